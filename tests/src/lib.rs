//! Test harness for idem's integration tests: a private `nats-server` per
//! test, a fresh PostgreSQL database or SQLite file per test, config files,
//! and an in-process host. What is not tied to idem (paths, the PostgreSQL
//! URL, the nats-server, running a CLI) comes from `idem-test-support`,
//! shared with `host/tests` and `host/benches`, and is re-exported here.
//!
//! Environment: `IDEM_NATS_SERVER` (default `.tools/venv/bin/nats-server`, put
//! there by `scripts/setup.sh`), `IDEM_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/test?sslmode=disable`: the admin URL used to create and
//! drop one database per test; [`pg_url`]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod arena;
pub mod chaos;
pub mod clock;
mod db;
pub mod deploy_keys;
pub mod examples;
mod host;
pub mod nats_jwt;
pub mod pg_cluster;
pub mod scrape;
mod streams;
pub mod tls;

pub use arena::*;
pub use db::*;
pub use host::*;
pub use idem_test_support::{
    Nats, built, free_port, guest, nats_server_bin, pg_url, root, target_dir, unique, with_backends,
};
pub use streams::*;

use std::path::{Path, PathBuf};

/// The Rust guests of `tests/guests.txt` as `build.rs` reads them: the
/// constant `GUESTS` and the macro [`foreach_guest!`].
pub mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

/// Runs wasm-tools (`$WASM_TOOLS`, default `.tools/venv/bin/wasm-tools`,
/// put there by `scripts/setup.sh`) with `args`; its stdout. Panics with
/// its stderr when it fails.
pub fn wasm_tools(args: &[&std::ffi::OsStr]) -> Vec<u8> {
    let tools = std::env::var_os("WASM_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".tools/venv/bin/wasm-tools"));
    let out = std::process::Command::new(&tools)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", tools.display()));
    assert!(
        out.status.success(),
        "wasm-tools {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The idem CLI with test-only fault points (`tests/src/bin/idem-test-host.rs`),
/// built by cargo beside the test binaries.
pub fn test_host() -> PathBuf {
    idem_test_support::binary_beside_tests("idem-test-host")
}

/// Runs the idem CLI ([`test_host`]) with `args` and `env` to its end:
/// `(exit code, stdout, stderr)`. The variables in `env` are the only
/// `IDEM_*` config (and `CREDENTIALS_DIRECTORY`) it sees: any the test
/// runner has are removed first. Logging is off (`RUST_LOG=off`), so
/// stderr holds only what the CLI prints itself (its one-line errors).
pub fn idem_cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    idem_test_support::run_cli(&test_host(), args, env)
}

/// The `batch` line every handler a test config writes gets when
/// `IDEM_TEST_BATCH` is set (`batch = N`; the suites run again with
/// batching on, see scripts/test.sh), unless `extra` sets `batch` itself.
pub fn test_batch_line(extra: &str) -> String {
    match std::env::var("IDEM_TEST_BATCH") {
        Ok(n) if !n.is_empty() && !extra.lines().any(|l| l.trim_start().starts_with("batch ")) => {
            let n: usize = n.parse().expect("IDEM_TEST_BATCH is a number");
            format!("batch = {n}\n")
        }
        _ => String::new(),
    }
}

/// `bytes` (a component) with a custom section `idem-test` holding `tag`
/// appended: another digest, the same code.
pub fn with_custom_section(bytes: &[u8], tag: &str) -> Vec<u8> {
    let name = b"idem-test";
    let payload = tag.as_bytes();
    let size = 1 + name.len() + payload.len();
    assert!(size < 128 && name.len() < 128);
    let mut out = bytes.to_vec();
    out.extend_from_slice(&[0, size as u8, name.len() as u8]);
    out.extend_from_slice(name);
    out.extend_from_slice(payload);
    out
}

/// Replaces `path` with `bytes` the way a deploy script does: write a
/// temporary file beside it, then rename it over (a watching host never
/// reads half a file).
pub fn replace_file(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A credit event payload.
pub fn credit(event_id: &str, account: i64, amount: i64) -> String {
    serde_json::json!({"event_id": event_id, "account_id": account, "amount": amount}).to_string()
}

/// Expands to one `#[tokio::test]` per database of
/// [`idem_test_support::with_backends!`]: `NAME::postgres`, `NAME::sqlite`,
/// each calling `BODY(Backend::…)`.
#[macro_export]
macro_rules! on_both_databases {
    ($name:ident, $body:ident) => {
        $crate::with_backends!([$crate::on_each_backend] $name, $body);
    };
}

/// [`on_both_databases!`]'s expansion, given the list of databases.
#[doc(hidden)]
#[macro_export]
macro_rules! on_each_backend {
    ($([$module:ident $variant:ident])* $name:ident, $body:ident) => {
        mod $name {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $module() {
                    super::$body($crate::Backend::$variant).await
                }
            )*
        }
    };
}

/// Peak and current resident memory of process `pid` in KiB: `VmHWM` and
/// `VmRSS` from `/proc/<pid>/status` (Linux). `None` when the process is
/// gone or the file lacks them.
pub fn process_memory_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status.lines().find_map(|l| {
            l.strip_prefix(name)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}
