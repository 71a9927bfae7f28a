//! idem: a host that consumes NATS JetStream messages and runs WebAssembly
//! component handlers so that each message changes a SQL database exactly once.
//!
//! Data flows one way: [`broker`] → [`pipeline`] → [`store`] + [`runtime`] →
//! [`pipeline`] → [`broker`]. [`service`] wires them up; [`cli`] is the binary.

pub mod broker;
pub mod cli;
pub mod config;
pub mod fault;
pub mod identity;
pub mod metrics;
pub mod pipeline;
pub mod publish;
pub mod runtime;
pub mod service;
pub mod sql_guard;
pub mod store;

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
