//! The retention horizon (ARCHITECTURE.md invariant 7): receipts older than
//! `retention` are pruned in batches by one host at a time, a message published longer ago than `retention` is
//! quarantined instead of run, and a host refuses a stream that can present
//! messages older than its receipts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::config::Config;
use idem::service::Host;
use idem::store::{Database, PRUNE_LOCK_KEY, PrunePass};
use idem_tests::examples::now_ms;
use idem_tests::*;
use std::time::{Duration, Instant};

const SUBJECT: &str = "accounts.credit";
const HOUR: Duration = Duration::from_secs(3600);

/// Inserts receipts `ids` for `consumer`, of messages published `secs`
/// seconds ago (this machine's clock stands in for the broker's here: the
/// cutoffs below are computed on it too).
async fn receipts_at(db: &TestDb, consumer: &str, ids: &[&str], secs: i64) {
    for id in ids {
        db.execute(&format!(
            "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms)
             VALUES ('{consumer}', '{id}', 1, 'digest', {})",
            now_ms() - secs * 1000
        ))
        .await;
    }
}

/// The prune cutoff "published more than `window` ago", Unix ms.
fn before(window: Duration) -> i64 {
    now_ms() - i64::try_from(window.as_millis()).unwrap()
}

async fn store(db: &TestDb) -> Database {
    let store = Database::connect(&db.url, 4).await.unwrap();
    store.prepare_host_tables().await.unwrap();
    store
}

async fn prune_deletes_only_old_receipts_in_batches(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = store(&db).await;
    // a: five two hours old, one 30 minutes old, two new; b: three two hours old.
    receipts_at(&db, "a", &["a1", "a2", "a3", "a4", "a5"], 7200).await;
    receipts_at(&db, "a", &["a_recent"], 1800).await;
    receipts_at(&db, "a", &["a_new1", "a_new2"], 0).await;
    receipts_at(&db, "b", &["b1", "b2", "b3"], 7200).await;

    // Batches of 2: 2 + 2 + 1.
    assert_eq!(store.prune_receipts("a", before(HOUR), 2).await.unwrap(), 5);
    assert_eq!(db.receipt_ids("a").await, ["a_new1", "a_new2", "a_recent"]);
    assert_eq!(db.receipts("b").await, 3);
    // A second pass finds nothing.
    assert_eq!(store.prune_receipts("a", before(HOUR), 2).await.unwrap(), 0);
    // A shorter window reaches the 30-minute-old receipt, and only it.
    assert_eq!(
        store
            .prune_receipts("a", before(Duration::from_secs(900)), 1000)
            .await
            .unwrap(),
        1
    );
    assert_eq!(db.receipt_ids("a").await, ["a_new1", "a_new2"]);
    // An exact multiple of the batch: 3 = 1 + 1 + 1, then an empty statement.
    assert_eq!(store.prune_receipts("b", before(HOUR), 1).await.unwrap(), 3);
    assert_eq!(db.receipts("b").await, 0);
    assert_eq!(db.receipts("a").await, 2);
    // A pass over several handlers reports each one's count, in order.
    receipts_at(&db, "b", &["b4", "b5"], 7200).await;
    assert_eq!(
        store
            .prune_pass(&[("a", before(HOUR)), ("b", before(HOUR))], 1000)
            .await
            .unwrap(),
        PrunePass::Pruned(vec![0, 2])
    );
    store.close().await;
}
on_both_databases!(
    prune_deletes_only_old_receipts_in_batches,
    prune_deletes_only_old_receipts_in_batches
);

/// Two hosts' pruning passes on one PostgreSQL database: only the holder of
/// the advisory lock prunes; the other skips its pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pruner_at_a_time_postgres() {
    use sqlx::Connection as _;
    let db = TestDb::new(Backend::Postgres).await;
    let a = store(&db).await;
    let b = store(&db).await;
    receipts_at(&db, "c", &["c1", "c2", "c3"], 7200).await;
    let targets = [("c", before(HOUR))];

    // Someone else (this test's own session) holds the lock: both skip.
    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(PRUNE_LOCK_KEY)
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert!(locked);
    assert_eq!(
        a.prune_pass(&targets, 1000).await.unwrap(),
        PrunePass::Skipped
    );
    assert_eq!(
        b.prune_pass(&targets, 1000).await.unwrap(),
        PrunePass::Skipped
    );
    assert_eq!(db.receipts("c").await, 3);
    let unlocked: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
        .bind(PRUNE_LOCK_KEY)
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert!(unlocked);

    // Host a holds it: b cannot take it until a releases.
    let lock_a = a.try_prune_lock().await.unwrap().expect("a gets the lock");
    assert!(b.try_prune_lock().await.unwrap().is_none());
    assert_eq!(
        b.prune_pass(&targets, 1000).await.unwrap(),
        PrunePass::Skipped
    );
    assert_eq!(db.receipts("c").await, 3);
    lock_a.release().await.unwrap();
    assert_eq!(
        b.prune_pass(&targets, 1000).await.unwrap(),
        PrunePass::Pruned(vec![3])
    );
    assert_eq!(
        a.prune_pass(&targets, 1000).await.unwrap(),
        PrunePass::Pruned(vec![0])
    );
    assert_eq!(db.receipts("c").await, 0);

    // A lock dropped without release (a task aborted mid-pass) closes its
    // session, which frees the lock; the connection is not pooled holding it.
    drop(a.try_prune_lock().await.unwrap().expect("a gets the lock"));
    let deadline = Instant::now() + Duration::from_secs(5);
    let lock_b = loop {
        if let Some(l) = b.try_prune_lock().await.unwrap() {
            break l;
        }
        assert!(Instant::now() < deadline, "dropped lock never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    lock_b.release().await.unwrap();
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database =
           (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(&mut other)
    .await
    .unwrap();
    assert_eq!(held, 0);
    other.close().await.unwrap();
    a.close().await;
    b.close().await;
}

async fn host_prunes_receipts_past_retention(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("credit-projector", "credit");
    h.extra = "retention = \"2s\"\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    // The host creates the stream with max_age = retention, so it starts.
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    for i in 1..=3 {
        publish(&js, SUBJECT, &credit(&format!("evt_{i}"), 4, 10), &[]).await;
    }
    let s = host
        .wait_for("credit-projector", "3 processed", |s| s.processed == 3)
        .await;
    assert_eq!((s.dead_lettered, s.receipts_pruned), (0, 0));
    assert_eq!(db.receipts("credit-projector").await, 3);
    let s = host
        .wait_for("credit-projector", "3 receipts pruned", |s| {
            s.receipts_pruned == 3
        })
        .await;
    assert_eq!((s.processed, s.duplicates, s.dead_lettered), (3, 0, 0));
    assert_eq!(db.receipts("credit-projector").await, 0);
    assert_eq!(db.balance(4).await, Some(30));
    let summary = host.stop().await;
    assert_eq!(summary[0].1.receipts_pruned, 3);
}
on_both_databases!(
    host_prunes_receipts_past_retention,
    host_prunes_receipts_past_retention
);

async fn message_beyond_horizon_is_quarantined(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    let js = nats.jetstream().await;
    publish(&js, SUBJECT, &credit("evt_old", 11, 500), &[]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let mut h = HandlerSpec::new("credit-projector", "credit");
    h.extra = "retention = \"1s\"\naccept_horizon_risk = true\nack_wait = \"1s\"\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    let host = RunningHost::start(&cfg).await;
    let s = host
        .wait_for("credit-projector", "dead letter", |s| s.dead_lettered == 1)
        .await;
    assert_eq!(
        (s.delivered, s.processed, s.duplicates, s.retried, s.traps),
        (1, 0, 0, 0, 0)
    );
    let dead = db.dead_letters("credit-projector").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0.as_deref(), Some("evt_old"));
    let reason = &dead[0].1;
    assert!(
        reason.starts_with("beyond-horizon: published 1s ")
            || reason.starts_with("beyond-horizon: published 2s "),
        "{reason}"
    );
    assert!(
        reason.ends_with(
                " ago, older than the retention window of 1s; its receipt may be pruned, so it cannot be proven new"
            ),
        "{reason}"
    );
    // Not run: no receipt, no effect.
    assert_eq!(db.receipts("credit-projector").await, 0);
    assert_eq!(db.balance(11).await, None);
    // Termed: nothing pending, and past ack_wait it is not delivered again.
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = js
        .get_stream("ACCOUNTS")
        .await
        .unwrap()
        .get_consumer("credit-projector")
        .await
        .unwrap();
    let info = consumer.info().await.unwrap();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(host.stats("credit-projector").delivered, 1);

    // A fresh message on the same host is run as usual.
    publish(&js, SUBJECT, &credit("evt_new", 11, 7), &[]).await;
    let s = host
        .wait_for("credit-projector", "fresh processed", |s| s.processed == 1)
        .await;
    assert_eq!((s.delivered, s.dead_lettered), (2, 1));
    assert_eq!(db.balance(11).await, Some(7));
    host.stop().await;
}
on_both_databases!(
    message_beyond_horizon_is_quarantined,
    message_beyond_horizon_is_quarantined
);

/// `Host::start`'s error for `cfg`, as one line.
async fn start_error(cfg: &std::path::Path) -> String {
    let config = Config::load(cfg).unwrap();
    match Host::start(&config).await {
        Ok(_) => panic!("host started"),
        Err(e) => format!("{e:#}"),
    }
}

fn refusal(keeps: &str, retention: &str) -> String {
    format!(
        "handler `credit-projector`: stream `ACCOUNTS` keeps messages for {keeps} but receipts \
         are kept for {retention}; a redelivered or replayed message older than that could run \
         twice. Set the stream's max_age <= retention, raise retention, or set \
         accept_horizon_risk = true"
    )
}

async fn startup_refuses_stream_that_outlives_receipts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let config = |nats: &Nats, extra: &str| {
        let mut h = HandlerSpec::new("credit-projector", "credit");
        h.extra = extra.into();
        write_config(dir.path(), nats, &db, &[h])
    };

    // A stream without max_age keeps messages for ever.
    let nats = Nats::start();
    create_stream_with_max_age(&nats, "ACCOUNTS", &[SUBJECT], Duration::ZERO).await;
    let cfg = config(&nats, "");
    assert_eq!(start_error(&cfg).await, refusal("ever", "7days"));
    // The idem binary says the same, on one line.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem-test-host"))
        .args(["run", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("idem: {}\n", refusal("ever", "7days"))
    );
    // Accepting the risk explicitly starts it.
    let cfg = config(&nats, "accept_horizon_risk = true\n");
    RunningHost::start(&cfg).await.stop().await;
    drop(nats);

    // max_age longer than retention: refused; equal: starts.
    let nats = Nats::start();
    create_stream_with_max_age(&nats, "ACCOUNTS", &[SUBJECT], 2 * HOUR).await;
    let cfg = config(&nats, "retention = \"1h\"\n");
    assert_eq!(start_error(&cfg).await, refusal("2h", "1h"));
    let cfg = config(&nats, "retention = \"2h\"\n");
    RunningHost::start(&cfg).await.stop().await;
    drop(nats);

    // A stream idem creates gets max_age = retention.
    let nats = Nats::start();
    let cfg = config(&nats, "retention = \"90m\"\n");
    RunningHost::start(&cfg).await.stop().await;
    let mut stream = nats.jetstream().await.get_stream("ACCOUNTS").await.unwrap();
    assert_eq!(
        stream.info().await.unwrap().config.max_age,
        Duration::from_secs(90 * 60)
    );
}
on_both_databases!(
    startup_refuses_stream_that_outlives_receipts,
    startup_refuses_stream_that_outlives_receipts
);
