//! Receipts: the processed-message marker written first in each message's
//! transaction (ARCHITECTURE.md, "The protocol", invariants 3 to 5).

use super::backend::{Pool as _, Transaction as _};
use super::{Database, StoreError, Tx, dispatch};

/// The receipt for one message: written first in its transaction.
#[derive(Debug, Clone)]
pub struct Receipt<'a> {
    /// The durable consumer (= handler name).
    pub consumer: &'a str,
    /// The message id (header or JSON pointer value).
    pub message_id: &'a str,
    /// The JetStream stream sequence of the delivery being processed.
    pub stream_sequence: u64,
    /// Hex SHA-256 of the component bytes that handle the message.
    pub module_digest: &'a str,
    /// When the broker stored the message, Unix ms on the broker's clock
    /// (JetStream's `published` metadata): what the retention window is
    /// measured on ([`crate::broker::clock`]).
    pub published_ms: i64,
}

/// One consumer's receipts as the metrics see them, from
/// [`Database::receipt_gauges`]: cheap on a large table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiptGauges {
    /// The consumer's receipts: on PostgreSQL the planner's estimate (from
    /// the statistics autovacuum's ANALYZE keeps; no row is read), on
    /// SQLite the exact count through the `(consumer, published_ms)` index.
    pub rows: u64,
    /// The oldest receipt's publish time, Unix ms on the broker's clock;
    /// `None` without receipts.
    pub oldest_ms: Option<i64>,
}

impl Database {
    /// [`ReceiptGauges`] of `consumer`: its row count (estimated on
    /// PostgreSQL) and its oldest publish time (one step down the
    /// `(consumer, published_ms)` index).
    ///
    /// # Errors
    /// A query fails.
    pub async fn receipt_gauges(&self, consumer: &str) -> Result<ReceiptGauges, StoreError> {
        let (rows, oldest_ms) = dispatch!(&self.0, b => b.receipt_gauges(consumer).await)?;
        // No oldest receipt: none at all, whatever an estimate says.
        let rows = if oldest_ms.is_some() { rows } else { 0 };
        Ok(ReceiptGauges {
            rows: u64::try_from(rows).unwrap_or(0),
            oldest_ms,
        })
    }

    /// How many receipts `consumer` has (committed ones only).
    ///
    /// # Errors
    /// The query fails.
    pub async fn receipt_count(&self, consumer: &str) -> Result<u64, StoreError> {
        let n = dispatch!(&self.0, b => b.receipt_count(consumer).await)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Which of `message_ids` have a receipt of `consumer`, in one query
    /// outside any transaction (so only committed receipts): the lookup a
    /// pull's deliveries get before any transaction (ARCHITECTURE.md,
    /// "Duplicates found before the transaction"). At most
    /// [`LOOKUP_IDS`] ids a query: more are looked up in several.
    ///
    /// # Errors
    /// A query fails.
    pub async fn existing_receipts(
        &self,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        let mut found = std::collections::HashSet::new();
        for chunk in message_ids.chunks(LOOKUP_IDS) {
            let ids = dispatch!(&self.0, b => b.existing_receipts(consumer, chunk).await)?;
            found.extend(ids);
        }
        Ok(found)
    }
}

/// The most message ids [`Database::existing_receipts`] puts in one query.
pub const LOOKUP_IDS: usize = 256;

impl Tx {
    /// Inserts the receipt (`ON CONFLICT (consumer, message_id) DO NOTHING`).
    /// `true`: inserted, the message is new; `false`: a receipt exists, the
    /// message is a duplicate. On PostgreSQL, while another transaction holds
    /// an uncommitted receipt with the same key this waits for it; if that one
    /// commits this returns `false` without error (ARCHITECTURE.md invariant 5).
    ///
    /// # Errors
    /// The stream sequence does not fit a BIGINT, or the insert fails.
    pub async fn insert_receipt(&mut self, r: &Receipt<'_>) -> Result<bool, StoreError> {
        let seq = to_i64(r.stream_sequence)?;
        Ok(dispatch!(&mut self.0, t => t.insert_receipt(r, seq).await)?)
    }
}

/// A stream sequence as the BIGINT it is stored as.
pub(super) fn to_i64(n: u64) -> Result<i64, sqlx::Error> {
    i64::try_from(n).map_err(|_| {
        sqlx::Error::Encode(format!("stream sequence {n} does not fit a BIGINT").into())
    })
}
