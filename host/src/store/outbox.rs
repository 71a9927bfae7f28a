//! The outbox table (`idem_outbox`): the rows a message's handler
//! published or called, inserted in the message's own transaction, and
//! the relay's claim, send and retry bookkeeping
//! (ARCHITECTURE.md, "The outbox"). Which rows to send when is
//! [`crate::outbox::relay`]'s; this is the mechanism.

use super::backend::{HostRow as _, Param, Pool as _, Transaction as _, TxRoles as _};
use super::{Database, DbKind, StoreError, Tx, dispatch, kind_of};
use crate::outbox::{OutboxEntry, Target};
use sqlx::SqlSafeStr as _;

/// Inserts one row: `$1` consumer, `$2` message id, `$3` call index, `$4`
/// kind, `$5` target, `$6` payload, `$7` headers (JSON), `$8` key, `$9`
/// when (Unix ms, the host's clock).
/// A row of a message that was stored already changes nothing.
const INSERT: &str = "INSERT INTO idem_outbox
        (consumer, message_id, call_index, kind, target, payload, headers, ordering_key, created_ms)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
     ON CONFLICT (consumer, message_id, call_index) DO NOTHING";

/// The channel a PostgreSQL transaction that stored outbox rows notifies:
/// PostgreSQL delivers the notification to every listening session when,
/// and only when, the transaction commits (a rolled-back savepoint takes
/// its notification with it; <https://www.postgresql.org/docs/current/sql-notify.html>),
/// so every host's relay wakes at once.
pub const NOTIFY_CHANNEL: &str = "idem_outbox";

/// Sends [`NOTIFY_CHANNEL`]'s notification (one per transaction: PostgreSQL
/// folds equal notifications of one transaction into one).
const NOTIFY: &str = "SELECT pg_notify('idem_outbox', '')";

/// PostgreSQL: waits for any uncommitted row of the same consumer and
/// key (a transaction-scoped advisory lock on the pair of keys `idem` and
/// `$1`, [`key_lock`]; the two-key space is apart from the host's one-key
/// locks, `store::advisory`), so rows of one key are numbered in commit
/// order.
const LOCK_KEY: &str = "SELECT pg_advisory_xact_lock(1768187245, ($1::bigint)::integer)";

/// The columns a claim returns, in [`OutboxRow`]'s order.
macro_rules! claimed_columns {
    () => {
        "id, consumer, message_id, call_index, kind, target, payload, headers, ordering_key, attempts, created_ms"
    };
}

/// A row of table `$t` (`o`, or `idem_outbox` itself) that no earlier
/// row of its key holds: none of another message that is not parked
/// ([`PARKED`]), and none of its own message that is not due at `$1` (a
/// row of its own message due with it is claimed with it, and the relay
/// sends one delivery's rows in call order).
macro_rules! key_free {
    ($t:literal) => {
        concat!(
            "(",
            $t,
            ".ordering_key IS NULL OR NOT EXISTS (
                 SELECT 1 FROM idem_outbox p
                 WHERE p.consumer = ",
            $t,
            ".consumer AND p.ordering_key = ",
            $t,
            ".ordering_key
                   AND p.id < ",
            $t,
            ".id AND p.due_ms < 9223372036854775807
                   AND (p.message_id <> ",
            $t,
            ".message_id OR p.due_ms > $1)))"
        )
    };
}

/// The deliveries (one handler's message's rows) with a row due at `$1`
/// (Unix ms) that its key lets go, the oldest, as many as the placeholder
/// `$limit` says.
macro_rules! due_deliveries {
    ($limit:literal) => {
        concat!(
            "SELECT o.consumer, o.message_id, min(o.id) AS first FROM idem_outbox o
             WHERE o.due_ms <= $1 AND ",
            key_free!("o"),
            " GROUP BY o.consumer, o.message_id ORDER BY first LIMIT ",
            $limit
        )
    };
}

/// SQLite: claims, of the deliveries in CTE `mine`, every row due at `$1`
/// that its key lets go, until `$2` (the lease); what it claimed.
macro_rules! claim_rows {
    () => {
        concat!(
            " UPDATE idem_outbox SET due_ms = $2, attempts = attempts + 1
              WHERE due_ms <= $1
                AND (consumer, message_id) IN (SELECT consumer, message_id FROM mine)
                AND ",
            key_free!("idem_outbox"),
            " RETURNING ",
            claimed_columns!()
        )
    };
}

/// PostgreSQL, the first statement of a claim's transaction: takes the
/// transaction-scoped advisory lock on the pair of keys `1768187246` and
/// the hash of consumer and message id of each of the oldest due
/// deliveries (`$2` of them at most) whose lock no other claim holds, so one delivery is taken
/// by one claim at a time (a hash two deliveries share is one lock for
/// both). How many it locked.
const LOCK_DELIVERIES_POSTGRES: &str = concat!(
    "WITH due AS MATERIALIZED (",
    due_deliveries!("$2"),
    ") SELECT count(*) FROM due
       WHERE pg_try_advisory_xact_lock(1768187246, hashtext(consumer || ' ' || message_id))"
);
/// PostgreSQL, the second statement: claims the due rows of the
/// deliveries whose lock this transaction holds (`pg_locks`: the first key
/// in `classid`, the second in `objid`, `objsubid` 2;
/// <https://www.postgresql.org/docs/current/view-pg-locks.html>). Its own
/// statement, so under READ COMMITTED it reads the table as of after the
/// locks were taken: a claim that held one of these deliveries has
/// committed, and the ordering-key rule sees its leases.
const CLAIM_LOCKED_POSTGRES: &str = concat!(
    "WITH mine AS MATERIALIZED (
         SELECT objid::bigint AS k FROM pg_locks
         WHERE locktype = 'advisory' AND pid = pg_backend_pid()
           AND classid = 1768187246 AND objsubid = 2)
     UPDATE idem_outbox SET due_ms = $2, attempts = attempts + 1
     WHERE due_ms <= $1
       AND (hashtext(consumer || ' ' || message_id)::bigint & 4294967295) IN (SELECT k FROM mine)
       AND ",
    key_free!("idem_outbox"),
    " RETURNING ",
    claimed_columns!()
);
/// SQLite has one writer: the claim holds the write lock.
const CLAIM_SQLITE: &str = concat!(
    "WITH mine AS MATERIALIZED (",
    due_deliveries!("$3"),
    ")",
    claim_rows!()
);

/// The `due_ms` of a parked row: never due again (kept for an operator).
pub const PARKED: i64 = i64::MAX;

/// Gives a claimed row back unsent: due at `$2`, its claim not counted;
/// only while its lease is still `$3` (this claim's: a row whose lease ran
/// out and that another host claimed again is that host's).
const RELEASE: &str =
    "UPDATE idem_outbox SET due_ms = $2, attempts = attempts - 1 WHERE id = $1 AND due_ms = $3";

/// Deletes sent rows: followed by the list of their ids' placeholders
/// (`($1, $2, …)`; nothing else is ever appended).
const SENT: &str = "DELETE FROM idem_outbox WHERE id IN";
/// A failed send: due again at `$2`, with the error `$3`; only while its
/// lease is still `$4` (as [`RELEASE`]).
const FAILED: &str =
    "UPDATE idem_outbox SET due_ms = $2, last_error = $3 WHERE id = $1 AND due_ms = $4";
/// Rows not sent yet, and the oldest one's id.
const DEPTH: &str = "SELECT count(*), min(id) FROM idem_outbox";

/// One claimed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// The row's id: its place in commit order among rows of its key.
    pub id: i64,
    /// The handler (durable consumer) whose message stored it.
    pub consumer: String,
    /// That message's id.
    pub message_id: String,
    /// Its place among the message's calls, from 0.
    pub call_index: u32,
    /// Where it goes.
    pub target: Target,
    /// Payload or request body.
    pub payload: Vec<u8>,
    /// Headers, in the guest's order.
    pub headers: Vec<(String, String)>,
    /// The ordering key.
    pub key: Option<String>,
    /// Sends tried, this one included.
    pub attempts: u32,
    /// When it was stored (Unix ms, the storing host's clock; 0 when
    /// not known).
    pub created_ms: i64,
    /// Until when the claim that returned it holds it (Unix ms): its
    /// `due_ms` while the claim is this host's.
    pub lease_ms: i64,
}

impl Tx {
    /// Stores `entries`, the outbox calls `consumer`'s handler made for
    /// `message_id`, in this transaction (as the host's user, where a
    /// handler role was entered): they commit with the message's effects
    /// and receipt, or not at all. On PostgreSQL each key's lock is taken
    /// first, in key order, so one key's rows are numbered in commit order.
    ///
    /// # Errors
    /// A statement fails (the message is then to run again).
    pub async fn insert_outbox(
        &mut self,
        consumer: &str,
        message_id: &str,
        entries: &[OutboxEntry],
    ) -> Result<(), StoreError> {
        let mut keys: Vec<i64> = entries
            .iter()
            .filter_map(|e| e.key.as_deref().map(|k| key_lock(consumer, k)))
            .collect();
        keys.sort();
        keys.dedup();
        let rows: Vec<(i64, &str, &str, String)> = entries
            .iter()
            .map(|e| {
                let (kind, target) = match &e.target {
                    Target::Publish(s) => ("publish", s.as_str()),
                    Target::Call(s) => ("call", s.as_str()),
                };
                let headers = serde_json::to_string(&e.headers).unwrap_or_else(|_| "[]".into());
                (i64::from(e.index), kind, target, headers)
            })
            .collect();
        let created_ms = now_ms();
        dispatch!(&mut self.0, t => {
            t.host_turn().await?;
            if kind_of(&*t) == DbKind::Postgres {
                for k in &keys {
                    t.run(LOCK_KEY.into_sql_str(), &[Param::Int(*k)]).await?;
                }
                if !entries.is_empty() {
                    t.run(NOTIFY.into_sql_str(), &[]).await?;
                }
            }
            for (e, (index, kind, target, headers)) in entries.iter().zip(&rows) {
                let params = [
                    Param::Text(consumer),
                    Param::Text(message_id),
                    Param::Int(*index),
                    Param::Text(kind),
                    Param::Text(target),
                    Param::Bytes(&e.payload),
                    Param::Text(headers),
                    Param::OptText(e.key.as_deref()),
                    Param::Int(created_ms),
                ];
                t.run(INSERT.into_sql_str(), &params).await?;
            }
            Ok::<(), sqlx::Error>(())
        })?;
        Ok(())
    }
}

impl Database {
    /// Claims the due rows of up to `limit` deliveries (one handler's
    /// message's rows), due at `now_ms` (Unix ms), for `lease_ms`: no other
    /// claim takes them until then, and a host that dies while sending
    /// leaves them to be claimed again after it. Oldest first; of the rows
    /// with a key, only those of the oldest delivery holding the key.
    ///
    /// # Errors
    /// The statement fails, or a row does not decode.
    pub async fn claim_outbox(
        &self,
        now_ms: i64,
        lease_ms: i64,
        limit: u32,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        let lease = now_ms.saturating_add(lease_ms);
        let rows = match self.postgres_pool() {
            Some(pool) => {
                let mut tx = pool.begin().await?;
                let locked: i64 = sqlx::query_scalar(LOCK_DELIVERIES_POSTGRES)
                    .bind(now_ms)
                    .bind(i64::from(limit))
                    .fetch_one(&mut *tx)
                    .await?;
                let rows = if locked > 0 {
                    let rows = sqlx::query(CLAIM_LOCKED_POSTGRES)
                        .bind(now_ms)
                        .bind(lease)
                        .fetch_all(&mut *tx)
                        .await?;
                    rows.iter()
                        .map(decode)
                        .collect::<Result<Vec<_>, sqlx::Error>>()?
                } else {
                    Vec::new()
                };
                tx.commit().await?;
                rows
            }
            None => dispatch!(&self.0, b => {
                let params = [
                    Param::Int(now_ms),
                    Param::Int(lease),
                    Param::Int(i64::from(limit)),
                ];
                // A write: through SQLite's write gate.
                let _writer = self.sqlite_writer().await?;
                let rows = b.fetch_all(CLAIM_SQLITE.into_sql_str(), &params).await?;
                rows.iter().map(decode).collect::<Result<Vec<_>, sqlx::Error>>()
            })?,
        };
        Ok(rows
            .into_iter()
            .map(|r| OutboxRow {
                lease_ms: lease,
                ..r
            })
            .collect())
    }

    /// Deletes the rows `ids`: they were sent. One statement.
    ///
    /// # Errors
    /// The statement fails.
    pub async fn outbox_sent(&self, ids: &[i64]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let placeholders: Vec<String> = (1..=ids.len()).map(|i| format!("${i}")).collect();
        let sql = format!("{SENT} ({})", placeholders.join(", "));
        let params: Vec<Param<'_>> = ids.iter().map(|id| Param::Int(*id)).collect();
        dispatch!(&self.0, b => b.run(sqlx::AssertSqlSafe(sql).into_sql_str(), &params).await)?;
        Ok(())
    }

    /// Row `id`, claimed until `lease_ms`, could not be sent: due again at
    /// `due_ms`, with `error` (nothing when its lease is no longer that).
    ///
    /// # Errors
    /// The statement fails.
    pub async fn outbox_failed(
        &self,
        id: i64,
        due_ms: i64,
        error: &str,
        lease_ms: i64,
    ) -> Result<(), StoreError> {
        let params = [
            Param::Int(id),
            Param::Int(due_ms),
            Param::Text(error),
            Param::Int(lease_ms),
        ];
        dispatch!(&self.0, b => b.run(FAILED.into_sql_str(), &params).await)?;
        Ok(())
    }

    /// Gives the row `id`, claimed until `lease_ms`, back unsent, due at
    /// `due_ms`; its claim does not count as a try (nothing when its lease
    /// is no longer that).
    ///
    /// # Errors
    /// The statement fails.
    pub async fn outbox_release(
        &self,
        id: i64,
        due_ms: i64,
        lease_ms: i64,
    ) -> Result<(), StoreError> {
        let params = [Param::Int(id), Param::Int(due_ms), Param::Int(lease_ms)];
        dispatch!(&self.0, b => b.run(RELEASE.into_sql_str(), &params).await)?;
        Ok(())
    }

    /// Until `stop`, wakes `wake` whenever a transaction that stored
    /// outbox rows commits on another session ([`NOTIFY_CHANNEL`]). On
    /// PostgreSQL only; on SQLite it waits for `stop` (one file, one
    /// writer: the relay polls).
    pub async fn wake_on_outbox_rows(
        &self,
        wake: std::sync::Arc<tokio::sync::Notify>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        match self.postgres_pool() {
            Some(pool) => {
                super::postgres::listen::wake_on_notify(pool, NOTIFY_CHANNEL, wake, stop).await;
            }
            None => stop.cancelled().await,
        }
    }

    /// How many rows wait to be sent, and the oldest one's id.
    ///
    /// # Errors
    /// The query fails.
    pub async fn outbox_depth(&self) -> Result<(u64, Option<i64>), StoreError> {
        let (n, oldest) = dispatch!(&self.0, b => {
            let row = b.fetch_one(DEPTH.into_sql_str(), &[]).await?;
            Ok::<_, sqlx::Error>((row.int(0)?, row.opt_int(1)?))
        })?;
        Ok((u64::try_from(n).unwrap_or(0), oldest))
    }
}

/// The second key of `consumer`'s ordering key `key`'s advisory lock:
/// the first 4 bytes of the SHA-256 of both (NUL-separated), as a signed
/// 32-bit number.
fn key_lock(consumer: &str, key: &str) -> i64 {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(consumer.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    let d = h.finalize();
    let mut four = [0u8; 4];
    for (b, d) in four.iter_mut().zip(d.iter()) {
        *b = *d;
    }
    i64::from(i32::from_be_bytes(four))
}

/// The target of a row whose `kind` column says `kind`.
pub(super) fn target(kind: &str, target: String) -> Result<Target, sqlx::Error> {
    match kind {
        "publish" => Ok(Target::Publish(target)),
        "call" => Ok(Target::Call(target)),
        _ => Err(sqlx::Error::Decode("idem_outbox: unknown kind".into())),
    }
}

/// Now, in milliseconds since the Unix epoch (the host's clock).
pub fn now_ms() -> i64 {
    let now = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
    i64::try_from(now).unwrap_or(i64::MAX)
}

fn decode(row: &impl super::backend::HostRow) -> Result<OutboxRow, sqlx::Error> {
    let bad = |what: &str| sqlx::Error::Decode(format!("idem_outbox: {what}").into());
    let target = target(&row.text(4)?, row.text(5)?)?;
    let headers: Vec<(String, String)> =
        serde_json::from_str(&row.text(7)?).map_err(|_| bad("headers are no JSON pairs"))?;
    Ok(OutboxRow {
        id: row.int(0)?,
        consumer: row.text(1)?,
        message_id: row.text(2)?,
        call_index: u32::try_from(row.int(3)?).map_err(|_| bad("call index"))?,
        target,
        payload: row.bytes(6)?,
        headers,
        key: row.opt_text(8)?,
        attempts: u32::try_from(row.int(9)?).unwrap_or(u32::MAX),
        created_ms: row.int(10)?,
        lease_ms: 0,
    })
}
