//! A deployment history cut on the broker cannot take a host back, against
//! real nats-server, PostgreSQL and SQLite, judged by effects (which digest each
//! receipt names). A writer of the deployments bucket without the deploy
//! key puts an old signed record back where nothing stands before it, in
//! the three ways the broker allows: a rollup (`Nats-Rollup: sub`), a
//! purge of the key's subject in the bucket's stream, and the stream made
//! again with another first sequence. Each time a host started after it,
//! and `idem replay`, run what the hosts ran (the database's high-water
//! mark), and `idem status` shows that as deployed; a real deploy after
//! the cut is still above the mark, also on a host that runs while the
//! bucket is made again (revisions start over, the sequence decides). With
//! the handler's key deleted a host starts on the mark's version; with
//! that version's component gone too, it does not start (the config's
//! module is older) and says what to do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use async_nats::jetstream;
use idem::deploy::Deployment;
use idem::deploy::store::DeployStore;
use idem_tests::deploy_keys::{DeployKeys, deploy_cli, deploy_store, trust_in};
use idem_tests::examples::{credit_log_migrations, sha256_hex};
use idem_tests::*;
use std::path::{Path, PathBuf};

const KV_STREAM: &str = "KV_idem-deployments";
const KEY_SUBJECT: &str = "$KV.idem-deployments.h";

fn config(dir: &Path, nats: &Nats, db: &TestDb) -> PathBuf {
    let cfg = dir.join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nmax_connections = 4\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\", \"credit_log\"]\nmigrations = \"{}\"\nretry_delay = \"100ms\"\n",
            nats.url(),
            db.url,
            guest("credit").display(),
            credit_log_migrations(dir).display()
        ),
    )
    .unwrap();
    trust_in(&cfg, &DeployKeys::of(dir));
    cfg
}

/// The high-water mark row of handler `h`: (sequence, digest of its record).
async fn mark(db: &TestDb) -> (i64, String) {
    use sqlx::Row;
    let pool = db.pool().await;
    let row = sqlx::query("SELECT sequence, record FROM idem_deploy_marks WHERE handler = 'h'")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    let record = Deployment::parse(row.get::<String, _>(1).as_bytes()).unwrap();
    (row.get(0), record.digest)
}

/// Stops `host`, starts another on `cfg`, and checks what it runs: `digest`,
/// with the cut-in record refused below the mark; then one message
/// `event` runs on it.
async fn restart_runs(
    host: RunningHost,
    cfg: &Path,
    js: &jetstream::Context,
    digest: &str,
    event: &str,
    amount: i64,
) -> RunningHost {
    host.stop().await;
    let host = RunningHost::start(cfg).await;
    let slot = host.slot("h").clone();
    assert_eq!(slot.current().digest(), digest);
    let refused = slot.refused().expect("the cut-in record is refused");
    assert!(
        refused.reason.contains("the database's high-water mark"),
        "{}",
        refused.reason
    );
    publish(js, "accounts.credit", &credit(event, 1, amount), &[]).await;
    host.wait_for("h", event, |s| s.processed == 1).await;
    host
}

on_both_databases!(
    a_history_cut_on_the_broker_cannot_take_a_host_back,
    history_cut
);

async fn history_cut(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &nats, &db);
    let (v1_path, v2_path) = (guest("credit"), guest("credit-log"));
    let v3_path = dir.path().join("v3.wasm");
    let v3 = [std::fs::read(&v2_path).unwrap(), vec![0, 3, 1, b'x', b'3']].concat();
    std::fs::write(&v3_path, &v3).unwrap();
    let d1 = sha256_hex(&std::fs::read(&v1_path).unwrap());
    let d2 = sha256_hex(&std::fs::read(&v2_path).unwrap());
    let d3 = sha256_hex(&v3);
    let js = nats.jetstream().await;
    let mut host = RunningHost::start(&cfg).await;

    // v1 (what the config runs) and then v2, each signed and waited for.
    for path in [&v1_path, &v2_path] {
        let (code, out, err) = deploy_cli(
            &cfg,
            &["h", path.to_str().unwrap(), "--wait", "--timeout", "20s"],
        );
        assert_eq!(code, 0, "{out}{err}");
    }
    assert_eq!(host.slot("h").current().digest(), d2);
    publish(&js, "accounts.credit", &credit("e1", 1, 1), &[]).await;
    host.wait_for("h", "e1 on v2", |s| s.processed == 1).await;
    let store = deploy_store(&nats.url()).await.unwrap();
    let history = store.history("h").await.unwrap();
    assert_eq!(history.records.len(), 2);
    let v1_record = history.records[0].deployment.clone().unwrap();
    let v2_record = history.records[1].deployment.clone().unwrap();
    assert_eq!(
        (v1_record.digest.as_str(), v1_record.replaces),
        (d1.as_str(), 0)
    );
    assert!(v2_record.sequence > v1_record.sequence && v1_record.sequence > 0);
    assert_eq!(mark(&db).await, (v2_record.sequence as i64, d2.clone()));
    let old = v1_record.to_value();

    // 1. A rollup: v1's record put back as the key's only entry.
    let mut rollup = async_nats::HeaderMap::new();
    rollup.insert("Nats-Rollup", "sub");
    js.publish_with_headers(KEY_SUBJECT, rollup, old.clone().into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(store.history("h").await.unwrap().records.len(), 1);
    host = restart_runs(host, &cfg, &js, &d2, "e2", 2).await;
    let (code, out, err) = idem_cli(&["status", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!(" h {d2} (deployed) ")), "{out}");
    // `idem replay` runs what the hosts run, not the record cut in.
    let (code, out, err) = idem_cli(
        &[
            "replay",
            "--config",
            cfg.to_str().unwrap(),
            "h",
            "--from-seq",
            "1",
            "--as",
            "rerun",
        ],
        &[],
    );
    // v2 writes `credit_log` rows keyed by event: run again under another
    // name, both messages are dead-lettered (v1 would credit them again).
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("new=0 duplicates=0 dead_lettered=2"), "{out}");
    assert_eq!(db.receipt_digests("rerun").await, vec![]);
    assert_eq!(db.dead_letters("rerun").await.len(), 2);

    // 2. The key's subject purged in the bucket's stream, v1's record put.
    jetstream::stream::Stream::purge(&js.get_stream(KV_STREAM).await.unwrap())
        .filter(KEY_SUBJECT)
        .await
        .unwrap();
    js.publish(KEY_SUBJECT, old.clone().into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(store.history("h").await.unwrap().records.len(), 1);
    host = restart_runs(host, &cfg, &js, &d2, "e3", 4).await;

    // 3. The bucket's stream made again, starting at sequence 1000.
    remake_bucket(&js, Some(1000)).await;
    let revision = js
        .publish(KEY_SUBJECT, old.clone().into())
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence;
    assert_eq!(revision, 1000);
    host = restart_runs(host, &cfg, &js, &d2, "e4", 8).await;

    // The operator deploys after the cut: above the mark, so it runs.
    let (code, out, err) = deploy_cli(
        &cfg,
        &["h", v3_path.to_str().unwrap(), "--wait", "--timeout", "20s"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.lines().next().unwrap(),
        format!("deployed {d3} to `h` (revision 1001, previous {d2})")
    );
    assert_eq!(host.slot("h").current().digest(), d3);
    publish(&js, "accounts.credit", &credit("e5", 1, 16), &[]).await;
    host.wait_for("h", "e5 on v3", |s| s.processed == 2).await;
    let v3_record = latest_record(&store).await;
    assert!(v3_record.sequence > v2_record.sequence);
    assert_eq!(mark(&db).await, (v3_record.sequence as i64, d3.clone()));

    // 4. The bucket made again under a running host, revisions from 1:
    // the operator's next deploy has a lower revision than what runs, and
    // a higher sequence, which decides.
    remake_bucket(&js, None).await;
    let (code, out, err) = deploy_cli(
        &cfg,
        &["h", v2_path.to_str().unwrap(), "--wait", "--timeout", "60s"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.lines().next().unwrap(),
        format!("deployed {d2} to `h` (revision 1, previous {d3})")
    );
    assert_eq!(host.slot("h").current().digest(), d2);
    assert_eq!(host.slot("h").refused(), None);
    publish(&js, "accounts.credit", &credit("e6", 1, 32), &[]).await;
    host.wait_for("h", "e6 on v2", |s| s.processed == 3).await;
    let v2_again = latest_record(&store).await;
    assert_eq!(mark(&db).await, (v2_again.sequence as i64, d2.clone()));

    // 5. The handler's key deleted: no record at all. A host started
    // after it runs what the hosts ran last (the mark), not the config's
    // module (v1).
    store.deployments().delete("h").await.unwrap();
    assert!(store.current("h").await.unwrap().is_none());
    host.stop().await;
    let host = RunningHost::start(&cfg).await;
    assert_eq!(host.slot("h").current().digest(), d2);
    publish(&js, "accounts.credit", &credit("e7", 1, 64), &[]).await;
    host.wait_for("h", "e7 on v2", |s| s.processed == 1).await;
    host.stop().await;

    // 6. The component the mark names deleted as well: no version at or
    // above the mark can run, and the config's module is older, so the
    // host does not start, and says what to do.
    js.get_object_store("idem-modules")
        .await
        .unwrap()
        .delete(&d2)
        .await
        .unwrap();
    let (code, out, err) = idem_cli(&["run", "--drain", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{out}{err}");
    let line = err.lines().last().unwrap_or_default();
    assert!(
        line.starts_with(&format!(
            "idem: handler `h`: cannot run {d2}, the version its hosts ran last (sequence {}, the database's high-water mark): ",
            v2_again.sequence
        )) && line.ends_with(
            "; the config's module is older and is not run in its place; deploy a version with `idem deploy h FILE`, or to go back to the config's module delete the mark: DELETE FROM idem_deploy_marks WHERE handler = 'h'"
        ),
        "{err}"
    );

    assert_eq!(db.balance(1).await, Some(127));
    assert_eq!(
        db.receipt_digests("h").await,
        vec![
            ("e1".into(), d2.clone()),
            ("e2".into(), d2.clone()),
            ("e3".into(), d2.clone()),
            ("e4".into(), d2.clone()),
            ("e5".into(), d3.clone()),
            ("e6".into(), d2.clone()),
            ("e7".into(), d2.clone()),
        ]
    );
}

/// Handler `h`'s latest record in the deployments bucket (there is one).
async fn latest_record(store: &DeployStore) -> Deployment {
    store
        .current("h")
        .await
        .unwrap()
        .unwrap()
        .deployment
        .unwrap()
}

/// Deletes the deployments bucket's stream and makes it again with the
/// same config, starting at `first_sequence` (1 when `None`).
async fn remake_bucket(js: &jetstream::Context, first_sequence: Option<u64>) {
    let mut stream_config = js
        .get_stream(KV_STREAM)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    js.delete_stream(KV_STREAM).await.unwrap();
    stream_config.first_sequence = first_sequence;
    js.create_stream(stream_config).await.unwrap();
}
