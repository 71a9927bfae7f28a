//! The `idem.toml` configuration: broker, database and one `[[handler]]` table
//! per handler. Parsing and validation only; nothing here connects anywhere.
//!
//! ```toml
//! [broker]
//! url = "nats://127.0.0.1:4222"
//! [database]
//! url = "postgres://postgres@127.0.0.1/test"   # default: sqlite://idem.db
//! [[handler]]
//! name = "credit-projector"
//! module = "target/guests/credit.wasm"
//! stream = "ACCOUNTS"
//! subjects = ["accounts.credit"]
//! identity = "json:/event_id"
//! tables = ["accounts"]
//! migrations = "examples/credit/migrations"
//! ```
//!
//! Relative paths (`module`, `migrations`) are resolved against the directory
//! of the config file.

use crate::start::StartPosition;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The database used when `[database] url` is absent: an embedded SQLite file
/// in the working directory, so a first run needs nothing but the broker.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://idem.db";

/// The smallest pull batch idem asks for (see
/// [`HandlerConfig::effective_pull_batch`]).
pub const MIN_PULL_BATCH: usize = 2;

/// A configuration error, one line: what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read. `error` is not a `#[source]`: the message
    /// already carries it, and `{:#}` would print it twice.
    #[error("cannot read config {path}: {error}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// Why it cannot be read.
        error: std::io::Error,
    },
    /// The file is not valid TOML, has an unknown key or a bad value, or
    /// fails validation ([`Config::validate`]).
    #[error("invalid config {path}: {message}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// What is wrong, one line.
        message: String,
    },
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[broker]`.
    pub broker: BrokerConfig,
    /// `[database]` (all defaults when absent).
    #[serde(default)]
    pub database: DatabaseConfig,
    /// `[service]` (all defaults when absent).
    #[serde(default)]
    pub service: ServiceConfig,
    /// Every `[[handler]]`, in file order.
    #[serde(rename = "handler", default)]
    pub handlers: Vec<HandlerConfig>,
}

/// `[service]`: how the host runs as a service.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Address of the HTTP listener (`/healthz`, `/readyz`, `/metrics`),
    /// e.g. `127.0.0.1:9464`. No listener when unset (the default).
    #[serde(default)]
    pub listen: Option<std::net::SocketAddr>,
    /// After SIGTERM or SIGINT, how long deliveries in flight may take to
    /// finish (commit and ack) before what is left is rolled back and the
    /// host exits. Default 30 s.
    #[serde(default = "default_shutdown_grace", with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            listen: None,
            shutdown_grace: default_shutdown_grace(),
        }
    }
}

fn default_shutdown_grace() -> Duration {
    Duration::from_secs(30)
}

/// `[broker]`: the NATS server with JetStream enabled.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// `nats://host:port`.
    pub url: String,
}

/// `[database]`: where receipts and handler effects are written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `postgres://…` or `sqlite://path`. Default [`DEFAULT_DATABASE_URL`].
    #[serde(default = "default_database_url")]
    pub url: String,
    /// Pool size. Default 8.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: default_database_url(),
            max_connections: default_max_connections(),
        }
    }
}

fn default_database_url() -> String {
    DEFAULT_DATABASE_URL.to_string()
}
fn default_max_connections() -> u32 {
    8
}

/// One `[[handler]]`: a component, the stream it reads and the tables it may write.
#[derive(Debug, Clone, Deserialize)]
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
    /// Where the message identity comes from: `header:NAME` or `json:/pointer`.
    #[serde(default = "default_identity")]
    pub identity: IdentityRule,
    /// Tables the handler's SQL may touch. Everything else is denied.
    #[serde(default)]
    pub tables: Vec<String>,
    /// Directory of sqlx migrations (`NNNN_name.sql`) applied at start, recorded per handler.
    pub migrations: Option<PathBuf>,
    /// JetStream `max_deliver`: deliveries before a failing message is dead-lettered. Default 5.
    #[serde(default = "default_max_deliver")]
    pub max_deliver: u32,
    /// JetStream `ack_wait`. Default 30 s.
    #[serde(default = "default_ack_wait", with = "humantime_serde")]
    pub ack_wait: Duration,
    /// Delay before a retried message is delivered again (nak delay), the same
    /// for every delivery. Default 1 s. Shorthand for `backoff = [retry_delay]`.
    #[serde(default, with = "humantime_serde")]
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
    /// Most messages requested per pull. Default 16; lowered at start so a
    /// buffered message cannot wait past `ack_wait`, never below 2
    /// ([`HandlerConfig::effective_pull_batch`]).
    #[serde(default = "default_pull_batch")]
    pub pull_batch: usize,
    /// Time bound on each statement of a message's transaction (PostgreSQL
    /// `SET LOCAL statement_timeout`; on SQLite, on the transaction from
    /// BEGIN). Default: the handler's `deadline` plus 1 s.
    #[serde(default, with = "humantime_serde")]
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
    /// Log output (the `log` interface and, under WASI, stdout/stderr) per
    /// message, in KiB; the rest is dropped and counted. Default 64.
    #[serde(default = "default_max_log_kib")]
    pub max_log_kib: usize,
    /// Link an empty WASI context (no preopens, no network, no environment,
    /// stdout/stderr to the host log) for a guest whose toolchain cannot avoid
    /// WASI imports. Default false: a guest importing WASI is refused at load.
    #[serde(default)]
    pub wasi: bool,
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
    #[serde(default)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
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
fn default_concurrency() -> usize {
    1
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

    /// Messages actually requested per pull: `pull_batch`, capped so that no
    /// message waits in the client past `ack_wait` before it starts (its
    /// in-progress keep-alive only runs once it does). The client buffers up
    /// to 1.5 batches (async-nats asks for the next batch when half of one is
    /// left) and each of `concurrency` slots may take up to `deadline` + 1 s
    /// per message, so the cap is
    /// `ack_wait × concurrency / (1.5 × (deadline + 1 s))`, at least 2:
    /// async-nats 0.51 asks for the next batch when at most half a batch is
    /// pending, and with a batch of 1 a reply that overtakes its request's
    /// result leaves the stream waiting for a message that never comes.
    pub fn effective_pull_batch(&self) -> usize {
        let worst = (self.deadline + Duration::from_secs(1)).as_secs_f64() * 1.5;
        let fits = self.ack_wait.as_secs_f64() * self.concurrency as f64 / worst;
        // Saturating float-to-int cast; `fits` is finite and non-negative.
        (fits as usize).min(self.pull_batch).max(MIN_PULL_BATCH)
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
}

impl Config {
    /// How long a SQLite transaction may wait for the single write lock: past
    /// the longest time any handler's transaction can hold it (deadline or
    /// statement timeout, plus the runtime's grace for a guest blocked
    /// outside wasm), with a margin, so a slow handler delays the others
    /// instead of failing them with "database is locked".
    pub fn lock_wait(&self) -> Duration {
        let longest = self
            .handlers
            .iter()
            .map(|h| h.deadline.max(h.statement_timeout()))
            .max()
            .unwrap_or_default();
        longest * 2 + Duration::from_secs(5)
    }

    /// Reads, parses and validates `path`; resolves relative paths against its directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let mut config: Config =
            toml::from_str(&text).map_err(|e| invalid(one_line(&e.to_string())))?;
        config.validate().map_err(invalid)?;
        let base = path.parent().unwrap_or(Path::new("."));
        for h in &mut config.handlers {
            if h.module.is_relative() {
                h.module = base.join(&h.module);
            }
            if let Some(m) = &h.migrations
                && m.is_relative()
            {
                h.migrations = Some(base.join(m));
            }
        }
        Ok(config)
    }

    /// Checks what serde cannot: names, duplicates, ranges.
    pub fn validate(&self) -> Result<(), String> {
        if self.handlers.is_empty() {
            return Err("no [[handler]] tables: add at least one handler".into());
        }
        let in_flight: usize = self.handlers.iter().map(|h| h.concurrency).sum();
        if in_flight >= self.database.max_connections as usize {
            return Err(format!(
                "handlers run {in_flight} messages at once (sum of `concurrency`) but [database] max_connections is {}; raise max_connections to at least {} (one spare for dead letters and pruning)",
                self.database.max_connections,
                in_flight + 1
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for h in &self.handlers {
            let valid_name = |s: &str| {
                !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            };
            if !valid_name(&h.name) {
                return Err(format!(
                    "handler name `{}` may use only letters, digits, `-` and `_` (it is a JetStream durable name)",
                    h.name
                ));
            }
            if !seen.insert(h.name.as_str()) {
                return Err(format!("handler name `{}` appears twice", h.name));
            }
            if !valid_name(&h.stream) {
                return Err(format!(
                    "handler `{}`: stream `{}` may use only letters, digits, `-` and `_`",
                    h.name, h.stream
                ));
            }
            if h.subjects.is_empty() {
                return Err(format!("handler `{}`: `subjects` is empty", h.name));
            }
            if h.max_deliver == 0 {
                return Err(format!(
                    "handler `{}`: max_deliver must be at least 1",
                    h.name
                ));
            }
            if h.retry_delay.is_some() && !h.backoff.is_empty() {
                return Err(format!(
                    "handler `{}`: set either retry_delay or backoff, not both",
                    h.name
                ));
            }
            if h.max_result_kib == 0 || h.max_param_kib == 0 {
                return Err(format!(
                    "handler `{}`: max_result_kib and max_param_kib must be at least 1",
                    h.name
                ));
            }
            if h.max_statements == 0 || h.max_rows == 0 {
                return Err(format!(
                    "handler `{}`: max_statements and max_rows must be at least 1",
                    h.name
                ));
            }
            if h.deadline.is_zero() || h.statement_timeout().is_zero() {
                return Err(format!(
                    "handler `{}`: deadline and statement_timeout must be more than 0s",
                    h.name
                ));
            }
            if h.pull_batch == 0 || h.pull_batch > 1000 {
                return Err(format!(
                    "handler `{}`: pull_batch must be between 1 and 1000",
                    h.name
                ));
            }
            if h.concurrency == 0 || h.concurrency > 256 {
                return Err(format!(
                    "handler `{}`: concurrency must be between 1 and 256",
                    h.name
                ));
            }
            if h.retention.is_zero() {
                return Err(format!(
                    "handler `{}`: retention must be more than 0s",
                    h.name
                ));
            }
            if h.max_memory_mib == 0 || h.max_memory_mib > 4096 {
                return Err(format!(
                    "handler `{}`: max_memory_mib must be between 1 and 4096",
                    h.name
                ));
            }
            for t in &h.tables {
                if t.to_ascii_lowercase().starts_with("idem_") {
                    return Err(format!(
                        "handler `{}`: table `{t}` belongs to idem and cannot be granted",
                        h.name
                    ));
                }
            }
        }
        Ok(())
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn parse(s: &str) -> Result<Config, String> {
        let c: Config = toml::from_str(s).map_err(|e| e.to_string())?;
        c.validate()?;
        Ok(c)
    }

    const OK: &str = r#"
[broker]
url = "nats://127.0.0.1:4222"
[[handler]]
name = "credit-projector"
module = "credit.wasm"
stream = "ACCOUNTS"
subjects = ["accounts.credit"]
identity = "json:/event_id"
tables = ["accounts"]
ack_wait = "10s"
"#;

    #[test]
    fn parses_defaults() {
        let c = parse(OK).unwrap();
        assert_eq!(c.database.url, "sqlite://idem.db");
        let h = &c.handlers[0];
        assert_eq!(h.identity, IdentityRule::JsonPointer("/event_id".into()));
        assert_eq!(h.ack_wait, Duration::from_secs(10));
        assert_eq!(h.max_deliver, 5);
        assert_eq!(h.deadline, Duration::from_secs(5));
        assert_eq!(h.retention, Duration::from_secs(7 * 86_400));
        assert!(!h.accept_horizon_risk);
    }

    #[test]
    fn concurrency_defaults_to_one_and_must_fit_the_pool() {
        assert_eq!(parse(OK).unwrap().handlers[0].concurrency, 1);
        assert_eq!(
            parse(&format!("{OK}concurrency = 7\n")).unwrap().handlers[0].concurrency,
            7
        );
        let err = parse(&format!("{OK}concurrency = 8\n")).unwrap_err();
        assert_eq!(
            err,
            "handlers run 8 messages at once (sum of `concurrency`) but [database] max_connections is 8; raise max_connections to at least 9 (one spare for dead letters and pruning)"
        );
        let err = parse(&format!("{OK}concurrency = 0\n")).unwrap_err();
        assert_eq!(
            err,
            "handler `credit-projector`: concurrency must be between 1 and 256"
        );
    }

    #[test]
    fn pull_batch_is_capped_by_ack_wait() {
        let mut h = parse(OK).unwrap().handlers.remove(0);
        // ack_wait 10s, deadline 5s: 10 / (1.5 × 6) = 1.1 → 1, raised to 2.
        assert_eq!(h.effective_pull_batch(), 2);
        h.concurrency = 4;
        assert_eq!(h.effective_pull_batch(), 4);
        h.ack_wait = Duration::from_secs(30);
        h.deadline = Duration::from_secs(1);
        // 30 × 4 / 3 = 40, capped by pull_batch 16.
        assert_eq!(h.effective_pull_batch(), 16);
        h.ack_wait = Duration::from_millis(100);
        assert_eq!(h.effective_pull_batch(), 2);
        h.pull_batch = 1;
        assert_eq!(h.effective_pull_batch(), 2);
    }

    #[test]
    fn retention_parses_and_must_be_positive() {
        let c = parse(&format!(
            "{OK}retention = \"36h\"\naccept_horizon_risk = true\n"
        ))
        .unwrap();
        assert_eq!(c.handlers[0].retention, Duration::from_secs(36 * 3600));
        assert!(c.handlers[0].accept_horizon_risk);
        assert_eq!(
            parse(&format!("{OK}retention = \"0s\"\n")).unwrap_err(),
            "handler `credit-projector`: retention must be more than 0s"
        );
    }

    #[test]
    fn rejects_bad_identity_and_names() {
        let bad = OK.replace("json:/event_id", "json:event_id");
        assert!(parse(&bad).unwrap_err().contains("starts with `/`"));
        let bad = OK.replace("credit-projector", "credit.projector");
        assert!(parse(&bad).unwrap_err().contains("handler name"));
        let bad = OK.replace("[\"accounts\"]", "[\"idem_receipts\"]");
        assert!(parse(&bad).unwrap_err().contains("belongs to idem"));
        let bad = OK.replace("ack_wait", "ack_wiat");
        assert!(parse(&bad).unwrap_err().contains("unknown field"));
    }

    #[test]
    fn start_is_read_and_checked() {
        assert_eq!(parse(OK).unwrap().handlers[0].start, StartPosition::All);
        let seq = OK.replace("ack_wait = \"10s\"", "start = \"seq:5\"");
        assert_eq!(
            parse(&seq).unwrap().handlers[0].start,
            StartPosition::Sequence(5)
        );
        let bad = OK.replace("ack_wait = \"10s\"", "start = \"first\"");
        assert!(
            parse(&bad).unwrap_err().contains(
                "start = \"first\" is not a start position; use \"all\", \"new\", \"seq:N\" (N >= 1)"
            ),
            "{:?}",
            parse(&bad)
        );
    }
}
