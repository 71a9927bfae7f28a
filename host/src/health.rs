//! Database availability: which store errors mean "the database cannot be
//! reached" (as opposed to "this transaction failed"), and the shared gate
//! every handler waits on while it is unreachable.
//!
//! The rule (README, "Failures"): an unreachable database is not the
//! message's fault, so it must not spend the message's JetStream deliveries
//! (`max_deliver`) nor end in a dead letter. The handler that hit it holds
//! its message (in-progress acks keep it ours), every handler stops fetching,
//! one probe per [`DbHealth`] asks the database with backoff, and when it
//! answers the held messages run again from BEGIN: the receipt decides
//! whether an earlier COMMIT whose outcome was unknown had happened.

use crate::store::{Database, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, watch};

/// First wait between two probes of an unreachable database.
const PROBE_FIRST: Duration = Duration::from_millis(100);
/// Longest wait between two probes.
const PROBE_MAX: Duration = Duration::from_secs(5);
/// Bound on one probe (connect + `SELECT 1`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// True when `e` says the database could not be reached or used at all,
/// rather than refusing this transaction:
/// - driver level: I/O error, TLS failure, protocol error, pool timed out
///   (no connection could be opened within the acquire timeout), pool
///   closed, SQLite worker crashed;
/// - PostgreSQL SQLSTATE class `08` (connection exception), `57P01`
///   (admin_shutdown, e.g. `pg_terminate_backend`), `57P02` (crash_shutdown),
///   `57P03` (cannot_connect_now, e.g. starting up), `53300`
///   (too_many_connections), class `53` insufficient resources (disk full,
///   out of memory). Source: PostgreSQL manual, Appendix A;
/// - SQLite primary result codes `SQLITE_READONLY` (8), `SQLITE_IOERR` (10),
///   `SQLITE_FULL` (13), `SQLITE_CANTOPEN` (14). Source: sqlite.org/rescode.html.
///
/// Everything else (a constraint violated at COMMIT, a serialization
/// failure, a statement timeout) is a failed transaction.
pub fn is_unavailable(e: &StoreError) -> bool {
    let StoreError::Sqlx(e) = e;
    sqlx_unavailable(e)
}

/// [`is_unavailable`] for a driver error.
pub fn sqlx_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                matches!(sqlite_primary(&code), Some(8 | 10 | 13 | 14))
            } else {
                code.starts_with("08")
                    || code.starts_with("53")
                    || matches!(&*code, "57P01" | "57P02" | "57P03")
            }
        }),
        _ => false,
    }
}

/// True when `e` is SQLite's `SQLITE_BUSY` (5) or `SQLITE_LOCKED` (6): another
/// transaction held the single write lock past the busy timeout. Nobody is
/// at fault and nothing happened: the pipeline runs the message again from
/// BEGIN after a short backoff, spending no delivery.
pub fn is_busy(e: &StoreError) -> bool {
    let StoreError::Sqlx(sqlx::Error::Database(db)) = e else {
        return false;
    };
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
        && db
            .code()
            .is_some_and(|code| matches!(sqlite_primary(&code), Some(5 | 6)))
}

/// The primary result code (low 8 bits) of a SQLite extended result code.
fn sqlite_primary(code: &str) -> Option<i64> {
    code.parse::<i64>().ok().map(|c| c & 0xff)
}

/// The availability gate shared by every handler of one host.
pub struct DbHealth {
    db: Arc<Database>,
    /// `true` while the database answers.
    up: watch::Sender<bool>,
    /// Only one task probes at a time; the others wait for its verdict.
    prober: Mutex<()>,
    /// Turns true at shutdown: a wait for the database gives up.
    stop: watch::Receiver<bool>,
}

impl DbHealth {
    /// A gate for `db`, starting "up". `stop`: the host's shutdown signal.
    pub fn new(db: Arc<Database>, stop: watch::Receiver<bool>) -> Self {
        Self {
            db,
            up: watch::Sender::new(true),
            prober: Mutex::new(()),
            stop,
        }
    }

    /// Whether the database answered last time anyone looked.
    pub fn is_up(&self) -> bool {
        *self.up.borrow()
    }

    /// Waits until the database is up (at once if it is). Returns `false`
    /// if shutdown was requested first.
    pub async fn ready(&self) -> bool {
        let mut up = self.up.subscribe();
        let mut stop = self.stop.clone();
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => false,
            r = up.wait_for(|u| *u) => r.is_ok(),
        }
    }

    /// Resolves once shutdown has been requested while the database is down
    /// (never, if the host is not stopping). The pipeline races a message's
    /// whole run against it: a step stuck waiting for a connection that
    /// will not come is abandoned then (nothing of it was committed, and
    /// nothing is acked), instead of holding up the exit for the pool's
    /// acquire timeout.
    pub async fn stopped_while_down(&self) {
        let mut stop = self.stop.clone();
        let mut up = self.up.subscribe();
        if stop.wait_for(|s| *s).await.is_err() || up.wait_for(|u| !*u).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Sleeps `d`; `false` (at once) if shutdown is requested meanwhile.
    pub async fn pause(&self, d: Duration) -> bool {
        let mut stop = self.stop.clone();
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => false,
            _ = tokio::time::sleep(d) => true,
        }
    }

    /// Called by a handler whose `step` failed with an unavailable-class
    /// `error`: marks the database down (logging the change once), probes
    /// it with backoff (100 ms doubling to 5 s) until it answers, marks it up
    /// (logging once) and returns `true`. Returns `false` if shutdown was
    /// requested while waiting.
    pub async fn wait_until_up(&self, handler: &str, step: &str, error: &str) -> bool {
        let went_down = self.up.send_if_modified(|up| std::mem::replace(up, false));
        if went_down {
            tracing::error!(%handler, %step, %error, "database unavailable; every handler paused, nothing is acked or fetched until it answers");
        }
        let mut wait = PROBE_FIRST;
        let mut stop = self.stop.clone();
        loop {
            // Both the turn to probe and the probe itself give way to shutdown.
            let verdict = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return false,
                v = self.probe_once() => v,
            };
            if verdict {
                return true;
            }
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return false,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(PROBE_MAX);
        }
    }

    /// One probe, by whoever holds the prober lock; `true` when the database
    /// is (or was meanwhile found) up.
    async fn probe_once(&self) -> bool {
        let _probing = self.prober.lock().await;
        if self.is_up() {
            return true;
        }
        match tokio::time::timeout(PROBE_TIMEOUT, ping(&self.db)).await {
            Ok(Ok(())) => {
                if self.up.send_if_modified(|up| !std::mem::replace(up, true)) {
                    tracing::info!("database available again; resuming");
                }
                true
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "database probe failed");
                false
            }
            Err(_) => {
                tracing::debug!("database probe timed out");
                false
            }
        }
    }
}

/// Whether the database can take a message's transaction again.
/// PostgreSQL: `SELECT 1` on a pooled connection (the pool tests a
/// connection before handing it out, so a dead one left from before an
/// outage is replaced). SQLite: `BEGIN IMMEDIATE` then ROLLBACK, so a file
/// that can be read but not written (read-only, disk full) is still "down".
async fn ping(db: &Database) -> Result<(), sqlx::Error> {
    match db {
        Database::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
        Database::Sqlite(pool) => pool.begin_with("BEGIN IMMEDIATE").await?.rollback().await,
    }
}
