//! What idem's integration tests (`tests/`, `host/tests/`) and benches
//! (`host/benches/`) share, none of it tied to idem's own types: where the
//! workspace, cargo's target directory and the built guests are, the
//! PostgreSQL URL the tests use, unique names, a private `nats-server` per
//! test or bench, running a CLI binary built beside the tests, an HTTP
//! receiver on loopback for the outbox's calls, a private nats-server
//! cluster, and a run directory kept
//! when a test fails.
//!
//! Environment: `CARGO_TARGET_DIR` (as `scripts/build-guests.sh` reads it),
//! `IDEM_TEST_PG` (see [`pg_url`]), `IDEM_NATS_SERVER` (see
//! [`nats_server_bin`]).
//!
//! Everything here panics on what a test cannot go on without (a missing
//! file, a server that does not start): the panic is the test's failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;
mod http;
mod nats;
mod nats_cluster;
mod pg;
mod run_dir;

pub use cli::{binary_beside_tests, run_cli};
pub use http::{HttpReceiver, Policy, Request};
pub use nats::{Nats, free_port, nats_server_bin};
pub use nats_cluster::NatsCluster;
pub use pg::{PG_URL_DEFAULT, pg_url, pg_url_as, pg_url_in_schema, pg_url_with_database};
pub use run_dir::RunDir;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The workspace root (the directory of the top `Cargo.toml`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set (as
/// `scripts/build-guests.sh` reads it), else `target/` in the workspace.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// Where `scripts/build-guests.sh` and `scripts/build-lang-guests.sh` put
/// the guest components: `<target>/guests` ([`target_dir`]). Not checked:
/// a bench skips the components that are missing.
pub fn guests_dir() -> PathBuf {
    target_dir().join("guests")
}

/// The file `rel` (a path relative to [`target_dir`], e.g.
/// `wasm32-unknown-unknown/guest/credit.wasm`) that
/// `scripts/build-guests.sh` builds.
///
/// # Panics
/// When the file is missing, with a hint to run `scripts/build-guests.sh`.
pub fn built(rel: &str) -> PathBuf {
    let p = target_dir().join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `bash scripts/build-guests.sh` first (scripts/test.sh does)",
        p.display()
    );
    p
}

/// A built guest component, `<target>/guests/NAME.wasm` (`name` without
/// the extension, e.g. `behave`).
///
/// # Panics
/// When the file is missing, as [`built`].
pub fn guest(name: &str) -> PathBuf {
    built(&format!("guests/{name}.wasm"))
}

/// `prefix` made unique to this process and call:
/// `<prefix>_<pid>_<nanoseconds of the second>_<counter>`, a valid SQL
/// identifier when `prefix` is one (for databases, schemas, roles, tables).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}_{}_{nanos}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The databases every suite runs on: the one list a new database joins
/// (ARCHITECTURE.md, "Adding a database"). `with_backends!([m] args…)`
/// expands to `m! { [module Variant]… args… }`, one `[module Variant]` per
/// database: `module` names its test (`x::postgres`, `x::sqlite`), and
/// `Variant` is the database's variant in the caller's own enum (idem's
/// `DbKind`, the integration tests' `Backend`). The macros that run a test
/// on every database (`on_both_databases!` in `tests/src`, `on_both!` in
/// `host/tests/store_statements.rs`) expand from it.
#[macro_export]
macro_rules! with_backends {
    ([$($m:tt)+] $($args:tt)*) => {
        $($m)+! { [postgres Postgres] [sqlite Sqlite] $($args)* }
    };
}
