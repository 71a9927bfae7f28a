//! Signed deploys against real nats-server and SQLite, judged by effects
//! (which component's rows appear, which digest each receipt names): a
//! writer of the broker's buckets without the deploy key decides nothing.
//! An unsigned record, one signed by an untrusted key, one edited after it
//! was signed, one signed for another handler and one put again later are
//! each refused, counted (`idem_deploy_refused_total`) and shown, and the
//! running version keeps running; `--rollback` takes its target from signed
//! history only; two keys trusted at once rotate; a host without trusted
//! keys follows nothing (and says so once) while `watch = true` still
//! works; `idem keygen` writes a private seed and `idem deploy` refuses one
//! others can read.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::deploy::Deployment;
use idem::deploy::heartbeat::HostReport;
use idem::deploy::keys::{Role, read_seed};
use idem_tests::chaos::HostProcess;
use idem_tests::deploy_keys::{DeployKeys, deploy_store, trust_in};
use idem_tests::examples::{credit_log_migrations, eventually, sha256_hex};
use idem_tests::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `NAME` in `dir` for handler `h` running `module`, granted `accounts` and
/// `credit_log`, `extra` lines in its table; no `[deploy]` table.
fn config(dir: &Path, name: &str, nats: &Nats, db: &TestDb, module: &Path, extra: &str) -> PathBuf {
    named_config(dir, name, "h", nats, db, module, extra)
}

/// [`config`] for handler `handler` (each test of this file counts its
/// refusals under its own handler: the metrics recorder is the process's).
fn named_config(
    dir: &Path,
    name: &str,
    handler: &str,
    nats: &Nats,
    db: &TestDb,
    module: &Path,
    extra: &str,
) -> PathBuf {
    let cfg = dir.join(name);
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nmax_connections = 4\n[[handler]]\nname = \"{handler}\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\", \"credit_log\"]\nmigrations = \"{}\"\nretry_delay = \"100ms\"\n{extra}\n",
            nats.url(),
            db.url,
            module.display(),
            credit_log_migrations(dir).display()
        ),
    )
    .unwrap();
    cfg
}

/// `idem deploy --config cfg ARGS` signing with `keys`' deploy key.
fn deploy(keys: &DeployKeys, cfg: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["deploy", "--config", cfg.to_str().unwrap()];
    all.extend_from_slice(args);
    idem_cli(&all, &keys.env())
}

/// (event id, receipt digest, credit_log version if any), by event id, of
/// handler `h`.
async fn applied(db: &TestDb) -> Vec<(String, String, Option<String>)> {
    applied_by(db, "h").await
}

/// [`applied`] of `handler`.
async fn applied_by(db: &TestDb, handler: &str) -> Vec<(String, String, Option<String>)> {
    use sqlx::Row;
    let pool = db.pool().await;
    let rows = sqlx::query(
        "SELECT r.message_id, r.module_digest, l.version FROM idem_receipts r \
         LEFT JOIN credit_log l ON l.event_id = r.message_id WHERE r.consumer = $1 ORDER BY r.message_id",
    )
    .bind(handler)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get::<Option<String>, _>(2)))
        .collect()
}

/// `bytes` with a custom section appended: another digest, the same code.
fn with_custom_section(bytes: &[u8], tag: &str) -> Vec<u8> {
    let name = b"idem-test";
    let size = 1 + name.len() + tag.len();
    let mut out = bytes.to_vec();
    out.extend_from_slice(&[0, size as u8, name.len() as u8]);
    out.extend_from_slice(name);
    out.extend_from_slice(tag.as_bytes());
    out
}

/// What a plain NATS client with no idem config can do: put an object in
/// the modules bucket and a value under a key of the deployments bucket.
async fn plain_put(
    js: &async_nats::jetstream::Context,
    component: Option<&[u8]>,
    value: &[u8],
) -> u64 {
    if let Some(bytes) = component {
        let mut reader = bytes;
        js.get_object_store("idem-modules")
            .await
            .unwrap()
            .put(sha256_hex(bytes).as_str(), &mut reader)
            .await
            .unwrap();
    }
    js.get_key_value("idem-deployments")
        .await
        .unwrap()
        .put("h", value.to_vec().into())
        .await
        .unwrap()
}

/// Waits until `h`'s last refusal is of the record at `revision`; returns
/// its reason.
async fn refused_at(host: &RunningHost, revision: u64) -> String {
    refused_of(host, "h", revision).await
}

/// [`refused_at`] of `handler`.
async fn refused_of(host: &RunningHost, handler: &str, revision: u64) -> String {
    let slot = host.slot(handler).clone();
    eventually(
        &format!("the record at revision {revision} refused"),
        || slot.refused().is_some_and(|r| r.revision == Some(revision)),
    )
    .await;
    slot.refused().unwrap().reason
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_without_the_deploy_key_decides_nothing() {
    let metrics = idem::metrics::install_recorder().unwrap();
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = DeployKeys::of(dir.path());
    let cfg = config(dir.path(), "idem.toml", &nats, &db, &guest("credit"), "");
    trust_in(&cfg, &keys);
    let v1 = std::fs::read(guest("credit")).unwrap();
    let v2_path = guest("credit-log");
    let v2 = std::fs::read(&v2_path).unwrap();
    let evil = with_custom_section(&v2, "evil");
    let (d1, d2, de) = (sha256_hex(&v1), sha256_hex(&v2), sha256_hex(&evil));
    let host = RunningHost::start(&cfg).await;
    let slot = host.slot("h").clone();
    let js = nats.jetstream().await;
    let store = deploy_store(&nats.url()).await.unwrap();
    let record = |digest: &str, size: usize| Deployment {
        digest: digest.to_owned(),
        previous: Some(d1.clone()),
        deployed_at: "2026-12-01T00:00:00Z".into(),
        size: size as u64,
        by: "ops@build\u{1b}[2J\nlevel=info deployed".into(),
        ..Default::default()
    };

    // 1. An unsigned record naming a component the writer put there.
    let r = plain_put(&js, Some(&evil), &record(&de, evil.len()).to_value()).await;
    assert!(refused_at(&host, r).await.contains("is not signed"));
    // 2. A record signed for another handler, moved under `h`.
    let for_g = keys.signed(&store, "g", record(&d2, v2.len())).await;
    let r = plain_put(&js, None, &for_g.to_value()).await;
    assert_eq!(
        refused_at(&host, r).await,
        "the deployment record was signed for handler `g`, not `h`"
    );
    // A record signed by a key no host trusts.
    let stranger = DeployKeys::named(dir.path(), "stranger");
    let theirs = stranger.signed(&store, "h", record(&de, evil.len())).await;
    let r = plain_put(&js, None, &theirs.to_value()).await;
    assert_eq!(
        refused_at(&host, r).await,
        format!(
            "the deployment record is signed by {}, which is not in [deploy] trusted_keys",
            stranger.public
        )
    );
    // A signed record edited after it was signed.
    let mut edited = keys.signed(&store, "h", record(&d2, v2.len())).await;
    edited.digest = de.clone();
    edited.size = evil.len() as u64;
    let r = plain_put(&js, None, &edited.to_value()).await;
    assert!(
        refused_at(&host, r)
            .await
            .ends_with("does not verify: it was changed after it was signed")
    );
    assert_eq!(slot.current().digest(), d1);
    publish(&js, "accounts.credit", &credit("e1", 1, 1), &[]).await;
    host.wait_for("h", "e1 on v1", |s| s.processed == 1).await;

    // `idem status` shows the refusal, escaped; `--history` marks every
    // record it would not run.
    let deadline = Instant::now() + Duration::from_secs(15);
    let out = loop {
        let (code, out, err) = idem_cli(&["status", "--config", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 0, "{err}");
        // Reports come every few seconds: wait for one after e1.
        if out.contains(" processed=1 ") || Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.contains(&format!(" h {d1} in_flight=0 processed=1 ")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            " refused {de}: the deployment record's signature by {} does not verify",
            keys.public
        )),
        "{out}"
    );
    let (code, out, _) = deploy(&keys, &cfg, &["h", "--history"]);
    assert_eq!(code, 0);
    let marks: Vec<&str> = out
        .lines()
        .map(|l| {
            l.split("  REFUSED (")
                .nth(1)
                .map_or("believed", |r| r.split(':').next().unwrap())
        })
        .collect();
    assert_eq!(
        marks,
        [
            "unsigned",
            "other_handler",
            "untrusted_key",
            "bad_signature"
        ],
        "{out}"
    );
    assert!(!out.contains('\u{1b}') && out.lines().count() == 4, "{out}");

    // 3. After a real deploy, an unsigned record naming the current
    // version with the writer's as `previous`; then the operator rolls
    // back: to the signed previous version.
    let (code, out, err) = deploy(
        &keys,
        &cfg,
        &["h", v2_path.to_str().unwrap(), "--wait", "--timeout", "20s"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("deployed {d2} to `h` (revision ")),
        "{out}"
    );
    assert!(out.contains(&format!(", previous {d1})")), "{out}");
    publish(&js, "accounts.credit", &credit("e2", 1, 2), &[]).await;
    host.wait_for("h", "e2 on v2", |s| s.processed == 2).await;
    let v2_record = store.current("h").await.unwrap().unwrap();
    let mut fake = v2_record.deployment.clone().unwrap();
    fake.previous = Some(de.clone());
    fake.signer = String::new();
    fake.signature = String::new();
    let r = plain_put(&js, None, &fake.to_value()).await;
    assert!(refused_at(&host, r).await.contains("is not signed"));
    let (code, out, err) = deploy(
        &keys,
        &cfg,
        &["h", "--rollback", "--wait", "--timeout", "20s"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines().next().unwrap(),
        format!("deployed {d1} to `h` (revision {}, previous {d2})", r + 1)
    );
    assert_eq!(slot.current().digest(), d1);
    publish(&js, "accounts.credit", &credit("e3", 1, 4), &[]).await;
    host.wait_for("h", "e3 on v1", |s| s.processed == 3).await;

    // 4. The signed v2 record put again later (a replay): refused.
    let r = plain_put(&js, None, &v2_record.deployment.unwrap().to_value()).await;
    assert!(refused_at(&host, r).await.ends_with(": a copy put again"));
    assert_eq!(slot.current().digest(), d1);
    publish(&js, "accounts.credit", &credit("e4", 1, 8), &[]).await;
    host.wait_for("h", "e4 on v1", |s| s.processed == 4).await;

    // A host started now runs what the signed history says: v1.
    host.stop().await;
    let host = RunningHost::start(&cfg).await;
    assert_eq!(host.slot("h").current().digest(), d1);
    publish(&js, "accounts.credit", &credit("e5", 1, 16), &[]).await;
    host.wait_for("h", "e5 on v1", |s| s.processed == 1).await;
    host.stop().await;

    assert_eq!(db.balance(1).await, Some(31));
    assert_eq!(
        applied(&db).await,
        vec![
            ("e1".into(), d1.clone(), None),
            ("e2".into(), d2.clone(), Some("v2".into())),
            ("e3".into(), d1.clone(), None),
            ("e4".into(), d1.clone(), None),
            ("e5".into(), d1.clone(), None),
        ]
    );
    let rendered = metrics.render();
    let refused: Vec<&str> = rendered
        .lines()
        .filter(|l| l.starts_with("idem_deploy_refused_total{handler=\"h\","))
        .collect();
    let count = |reason: &str| {
        refused
            .iter()
            .find(|l| l.contains(&format!("reason=\"{reason}\"")))
            .map(|l| l.rsplit(' ').next().unwrap().to_owned())
    };
    assert_eq!(count("unsigned").as_deref(), Some("2"), "{refused:?}");
    assert_eq!(count("other_handler").as_deref(), Some("1"), "{refused:?}");
    assert_eq!(count("untrusted_key").as_deref(), Some("1"), "{refused:?}");
    assert_eq!(count("bad_signature").as_deref(), Some("1"), "{refused:?}");
    // Put again: refused by the running host, and by the one started after.
    assert_eq!(count("replayed").as_deref(), Some("2"), "{refused:?}");
    assert_eq!(refused.len(), 5, "{refused:?}");
}

/// Two keys trusted at once: each one's deploys run. Then the old key is
/// dropped from the config: a host started with it refuses what the old key
/// signs and runs what the new one does; `idem deploy` with the old key is
/// refused before anything changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_keys_trusted_at_once_rotate() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (
        DeployKeys::named(dir.path(), "old"),
        DeployKeys::named(dir.path(), "new"),
    );
    let both = named_config(
        dir.path(),
        "both.toml",
        "rot",
        &nats,
        &db,
        &guest("credit"),
        "",
    );
    let mut text = std::fs::read_to_string(&both).unwrap();
    text.push_str(&new.section_trusting(&[&old.public, &new.public]));
    std::fs::write(&both, text).unwrap();
    let only_new = named_config(
        dir.path(),
        "new.toml",
        "rot",
        &nats,
        &db,
        &guest("credit"),
        "",
    );
    let mut text = std::fs::read_to_string(&only_new).unwrap();
    text.push_str(&new.section_trusting(&[&new.public]));
    std::fs::write(&only_new, text).unwrap();
    let v1 = std::fs::read(guest("credit")).unwrap();
    let v2 = std::fs::read(guest("credit-log")).unwrap();
    let v3 = with_custom_section(&v1, "v3");
    let v3_path = dir.path().join("credit-v3.wasm");
    std::fs::write(&v3_path, &v3).unwrap();
    let (d2, d3) = (sha256_hex(&v2), sha256_hex(&v3));

    let host = RunningHost::start(&both).await;
    let slot = host.slot("rot").clone();
    let js = nats.jetstream().await;
    let (code, _, err) = deploy(
        &old,
        &both,
        &[
            "rot",
            guest("credit-log").to_str().unwrap(),
            "--wait",
            "--timeout",
            "20s",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(slot.current().digest(), d2);
    publish(&js, "accounts.credit", &credit("e1", 1, 1), &[]).await;
    host.wait_for("rot", "e1 on v2", |s| s.processed == 1).await;
    let (code, _, err) = deploy(
        &new,
        &both,
        &[
            "rot",
            v3_path.to_str().unwrap(),
            "--wait",
            "--timeout",
            "20s",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(slot.current().digest(), d3);
    publish(&js, "accounts.credit", &credit("e2", 1, 2), &[]).await;
    host.wait_for("rot", "e2 on v3", |s| s.processed == 2).await;
    host.stop().await;

    // The old key dropped.
    let (code, out, err) = deploy(
        &old,
        &only_new,
        &["rot", guest("credit-log").to_str().unwrap()],
    );
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err,
        format!(
            "idem: the deploy key {} ({}) is not in [deploy] trusted_keys of {}: hosts with this config would refuse what it signs; add it there (and to every host's config) first\n",
            old.seed.display(),
            old.public,
            only_new.display()
        )
    );
    let host = RunningHost::start(&only_new).await;
    let slot = host.slot("rot").clone();
    assert_eq!(slot.current().digest(), d3);
    let store = deploy_store(&nats.url()).await.unwrap();
    let r = old
        .put_signed(
            &store,
            "rot",
            Deployment {
                digest: d2.clone(),
                previous: Some(d3.clone()),
                deployed_at: "2026-12-01T00:00:00Z".into(),
                size: v2.len() as u64,
                by: "old".into(),
                ..Default::default()
            },
        )
        .await;
    assert!(
        refused_of(&host, "rot", r)
            .await
            .contains("which is not in [deploy] trusted_keys")
    );
    publish(&js, "accounts.credit", &credit("e3", 1, 4), &[]).await;
    host.wait_for("rot", "e3 on v3", |s| s.processed == 1).await;
    // The new key's rollback: the latest record it vouches for is v3's,
    // whose previous is v2.
    let (code, _, err) = deploy(
        &new,
        &only_new,
        &["rot", "--rollback", "--wait", "--timeout", "20s"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(slot.current().digest(), d2);
    publish(&js, "accounts.credit", &credit("e4", 1, 8), &[]).await;
    host.wait_for("rot", "e4 on v2", |s| s.processed == 2).await;
    host.stop().await;
    assert_eq!(
        applied_by(&db, "rot").await,
        vec![
            ("e1".into(), d2.clone(), Some("v2".into())),
            ("e2".into(), d3.clone(), None),
            ("e3".into(), d3.clone(), None),
            ("e4".into(), d2.clone(), Some("v2".into())),
        ]
    );
}

/// A host whose config trusts no deploy key runs its configured module
/// whatever is deployed, says so once in its log, and still swaps in a
/// replaced module file under `watch = true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_trusted_keys_a_host_follows_nothing_but_watch_works() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = DeployKeys::of(dir.path());
    let v1 = std::fs::read(guest("credit")).unwrap();
    let v2 = std::fs::read(guest("credit-log")).unwrap();
    let (d1, d2) = (sha256_hex(&v1), sha256_hex(&v2));
    let module = dir.path().join("handler.wasm");
    std::fs::write(&module, &v1).unwrap();
    let deployer = config(dir.path(), "deployer.toml", &nats, &db, &module, "");
    trust_in(&deployer, &keys);
    let untrusting = config(dir.path(), "host.toml", &nats, &db, &module, "watch = true");
    // A signed deployment of v2 is there before the host starts, and
    // another after.
    let (code, _, err) = deploy(
        &keys,
        &deployer,
        &["h", guest("credit-log").to_str().unwrap()],
    );
    assert_eq!(code, 0, "{err}");
    let host = HostProcess::spawn(&test_host(), &untrusting, "", dir.path(), "host");
    let log_path = host.log.clone();
    let js = nats.jetstream().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while js.get_stream("ACCOUNTS").await.is_err() {
        assert!(Instant::now() < deadline, "the host did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    publish(&js, "accounts.credit", &credit("e1", 1, 1), &[]).await;
    let receipts = |n: usize| {
        let db = &db;
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let rows = applied(db).await;
                if rows.len() >= n {
                    return rows;
                }
                assert!(
                    Instant::now() < deadline,
                    "fewer than {n} receipts: {rows:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    receipts(1).await;
    let (code, _, err) = deploy(&keys, &deployer, &["h", "--rollback"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = deploy(
        &keys,
        &deployer,
        &["h", guest("credit-log").to_str().unwrap()],
    );
    assert_eq!(code, 0, "{err}");
    publish(&js, "accounts.credit", &credit("e2", 1, 2), &[]).await;
    receipts(2).await;
    // The module file replaced: watched, swapped in.
    let tmp = dir.path().join("handler.tmp");
    std::fs::write(&tmp, &v2).unwrap();
    std::fs::rename(&tmp, &module).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log_path)
        .unwrap()
        .contains("new component in place")
    {
        assert!(Instant::now() < deadline, "v2 never swapped in");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    publish(&js, "accounts.credit", &credit("e3", 1, 4), &[]).await;
    let rows = receipts(3).await;
    let ended = host.terminate(Duration::from_secs(30));
    assert!(ended.status.is_some_and(|s| s.success()));
    assert_eq!(
        rows,
        vec![
            ("e1".into(), d1.clone(), None),
            ("e2".into(), d1.clone(), None),
            ("e3".into(), d2.clone(), Some("v2".into())),
        ]
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(
        log.matches("no [deploy] trusted_keys: deployments are not followed")
            .count(),
        1,
        "{log}"
    );
}

/// `idem keygen` writes a seed only its owner can read and prints the
/// public key; it never overwrites a file. `idem deploy` refuses a seed
/// file others can read, no key at all, and a host key, before it
/// contacts anything.
#[test]
fn keygen_writes_a_private_seed_and_deploy_refuses_a_readable_one() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("deploy.nk");
    let (code, out, err) = idem_cli(&["keygen", seed.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    let public = out.trim_end().to_owned();
    assert!(
        public.starts_with('M') && public.len() == 56 && out.lines().count() == 1,
        "{out}"
    );
    assert_eq!(
        std::fs::metadata(&seed).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let text = std::fs::read_to_string(&seed).unwrap();
    assert!(text.starts_with("SM") && !text.contains(&public));
    let (code, _, err) = idem_cli(&["keygen", seed.to_str().unwrap()], &[]);
    assert_eq!(code, 1);
    assert!(err.contains(" exists; it is never overwritten"), "{err}");
    assert_eq!(std::fs::read_to_string(&seed).unwrap(), text);
    let host_seed = dir.path().join("host.nk");
    let (code, out, _) = idem_cli(&["keygen", "--host", host_seed.to_str().unwrap()], &[]);
    assert_eq!(code, 0);
    assert!(out.starts_with('N'), "{out}");

    // A config whose broker is never contacted.
    let cfg = dir.path().join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"nats://127.0.0.1:1\"\n[deploy]\ntrusted_keys = [\"{public}\"]\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"S\"\nsubjects = [\"s\"]\ntables = [\"accounts\"]\n",
            guest("credit").display()
        ),
    )
    .unwrap();
    let module = guest("credit-log");
    let args = [
        "deploy",
        "--config",
        cfg.to_str().unwrap(),
        "h",
        module.to_str().unwrap(),
    ];
    let (code, _, err) = idem_cli(&args, &[]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "idem: no deploy key: give --key FILE or set IDEM_SIGNING_KEY (`idem keygen FILE` makes one; its public key goes in [deploy] trusted_keys of every host's config)\n"
    );
    let (code, _, err) = idem_cli(&args, &[("IDEM_SIGNING_KEY", host_seed.to_str().unwrap())]);
    assert_eq!(code, 1);
    assert!(
        err.contains("holds the seed of a Server key, not of a deploy key"),
        "{err}"
    );
    std::fs::set_permissions(&seed, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut with_flag = args.to_vec();
    with_flag.extend(["--key", seed.to_str().unwrap()]);
    let (code, out, err) = idem_cli(&with_flag, &[]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err,
        format!(
            "idem: the deploy key {} may be read by other users (mode 644); whoever reads it can sign as you: chmod 600 it\n",
            seed.display()
        )
    );
    assert!(!err.contains(text.trim()));
    // A key that is not a deploy key's in trusted_keys is a config problem.
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace(&public, "MNOTAKEY"),
    )
    .unwrap();
    let (code, _, err) = idem_cli(&["config", "check", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with(&format!(
            "idem: invalid config {}: [deploy] trusted_keys: `MNOTAKEY` is not a public NKey",
            cfg.display()
        )),
        "{err}"
    );
}

/// A report in the hosts bucket from no host (a plain NATS client wrote
/// it), and a real host's signed report copied under another name and
/// edited: `idem status` marks both unverified; `idem deploy --wait`
/// counts only the real host and names what it ignored. With no
/// `trusted_hosts`, every report is marked unverified. A report the real
/// host's key signed long ago, put back after it stopped, is stale:
/// unverified, and no success for `--wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_reports_of_trusted_hosts_count() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = DeployKeys::of(dir.path());
    let cfg = named_config(
        dir.path(),
        "idem.toml",
        "rep",
        &nats,
        &db,
        &guest("credit"),
        "",
    );
    trust_in(&cfg, &keys);
    let d1 = sha256_hex(&std::fs::read(guest("credit")).unwrap());
    let d2 = sha256_hex(&std::fs::read(guest("credit-log")).unwrap());
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    let hosts = js.get_key_value("idem-hosts").await.unwrap();
    // The real host's first report.
    let real = loop {
        let mut keys = hosts.keys().await.unwrap();
        use futures::StreamExt as _;
        if let Some(Ok(k)) = keys.next().await {
            break k;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let value = hosts.get(&real).await.unwrap().unwrap();
    let mut copied: serde_json::Value = serde_json::from_slice(&value).unwrap();
    copied["host"] = "copy-1".into();
    hosts
        .put("copy-1", serde_json::to_vec(&copied).unwrap().into())
        .await
        .unwrap();
    let ghost = serde_json::json!({
        "host": "ghost-1", "started_at": "2026-12-01T00:00:00Z",
        "reported_at": "2099-01-01T00:00:00Z",
        "handlers": [{"name": "rep", "digest": d1, "in_flight": 0, "processed": 0,
                      "duplicates": 0, "dead_lettered": 0}]
    });
    hosts
        .put("ghost-1", serde_json::to_vec(&ghost).unwrap().into())
        .await
        .unwrap();

    let (code, out, err) = idem_cli(&["status", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    for start in [
        format!("copy-1 [unverified] rep {d1} in_flight="),
        format!("ghost-1 [unverified] rep {d1} in_flight="),
        format!("{real} rep {d1} in_flight="),
    ] {
        assert_eq!(
            out.lines().filter(|l| l.starts_with(&start)).count(),
            1,
            "{start}: {out}"
        );
    }

    let (code, out, err) = deploy(
        &keys,
        &cfg,
        &[
            "rep",
            guest("credit-log").to_str().unwrap(),
            "--wait",
            "--timeout",
            "20s",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[1..],
        [
            format!("every live host runs {d2}: {real}"),
            "ignored 2 unverified report(s), not signed by a key of [deploy] trusted_hosts: copy-1, ghost-1".to_owned()
        ],
        "{out}"
    );
    assert_eq!(host.slot("rep").current().digest(), d2);

    // A config that trusts no host: nothing it shows is verified.
    let untrusting = named_config(
        dir.path(),
        "untrusting.toml",
        "rep",
        &nats,
        &db,
        &guest("credit"),
        "",
    );
    let (code, out, err) = idem_cli(&["status", "--config", untrusting.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    assert_eq!(
        out.lines()
            .filter(|l| l.contains(" [unverified] rep "))
            .count(),
        3,
        "{out}"
    );
    host.stop().await;

    // The real host gone, only unverified reports are left: with
    // `trusted_hosts`, that is never success. One of them is the real
    // host's, signed by its key long ago and put back now: a signature
    // says who, not when, so the broker's time of storing judges it.
    for key in ["copy-1", "ghost-1"] {
        hosts.delete(key).await.unwrap();
    }
    let mut ghost = ghost;
    ghost["host"] = "ghost-2".into();
    hosts
        .put("ghost-2", serde_json::to_vec(&ghost).unwrap().into())
        .await
        .unwrap();
    let mut old: HostReport = serde_json::from_slice(&value).unwrap();
    old.reported_at = "2026-01-01T00:00:00Z".into();
    old.sign(&read_seed(&keys.host_seed, Role::Host).unwrap())
        .unwrap();
    assert!(
        old.verified(
            &real,
            &[nkeys::KeyPair::from_public_key(&keys.host_public).unwrap()]
        ),
        "the signature itself holds"
    );
    hosts
        .put(&real, serde_json::to_vec(&old).unwrap().into())
        .await
        .unwrap();
    let (code, out, err) = idem_cli(&["status", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    let stale = format!("{real} [unverified: stale report] rep {d1} (deployed: {d2}) in_flight=");
    assert_eq!(
        out.lines().filter(|l| l.starts_with(&stale)).count(),
        1,
        "{stale}: {out}"
    );
    let mut ignored = [real.clone(), "ghost-2".to_owned()];
    ignored.sort();
    let (code, _, err) = deploy(
        &keys,
        &cfg,
        &[
            "rep",
            guest("credit").to_str().unwrap(),
            "--wait",
            "--timeout",
            "2s",
        ],
    );
    assert_eq!(
        (code, err.as_str()),
        (
            1,
            format!(
                "idem: after 2s, no host whose report is signed by a key of [deploy] trusted_hosts runs `rep` (ignored 2 unverified report(s): {}); check that the hosts run with a [deploy] host_key this config trusts\n",
                ignored.join(", ")
            )
            .as_str()
        )
    );
}
