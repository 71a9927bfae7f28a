//! Every metric idem exports, defined in one place, and the per-handler
//! counters of the protocol's outcomes (the signals an operator watches:
//! duplicates skipped, retries, dead letters).
//!
//! A [`HandlerStats`] counter is a cheap atomic, read by the periodic stats
//! line, the shutdown summary and the tests, and at once a counter of the
//! `metrics` facade labelled `handler`, which the Prometheus recorder of
//! `idem run` renders on `/metrics` ([`install_recorder`], module
//! [`crate::service::http`]). Without an installed recorder (an in-process host, an
//! admin command) the facade's instruments do nothing. The instruments are
//! registered when the handler's stats are made ([`HandlerStats::new`]), so
//! the recorder must be installed before the host starts.

use metrics::{Counter, Gauge, Histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, Ordering::Relaxed};
use std::time::Duration;

/// The label every per-handler metric carries: the handler's name.
pub const HANDLER_LABEL: &str = "handler";

/// Counter names (Prometheus, `_total`) with their help text.
const COUNTERS: &[(&str, &str)] = &[
    (
        "idem_deliveries_total",
        "Deliveries taken from the broker (every copy, duplicates included).",
    ),
    (
        "idem_processed_total",
        "Deliveries whose effect committed (new receipt and handler writes).",
    ),
    (
        "idem_duplicates_total",
        "Deliveries whose message id already had a receipt: acked, nothing changed.",
    ),
    (
        "idem_retries_total",
        "Deliveries rolled back and naked to run again (guest retry, trap, failed database step).",
    ),
    (
        "idem_dead_letters_total",
        "Messages written to the dead-letter table, then termed.",
    ),
    (
        "idem_traps_total",
        "Guest calls that trapped (deadline, memory or other limit, panic).",
    ),
    (
        "idem_ack_failures_total",
        "Acks after COMMIT the broker did not confirm (the receipt absorbs the redelivery).",
    ),
    (
        "idem_db_pauses_total",
        "Times a delivery was held and run again because the database was unavailable or busy.",
    ),
    (
        "idem_receipts_pruned_total",
        "Receipts deleted by this host's pruning (rows).",
    ),
    (
        "idem_outbox_sent_total",
        "Outbox rows this host's relay sent (a PubAck or a 2xx answer), duplicates included.",
    ),
    (
        "idem_outbox_duplicates_total",
        "Outbox publishes the target stream had stored already (PubAck duplicate): sent before.",
    ),
    (
        "idem_outbox_failures_total",
        "Outbox sends that failed and wait to be tried again (or, for a call past its last try, are kept).",
    ),
    (
        "idem_unique_violations_total",
        "Guest statements that failed on a unique constraint.",
    ),
    (
        "idem_receipt_lookups_total",
        "Receipt lookups run before any transaction (for a pull, a batch, or one likely copy).",
    ),
    (
        "idem_duplicates_looked_up_total",
        "Duplicates a receipt lookup found, acked without a transaction (also in idem_duplicates_total).",
    ),
    (
        "idem_batched_total",
        "Deliveries settled after a batch transaction that carried several messages committed.",
    ),
    (
        "idem_log_bytes_dropped_total",
        "Guest log bytes dropped by the per-message cap.",
    ),
    (
        "idem_deploy_refused_total",
        "Deployment records this host refused, by reason (unsigned, untrusted_key, bad_signature, other_handler, replayed, not_a_record, component).",
    ),
    (
        "idem_sqlite_write_lock_waits_total",
        "SQLite transactions that found the write lock held by another connection when they began, and waited for it (another process writing the file, or several transactions of this host at once). No handler label.",
    ),
    (
        "idem_shadow_messages_total",
        "Sampled messages of a shadow candidate, by result (agreed, diverged: compared with the live version; skipped: not compared).",
    ),
];

/// Histogram names (seconds) with their help text.
const HISTOGRAMS: &[(&str, &str)] = &[
    (
        "idem_handler_seconds",
        "Time of the guest's handle call, for deliveries whose effect committed.",
    ),
    (
        "idem_commit_seconds",
        "Time of the COMMIT of deliveries whose effect committed.",
    ),
    (
        "idem_publish_to_commit_seconds",
        "From the message's publish time to its COMMIT, on the broker's clock.",
    ),
    (
        "idem_outbox_delay_seconds",
        "From an outbox row's storing (in its message's transaction) to its send being acknowledged, on the hosts' clocks.",
    ),
];

/// Gauge names with their unit and help text.
const GAUGES: &[(&str, Option<Unit>, &str)] = &[
    (
        "idem_in_flight",
        None,
        "Deliveries this host is working on now.",
    ),
    (
        "idem_consumer_pending",
        None,
        "Messages of the durable consumer not yet delivered, as the broker reports them.",
    ),
    (
        "idem_consumer_ack_pending",
        None,
        "Messages delivered and not yet acked, as the broker reports them.",
    ),
    (
        "idem_consumer_silence_seconds",
        Some(Unit::Seconds),
        "How long JetStream has said nothing (no message, no heartbeat) to the handler's pull requests while they waited: under the 2 s heartbeat while it answers, 0 while nothing is asked.",
    ),
    (
        "idem_receipts",
        None,
        "The handler's receipts (PostgreSQL: the planner's estimate; SQLite: exact).",
    ),
    (
        "idem_oldest_receipt_age_seconds",
        Some(Unit::Seconds),
        "Age of the handler's oldest receipt on the broker's clock (0 without receipts).",
    ),
    (
        "idem_retention_seconds",
        Some(Unit::Seconds),
        "The handler's retention window.",
    ),
    (
        "idem_outbox_pending",
        None,
        "Outbox rows of the handler and target not sent yet and still tried (read every 5 s).",
    ),
    (
        "idem_outbox_parked",
        None,
        "Outbox rows of the handler and target parked after their last try (`idem outbox retry` sends them again).",
    ),
    (
        "idem_outbox_oldest_age_seconds",
        Some(Unit::Seconds),
        "Age of the handler and target's oldest pending outbox row (0 without one).",
    ),
];

/// Sets `handler`'s `idem_consumer_silence_seconds` to `silence`
/// ([`crate::broker::liveness::Liveness::silence`]).
pub fn set_consumer_silence(handler: &str, silence: Duration) {
    metrics::gauge!("idem_consumer_silence_seconds", HANDLER_LABEL => handler.to_owned())
        .set(silence.as_secs_f64());
}

/// Upper bounds (seconds) of the histograms' buckets: 1 ms to 1 h.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];

/// Installs the process-wide Prometheus recorder (histograms with
/// buckets from 1 ms to 1 h) and describes every metric, so `/metrics` has their
/// help text. Only `idem run` calls it, before the host starts.
///
/// # Errors
/// A recorder is already installed, or the buckets are refused.
pub fn install_recorder() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
        .install_recorder()
        .map_err(|e| anyhow::anyhow!("cannot install the metrics recorder: {e}"))?;
    for (name, help) in COUNTERS {
        metrics::describe_counter!(*name, *help);
    }
    for (name, help) in HISTOGRAMS {
        metrics::describe_histogram!(*name, Unit::Seconds, *help);
    }
    for (name, unit, help) in GAUGES {
        match unit {
            Some(u) => metrics::describe_gauge!(*name, *u, *help),
            None => metrics::describe_gauge!(*name, *help),
        }
    }
    Ok(handle)
}

/// Counts one `BEGIN IMMEDIATE` on SQLite that found the write lock held
/// by a writer outside the host's message transactions (which queue at
/// their pool's write gate) and waited for it
/// (`idem_sqlite_write_lock_waits_total`; ARCHITECTURE.md, "SQLite on the
/// handler's task").
pub fn sqlite_write_lock_waited() {
    metrics::counter!("idem_sqlite_write_lock_waits_total").increment(1);
}

/// Registers `idem_sqlite_write_lock_waits_total` at 0, so a host on SQLite
/// exports it before its first wait.
pub fn sqlite_write_lock_waits_exported() {
    metrics::counter!("idem_sqlite_write_lock_waits_total").increment(0);
}

/// Counts one deployment record of `handler` this host refused
/// (`idem_deploy_refused_total`), `reason` being one of the fixed set of
/// [`crate::deploy::trust::Refusal::label`].
pub fn deploy_refused(handler: &str, reason: &'static str) {
    metrics::counter!(
        "idem_deploy_refused_total",
        HANDLER_LABEL => handler.to_owned(),
        "reason" => reason
    )
    .increment(1);
}

/// Counts one sampled message of `handler`'s shadow candidate
/// (`idem_shadow_messages_total`), `result` being `agreed`, `diverged` or
/// `skipped`.
pub fn shadow_message(handler: &str, result: &'static str) {
    metrics::counter!(
        "idem_shadow_messages_total",
        HANDLER_LABEL => handler.to_owned(),
        "result" => result
    )
    .increment(1);
}

/// The `target` label of an outbox series: `publish:PATTERN` or
/// `call:ENDPOINT`, the grant a row falls under
/// (`outbox::OutboxGrants::grant_of`), so the label values are bounded by
/// the config.
pub fn outbox_target_label(grant: &crate::outbox::Target) -> String {
    match grant {
        crate::outbox::Target::Publish(t) => format!("publish:{t}"),
        crate::outbox::Target::Call(t) => format!("call:{t}"),
    }
}

/// Counts one outbox row of `handler` to `target` (a label from
/// [`outbox_target_label`]) the relay sent (`idem_outbox_sent_total`), and
/// whether the stream had it already (`idem_outbox_duplicates_total`).
pub fn outbox_sent(handler: &str, target: &str, duplicate: bool) {
    let labels = [
        (HANDLER_LABEL, handler.to_owned()),
        ("target", target.to_owned()),
    ];
    metrics::counter!("idem_outbox_sent_total", &labels).increment(1);
    if duplicate {
        metrics::counter!("idem_outbox_duplicates_total", &labels).increment(1);
    }
}

/// Records how long `handler`'s outbox row waited from its storing
/// (`created_ms`, Unix ms) to now, when its send was acknowledged
/// (`idem_outbox_delay_seconds`); nothing for a row without a storing time.
pub fn outbox_delay(handler: &str, created_ms: i64, now_ms: i64) {
    if created_ms > 0 {
        let ms = u64::try_from(now_ms.saturating_sub(created_ms)).unwrap_or(0);
        metrics::histogram!("idem_outbox_delay_seconds", HANDLER_LABEL => handler.to_owned())
            .record(Duration::from_millis(ms).as_secs_f64());
    }
}

/// The outbox gauges (`idem_outbox_pending`, `idem_outbox_parked`,
/// `idem_outbox_oldest_age_seconds`), per handler and grant (labels
/// `handler`, `target`: `publish:PATTERN` or `call:ENDPOINT`, as
/// `outbox::grants::summary_by_grant` makes them); a pair that had rows
/// and has none any more is set to 0.
#[derive(Debug, Default)]
pub struct OutboxGauges {
    /// The label pairs set last time.
    seen: std::collections::BTreeSet<(String, String)>,
}

impl OutboxGauges {
    /// Sets every gauge from `summary` at `now_ms` (Unix ms).
    pub fn set(&mut self, summary: &[crate::store::OutboxSummary], now_ms: i64) {
        let mut seen = std::collections::BTreeSet::new();
        for s in summary {
            let target = outbox_target_label(&s.target);
            let age = s.oldest_ms.map_or(0.0, |t| {
                Duration::from_millis(u64::try_from(now_ms.saturating_sub(t)).unwrap_or(0))
                    .as_secs_f64()
            });
            Self::put(&s.consumer, &target, s.pending, s.parked, age);
            seen.insert((s.consumer.clone(), target));
        }
        for (handler, target) in self.seen.difference(&seen) {
            Self::put(handler, target, 0, 0, 0.0);
        }
        self.seen = seen;
    }

    fn put(handler: &str, target: &str, pending: u64, parked: u64, age: f64) {
        let labels = [
            (HANDLER_LABEL, handler.to_owned()),
            ("target", target.to_owned()),
        ];
        #[allow(clippy::cast_precision_loss)]
        {
            metrics::gauge!("idem_outbox_pending", &labels).set(pending as f64);
            metrics::gauge!("idem_outbox_parked", &labels).set(parked as f64);
        }
        metrics::gauge!("idem_outbox_oldest_age_seconds", &labels).set(age);
    }
}

/// Counts one failed outbox send of `handler` to `target` (a label from
/// [`outbox_target_label`]) (`idem_outbox_failures_total`).
pub fn outbox_failed(handler: &str, target: &str) {
    let labels = [
        (HANDLER_LABEL, handler.to_owned()),
        ("target", target.to_owned()),
    ];
    metrics::counter!("idem_outbox_failures_total", &labels).increment(1);
}

/// One counter: an atomic read by the stats line and the tests, and the
/// exported counter of the same name.
#[derive(Debug)]
pub struct Count {
    value: AtomicU64,
    exported: Counter,
}

impl Count {
    fn new(name: &'static str, handler: &str) -> Self {
        Self {
            value: AtomicU64::new(0),
            exported: metrics::counter!(name, HANDLER_LABEL => handler.to_owned()),
        }
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Relaxed);
        self.exported.increment(n);
    }

    /// The count so far.
    pub fn get(&self) -> u64 {
        self.value.load(Relaxed)
    }
}

/// The exported instruments of one handler that are not counters.
#[derive(Debug)]
struct Instruments {
    handler_seconds: Histogram,
    commit_seconds: Histogram,
    publish_to_commit_seconds: Histogram,
    in_flight: Gauge,
    consumer_pending: Gauge,
    consumer_ack_pending: Gauge,
    receipts: Gauge,
    oldest_receipt_age_seconds: Gauge,
}

/// Counters for one handler since the host started, and its other exported
/// instruments. All counts are messages (deliveries), not rows, except
/// `log_bytes_dropped`, `receipts_pruned` and `unique_violations`.
#[derive(Debug)]
pub struct HandlerStats {
    /// Deliveries taken from the broker (`idem_deliveries_total`).
    pub delivered: Count,
    /// Effects committed (new receipt + handler writes) (`idem_processed_total`).
    pub processed: Count,
    /// Deliveries whose message id already had a receipt: rolled back and
    /// acked (`idem_duplicates_total`).
    pub duplicates: Count,
    /// Deliveries rolled back and naked for a later delivery (guest retry,
    /// trap, store error) (`idem_retries_total`).
    pub retried: Count,
    /// Messages written to the dead-letter table and termed (`idem_dead_letters_total`).
    pub dead_lettered: Count,
    /// Guest traps (deadline, memory, panic): each also counted as retried
    /// or dead-lettered (`idem_traps_total`).
    pub traps: Count,
    /// Confirmed acks that failed after a commit (the receipt covers the
    /// redelivery) (`idem_ack_failures_total`).
    pub ack_failures: Count,
    /// Guest log output (bytes) dropped by the per-message cap
    /// (`idem_log_bytes_dropped_total`).
    pub log_bytes_dropped: Count,
    /// Times a delivery was held and run again instead of naked: the
    /// database was unreachable (held until it answered) or, on SQLite, its
    /// write lock stayed busy past the busy timeout (run again after a
    /// short backoff) (`idem_db_pauses_total`).
    pub db_pauses: Count,
    /// Receipts deleted by the pruning task because they were older than the
    /// handler's `retention` (rows, not messages) (`idem_receipts_pruned_total`).
    pub receipts_pruned: Count,
    /// Guest statements that failed on a unique constraint (statements,
    /// not messages) (`idem_unique_violations_total`).
    pub unique_violations: Count,
    /// Deliveries settled after a batch transaction (`batch` above 1) that
    /// carried several messages committed (`idem_batched_total`); each is
    /// also counted as processed, duplicate, retried or dead-lettered.
    pub batched: Count,
    /// Receipt lookups run before any transaction, each for the
    /// deliveries of one pull or batch, or one likely copy
    /// (`idem_receipt_lookups_total`).
    pub receipt_lookups: Count,
    /// Deliveries a receipt lookup found committed, acked without a
    /// transaction (`idem_duplicates_looked_up_total`); each is also
    /// counted as a duplicate.
    pub duplicates_looked_up: Count,
    in_flight_now: Arc<AtomicU64>,
    instruments: Instruments,
}

/// What describes a handler in its metrics (`idem_handler_info`, which
/// names its component, is [`crate::runtime::handler_info`]'s).
#[derive(Debug, Clone, Copy)]
pub struct HandlerIdentity<'a> {
    /// The handler's name (the `handler` label).
    pub name: &'a str,
    /// Its retention window (`idem_retention_seconds`).
    pub retention: Duration,
}

/// How long the two timed steps of a committed delivery took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitTimings {
    /// The guest's `handle` call.
    pub handler: Duration,
    /// The COMMIT.
    pub commit: Duration,
}

/// Counts a delivery in flight (`idem_in_flight`, and
/// [`HandlerStats::in_flight_now`]) until dropped.
#[must_use = "the delivery is in flight until this is dropped"]
pub struct InFlight(Gauge, Arc<AtomicU64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
        self.1.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Default for HandlerStats {
    /// The stats of a handler without a name or retention (for
    /// tests that call the runtime directly).
    fn default() -> Self {
        Self::new(HandlerIdentity {
            name: "",
            retention: Duration::ZERO,
        })
    }
}

impl HandlerStats {
    /// Zeroed counters for the handler `id.name`, its instruments
    /// registered with the installed recorder (none: they do nothing), and
    /// `idem_retention_seconds` set.
    pub fn new(id: HandlerIdentity<'_>) -> Self {
        let handler = id.name;
        let gauge = |name: &'static str| metrics::gauge!(name, HANDLER_LABEL => handler.to_owned());
        let histogram =
            |name: &'static str| metrics::histogram!(name, HANDLER_LABEL => handler.to_owned());
        gauge("idem_retention_seconds").set(id.retention.as_secs_f64());
        Self {
            delivered: Count::new("idem_deliveries_total", handler),
            processed: Count::new("idem_processed_total", handler),
            duplicates: Count::new("idem_duplicates_total", handler),
            retried: Count::new("idem_retries_total", handler),
            dead_lettered: Count::new("idem_dead_letters_total", handler),
            traps: Count::new("idem_traps_total", handler),
            ack_failures: Count::new("idem_ack_failures_total", handler),
            log_bytes_dropped: Count::new("idem_log_bytes_dropped_total", handler),
            db_pauses: Count::new("idem_db_pauses_total", handler),
            receipts_pruned: Count::new("idem_receipts_pruned_total", handler),
            unique_violations: Count::new("idem_unique_violations_total", handler),
            batched: Count::new("idem_batched_total", handler),
            receipt_lookups: Count::new("idem_receipt_lookups_total", handler),
            duplicates_looked_up: Count::new("idem_duplicates_looked_up_total", handler),
            in_flight_now: Arc::default(),
            instruments: Instruments {
                handler_seconds: histogram("idem_handler_seconds"),
                commit_seconds: histogram("idem_commit_seconds"),
                publish_to_commit_seconds: histogram("idem_publish_to_commit_seconds"),
                in_flight: gauge("idem_in_flight"),
                consumer_pending: gauge("idem_consumer_pending"),
                consumer_ack_pending: gauge("idem_consumer_ack_pending"),
                receipts: gauge("idem_receipts"),
                oldest_receipt_age_seconds: gauge("idem_oldest_receipt_age_seconds"),
            },
        }
    }

    /// Adds one to a counter.
    pub fn incr(counter: &Count) {
        counter.add(1);
    }

    /// Records one committed delivery's latencies: its guest call and
    /// COMMIT, and `publish_to_commit` (its COMMIT minus its publish time,
    /// both on the broker's clock).
    pub fn committed(&self, timings: CommitTimings, publish_to_commit: Duration) {
        let i = &self.instruments;
        i.handler_seconds.record(timings.handler.as_secs_f64());
        i.commit_seconds.record(timings.commit.as_secs_f64());
        i.publish_to_commit_seconds
            .record(publish_to_commit.as_secs_f64());
    }

    /// Counts one delivery in flight until the returned guard is dropped.
    pub fn in_flight(&self) -> InFlight {
        self.instruments.in_flight.increment(1.0);
        self.in_flight_now.fetch_add(1, Ordering::Relaxed);
        InFlight(
            self.instruments.in_flight.clone(),
            self.in_flight_now.clone(),
        )
    }

    /// Deliveries of this handler in flight now.
    pub fn in_flight_now(&self) -> u64 {
        self.in_flight_now.load(Ordering::Relaxed)
    }

    /// Sets the consumer gauges from the broker's consumer info: messages
    /// not yet delivered, and delivered but not yet acked.
    pub fn set_consumer(&self, pending: u64, ack_pending: u64) {
        // Gauges are f64: a count above 2^53 is rounded, never wrong by much.
        self.instruments.consumer_pending.set(pending as f64);
        self.instruments
            .consumer_ack_pending
            .set(ack_pending as f64);
    }

    /// Sets the receipt gauges: `rows` receipts, the oldest published
    /// `oldest_age` ago on the broker's clock (`None`: no receipts).
    pub fn set_receipts(&self, rows: u64, oldest_age: Option<Duration>) {
        self.instruments.receipts.set(rows as f64);
        self.instruments
            .oldest_receipt_age_seconds
            .set(oldest_age.unwrap_or_default().as_secs_f64());
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            delivered: self.delivered.get(),
            processed: self.processed.get(),
            duplicates: self.duplicates.get(),
            retried: self.retried.get(),
            dead_lettered: self.dead_lettered.get(),
            traps: self.traps.get(),
            ack_failures: self.ack_failures.get(),
            log_bytes_dropped: self.log_bytes_dropped.get(),
            db_pauses: self.db_pauses.get(),
            receipts_pruned: self.receipts_pruned.get(),
            unique_violations: self.unique_violations.get(),
            batched: self.batched.get(),
            receipt_lookups: self.receipt_lookups.get(),
            duplicates_looked_up: self.duplicates_looked_up.get(),
        }
    }
}

/// A point-in-time copy of [`HandlerStats`]' counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Deliveries received (every copy, duplicates included).
    pub delivered: u64,
    /// Deliveries whose effect committed.
    pub processed: u64,
    /// Deliveries whose receipt existed: acked, nothing changed.
    pub duplicates: u64,
    /// Deliveries rolled back and naked to run again.
    pub retried: u64,
    /// Deliveries written as dead letters, then termed.
    pub dead_lettered: u64,
    /// Guest calls that trapped (deadline, limit, panic).
    pub traps: u64,
    /// Acks after COMMIT the broker did not confirm.
    pub ack_failures: u64,
    /// Guest log bytes dropped by the per-message cap.
    pub log_bytes_dropped: u64,
    /// Times a delivery was held because the database was unavailable or busy.
    pub db_pauses: u64,
    /// Receipts deleted by pruning.
    pub receipts_pruned: u64,
    /// Guest statements that failed on a unique constraint.
    pub unique_violations: u64,
    /// Deliveries settled after a committed batch transaction.
    pub batched: u64,
    /// Receipt lookups run before any transaction.
    pub receipt_lookups: u64,
    /// Duplicates a receipt lookup found (also in `duplicates`).
    pub duplicates_looked_up: u64,
}

impl std::fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "delivered={} processed={} duplicates={} retried={} dead_lettered={} traps={} ack_failures={} log_bytes_dropped={} db_pauses={} receipts_pruned={} unique_violations={} batched={} receipt_lookups={} duplicates_looked_up={}",
            self.delivered,
            self.processed,
            self.duplicates,
            self.retried,
            self.dead_lettered,
            self.traps,
            self.ack_failures,
            self.log_bytes_dropped,
            self.db_pauses,
            self.receipts_pruned,
            self.unique_violations,
            self.batched,
            self.receipt_lookups,
            self.duplicates_looked_up
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_count_without_a_recorder() {
        let s = HandlerStats::new(HandlerIdentity {
            name: "h",
            retention: Duration::from_secs(60),
        });
        HandlerStats::incr(&s.processed);
        s.receipts_pruned.add(3);
        s.committed(CommitTimings::default(), Duration::ZERO);
        drop(s.in_flight());
        s.set_consumer(1, 2);
        s.set_receipts(4, None);
        let snap = s.snapshot();
        assert_eq!((snap.processed, snap.receipts_pruned), (1, 3));
    }

    #[test]
    fn outbox_gauges_follow_the_summary_and_fall_to_zero() {
        use crate::outbox::Target;
        use crate::store::OutboxSummary;
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let read = || {
            let mut got: Vec<(String, String, f64)> = snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .filter_map(|(key, _, _, value)| {
                    let DebugValue::Gauge(v) = value else {
                        return None;
                    };
                    let key = key.key();
                    let target = key
                        .labels()
                        .find(|l| l.key() == "target")
                        .map(|l| l.value().to_string())?;
                    Some((key.name().to_string(), target, v.into_inner()))
                })
                .collect();
            got.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
            got
        };
        metrics::with_local_recorder(&recorder, || {
            let mut gauges = OutboxGauges::default();
            gauges.set(
                &[OutboxSummary {
                    consumer: "orders".into(),
                    target: Target::Call("notify".into()),
                    pending: 3,
                    parked: 1,
                    oldest_ms: Some(1_000),
                }],
                4_500,
            );
            assert_eq!(
                read(),
                vec![
                    (
                        "idem_outbox_oldest_age_seconds".into(),
                        "call:notify".into(),
                        3.5
                    ),
                    ("idem_outbox_parked".into(), "call:notify".into(), 1.0),
                    ("idem_outbox_pending".into(), "call:notify".into(), 3.0),
                ]
            );
            gauges.set(&[], 5_000);
            assert_eq!(
                read(),
                vec![
                    (
                        "idem_outbox_oldest_age_seconds".into(),
                        "call:notify".into(),
                        0.0
                    ),
                    ("idem_outbox_parked".into(), "call:notify".into(), 0.0),
                    ("idem_outbox_pending".into(), "call:notify".into(), 0.0),
                ]
            );
        });
    }
}
