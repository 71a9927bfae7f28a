//! `idem deploy` through the broker's buckets, against real nats-server,
//! SQLite and PostgreSQL: a deploy reaches a running host, `--rollback`
//! returns to the previous version, `--history` lists them, a component
//! that would not load is refused before anything changes, a record
//! written by hand that names a missing, damaged or invalid component is
//! refused by the host (which keeps its version and says so in `idem
//! status`), a stale compare-and-set is refused, a restarted host starts on
//! the deployed version; and under load, two hosts sharing one consumer
//! take two deploys and a rollback with every effect applied once by the
//! version its receipt names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::deploy::Deployment;
use idem::deploy::store::RecordError;
use idem_tests::chaos::{HostProcess, publish_all};
use idem_tests::deploy_keys::{DeployKeys, deploy_store, trust_in};
use idem_tests::examples::{credit_log_migrations, eventually, sha256_hex};
use idem_tests::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `idem.toml` for handler `h` (module: the credit component, v1),
/// granted `accounts` and `credit_log`, trusting the test's keys
/// ([`DeployKeys::of`] `dir`).
fn config(dir: &Path, nats_url: &str, db_url: &str, extra: &str) -> PathBuf {
    let cfg = dir.join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{nats_url}\"\n[database]\nurl = \"{db_url}\"\nmax_connections = 6\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\", \"credit_log\"]\nmigrations = \"{}\"\nretry_delay = \"100ms\"\n{extra}\n",
            guest("credit").display(),
            credit_log_migrations(dir).display()
        ),
    )
    .unwrap();
    trust_in(&cfg, &DeployKeys::of(dir));
    cfg
}

/// `idem deploy --config cfg ARGS`, signing with the test's deploy key.
fn deploy(cfg: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["deploy", "--config", cfg.to_str().unwrap()];
    all.extend_from_slice(args);
    idem_cli(&all, &DeployKeys::of(cfg.parent().unwrap()).env())
}

/// The credit component with a core start function that traps: it loads
/// and links, and fails as soon as it is instantiated. Made from the
/// credit guest's core module with wasm-tools (print, add the start
/// function, parse, `component new`).
fn traps_when_instantiated(dir: &Path) -> PathBuf {
    let tools = std::env::var_os("WASM_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".tools/venv/bin/wasm-tools"));
    let core = target_dir().join("wasm32-unknown-unknown/guest/credit.wasm");
    let run = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(&tools)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let wat = String::from_utf8(run(&["print".as_ref(), core.as_os_str()])).unwrap();
    let wat = wat.trim_end().strip_suffix(')').unwrap().to_owned()
        + "  (func $idem_trap_at_start unreachable)\n  (start $idem_trap_at_start)\n)\n";
    let (wat_path, core_path, out) = (
        dir.join("trap.wat"),
        dir.join("trap-core.wasm"),
        dir.join("trap.wasm"),
    );
    std::fs::write(&wat_path, wat).unwrap();
    run(&[
        "parse".as_ref(),
        wat_path.as_os_str(),
        "-o".as_ref(),
        core_path.as_os_str(),
    ]);
    run(&[
        "component".as_ref(),
        "new".as_ref(),
        core_path.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    out
}

/// (event id, receipt digest, credit_log version if any), by event id.
async fn applied(db: &TestDb) -> Vec<(String, String, Option<String>)> {
    use sqlx::Row;
    let pool = db.pool().await;
    let rows = sqlx::query(
        "SELECT r.message_id, r.module_digest, l.version FROM idem_receipts r \
         LEFT JOIN credit_log l ON l.event_id = r.message_id WHERE r.consumer = 'h' ORDER BY r.message_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get::<Option<String>, _>(2)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_rollback_history_and_refusals() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &nats.url(), &db.url, "");
    let v1 = std::fs::read(guest("credit")).unwrap();
    let v2_path = guest("credit-log");
    let (d1, d2) = (
        sha256_hex(&v1),
        sha256_hex(&std::fs::read(&v2_path).unwrap()),
    );
    let host = RunningHost::start(&cfg).await;
    let slot = host.slot("h").clone();
    assert_eq!(slot.current().digest(), d1);
    let js = nats.jetstream().await;
    publish(&js, "accounts.credit", &credit("e1", 1, 1), &[]).await;
    host.wait_for("h", "e1", |s| s.processed == 1).await;

    let (code, out, err) = deploy(
        &cfg,
        &[
            "h",
            v2_path.to_str().unwrap(),
            "--note",
            "log credits",
            "--wait",
            "--timeout",
            "20s",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap(),
        format!("deployed {d2} to `h` (revision 1, previous {d1})")
    );
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with(&format!("every live host runs {d2}: ")),
        "{out}"
    );
    assert_eq!(slot.current().digest(), d2);
    publish(&js, "accounts.credit", &credit("e2", 1, 2), &[]).await;
    host.wait_for("h", "e2", |s| s.processed == 2).await;

    // The same version again is recorded again (hosts that refused it retry).
    let (code, out, _) = deploy(&cfg, &["h", v2_path.to_str().unwrap()]);
    assert_eq!(
        (code, out.as_str()),
        (
            0,
            format!("`h` already had {d2} deployed; recorded again (revision 2) so hosts that refused it try again\n").as_str()
        )
    );

    let (code, out, err) = deploy(&cfg, &["h", "--rollback", "--wait", "--timeout", "20s"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines().next().unwrap(),
        format!("deployed {d1} to `h` (revision 3, previous {d2})")
    );
    assert_eq!(slot.current().digest(), d1);
    publish(&js, "accounts.credit", &credit("e3", 1, 4), &[]).await;
    host.wait_for("h", "e3", |s| s.processed == 3).await;

    // Refused before anything changes: another world, WASI imports on a
    // handler without `wasi = true`, not WebAssembly at all, an unknown handler.
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"not wasm").unwrap();
    let trap = traps_when_instantiated(dir.path());
    for (module, says) in [
        (trap, "traps when instantiated: "),
        (guest("wrong-world"), "refused, nothing deployed: "),
        (
            guest("credit-wasip2"),
            "which idem links only for handlers with `wasi = true`",
        ),
        (junk.clone(), "not a WebAssembly file"),
    ] {
        let (code, out, err) = deploy(&cfg, &["h", module.to_str().unwrap()]);
        assert_eq!((code, out.as_str()), (1, ""), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("idem: refused, nothing deployed: ") && err.contains(says),
            "{err}"
        );
    }
    let (code, _, err) = deploy(&cfg, &["nope", v2_path.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.starts_with("idem: handler `nope` is not in "), "{err}");

    let (code, out, _) = deploy(&cfg, &["h", "--history"]);
    assert_eq!(code, 0);
    let history: Vec<&str> = out.lines().collect();
    assert_eq!(history.len(), 3, "{out}");
    assert!(history[0].starts_with("revision 1  "), "{out}");
    assert!(
        history[0].contains(&format!("  {d2}  previous {d1}  by ")),
        "{out}"
    );
    assert!(history[0].ends_with("  note log credits"), "{out}");
    assert!(
        history[1].contains(&format!("  {d2}  previous {d1}  by ")),
        "{out}"
    );
    assert!(history[1].ends_with("  note deployed again"), "{out}");
    assert!(
        history[2].contains(&format!("  {d1}  previous {d2}  by ")),
        "{out}"
    );
    assert!(history[2].ends_with("  note rollback"), "{out}");

    // Records the deploy command would never write, put by hand by a
    // holder of the deploy key (signed): the host refuses each and keeps v1.
    let keys = DeployKeys::of(dir.path());
    let store = deploy_store(&nats.url()).await.unwrap();
    let garbage = b"neither wasm nor anything".to_vec();
    let dg = sha256_hex(&garbage);
    store.put_module(&dg, &garbage).await.unwrap();
    let missing = sha256_hex(b"never stored");
    for (record, refused_digest, says) in [
        (
            Some(Deployment {
                digest: missing.clone(),
                previous: None,
                deployed_at: "2026-12-01T00:00:00Z".into(),
                note: String::new(),
                size: 1,
                by: "hand".into(),
                ..Default::default()
            }),
            missing.clone(),
            "is not in object store bucket idem-modules",
        ),
        (
            Some(Deployment {
                digest: dg.clone(),
                previous: None,
                deployed_at: "2026-12-01T00:00:00Z".into(),
                note: String::new(),
                size: garbage.len() as u64,
                by: "hand".into(),
                ..Default::default()
            }),
            dg.clone(),
            "not a WebAssembly file",
        ),
        (None, String::new(), "not a deployment record"),
        (
            Some(Deployment {
                digest: dg.clone(),
                previous: None,
                deployed_at: "2026-12-01T00:00:00Z".into(),
                note: String::new(),
                size: 1,
                by: "hand".into(),
                ..Default::default()
            }),
            dg.clone(),
            "not the 1 its deployment record gives",
        ),
    ] {
        let revision = match record {
            Some(d) => keys.put_signed(&store, "h", d).await,
            None => store
                .deployments()
                .put("h", b"{not json".to_vec().into())
                .await
                .unwrap(),
        };
        let expect = if refused_digest.is_empty() {
            format!("revision {revision}")
        } else {
            refused_digest
        };
        eventually("the hand-written record refused", || {
            slot.refused().is_some_and(|r| r.digest == expect)
        })
        .await;
        assert!(
            slot.refused().unwrap().reason.contains(says),
            "{:?}",
            slot.refused()
        );
        assert_eq!(slot.current().digest(), d1);
    }
    // Reports are refreshed every few seconds: wait for one after the refusal.
    let deadline = Instant::now() + Duration::from_secs(15);
    let out = loop {
        let (code, out, err) = idem_cli(&["status", "--config", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 0, "{err}");
        if out.contains(&format!(" refused {dg}: ")) || Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.contains(&format!(
            " h {d1} (deployed: {dg}) in_flight=0 processed=3 duplicates=0 dead_lettered=0 since "
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            " refused {dg}: component {dg} in bucket idem-modules is "
        )),
        "{out}"
    );

    // A version refused because its object was missing is tried again
    // once it is deployed again.
    let v2_bytes = std::fs::read(&v2_path).unwrap();
    js.get_object_store("idem-modules")
        .await
        .unwrap()
        .delete(&d2)
        .await
        .unwrap();
    let record = Deployment {
        digest: d2.clone(),
        previous: Some(d1.clone()),
        deployed_at: "2026-12-01T00:00:00Z".into(),
        note: String::new(),
        size: v2_bytes.len() as u64,
        by: "hand".into(),
        ..Default::default()
    };
    keys.put_signed(&store, "h", record).await;
    eventually("v2 refused while its object is missing", || {
        slot.refused().is_some_and(|r| r.digest == d2)
    })
    .await;
    assert_eq!(slot.current().digest(), d1);
    let (code, out, err) = deploy(&cfg, &["h", v2_path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("recorded again"), "{out}");
    eventually("v2 in place after the redeploy", || {
        slot.current().digest() == d2
    })
    .await;
    assert_eq!(slot.refused(), None);
    let (code, _, err) = deploy(&cfg, &["h", "--rollback", "--wait", "--timeout", "20s"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(slot.current().digest(), d1);

    // A compare-and-set from a stale revision is refused.
    let current = store.current("h").await.unwrap().unwrap();
    let stale = store
        .record(
            "h",
            &Deployment {
                digest: d2.clone(),
                previous: None,
                deployed_at: "2026-12-01T00:00:00Z".into(),
                note: String::new(),
                size: 1,
                by: "racer".into(),
                replaces: current.revision - 1,
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(stale, Err(RecordError::Stale { .. })), "{stale:?}");
    host.stop().await;

    // Deployed again, then a fresh host starts on the deployed version.
    let (code, _, err) = deploy(&cfg, &["h", v2_path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let host = RunningHost::start(&cfg).await;
    assert_eq!(host.slot("h").current().digest(), d2);
    publish(&js, "accounts.credit", &credit("e4", 1, 8), &[]).await;
    host.wait_for("h", "e4", |s| s.processed == 1).await;
    host.stop().await;

    // A host that starts while the record names a version it refuses runs
    // the most recent earlier deployment that loads (v2, as the hosts that
    // refused the record keep doing), not the config's module, and reports
    // the refusal.
    let v2_size = v2_bytes.len() as u64;
    let record = Deployment {
        digest: missing.clone(),
        previous: Some(d2.clone()),
        deployed_at: "2026-12-01T00:00:00Z".into(),
        note: String::new(),
        size: v2_size,
        by: "hand".into(),
        ..Default::default()
    };
    keys.put_signed(&store, "h", record).await;
    let host = RunningHost::start(&cfg).await;
    let slot = host.slot("h").clone();
    assert_eq!(slot.current().digest(), d2);
    assert_eq!(slot.refused().map(|r| r.digest), Some(missing.clone()));
    publish(&js, "accounts.credit", &credit("e5", 1, 16), &[]).await;
    let bad = r#"{"event_id":"e6","account_id":"one","amount":32}"#;
    publish(&js, "accounts.credit", bad, &[]).await;
    host.wait_for("h", "e5 processed, e6 dead-lettered", |s| {
        s.processed == 1 && s.dead_lettered == 1
    })
    .await;
    host.stop().await;

    // `idem dlq redrive` runs the version the hosts run (here v2, the last
    // deployment that loads), not the config's module: the dead letter,
    // its payload mended by hand, is applied by v2.
    {
        use sqlx::Row;
        let pool = db.pool().await;
        sqlx::query("UPDATE idem_dead_letters SET payload = $1 WHERE message_id = 'e6'")
            .bind(credit("e6", 1, 32).into_bytes())
            .execute(&pool)
            .await
            .unwrap();
        let id: i64 = sqlx::query("SELECT id FROM idem_dead_letters WHERE message_id = 'e6'")
            .fetch_one(&pool)
            .await
            .unwrap()
            .get(0);
        pool.close().await;
        let (code, out, err) = idem_cli(
            &[
                "dlq",
                "redrive",
                &id.to_string(),
                "--config",
                cfg.to_str().unwrap(),
            ],
            &[],
        );
        assert_eq!(code, 0, "{err}");
        assert!(out.contains(" processed"), "{out}");
    }

    assert_eq!(db.balance(1).await, Some(63));
    // What one version did: the effects v2 produced.
    let (code, out, err) = idem_cli(
        &[
            "receipts",
            "show",
            "--config",
            cfg.to_str().unwrap(),
            "--handler",
            "h",
            "--digest",
            &d2,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("digest: {d2}\nhandler: h\nreceipts: 4\n")),
        "{out}"
    );
    assert_eq!(
        applied(&db).await,
        vec![
            ("e1".into(), d1.clone(), None),
            ("e2".into(), d2.clone(), Some("v2".into())),
            ("e3".into(), d1.clone(), None),
            ("e4".into(), d2.clone(), Some("v2".into())),
            ("e5".into(), d2.clone(), Some("v2".into())),
            ("e6".into(), d2.clone(), Some("v2".into())),
        ]
    );
}

/// Two host processes share one durable consumer on PostgreSQL while 5,000
/// credits flow; v2 (logs its credits) is deployed, then v3 (v1's code,
/// another digest), then a rollback to v2. Every balance is exact, every
/// receipt names one of the versions, a credit has a `credit_log` row
/// exactly when its receipt names v2, and nothing applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_take_two_deploys_and_a_rollback_under_load() {
    const N: usize = 5000;
    const ACCOUNTS: i64 = 50;
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &nats.url(), &db.url, "concurrency = 2");
    let v1 = std::fs::read(guest("credit")).unwrap();
    let v2 = std::fs::read(guest("credit-log")).unwrap();
    let v3 = with_custom_section(&v1, "v3");
    let v3_path = dir.path().join("credit-v3.wasm");
    std::fs::write(&v3_path, &v3).unwrap();
    let (d1, d2, d3) = (sha256_hex(&v1), sha256_hex(&v2), sha256_hex(&v3));
    assert_ne!(d1, d3);

    let a = HostProcess::spawn(&test_host(), &cfg, "", dir.path(), "a");
    let b = HostProcess::spawn(&test_host(), &cfg, "", dir.path(), "b");
    let js = nats.jetstream().await;
    // Wait until both report to the hosts bucket.
    let store = loop {
        if let Ok(s) = deploy_store(&nats.url()).await {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, out, _) = idem_cli(&["status", "--config", cfg.to_str().unwrap()], &[]);
        if out.lines().filter(|l| l.contains(" h ")).count() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "hosts did not report: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(store);

    let mut expected = std::collections::BTreeMap::new();
    let events: Vec<String> = (0..N)
        .map(|i| {
            let (account, amount) = (i as i64 % ACCOUNTS, 1 + i as i64 % 7);
            *expected.entry(account).or_insert(0i64) += amount;
            credit(&format!("e{i:05}"), account, amount)
        })
        .collect();
    let publisher = {
        let js = js.clone();
        tokio::spawn(async move {
            for chunk in events.chunks(500) {
                publish_all(
                    &js,
                    "accounts.credit",
                    chunk,
                    100,
                    Instant::now() + Duration::from_secs(120),
                )
                .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let probe = chaos::Probe::new(&db);
    let wait_receipts = |n: i64| {
        let probe = &probe;
        async move {
            let deadline = Instant::now() + Duration::from_secs(180);
            while probe.receipts("h").await.unwrap_or(0) < n {
                assert!(
                    Instant::now() < deadline,
                    "fewer than {n} receipts after 180 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    wait_receipts(800).await;
    let (code, _, err) = deploy(
        &cfg,
        &[
            "h",
            guest("credit-log").to_str().unwrap(),
            "--wait",
            "--timeout",
            "30s",
        ],
    );
    assert_eq!(code, 0, "{err}");
    wait_receipts(2000).await;
    let (code, _, err) = deploy(
        &cfg,
        &["h", v3_path.to_str().unwrap(), "--wait", "--timeout", "30s"],
    );
    assert_eq!(code, 0, "{err}");
    wait_receipts(3200).await;
    let (code, _, err) = deploy(&cfg, &["h", "--rollback", "--wait", "--timeout", "30s"]);
    assert_eq!(code, 0, "{err}");
    publisher.await.unwrap();
    wait_receipts(N as i64).await;
    let (ea, eb) = (
        a.terminate(Duration::from_secs(30)),
        b.terminate(Duration::from_secs(30)),
    );
    assert!(ea.status.is_some_and(|s| s.success()) && eb.status.is_some_and(|s| s.success()));

    assert_eq!(probe.balances().await.unwrap(), expected);
    let rows = applied(&db).await;
    assert_eq!(rows.len(), N);
    let mut by_version = std::collections::BTreeMap::new();
    for (id, d, logged) in &rows {
        assert!([&d1, &d2, &d3].contains(&d), "{id}: digest {d}");
        assert_eq!(
            logged.is_some(),
            *d == d2,
            "{id}: digest {d}, log {logged:?}"
        );
        *by_version.entry(d.clone()).or_insert(0) += 1;
    }
    // Each version applied some of the messages.
    assert_eq!(by_version.len(), 3, "{by_version:?}");
    let logged: i64 = probe
        .scalar("SELECT count(*) FROM credit_log")
        .await
        .unwrap();
    assert_eq!(logged, by_version[&d2]);
}
