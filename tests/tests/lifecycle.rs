//! The host's lifecycle as a service, against the real binary (the idem CLI
//! as `idem-test-host`), nats-server and PostgreSQL (ARCHITECTURE.md,
//! "Shutdown"):
//!
//! - SIGTERM to one of two hosts sharing a consumer while 2,000 credits
//!   flow: it exits 0 within its grace, and nothing is lost, applied twice
//!   or redelivered after it was finished.
//! - A delivery still running at the end of the grace is abandoned: rolled
//!   back, naked at once, and processed exactly once by the other host.
//! - Started the way `deploy/systemd/idem.service` starts it, the host tells
//!   the test's `NOTIFY_SOCKET` READY=1, WATCHDOG=1 and STOPPING=1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::metrics::StatsSnapshot;
use idem_tests::chaos::{HostProcess, Probe, consumer_info, describe_consumer, publish_all};
use idem_tests::*;
use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const SUBJECT: &str = "accounts.credit";
const STREAM: &str = "ACCOUNTS";

fn host_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_idem-test-host"))
}

/// Appends `[service]` with `shutdown_grace` to the config at `cfg`.
fn with_grace(cfg: &Path, grace: &str) {
    let mut text = std::fs::read_to_string(cfg).unwrap();
    text.push_str(&format!("\n[service]\nshutdown_grace = \"{grace}\"\n"));
    std::fs::write(cfg, text).unwrap();
}

/// Waits until `path` (a host's log) contains `needle`.
async fn wait_for_log(path: &Path, needle: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "`{needle}` not in {} within {limit:?}:\n{text}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGTERM `host`, waiting up to `patience`; how it ended and how long
/// it took from the signal.
async fn sigterm(
    host: HostProcess,
    patience: Duration,
) -> (Option<ExitStatus>, StatsSnapshot, Duration) {
    let t0 = Instant::now();
    let ended = tokio::task::spawn_blocking(move || host.terminate(patience))
        .await
        .unwrap();
    let took = t0.elapsed();
    (ended.status, ended.stats.expect("a summary line"), took)
}

/// Waits until `consumer` has nothing pending or unacknowledged.
async fn wait_drained(js: &async_nats::jetstream::Context, consumer: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(info) = consumer_info(js, STREAM, consumer).await {
            if info.num_pending == 0 && info.num_ack_pending == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "consumer not drained within {limit:?}: {}",
                describe_consumer(&info)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_flow_loses_nothing_and_redelivers_no_finished_work() {
    const EVENTS: usize = 2000;
    const HANDLER: &str = "credit-projector";
    const GRACE: Duration = Duration::from_secs(10);
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new(HANDLER, "credit");
    spec.extra.push_str("concurrency = 3\nack_wait = \"10s\"\n");
    let cfg = write_config(dir.path(), &nats, &db, &[spec]);
    with_grace(&cfg, "10s");

    let events: Vec<String> = (0..EVENTS)
        .map(|i| credit(&format!("evt-{i}"), (i % 25) as i64 + 1, (i % 7) as i64 + 1))
        .collect();
    let mut expected: BTreeMap<i64, i64> = BTreeMap::new();
    for i in 0..EVENTS {
        *expected.entry((i % 25) as i64 + 1).or_default() += (i % 7) as i64 + 1;
    }

    let a = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "a");
    let a_log = a.log.clone();
    let b = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "b");
    let b_log = b.log.clone();
    wait_for_log(
        &a_log,
        "every handler is consuming",
        Duration::from_secs(60),
    )
    .await;
    wait_for_log(
        &b_log,
        "every handler is consuming",
        Duration::from_secs(60),
    )
    .await;

    let js = nats.jetstream().await;
    let probe = Probe::new(&db);
    let (first, rest) = events.split_at(800);
    publish_all(
        &js,
        SUBJECT,
        first,
        100,
        Instant::now() + Duration::from_secs(60),
    )
    .await;
    // Mid-flow: some work done, more published while host a stops.
    let deadline = Instant::now() + Duration::from_secs(60);
    while probe.receipts(HANDLER).await.unwrap_or(0) < 200 {
        assert!(Instant::now() < deadline, "nothing processed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let publisher = {
        let js = js.clone();
        let rest = rest.to_vec();
        tokio::spawn(async move {
            publish_all(
                &js,
                SUBJECT,
                &rest,
                50,
                Instant::now() + Duration::from_secs(60),
            )
            .await
        })
    };
    let (a_status, a_stats, a_took) = sigterm(a, GRACE + Duration::from_secs(20)).await;
    assert_eq!(publisher.await.unwrap(), 0, "no publish was sent twice");
    assert!(
        a_status.is_some_and(|s| s.code() == Some(0)),
        "host a exited {a_status:?}"
    );
    assert!(
        a_took <= GRACE + Duration::from_secs(5),
        "host a took {a_took:?} to stop (grace {GRACE:?})"
    );
    let a_text = std::fs::read_to_string(&a_log).unwrap();
    assert!(
        a_text.contains("SIGTERM received: shutting down"),
        "{a_text}"
    );
    assert!(a_text.contains("stopping: fetching stopped"), "{a_text}");
    assert!(
        a_text.contains("stopped: every delivery in flight finished"),
        "{a_text}"
    );

    // Host b takes the rest: what a gave back at once, and anything that
    // was on its way to a when it closed its pull (after ack_wait).
    let deadline = Instant::now() + Duration::from_secs(120);
    while probe.receipts(HANDLER).await.unwrap_or(0) < EVENTS as i64 {
        assert!(
            Instant::now() < deadline,
            "not every event processed: {} receipts",
            probe.receipts(HANDLER).await.unwrap_or(0)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_drained(&js, HANDLER, Duration::from_secs(60)).await;
    let (b_status, b_stats, _) = sigterm(b, GRACE + Duration::from_secs(20)).await;
    assert!(
        b_status.is_some_and(|s| s.code() == Some(0)),
        "host b exited {b_status:?}"
    );
    println!("host a: {a_stats} (stopped in {a_took:?})\nhost b: {b_stats}");

    assert_eq!(probe.receipts(HANDLER).await.unwrap(), EVENTS as i64);
    assert_eq!(probe.dead_letters(HANDLER).await.unwrap(), 0);
    let balances = probe.balances().await.unwrap();
    assert_eq!(balances, expected);
    assert_eq!(
        balances.values().sum::<i64>(),
        expected.values().sum::<i64>()
    );
    // Every effect once, by exactly one host. A duplicate could only come
    // from an ack lost at host a's exit (a failed confirmed ack, or a
    // delivery abandoned between COMMIT and ack at the end of the grace);
    // a had no ack failure and abandoned nothing (its log says every
    // delivery finished), so there is none.
    assert_eq!(a_stats.ack_failures, 0);
    assert_eq!(a_stats.processed + b_stats.processed, EVENTS as u64);
    assert_eq!((a_stats.duplicates, b_stats.duplicates), (0, 0));
    assert_eq!((a_stats.retried, b_stats.retried), (0, 0));
    assert_eq!((a_stats.dead_lettered, b_stats.dead_lettered), (0, 0));
    // What a gave back was never started there: not counted as a delivery.
    assert_eq!(a_stats.delivered, a_stats.processed);
    assert_eq!(b_stats.delivered, b_stats.processed);
    assert!(a_stats.processed > 0 && b_stats.processed > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_still_running_at_the_end_of_the_grace_is_rolled_back_and_runs_once_elsewhere() {
    const HANDLER: &str = "slow";
    const GRACE: Duration = Duration::from_secs(2);
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new(HANDLER, "behave");
    // The guest spins far past the grace; ack_wait far past what the
    // test waits for the other host, so only the nak can bring it there.
    spec.extra
        .push_str("deadline = \"60s\"\nack_wait = \"120s\"\nmax_deliver = 5\n");
    let cfg = write_config(dir.path(), &nats, &db, &[spec]);
    with_grace(&cfg, "2s");
    let js = nats.jetstream().await;
    let probe = Probe::new(&db);

    // Both hosts consume before the message exists (a host starting while
    // another holds the message's transaction open waits for it at start);
    // the one that takes it is stopped. Stats lines at debug say which.
    let env = [("RUST_LOG", "info,async_nats=warn,idem=debug")];
    let one = HostProcess::spawn_with_env(host_bin(), &cfg, &env, dir.path(), "one");
    let two = HostProcess::spawn_with_env(host_bin(), &cfg, &env, dir.path(), "two");
    wait_for_log(
        &one.log,
        "every handler is consuming",
        Duration::from_secs(60),
    )
    .await;
    wait_for_log(
        &two.log,
        "every handler is consuming",
        Duration::from_secs(60),
    )
    .await;
    let payload = serde_json::json!({
        "op": "credit-then-loop-once", "event_id": "slow-1", "account_id": 1, "amount": 7
    })
    .to_string();
    publish(&js, SUBJECT, &payload, &[]).await;
    let taken = |p: &Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .contains("stats delivered=1 ")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !taken(&one.log) && !taken(&two.log) {
        assert!(Instant::now() < deadline, "no host took the message");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (a, b) = if taken(&one.log) {
        (one, two)
    } else {
        (two, one)
    };
    let a_log = a.log.clone();

    let (a_status, a_stats, a_took) = sigterm(a, Duration::from_secs(30)).await;
    assert!(
        a_status.is_some_and(|s| s.code() == Some(0)),
        "host a exited {a_status:?}"
    );
    let a_text = std::fs::read_to_string(&a_log).unwrap();
    assert!(
        a_took >= GRACE && a_took <= GRACE + Duration::from_secs(8),
        "host a took {a_took:?} to stop (grace {GRACE:?}):\n{a_text}"
    );
    assert!(
        a_text.contains("0 fetched messages given back, 1 in flight, grace 2s"),
        "{a_text}"
    );
    assert!(a_text.contains("1 deliveries abandoned"), "{a_text}");
    // Host a ran it once and settled nothing: no commit, retry or dead letter.
    assert_eq!(
        (
            a_stats.delivered,
            a_stats.processed,
            a_stats.retried,
            a_stats.dead_lettered
        ),
        (1, 0, 0, 0)
    );

    // Given back at once: host b runs it (its second delivery) long before
    // ack_wait could have brought it back.
    let deadline = Instant::now() + Duration::from_secs(60);
    while probe.receipts(HANDLER).await.unwrap_or(0) < 1 {
        assert!(
            Instant::now() < deadline,
            "host b did not process the message"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_drained(&js, HANDLER, Duration::from_secs(30)).await;
    let (b_status, b_stats, _) = sigterm(b, Duration::from_secs(30)).await;
    assert!(b_status.is_some_and(|s| s.code() == Some(0)));
    assert_eq!(
        (
            b_stats.delivered,
            b_stats.processed,
            b_stats.duplicates,
            b_stats.retried
        ),
        (1, 1, 0, 0)
    );
    // Host a's credit was rolled back: the balance holds one credit, the
    // receipt is host b's (its insert waited for a's transaction to end).
    assert_eq!(probe.receipts(HANDLER).await.unwrap(), 1);
    assert_eq!(probe.dead_letters(HANDLER).await.unwrap(), 0);
    assert_eq!(probe.balances().await.unwrap(), BTreeMap::from([(1, 7)]));
}

/// `ExecStart=` of `deploy/systemd/idem.service`, split into words.
fn unit_exec_start() -> Vec<String> {
    let unit = std::fs::read_to_string(root().join("deploy/systemd/idem.service")).unwrap();
    let line = unit
        .lines()
        .find_map(|l| l.trim().strip_prefix("ExecStart="))
        .expect("ExecStart= in idem.service");
    line.split_whitespace().map(str::to_string).collect()
}

/// The `KEY=VALUE` lines of `deploy/systemd/idem.env` (comments skipped).
fn unit_env() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("deploy/systemd/idem.env")).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=VALUE");
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// Reads datagrams from `sock` until `done` holds for what arrived, or
/// `limit` passes; every datagram's lines, in order.
fn notifications(
    sock: &UnixDatagram,
    seen: &mut Vec<String>,
    limit: Duration,
    done: impl Fn(&[String]) -> bool,
) {
    let deadline = Instant::now() + limit;
    let mut buf = vec![0u8; 4096];
    while !done(seen) {
        assert!(Instant::now() < deadline, "notifications so far: {seen:?}");
        if let Ok(n) = sock.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            seen.extend(text.lines().map(str::to_string));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_the_unit_starts_it_the_host_notifies_ready_watchdog_and_stopping() {
    const HANDLER: &str = "credit-projector";
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new(HANDLER, "credit")],
    );
    let js = nats.jetstream().await;

    let exec = unit_exec_start();
    assert_eq!(
        exec,
        [
            "/usr/local/bin/idem",
            "run",
            "--config",
            "/etc/idem/idem.toml"
        ]
    );
    let args: Vec<PathBuf> = exec[1..]
        .iter()
        .map(|a| {
            if a == "/etc/idem/idem.toml" {
                cfg.clone()
            } else {
                PathBuf::from(a)
            }
        })
        .collect();
    let socket_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&socket_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let log = dir.path().join("host.log");
    let mut child = Command::new(host_bin())
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(unit_env())
        .env("IDEM_BROKER__URL", nats.url())
        .env("IDEM_DATABASE__URL", &db.url)
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "200000")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.path().join("host.out")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();

    let mut seen = Vec::new();
    let has = |seen: &[String], what: &str| seen.iter().filter(|l| *l == what).count();
    notifications(&sock, &mut seen, Duration::from_secs(60), |s| {
        has(s, "READY=1") == 1
    });
    // Ready means consuming: a message published now is processed.
    publish(&js, SUBJECT, &credit("e1", 1, 5), &[]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.receipts(HANDLER).await < 1 {
        assert!(Instant::now() < deadline, "not processed after READY=1");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = has(&seen, "WATCHDOG=1");
    notifications(&sock, &mut seen, Duration::from_secs(10), |s| {
        has(s, "WATCHDOG=1") >= before + 2
    });
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    notifications(&sock, &mut seen, Duration::from_secs(30), |s| {
        has(s, "STOPPING=1") == 1
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the host did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(exit.code(), Some(0), "{text}");
    let ready = seen.iter().position(|l| l == "READY=1").unwrap();
    let stopping = seen.iter().position(|l| l == "STOPPING=1").unwrap();
    assert!(ready < stopping, "{seen:?}");
    assert_eq!(has(&seen, "READY=1"), 1, "{seen:?}");
    assert!(has(&seen, "WATCHDOG=1") >= 2, "{seen:?}");
    assert_eq!(db.balance(1).await, Some(5));
}
