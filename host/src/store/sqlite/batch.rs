//! SQLite's side of a batch transaction (`store::batch`): the batch's
//! receipts in one statement, the receipts of messages that did not apply
//! taken back, and each message's time budget.

use super::Tx;
use super::codes::to_sqlx;
use crate::store::backend::{Batch, Param, Transaction as _};
use crate::store::batch::BatchRow;
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
        let mut params = vec![Param::Text(consumer), Param::Text(digest)];
        for r in rows {
            params.extend([
                Param::Text(r.message_id),
                Param::Int(r.stream_sequence),
                Param::Int(r.published_ms),
            ]);
        }
        let run = || -> rusqlite::Result<Vec<String>> {
            let conn = self.0.get();
            let mut stmt = conn.prepare_cached(&insert)?;
            super::values::bind_host(&mut stmt, &params)?;
            let mut inserted = Vec::with_capacity(rows.len());
            let mut found = stmt.raw_query();
            while let Some(row) = found.next()? {
                inserted.push(row.get(0)?);
            }
            Ok(inserted)
        };
        run().map_err(to_sqlx)
    }

    /// The statements of the next message get the whole budget again.
    async fn renew_budget(&mut self, budget: std::time::Duration) -> Result<(), sqlx::Error> {
        self.bound_statements(budget)
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
