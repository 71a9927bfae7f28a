//! PostgreSQL's side of a batch transaction (`store::batch`): the batch's
//! receipts in one statement, the receipts of messages that did not apply
//! taken back, and the lock conflicts a guest statement lost.

use super::Tx;
use super::codes;
use crate::store::backend::Batch;
use crate::store::batch::BatchRow;
use sqlx::AssertSqlSafe;

/// Inserts a batch's receipts: `$1` consumer, `$2` module digest, then the
/// message ids, stream sequences and publish times as arrays of one length
/// (`unnest` yields them in array order, which is the lock order).
const INSERT_RECEIPTS: &str = "INSERT INTO idem_receipts
        (consumer, message_id, stream_sequence, module_digest, published_ms)
     SELECT $1, r.message_id, r.stream_sequence, $2, r.published_ms
     FROM unnest($3::text[], $4::bigint[], $5::bigint[])
          AS r(message_id, stream_sequence, published_ms)
     ON CONFLICT (consumer, message_id) DO NOTHING
     RETURNING message_id";

/// Deletes `$1`'s receipts of the message ids in `$2`.
const FORGET_RECEIPTS: &str =
    "DELETE FROM idem_receipts WHERE consumer = $1 AND message_id = ANY($2::text[])";

/// Back to the session's own user for the host's statements after the
/// guests' (`SET ROLE NONE`; PostgreSQL manual, "SET ROLE": any user may).
pub(super) const LEAVE_ROLE: &str = "SET LOCAL ROLE NONE";

impl Batch for Tx {
    /// The message ids of `rows` that were inserted (had no receipt).
    async fn insert_receipts(
        &mut self,
        consumer: &str,
        digest: &str,
        rows: &[BatchRow<'_>],
    ) -> Result<Vec<String>, sqlx::Error> {
        let ids: Vec<&str> = rows.iter().map(|r| r.message_id).collect();
        let seqs: Vec<i64> = rows.iter().map(|r| r.stream_sequence).collect();
        let published: Vec<i64> = rows.iter().map(|r| r.published_ms).collect();
        sqlx::query_scalar(INSERT_RECEIPTS)
            .bind(consumer)
            .bind(digest)
            .bind(ids)
            .bind(seqs)
            .bind(published)
            .fetch_all(&mut *self.tx)
            .await
    }

    /// Statements are bounded by `statement_timeout` each: nothing to renew.
    async fn renew_budget(&mut self, _budget: std::time::Duration) -> Result<(), sqlx::Error> {
        Ok(())
    }

    fn take_conflict(&mut self) -> bool {
        std::mem::take(&mut self.conflict)
    }

    /// A host statement that failed inside the message's savepoint (the
    /// guard's catalog query, a role switch) aborted the transaction;
    /// `ROLLBACK TO SAVEPOINT` made it usable again (PostgreSQL,
    /// "ROLLBACK TO SAVEPOINT"), so COMMIT is no longer refused. A failure
    /// before the savepoint was opened would have made the rollback fail.
    fn message_undone(&mut self) {
        self.aborted = None;
    }

    /// Leaves the handler's role first when it was entered (a pending
    /// switch is dropped), so the delete runs as the host's user.
    async fn forget_receipts(
        &mut self,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<(), sqlx::Error> {
        self.pending_role = None;
        if std::mem::take(&mut self.role_entered) {
            sqlx::raw_sql(AssertSqlSafe(LEAVE_ROLE))
                .execute(&mut *self.tx)
                .await?;
        }
        sqlx::query(FORGET_RECEIPTS)
            .bind(consumer)
            .bind(message_ids)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }
}

impl Tx {
    /// Notes a guest statement's failure that was a lost lock conflict.
    pub(super) fn note_conflict(&mut self, e: &sqlx::Error) {
        if codes::is_conflict(e) {
            self.conflict = true;
        }
    }
}
