//! The relay: sends what committed messages stored in the outbox
//! (`idem_outbox`), on every host (no leader). A pass claims the due rows
//! of whole deliveries (one message's rows) for a lease ([`LEASE`];
//! PostgreSQL skips deliveries another host's claim holds), sends them
//! ([`SENDS_IN_FLIGHT`] deliveries at once, one delivery's rows in call
//! order, its publishes to one stream as one atomic batch,
//! [`super::batch`]), deletes the sent ones in one statement and makes
//! the others due again later ([`retry_after`]). A host that dies between sending and deleting
//! leaves the row to be claimed again after the lease; it is sent again
//! with the same id ([`delivery_id`]): JetStream drops the copy inside the
//! target stream's duplicate window (a PubAck with `duplicate: true`
//! counts as sent), and a receiver that honours `Idempotency-Key` sees the
//! call once. Message processing never waits for the relay.
//!
//! A pass runs when this host committed rows ([`Relay::waker`]), on
//! PostgreSQL when any host's transaction that stored rows commits (its
//! `pg_notify`, `store::NOTIFY_CHANNEL`), and at the latest every
//! [`POLL`] (what rows due again wait for, and on SQLite other processes'
//! rows). Every [`GAUGES_EVERY`] it sets the outbox gauges
//! ([`crate::metrics::OutboxGauges`]).

use super::Target;
use super::flight::{Flight, Outcome, Running, cancelled, deliveries};
use super::grants::OutboxGrants;
use super::streams::StreamFactsCache;
use crate::store::{Database, OutboxRow, PARKED};
use async_nats::jetstream;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use sha2::Digest as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How long a claim holds its rows: longer than a send may take
/// ([`SEND_TIMEOUT`]) and much shorter than JetStream's default duplicate
/// window (2 min), so a row sent again after a crash is still dropped as a
/// copy.
pub const LEASE: Duration = Duration::from_secs(30);
/// The longest wait between passes.
pub const POLL: Duration = Duration::from_secs(1);
/// The longest time between two sends of one row when a host dies after
/// sending and before deleting it: the lease, then the next poll, then
/// the send. A target stream's `duplicate_window` must be at least this
/// for JetStream to drop the copy (`outbox::window`); past it (a broker
/// unreachable for longer keeps a row failing) the downstream receipt
/// catches the copy, as its `Nats-Msg-Id` is the same.
pub const RESEND_HORIZON: Duration =
    Duration::from_secs(LEASE.as_secs() + POLL.as_secs() + SEND_TIMEOUT.as_secs());
/// How often the relay reads the outbox's depth and age for the gauges.
pub const GAUGES_EVERY: Duration = Duration::from_secs(5);
/// Deliveries one pass sends at once.
pub const SENDS_IN_FLIGHT: usize = 16;
/// When all of a pass's deliveries are started and none ended for this
/// long, the pass leaves the rest in flight and ends, so the next pass
/// claims what else is due.
pub const SLOW_SEND: Duration = Duration::from_millis(200);
/// Deliveries passes leave in flight at most; past it a pass waits for
/// its slow deliveries as for the others.
pub const MAX_SLOW: usize = 64;
/// Deliveries (one handler's message's rows, at most its
/// `max_outbox_calls`) one pass claims.
pub const CLAIM: u32 = 64;
/// The bound on one claim: a database that does not answer (a pool
/// waiting for a connection) fails the pass rather than holding it.
pub const CLAIM_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a stopping host keeps sending what is due.
pub const LAST_PASSES: Duration = Duration::from_secs(5);
/// After this many failed tries of one row, the failure is logged as a
/// warning (once); the earlier ones at debug level.
pub const WARN_AFTER_ATTEMPTS: u32 = 3;
/// The bound on one publish's PubAck or one call's answer.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Tries of one HTTP call; after the last the row is parked (never due
/// again, kept with its error for an operator).
pub const MAX_CALL_ATTEMPTS: u32 = 10;

/// The `Nats-Msg-Id` of a publish and the `Idempotency-Key` of a call:
/// `idem-` and the first 32 hex digits of the SHA-256 of consumer,
/// message id and call index (NUL-separated). The same on every send of
/// the row, and on a run of the same message again.
pub fn delivery_id(consumer: &str, message_id: &str, call_index: u32) -> String {
    let mut h = sha2::Sha256::new();
    h.update(consumer.as_bytes());
    h.update([0]);
    h.update(message_id.as_bytes());
    h.update([0]);
    h.update(call_index.to_be_bytes());
    let hex = hex::encode(h.finalize());
    format!("idem-{}", hex.get(..32).unwrap_or(&hex))
}

/// How long a row waits after its `attempts`-th failed send: doubling from
/// 100 ms up to 30 s, with jitter ([`crate::backoff::doubling`]).
pub fn retry_after(attempts: u32) -> Duration {
    let n = usize::try_from(attempts.saturating_sub(1)).unwrap_or(usize::MAX);
    crate::backoff::doubling(Duration::from_millis(100), Duration::from_secs(30))
        .nth(n)
        .unwrap_or(Duration::from_secs(30))
}

/// What one send came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// Stored, or answered 2xx.
    Sent,
    /// Stored before: the PubAck said `duplicate`.
    Duplicate,
}

/// What one send came to, or why not.
pub(super) type SendResult = Result<Sent, String>;

/// The relay of one host.
pub struct Relay {
    pub(super) db: Arc<Database>,
    pub(super) js: jetstream::Context,
    /// `js`'s connection, for a batch's requests.
    pub(super) client: async_nats::Client,
    /// Which stream stores a subject, for batches.
    pub(super) streams: StreamFactsCache,
    pub(super) http: reqwest::Client,
    /// Per handler, its grants (where its endpoints are).
    pub(super) grants: HashMap<String, Arc<OutboxGrants>>,
    pub(super) wake: Arc<Notify>,
    /// The last claim failed (and said so).
    pub(super) claim_failing: AtomicBool,
}

impl Relay {
    /// A relay sending `db`'s rows through `js` and to the endpoints of
    /// `grants` (per handler name).
    ///
    /// # Errors
    /// The HTTP client cannot be built (no TLS roots).
    pub fn new(
        db: Arc<Database>,
        js: jetstream::Context,
        grants: HashMap<String, Arc<OutboxGrants>>,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(SEND_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self {
            db,
            client: js.client(),
            js,
            streams: StreamFactsCache::default(),
            http,
            grants,
            wake: Arc::new(Notify::new()),
            claim_failing: AtomicBool::new(false),
        })
    }

    /// What starts a pass at once: notified by a host that committed rows.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Runs passes until `stop`: at once when woken, else every [`POLL`];
    /// then, for at most [`LAST_PASSES`], passes until none claims a row,
    /// so what the host committed last leaves before it exits.
    ///
    /// A stop ends a pass where it is: what was sent is deleted, what was
    /// not started is given back, and only a send in flight is left to
    /// be sent again after its lease, with the same id. With a database
    /// that did not answer the last claim there are no last passes.
    pub async fn run(self, stop: CancellationToken) {
        let listening = stop.child_token();
        let listener = {
            let (db, wake, stop) = (self.db.clone(), self.wake.clone(), listening.clone());
            tokio::spawn(async move { db.wake_on_outbox_rows(wake, stop).await })
        };
        let mut gauges = crate::metrics::OutboxGauges::default();
        let mut gauges_at = Instant::now();
        let mut flight = Flight::default();
        let publishers: Vec<(String, Vec<String>)> = self
            .grants
            .iter()
            .map(|(h, g)| (h.clone(), g.publish().to_vec()))
            .collect();
        // Its own task: a broker slow to list its streams holds up no send.
        let rechecking = {
            let (js, stop) = (self.js.clone(), listening.clone());
            tokio::spawn(async move {
                let mut recheck = super::window::Recheck::default();
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(super::window::RECHECK_EVERY) => {}
                    }
                    recheck.run(&js, &publishers).await;
                }
            })
        };
        loop {
            if gauges_at.elapsed() >= GAUGES_EVERY {
                self.set_gauges(&mut gauges).await;
                gauges_at = Instant::now();
            }
            // The pass watches `stop` itself, so what it sent is recorded.
            let claimed = self
                .pass(Some(&stop), Instant::now() + LEASE / 2, &mut flight)
                .await;
            if stop.is_cancelled() {
                break;
            }
            // Rows were there: more may be due now (the next row of a key
            // whose row was just deleted), so no wait.
            if claimed > 0 {
                continue;
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(POLL) => {}
                Some(()) = flight.slow.next(), if !flight.slow.is_empty() => {
                    self.record(&mut flight, false).await;
                }
            }
        }
        self.end(flight).await;
        listening.cancel();
        let _ = listener.await;
        let _ = rechecking.await;
        if self.claim_failing.load(Ordering::Relaxed) {
            return;
        }
        let until = Instant::now() + LAST_PASSES;
        // Ends a last pass at the bound, recording what it sent.
        let last_stop = CancellationToken::new();
        let at_bound = {
            let t = last_stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(LAST_PASSES).await;
                t.cancel();
            })
        };
        let last = async {
            let mut flight = Flight::default();
            while !last_stop.is_cancelled()
                && self.pass(Some(&last_stop), until, &mut flight).await > 0
            {}
            self.end(flight).await;
            self.db.outbox_depth().await
        };
        // Bounded as a whole: a database that does not answer keeps a
        // claim waiting for a connection.
        let bound = LAST_PASSES + 2 * CLAIM_TIMEOUT;
        let left = tokio::time::timeout(bound, last).await;
        at_bound.abort();
        if let Ok(Ok((left, _))) = left
            && left > 0
        {
            tracing::info!(
                rows = left,
                "outbox rows are left to send; the next host to run sends them"
            );
        }
    }

    /// One pass: claims the due deliveries and sends them,
    /// [`SENDS_IN_FLIGHT`] at once, until `until` or `stop`; the rows it
    /// did not start are given back, due at once, so a pass never holds
    /// rows past half their lease plus one send (another host would claim
    /// them again and send them twice). When all are started and none
    /// ends for [`SLOW_SEND`], the pass leaves the deliveries still in
    /// flight to `flight` (up to [`MAX_SLOW`]) and ends: one endpoint that
    /// does not answer holds up no other target. What ended by then (of
    /// this pass and of earlier slow ones) is recorded together at the
    /// end, the sent rows deleted in one statement. How many rows it
    /// claimed.
    pub async fn pass<'a>(
        &'a self,
        stop: Option<&'a CancellationToken>,
        until: Instant,
        flight: &mut Flight<'a>,
    ) -> usize {
        let now = now_ms();
        let lease = i64::try_from(LEASE.as_millis()).unwrap_or(i64::MAX);
        let claim = tokio::time::timeout(CLAIM_TIMEOUT, self.db.claim_outbox(now, lease, CLAIM));
        let claimed = match claim.await {
            Ok(claimed) => claimed.map_err(|e| e.to_string()),
            Err(_) => Err(format!(
                "the database did not answer within {CLAIM_TIMEOUT:?}"
            )),
        };
        let rows = match claimed {
            Ok(rows) => rows,
            Err(e) => {
                // Said once until a claim works again (a database that is
                // down is also reported by the pipeline).
                if !self.claim_failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "cannot claim outbox rows; trying again every {POLL:?}");
                }
                return 0;
            }
        };
        self.claim_failing.store(false, Ordering::Relaxed);
        let claimed = rows.len();
        flight
            .claimed
            .extend(rows.iter().map(|r| (r.id, r.lease_ms)));
        // Up to SENDS_IN_FLIGHT deliveries at once; the rows of one
        // delivery one step after the other, so rows of one key (which a
        // claim takes only from one delivery) leave in call order.
        let mut queue: std::collections::VecDeque<Vec<OutboxRow>> = deliveries(rows).into();
        let mut running: Running<'a> = FuturesUnordered::new();
        let mut last_end = Instant::now();
        let stopped = loop {
            while running.len() < SENDS_IN_FLIGHT
                && let Some(rows) = queue.pop_front()
            {
                let progress = flight.progress.clone();
                running.push(Box::pin(self.send_delivery(rows, stop, until, progress)));
            }
            if running.is_empty() {
                break false;
            }
            let may_leave = queue.is_empty() && flight.slow.len() + running.len() <= MAX_SLOW;
            tokio::select! {
                () = cancelled(stop) => break true,
                Some(()) = running.next() => last_end = Instant::now(),
                Some(()) = flight.slow.next(), if !flight.slow.is_empty() => {}
                () = tokio::time::sleep_until((last_end + SLOW_SEND).into()), if may_leave => {
                    flight.slow.extend(std::mem::take(&mut running));
                    break false;
                }
            }
        };
        drop(running);
        if stopped {
            // What was in flight keeps its lease; what was not started is
            // given back (`end`).
            flight.slow = FuturesUnordered::new();
            // A stopping host does not wait long on a database that does
            // not answer: what is not recorded is sent again after its
            // lease.
            let _ = tokio::time::timeout(CLAIM_TIMEOUT, self.record(flight, true)).await;
        } else {
            self.record(flight, false).await;
        }
        claimed
    }

    /// Ends `flight` at a stop: the slow deliveries are dropped (what they
    /// had in flight keeps its lease), and what ended is recorded, what
    /// was claimed and not started given back (bounded by
    /// [`CLAIM_TIMEOUT`]).
    async fn end(&self, mut flight: Flight<'_>) {
        flight.slow = FuturesUnordered::new();
        let _ = tokio::time::timeout(CLAIM_TIMEOUT, self.record(&mut flight, true)).await;
    }

    /// Records what ended in `flight`: sent rows deleted in one statement,
    /// failed ones due again later (or parked), rows given back due at their time, or at
    /// once. With `stopped`, also gives back every claimed row whose send
    /// has not begun.
    async fn record(&self, flight: &mut Flight<'_>, stopped: bool) {
        let (outcomes, started) = flight.progress.drain();
        // Taken out first: a record cut short (a stop's bound) leaves these
        // leased, not given back as if never started.
        for o in &outcomes {
            flight.claimed.remove(&o.row.id);
        }
        let mut sent = Vec::new();
        for Outcome {
            row,
            result,
            at,
            due,
        } in outcomes
        {
            match result {
                None => self.release(&row, due).await,
                Some(Ok(how)) => {
                    let target = self.target_label(&row);
                    crate::metrics::outbox_sent(&row.consumer, &target, how == Sent::Duplicate);
                    crate::metrics::outbox_delay(&row.consumer, row.created_ms, at);
                    sent.push(row.id);
                }
                Some(Err(e)) => self.record_failure(&row, &e, due).await,
            }
        }
        if let Err(e) = self.db.outbox_sent(&sent).await {
            tracing::warn!(error = %e, rows = sent.len(), "cannot delete sent outbox rows; they are sent again after their lease, with the same ids");
        }
        if stopped {
            // Not started: another host may send them at once. A send
            // that was in flight keeps its lease.
            let unstarted: Vec<(i64, i64)> = flight
                .claimed
                .iter()
                .filter(|(id, _)| !started.contains(id))
                .map(|(id, lease)| (*id, *lease))
                .collect();
            flight.claimed.clear();
            for (id, lease) in unstarted {
                if let Err(e) = self.db.outbox_release(id, now_ms(), lease).await {
                    tracing::debug!(error = %e, "cannot give an outbox row back; it is claimed again after its lease");
                }
            }
        }
    }

    /// Reads what waits per handler and grant into the gauges (bounded
    /// like a claim; a failure leaves them as they were).
    async fn set_gauges(&self, gauges: &mut crate::metrics::OutboxGauges) {
        match tokio::time::timeout(CLAIM_TIMEOUT, self.db.outbox_summary()).await {
            Ok(Ok(summary)) => gauges.set(
                &super::grants::summary_by_grant(&summary, &self.grants),
                now_ms(),
            ),
            Ok(Err(e)) => tracing::debug!(error = %e, "cannot read the outbox's depth"),
            Err(_) => tracing::debug!("the database did not answer the outbox depth query"),
        }
    }

    /// The metric label of `row`'s target: the grant it falls under
    /// (`(not run here)` for a handler this host does not run).
    fn target_label(&self, row: &OutboxRow) -> String {
        let grant = super::grants::grant_in(&self.grants, &row.consumer, &row.target);
        crate::metrics::outbox_target_label(&grant)
    }

    /// Gives `row` back unsent, due at `due` (at once when `None`).
    pub(super) async fn release(&self, row: &OutboxRow, due: Option<i64>) {
        let due = due.unwrap_or_else(now_ms);
        if let Err(e) = self.db.outbox_release(row.id, due, row.lease_ms).await {
            tracing::debug!(error = %e, "cannot give an outbox row back; it is claimed again after its lease");
        }
    }

    /// Records that `row`'s send failed with `e`: due again at `due` or
    /// after [`retry_after`] its tries, or parked after a call's last try.
    pub(super) async fn record_failure(&self, row: &OutboxRow, e: &str, due: Option<i64>) {
        let target = match &row.target {
            Target::Publish(s) | Target::Call(s) => s.as_str(),
        };
        crate::metrics::outbox_failed(&row.consumer, &self.target_label(row));
        let parked = matches!(row.target, Target::Call(_)) && row.attempts >= MAX_CALL_ATTEMPTS;
        let message_id = crate::deploy::record::bounded(&row.message_id);
        let due = if parked {
            tracing::warn!(handler = %row.consumer, message_id = %message_id, target, attempts = row.attempts, error = %e, "outbox call failed its last try; the row is kept, not sent again");
            PARKED
        } else {
            if row.attempts == WARN_AFTER_ATTEMPTS {
                tracing::warn!(handler = %row.consumer, message_id = %message_id, target, attempts = row.attempts, error = %e, "outbox send keeps failing; trying again (rows after it with the same key wait)");
            } else {
                tracing::debug!(handler = %row.consumer, target, attempts = row.attempts, error = %e, "outbox send failed; trying again later");
            }
            due.unwrap_or_else(|| {
                let wait = i64::try_from(retry_after(row.attempts).as_millis()).unwrap_or(i64::MAX);
                now_ms().saturating_add(wait)
            })
        };
        if let Err(err) = self.db.outbox_failed(row.id, due, e, row.lease_ms).await {
            tracing::warn!(error = %err, "cannot record a failed outbox send; the row is tried again after its lease");
        }
    }
}

pub(super) fn now_ms() -> i64 {
    crate::store::now_ms()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_id_is_the_same_for_the_same_call_and_differs_otherwise() {
        let a = delivery_id("orders", "o-1", 0);
        assert_eq!(a, delivery_id("orders", "o-1", 0));
        assert_eq!(a.len(), 5 + 32);
        assert!(a.starts_with("idem-"));
        assert_ne!(a, delivery_id("orders", "o-1", 1));
        assert_ne!(a, delivery_id("orders", "o-2", 0));
        assert_ne!(a, delivery_id("order", "so-1", 0), "fields are separated");
    }

    #[test]
    fn retries_wait_longer_each_time_up_to_a_bound() {
        assert!(retry_after(1) >= Duration::from_millis(100));
        assert!(retry_after(1) < Duration::from_millis(200));
        assert!(retry_after(4) >= Duration::from_millis(800));
        assert!(retry_after(50) >= Duration::from_secs(30));
        assert!(retry_after(50) < Duration::from_secs(60));
    }
}
