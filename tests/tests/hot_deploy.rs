//! Hot deploy on one machine, against real nats-server and SQLite:
//! `watch = true` puts a replaced module file in place under a running host
//! (each receipt names the version that applied its message; a second
//! version's own writes show which messages it ran), a truncated file is
//! refused while the running version keeps running, and a restart loads a
//! component from the compiled-component cache instead of compiling it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::deploy_keys::{DeployKeys, trust_in};
use idem_tests::examples::{credit_log_migrations, eventually, sha256_hex};
use idem_tests::*;
use std::path::{Path, PathBuf};

/// `idem.toml` in `dir` for handler `h` running `module`, granted
/// `accounts` and `credit_log`, with `extra` lines in the handler table and
/// `runtime` as the `[runtime]` table's body, trusting the test's keys.
fn config(
    dir: &Path,
    nats: &Nats,
    db: &TestDb,
    module: &Path,
    extra: &str,
    runtime: &str,
) -> PathBuf {
    let cfg = dir.join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nmax_connections = 4\n[runtime]\n{runtime}\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\", \"credit_log\"]\nmigrations = \"{}\"\n{extra}\n",
            nats.url(),
            db.url,
            module.display(),
            credit_log_migrations(dir).display()
        ),
    )
    .unwrap();
    trust_in(&cfg, &DeployKeys::of(dir));
    cfg
}

/// v1 (credit) runs; the file is replaced by v2 (credit-log) and the next
/// messages run on v2; a truncated file is refused and v2 keeps running;
/// the complete v1 file puts v1 back. Balances, receipts' digests and v2's
/// log rows are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_swaps_a_replaced_module_and_refuses_a_truncated_one() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let v1 = std::fs::read(guest("credit")).unwrap();
    let v2 = std::fs::read(guest("credit-log")).unwrap();
    let (d1, d2) = (sha256_hex(&v1), sha256_hex(&v2));
    let module = dir.path().join("handler.wasm");
    std::fs::write(&module, &v1).unwrap();
    let cfg = config(
        dir.path(),
        &nats,
        &db,
        &module,
        "watch = true",
        "cache = false",
    );
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    let slot = host.slot("h").clone();
    assert_eq!(slot.current().digest(), d1);

    for (id, amount) in [("e1", 1), ("e2", 2)] {
        publish(&js, "accounts.credit", &credit(id, 1, amount), &[]).await;
    }
    host.wait_for("h", "v1 credits", |s| s.processed == 2).await;

    replace_file(&module, &v2);
    eventually("v2 in place", || slot.current().digest() == d2).await;
    for (id, amount) in [("e3", 4), ("e4", 8)] {
        publish(&js, "accounts.credit", &credit(id, 1, amount), &[]).await;
    }
    host.wait_for("h", "v2 credits", |s| s.processed == 4).await;

    // A deploy that stops half-way: the file holds the first KiB of v1.
    let truncated = &v1[..1024];
    std::fs::write(&module, truncated).unwrap();
    eventually("the truncated file refused", || {
        slot.refused()
            .is_some_and(|r| r.digest == sha256_hex(truncated))
    })
    .await;
    assert_eq!(slot.current().digest(), d2);
    let refused = slot.refused().unwrap();
    assert!(
        refused.reason.contains("not a valid WebAssembly component"),
        "{}",
        refused.reason
    );
    publish(&js, "accounts.credit", &credit("e5", 1, 16), &[]).await;
    host.wait_for("h", "e5 on v2", |s| s.processed == 5).await;

    replace_file(&module, &v1);
    eventually("v1 back", || slot.current().digest() == d1).await;
    assert_eq!(slot.refused(), None);
    publish(&js, "accounts.credit", &credit("e6", 1, 32), &[]).await;
    host.wait_for("h", "e6 on v1", |s| s.processed == 6).await;
    let summary = host.stop().await;
    assert_eq!(summary[0].1.dead_lettered, 0);

    assert_eq!(db.balance(1).await, Some(63));
    let by = |d: &str| d.to_owned();
    assert_eq!(
        db.receipt_digests("h").await,
        vec![
            ("e1".into(), by(&d1)),
            ("e2".into(), by(&d1)),
            ("e3".into(), by(&d2)),
            ("e4".into(), by(&d2)),
            ("e5".into(), by(&d2)),
            ("e6".into(), by(&d1)),
        ]
    );
    assert_eq!(
        db.credit_log().await,
        vec![
            ("e3".into(), "v2".into()),
            ("e4".into(), "v2".into()),
            ("e5".into(), "v2".into()),
        ]
    );
}

/// What `idem run --drain` logged about loading its component: the
/// `cache` field of its "component loaded" line (`miss`, `hit` or `off`).
fn cache_outcome(cfg: &Path) -> String {
    let out = std::process::Command::new(test_host())
        .args(["--log-format", "json", "run", "--drain", "--config"])
        .arg(cfg)
        .env("RUST_LOG", "idem=info")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = String::from_utf8_lossy(&out.stderr);
    let loaded: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "component loaded")
        .collect();
    assert_eq!(loaded.len(), 1, "{log}");
    loaded[0]["cache"].as_str().unwrap().to_owned()
}

/// The first start compiles the component and keeps it in `cache_dir`
/// (created with mode 0700); the second start takes it from there; with
/// `cache = false` nothing is kept or read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loads_the_component_from_the_cache() {
    use std::os::unix::fs::PermissionsExt;
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let runtime = format!("cache_dir = \"{}\"", cache.display());
    let cfg = config(dir.path(), &nats, &db, &guest("credit"), "", &runtime);
    assert_eq!(cache_outcome(&cfg), "miss");
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    assert_eq!(cache_outcome(&cfg), "hit");

    let cfg = config(
        dir.path(),
        &nats,
        &db,
        &guest("credit"),
        "",
        "cache = false",
    );
    assert_eq!(cache_outcome(&cfg), "off");

    // A cache others can write to is refused: what is there runs as code.
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let cfg = config(dir.path(), &nats, &db, &guest("credit"), "", &runtime);
    let (code, _, err) = idem_cli(&["run", "--drain", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "idem: cannot start the wasm runtime: the compiled-component cache {} is writable by other users (mode 777); wasmtime runs what it finds there: chmod 700 it, or set [runtime] cache_dir or cache = false\n",
            cache.display()
        )
    );
}
