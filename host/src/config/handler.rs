//! One `[[handler]]` table: a component, the stream it reads, the tables it
//! may write and its limits. Parsing and the values derived from it; the
//! checks across fields are [`super::Config::validate`].

use crate::config::batch::Batch;
use crate::config::start::StartPosition;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The smallest pull size (messages per pull) idem asks for (see
/// [`HandlerConfig::pull_size`]).
pub const MIN_PULL_SIZE: usize = 2;

/// How much longer than `ack_wait` a partition's `priority_timeout` is at
/// least: a host pulls each partition at least every 10 s (the pull
/// expiry), so a host that dies was last heard up to 10 s before its
/// deliveries stop being kept in progress; 5 s more covers the server's
/// redelivery check.
pub const PRIORITY_TIMEOUT_MARGIN: Duration = Duration::from_secs(15);

/// One `[[handler]]`: a component, the stream it reads and the tables it may write.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerConfig {
    /// The JetStream durable consumer name and the `consumer` part of every
    /// receipt key. JetStream allows no `.`, `*`, `>` or whitespace in it.
    pub name: String,
    /// Path to the component (`.wasm`) implementing world `idem:handler/handler`.
    pub module: PathBuf,
    /// The stream to consume; created with `subjects` if it does not exist.
    pub stream: String,
    /// Subjects the stream captures (used only when idem creates the stream)
    /// and that this consumer filters on.
    pub subjects: Vec<String>,
    /// Replicas of the stream when idem creates it (`num_replicas`: 1, or
    /// 3 or 5 on a JetStream cluster, where the stream survives the loss
    /// of a minority of its servers); an existing stream keeps its own.
    /// The durable consumer inherits the stream's. Default 1.
    #[serde(default = "default_stream_replicas")]
    pub stream_replicas: usize,
    /// Where the message identity comes from: `header:NAME` or `json:/pointer`.
    #[serde(default = "default_identity", serialize_with = "display")]
    pub identity: IdentityRule,
    /// Tables the handler's SQL may touch. Everything else is denied.
    #[serde(default)]
    pub tables: Vec<String>,
    /// Subjects the handler's outbox may publish to, NATS wildcards allowed
    /// (`orders.accepted`, `audit.>`); none starting with `$`. Default none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub publish: Vec<String>,
    /// Endpoints the handler's outbox may call: name → `http(s)://` URL
    /// (`{ notify = "http://127.0.0.1:8088/notify" }`); the guest names an
    /// endpoint, never a URL. Default none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub endpoints: BTreeMap<String, String>,
    /// Directory of sqlx migrations (`NNNN_name.sql`) applied at start, recorded per handler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrations: Option<PathBuf>,
    /// JetStream `max_deliver`: deliveries before a failing message is dead-lettered. Default 5.
    #[serde(default = "default_max_deliver")]
    pub max_deliver: u32,
    /// JetStream `ack_wait`. Default 30 s.
    #[serde(default = "default_ack_wait", with = "humantime_serde")]
    pub ack_wait: Duration,
    /// Delay before a retried message is delivered again (nak delay), the same
    /// for every delivery. Default 1 s. Shorthand for `backoff = [retry_delay]`.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub retry_delay: Option<Duration>,
    /// Nak delays by delivery: after the n-th failed delivery the message is
    /// delivered again after `backoff[n-1]`, the last entry repeating, e.g.
    /// `["1s", "10s", "1m"]`. JetStream's own consumer `backoff` applies to
    /// ack timeouts, not naks, so idem sends each delay with its nak.
    #[serde(default)]
    pub backoff: Vec<HumanDuration>,
    /// Wall-clock deadline for one `handle` call. Default 5 s.
    #[serde(default = "default_deadline", with = "humantime_serde")]
    pub deadline: Duration,
    /// Messages this handler runs at once on one host, each in its own
    /// transaction. Default 1. Ordering is not promised either way (JetStream
    /// redelivers out of order, and several hosts share one consumer). The
    /// sum over handlers must leave one `[database] max_connections` spare.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Most messages one transaction carries (ARCHITECTURE.md, "Batching"):
    /// each runs in its own savepoint, and one COMMIT makes them all durable
    /// before any is acked. Default 1 (a transaction per message); at most
    /// 1000; or `"auto"`: what is already fetched, up to 64, without
    /// waiting ([`Batch::Auto`]). `concurrency` transactions run at once,
    /// each with up to that many messages.
    #[serde(default)]
    pub batch: Batch,
    /// How long a transaction waits for its batch to fill after its first
    /// message; what is already fetched is always taken at once. Default
    /// 5 ms; less than half of `ack_wait`, and at most 10 s. Not used with
    /// `batch = "auto"`, which never waits.
    #[serde(default = "default_batch_linger", with = "humantime_serde")]
    pub batch_linger: Duration,
    /// Key lanes (ARCHITECTURE.md, "Key lanes"): where a message's ordering
    /// key is read from, in the form of `identity` (`json:/pointer` or
    /// `header:NAME`). Within a host, the messages of one key run one at a
    /// time and in stream order, different keys in parallel up to
    /// `concurrency`. A message without the key runs unordered. Unset
    /// (default): no order is kept. Only with `batch = 1`.
    #[serde(
        default,
        serialize_with = "display_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub order_key: Option<OrderKey>,
    /// Partitions across hosts (ARCHITECTURE.md, "Partitions"): the number
    /// of partitions the stream's subject transform hashes the key token
    /// into (`{{partition(N,…)}}`), each consumed through a durable
    /// consumer of its own (`<name>-p<i>`) that JetStream serves to one
    /// host at a time (pinned client, nats-server 2.11+). Needs `order_key
    /// = "subject:N"` naming a `*` token of the handler's one subject.
    /// Unset (default): one consumer, shared by every host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    /// With `partitions`: how long a host may go without pulling from a
    /// partition before JetStream gives the partition to another host
    /// (the consumer's `priority_timeout`). At least the longer of
    /// `ack_wait` and the longest nak delay, plus 15 s, so that what a dead
    /// host held (in flight, or naked with its delay) has come back to the
    /// stream's redelivery queue before another host is served. Default:
    /// that least value.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub priority_timeout: Option<Duration>,
    /// With `order_key`: refuse, in the message's transaction, a message
    /// whose stream sequence is not above the last one applied for its key
    /// (recorded in `idem_key_sequences`): it is dead-lettered
    /// (`out-of-order: …`) instead of applied. A guard for the moment a
    /// partition changes hands, when two hosts may briefly serve it.
    /// Default false.
    #[serde(default)]
    pub refuse_out_of_order: bool,
    /// The partition this copy of the config consumes (`0..partitions`):
    /// set by the host for each partition's consuming loop, never read
    /// from a file.
    #[serde(skip)]
    pub partition: Option<u32>,
    /// Most messages requested per pull (the pull size; the key keeps its
    /// name, `batch` is messages per transaction). Default 16; lowered at start so a
    /// buffered message cannot wait past `ack_wait`, never below 2
    /// ([`HandlerConfig::pull_size`]). Unbatched, a run of copies is
    /// pulled `pull_batch` at a time, what is fetched beyond the lowered
    /// size held in progress ([`crate::broker::surplus`]).
    #[serde(default = "default_pull_batch")]
    pub pull_batch: usize,
    /// Time bound on each statement of a message's transaction (PostgreSQL
    /// `SET LOCAL statement_timeout`; on SQLite, on the transaction from
    /// BEGIN). Default: the handler's `deadline` plus 1 s.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub statement_timeout: Option<Duration>,
    /// Most statements (`execute` + `query`) one message may run. Default 1000.
    #[serde(default = "default_max_statements")]
    pub max_statements: u32,
    /// Most rows one query may return to the guest. Default 10,000.
    #[serde(default = "default_max_rows")]
    pub max_rows: usize,
    /// Bytes of values one message's queries may return to the guest, all
    /// statements together, in KiB. Also bounds (on SQLite) any one value or
    /// row its statements create or read. Default 8192 (8 MiB).
    #[serde(default = "default_max_result_kib")]
    pub max_result_kib: usize,
    /// Bytes of parameter values one statement may carry, in KiB. Default
    /// 8192 (8 MiB).
    #[serde(default = "default_max_param_kib")]
    pub max_param_kib: usize,
    /// Host log per message for the guest's output (the `log` interface
    /// and, under WASI, stdout/stderr), in KiB: each line counts its text
    /// as written plus its fixed part (timestamp, level, target, handler,
    /// message id; [`crate::log_format::guest_line_overhead`]); the rest is
    /// dropped and counted. Default 64.
    #[serde(default = "default_max_log_kib")]
    pub max_log_kib: usize,
    /// Most outbox publishes and calls one message may make. Default 16.
    #[serde(default = "default_max_outbox_calls")]
    pub max_outbox_calls: u32,
    /// Bytes one message's outbox calls may carry, all together (subjects
    /// or endpoint names, payloads, headers, keys), in KiB. Default 1024.
    #[serde(default = "default_max_outbox_kib")]
    pub max_outbox_kib: usize,
    /// Link an empty WASI context (no preopens, no network, no environment,
    /// stdout/stderr to the host log) for a guest whose toolchain cannot avoid
    /// WASI imports. Default false: a guest importing WASI is refused at load.
    #[serde(default)]
    pub wasi: bool,
    /// Watch `module` and put a changed file in place while the host runs
    /// (validated and compiled first; the old version keeps running when
    /// the new one does not load). Default false.
    #[serde(default)]
    pub watch: bool,
    /// Linear memory cap per instance, in MiB. Default 64.
    #[serde(default = "default_memory_mib")]
    pub max_memory_mib: u32,
    /// The retention window (ARCHITECTURE.md invariant 7): receipts older than
    /// this are pruned, and a message published longer ago than this cannot
    /// be proven new, so it is dead-lettered (`beyond-horizon: …`) instead of
    /// run. A stream idem creates gets this as its `max_age`; at start the
    /// host refuses a stream that can keep messages longer. Default 7 days.
    #[serde(default = "default_retention", with = "humantime_serde")]
    pub retention: Duration,
    /// Start even when the stream keeps messages longer than `retention`
    /// (unlimited or larger `max_age`): a redelivered or replayed message
    /// older than the window is then quarantined, never run. Default false.
    #[serde(default)]
    pub accept_horizon_risk: bool,
    /// Where a new durable consumer starts in the stream: `"all"` (default),
    /// `"new"`, `"seq:N"` or `"time:<RFC 3339>"` ([`StartPosition`]). Only
    /// when idem creates the consumer; an existing one goes on from where
    /// it is.
    #[serde(default, serialize_with = "display")]
    pub start: StartPosition,
}

fn default_identity() -> IdentityRule {
    IdentityRule::Header("Nats-Msg-Id".to_string())
}
fn default_max_deliver() -> u32 {
    5
}
fn default_ack_wait() -> Duration {
    Duration::from_secs(30)
}
/// A duration written the humantime way (`"1s"`, `"500ms"`, `"2m"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct HumanDuration(#[serde(with = "humantime_serde")] pub Duration);
fn default_deadline() -> Duration {
    Duration::from_secs(5)
}
fn default_max_statements() -> u32 {
    1000
}
fn default_max_rows() -> usize {
    10_000
}
fn default_max_result_kib() -> usize {
    8192
}
fn default_max_param_kib() -> usize {
    8192
}
fn default_max_log_kib() -> usize {
    64
}
fn default_stream_replicas() -> usize {
    1
}
fn default_max_outbox_calls() -> u32 {
    16
}
fn default_max_outbox_kib() -> usize {
    1024
}
fn default_concurrency() -> usize {
    1
}
fn default_batch_linger() -> Duration {
    Duration::from_millis(5)
}
fn default_pull_batch() -> usize {
    16
}
fn default_memory_mib() -> u32 {
    64
}
fn default_retention() -> Duration {
    Duration::from_secs(7 * 24 * 60 * 60)
}

/// Where a message's identity is read from. Never invented: a message without
/// one is dead-lettered (ARCHITECTURE.md invariant 6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityRule {
    /// `header:NAME`: the value of a NATS header, e.g. `Nats-Msg-Id`.
    Header(String),
    /// `json:/pointer`: an RFC 6901 JSON pointer into the payload; the value
    /// must be a non-empty string or an integer.
    JsonPointer(String),
}

impl std::str::FromStr for IdentityRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(name) = s.strip_prefix("header:") {
            if name.is_empty() {
                return Err(
                    "identity `header:` needs a header name, e.g. header:Nats-Msg-Id".into(),
                );
            }
            Ok(IdentityRule::Header(name.to_string()))
        } else if let Some(ptr) = s.strip_prefix("json:") {
            if !ptr.starts_with('/') {
                return Err(format!(
                    "identity `{s}`: a JSON pointer starts with `/`, e.g. json:/event_id"
                ));
            }
            Ok(IdentityRule::JsonPointer(ptr.to_string()))
        } else {
            Err(format!(
                "identity `{s}` must be `header:NAME` or `json:/pointer`"
            ))
        }
    }
}

impl std::fmt::Display for IdentityRule {
    /// The form it is written in: `header:NAME` or `json:/pointer`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdentityRule::Header(name) => write!(f, "header:{name}"),
            IdentityRule::JsonPointer(ptr) => write!(f, "json:{ptr}"),
        }
    }
}

/// Where a message's ordering key (`order_key`) is read from: the forms of
/// [`IdentityRule`] (`json:/pointer`, `header:NAME`), or `subject:N`, the
/// N-th token (from 1) of the subject the message was published to. The
/// key is compared byte for byte as an identity is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderKey {
    /// `json:/pointer` or `header:NAME`.
    Field(IdentityRule),
    /// `subject:N`: the N-th `.`-separated token of the subject (1-based).
    SubjectToken(usize),
}

impl std::str::FromStr for OrderKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(n) = s.strip_prefix("subject:") {
            return match n.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(OrderKey::SubjectToken(n)),
                _ => Err(format!(
                    "order_key `{s}`: `subject:N` needs a token position from 1, e.g. subject:2 for the account in accounts.<account>"
                )),
            };
        }
        match s.parse::<IdentityRule>() {
            Ok(rule) => Ok(OrderKey::Field(rule)),
            Err(_) => Err(format!(
                "order_key `{s}` must be `json:/pointer` (e.g. json:/account_id), `header:NAME` or `subject:N`"
            )),
        }
    }
}

impl std::fmt::Display for OrderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OrderKey::Field(rule) => rule.fmt(f),
            OrderKey::SubjectToken(n) => write!(f, "subject:{n}"),
        }
    }
}

impl<'de> Deserialize<'de> for OrderKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// [`display`] of an optional value (`None` is left out by the field's
/// `skip_serializing_if`).
fn display_opt<T: std::fmt::Display, S: serde::Serializer>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

/// Serializes a value as the text its `Display` writes (the form it is read from).
fn display<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

impl<'de> Deserialize<'de> for IdentityRule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl HandlerConfig {
    /// The nak delay after the `delivered`-th delivery failed (1-based):
    /// `backoff[delivered - 1]`, the last entry repeating; `retry_delay`
    /// (default 1 s) when no backoff is set.
    pub fn nak_delay(&self, delivered: u64) -> Duration {
        let i = usize::try_from(delivered.saturating_sub(1)).unwrap_or(usize::MAX);
        match self.backoff.get(i).or(self.backoff.last()) {
            Some(d) => d.0,
            None => self.retry_delay.unwrap_or(Duration::from_secs(1)),
        }
    }

    /// The longest of the nak delays [`HandlerConfig::nak_delay`] gives.
    pub fn longest_nak_delay(&self) -> Duration {
        self.backoff
            .iter()
            .map(|d| d.0)
            .max()
            .unwrap_or_else(|| self.retry_delay.unwrap_or(Duration::from_secs(1)))
    }

    /// The pull size, messages actually requested per pull: `pull_batch`,
    /// capped so that no message waits in the client past `ack_wait` before
    /// it starts (its in-progress keep-alive only runs once it does). The
    /// client buffers up to 1.5 pulls (it asks for the next pull when half
    /// of one is left)
    /// and each of `concurrency` slots may take up to `deadline` + 1 s
    /// per message, so the cap is
    /// `ack_wait × concurrency / (1.5 × (deadline + 1 s))`, at least 2, so
    /// that the next request is out while a message is processed (the next
    /// one goes out when at most half a request is buffered or still to
    /// come; see `broker::PullStream`).
    ///
    /// `batch` does not raise it: a batch fills from what the pulls bring
    /// within `batch_linger`, and a message still waits in the buffer at
    /// the rate the handler drains it.
    pub fn pull_size(&self) -> usize {
        let worst = (self.deadline + Duration::from_secs(1)).as_secs_f64() * 1.5;
        let fits = self.ack_wait.as_secs_f64() * self.concurrency as f64 / worst;
        // Saturating float-to-int cast; `fits` is finite and non-negative.
        (fits as usize).min(self.pull_batch).max(MIN_PULL_SIZE)
    }

    /// The effective statement timeout: `statement_timeout`, else `deadline`
    /// plus 1 s, so that the deadline (a trap) fires first and the statement
    /// timeout is only the backstop that cancels a statement the runtime
    /// abandoned (on SQLite the budget runs from BEGIN, a little before the
    /// guest starts).
    pub fn statement_timeout(&self) -> Duration {
        self.statement_timeout
            .unwrap_or(self.deadline + Duration::from_secs(1))
    }

    /// The durable consumer this copy of the config consumes: the handler's
    /// name, or `<name>-p<i>` for partition `i` ([`HandlerConfig::partition`]).
    /// Receipts are keyed by the handler's name either way.
    pub fn durable_name(&self) -> String {
        match self.partition {
            Some(i) => format!("{}-p{i}", self.name),
            None => self.name.clone(),
        }
    }

    /// `priority_timeout`, else [`HandlerConfig::min_priority_timeout`].
    pub fn priority_timeout(&self) -> Duration {
        self.priority_timeout
            .unwrap_or_else(|| self.min_priority_timeout())
    }

    /// The shortest `priority_timeout` that lets what a dead host held come
    /// back before its partition moves: the longer of `ack_wait` and the
    /// longest nak delay (`backoff`, `retry_delay`), plus
    /// [`PRIORITY_TIMEOUT_MARGIN`].
    pub fn min_priority_timeout(&self) -> Duration {
        let longest_nak = self
            .backoff
            .iter()
            .map(|d| d.0)
            .chain(self.retry_delay)
            .max()
            .unwrap_or(Duration::from_secs(1));
        self.ack_wait.max(longest_nak) + PRIORITY_TIMEOUT_MARGIN
    }

    /// One copy of this config per partition (`partition` set), or this
    /// one alone when the handler is not partitioned.
    pub fn per_partition(&self) -> Vec<HandlerConfig> {
        match self.partitions {
            None => vec![self.clone()],
            Some(n) => (0..n)
                .map(|i| HandlerConfig {
                    partition: Some(i),
                    ..self.clone()
                })
                .collect(),
        }
    }
}
