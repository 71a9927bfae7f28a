//! A transaction that carries a batch of messages (ARCHITECTURE.md,
//! "Batching"), written once for every backend:
//!
//! ```text
//! BEGIN
//! INSERT the batch's receipts in one statement, sorted by message id,
//!        ON CONFLICT DO NOTHING RETURNING message_id   → which are new
//! per new message:  SAVEPOINT idem_msg  (sent with its first statement)
//!                   its guest statements, each in idem_stmt inside it
//!                   applied → released (with the next round trip or COMMIT)
//!                   failed  → ROLLBACK TO SAVEPOINT idem_msg
//! DELETE the receipts of the messages that did not apply (as the host's user)
//! COMMIT
//! ```
//!
//! Every statement waits at most [`BATCH_LOCK_WAIT`] for a row lock. The
//! receipts go first and in message id order, so two hosts whose
//! batches hold copies of the same messages take the receipts' key locks
//! in the same order and cannot deadlock on them; the receipts' unique key
//! still arbitrates every copy (invariant 5). A message whose statements
//! lost a lock conflict (deadlock, serialization failure) is reported by
//! [`Tx::take_conflict`] so that it can be run again without spending a
//! delivery.

use super::backend::{Batch as _, Param, Pool as _, Transaction as _};
use super::sql::{
    MESSAGE_SAVEPOINT, NEXT_MESSAGE_SAVEPOINT, NEXT_SAVEPOINT, RELEASED_MESSAGE_SAVEPOINT,
    SAVEPOINT, UNDO_MESSAGE,
};
use super::{DbKind, MessageSavepoint, Receipt, Savepoints, StoreError, Tx, dispatch, kind_of};
use sqlx::SqlSafeStr as _;
use std::time::Duration;

/// How long a guest statement of a batch waits for a row lock on
/// PostgreSQL (`lock_timeout`) before it counts as a lost conflict. A batch
/// holds its rows' locks until its COMMIT, and two batches that lock rows in
/// different orders deadlock, which PostgreSQL only detects after
/// `deadlock_timeout` (1 s by default): waiting less than that, the message
/// gives way at once and runs again alone after its batch.
pub const BATCH_LOCK_WAIT: Duration = Duration::from_millis(200);

impl super::Database {
    /// Begins the transaction of a batch: [`super::Database::begin_bounded`]
    /// with `timeout`, and on PostgreSQL a lock wait of [`BATCH_LOCK_WAIT`]
    /// per statement, set with BEGIN in the same round trip.
    ///
    /// # Errors
    /// As [`super::Database::begin_bounded`].
    pub async fn begin_batch(&self, timeout: Duration) -> Result<Tx, StoreError> {
        Ok(dispatch!(&self.0, b, wrap => {
            let tx = b.begin_limited(timeout, Some(BATCH_LOCK_WAIT)).await?;
            Tx(wrap(tx), Savepoints::default())
        }))
    }
}

/// PostgreSQL: `statement_timeout` and `lock_timeout` (ms, as text) until
/// the end of the current savepoint ([`Tx::begin_bounded_message`]).
const BOUND_MESSAGE: &str =
    "SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true)";

impl Savepoints {
    /// The host SQL that opens a guest statement's savepoint now: the
    /// previous statement's released, and in a batch the message's own
    /// savepoint opened (and the previous message's released) first.
    pub(super) fn opening_sql(&self) -> &'static str {
        match (self.message, self.release_message, self.statement) {
            (MessageSavepoint::Pending, true, _) => NEXT_MESSAGE_SAVEPOINT,
            (MessageSavepoint::Pending, false, _) => MESSAGE_SAVEPOINT,
            (_, _, true) => NEXT_SAVEPOINT,
            (_, true, false) => RELEASED_MESSAGE_SAVEPOINT,
            (_, false, false) => SAVEPOINT,
        }
    }

    /// [`Savepoints::opening_sql`] ran.
    pub(super) fn opened(&mut self) {
        self.statement = true;
        self.release_message = false;
        if self.message == MessageSavepoint::Pending {
            self.message = MessageSavepoint::Open;
        }
    }
}

impl Tx {
    /// Inserts the receipts of a batch in one statement (`ON CONFLICT
    /// (consumer, message_id) DO NOTHING`), in message id order (module
    /// docs). Returns, in the order of `receipts`, whether each was inserted
    /// (`true`: the message is new) or existed (`false`: a duplicate). On
    /// PostgreSQL a receipt another transaction holds uncommitted is waited
    /// for, as with [`Tx::insert_receipt`]. Every receipt must have the same
    /// consumer and module digest, and no message id may appear twice.
    ///
    /// # Errors
    /// A stream sequence does not fit a BIGINT, the receipts differ in
    /// consumer or digest or repeat a message id, or the insert fails.
    pub async fn insert_receipts(
        &mut self,
        receipts: &[Receipt<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        let Some(first) = receipts.first() else {
            return Ok(Vec::new());
        };
        let mut order: Vec<usize> = (0..receipts.len()).collect();
        order.sort_by(|&a, &b| receipts[a].message_id.cmp(receipts[b].message_id));
        let mut rows = Vec::with_capacity(receipts.len());
        for (n, &i) in order.iter().enumerate() {
            let r = &receipts[i];
            let repeated = n > 0 && receipts[order[n - 1]].message_id == r.message_id;
            if r.consumer != first.consumer || r.module_digest != first.module_digest || repeated {
                return Err(sqlx::Error::Protocol(
                    "a batch's receipts must share consumer and digest and name each message once"
                        .into(),
                )
                .into());
            }
            rows.push(BatchRow {
                message_id: r.message_id,
                stream_sequence: super::receipts::to_i64(r.stream_sequence)?,
                published_ms: r.published_ms,
            });
        }
        let inserted: std::collections::HashSet<String> = dispatch!(&mut self.0, t => t
            .insert_receipts(first.consumer, first.module_digest, &rows)
            .await)?
        .into_iter()
        .collect();
        Ok(receipts
            .iter()
            .map(|r| inserted.contains(r.message_id))
            .collect())
    }

    /// Starts the next message of a batch: its savepoint is opened with its
    /// first statement, and on SQLite the time budget of its statements
    /// starts again (`budget`, as [`super::Database::begin_bounded`]; on
    /// PostgreSQL `statement_timeout` bounds each statement already).
    ///
    /// # Errors
    /// On SQLite, the connection cannot be locked.
    pub async fn begin_message(&mut self, budget: Duration) -> Result<(), StoreError> {
        dispatch!(&mut self.0, t => t.renew_budget(budget).await)?;
        self.1.message = MessageSavepoint::Pending;
        Ok(())
    }

    /// Starts a message whose statements must end within `bound` (a shadow
    /// candidate's, `crate::pipeline::shadow_run`), as [`Tx::begin_message`]
    /// with `bound` as the budget on SQLite. On PostgreSQL the message's
    /// savepoint is opened now, and inside it `statement_timeout` is set to
    /// `bound` and `lock_timeout` to at most [`BATCH_LOCK_WAIT`], so the
    /// server stops a statement there itself; rolling back to the savepoint
    /// restores both (PostgreSQL, "SET": the effects of `SET LOCAL` made
    /// after a savepoint end when it is rolled back).
    ///
    /// # Errors
    /// A statement fails: the transaction must be rolled back.
    pub async fn begin_bounded_message(&mut self, bound: Duration) -> Result<(), StoreError> {
        self.begin_message(bound).await?;
        let postgres = dispatch!(&mut self.0, t => kind_of(&*t) == DbKind::Postgres);
        if !postgres {
            return Ok(());
        }
        let opening = self.1.opening_sql();
        dispatch!(&mut self.0, t => t.run_host_sql(opening).await)?;
        self.1.opened();
        let ms = |d: Duration| d.as_millis().max(1).to_string();
        let (statement, lock) = (ms(bound), ms(bound.min(BATCH_LOCK_WAIT)));
        let params = [Param::Text(&statement), Param::Text(&lock)];
        dispatch!(&mut self.0, t => t.run(BOUND_MESSAGE.into_sql_str(), &params).await)?;
        Ok(())
    }

    /// Ends the current message of a batch. `applied`: its effects stay
    /// (its savepoint is released with the next round trip, or by COMMIT).
    /// Otherwise everything it did is rolled back to its savepoint, at once,
    /// which also proves the transaction is still usable.
    ///
    /// # Errors
    /// The rollback to the savepoint failed: the transaction is in an
    /// unknown state and must be rolled back whole.
    pub async fn end_message(&mut self, applied: bool) -> Result<(), StoreError> {
        let was = std::mem::take(&mut self.1.message);
        if was != MessageSavepoint::Open {
            return Ok(());
        }
        self.1.statement = false;
        if applied {
            self.1.release_message = true;
            return Ok(());
        }
        dispatch!(&mut self.0, t => {
            t.run_host_sql(UNDO_MESSAGE).await?;
            t.message_undone();
        });
        Ok(())
    }

    /// After [`Tx::end_message`] failed to roll a message back: the
    /// message's savepoint counts as open again, so that the rollback can
    /// be tried once more.
    pub fn reopen_message(&mut self) {
        self.1.message = MessageSavepoint::Open;
    }

    /// Whether a statement since the last call failed on a lock conflict
    /// (PostgreSQL deadlock 40P01, serialization failure 40001, or a lock
    /// waited for past [`BATCH_LOCK_WAIT`], 55P03): the
    /// message lost a race with another transaction, not a verdict on
    /// itself. Always `false` on SQLite (one writer, no deadlock).
    pub fn take_conflict(&mut self) -> bool {
        dispatch!(&mut self.0, t => t.take_conflict())
    }

    /// Deletes `consumer`'s receipts of `message_ids` (messages of the batch
    /// that did not apply, so that their next delivery runs them), as the
    /// host's own user. Call it after the batch's last message, before
    /// COMMIT.
    ///
    /// # Errors
    /// The delete fails.
    pub async fn forget_receipts(
        &mut self,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<(), StoreError> {
        if message_ids.is_empty() {
            return Ok(());
        }
        Ok(dispatch!(&mut self.0, t => t.forget_receipts(consumer, message_ids).await)?)
    }
}

/// One receipt of a batch as the backends insert it (the consumer and the
/// digest are the batch's).
pub(super) struct BatchRow<'a> {
    pub message_id: &'a str,
    pub stream_sequence: i64,
    pub published_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_savepoint_a_statement_opens() {
        let mut s = Savepoints::default();
        assert_eq!(s.opening_sql(), SAVEPOINT);
        s.opened();
        assert_eq!(s.opening_sql(), NEXT_SAVEPOINT);
        // A batch: the first message's first statement, then its second.
        let mut s = Savepoints {
            message: MessageSavepoint::Pending,
            ..Savepoints::default()
        };
        assert_eq!(s.opening_sql(), MESSAGE_SAVEPOINT);
        s.opened();
        assert_eq!(s.message, MessageSavepoint::Open);
        assert_eq!(s.opening_sql(), NEXT_SAVEPOINT);
        // It applied: the next message's first statement releases it.
        s.message = MessageSavepoint::Pending;
        s.statement = false;
        s.release_message = true;
        assert_eq!(s.opening_sql(), NEXT_MESSAGE_SAVEPOINT);
        s.opened();
        assert!(!s.release_message);
        assert_eq!(s.message, MessageSavepoint::Open);
        // Released, then a statement outside any message.
        let s = Savepoints {
            release_message: true,
            ..Savepoints::default()
        };
        assert_eq!(s.opening_sql(), RELEASED_MESSAGE_SAVEPOINT);
    }
}
