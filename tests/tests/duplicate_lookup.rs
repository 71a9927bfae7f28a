//! Duplicates found before the transaction (ARCHITECTURE.md, "Duplicates
//! found before the transaction"): copies whose receipts are committed are
//! found by one receipt lookup for several deliveries and acked without a
//! transaction, also on a host that has just started (it remembers no
//! commit), unbatched and batched, on PostgreSQL and SQLite, against a
//! private nats-server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::metrics::StatsSnapshot;
use idem_tests::*;
use sqlx::Connection;
use std::time::Duration;

const SUBJECT: &str = "accounts.credit";
const N: i64 = 20;

/// A private nats-server, a fresh database of `backend`, and a config (in
/// the returned directory) with handler `credit-projector` (the Rust
/// credit component) and the `extra` TOML lines.
async fn setup(
    backend: Backend,
    extra: &str,
) -> (Nats, TestDb, tempfile::TempDir, std::path::PathBuf) {
    let (nats, db, dir) = (
        Nats::start(),
        TestDb::new(backend).await,
        tempfile::tempdir().unwrap(),
    );
    let mut h = HandlerSpec::new("credit-projector", "credit");
    h.extra = format!("{}{extra}", h.extra);
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    (nats, db, dir, cfg)
}

/// A second host with `cfg`, run until the N copies and `evt_new` are
/// settled, then stopped: its counters.
async fn second_host(cfg: &std::path::Path) -> StatsSnapshot {
    second_host_of(cfg, N).await
}

/// [`second_host`] for `n` copies.
async fn second_host_of(cfg: &std::path::Path, n: i64) -> StatsSnapshot {
    let second = RunningHost::start(cfg).await;
    let s = second
        .wait_for_within(
            "credit-projector",
            "the copies and evt_new settled",
            Duration::from_secs(30),
            |s| s.duplicates + s.processed == n as u64 + 1,
        )
        .await;
    second.stop().await;
    s
}

/// Credits `evt_0` … `evt_{N-1}` of 1 to accounts 0 … 9, processed by one
/// host that then stops; then the same N messages again (same event ids,
/// new stream sequences) and one new one, `evt_new`, for a second host
/// started with the same config.
async fn copies_after_a_restart(nats: &Nats, cfg: &std::path::Path) {
    n_copies_after_a_restart(nats, cfg, N).await;
}

/// [`copies_after_a_restart`] with `n` messages.
async fn n_copies_after_a_restart(nats: &Nats, cfg: &std::path::Path, n: i64) {
    let js = nats.jetstream().await;
    let first = RunningHost::start(cfg).await;
    for i in 0..n {
        publish(&js, SUBJECT, &credit(&format!("evt_{i}"), i % 10, 1), &[]).await;
    }
    first
        .wait_for("credit-projector", "the first N processed", |s| {
            s.processed == n as u64
        })
        .await;
    first.stop().await;
    for i in 0..n {
        publish(&js, SUBJECT, &credit(&format!("evt_{i}"), i % 10, 1), &[]).await;
    }
    publish(&js, SUBJECT, &credit("evt_new", 3, 100), &[]).await;
}

/// What the second host must leave: each account credited twice by the
/// first N, account 3 also by `evt_new`; N + 1 receipts.
async fn assert_applied_once(db: &TestDb) {
    assert_n_applied_once(db, N).await;
}

/// [`assert_applied_once`] after `n` messages (a multiple of 10) and their
/// copies: each account credited once per message, `n / 10` times.
async fn assert_n_applied_once(db: &TestDb, n: i64) {
    for account in 0..10 {
        let want = n / 10 + if account == 3 { 100 } else { 0 };
        assert_eq!(db.balance(account).await, Some(want), "account {account}");
    }
    assert_eq!(db.receipts("credit-projector").await, n + 1);
}

/// Unbatched, one message at a time: on a host that has just started, the
/// first copy runs a transaction, which finds its receipt; from then on
/// every pull is looked up with one query, and the other N − 1 copies are
/// acked without a transaction. The new message among them is processed.
async fn copies_after_a_restart_are_acked_after_one_lookup(backend: Backend) {
    let (nats, db, _dir, cfg) = setup(backend, "batch = 1\nconcurrency = 1\n").await;
    copies_after_a_restart(&nats, &cfg).await;
    let s = second_host(&cfg).await;
    assert_eq!(
        (s.processed, s.duplicates, s.duplicates_looked_up, s.retried),
        (1, N as u64, N as u64 - 1, 0),
        "{s}"
    );
    // At least one lookup, at most one per copy found and one for evt_new.
    assert!(
        (1..=N as u64).contains(&s.receipt_lookups),
        "{} lookups",
        s.receipt_lookups
    );
    assert_applied_once(&db).await;
}
on_both_databases!(
    copies_after_a_restart_are_acked_after_one_lookup,
    copies_after_a_restart_are_acked_after_one_lookup
);

/// Unbatched, with the defaults' usual pull size of 3 (`ack_wait` 30 s,
/// `deadline` 5 s, `concurrency` 1) and `pull_batch` 16: while copies
/// arrive the pull size is raised to 16, so one lookup takes more copies
/// than a usual pull holds. Lookups of at most 3 would need 66 or more for
/// the 199 copies after the first.
async fn a_run_of_copies_is_looked_up_more_than_a_usual_pull_at_a_time(backend: Backend) {
    const MANY: i64 = 200;
    let (nats, db, _dir, cfg) = setup(backend, "batch = 1\nconcurrency = 1\n").await;
    n_copies_after_a_restart(&nats, &cfg, MANY).await;
    let s = second_host_of(&cfg, MANY).await;
    assert_eq!(
        (s.processed, s.duplicates, s.duplicates_looked_up, s.retried),
        (1, MANY as u64, MANY as u64 - 1, 0),
        "{s}"
    );
    assert!(
        s.receipt_lookups < 66,
        "{} lookups: the pull size was not raised",
        s.receipt_lookups
    );
    assert_n_applied_once(&db, MANY).await;
}
on_both_databases!(
    a_run_of_copies_is_looked_up_more_than_a_usual_pull_at_a_time,
    a_run_of_copies_is_looked_up_more_than_a_usual_pull_at_a_time
);

/// Batched (`batch = 16`, a linger long enough to fill it): on a host that
/// has just started the first batch (16 copies) runs its transaction,
/// which finds the receipts; the next batch (4 copies and `evt_new`) is
/// looked up with one query before any transaction: its copies are acked
/// without one, and `evt_new` runs alone.
async fn copies_in_a_batch_are_acked_before_its_transaction(backend: Backend) {
    let (nats, db, _dir, cfg) = setup(
        backend,
        "batch = 16\nbatch_linger = \"2s\"\nconcurrency = 1\n",
    )
    .await;
    copies_after_a_restart(&nats, &cfg).await;
    let s = second_host(&cfg).await;
    assert_eq!(
        (
            s.processed,
            s.duplicates,
            s.duplicates_looked_up,
            s.receipt_lookups,
            s.retried
        ),
        (1, N as u64, 4, 1, 0),
        "{s}"
    );
    assert_applied_once(&db).await;
}
on_both_databases!(
    copies_in_a_batch_are_acked_before_its_transaction,
    copies_in_a_batch_are_acked_before_its_transaction
);

/// A receipt forgotten (`idem receipts forget`) is not found by the
/// lookup: that copy (the last, so that nothing depends on whether its
/// lookup found another copy with it) runs its transaction and is applied
/// again; the other copies after the first (which ran a transaction) are
/// found by lookups.
async fn a_forgotten_receipt_is_not_found_by_the_lookup(backend: Backend) {
    let (nats, db, _dir, cfg) = setup(backend, "batch = 1\nconcurrency = 1\n").await;
    copies_after_a_restart(&nats, &cfg).await;
    let (code, _, err) = idem_cli(
        &[
            "receipts",
            "forget",
            "--handler",
            "credit-projector",
            "evt_19",
            "--config",
            cfg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let s = second_host(&cfg).await;
    assert_eq!(
        (s.processed, s.duplicates, s.duplicates_looked_up, s.retried),
        (2, N as u64 - 1, N as u64 - 2, 0),
        "{s}"
    );
    // evt_19 credited account 9 a third time.
    assert_eq!(db.balance(9).await, Some(3));
    assert_eq!(db.receipts("credit-projector").await, N + 1);
}
on_both_databases!(
    a_forgotten_receipt_is_not_found_by_the_lookup,
    a_forgotten_receipt_is_not_found_by_the_lookup
);

/// A run of copies raises the pull size; what it and the pulls after it
/// bring is held in progress while it waits behind deliveries the loop
/// already holds. Here `ack_wait` is 1 s (usual pull size 2, raised to
/// 16): after the copies, 30 new messages arrive while SQLite's write
/// lock is held elsewhere for three times `ack_wait`, so the first
/// lookup's new deliveries wait in the loop and the rest in the pull
/// stream. None is delivered twice.
#[tokio::test]
async fn what_waits_behind_a_lookup_after_copies_is_not_redelivered_sqlite() {
    const NEW: u64 = 30;
    let (nats, db, _dir, cfg) = setup(
        Backend::Sqlite,
        "batch = 1\nconcurrency = 1\nack_wait = \"1s\"\n",
    )
    .await;
    copies_after_a_restart(&nats, &cfg).await;
    let second = RunningHost::start(&cfg).await;
    second
        .wait_for("credit-projector", "the copies and evt_new settled", |s| {
            s.duplicates + s.processed == N as u64 + 1
        })
        .await;
    let mut lock = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut lock)
        .await
        .unwrap();
    let js = nats.jetstream().await;
    for i in 0..NEW {
        publish(&js, SUBJECT, &credit(&format!("evt_late_{i}"), 5, 1), &[]).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    sqlx::raw_sql("ROLLBACK").execute(&mut lock).await.unwrap();
    second
        .wait_for("credit-projector", "the late messages processed", |s| {
            s.processed == 1 + NEW
        })
        .await;
    // Room for a redelivery to show up, were there one.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = second.stats("credit-projector");
    second.stop().await;
    // Every message delivered once: the N copies, evt_new, the late ones.
    assert_eq!(
        (s.processed, s.duplicates, s.delivered, s.retried),
        (1 + NEW, N as u64, N as u64 + 1 + NEW, 0),
        "{s}"
    );
    assert_eq!(db.balance(5).await, Some(2 + NEW as i64));
    assert_eq!(db.receipts("credit-projector").await, N + 1 + NEW as i64);
}
