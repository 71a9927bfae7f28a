//! Where a handler's versions come from, against real nats-server and
//! SQLite: a handler with `watch = true` runs its module file and follows
//! no deployment (the file and the deployments bucket never take turns, a
//! restart keeps the file's version, `idem deploy --wait` says so at once,
//! and the file is not read again until it changes). The only test in its
//! binary: it counts the bytes this process reads.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::deploy_keys::{DeployKeys, deploy_cli, trust_in};
use idem_tests::examples::{credit_log_migrations, eventually, sha256_hex};
use idem_tests::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `idem.toml` in `dir`: handler `h` runs `module` with `watch = true`
/// (stream ACCOUNTS), handler `g` runs the credit component from the build
/// (stream GIFTS) and follows deployments; both trust the test's keys.
fn config(dir: &Path, nats: &Nats, db: &TestDb, module: &Path) -> PathBuf {
    let cfg = dir.join("idem.toml");
    let migrations = credit_log_migrations(dir);
    let handler = |name: &str, module: &Path, stream: &str, subject: &str, extra: &str| {
        format!(
            "[[handler]]\nname = \"{name}\"\nmodule = \"{}\"\nstream = \"{stream}\"\nsubjects = [\"{subject}\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\", \"credit_log\"]\nmigrations = \"{}\"\n{extra}\n",
            module.display(),
            migrations.display()
        )
    };
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nmax_connections = 4\n[runtime]\ncache = false\n{}{}",
            nats.url(),
            db.url,
            handler("h", module, "ACCOUNTS", "accounts.credit", "watch = true"),
            handler("g", &guest("credit"), "GIFTS", "gifts.credit", ""),
        ),
    )
    .unwrap();
    trust_in(&cfg, &DeployKeys::of(dir));
    cfg
}

/// Bytes this process has read through system calls so far
/// (`/proc/self/io`, `rchar`: files and sockets).
fn bytes_read() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_handler_runs_its_file_and_follows_no_deployment() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let v1 = std::fs::read(guest("credit")).unwrap();
    let v2_path = guest("credit-log");
    let file_v2 = with_custom_section(&v1, "file-v2");
    let g_v2 = dir.path().join("g-v2.wasm");
    std::fs::write(&g_v2, with_custom_section(&v1, "g-v2")).unwrap();
    let (d1, d_file_v2) = (sha256_hex(&v1), sha256_hex(&file_v2));
    let d_g_v2 = sha256_hex(&std::fs::read(&g_v2).unwrap());
    let module = dir.path().join("h.wasm");
    std::fs::write(&module, &v1).unwrap();
    let cfg = config(dir.path(), &nats, &db, &module);
    let host = RunningHost::start(&cfg).await;
    let (h, g) = (host.slot("h").clone(), host.slot("g").clone());
    assert_eq!((h.current().digest(), g.current().digest()), (&*d1, &*d1));

    // A deploy to the watched handler is recorded, and `--wait` says at
    // once that the host runs the file.
    let waited = Instant::now();
    let (code, out, err) = deploy_cli(
        &cfg,
        &["h", v2_path.to_str().unwrap(), "--wait", "--timeout", "30s"],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with(&format!(
            "deployed {} to `h` (revision 1",
            sha256_hex(&std::fs::read(&v2_path).unwrap())
        )),
        "{out}"
    );
    let host_id = idem::deploy::heartbeat::host_id();
    assert_eq!(
        err.trim_end(),
        format!(
            "idem: not every host can run {}: {host_id} run `h` from the module file (`watch = true`) and follow no deployment; remove `watch` from their config and restart them to follow `idem deploy`",
            sha256_hex(&std::fs::read(&v2_path).unwrap())
        )
    );
    assert!(
        waited.elapsed() < Duration::from_secs(25),
        "{:?}",
        waited.elapsed()
    );
    // A deploy to `g` after it is followed; the bucket's watch delivers
    // the records in order, so `h`'s record came to this host first.
    let (code, _, err) = deploy_cli(
        &cfg,
        &["g", g_v2.to_str().unwrap(), "--wait", "--timeout", "30s"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(g.current().digest(), d_g_v2);
    assert_eq!(
        h.current().digest(),
        d1,
        "the watched handler followed a deployment"
    );

    // The file changes once: it goes in, and is not read again while it
    // stays as it is (the host's own read is an inotify event too).
    replace_file(&module, &file_v2);
    eventually("the file's v2 in place", || {
        h.current().digest() == d_file_v2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = bytes_read();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let read = bytes_read() - before;
    assert!(
        read < file_v2.len() as u64,
        "{read} bytes read in 4 idle seconds: the {}-byte module file is read again and again",
        file_v2.len()
    );
    // Recorded again, `h`'s deployment still does not replace the file.
    let (code, _, _) = deploy_cli(&cfg, &["h", v2_path.to_str().unwrap()]);
    assert_eq!(code, 0);
    let (code, _, err) = deploy_cli(
        &cfg,
        &[
            "g",
            guest("credit").to_str().unwrap(),
            "--wait",
            "--timeout",
            "30s",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(g.current().digest(), d1);
    assert_eq!(h.current().digest(), d_file_v2);
    let js = nats.jetstream().await;
    publish(&js, "accounts.credit", &credit("e1", 1, 5), &[]).await;
    host.wait_for("h", "e1", |s| s.processed == 1).await;
    host.stop().await;

    // A restart keeps the file's version for `h`, the deployed one for `g`.
    let host = RunningHost::start(&cfg).await;
    assert_eq!(host.slot("h").current().digest(), d_file_v2);
    assert_eq!(host.slot("g").current().digest(), d1);
    publish(&js, "accounts.credit", &credit("e2", 1, 7), &[]).await;
    publish(&js, "gifts.credit", &credit("g1", 2, 11), &[]).await;
    host.wait_for("h", "e2", |s| s.processed == 1).await;
    host.wait_for("g", "g1", |s| s.processed == 1).await;
    host.stop().await;
    assert_eq!(
        db.receipt_digests("h").await,
        [
            ("e1".to_owned(), d_file_v2.clone()),
            ("e2".to_owned(), d_file_v2.clone())
        ]
    );
    assert_eq!(db.receipt_digests("g").await, [("g1".to_owned(), d1)]);
    assert_eq!(
        (db.balance(1).await, db.balance(2).await),
        (Some(12), Some(11))
    );
}
