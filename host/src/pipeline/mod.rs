//! The protocol for one message, written once for every database
//! (ARCHITECTURE.md, "The protocol"):
//!
//! ```text
//! BEGIN → INSERT receipt ON CONFLICT DO NOTHING
//!   0 rows → ROLLBACK → ack → duplicate
//!   published longer ago than `retention` (broker's clock)
//!          → ROLLBACK → durable dead letter (beyond-horizon) → term
//!   run guest handle(msg) in this transaction
//!     ok     → COMMIT → confirmed ack
//!     retry  → ROLLBACK → nak with delay (dead letter on the last delivery)
//!     reject → ROLLBACK → durable dead letter → term
//!     trap   → as retry
//! ```
//!
//! Ack only after commit; never ack a message whose effect is not durable,
//! except one whose dead letter is durable first.
//!
//! The transaction itself (receipt, role, guest, COMMIT) is the prepared
//! handler's step, [`PreparedHandler::apply`], which `idem dlq redrive` runs
//! too; this module adds what belongs to a delivery: its message id, the
//! horizon, the verdict ([`crate::pipeline::verdict`]), the settlement toward the
//! broker, the counters, and holding the delivery while the database is
//! unavailable.

use crate::backoff;
use crate::broker::clock::BrokerClock;
use crate::broker::{self, Settlement};
use crate::config::HandlerConfig;
use db_gate::DbGate;

use crate::metrics::{CommitTimings, HandlerStats};
use crate::pipeline::step::{Applied, PreparedHandler, Rollback, StepFailed};
use crate::runtime::{GuestMessage, HandlerFailure};
use crate::store::{Database, DeadLetter, StoreError};
use async_nats::jetstream::Message;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;
use verdict::{Attempt, DeliveryCount, Verdict};

mod batch;
mod committed;
pub mod db_gate;
pub mod fault;
pub mod lookup;
pub mod message_id;
pub mod rehearse;
pub mod shadow_run;
pub mod step;
mod unsettled;
pub mod verdict;
pub use committed::{COMMITTED_IDS, COMMITTED_TTL, Committed};
pub use unsettled::Unsettled;

/// First wait before a held message runs again (doubling up to [`HOLD_MAX`],
/// with jitter: [`backoff::doubling`]).
const HOLD_FIRST: Duration = Duration::from_millis(50);
/// Longest wait between two runs of a held message.
const HOLD_MAX: Duration = Duration::from_secs(5);

/// Everything one handler needs to run the protocol on its messages: the
/// prepared handler, its config (stream, message id rule, delivery and
/// retry settings, retention), the broker's clock, the database and the
/// database gate. Built by [`Pipeline::new`]; read through its accessors.
pub struct Pipeline {
    handler: PreparedHandler,
    config: HandlerConfig,
    /// The broker's clock, which the retention window is measured on.
    clock: Arc<BrokerClock>,
    db: Arc<Database>,
    /// The host's database availability gate, shared by every handler.
    gate: Arc<DbGate>,
    /// Whether a message beyond the retention horizon is quarantined (always,
    /// but in a replay under a fresh name: [`Pipeline::without_horizon`]).
    horizon: bool,
    /// The message ids whose receipts this process saw committed lately: a
    /// copy of one has its receipt read, and is acked without a transaction
    /// when it is there.
    committed: Committed,
    /// Whether copies are arriving: deliveries are looked up before
    /// their transactions.
    copies: lookup::CopiesArriving,
    /// The deliveries being worked on, kept ours by one task.
    keep_alive: broker::KeepAlive,
}

/// What happened to one delivery (also counted in [`HandlerStats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The effect committed and the delivery was acked.
    Processed,
    /// A receipt existed: acked, nothing changed.
    Duplicate,
    /// Rolled back and naked to run again (the reason).
    Retried(String),
    /// Written as a dead letter, then termed (the reason).
    DeadLettered(String),
    /// A database step failed for a reason other than an outage (for example
    /// a constraint checked at COMMIT): rolled back, naked (counted as retried).
    StoreFailed(String),
    /// Left without ack, nak or term (shutdown while the database was
    /// unreachable, or not a JetStream delivery): `ack_wait` redelivers it.
    Unsettled(String),
}

impl Pipeline {
    /// The pipeline of `cfg`'s handler, prepared as `handler`. `gate`:
    /// the host's database gate (one per [`Database`], shared by every
    /// handler); `clock`: the broker's clock of the handler's stream.
    pub fn new(
        cfg: &HandlerConfig,
        handler: PreparedHandler,
        db: Arc<Database>,
        gate: Arc<DbGate>,
        clock: Arc<BrokerClock>,
    ) -> Self {
        Self {
            handler,
            config: cfg.clone(),
            clock,
            db,
            gate,
            horizon: true,
            committed: Committed::default(),
            copies: lookup::CopiesArriving::default(),
            keep_alive: broker::KeepAlive::new(cfg.ack_wait),
        }
    }

    /// Keeps `msg` ours (in-progress acks every third of `ack_wait`)
    /// until the returned guard is dropped.
    pub fn keep_in_progress(&self, msg: &Message) -> broker::InProgress {
        self.keep_alive.hold(msg.clone())
    }

    /// This pipeline runs a message beyond the retention horizon instead of
    /// quarantining it. Only for `idem replay --as` a name no configured
    /// handler has, whose receipts no host prunes (ARCHITECTURE.md
    /// invariant 7).
    pub fn without_horizon(mut self) -> Self {
        self.horizon = false;
        self
    }

    /// The handler's name (= its durable consumer's name).
    pub fn name(&self) -> &Arc<str> {
        self.handler.name()
    }

    /// The handler's counters.
    pub fn stats(&self) -> &Arc<HandlerStats> {
        self.handler.stats()
    }

    /// The prepared handler (its component slot, for a deploy).
    pub fn handler(&self) -> &PreparedHandler {
        &self.handler
    }

    /// The handler's config.
    pub fn config(&self) -> &HandlerConfig {
        &self.config
    }

    /// The broker's clock of the handler's stream.
    pub fn clock(&self) -> &Arc<BrokerClock> {
        &self.clock
    }

    /// Runs the protocol for one delivery, including its ack / nak / term,
    /// inside one tracing span (`delivery`: handler, stream sequence,
    /// delivery count, and the message id once it is known).
    ///
    /// While the database is unreachable ([`crate::pipeline::db_gate::is_unavailable`])
    /// the delivery is held, not naked: the in-progress keep-alive keeps it
    /// ours, the host waits for the database, and the protocol runs again
    /// from the start (the receipt decides whether an earlier COMMIT whose
    /// outcome was unknown had happened). An outage spends no deliveries.
    pub async fn process(&self, msg: &Message) -> Outcome {
        self.process_delivery(msg, false).await
    }

    /// [`Pipeline::process`] for a delivery a receipt lookup has just
    /// found new ([`Pipeline::split_duplicates`]): it is not looked up
    /// again before its transaction.
    pub async fn process_looked_up(&self, msg: &Message) -> Outcome {
        self.process_delivery(msg, true).await
    }

    /// [`Pipeline::process`]; `looked_up`: a receipt lookup has just found
    /// `msg` new, so it is not looked up again.
    pub(super) async fn process_delivery(&self, msg: &Message, looked_up: bool) -> Outcome {
        self.process_in_slot(msg, looked_up, None).await
    }

    /// [`Pipeline::process`] (`looked_up`: [`Pipeline::process_looked_up`])
    /// holding one of the consuming loop's concurrency slots, which is
    /// given back as soon as the delivery's transaction committed (or found
    /// its receipt) and only the confirmed ack is left, so the next
    /// delivery's transaction runs while the ack's round trip lasts
    /// (ARCHITECTURE.md, "Cost of a message"); otherwise when the delivery
    /// is settled.
    pub async fn process_in_slot(
        &self,
        msg: &Message,
        looked_up: bool,
        slot: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Outcome {
        HandlerStats::incr(&self.handler.stats().delivered);
        let _in_flight = self.handler.stats().in_flight();
        let d = match Delivery::of(msg, self.config().partitions.is_some()) {
            Ok(d) => Delivery {
                looked_up,
                slot: std::sync::Mutex::new(slot),
                ..d
            },
            Err(e) => {
                // Not a JetStream delivery (no ack subject): nothing to ack either.
                tracing::error!(handler = %self.handler.name(), error = %e, "message without JetStream metadata; ignored");
                return Outcome::Unsettled(format!("no JetStream metadata: {e}"));
            }
        };
        let span = self.delivery_span(&d);
        self.hold_while_unavailable(&d).instrument(span).await
    }

    /// The `delivery` span of `d`: handler, stream sequence, delivery
    /// count, and the message id once it is known.
    fn delivery_span(&self, d: &Delivery<'_>) -> tracing::Span {
        tracing::info_span!(
            "delivery",
            handler = %self.handler.name(),
            stream_sequence = d.stream_sequence,
            delivery = d.delivered,
            message_id = tracing::field::Empty,
        )
    }

    /// Runs [`Pipeline::run_once`] until it settles the delivery, holding it
    /// (with a doubling pause) while the database cannot be used.
    async fn hold_while_unavailable(&self, d: &Delivery<'_>) -> Outcome {
        // The work can take a while (a lock wait, a slow guest, a database
        // outage): keep the message ours until this delivery is settled.
        let _in_progress = self.keep_in_progress(d.msg);
        let mut waits = backoff::doubling(HOLD_FIRST, HOLD_MAX);
        let mut first = true;
        loop {
            let settled = tokio::select! {
                biased;
                r = self.run_once(d) => r,
                () = self.gate.stopped_while_down() => {
                    tracing::warn!("shutting down while the database is unavailable; the message is left for redelivery");
                    return Outcome::Unsettled("shutdown while the database was unavailable".into());
                }
            };
            match settled {
                Ok(outcome) => return outcome,
                Err(Unavailable { step, error, busy }) => {
                    HandlerStats::incr(&self.handler.stats().db_pauses);
                    let wait = waits.next().unwrap_or(HOLD_MAX);
                    let go_on = if busy {
                        tracing::debug!(%step, %error, "database busy; running the message again shortly");
                        self.gate.pause(wait).await
                    } else {
                        // Back off as well: a database that answers the probe
                        // but still fails this step (say, disk full) must not
                        // make this a hot loop.
                        self.gate
                            .wait_until_up(self.handler.name(), step, &error)
                            .await
                            && (first || self.gate.pause(wait).await)
                    };
                    if !go_on {
                        tracing::warn!(
                            "shutting down while the database is unavailable; the message is left for redelivery"
                        );
                        return Outcome::Unsettled(format!("{step}: {error}"));
                    }
                    first = false;
                }
            }
        }
    }

    /// One run of the protocol: the attempt ([`Pipeline::attempt`]), the
    /// decision ([`verdict::decide`]), the settlement ([`Pipeline::settle`]),
    /// then the counters. `Err` only when the database could not be used:
    /// nothing was acked, naked or termed, so the caller may run it again.
    async fn run_once(&self, d: &Delivery<'_>) -> Result<Outcome, Unavailable> {
        let (message_id, attempt) = self.attempt(d).await?;
        let count = DeliveryCount {
            delivered: d.delivered,
            max_deliver: self.config.max_deliver,
        };
        let verdict = verdict::decide(&attempt, count, self.config.nak_delay(d.delivered));
        let outcome = self
            .settle(d, message_id.as_deref(), &attempt, verdict)
            .await?;
        self.count(&attempt, &outcome);
        Ok(outcome)
    }

    /// Bumps the handler's counters for one settled delivery.
    fn count(&self, attempt: &Attempt, outcome: &Outcome) {
        if matches!(attempt, Attempt::GuestFailed(HandlerFailure::Trap(_))) {
            HandlerStats::incr(&self.handler.stats().traps);
        }
        let counter = match outcome {
            Outcome::Processed => &self.handler.stats().processed,
            Outcome::Duplicate => &self.handler.stats().duplicates,
            Outcome::Retried(_) | Outcome::StoreFailed(_) => &self.handler.stats().retried,
            Outcome::DeadLettered(_) => &self.handler.stats().dead_lettered,
            Outcome::Unsettled(_) => return,
        };
        HandlerStats::incr(counter);
    }

    /// The transaction step for one delivery: message_id, BEGIN, receipt,
    /// horizon, role, guest, COMMIT or ROLLBACK. Returns the message id (if
    /// it has one) and how the attempt ended; `Err` when the database could
    /// not be used (nothing committed).
    async fn attempt(&self, d: &Delivery<'_>) -> Result<(Option<String>, Attempt), Unavailable> {
        let message_id = match crate::pipeline::message_id::extract(
            &self.config.identity,
            d.msg.headers.as_ref(),
            &d.msg.payload,
        ) {
            Ok(id) => id,
            Err(reason) => return Ok((None, Attempt::NoMessageId(reason))),
        };
        tracing::Span::current().record("message_id", message_id.as_str());
        if !d.looked_up
            && self.worth_a_lookup(d.delivered, &message_id)
            && self
                .lookup(std::iter::once(message_id.as_str()))
                .await
                .contains(&message_id)
        {
            // The receipt is there (read outside a transaction: committed).
            // Not found (forgotten, pruned) or not readable: the
            // transaction decides, as for any message.
            tracing::debug!("receipt found by the lookup; a duplicate without a transaction");
            HandlerStats::incr(&self.handler.stats().duplicates_looked_up);
            return Ok((Some(message_id), Attempt::Duplicate));
        }
        let attempt = self.transaction(d, &message_id).await?;
        if matches!(attempt, Attempt::Committed | Attempt::Duplicate) {
            self.committed.insert(&message_id);
        }
        if matches!(attempt, Attempt::Duplicate) {
            self.copies.found_without_lookup();
        }
        Ok((Some(message_id), attempt))
    }

    /// BEGIN, then the handler's transaction step
    /// ([`PreparedHandler::apply`]) with the horizon as its admission check,
    /// and how it ended as an [`Attempt`].
    async fn transaction(
        &self,
        d: &Delivery<'_>,
        message_id: &str,
    ) -> Result<Attempt, Unavailable> {
        match self.transaction_once(d, message_id).await {
            // Rolled back whole, and the message no longer samples the
            // candidate: once more, as if it had never run.
            Err(StepFailed {
                step: shadow_run::SHADOW_LOST,
                ..
            }) => self.transaction_once(d, message_id).await,
            other => other,
        }
        .unwrap_or_else(|StepFailed { step, error }| store_failed(step, error))
    }

    /// One try of [`Pipeline::transaction`]; `Err` when a database step
    /// failed.
    async fn transaction_once(
        &self,
        d: &Delivery<'_>,
        message_id: &str,
    ) -> Result<Result<Attempt, Unavailable>, StepFailed> {
        let tx = match self.handler.begin(&self.db).await {
            Ok(tx) => tx,
            Err(e) => return Ok(store_failed("BEGIN", e)),
        };
        let msg = d.guest_message(message_id);
        // No receipt, but beyond the memory horizon: the receipt that would
        // recognise this message may have been pruned, so it cannot be
        // proven new; quarantined before any guest code (ARCHITECTURE.md
        // invariant 7). Judged after the receipt insert, so a prune that
        // deleted the receipt before it is seen here.
        let admit = || {
            self.horizon
                .then(|| self.beyond_horizon(d.published_ms))
                .flatten()
        };
        // `refuse_out_of_order`: the key whose last applied stream sequence
        // this message must pass.
        let order_key = self
            .config
            .refuse_out_of_order
            .then(|| {
                self.config.order_key.as_ref().and_then(|rule| {
                    message_id::order_key(rule, &d.subject, d.msg.headers.as_ref(), &d.msg.payload)
                })
            })
            .flatten();
        let attempt = match self
            .handler
            .apply(tx, msg, admit, order_key.as_deref())
            .await
        {
            Ok(Applied::Committed(timings)) => {
                self.note_commit(d, timings);
                Ok(Attempt::Committed)
            }
            Ok(Applied::Duplicate(tx)) => {
                if let Err(e) = tx.rollback().await {
                    tracing::warn!(error = %e, "rollback of a duplicate failed");
                }
                Ok(Attempt::Duplicate)
            }
            Ok(Applied::Refused(reason)) => Ok(Attempt::Refused(reason)),
            Ok(Applied::GuestFailed(failure, Rollback::Failed(e)))
                if db_gate::is_unavailable(&e) =>
            {
                // The connection broke under the guest: its verdict came from
                // failed statements, not from the message. Run it again.
                Err(Unavailable {
                    step: "handler transaction",
                    error: format!("{e} (the guest returned {failure})"),
                    busy: false,
                })
            }
            Ok(Applied::GuestFailed(failure, _)) => Ok(Attempt::GuestFailed(failure)),
            // Failed, or at COMMIT outcome unknown: never ack. An unknown
            // outcome runs again, where the receipt decides.
            Err(failed) => return Err(failed),
        };
        Ok(attempt)
    }

    /// Counts `d`'s COMMIT: its guest and COMMIT times, and the time from
    /// publish to COMMIT, both on the broker's clock (ARCHITECTURE.md
    /// invariant 7; a reading's error below 0 is 0).
    fn note_commit(&self, d: &Delivery<'_>, timings: CommitTimings) {
        let since_publish = self.clock.now_ms().saturating_sub(d.published_ms);
        let since_publish = Duration::from_millis(u64::try_from(since_publish).unwrap_or(0));
        self.handler.stats().committed(timings, since_publish);
    }

    /// Acts on `verdict` toward the broker (ack, nak, or a durable dead
    /// letter then term), and says what happened. `Err` when the dead letter
    /// could not be written because the database is unavailable (nothing
    /// was termed).
    async fn settle(
        &self,
        d: &Delivery<'_>,
        message_id: Option<&str>,
        attempt: &Attempt,
        verdict: Verdict,
    ) -> Result<Outcome, Unavailable> {
        match verdict {
            Verdict::Duplicate => {
                tracing::debug!("duplicate: receipt exists; acking");
                d.free_slot();
                self.confirm_ack(d.msg).await;
                Ok(Outcome::Duplicate)
            }
            Verdict::Processed => {
                d.free_slot();
                if fault::after_commit() == fault::AfterCommit::Ack {
                    self.confirm_ack(d.msg).await;
                }
                Ok(Outcome::Processed)
            }
            Verdict::Retry { reason, delay } => {
                tracing::info!(%reason, "rolled back; will retry");
                if let Err(e) = broker::settle(d.msg, Settlement::Nak(delay)).await {
                    tracing::warn!(error = %e, "nak failed; ack_wait will redeliver");
                }
                Ok(match attempt {
                    Attempt::StoreFailed { .. } => Outcome::StoreFailed(reason),
                    _ => Outcome::Retried(reason),
                })
            }
            Verdict::DeadLetter {
                reason,
                without_message_id,
            } => {
                let message_id = if without_message_id { None } else { message_id };
                self.dead_letter(d, message_id, &reason).await
            }
        }
    }

    /// `Some(reason)` when a message published at `published_ms` (Unix ms,
    /// the broker's clock) is older than the retention window by the
    /// broker's clock now.
    fn beyond_horizon(&self, published_ms: i64) -> Option<String> {
        let age = crate::retention::beyond_horizon(
            published_ms,
            self.clock.now_ms(),
            self.config.retention,
        )?;
        Some(format!(
            "beyond-horizon: published {} ago, older than the retention window of {}; its receipt may be pruned, so it cannot be proven new",
            humantime::format_duration(Duration::from_secs(age.as_secs())),
            humantime::format_duration(self.config.retention)
        ))
    }

    async fn confirm_ack(&self, msg: &Message) {
        if let Err(e) = broker::settle(msg, Settlement::Ack).await {
            HandlerStats::incr(&self.handler.stats().ack_failures);
            tracing::warn!(error = %e, "ack after commit failed; the receipt will absorb the redelivery");
        }
    }

    /// Writes the dead letter durably, then terms. If the write fails the
    /// message is not termed: held while the database is unreachable, naked
    /// otherwise. Nothing is dropped.
    async fn dead_letter(
        &self,
        d: &Delivery<'_>,
        message_id: Option<&str>,
        reason: &str,
    ) -> Result<Outcome, Unavailable> {
        let dl = DeadLetter {
            consumer: self.handler.name(),
            message_id,
            stream: &self.config.stream,
            stream_sequence: d.stream_sequence,
            published_ns: d.published_ns,
            subject: &d.subject,
            reason,
            headers: &d.headers,
            payload: &d.msg.payload,
        };
        let written = match self.db.dead_letter(&dl).await {
            Ok(()) => Ok(()),
            Err(e) => {
                if let Some(hold) = Unavailable::of("dead letter", &e) {
                    return Err(hold);
                }
                // Something in the message itself cannot be stored: keep
                // what can be (payload, sequence, the reason and why).
                tracing::error!(error = %e, "cannot write the full dead letter; writing it without message id and headers");
                let fallback_reason = format!(
                    "{reason} (the full dead letter could not be written: {})",
                    e
                );
                let minimal = DeadLetter {
                    message_id: None,
                    headers: &[],
                    reason: &fallback_reason,
                    ..dl
                };
                self.db.dead_letter(&minimal).await
            }
        };
        match written {
            Ok(()) => {
                tracing::warn!(%reason, "dead-lettered");
                if let Err(e) = broker::settle(d.msg, Settlement::Term).await {
                    tracing::warn!(error = %e, "term after dead letter failed; a redelivery will find the dead letter row already written");
                }
                Ok(Outcome::DeadLettered(reason.to_string()))
            }
            Err(e) => {
                if let Some(hold) = Unavailable::of("dead letter", &e) {
                    return Err(hold);
                }
                // The consumer has no JetStream max_deliver (idem enforces
                // its own), so a nak always comes back: nothing is dropped.
                tracing::error!(error = %e, "cannot write the dead letter; naked, it will be tried again");
                let delay = self.config.nak_delay(d.delivered);
                if let Err(e) = broker::settle(d.msg, Settlement::Nak(delay)).await {
                    tracing::warn!(error = %e, "nak failed; ack_wait will redeliver");
                }
                Ok(Outcome::StoreFailed(format!("dead letter: {e}")))
            }
        }
    }
}

/// A database step of the transaction failed: unreachable or busy → `Err`
/// (the caller holds the message and runs it again); any other error (for
/// example a deferred constraint checked at COMMIT) is a failed attempt,
/// retried like a guest `retry` and dead-lettered on the last delivery.
fn store_failed(step: &'static str, error: StoreError) -> Result<Attempt, Unavailable> {
    if let Some(hold) = Unavailable::of(step, &error) {
        return Err(hold);
    }
    if step == "receipt insert" && error.is_lock_wait() {
        // The receipt insert waits only on another transaction holding a
        // copy of this message's receipt (a batch holds it until its
        // COMMIT): contention, not the message's fault. Held, like busy.
        return Err(Unavailable {
            step,
            error: error.to_string(),
            busy: true,
        });
    }
    tracing::error!(%step, %error, "database step failed; rolled back");
    Ok(Attempt::StoreFailed {
        step,
        error: error.to_string(),
    })
}

/// One delivery as the protocol reads it.
struct Delivery<'a> {
    msg: &'a Message,
    stream_sequence: u64,
    /// JetStream's delivery count, 1-based.
    delivered: u64,
    /// Publish time, Unix ms (the broker's clock).
    published_ms: i64,
    /// Publish time, Unix ns (the broker's clock): with the stream sequence
    /// it names one stored message, even across a stream created again.
    published_ns: i64,
    subject: String,
    headers: Vec<(String, String)>,
    /// A receipt lookup has just found it new: not looked up again.
    looked_up: bool,
    /// The consuming loop's concurrency slot it holds, if any
    /// ([`Pipeline::process_in_slot`]).
    slot: std::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>,
}

impl<'a> Delivery<'a> {
    /// `msg` as the protocol reads it.
    ///
    /// # Errors
    /// `msg` carries no JetStream metadata (no ack subject).
    /// `partitioned`: the stream stores the message under a partition
    /// number before the subject it was published to, which is dropped.
    fn of(msg: &'a Message, partitioned: bool) -> Result<Self, async_nats::Error> {
        let info = msg.info()?;
        let published_ns = i64::try_from(info.published.unix_timestamp_nanos()).unwrap_or(i64::MAX);
        let headers: Vec<(String, String)> = msg
            .headers
            .iter()
            .flat_map(|h| {
                h.iter().flat_map(|(k, vs)| {
                    vs.iter()
                        .map(move |v| (k.to_string(), v.as_str().to_string()))
                })
            })
            .collect();
        Ok(Delivery {
            msg,
            stream_sequence: info.stream_sequence,
            delivered: u64::try_from(info.delivered).unwrap_or(1),
            published_ms: published_ns.div_euclid(1_000_000),
            published_ns,
            subject: if partitioned {
                crate::broker::partition::published_subject(&msg.subject).to_string()
            } else {
                msg.subject.to_string()
            },
            headers,
            looked_up: false,
            slot: std::sync::Mutex::default(),
        })
    }

    /// Gives back the concurrency slot this delivery holds, if any: its
    /// transaction is over and only its ack is left.
    fn free_slot(&self) {
        drop(
            self.slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
    }

    /// The message the guest sees, under `message_id`.
    fn guest_message(&self, message_id: &str) -> GuestMessage {
        GuestMessage {
            message_id: message_id.to_owned(),
            subject: self.subject.clone(),
            headers: self.headers.clone(),
            payload: self.msg.payload.to_vec(),
            stream_sequence: self.stream_sequence,
            delivery_count: self.delivered,
            published_ms: self.published_ms,
        }
    }
}

/// The database could not be used at `step`; nothing was settled.
struct Unavailable {
    step: &'static str,
    error: String,
    /// SQLite's write lock stayed busy: contention, not an outage.
    busy: bool,
}

impl Unavailable {
    /// `Some` when `error` at `step` means "run again later" (outage or busy).
    fn of(step: &'static str, error: &StoreError) -> Option<Self> {
        let busy = db_gate::is_busy(error);
        (busy || db_gate::is_unavailable(error)).then(|| Unavailable {
            step,
            error: error.to_string(),
            busy,
        })
    }
}
