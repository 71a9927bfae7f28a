//! The `idem` command line: startup errors are one line and a non-zero exit;
//! a restart logs no database notices at the default level (`idem publish`
//! is tests/tests/publish.rs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use std::process::Command;

/// The CLI with no `IDEM_*` config variables and logging off.
fn idem(args: &[&str]) -> (i32, String, String) {
    idem_cli(args, &[])
}

/// Runs `idem run` on a config whose handler module is `module` and returns
/// (exit code, stderr).
fn run_with(toml: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("idem.toml");
    std::fs::write(&cfg, toml).unwrap();
    let (code, _, err) = idem(&["run", "--config", cfg.to_str().unwrap()]);
    (code, err)
}

fn config_with_module(module: &str) -> String {
    format!(
        "[broker]\nurl = \"nats://127.0.0.1:1\"\n[[handler]]\nname = \"h\"\nmodule = \"{module}\"\nstream = \"S\"\nsubjects = [\"s\"]\ntables = [\"accounts\"]\n"
    )
}

fn assert_one_line(code: i32, err: &str, needle: &str) {
    assert_eq!(code, 1, "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err:?}");
    assert!(err.starts_with("idem: "), "stderr: {err}");
    assert!(err.contains(needle), "expected `{needle}` in: {err}");
}

#[test]
fn bad_config_is_one_line() {
    let (code, err) = run_with("[broker]\nurl = 3\n");
    assert_one_line(code, &err, "invalid config");
    let (code, err) = run_with(&config_with_module("x.wasm").replace("tables", "tabels"));
    assert_one_line(code, &err, "unknown field `tabels`");
    let (code, _, err) = idem(&["run", "--config", "/nonexistent/idem.toml"]);
    assert_one_line(code, &err, "cannot read config /nonexistent/idem.toml");
}

#[test]
fn missing_or_mismatched_module_is_one_line() {
    let (code, err) = run_with(&config_with_module("/nonexistent/handler.wasm"));
    assert_one_line(code, &err, "handler `h`");
    assert!(err.contains("/nonexistent/handler.wasm"), "{err}");

    let wrong = guest("wrong-world");
    let (code, err) = run_with(&config_with_module(wrong.to_str().unwrap()));
    assert_one_line(code, &err, "handler `h`");

    let wasi = guest("credit-wasip2");
    let (code, err) = run_with(&config_with_module(wasi.to_str().unwrap()));
    assert_one_line(code, &err, "wasi");
}

#[test]
fn unreachable_broker_is_one_line() {
    let credit = guest("credit");
    let dir = tempfile::tempdir().unwrap();
    let toml = config_with_module(credit.to_str().unwrap()).replace(
        "[[handler]]",
        &format!(
            "[database]\nurl = \"sqlite://{}/idem.db\"\n[[handler]]",
            dir.path().display()
        ),
    );
    let (code, err) = run_with(&toml);
    assert_one_line(code, &err, "nats://127.0.0.1:1");
}

/// PostgreSQL's notices for what already exists ("relation … already exists,
/// skipping", sent by the start's `CREATE … IF NOT EXISTS`) are not logged
/// at the default level: a second start on the same database prints none.
#[tokio::test]
async fn a_restart_on_postgresql_logs_no_notices() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new("quiet", "credit")],
    );
    let drain = || {
        let out = Command::new(env!("CARGO_BIN_EXE_idem-test-host"))
            .args(["run", "--drain", "--config", cfg.to_str().unwrap()])
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let first = drain();
    assert_eq!(first.0, 0, "{}", first.2);
    let (code, out, err) = drain();
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        "handler quiet: delivered=0 processed=0 duplicates=0 retried=0 dead_lettered=0 traps=0 ack_failures=0 log_bytes_dropped=0 db_pauses=0 receipts_pruned=0 unique_violations=0 batched=0 receipt_lookups=0 duplicates_looked_up=0"
    );
    assert!(
        err.contains("handler ready"),
        "the host logs at info: {err}"
    );
    assert!(!err.contains("already exists"), "{err}");
    assert!(!err.contains("sqlx::postgres::notice"), "{err}");
}

/// Output cut short by its reader (`idem deploy --help | head -1`) ends the
/// command as SIGPIPE ends `cat`, quietly, instead of a panic in `println!`.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    // The reading end is closed before the command starts: its first write
    // to stdout meets a closed pipe, whatever the timing.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(test_host())
        .args(["deploy", "--help"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err, "", "{err}");
    // SIGPIPE is signal 13 on Linux.
    assert_eq!(out.status.signal(), Some(13), "{:?}", out.status);
}
