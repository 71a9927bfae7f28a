//! `idem replay`: runs one handler again over a range of its stream, through
//! an ephemeral pull consumer, each message through the same protocol as
//! `idem run` ([`Pipeline::process`]; ARCHITECTURE.md, "The protocol").
//!
//! ```text
//! stream info: last sequence L (the range ends at --to-seq, at most L)
//! ephemeral consumer (filtered on the handler's subjects, from --from-seq
//!   or --since, inactive_threshold 5 min) ──► Pipeline::process, as idem run
//!   receipt exists   → duplicate, nothing changes
//!   no receipt       → the handler runs (or, beyond the horizon, dead letter)
//! until every message of the range is settled; the consumer is deleted
//! ```
//!
//! Receipts and dead letters are keyed by the handler's name, or by `--as
//! NAME` (a fresh projection). The retention horizon (ARCHITECTURE.md
//! invariant 7) applies under the handler's own name; under a name no
//! handler of the config has, it is lifted: no host prunes such a name's
//! receipts (`idem run` and `idem receipts prune` prune the config's
//! handlers only), so a message without a receipt under it was never
//! applied under it, however old.
//!
//! A message past the range (published later, or after `--to-seq`) is
//! never run nor acked: the consumer holds at most its `max_ack_pending`
//! of them, and is deleted at the end.

use super::printable;
use crate::broker;
use crate::broker::clock::{self, BrokerClock};
use crate::config::{Config, HandlerConfig};
use crate::pipeline::Pipeline;
use crate::pipeline::db_gate::DbGate;
use crate::pipeline::step::PreparedHandler;
use crate::progress::{Progress, Unit};
use crate::runtime::{LoadOptions, Runtime};
use crate::store::Database;
use anyhow::Context as _;
use async_nats::jetstream::{
    self,
    consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull},
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio_util::sync::CancellationToken;

mod range;
use range::{Range, Take, Tally};

/// How long the broker keeps a replay's consumer once nobody pulls from it:
/// a killed replay leaves nothing behind after this.
pub const INACTIVE_THRESHOLD: Duration = Duration::from_secs(300);
/// How long the replay waits for a message before asking the broker whether
/// the range is exhausted.
const IDLE: Duration = Duration::from_secs(1);
/// The replay consumer's `max_ack_pending`: it also bounds the messages past
/// the range it holds unacked.
const MAX_ACK_PENDING: i64 = 1000;

/// One `idem replay`, as the command line asks for it
/// (`cli/replay.rs`).
#[derive(Debug)]
pub struct Request {
    /// The config that runs the handler.
    pub config: PathBuf,
    /// The handler to run.
    pub handler: String,
    /// First stream sequence of the range.
    pub from_seq: Option<u64>,
    /// Or the first message published at or after this.
    pub since: Option<Since>,
    /// Last stream sequence of the range.
    pub to_seq: Option<u64>,
    /// Receipts and dead letters under this name instead of the handler's.
    pub as_name: Option<String>,
}

/// `--since`: a time, or an age measured back from the broker's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    /// An RFC 3339 time.
    Time(OffsetDateTime),
    /// This long before the broker's time now.
    Age(Duration),
}

impl FromStr for Since {
    type Err = String;

    /// # Errors
    /// One line naming both accepted forms.
    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(t) = OffsetDateTime::parse(s, &Rfc3339) {
            return Ok(Since::Time(t));
        }
        humantime::parse_duration(s).map(Since::Age).map_err(|_| {
            format!("`{s}` is neither an RFC 3339 time (2026-01-31T12:00:00Z) nor an age (2h, 30m)")
        })
    }
}

/// Runs `idem replay` (module docs): one summary line on stdout,
/// `handler NAME: replayed stream S from … to …: new=N duplicates=D
/// dead_lettered=X retried=R duration=1.234s`, or `…: nothing to replay …`.
///
/// # Errors
/// One line: an unknown handler or a bad `--as` name, a module that does
/// not load, a database or stream that cannot be used, a stream that keeps
/// messages beyond the retention window (under the handler's own name);
/// and, after the summary, a replay that dead-lettered messages, was
/// interrupted, or lost naked messages to the stream's limits.
pub async fn run(args: Request) -> anyhow::Result<()> {
    let path = &args.config;
    let config = Config::load(path)?;
    let h = super::handler(&config, path, &args.handler)?;
    let name = receipt_name(&config, path, h, args.as_name.as_deref())?;
    let start = match (args.from_seq, args.since) {
        (Some(0), _) => anyhow::bail!("--from-seq starts at 1 (the stream's first sequence)"),
        (Some(n), _) => Start::Sequence(n),
        (None, Some(since)) => Start::Since(since),
        (None, None) => anyhow::bail!("give --from-seq N or --since TIME"),
    };
    let runtime = Arc::new(
        Runtime::new().map_err(|e| anyhow::anyhow!("cannot start the wasm runtime: {e:#}"))?,
    );
    let component = runtime
        .load(&h.module, LoadOptions { wasi: h.wasi })
        .map_err(|e| anyhow::anyhow!("handler `{}`: {e}", h.name))?;
    let connections = u32::try_from(h.concurrency)
        .unwrap_or(256)
        .saturating_add(2);
    let db = Arc::new(
        Database::connect_existing(&config.database.url, connections, config.lock_wait()).await?,
    );
    db.check_durable_commit(config.database.accept_non_durable_commit)
        .await?;
    let mut cfg = h.clone();
    cfg.name = name;
    let handler = PreparedHandler::prepare(&cfg, component, runtime, &db).await;
    // The version the hosts run: the deployed one, when they follow deployments.
    crate::deploy::at_start::use_deployed_via_broker(&config, h, &handler, &db).await?;
    tracing::info!(handler = %cfg.name, digest = %handler.slot().current().digest(), "replaying with this version");
    let plan = Plan {
        broker: &config.broker,
        own: h,
        cfg: &cfg,
        start,
        to_seq: args.to_seq,
    };
    let result = plan.replay(handler, &db).await;
    db.close().await;
    result
}

/// The receipts' consumer name: the handler's, or `--as NAME` (checked:
/// a valid name, and not another handler's of the config).
fn receipt_name(
    config: &Config,
    path: &std::path::Path,
    h: &HandlerConfig,
    as_name: Option<&str>,
) -> anyhow::Result<String> {
    let Some(name) = as_name else {
        return Ok(h.name.clone());
    };
    if !is_as_name(name) {
        anyhow::bail!(
            "--as `{}` may use only letters, digits, `-` and `_` (it names the receipts and dead letters, like a handler name)",
            printable(name)
        );
    }
    if name != h.name && config.handlers.iter().any(|o| o.name == name) {
        anyhow::bail!(
            "--as `{name}` is another handler of {}: its receipts are that handler's; choose a name no handler has",
            path.display()
        );
    }
    Ok(name.to_owned())
}

/// Whether `name` is one `--as` takes: 1 or more ASCII letters, digits, `-`
/// and `_`, like a handler's name. With the config's handlers' names these
/// are every receipts' and dead letters' consumer a replay can write, so
/// `idem receipts show` and `idem dlq redrive` take the same ones.
pub fn is_as_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The handler of `config` that writes receipts and dead letters under
/// `consumer`: the handler of that name, or for a name only `--as` makes
/// ([`is_as_name`], no handler's) `None`.
///
/// # Errors
/// `consumer` is neither a handler of the config nor a name `--as` takes
/// (one line listing the handlers).
pub fn as_name_of<'c>(
    config: &'c Config,
    path: &std::path::Path,
    consumer: &str,
) -> anyhow::Result<Option<&'c HandlerConfig>> {
    if let Some(h) = config.handlers.iter().find(|h| h.name == consumer) {
        return Ok(Some(h));
    }
    if is_as_name(consumer) {
        return Ok(None);
    }
    super::handler(config, path, consumer).map(Some)
}

/// Where the range starts.
#[derive(Debug, Clone, Copy)]
enum Start {
    Sequence(u64),
    Since(Since),
}

/// One replay, decided (module docs).
struct Plan<'a> {
    broker: &'a crate::config::BrokerConfig,
    /// The handler as configured.
    own: &'a HandlerConfig,
    /// The handler as the replay runs it: named after the receipts' consumer.
    cfg: &'a HandlerConfig,
    start: Start,
    to_seq: Option<u64>,
}

impl Plan<'_> {
    /// A name no handler of the config has: the horizon is lifted.
    fn fresh(&self) -> bool {
        self.cfg.name != self.own.name
    }

    /// `handler credit` or `handler credit as rebuild`.
    fn who(&self) -> String {
        if self.fresh() {
            format!("handler {} as {}", self.own.name, self.cfg.name)
        } else {
            format!("handler {}", self.own.name)
        }
    }

    async fn replay(&self, handler: PreparedHandler, db: &Arc<Database>) -> anyhow::Result<()> {
        let h = self.own;
        let nats = broker::connect(self.broker).await?;
        let js = &nats.js;
        let stream = js.get_stream(&h.stream).await.with_context(|| {
            format!(
                "handler `{}`: cannot read stream `{}`; check [broker] url and the handler's stream",
                h.name, h.stream
            )
        })?;
        let last = stream.cached_info().state.last_sequence;
        if !self.fresh() {
            crate::retention::check_horizon(js, h).await?;
        }
        let (broker_ms, at) = clock::read(js, &h.stream)
            .await
            .with_context(|| format!("handler `{}`", h.name))?;
        let clock = Arc::new(BrokerClock::new(broker_ms, at));
        let end = self.to_seq.map_or(last, |m| m.min(last));
        let (policy, range) = match self.start {
            Start::Sequence(n) => (
                DeliverPolicy::ByStartSequence { start_sequence: n },
                format!("from sequence {n} to {end}"),
            ),
            Start::Since(since) => {
                let at_ms = match since {
                    Since::Time(t) => {
                        i64::try_from(t.unix_timestamp_nanos().div_euclid(1_000_000)).unwrap_or(0)
                    }
                    Since::Age(age) => clock
                        .now_ms()
                        .saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX)),
                };
                let start_time =
                    OffsetDateTime::from_unix_timestamp_nanos(i128::from(at_ms) * 1_000_000)
                        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
                (
                    DeliverPolicy::ByStartTime { start_time },
                    format!("from {} to sequence {end}", super::time(at_ms)),
                )
            }
        };
        let nothing = || {
            println!(
                "{}: nothing to replay in stream {} {range}",
                self.who(),
                h.stream
            );
        };
        if end == 0 || matches!(self.start, Start::Sequence(n) if n > end) {
            nothing();
            return Ok(());
        }
        let started = Instant::now();
        let consumer_name = format!(
            "idem-replay-{}-{}-{}",
            self.cfg.name,
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        );
        // A partitioned stream stores each message under its partition's
        // number first: every partition is replayed.
        let subjects: Vec<String> = match h.partitions {
            Some(_) => h.subjects.iter().map(|s| format!("*.{s}")).collect(),
            None => h.subjects.clone(),
        };
        let (filter_subject, filter_subjects) = match subjects.as_slice() {
            [one] => (one.clone(), Vec::new()),
            many => (String::new(), many.to_vec()),
        };
        let consumer: PullConsumer = stream
            .create_consumer(pull::Config {
                name: Some(consumer_name.clone()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: h.ack_wait,
                // idem enforces the handler's max_deliver, as for its durable consumer.
                max_deliver: -1,
                max_ack_pending: MAX_ACK_PENDING,
                filter_subject,
                filter_subjects,
                deliver_policy: policy,
                inactive_threshold: INACTIVE_THRESHOLD,
                ..Default::default()
            })
            .await
            .with_context(|| {
                format!(
                    "handler `{}`: cannot create the replay's consumer on stream `{}`",
                    h.name, h.stream
                )
            })?;
        let stop = CancellationToken::new();
        let signals = tokio::spawn(stop_on_signal(stop.clone()));
        let gate = Arc::new(DbGate::new(db.clone(), stop.clone()));
        let mut pipeline = Pipeline::new(self.cfg, handler, db.clone(), gate, clock);
        if self.fresh() {
            pipeline = pipeline.without_horizon();
        }
        let first = match self.start {
            Start::Sequence(n) => Some(n),
            Start::Since(_) => None,
        };
        let label = format!("replay {}", self.cfg.name);
        let result = consume(js, Arc::new(pipeline), consumer, end, first, &label, &stop).await;
        signals.abort();
        if let Err(e) = stream.delete_consumer(&consumer_name).await {
            tracing::warn!(consumer = %consumer_name, error = %e, "cannot delete the replay's consumer; the broker removes it after {}", humantime::format_duration(INACTIVE_THRESHOLD));
        }
        let (tally, interrupted) = result?;
        let elapsed = started.elapsed();
        if tally.messages() == 0 && tally.lost == 0 && !interrupted {
            nothing();
            return Ok(());
        }
        println!(
            "{}: replayed stream {} {range}: {} duration={:.3}s",
            self.who(),
            h.stream,
            tally,
            elapsed.as_secs_f64()
        );
        if interrupted {
            anyhow::bail!(
                "replay of {} interrupted; what it applied has receipts under `{}`: run the same replay again to finish it",
                self.who(),
                self.cfg.name
            );
        }
        if tally.lost > 0 {
            anyhow::bail!(
                "{} naked during the replay left stream {} (its limits or a purge) before coming back; they were not replayed",
                super::count(tally.lost, "message", "messages"),
                h.stream
            );
        }
        if tally.dead_lettered > 0 {
            anyhow::bail!(
                "{} dead-lettered during the replay; see idem dlq list --handler {}",
                super::count(tally.dead_lettered, "message", "messages"),
                self.cfg.name
            );
        }
        Ok(())
    }
}

/// Pulls from the replay's consumer and runs every message of the range
/// (up to the handler's `concurrency` at once) until the range is settled
/// or `stop` is cancelled; returns the counts and whether it was stopped.
/// `first`: the range's first sequence when known (for the progress bar).
async fn consume(
    js: &jetstream::Context,
    pipeline: Arc<Pipeline>,
    mut consumer: PullConsumer,
    end: u64,
    first: Option<u64>,
    label: &str,
    stop: &CancellationToken,
) -> anyhow::Result<(Tally, bool)> {
    let mut range = Range::new(end);
    if consumer.cached_info().num_pending == 0 {
        range.idle(0, 0, 0);
    }
    let mut progress = Progress::new(
        label,
        first.map(|f| end.saturating_sub(f) + 1),
        Unit::Items("sequences"),
    );
    let mut first = first;
    let pull = broker::PullSettings {
        size: pipeline.config().pull_size(),
        expires: broker::PULL_EXPIRES,
        heartbeat: broker::PULL_HEARTBEAT,
        pinned: false,
    };
    let (stream_name, consumer_name) = {
        let info = consumer.cached_info();
        (info.stream_name.clone(), info.name.clone())
    };
    let open = || broker::PullStream::open(js, &stream_name, &consumer_name, pull);
    let mut messages = open()
        .await
        .context("cannot pull from the replay's consumer")?;
    let concurrency = pipeline.config().concurrency.max(1);
    let mut in_flight = tokio::task::JoinSet::new();
    let mut running: HashMap<tokio::task::Id, u64> = HashMap::new();
    let mut interrupted = false;
    loop {
        if range.done() && in_flight.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => {
                interrupted = true;
                break;
            }
            Some(joined) = in_flight.join_next_with_id(), if !in_flight.is_empty() => {
                match joined {
                    Ok((id, outcome)) => {
                        if let Some(seq) = running.remove(&id) {
                            range.settled(seq, Some(&outcome));
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "a message task failed; its message is redelivered after ack_wait");
                        if let Some(seq) = running.remove(&e.id()) {
                            range.settled(seq, None);
                        }
                    }
                }
                let at = first.map_or(0, |f| range.reached().saturating_sub(f) + 1);
                progress.update(at, &range.tally().to_string());
            }
            next = tokio::time::timeout(IDLE, messages.next()), if in_flight.len() < concurrency => {
                let msg = match next {
                    Err(_) => {
                        if !range.done() {
                            let info = consumer.info().await.context("cannot read the replay's consumer")?;
                            range.idle(
                                info.num_pending,
                                info.delivered.consumer_sequence,
                                u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX),
                            );
                        }
                        continue;
                    }
                    Ok(None) => anyhow::bail!("the replay's consumer stopped delivering; run the replay again"),
                    Ok(Some(Err(e))) => {
                        if matches!(e, broker::PullError::ConsumerDeleted) {
                            anyhow::bail!(
                                "the replay's consumer is gone from the broker (deleted, or idle for more than {}); run the replay again: what it applied is recognised by its receipts",
                                humantime::format_duration(INACTIVE_THRESHOLD)
                            );
                        }
                        tracing::warn!(error = %e, "pulling from the replay's consumer; going on");
                        if !e.goes_on() {
                            // The pull stream ended (no responders, a
                            // refused or unsent request): pull again.
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            messages = open()
                                .await
                                .context("cannot pull from the replay's consumer")?;
                        }
                        continue;
                    }
                    Ok(Some(Ok(msg))) => msg,
                };
                let Ok(info) = msg.info() else { continue };
                let (seq, consumer_seq, pending, delivered) = (
                    info.stream_sequence,
                    info.consumer_sequence,
                    info.pending,
                    u64::try_from(info.delivered).unwrap_or(1),
                );
                if let Take::Run = range.delivered(seq, consumer_seq, pending, delivered) {
                    if first.is_none() {
                        first = Some(seq);
                        progress.set_total(Some(end.saturating_sub(seq) + 1));
                    }
                    let p = pipeline.clone();
                    let task = in_flight.spawn(async move { p.process(&msg).await });
                    running.insert(task.id(), seq);
                }
            }
        }
    }
    // Stopped: what is in flight finishes (or, with the database down, is
    // left for redelivery by the gate).
    while let Some(joined) = in_flight.join_next_with_id().await {
        match joined {
            Ok((id, outcome)) => {
                if let Some(seq) = running.remove(&id) {
                    range.settled(seq, Some(&outcome));
                }
            }
            Err(e) => {
                if let Some(seq) = running.remove(&e.id()) {
                    range.settled(seq, None);
                }
            }
        }
    }
    progress.finish();
    Ok((range.tally(), interrupted))
}

/// Cancels `stop` on SIGINT or SIGTERM ([`crate::service::shutdown::signal`],
/// the wait `idem run` stops on): the replay stops taking messages, lets
/// those in flight finish, deletes its consumer and says so.
async fn stop_on_signal(stop: CancellationToken) {
    crate::service::shutdown::signal().await;
    stop.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_names_are_handler_like() {
        for ok in ["rebuild-1", "a", "A_b-9"] {
            assert!(is_as_name(ok), "{ok}");
        }
        for bad in ["", "a b", "a.b", "a/b", "ä", "a\n"] {
            assert!(!is_as_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn since_is_a_time_or_an_age() {
        assert_eq!(
            "2h".parse::<Since>(),
            Ok(Since::Age(Duration::from_secs(7200)))
        );
        assert!(matches!(
            "2026-01-31T12:00:00Z".parse::<Since>(),
            Ok(Since::Time(t)) if t.unix_timestamp() == 1_769_860_800
        ));
        assert_eq!(
            "yesterday".parse::<Since>(),
            Err("`yesterday` is neither an RFC 3339 time (2026-01-31T12:00:00Z) nor an age (2h, 30m)".into())
        );
    }
}
