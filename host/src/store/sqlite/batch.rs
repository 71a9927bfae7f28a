//! SQLite's side of a batch transaction (`store::batch`): the batch's
//! receipts in one statement, the receipts of messages that did not apply
//! taken back, and each message's time budget.

use super::Tx;
use crate::store::backend::{Batch, Transaction as _};
use crate::store::batch::BatchRow;
use sqlx::AssertSqlSafe;
use std::fmt::Write as _;

impl Batch for Tx {
    /// The message ids of `rows` that were inserted (had no receipt): one
    /// `INSERT … VALUES (…), (…) ON CONFLICT DO NOTHING RETURNING
    /// message_id` (SQLite 3.35+ returns only the rows it inserted).
    async fn insert_receipts(
        &mut self,
        consumer: &str,
        digest: &str,
        rows: &[BatchRow<'_>],
    ) -> Result<Vec<String>, sqlx::Error> {
        // Host-made text: placeholders only, no outside text. `?NNN` is
        // SQLite's numbered parameter: the index is the number wherever it
        // stands (<https://www.sqlite.org/lang_expr.html#varparam>).
        let mut insert = String::from(
            "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms) VALUES ",
        );
        for i in 0..rows.len() {
            let p = 3 + 3 * i;
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(insert, "{sep}(?1, ?{p}, ?{}, ?2, ?{})", p + 1, p + 2);
        }
        insert.push_str(" ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id");
        let mut query = sqlx::query_scalar(AssertSqlSafe(insert))
            .bind(consumer)
            .bind(digest);
        for r in rows {
            query = query
                .bind(r.message_id)
                .bind(r.stream_sequence)
                .bind(r.published_ms);
        }
        query.fetch_all(&mut *self.0).await
    }

    /// The statements of the next message get the whole budget again.
    async fn renew_budget(&mut self, budget: std::time::Duration) -> Result<(), sqlx::Error> {
        self.bound_statements(budget).await
    }

    /// One writer: no deadlock, no serialization failure.
    fn take_conflict(&mut self) -> bool {
        false
    }

    /// One `DELETE` per message id (`Transaction::forget_receipt`).
    async fn forget_receipts(
        &mut self,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<(), sqlx::Error> {
        for id in message_ids {
            self.forget_receipt(consumer, id).await?;
        }
        Ok(())
    }
}
