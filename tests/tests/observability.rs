//! The HTTP listener of `idem run` (`[service] listen`), against the real
//! binary: `/metrics` counts a known workload exactly, `/readyz` follows the
//! broker and the database going away and coming back, `/healthz` answers,
//! and an address that cannot be bound stops the start with one line.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::chaos::HostProcess;
use idem_tests::pg_cluster::PgCluster;
use idem_tests::scrape::{http_get as get, scrape};
use idem_tests::*;
use sha2::Digest as _;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const HANDLER: &str = "obs";
const SUBJECT: &str = "accounts.credit";

fn host_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_idem-test-host"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// [`write_config`] for one `behave` handler, with `[service] listen` on
/// `port`.
fn config(dir: &Path, nats: &Nats, db: &TestDb, port: u16) -> PathBuf {
    config_with(dir, nats, db, port, "")
}

/// [`config`] with `extra` lines in the handler's table.
fn config_with(dir: &Path, nats: &Nats, db: &TestDb, port: u16, extra: &str) -> PathBuf {
    let mut spec = HandlerSpec::new(HANDLER, "behave");
    spec.extra.push_str(extra);
    let path = write_config(dir, nats, db, &[spec]);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("[service]\nlisten = \"127.0.0.1:{port}\"\n"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Polls `GET path` until its status is `status` (60 s at most); the body.
async fn until_status(host: &mut HostProcess, port: u16, path: &str, status: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = get(port, path);
        if let Some((s, body)) = &got
            && *s == status
        {
            return body.clone();
        }
        assert!(
            host.exited().is_none() && Instant::now() < deadline,
            "{path} never answered {status} (last: {got:?}); log:\n{}",
            std::fs::read_to_string(&host.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The handler's sample of `name` (`None`: not exported).
fn sample(m: &BTreeMap<String, f64>, name: &str) -> Option<f64> {
    m.get(&format!("{name}{{handler=\"{HANDLER}\"}}")).copied()
}

/// Polls `/metrics` until the handler's `name` is `want` (60 s at most).
async fn until_metric(host: &mut HostProcess, port: u16, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = sample(&scrape(port), name);
        if got == Some(want) {
            return;
        }
        assert!(
            host.exited().is_none() && Instant::now() < deadline,
            "{name} never reached {want} (last {got:?}); log:\n{}",
            std::fs::read_to_string(&host.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn op(event_id: &str, op: &str, account: i64, amount: i64) -> String {
    serde_json::json!({"op": op, "event_id": event_id, "account_id": account, "amount": amount})
        .to_string()
}

/// N = 5 new credits, D = 2 re-published copies, R = 2 messages retried
/// once (then committed), and one dead letter whose statement failed on a
/// unique constraint: every counter exact, each latency histogram with one
/// observation per commit, `idem_handler_info` naming the component's digest.
async fn metrics_count_a_known_workload(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), &nats, &db, port);
    let mut host = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "host");
    until_status(&mut host, port, "/readyz", 200).await;
    let js = nats.jetstream().await;

    for i in 1..=5 {
        publish(&js, SUBJECT, &op(&format!("c{i}"), "credit", i, 10), &[]).await;
    }
    until_metric(&mut host, port, "idem_processed_total", 5.0).await;
    for i in 1..=2 {
        publish(&js, SUBJECT, &op(&format!("c{i}"), "credit", i, 10), &[]).await;
    }
    until_metric(&mut host, port, "idem_duplicates_total", 2.0).await;
    for (id, account) in [("r1", 6), ("r2", 7)] {
        publish(
            &js,
            SUBJECT,
            &op(id, "retry-once-then-credit", account, 10),
            &[],
        )
        .await;
    }
    until_metric(&mut host, port, "idem_processed_total", 7.0).await;
    let clash = serde_json::json!({
        "op": "sql",
        "event_id": "u1",
        "sql": "INSERT INTO accounts (account_id, balance) VALUES (1, 0)",
    });
    publish(&js, SUBJECT, &clash.to_string(), &[]).await;
    until_metric(&mut host, port, "idem_dead_letters_total", 1.0).await;

    let m = scrape(port);
    let counters = [
        ("idem_deliveries_total", 12.0),
        ("idem_processed_total", 7.0),
        ("idem_duplicates_total", 2.0),
        ("idem_retries_total", 2.0),
        ("idem_dead_letters_total", 1.0),
        ("idem_traps_total", 0.0),
        ("idem_ack_failures_total", 0.0),
        ("idem_db_pauses_total", 0.0),
        ("idem_receipts_pruned_total", 0.0),
        ("idem_unique_violations_total", 1.0),
        ("idem_batched_total", 0.0),
        ("idem_handler_seconds_count", 7.0),
        ("idem_commit_seconds_count", 7.0),
        ("idem_publish_to_commit_seconds_count", 7.0),
        ("idem_in_flight", 0.0),
        ("idem_retention_seconds", 604_800.0),
    ];
    for (name, want) in counters {
        assert_eq!(sample(&m, name), Some(want), "{name}");
    }
    // Exported from the start on SQLite, without a handler label (its
    // count is `store_receipts`' test: the host's own pruning may hold the
    // lock at any time); PostgreSQL has no such counter.
    let waits = m.get("idem_sqlite_write_lock_waits_total").copied();
    assert_eq!(
        waits.is_some(),
        matches!(backend, Backend::Sqlite),
        "{waits:?}"
    );
    let digest = hex(&sha2::Sha256::digest(
        std::fs::read(guest("behave")).unwrap(),
    ));
    let info: Vec<(&String, &f64)> = m
        .iter()
        .filter(|(k, _)| k.starts_with("idem_handler_info{"))
        .collect();
    assert_eq!(info.len(), 1, "{info:?}");
    let (labels, value) = info[0];
    assert_eq!(*value, 1.0);
    for label in [
        format!("handler=\"{HANDLER}\""),
        format!("digest=\"{digest}\""),
        "wit=\"idem:handler@0.2.0\"".to_string(),
    ] {
        assert!(labels.contains(&label), "{labels} lacks {label}");
    }
    assert_eq!(db.receipts(HANDLER).await, 7);
    assert_eq!(db.dead_letters(HANDLER).await.len(), 1);

    // The gauges refreshed on an interval: the consumer is drained, and the
    // receipts have an oldest one (SQLite counts them exactly; PostgreSQL's
    // figure is the planner's estimate).
    until_metric(&mut host, port, "idem_consumer_pending", 0.0).await;
    until_metric(&mut host, port, "idem_consumer_ack_pending", 0.0).await;
    if backend == Backend::Sqlite {
        until_metric(&mut host, port, "idem_receipts", 7.0).await;
    } else {
        let deadline = Instant::now() + Duration::from_secs(60);
        while sample(&scrape(port), "idem_receipts").unwrap_or(0.0) < 1.0 {
            assert!(Instant::now() < deadline, "no receipt estimate");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while sample(&scrape(port), "idem_oldest_receipt_age_seconds").unwrap_or(0.0) <= 0.0 {
        assert!(Instant::now() < deadline, "no oldest receipt age");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ended = host.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
}
on_both_databases!(metrics_workload, metrics_count_a_known_workload);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The handler's `idem_handler_info` series as (digest, value), by value
/// (1 first), each checked to name the handler and the WIT package.
fn info_series(m: &BTreeMap<String, f64>) -> Vec<(String, f64)> {
    let mut series: Vec<(String, f64)> = m
        .iter()
        .filter_map(|(k, v)| {
            let labels = k.strip_prefix("idem_handler_info{")?.strip_suffix('}')?;
            let prefix = format!("handler=\"{HANDLER}\",digest=\"");
            let (digest, rest) = labels.strip_prefix(&prefix)?.split_once('"')?;
            assert_eq!(rest, ",wit=\"idem:handler@0.2.0\"", "{k}");
            Some((digest.to_string(), *v))
        })
        .collect();
    let all = m
        .keys()
        .filter(|k| k.starts_with("idem_handler_info"))
        .count();
    assert_eq!(all, series.len(), "{m:?}");
    series.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    series
}

/// Polls `/metrics` until `digest` is the handler's current version (60 s
/// at most); the series then.
async fn until_running(host: &mut HostProcess, port: u16, digest: &str) -> Vec<(String, f64)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let series = info_series(&scrape(port));
        if series
            .first()
            .is_some_and(|(d, v)| d == digest && *v == 1.0)
        {
            return series;
        }
        assert!(
            host.exited().is_none() && Instant::now() < deadline,
            "{digest} never became current (last {series:?}); log:\n{}",
            std::fs::read_to_string(&host.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Five components swapped in back to back (`watch = true`, the module file
/// rewritten each time with another custom section: same code, another
/// digest): after each swap `/metrics` has exactly two `idem_handler_info`
/// series, the new digest reading 1 and the one it replaced 0, whatever
/// ran before. Back to the version just left, the two trade values.
#[tokio::test]
async fn handler_info_keeps_the_current_and_the_left_version_only() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let original = std::fs::read(guest("behave")).unwrap();
    let module = dir.path().join("handler.wasm");
    std::fs::write(&module, &original).unwrap();
    let cfg = config_with(dir.path(), &nats, &db, port, "watch = true\n");
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        &guest("behave").display().to_string(),
        &module.display().to_string(),
    );
    std::fs::write(&cfg, text).unwrap();
    let mut host = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "host");
    until_status(&mut host, port, "/readyz", 200).await;
    let version = |i: usize| with_custom_section(&original, &format!("v{i}"));
    let digest = |bytes: &[u8]| hex(&sha2::Sha256::digest(bytes));
    let d0 = digest(&original);
    assert_eq!(info_series(&scrape(port)), vec![(d0.clone(), 1.0)]);

    let mut left = d0;
    for i in 1..=5 {
        let next = version(i);
        let d = digest(&next);
        replace_file(&module, &next);
        let series = until_running(&mut host, port, &d).await;
        assert_eq!(
            series,
            vec![(d.clone(), 1.0), (left.clone(), 0.0)],
            "swap {i}"
        );
        left = d;
    }
    let (d4, d5) = (digest(&version(4)), left);
    replace_file(&module, &version(4));
    let series = until_running(&mut host, port, &d4).await;
    assert_eq!(series, vec![(d4, 1.0), (d5, 0.0)]);

    // The help and type lines come once, with the series.
    let (_, body) = get(port, "/metrics").unwrap();
    assert_eq!(body.matches("# TYPE idem_handler_info gauge\n").count(), 1);
    let ended = host.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_broker() {
    let mut nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), &nats, &db, port);
    let mut host = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "host");
    assert_eq!(
        until_status(&mut host, port, "/readyz", 200).await,
        r#"{"ready":true}"#
    );
    nats.stop();
    assert_eq!(
        until_status(&mut host, port, "/readyz", 503).await,
        r#"{"ready":false,"reason":"broker disconnected"}"#
    );
    assert_eq!(get(port, "/healthz"), Some((200, "ok\n".to_string())));
    nats.start_again();
    until_status(&mut host, port, "/readyz", 200).await;
    let js = nats.jetstream().await;
    publish(&js, SUBJECT, &op("after", "credit", 1, 5), &[]).await;
    until_metric(&mut host, port, "idem_processed_total", 1.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_database() {
    let mut pg = PgCluster::start();
    let db = pg.create_db("idem_ready").await;
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), &nats, &db, port);
    let mut host = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "host");
    until_status(&mut host, port, "/readyz", 200).await;
    let js = nats.jetstream().await;
    pg.stop();
    // The host learns of the outage from the first message that needs the
    // database; it holds that message until the database is back.
    publish(&js, SUBJECT, &op("held", "credit", 1, 5), &[]).await;
    assert_eq!(
        until_status(&mut host, port, "/readyz", 503).await,
        r#"{"ready":false,"reason":"database unavailable"}"#
    );
    pg.start_again();
    assert_eq!(
        until_status(&mut host, port, "/readyz", 200).await,
        r#"{"ready":true}"#
    );
    until_metric(&mut host, port, "idem_processed_total", 1.0).await;
    assert_eq!(db.balance(1).await, Some(5));
}

/// SIGTERM while a delivery is in flight (a guest spinning until its 3 s
/// deadline): `/readyz` is 503 "shutting down" while the host finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_turns_off_at_once_on_shutdown() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config_with(dir.path(), &nats, &db, port, "deadline = \"3s\"\n");
    let mut host = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "host");
    until_status(&mut host, port, "/readyz", 200).await;
    let js = nats.jetstream().await;
    let spin = serde_json::json!({"op": "loop", "event_id": "spin"});
    publish(&js, SUBJECT, &spin.to_string(), &[]).await;
    until_metric(&mut host, port, "idem_in_flight", 1.0).await;
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &host.pid().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    assert_eq!(
        until_status(&mut host, port, "/readyz", 503).await,
        r#"{"ready":false,"reason":"shutting down"}"#
    );
    assert_eq!(get(port, "/healthz"), Some((200, "ok\n".to_string())));
    let ended = host.wait_exit(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_and_unknown_paths_are_404() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), &nats, &db, port);
    let mut host = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "host");
    assert_eq!(until_status(&mut host, port, "/healthz", 200).await, "ok\n");
    assert_eq!(get(port, "/nothing").map(|r| r.0), Some(404));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_in_use_stops_the_start_with_one_line() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg = config(dir.path(), &nats, &db, port);
    let out = std::process::Command::new(host_bin())
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "idem: cannot listen on 127.0.0.1:{port} ([service] listen): Address already in use (os error 98); choose a free address and port, or remove `listen`\n"
        )
    );
}

/// A server that says nothing while the connection stays up (frozen with
/// SIGSTOP: no message, no heartbeat; the client's pings are not missed for
/// a minute): `/readyz` names the handler whose pull requests go
/// unanswered and `idem_consumer_silence_seconds` counts the silence; once
/// the server goes on, the host is ready again, the gauge back under the
/// threshold, and a message is processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_jetstream_silence() {
    let mut nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), &nats, &db, port);
    let mut host = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "host");
    until_status(&mut host, port, "/readyz", 200).await;
    // While the server answers, the silence stays under a heartbeat (2 s)
    // and far from the 6 s that make the host not ready.
    let answered = sample(&scrape(port), "idem_consumer_silence_seconds");
    assert!(answered.is_some_and(|s| s < 6.0), "gauge {answered:?}");
    nats.freeze();
    let body = until_status(&mut host, port, "/readyz", 503).await;
    let silence = sample(&scrape(port), "idem_consumer_silence_seconds");
    nats.resume();
    let reason: serde_json::Value = serde_json::from_str(&body).unwrap();
    let reason = reason["reason"].as_str().unwrap().to_string();
    let prefix = format!("handler `{HANDLER}`: JetStream has not answered its pull requests for ");
    let secs = reason
        .strip_prefix(&prefix)
        .and_then(|r| r.strip_suffix("s (no message, no heartbeat)"))
        .unwrap_or_else(|| panic!("not a silence: {reason}"));
    assert!(secs.parse::<u64>().unwrap() >= 6, "{reason}");
    assert!(silence.is_some_and(|s| s >= 6.0), "gauge {silence:?}");
    assert_eq!(
        until_status(&mut host, port, "/readyz", 200).await,
        r#"{"ready":true}"#
    );
    let js = nats.jetstream().await;
    publish(&js, SUBJECT, &op("after", "credit", 1, 5), &[]).await;
    until_metric(&mut host, port, "idem_processed_total", 1.0).await;
    assert_eq!(db.balance(1).await, Some(5));
    let answered = sample(&scrape(port), "idem_consumer_silence_seconds");
    assert!(answered.is_some_and(|s| s < 6.0), "gauge {answered:?}");
    let ended = host.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
}
