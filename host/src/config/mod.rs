//! The `idem.toml` configuration: broker, database, service and one
//! `[[handler]]` table per handler, with the keys outside `[[handler]]`
//! overridable from the environment (`IDEM_<SECTION>__<KEY>`,
//! [`sources`]). Parsing and validation only; nothing here connects anywhere.
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
//! of the config file; relative `*_file` paths against
//! `$CREDENTIALS_DIRECTORY` when set, else that directory too.

pub mod batch;
mod broker;
pub mod database_url;
mod deploy;
mod handler;
pub mod sources;
pub mod start;

pub use broker::{BrokerAuth, BrokerConfig};
pub use deploy::DeployConfig;

pub use handler::{
    HandlerConfig, HumanDuration, IdentityRule, MIN_PULL_SIZE, OrderKey, PRIORITY_TIMEOUT_MARGIN,
};
pub use sources::Problem;

use crate::secret::redact_url;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The database used when `[database] url` is absent: an embedded SQLite file
/// in the working directory, so a first run needs nothing but the broker.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://idem.db";

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
    /// The file is not valid TOML, a key of the file or of an environment
    /// variable is unknown or has a bad value, a secret file cannot be read,
    /// or validation fails ([`Config::validate`]). Shows the first problem;
    /// `idem config check` prints them all.
    #[error("{}{}", problems.first().map(ToString::to_string).unwrap_or_default(), more(problems.len()))]
    Invalid {
        /// Every problem found, at least one.
        problems: Vec<Problem>,
    },
}

fn more(problems: usize) -> String {
    match problems {
        0 | 1 => String::new(),
        n => format!(" (and {} more; `idem config check` lists them all)", n - 1),
    }
}

/// The whole file.
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    /// `[runtime]` (all defaults when absent).
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// `[deploy]` (all defaults when absent).
    #[serde(default)]
    pub deploy: DeployConfig,
    /// Every `[[handler]]`, in file order.
    #[serde(rename = "handler", default)]
    pub handlers: Vec<HandlerConfig>,
}

/// `[runtime]`: how components are compiled.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Keep compiled components on disk, keyed by the component's bytes,
    /// the wasmtime version and the engine's settings, so a restart or a
    /// second host on the machine loads a component without compiling it
    /// (ARCHITECTURE.md, "Compiled-component cache"). Default true.
    #[serde(default = "default_cache")]
    pub cache: bool,
    /// Where the compiled components are kept. Default: `$CACHE_DIRECTORY`
    /// (systemd's `CacheDirectory=`), else the user's cache directory
    /// (`$XDG_CACHE_HOME` or `~/.cache`), then `idem/wasmtime`. A relative
    /// path is resolved against the config file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<PathBuf>,
    /// The most functions (with a body, all core modules together) one
    /// component may bring; a component with more is refused before it is
    /// compiled. Default 50,000 (the Python and StarlingMonkey credit
    /// components have about 13,000).
    #[serde(default = "default_max_component_functions")]
    pub max_component_functions: u32,
    /// The most code (code sections, all core modules together) one
    /// component may bring, in MiB; a component with more is refused
    /// before it is compiled. Default 32 (StarlingMonkey's credit
    /// component has 8.8 MiB).
    #[serde(default = "default_max_component_code_mib")]
    pub max_component_code_mib: u32,
    /// The most freed guest memory, in MiB, that may stay resident while it
    /// waits to be reset together with other freed instances' (one reset
    /// per batch saves an interrupt to every core per message): the
    /// pooling allocator's batch is sized so it stays within this. Default
    /// 256; 0 resets each freed instance at once.
    #[serde(default = "default_freed_memory_mib")]
    pub freed_memory_mib: u32,
    /// Whether a trap names its source line when the component carries
    /// DWARF debug info (wasmtime's `wasm_backtrace_details`). Compiling
    /// such a component takes longer: the debug-build host took 12–14 s
    /// instead of 7 s for the Python credit component (which carries
    /// DWARF); one without DWARF compiles as fast either way. Default true;
    /// `idem invoke` and `idem test` always name it.
    #[serde(default = "default_trap_source_lines")]
    pub trap_source_lines: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            cache: default_cache(),
            cache_dir: None,
            max_component_functions: default_max_component_functions(),
            max_component_code_mib: default_max_component_code_mib(),
            freed_memory_mib: default_freed_memory_mib(),
            trap_source_lines: default_trap_source_lines(),
        }
    }
}

fn default_cache() -> bool {
    true
}
fn default_max_component_functions() -> u32 {
    50_000
}
fn default_max_component_code_mib() -> u32 {
    32
}
fn default_trap_source_lines() -> bool {
    true
}

fn default_freed_memory_mib() -> u32 {
    256
}

impl RuntimeConfig {
    /// The compile limits of `max_component_functions` and
    /// `max_component_code_mib`.
    pub fn compile_limits(&self) -> crate::runtime::CompileLimits {
        crate::runtime::CompileLimits {
            max_functions: u64::from(self.max_component_functions),
            max_code_bytes: u64::from(self.max_component_code_mib) << 20,
        }
    }

    /// The directory compiled components are kept in, or `None` when the
    /// cache is off or no cache directory can be found (no `$HOME`).
    pub fn effective_cache_dir(&self) -> Option<PathBuf> {
        if !self.cache {
            return None;
        }
        if let Some(dir) = &self.cache_dir {
            return Some(dir.clone());
        }
        let base = std::env::var_os("CACHE_DIRECTORY")
            .filter(|d| !d.is_empty())
            // systemd may list several, separated by `:`; the first is ours.
            .and_then(|d| std::env::split_paths(&d).next())
            .or_else(|| dirs::cache_dir().map(|d| d.join("idem")))?;
        Some(base.join("wasmtime"))
    }
}

/// `[service]`: how the host runs as a service.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Address of the HTTP listener (`/healthz`, `/readyz`, `/metrics`),
    /// e.g. `127.0.0.1:9464`. No listener when unset (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

/// `[database]`: where receipts and handler effects are written. Its
/// `Debug` masks the URL's password, so a logged config shows none.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `postgres://…` or `sqlite://path`. Default [`DEFAULT_DATABASE_URL`].
    /// After [`Config::load`] it carries the password `password_file` names.
    #[serde(default = "default_database_url")]
    pub url: String,
    /// Pool size. Default 8.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// A file holding the PostgreSQL password (a trailing newline is
    /// dropped), put into `url` at load. A relative path is resolved against
    /// `$CREDENTIALS_DIRECTORY` when set, else the config file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// Run on a database whose commits are not durable (PostgreSQL
    /// `synchronous_commit = off` or `fsync = off`, SQLite `synchronous`
    /// below FULL or journal off/in memory), warning once, instead of
    /// refusing to start: a crash may then lose effects already acked.
    /// Default false (ARCHITECTURE.md, invariant 2); printed by `idem
    /// config check` only when set.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accept_non_durable_commit: bool,
}

impl std::fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .field("password_file", &self.password_file)
            .field("accept_non_durable_commit", &self.accept_non_durable_commit)
            .finish()
    }
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: default_database_url(),
            max_connections: default_max_connections(),
            password_file: None,
            accept_non_durable_commit: false,
        }
    }
}

fn default_database_url() -> String {
    DEFAULT_DATABASE_URL.to_string()
}
fn default_max_connections() -> u32 {
    8
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

    /// Reads `path`, lays the `IDEM_<SECTION>__<KEY>` environment variables
    /// over it, reads the secret files, resolves relative paths and
    /// validates ([`sources`]).
    ///
    /// # Errors
    /// [`ConfigError::Read`] when the file cannot be read;
    /// [`ConfigError::Invalid`] with every problem found otherwise.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let credentials = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
        sources::load(path, credentials.as_deref())
    }

    /// The config as TOML, every default filled in, with secrets masked: a
    /// password in a URL, a token, a password and an NKey seed print as
    /// [`crate::secret::MASK`] (what `idem config check` prints).
    pub fn to_masked_toml(&self) -> String {
        let mut shown = self.clone();
        shown.broker.url = redact_url(&shown.broker.url);
        shown.database.url = redact_url(&shown.database.url);
        // Every value here has a TOML form (no maps with non-string keys,
        // no bare `None`), so this cannot fail; say so if it ever does.
        toml::to_string(&shown).unwrap_or_else(|e| format!("# cannot show the config: {e}\n"))
    }

    /// Checks what serde cannot: names, duplicates, ranges.
    ///
    /// # Errors
    /// Every problem found, one line each, in file order.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        if self.handlers.is_empty() {
            problems.push("no [[handler]] tables: add at least one handler".into());
        }
        if self.runtime.max_component_functions == 0 || self.runtime.max_component_code_mib == 0 {
            problems.push("[runtime] max_component_functions and max_component_code_mib must be at least 1 (0 refuses every component)".into());
        }
        // A partitioned handler runs `concurrency` per partition a host
        // serves, and one host may serve them all.
        let in_flight: usize = self
            .handlers
            .iter()
            .map(|h| h.concurrency * h.partitions.map_or(1, |n| n as usize))
            .sum();
        if in_flight >= self.database.max_connections as usize {
            problems.push(format!(
                "handlers run {in_flight} messages at once (sum of `concurrency`, times `partitions` where set) but [database] max_connections is {}; raise max_connections to at least {} (one spare for dead letters and pruning)",
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
                problems.push(format!(
                    "handler name `{}` may use only letters, digits, `-` and `_` (it is a JetStream durable name)",
                    h.name
                ));
            }
            if !seen.insert(h.name.as_str()) {
                problems.push(format!("handler name `{}` appears twice", h.name));
            }
            if !valid_name(&h.stream) {
                problems.push(format!(
                    "handler `{}`: stream `{}` may use only letters, digits, `-` and `_`",
                    h.name, h.stream
                ));
            }
            if h.subjects.is_empty() {
                problems.push(format!("handler `{}`: `subjects` is empty", h.name));
            }
            if h.max_deliver == 0 {
                problems.push(format!(
                    "handler `{}`: max_deliver must be at least 1",
                    h.name
                ));
            }
            if h.retry_delay.is_some() && !h.backoff.is_empty() {
                problems.push(format!(
                    "handler `{}`: set either retry_delay or backoff, not both",
                    h.name
                ));
            }
            if h.max_result_kib == 0 || h.max_param_kib == 0 {
                problems.push(format!(
                    "handler `{}`: max_result_kib and max_param_kib must be at least 1",
                    h.name
                ));
            }
            for why in crate::outbox::grants::check(&h.publish, &h.endpoints) {
                problems.push(format!("handler `{}`: {why}", h.name));
            }
            if h.max_statements == 0 || h.max_rows == 0 {
                problems.push(format!(
                    "handler `{}`: max_statements and max_rows must be at least 1",
                    h.name
                ));
            }
            if h.deadline.is_zero() || h.statement_timeout().is_zero() {
                problems.push(format!(
                    "handler `{}`: deadline and statement_timeout must be more than 0s",
                    h.name
                ));
            }
            if h.pull_batch == 0 || h.pull_batch > 1000 {
                problems.push(format!(
                    "handler `{}`: pull_batch must be between 1 and 1000",
                    h.name
                ));
            }
            if matches!(h.batch, batch::Batch::Fixed(n) if n == 0 || n > 1000) {
                problems.push(format!(
                    "handler `{}`: batch must be between 1 and 1000 (messages per transaction)",
                    h.name
                ));
            }
            if h.order_key.is_some() && h.batch.batches() {
                problems.push(format!(
                    "handler `{}`: order_key needs batch = 1 (key lanes run one message per transaction); remove batch or order_key",
                    h.name
                ));
            }
            if let Some(n) = h.partitions {
                if !(1..=256).contains(&n) {
                    problems.push(format!(
                        "handler `{}`: partitions must be between 1 and 256 (each is a durable consumer and, on every host, a consuming loop)",
                        h.name
                    ));
                }
                if let Err(why) = crate::broker::partition::transform(h) {
                    problems.push(why);
                }
                if h.priority_timeout() < h.min_priority_timeout() {
                    problems.push(format!(
                        "handler `{}`: priority_timeout must be at least {}s, the longer of ack_wait and the longest nak delay plus {}s (what a dead host held must come back before another host takes its partition)",
                        h.name,
                        h.min_priority_timeout().as_secs(),
                        handler::PRIORITY_TIMEOUT_MARGIN.as_secs()
                    ));
                }
                for other in &self.handlers {
                    let taken = other
                        .name
                        .strip_prefix(&format!("{}-p", h.name))
                        .and_then(|i| i.parse::<u32>().ok())
                        .is_some_and(|i| i < n);
                    if taken {
                        problems.push(format!(
                            "handler `{}`: its partitions' durable consumers are named `{}-p0` to `{}-p{}`, which handler `{}` also is; rename one",
                            h.name,
                            h.name,
                            h.name,
                            n.saturating_sub(1),
                            other.name
                        ));
                    }
                }
            } else if h.priority_timeout.is_some() {
                problems.push(format!(
                    "handler `{}`: priority_timeout applies only with partitions",
                    h.name
                ));
            }
            if h.refuse_out_of_order && h.order_key.is_none() {
                problems.push(format!(
                    "handler `{}`: refuse_out_of_order needs order_key (the last applied stream sequence is kept per key)",
                    h.name
                ));
            }
            if h.batch_linger >= h.ack_wait / 2 {
                problems.push(format!(
                    "handler `{}`: batch_linger must be less than half of ack_wait (the first message of a batch waits that long before it is kept in progress)",
                    h.name
                ));
            }
            if h.batch_linger > Duration::from_secs(10) {
                problems.push(format!(
                    "handler `{}`: batch_linger must be at most 10s (it delays every message of a batch that does not fill)",
                    h.name
                ));
            }
            if h.concurrency == 0 || h.concurrency > 256 {
                problems.push(format!(
                    "handler `{}`: concurrency must be between 1 and 256",
                    h.name
                ));
            }
            // JetStream's limit (nats-server `StreamMaxReplicas`).
            if !(1..=5).contains(&h.stream_replicas) {
                problems.push(format!(
                    "handler `{}`: stream_replicas must be between 1 and 5 (JetStream keeps at most 5 replicas; 3 survives the loss of one server)",
                    h.name
                ));
            }
            if h.retention.is_zero() {
                problems.push(format!(
                    "handler `{}`: retention must be more than 0s",
                    h.name
                ));
            }
            if h.max_memory_mib == 0 || h.max_memory_mib > 4096 {
                problems.push(format!(
                    "handler `{}`: max_memory_mib must be between 1 and 4096",
                    h.name
                ));
            }
            for t in &h.tables {
                if t.to_ascii_lowercase().starts_with("idem_") {
                    problems.push(format!(
                        "handler `{}`: table `{t}` belongs to idem and cannot be granted",
                        h.name
                    ));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::config::start::StartPosition;

    fn parse(s: &str) -> Result<Config, String> {
        let c: Config = toml::from_str(s).map_err(|e| e.to_string())?;
        c.validate().map_err(|problems| problems.join("; "))?;
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
            "handlers run 8 messages at once (sum of `concurrency`, times `partitions` where set) but [database] max_connections is 8; raise max_connections to at least 9 (one spare for dead letters and pruning)"
        );
        let err = parse(&format!("{OK}concurrency = 0\n")).unwrap_err();
        assert_eq!(
            err,
            "handler `credit-projector`: concurrency must be between 1 and 256"
        );
    }

    #[test]
    fn stream_replicas_default_to_one_and_stay_within_jetstreams_five() {
        assert_eq!(parse(OK).unwrap().handlers[0].stream_replicas, 1);
        assert_eq!(
            parse(&format!("{OK}stream_replicas = 3\n"))
                .unwrap()
                .handlers[0]
                .stream_replicas,
            3
        );
        for n in [0, 6] {
            assert_eq!(
                parse(&format!("{OK}stream_replicas = {n}\n")).unwrap_err(),
                "handler `credit-projector`: stream_replicas must be between 1 and 5 (JetStream keeps at most 5 replicas; 3 survives the loss of one server)"
            );
        }
    }

    #[test]
    fn pull_batch_is_capped_by_ack_wait() {
        let mut h = parse(OK).unwrap().handlers.remove(0);
        // ack_wait 10s, deadline 5s: 10 / (1.5 × 6) = 1.1 → 1, raised to 2.
        assert_eq!(h.pull_size(), 2);
        h.concurrency = 4;
        assert_eq!(h.pull_size(), 4);
        h.ack_wait = Duration::from_secs(30);
        h.deadline = Duration::from_secs(1);
        // 30 × 4 / 3 = 40, capped by pull_batch 16.
        assert_eq!(h.pull_size(), 16);
        h.ack_wait = Duration::from_millis(100);
        assert_eq!(h.pull_size(), 2);
        h.pull_batch = 1;
        assert_eq!(h.pull_size(), 2);
        // Batching does not raise it past what ack_wait allows.
        h.batch = batch::Batch::Fixed(64);
        assert_eq!(h.pull_size(), 2);
    }

    #[test]
    fn batch_defaults_to_one_and_is_bounded() {
        let h = parse(OK).unwrap().handlers.remove(0);
        assert_eq!(
            (h.batch, h.batch_linger),
            (batch::Batch::Fixed(1), Duration::from_millis(5))
        );
        let h = parse(&format!("{OK}batch = 64\nbatch_linger = \"20ms\"\n"))
            .unwrap()
            .handlers
            .remove(0);
        assert_eq!(
            (h.batch, h.batch_linger),
            (batch::Batch::Fixed(64), Duration::from_millis(20))
        );
        for (bad, err) in [
            (
                "batch = 0",
                "handler `credit-projector`: batch must be between 1 and 1000 (messages per transaction)",
            ),
            (
                "batch = 1001",
                "handler `credit-projector`: batch must be between 1 and 1000 (messages per transaction)",
            ),
            (
                "batch_linger = \"5s\"",
                "handler `credit-projector`: batch_linger must be less than half of ack_wait (the first message of a batch waits that long before it is kept in progress)",
            ),
            (
                "batch_linger = \"11s\"",
                "handler `credit-projector`: batch_linger must be less than half of ack_wait (the first message of a batch waits that long before it is kept in progress); handler `credit-projector`: batch_linger must be at most 10s (it delays every message of a batch that does not fill)",
            ),
        ] {
            assert_eq!(parse(&format!("{OK}{bad}\n")).unwrap_err(), err, "{bad}");
        }
    }

    #[test]
    fn order_key_reads_like_an_identity_and_needs_batch_one() {
        let h = parse(OK).unwrap().handlers.remove(0);
        assert_eq!(h.order_key, None);
        let h = parse(&format!("{OK}order_key = \"json:/account_id\"\n"))
            .unwrap()
            .handlers
            .remove(0);
        assert_eq!(
            h.order_key,
            Some(OrderKey::Field(IdentityRule::JsonPointer(
                "/account_id".into()
            )))
        );
        let h = parse(&format!("{OK}order_key = \"header:Account\"\n"))
            .unwrap()
            .handlers
            .remove(0);
        assert_eq!(
            h.order_key,
            Some(OrderKey::Field(IdentityRule::Header("Account".into())))
        );
        assert_eq!(
            parse(&format!("{OK}order_key = \"json:/a\"\nbatch = 16\n")).unwrap_err(),
            "handler `credit-projector`: order_key needs batch = 1 (key lanes run one message per transaction); remove batch or order_key"
        );
        let err = parse(&format!("{OK}order_key = \"account_id\"\n")).unwrap_err();
        assert!(
            err.contains(
                "order_key `account_id` must be `json:/pointer` (e.g. json:/account_id), `header:NAME` or `subject:N`"
            ),
            "{err}"
        );
        let h = parse(&format!("{OK}order_key = \"subject:2\"\n"))
            .unwrap()
            .handlers
            .remove(0);
        assert_eq!(h.order_key, Some(OrderKey::SubjectToken(2)));
        assert!(
            parse(&format!("{OK}order_key = \"subject:0\"\n"))
                .unwrap_err()
                .contains("needs a token position from 1")
        );
    }

    #[test]
    fn partitions_need_a_subject_key_and_a_long_enough_priority_timeout() {
        let ok = OK
            .replace("[\"accounts.credit\"]", "[\"accounts.*\"]")
            .replace("ack_wait = \"10s\"", "ack_wait = \"5s\"");
        assert!(ok.contains("accounts.*"), "{ok}");
        let c = parse(&format!("{ok}order_key = \"subject:2\"\npartitions = 4\n")).unwrap();
        let h = &c.handlers[0];
        assert_eq!(h.priority_timeout(), Duration::from_secs(20));
        let parts = h.per_partition();
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[3].durable_name(), "credit-projector-p3");
        assert_eq!(h.durable_name(), "credit-projector");
        assert_eq!(
            parse(&format!(
                "{ok}order_key = \"subject:2\"\npartitions = 4\npriority_timeout = \"10s\"\n"
            ))
            .unwrap_err(),
            "handler `credit-projector`: priority_timeout must be at least 20s, the longer of ack_wait and the longest nak delay plus 15s (what a dead host held must come back before another host takes its partition)"
        );
        assert_eq!(
            parse(&format!("{ok}order_key = \"json:/a\"\npartitions = 4\n")).unwrap_err(),
            "handler `credit-projector`: partitions needs order_key = \"subject:N\" (JetStream hashes a subject token into the partition; it cannot read a payload or header)"
        );
        assert!(
            parse(&format!("{ok}order_key = \"subject:2\"\npartitions = 0\n"))
                .unwrap_err()
                .contains("partitions must be between 1 and 256")
        );
        let twin = "[[handler]]\nname = \"credit-projector-p2\"\nmodule = \"c.wasm\"\nstream = \"OTHER\"\nsubjects = [\"other\"]\n";
        assert_eq!(
            parse(&format!(
                "{ok}order_key = \"subject:2\"\npartitions = 4\n{twin}"
            ))
            .unwrap_err(),
            "handler `credit-projector`: its partitions' durable consumers are named `credit-projector-p0` to `credit-projector-p3`, which handler `credit-projector-p2` also is; rename one"
        );
        // A nak delay longer than ack_wait sets the least timeout.
        let c = parse(&format!(
            "{ok}order_key = \"subject:2\"\npartitions = 4\nbackoff = [\"1s\", \"1m\"]\n"
        ))
        .unwrap();
        assert_eq!(c.handlers[0].priority_timeout(), Duration::from_secs(75));
        assert_eq!(
            parse(&format!(
                "{ok}order_key = \"subject:2\"\npartitions = 4\nbackoff = [\"1m\"]\npriority_timeout = \"30s\"\n"
            ))
            .unwrap_err(),
            "handler `credit-projector`: priority_timeout must be at least 75s, the longer of ack_wait and the longest nak delay plus 15s (what a dead host held must come back before another host takes its partition)"
        );
        assert_eq!(
            parse(&format!("{ok}refuse_out_of_order = true\n")).unwrap_err(),
            "handler `credit-projector`: refuse_out_of_order needs order_key (the last applied stream sequence is kept per key)"
        );
        assert_eq!(
            parse(&format!("{ok}priority_timeout = \"1m\"\n")).unwrap_err(),
            "handler `credit-projector`: priority_timeout applies only with partitions"
        );
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
