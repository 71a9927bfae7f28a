//! The retention window is measured on one clock, the broker's
//! (ARCHITECTURE.md invariant 7): a host whose wall clock is far from the
//! broker's (libfaketime, see `idem_tests::clock`) judges the horizon and
//! prunes receipts exactly like one whose clock is right. On SQLite the
//! database's clock is the host's (it runs in the host process), so it is
//! skewed with it; the PostgreSQL server keeps the machine's clock. And
//! `idem deploy --wait` judges a host by the deployment revision it
//! reports, never by comparing its clock to the deploying machine's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::chaos::HostProcess;
use idem_tests::deploy_keys::{DeployKeys, deploy_cli, trust_in};
use idem_tests::examples::{credit_log_migrations, sha256_hex};
use idem_tests::*;
use std::path::Path;
use std::time::{Duration, Instant};

const SUBJECT: &str = "accounts.credit";
const HANDLER: &str = "credit-projector";

/// A config for one credit handler with a 10 s retention window on a stream
/// that keeps messages for ever (so old ones can be delivered again).
async fn setup(nats: &Nats, db: &TestDb, dir: &Path) -> std::path::PathBuf {
    create_stream(nats, "ACCOUNTS", &[SUBJECT]).await;
    let mut h = HandlerSpec::new(HANDLER, "credit");
    h.extra = "retention = \"10s\"\naccept_horizon_risk = true\nack_wait = \"2s\"\n".into();
    write_config(dir, nats, db, &[h])
}

/// Starts the test host binary with its wall clock `offset` from the
/// machine's, and waits until its handler is ready (30 s at most).
async fn skewed_host(cfg: &Path, dir: &Path, name: &str, offset: &str) -> HostProcess {
    let env = idem_tests::clock::skewed(offset);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut host = HostProcess::spawn_with_env(
        Path::new(env!("CARGO_BIN_EXE_idem-test-host")),
        cfg,
        &env,
        dir,
        name,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(&host.log).unwrap_or_default();
        if log.contains("handler ready") {
            return host;
        }
        assert!(
            host.exited().is_none() && Instant::now() < deadline,
            "host not ready; log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `what` until it returns `want` (30 s at most).
async fn until<F, Fut>(host: &mut HostProcess, label: &str, want: i64, what: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = i64>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = what().await;
        if got == want {
            return;
        }
        assert!(
            host.exited().is_none(),
            "host exited waiting for {label}: {}",
            std::fs::read_to_string(&host.log).unwrap_or_default()
        );
        assert!(
            Instant::now() < deadline,
            "{label}: {got}, want {want}; log:\n{}",
            std::fs::read_to_string(&host.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Host 30 s behind the broker, retention 10 s. Credits A and B at T0; a
/// copy of A at T0+5 s is a duplicate; once their receipts are pruned (the
/// broker's clock past T0+10 s plus the margin) a copy of A published at
/// T0+12 s is a new message by the contract (published after the original's
/// window) and applies. Then every stored message is delivered again (the
/// durable consumer deleted and created anew): B, whose receipt was pruned
/// and which was published longer than 10 s ago on the broker's clock, is
/// quarantined (a host judging by its own clock saw it as 16 s in the
/// future and applied it again); the rest are duplicates.
async fn a_host_behind_the_broker_never_applies_a_message_twice(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(&nats, &db, dir.path()).await;
    let js = nats.jetstream().await;
    let mut host = skewed_host(&cfg, dir.path(), "behind-1", "-30s").await;

    let t0 = Instant::now();
    publish(&js, SUBJECT, &credit("evt_a", 1, 5), &[]).await;
    publish(&js, SUBJECT, &credit("evt_b", 2, 7), &[]).await;
    until(&mut host, "A and B applied", 12, || async {
        db.balance(1).await.unwrap_or(0) + db.balance(2).await.unwrap_or(0)
    })
    .await;
    tokio::time::sleep_until((t0 + Duration::from_secs(5)).into()).await;
    publish(&js, SUBJECT, &credit("evt_a", 1, 5), &[]).await;
    // Pruned once the broker's clock is past T0 + 10 s + 1 s of margin,
    // never before T0 + 10 s.
    until(&mut host, "A and B pruned", 0, || async {
        db.receipts(HANDLER).await
    })
    .await;
    let pruned_after = t0.elapsed();
    assert!(pruned_after >= Duration::from_secs(10), "{pruned_after:?}");
    assert_eq!(db.balance(1).await, Some(5), "the copy at T0+5s applied");
    tokio::time::sleep_until((t0 + Duration::from_secs(12)).into()).await;
    publish(&js, SUBJECT, &credit("evt_a", 1, 5), &[]).await;
    until(&mut host, "the copy at T0+12s applied", 10, || async {
        db.balance(1).await.unwrap_or(0)
    })
    .await;
    assert_eq!(db.receipt_ids(HANDLER).await, ["evt_a"]);
    let ended = host.terminate(Duration::from_secs(20));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));

    // Every stored message again, on a new durable consumer of the same name.
    js.get_stream("ACCOUNTS")
        .await
        .unwrap()
        .delete_consumer(HANDLER)
        .await
        .unwrap();
    let mut host = skewed_host(&cfg, dir.path(), "behind-2", "-30s").await;
    until(&mut host, "B dead-lettered", 1, || async {
        i64::try_from(db.dead_letters(HANDLER).await.len()).unwrap()
    })
    .await;
    until(&mut host, "all four settled", 0, || async {
        let mut c: async_nats::jetstream::consumer::PullConsumer = js
            .get_stream("ACCOUNTS")
            .await
            .unwrap()
            .get_consumer(HANDLER)
            .await
            .unwrap();
        let i = c.info().await.unwrap();
        i64::try_from(i.num_pending).unwrap() + i64::try_from(i.num_ack_pending).unwrap()
    })
    .await;
    let ended = host.terminate(Duration::from_secs(20));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
    let stats = ended.stats.expect("a shutdown summary");
    assert_eq!(
        (
            stats.delivered,
            stats.processed,
            stats.duplicates,
            stats.dead_lettered
        ),
        (4, 0, 3, 1)
    );
    assert_eq!(db.balance(1).await, Some(10));
    assert_eq!(db.balance(2).await, Some(7));
    let dead = db.dead_letters(HANDLER).await;
    assert_eq!(dead[0].0.as_deref(), Some("evt_b"));
    assert!(
        dead[0].1.starts_with("beyond-horizon: published ")
            && dead[0].1.ends_with(
                " ago, older than the retention window of 10s; its receipt may be pruned, so it cannot be proven new"
            ),
        "{}",
        dead[0].1
    );
    assert_eq!(db.receipt_ids(HANDLER).await, ["evt_a"]);
}
on_both_databases!(
    a_host_behind_the_broker_never_applies_a_message_twice,
    a_host_behind_the_broker_never_applies_a_message_twice
);

/// Host 60 s ahead of the broker, retention 10 s: a message published a
/// moment ago is run (a host judging by its own clock dead-lettered it as
/// "published 1m ago"), a copy is a duplicate, and its receipt is kept for
/// the window (not pruned as if a minute old).
async fn a_host_ahead_of_the_broker_runs_a_fresh_message(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(&nats, &db, dir.path()).await;
    let js = nats.jetstream().await;
    let mut host = skewed_host(&cfg, dir.path(), "ahead", "+60s").await;

    let t0 = Instant::now();
    publish(&js, SUBJECT, &credit("evt_f", 3, 4), &[]).await;
    until(&mut host, "F applied", 4, || async {
        db.balance(3).await.unwrap_or(0)
    })
    .await;
    publish(&js, SUBJECT, &credit("evt_f", 3, 4), &[]).await;
    // Three pruning passes (one a second) later, well inside the window.
    tokio::time::sleep_until((t0 + Duration::from_secs(4)).into()).await;
    let ended = host.terminate(Duration::from_secs(20));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
    let stats = ended.stats.expect("a shutdown summary");
    assert_eq!(
        (
            stats.delivered,
            stats.processed,
            stats.duplicates,
            stats.dead_lettered,
            stats.receipts_pruned
        ),
        (2, 1, 1, 0, 0)
    );
    assert_eq!(db.balance(3).await, Some(4));
    assert_eq!(db.dead_letters(HANDLER).await, []);
    assert_eq!(db.receipt_ids(HANDLER).await, ["evt_f"]);
}
on_both_databases!(
    a_host_ahead_of_the_broker_runs_a_fresh_message,
    a_host_ahead_of_the_broker_runs_a_fresh_message
);

/// A host 20 s behind the deploying machine (libfaketime) swaps as soon as
/// the record is written; `idem deploy --wait` sees that from the revision
/// it reports, well inside its timeout, where comparing the report's time
/// to the deploy's would call every report stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_wait_sees_a_host_whose_clock_runs_behind() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nmax_connections = 4\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\", \"credit_log\"]\nmigrations = \"{}\"\n",
            nats.url(),
            db.url,
            guest("credit").display(),
            credit_log_migrations(dir.path()).display()
        ),
    )
    .unwrap();
    trust_in(&cfg, &DeployKeys::of(dir.path()));
    let mut host = skewed_host(&cfg, dir.path(), "behind", "-20s").await;
    let js = nats.jetstream().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    publish(&js, "accounts.credit", &credit("e1", 1, 3), &[]).await;
    while db.balance(1).await != Some(3) {
        assert!(
            host.exited().is_none() && Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&host.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v2 = guest("credit-log");
    let d2 = sha256_hex(&std::fs::read(&v2).unwrap());
    for (revision, module) in [(1, v2.clone()), (2, guest("credit"))] {
        let (code, out, err) = deploy_cli(
            &cfg,
            &["h", module.to_str().unwrap(), "--wait", "--timeout", "15s"],
        );
        let digest = sha256_hex(&std::fs::read(&module).unwrap());
        assert_eq!(code, 0, "{out}{err}");
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with(&format!("deployed {digest} to `h` (revision {revision}")),
            "{out}"
        );
        assert!(
            lines[1].starts_with(&format!("every live host runs {digest}: ")),
            "{out}"
        );
        if revision == 1 {
            publish(&js, "accounts.credit", &credit("e2", 1, 4), &[]).await;
            let deadline = Instant::now() + Duration::from_secs(30);
            while db.balance(1).await != Some(7) {
                assert!(Instant::now() < deadline, "e2 not applied");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let ended = host.terminate(Duration::from_secs(20));
    assert!(
        ended.status.is_some_and(|s| s.success()),
        "{:?}",
        ended.status
    );
    assert_eq!(
        db.receipt_digests("h").await,
        [
            (
                "e1".to_owned(),
                sha256_hex(&std::fs::read(guest("credit")).unwrap())
            ),
            ("e2".to_owned(), d2)
        ]
    );
}
