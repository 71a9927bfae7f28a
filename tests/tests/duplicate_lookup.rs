//! Duplicates found before the transaction (ARCHITECTURE.md, "Duplicates
//! found before the transaction"): copies whose receipts are committed are
//! found by one receipt lookup for several deliveries and acked without a
//! transaction, also on a host that has just started (it remembers no
//! commit), unbatched and batched, on PostgreSQL and SQLite, against a
//! private nats-server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::metrics::StatsSnapshot;
use idem_tests::*;
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
    let second = RunningHost::start(cfg).await;
    let s = second
        .wait_for_within(
            "credit-projector",
            "the copies and evt_new settled",
            Duration::from_secs(30),
            |s| s.duplicates + s.processed == N as u64 + 1,
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
    let js = nats.jetstream().await;
    let first = RunningHost::start(cfg).await;
    for i in 0..N {
        publish(&js, SUBJECT, &credit(&format!("evt_{i}"), i % 10, 1), &[]).await;
    }
    first
        .wait_for("credit-projector", "the first N processed", |s| {
            s.processed == N as u64
        })
        .await;
    first.stop().await;
    for i in 0..N {
        publish(&js, SUBJECT, &credit(&format!("evt_{i}"), i % 10, 1), &[]).await;
    }
    publish(&js, SUBJECT, &credit("evt_new", 3, 100), &[]).await;
}

/// What the second host must leave: each account credited twice by the
/// first N, account 3 also by `evt_new`; N + 1 receipts.
async fn assert_applied_once(db: &TestDb) {
    for account in 0..10 {
        let want = 2 + if account == 3 { 100 } else { 0 };
        assert_eq!(db.balance(account).await, Some(want), "account {account}");
    }
    assert_eq!(db.receipts("credit-projector").await, N + 1);
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
