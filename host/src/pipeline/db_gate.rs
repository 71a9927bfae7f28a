//! The database availability gate every handler waits on while the
//! database is unreachable. Which store errors mean "the database cannot be
//! reached" (as opposed to "this transaction failed") is the store's
//! ([`StoreError::class`]); how the database is asked is too
//! ([`Database::probe`]).
//!
//! The rule (docs/semantics.md, "Failures"): an unreachable database is not the
//! message's fault, so it must not spend the message's JetStream deliveries
//! (`max_deliver`) nor end in a dead letter. The handler that hit it holds
//! its message (in-progress acks keep it ours), every handler stops fetching,
//! one probe per [`DbGate`] asks the database with backoff, and when it
//! answers the held messages run again from BEGIN: the receipt decides
//! whether an earlier COMMIT whose outcome was unknown had happened.

use crate::backoff;
use crate::store::{Database, ErrorClass, ProbeFailure, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;

/// First wait between two probes of an unreachable database.
const PROBE_FIRST: Duration = Duration::from_millis(100);
/// Longest wait between two probes.
const PROBE_MAX: Duration = Duration::from_secs(5);
/// Bound on one probe (connect + `SELECT 1`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// True when `e` says the database could not be reached or used at all,
/// rather than refusing this transaction ([`ErrorClass::Unavailable`]; the
/// codes are listed there).
pub fn is_unavailable(e: &StoreError) -> bool {
    e.class() == ErrorClass::Unavailable
}

/// True when `e` is SQLite's write lock staying busy past the busy timeout
/// ([`ErrorClass::Busy`]). Nobody is at fault and nothing happened: the
/// pipeline runs the message again from BEGIN after a short backoff,
/// spending no delivery.
pub fn is_busy(e: &StoreError) -> bool {
    e.class() == ErrorClass::Busy
}

/// The availability gate shared by every handler of one host.
pub struct DbGate {
    db: Arc<Database>,
    /// `true` while the database answers.
    up: watch::Sender<bool>,
    /// Only one task probes at a time; the others wait for its verdict.
    prober: Mutex<()>,
    /// Cancelled at shutdown: a wait for the database gives up.
    stop: CancellationToken,
}

impl DbGate {
    /// A gate for `db`, starting "up". `stop`: the host's stop signal.
    pub fn new(db: Arc<Database>, stop: CancellationToken) -> Self {
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
        tokio::select! {
            biased;
            () = self.stop.cancelled() => false,
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
        let mut up = self.up.subscribe();
        self.stop.cancelled().await;
        if up.wait_for(|u| !*u).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Sleeps `d`; `false` (at once) if shutdown is requested meanwhile.
    pub async fn pause(&self, d: Duration) -> bool {
        tokio::select! {
            biased;
            () = self.stop.cancelled() => false,
            () = tokio::time::sleep(d) => true,
        }
    }

    /// Called by a handler whose `step` failed with an unavailable-class
    /// `error`: marks the database down (logging the change once), probes
    /// it with backoff (100 ms doubling to 5 s, with jitter: [`backoff::doubling`]) until it answers, marks it up
    /// (logging once) and returns `true`. Returns `false` if shutdown was
    /// requested while waiting.
    pub async fn wait_until_up(&self, handler: &str, step: &str, error: &str) -> bool {
        let went_down = self.up.send_if_modified(|up| std::mem::replace(up, false));
        if went_down {
            tracing::error!(%handler, %step, %error, "database unavailable; every handler paused, nothing is acked or fetched until it answers");
        }
        let mut waits = backoff::doubling(PROBE_FIRST, PROBE_MAX);
        loop {
            // Both the turn to probe and the probe itself give way to shutdown.
            let verdict = tokio::select! {
                biased;
                () = self.stop.cancelled() => return false,
                v = self.probe_once() => v,
            };
            if verdict {
                return true;
            }
            if !self.pause(waits.next().unwrap_or(PROBE_MAX)).await {
                return false;
            }
        }
    }

    /// One probe, by whoever holds the prober lock; `true` when the database
    /// is (or was meanwhile found) up.
    async fn probe_once(&self) -> bool {
        let _probing = self.prober.lock().await;
        if self.is_up() {
            return true;
        }
        match self.db.probe(PROBE_TIMEOUT).await {
            Ok(()) => {
                if self.up.send_if_modified(|up| !std::mem::replace(up, true)) {
                    tracing::info!("database available again; resuming");
                }
                true
            }
            Err(ProbeFailure::Failed(e)) => {
                tracing::debug!(error = %e, "database probe failed");
                false
            }
            Err(ProbeFailure::TimedOut) => {
                tracing::debug!("database probe timed out");
                false
            }
        }
    }
}
