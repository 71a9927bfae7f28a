//! Configuration from the environment, through the real binary: the
//! `IDEM_<SECTION>__<KEY>` variables beat the file, other `IDEM_*` variables
//! are not config, `idem config check` prints the effective config with
//! secrets masked or one line per problem, secrets come from files (also
//! under `$CREDENTIALS_DIRECTORY`) and a token file authenticates to a
//! token-protected nats-server; `--log-format json` writes JSON lines that
//! carry the delivery span's fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use std::path::Path;
use std::process::Command;

use idem_tests::idem_cli as idem;

fn check(config: &Path, env: &[(&str, &str)]) -> (i32, String, String) {
    idem(
        &["config", "check", "--config", config.to_str().unwrap()],
        env,
    )
}

const HANDLER: &str = "[[handler]]\nname = \"h\"\nmodule = \"h.wasm\"\nstream = \"S\"\nsubjects = [\"s\"]\ntables = [\"accounts\"]\n";

/// Writes `idem.toml` (`toml`, then one handler) into a new directory.
fn config(toml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.toml");
    std::fs::write(&path, format!("{toml}{HANDLER}")).unwrap();
    (dir, path)
}

/// The printed config up to the first `[[handler]]`.
fn sections(out: &str) -> &str {
    &out[..out.find("[[handler]]").unwrap()]
}

const FILE: &str = "[broker]\nurl = \"nats://file.example:4222\"\n[database]\nurl = \"sqlite://file.db\"\nmax_connections = 4\n[service]\nshutdown_grace = \"5s\"\n";

#[test]
fn the_environment_beats_the_file() {
    let (dir, cfg) = config(FILE);
    let (code, out, err) = check(&cfg, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        sections(&out),
        "[broker]\nurl = \"nats://file.example:4222\"\n\n[database]\nurl = \"sqlite://file.db\"\nmax_connections = 4\n\n[service]\nshutdown_grace = \"5s\"\n\n[runtime]\ncache = true\nmax_component_functions = 50000\nmax_component_code_mib = 32\nfreed_memory_mib = 256\ntrap_source_lines = true\n\n[deploy]\nfollow = true\nmodules_bucket = \"idem-modules\"\ndeployments_bucket = \"idem-deployments\"\nhosts_bucket = \"idem-hosts\"\nshadows_bucket = \"idem-shadows\"\n\n"
    );
    // Every default filled in; relative paths resolved against the file's directory.
    assert!(
        out.contains(&format!(
            "module = \"{}\"\n",
            dir.path().join("h.wasm").display()
        )),
        "{out}"
    );
    assert!(out.contains("max_deliver = 5\n"), "{out}");
    assert!(out.contains("identity = \"header:Nats-Msg-Id\"\n"), "{out}");
    assert!(out.contains("start = \"all\"\n"), "{out}");

    let (code, out, err) = check(
        &cfg,
        &[
            ("IDEM_BROKER__URL", "nats://env.example:4222"),
            ("IDEM_DATABASE__MAX_CONNECTIONS", "12"),
            ("IDEM_SERVICE__SHUTDOWN_GRACE", "10s"),
            ("IDEM_SERVICE__LISTEN", "127.0.0.1:9464"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(err, "");
    assert_eq!(
        sections(&out),
        "[broker]\nurl = \"nats://env.example:4222\"\n\n[database]\nurl = \"sqlite://file.db\"\nmax_connections = 12\n\n[service]\nlisten = \"127.0.0.1:9464\"\nshutdown_grace = \"10s\"\n\n[runtime]\ncache = true\nmax_component_functions = 50000\nmax_component_code_mib = 32\nfreed_memory_mib = 256\ntrap_source_lines = true\n\n[deploy]\nfollow = true\nmodules_bucket = \"idem-modules\"\ndeployments_bucket = \"idem-deployments\"\nhosts_bucket = \"idem-hosts\"\nshadows_bucket = \"idem-shadows\"\n\n"
    );
}

#[test]
fn other_idem_variables_are_not_config() {
    let (_dir, cfg) = config(FILE);
    let (_, plain, _) = check(&cfg, &[]);
    let (code, out, err) = check(
        &cfg,
        &[
            ("IDEM_TEST_PG", "postgres://postgres@127.0.0.1:5432/test"),
            ("IDEM_NATS_SERVER", "/usr/bin/nats-server"),
            ("IDEM_FAULT", ""),
            ("IDEM_CHAOS_LOG", "debug"),
            ("IDEM_LOG_FORMAT", "pretty"),
            ("IDEM_SOMETHING__ELSE", "1"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(err, "");
    assert_eq!(out, plain);
}

#[test]
fn config_check_masks_a_password_and_a_token() {
    let (_dir, cfg) = config(FILE);
    let (code, out, err) = check(
        &cfg,
        &[
            (
                "IDEM_DATABASE__URL",
                "postgres://idem:hunter2-pg@127.0.0.1:5432/test?sslmode=disable",
            ),
            ("IDEM_BROKER__TOKEN", "tok-hunter3"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        sections(&out),
        "[broker]\nurl = \"nats://file.example:4222\"\ntoken = \"***\"\n\n[database]\nurl = \"postgres://idem:***@127.0.0.1:5432/test?sslmode=disable\"\nmax_connections = 4\n\n[service]\nshutdown_grace = \"5s\"\n\n[runtime]\ncache = true\nmax_component_functions = 50000\nmax_component_code_mib = 32\nfreed_memory_mib = 256\ntrap_source_lines = true\n\n[deploy]\nfollow = true\nmodules_bucket = \"idem-modules\"\ndeployments_bucket = \"idem-deployments\"\nhosts_bucket = \"idem-hosts\"\nshadows_bucket = \"idem-shadows\"\n\n"
    );
    assert!(
        !out.contains("hunter2") && !out.contains("hunter3"),
        "{out}"
    );
}

/// `password_file` and `token_file` are read from `$CREDENTIALS_DIRECTORY`
/// (systemd's `LoadCredential=`) when it is set, else next to the config.
#[test]
fn secrets_come_from_files() {
    let creds = tempfile::tempdir().unwrap();
    std::fs::write(creds.path().join("pg-password"), "hunter4-pg\n").unwrap();
    std::fs::write(creds.path().join("nats-token"), "tok-hunter5\n").unwrap();
    let (dir, cfg) = config(
        "[broker]\nurl = \"nats://127.0.0.1:4222\"\ntoken_file = \"nats-token\"\n[database]\nurl = \"postgres://idem@127.0.0.1:5432/test\"\npassword_file = \"pg-password\"\n",
    );
    let creds_dir = creds.path().to_str().unwrap();
    let (code, out, err) = check(&cfg, &[("CREDENTIALS_DIRECTORY", creds_dir)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        sections(&out),
        format!(
            "[broker]\nurl = \"nats://127.0.0.1:4222\"\ntoken = \"***\"\ntoken_file = \"{creds_dir}/nats-token\"\n\n[database]\nurl = \"postgres://idem:***@127.0.0.1:5432/test\"\nmax_connections = 8\npassword_file = \"{creds_dir}/pg-password\"\n\n[service]\nshutdown_grace = \"30s\"\n\n[runtime]\ncache = true\nmax_component_functions = 50000\nmax_component_code_mib = 32\nfreed_memory_mib = 256\ntrap_source_lines = true\n\n[deploy]\nfollow = true\nmodules_bucket = \"idem-modules\"\ndeployments_bucket = \"idem-deployments\"\nhosts_bucket = \"idem-hosts\"\nshadows_bucket = \"idem-shadows\"\n\n"
        )
    );
    assert!(!out.contains("hunter"), "{out}");

    // Without $CREDENTIALS_DIRECTORY the files are looked for next to the config.
    let (code, _, err) = check(&cfg, &[]);
    assert_eq!(code, 1);
    let d = dir.path().display();
    assert_eq!(
        err,
        format!(
            "idem: invalid config {d}/idem.toml: [broker] token_file: cannot read {d}/nats-token: No such file or directory (os error 2); a relative path is read from $CREDENTIALS_DIRECTORY when set, else from the config file's directory\n\
             idem: invalid config {d}/idem.toml: [database] password_file: cannot read {d}/pg-password: No such file or directory (os error 2); a relative path is read from $CREDENTIALS_DIRECTORY when set, else from the config file's directory\n"
        )
    );
}

#[test]
fn an_unknown_key_in_the_environment_is_one_line() {
    let (_dir, cfg) = config(FILE);
    let line = "idem: invalid environment variable IDEM_DATABASE__NOPE: [database] has no key `nope`; unset it or use one of IDEM_DATABASE__URL, IDEM_DATABASE__MAX_CONNECTIONS, IDEM_DATABASE__PASSWORD_FILE, IDEM_DATABASE__ACCEPT_NON_DURABLE_COMMIT\n";
    let (code, out, err) = check(&cfg, &[("IDEM_DATABASE__NOPE", "1")]);
    assert_eq!((code, out.as_str(), err.as_str()), (1, "", line));
    // `idem run` stops on it the same way, before contacting anything.
    let (code, _, err) = idem(
        &["run", "--config", cfg.to_str().unwrap()],
        &[("IDEM_DATABASE__NOPE", "1")],
    );
    assert_eq!((code, err.as_str()), (1, line));
}

#[test]
fn a_bad_duration_in_the_environment_names_the_variable() {
    let (_dir, cfg) = config(FILE);
    let (code, out, err) = check(&cfg, &[("IDEM_SERVICE__SHUTDOWN_GRACE", "soon")]);
    assert_eq!(code, 1);
    assert_eq!(out, "");
    assert_eq!(
        err,
        "idem: invalid environment variable IDEM_SERVICE__SHUTDOWN_GRACE: [service] shutdown_grace: expected a duration, found string \"soon\"\n"
    );
}

#[test]
fn every_problem_is_one_line() {
    let (dir, cfg) = config(&FILE.replace("max_connections = 4", "max_connections = \"four\""));
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg).unwrap() + "tabels = []\n",
    )
    .unwrap();
    let (code, out, err) = check(
        &cfg,
        &[
            ("IDEM_DATABASE__NOPE", "1"),
            ("IDEM_SERVICE__SHUTDOWN_GRACE", "soon"),
            ("IDEM_BROKER_URL", "nats://127.0.0.1:4222"),
            ("IDEM_HANDLER__NAME", "other"),
        ],
    );
    assert_eq!(code, 1);
    assert_eq!(out, "");
    let p = dir.path().join("idem.toml");
    let p = p.display();
    let mut lines: Vec<&str> = err.lines().collect();
    lines.sort();
    let mut expected = vec![
        "idem: invalid environment variable IDEM_BROKER_URL: not read: a section and its key are separated by two underscores, as in IDEM_BROKER__URL".to_owned(),
        "idem: invalid environment variable IDEM_HANDLER__NAME: [[handler]] tables are read from the config file only; unset it".to_owned(),
        "idem: invalid environment variable IDEM_DATABASE__NOPE: [database] has no key `nope`; unset it or use one of IDEM_DATABASE__URL, IDEM_DATABASE__MAX_CONNECTIONS, IDEM_DATABASE__PASSWORD_FILE, IDEM_DATABASE__ACCEPT_NON_DURABLE_COMMIT".to_owned(),
        format!("idem: invalid config {p}: [database] max_connections: expected u32, found string \"four\""),
        "idem: invalid environment variable IDEM_SERVICE__SHUTDOWN_GRACE: [service] shutdown_grace: expected a duration, found string \"soon\"".to_owned(),
        format!("idem: invalid config {p}: [[handler]] `h`: unknown field `tabels`, expected one of `name`, `module`, `stream`, `subjects`, `stream_replicas`, `identity`, `tables`, `publish`, `endpoints`, `migrations`, `max_deliver`, `ack_wait`, `retry_delay`, `backoff`, `deadline`, `concurrency`, `batch`, `batch_linger`, `order_key`, `partitions`, `priority_timeout`, `refuse_out_of_order`, `pull_batch`, `statement_timeout`, `max_statements`, `max_rows`, `max_result_kib`, `max_param_kib`, `max_log_kib`, `max_outbox_calls`, `max_outbox_kib`, `wasi`, `watch`, `max_memory_mib`, `retention`, `accept_horizon_risk`, `start`"),
    ];
    expected.sort();
    assert_eq!(lines, expected);

    // `idem run` prints the first, one line, and says there are more.
    let (code, _, err) = idem(
        &["run", "--config", cfg.to_str().unwrap()],
        &[("IDEM_SERVICE__SHUTDOWN_GRACE", "soon")],
    );
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "idem: invalid config {p}: [database] max_connections: expected u32, found string \"four\" (and 2 more; `idem config check` lists them all)\n"
        )
    );
}

/// The token in `token_file` is what the host authenticates with: against a
/// nats-server that requires it, `idem run --drain` starts and exits 0; with
/// a wrong one it stops with one line that does not show the token.
#[test]
fn a_token_file_authenticates_to_the_broker() {
    let nats = Nats::start_with_config("authorization { token: \"tok-hunter6\" }\n");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nats-token"), "tok-hunter6\n").unwrap();
    let cfg = dir.path().join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"nats://127.0.0.1:{}\"\ntoken_file = \"nats-token\"\n[database]\nurl = \"sqlite://{}/idem.db\"\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\"]\nmigrations = \"{}\"\n",
            nats.port,
            dir.path().display(),
            guest("credit").display(),
            root().join("examples/credit/migrations").display()
        ),
    )
    .unwrap();
    let run = ["run", "--drain", "--config", cfg.to_str().unwrap()];
    let (code, out, err) = idem(&run, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("handler h: delivered=0 processed=0"),
        "{out}"
    );

    std::fs::write(dir.path().join("nats-token"), "tok-wrong7\n").unwrap();
    let (code, _, err) = idem(&run, &[]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "idem: NATS at nats://127.0.0.1:{} refused idem's credentials (authorization violation); check [broker] token / token_file\n",
            nats.port
        )
    );
}

/// A token or password that looks like a number reaches the broker as the
/// characters of its variable: `0123456789` is not the number 123456789,
/// `00042` not 42; a value that reads as a float is no error that prints it.
#[test]
fn numeric_looking_secrets_from_the_environment_are_kept_verbatim() {
    let run = |nats: &Nats, env: &[(&str, &str)]| {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("idem.toml");
        std::fs::write(
            &cfg,
            format!(
                "[broker]\nurl = \"nats://127.0.0.1:{}\"\n[database]\nurl = \"sqlite://{}/idem.db\"\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\"]\nmigrations = \"{}\"\n",
                nats.port,
                dir.path().display(),
                guest("credit").display(),
                root().join("examples/credit/migrations").display()
            ),
        )
        .unwrap();
        idem(&["run", "--drain", "--config", cfg.to_str().unwrap()], env)
    };
    let nats = Nats::start_with_config("authorization { token: \"0123456789\" }\n");
    let (code, out, err) = run(&nats, &[("IDEM_BROKER__TOKEN", "0123456789")]);
    assert_eq!((code, err.contains("refused")), (0, false), "{err}");
    assert!(out.starts_with("handler h: delivered=0"), "{out}");

    let nats = Nats::start_with_config(
        "authorization { users = [ { user: \"0070\", password: \"00042\" } ] }\n",
    );
    let (code, _, err) = run(
        &nats,
        &[
            ("IDEM_BROKER__USER", "0070"),
            ("IDEM_BROKER__PASSWORD", "00042"),
        ],
    );
    assert_eq!(code, 0, "{err}");

    let (dir, path) = config("[broker]\nurl = \"nats://127.0.0.1:4222\"\nuser = \"u\"\n");
    let (code, out, err) = check(&path, &[("IDEM_BROKER__PASSWORD", "31337.25")]);
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
    assert!(sections(&out).contains("password = \"***\"\n"), "{out}");
    assert!(!out.contains("31337"), "{out}");
    drop(dir);
}

/// `--log-format json`: every stderr line is a JSON object, and a line
/// logged inside a delivery (here the retry of its first delivery) carries
/// the `delivery` span's handler, stream sequence, delivery count and
/// message id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_delivery_span() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new("jsonlog", "behave")],
    );
    create_stream(&nats, "ACCOUNTS", &["accounts.credit"]).await;
    let js = nats.jetstream().await;
    publish(
        &js,
        "accounts.credit",
        r#"{"op":"retry-once-then-credit","event_id":"e1","account_id":1,"amount":5}"#,
        &[],
    )
    .await;
    let out = Command::new(env!("CARGO_BIN_EXE_idem-test-host"))
        .args(["--log-format", "json", "run", "--drain", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info,async_nats=warn")
        .env_remove("IDEM_LOG_FORMAT")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "handler jsonlog: delivered=2 processed=1 duplicates=0 retried=1 dead_lettered=0 traps=0 ack_failures=0 log_bytes_dropped=0 db_pauses=0 receipts_pruned=0 unique_violations=0 batched=0 receipt_lookups=1 duplicates_looked_up=0"
    );
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let retry: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["message"] == "rolled back; will retry")
        .collect();
    assert_eq!(retry.len(), 1, "{err}");
    assert_eq!(retry[0]["level"], "INFO");
    assert_eq!(
        retry[0]["spans"],
        serde_json::json!([{
            "name": "delivery",
            "handler": "jsonlog",
            "stream_sequence": 1,
            "delivery": 1,
            "message_id": "e1",
        }])
    );
    assert_eq!(db.balance(1).await, Some(5));
    // The same with IDEM_LOG_FORMAT instead of the flag.
    let out = Command::new(env!("CARGO_BIN_EXE_idem-test-host"))
        .args(["run", "--drain", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info,async_nats=warn")
        .env("IDEM_LOG_FORMAT", "json")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.lines().count() > 0);
    for l in err.lines() {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["timestamp"].is_string() && v["level"].is_string(), "{l}");
    }
}
