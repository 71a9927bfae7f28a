//! The operator's view of the outbox (`idem_outbox`): what waits per
//! handler and target (the relay's gauges), the rows one by one
//! (`idem outbox list`), a parked row made due again (`retry`) and rows
//! removed unsent (`drop`). The relay's own claim and bookkeeping are in
//! `store::outbox`.

use super::backend::{HostRow as _, Param, Pool as _};
use super::outbox::{PARKED, target};
use super::{Database, StoreError, dispatch};
use crate::outbox::Target;
use sqlx::SqlSafeStr as _;

/// Per handler and target: rows waiting (parked ones apart), parked rows,
/// and the creation time of the oldest waiting row.
const SUMMARY: &str = "SELECT consumer, kind, target,
        sum(CASE WHEN due_ms < 9223372036854775807 THEN 1 ELSE 0 END),
        sum(CASE WHEN due_ms = 9223372036854775807 THEN 1 ELSE 0 END),
        min(CASE WHEN due_ms < 9223372036854775807 THEN created_ms END)
     FROM idem_outbox GROUP BY consumer, kind, target ORDER BY consumer, kind, target";

/// The columns of a listed row, in [`OutboxListed`]'s order.
macro_rules! listed_columns {
    () => {
        "id, consumer, message_id, call_index, kind, target, ordering_key, attempts, due_ms, created_ms, last_error, CAST(length(payload) AS BIGINT)"
    };
}

/// Every row, oldest first, at most `$1`.
const LIST_ALL: &str = concat!(
    "SELECT ",
    listed_columns!(),
    " FROM idem_outbox ORDER BY id LIMIT $1"
);
/// One handler's rows (`$2`), oldest first, at most `$1`.
const LIST_HANDLER: &str = concat!(
    "SELECT ",
    listed_columns!(),
    " FROM idem_outbox WHERE consumer = $2 ORDER BY id LIMIT $1"
);
/// A parked row `$1` due at once, its tries counted from 0 again.
const RETRY_ONE: &str = "UPDATE idem_outbox SET due_ms = 0, attempts = 0
     WHERE id = $1 AND due_ms = 9223372036854775807";
/// Every parked row of handler `$1` due at once.
const RETRY_HANDLER: &str = "UPDATE idem_outbox SET due_ms = 0, attempts = 0
     WHERE consumer = $1 AND due_ms = 9223372036854775807";
/// Whether row `$1` exists.
const EXISTS: &str = "SELECT count(*) FROM idem_outbox WHERE id = $1";
/// Deletes row `$1`.
const DROP_ONE: &str = "DELETE FROM idem_outbox WHERE id = $1";
/// Deletes every row of handler `$1`.
const DROP_HANDLER: &str = "DELETE FROM idem_outbox WHERE consumer = $1";

/// What waits in the outbox for one handler and target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxSummary {
    /// The handler (durable consumer).
    pub consumer: String,
    /// Subject or endpoint name.
    pub target: Target,
    /// Rows not sent yet and still tried (parked ones apart).
    pub pending: u64,
    /// Rows parked after their last try.
    pub parked: u64,
    /// When the oldest pending row was stored (Unix ms, the storing host's
    /// clock); `None` without pending rows, 0 for a row stored before idem
    /// recorded it.
    pub oldest_ms: Option<i64>,
}

/// One outbox row as `idem outbox list` shows it (without its payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxListed {
    /// The row's id.
    pub id: i64,
    /// The handler whose message stored it.
    pub consumer: String,
    /// That message's id.
    pub message_id: String,
    /// Its place among the message's calls.
    pub call_index: i64,
    /// Subject or endpoint name.
    pub target: Target,
    /// The ordering key.
    pub key: Option<String>,
    /// Sends tried.
    pub attempts: i64,
    /// When it is next due (Unix ms; a claim's lease end while being sent;
    /// [`PARKED`] when parked).
    pub due_ms: i64,
    /// When it was stored (Unix ms).
    pub created_ms: i64,
    /// The last send's error.
    pub last_error: Option<String>,
    /// Payload or body size in bytes.
    pub payload_bytes: i64,
}

impl OutboxListed {
    /// Parked after its last try (never due again until `idem outbox retry`).
    pub fn parked(&self) -> bool {
        self.due_ms == PARKED
    }
}

/// What `retry` or `drop` of one row found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowChange {
    /// Done.
    Changed,
    /// The row exists but is not parked (retry only).
    NotParked,
    /// No row has that id.
    Missing,
}

impl Database {
    /// Per handler and target, what waits: [`OutboxSummary`] rows in
    /// handler and target order.
    ///
    /// # Errors
    /// The query fails, or a row does not decode.
    pub async fn outbox_summary(&self) -> Result<Vec<OutboxSummary>, StoreError> {
        let rows = dispatch!(&self.0, b => {
            let rows = b.fetch_all(SUMMARY.into_sql_str(), &[]).await?;
            rows.iter()
                .map(|r| {
                    Ok(OutboxSummary {
                        consumer: r.text(0)?,
                        target: target(&r.text(1)?, r.text(2)?)?,
                        pending: u64::try_from(r.opt_int(3)?.unwrap_or(0)).unwrap_or(0),
                        parked: u64::try_from(r.opt_int(4)?.unwrap_or(0)).unwrap_or(0),
                        oldest_ms: r.opt_int(5)?,
                    })
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()
        })?;
        Ok(rows)
    }

    /// Up to `limit` rows, oldest first, of `handler` or of every handler.
    ///
    /// # Errors
    /// The query fails, or a row does not decode.
    pub async fn list_outbox(
        &self,
        handler: Option<&str>,
        limit: u32,
    ) -> Result<Vec<OutboxListed>, StoreError> {
        let limit = i64::from(limit);
        let rows = dispatch!(&self.0, b => {
            let rows = match handler {
                Some(h) => {
                    b.fetch_all(LIST_HANDLER.into_sql_str(), &[Param::Int(limit), Param::Text(h)])
                        .await?
                }
                None => b.fetch_all(LIST_ALL.into_sql_str(), &[Param::Int(limit)]).await?,
            };
            rows.iter()
                .map(|r| {
                    Ok(OutboxListed {
                        id: r.int(0)?,
                        consumer: r.text(1)?,
                        message_id: r.text(2)?,
                        call_index: r.int(3)?,
                        target: target(&r.text(4)?, r.text(5)?)?,
                        key: r.opt_text(6)?,
                        attempts: r.int(7)?,
                        due_ms: r.int(8)?,
                        created_ms: r.int(9)?,
                        last_error: r.opt_text(10)?,
                        payload_bytes: r.int(11)?,
                    })
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()
        })?;
        Ok(rows)
    }

    /// Makes the parked row `id` due at once, its tries counted from 0.
    ///
    /// # Errors
    /// A statement fails.
    pub async fn retry_outbox_row(&self, id: i64) -> Result<RowChange, StoreError> {
        let changed =
            dispatch!(&self.0, b => b.run(RETRY_ONE.into_sql_str(), &[Param::Int(id)]).await)?;
        if changed > 0 {
            return Ok(RowChange::Changed);
        }
        Ok(if self.outbox_row_exists(id).await? {
            RowChange::NotParked
        } else {
            RowChange::Missing
        })
    }

    /// Makes every parked row of `handler` due at once; how many.
    ///
    /// # Errors
    /// The statement fails.
    pub async fn retry_outbox_parked(&self, handler: &str) -> Result<u64, StoreError> {
        let n = dispatch!(&self.0, b => b.run(RETRY_HANDLER.into_sql_str(), &[Param::Text(handler)]).await)?;
        Ok(n)
    }

    /// Deletes row `id` unsent.
    ///
    /// # Errors
    /// The statement fails.
    pub async fn drop_outbox_row(&self, id: i64) -> Result<RowChange, StoreError> {
        let n = dispatch!(&self.0, b => b.run(DROP_ONE.into_sql_str(), &[Param::Int(id)]).await)?;
        Ok(if n > 0 {
            RowChange::Changed
        } else {
            RowChange::Missing
        })
    }

    /// Deletes every row of `handler` unsent, pending and parked; how many.
    ///
    /// # Errors
    /// The statement fails.
    pub async fn drop_outbox_rows(&self, handler: &str) -> Result<u64, StoreError> {
        let n = dispatch!(&self.0, b => b.run(DROP_HANDLER.into_sql_str(), &[Param::Text(handler)]).await)?;
        Ok(n)
    }

    async fn outbox_row_exists(&self, id: i64) -> Result<bool, StoreError> {
        let n = dispatch!(&self.0, b => {
            let row = b.fetch_one(EXISTS.into_sql_str(), &[Param::Int(id)]).await?;
            row.int(0)
        })?;
        Ok(n > 0)
    }
}
