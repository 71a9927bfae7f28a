//! SQL text both backends send alike (PostgreSQL and SQLite read it the
//! same; both take `$n` placeholders), for the `backend` traits' provided
//! methods and the statement savepoints. Dialect SQL is in the backend
//! modules.

/// Opens the savepoint of the first guest statement of a transaction.
pub(super) const SAVEPOINT: &str = "SAVEPOINT idem_stmt";
/// Before each later guest statement: releases the previous statement's
/// savepoint and opens this one's, in one round trip.
pub(super) const NEXT_SAVEPOINT: &str = "RELEASE SAVEPOINT idem_stmt; SAVEPOINT idem_stmt";
/// Undoes a failed statement; its savepoint stays open (the next statement
/// or COMMIT releases it).
pub(super) const UNDO: &str = "ROLLBACK TO SAVEPOINT idem_stmt";
/// The first statement of a message in a batch transaction: opens the
/// message's savepoint and the statement's.
pub(super) const MESSAGE_SAVEPOINT: &str = "SAVEPOINT idem_msg; SAVEPOINT idem_stmt";
/// [`MESSAGE_SAVEPOINT`] after a message that succeeded: releases its
/// savepoint (and the statement savepoint nested in it) first.
pub(super) const NEXT_MESSAGE_SAVEPOINT: &str =
    "RELEASE SAVEPOINT idem_msg; SAVEPOINT idem_msg; SAVEPOINT idem_stmt";
/// A statement outside any message after a message that succeeded.
pub(super) const RELEASED_MESSAGE_SAVEPOINT: &str =
    "RELEASE SAVEPOINT idem_msg; SAVEPOINT idem_stmt";
/// Undoes everything a failed message did and closes its savepoint.
pub(super) const UNDO_MESSAGE: &str = "ROLLBACK TO SAVEPOINT idem_msg; RELEASE SAVEPOINT idem_msg";

/// Inserts a receipt: `$1` consumer, `$2` message id, `$3` stream sequence,
/// `$4` module digest, `$5` published ms.
pub(super) const INSERT_RECEIPT: &str =
    "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (consumer, message_id) DO NOTHING";

/// Records stream sequence `$3` as the last applied for ordering key `$2`
/// of consumer `$1`, unless one at least as high is recorded: 1 row
/// affected when it was recorded, 0 when the message comes out of order.
/// On PostgreSQL a concurrent transaction's row is waited for and the
/// `WHERE` evaluated on its committed version (`ON CONFLICT DO UPDATE`
/// under READ COMMITTED); SQLite has one writer.
pub(super) const ADVANCE_KEY_SEQUENCE: &str =
    "INSERT INTO idem_key_sequences (consumer, order_key, stream_sequence)
         VALUES ($1, $2, $3)
         ON CONFLICT (consumer, order_key) DO UPDATE SET stream_sequence = excluded.stream_sequence
         WHERE idem_key_sequences.stream_sequence < excluded.stream_sequence";

/// Inserts a dead letter once per stored message.
pub(super) const INSERT_DEAD_LETTER: &str = "INSERT INTO idem_dead_letters
           (consumer, message_id, stream, stream_sequence, published_ns,
            subject, reason, headers, payload)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (consumer, stream, stream_sequence, published_ns) DO NOTHING";

/// `$1`'s receipts.
pub(super) const RECEIPT_COUNT: &str = "SELECT count(*) FROM idem_receipts WHERE consumer = $1";

/// `$1`'s oldest receipt's publish time: one step down the
/// `(consumer, published_ms)` index.
pub(super) const OLDEST_RECEIPT: &str =
    "SELECT min(published_ms) FROM idem_receipts WHERE consumer = $1";

/// `$1`'s receipt count and publish-time span.
pub(super) const RECEIPT_SUMMARY: &str = "SELECT count(*), min(published_ms), max(published_ms)
                               FROM idem_receipts WHERE consumer = $1";

/// `$1`'s receipts whose effect component `$2` (a digest) produced:
/// count and publish-time span.
pub(super) const RECEIPT_SUMMARY_BY_DIGEST: &str =
    "SELECT count(*), min(published_ms), max(published_ms)
     FROM idem_receipts WHERE consumer = $1 AND module_digest = $2";

/// Deletes `$1`'s receipt for message `$2`.
pub(super) const FORGET_RECEIPT: &str =
    "DELETE FROM idem_receipts WHERE consumer = $1 AND message_id = $2";

/// Deletes the dead letter with id `$1`.
pub(super) const DROP_DEAD_LETTER: &str = "DELETE FROM idem_dead_letters WHERE id = $1";

/// Deletes every dead letter of consumer `$1`.
pub(super) const DROP_DEAD_LETTERS: &str = "DELETE FROM idem_dead_letters WHERE consumer = $1";

/// One prune chunk: at most `$3` of consumer `$1`'s receipts published
/// before `$2` (module `retention`).
pub(super) const PRUNE_CHUNK: &str =
    "DELETE FROM idem_receipts WHERE consumer = $1 AND message_id IN (
                         SELECT message_id FROM idem_receipts
                         WHERE consumer = $1 AND published_ms < $2
                         LIMIT $3)";

/// Whether `table` (an unquoted identifier: lower-cased, then quoted) has a row.
pub(super) fn any_row(table: &str) -> String {
    format!(
        "SELECT 1 FROM \"{}\" LIMIT 1",
        table.to_lowercase().replace('"', "\"\"")
    )
}
