//! idem: a host that consumes NATS JetStream messages and runs WebAssembly
//! component handlers so that each message changes a SQL database exactly once.
//!
//! Data flows one way: [`broker`] → [`pipeline`] → [`store`] + [`runtime`] →
//! [`pipeline`] → [`broker`]. [`service`] is the running host that wires them
//! up (its [`service::http`] serves health, readiness and [`metrics`]);
//! [`retention`] is the retention policy; [`cli`] is the binary; [`admin`]
//! holds the operator commands on the database. ARCHITECTURE.md, "Code
//! map", walks the folders in this order.

#![deny(missing_docs)]

pub mod admin;
pub mod authoring;
pub mod backoff;
pub mod broker;
pub mod cli;
pub mod config;
pub mod deploy;
pub mod log_format;
pub mod metrics;
pub mod outbox;
pub mod pipeline;
pub mod progress;
pub mod publish;
pub mod retention;
pub mod runtime;
pub mod scaffold;
pub mod secret;
pub mod service;
pub mod shadow;
pub mod sql_guard;
pub mod sql_value;
pub mod store;

/// The log filter when `RUST_LOG` is unset: `info`, with the NATS client's
/// connection chatter at `warn`, and PostgreSQL's notices (sqlx logs a
/// `NOTICE` such as "relation … already exists, skipping", sent on every
/// start by `CREATE … IF NOT EXISTS`, at info under the target
/// `sqlx::postgres::notice`) shown only from `warn`; PostgreSQL's warnings
/// still show.
pub const DEFAULT_LOG_FILTER: &str = "info,async_nats=warn,sqlx::postgres::notice=warn";

/// The default filter of the authors' commands (`idem invoke`, `idem
/// test`): their report is on stdout, and the guest's lines are in it, so
/// only warnings of the host go to stderr.
pub const QUIET_LOG_FILTER: &str = "warn,idem::guest=off,sqlx::postgres::notice=error";

/// How log lines are written (`idem --log-format`, or `IDEM_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; colours only on a terminal.
    #[default]
    Pretty,
    /// One JSON object per line: `timestamp`, `level`, `target`, the
    /// event's fields flattened (`message`, …), and `spans`, the open spans
    /// outermost first, each with its `name` and fields (inside a delivery,
    /// the `delivery` span: `handler`, `stream_sequence`, `delivery`,
    /// `message_id`).
    Json,
}

/// Logs to stderr in `format`, filtered by `RUST_LOG` (default
/// `default_filter`, [`DEFAULT_LOG_FILTER`] or [`QUIET_LOG_FILTER`]). Whatever the fields hold, a line stays one line
/// with no control bytes in it, of bounded length ([`log_format`]).
pub fn init_tracing(format: LogFormat, default_filter: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder
            .fmt_fields(log_format::text::TextFields)
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .fmt_fields(log_format::json::JsonFields)
            .event_format(log_format::json::JsonLines)
            .try_init(),
    };
}
