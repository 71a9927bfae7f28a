//! Two copies of one event in flight at once on two hosts: the database's
//! unique constraint on the receipt arbitrates (ARCHITECTURE.md invariant 5). The
//! test holds a row lock so that both transactions provably overlap.
//! PostgreSQL only: SQLite takes its single write lock at BEGIN, so two
//! transactions there never overlap in the first place.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use sqlx::Connection;
use std::time::{Duration, Instant};

/// A connection to `db` after creating account 73 (balance 0).
async fn account_73(db: &TestDb) -> sqlx::PgConnection {
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("INSERT INTO accounts (account_id, balance) VALUES (73, 0)")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

/// Holds account 73's row lock until the returned transaction ends: every
/// credit to it waits behind this.
async fn lock_row(conn: &mut sqlx::PgConnection) -> sqlx::Transaction<'_, sqlx::Postgres> {
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT balance FROM accounts WHERE account_id = 73 FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_one_event_in_flight_twice_postgres() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("credit-projector", "credit");
    h.extra = "pull_batch = 1\nack_wait = \"30s\"\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    let host_a = RunningHost::start(&cfg).await;
    let host_b = RunningHost::start(&cfg).await;

    let mut locker = account_73(&db).await;
    let lock_tx = lock_row(&mut locker).await;

    let js = nats.jetstream().await;
    let waiting = || async {
        db.scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
        .await
        .unwrap()
    };
    publish(&js, "accounts.credit", &credit("evt_8142", 73, 500), &[]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiting().await < 1 {
        assert!(
            Instant::now() < deadline,
            "first copy never blocked on the row lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    publish(&js, "accounts.credit", &credit("evt_8142", 73, 500), &[]).await;
    // Both transactions are open at once: one waits on the row, the other on the first one's receipt.
    while waiting().await < 2 {
        assert!(
            Instant::now() < deadline,
            "second copy never overlapped the first"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lock_tx.rollback().await.unwrap();

    let total = || {
        let (a, b) = (
            host_a.stats("credit-projector"),
            host_b.stats("credit-projector"),
        );
        (
            a.processed + b.processed,
            a.duplicates + b.duplicates,
            a.delivered,
            b.delivered,
            a.retried + b.retried,
        )
    };
    while {
        let t = total();
        t.0 + t.1 < 2
    } {
        assert!(
            Instant::now() < deadline + Duration::from_secs(10),
            "not finished: {:?}",
            total()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One effect, the other copy a duplicate, each host had one copy, no errors.
    assert_eq!(total(), (1, 1, 1, 1, 0));
    assert_eq!(db.balance(73).await, Some(500));
    assert_eq!(db.receipts("credit-projector").await, 1);
    host_a.stop().await;
    host_b.stop().await;
}

/// With `concurrency = n`, one host runs exactly `n` messages at once: the
/// test holds a row lock every message needs, and counts the host's
/// transactions waiting on it (PostgreSQL's `pg_stat_activity`), which must
/// reach `n` and never exceed it; released, all messages apply once.
async fn runs_exactly_concurrency_messages_at_once(n: i64) {
    const EVENTS: i64 = 8;
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("credit-projector", "credit");
    // A long deadline: the blocked statements must not trap while the test looks.
    h.extra = format!("concurrency = {n}\ndeadline = \"60s\"\nack_wait = \"30s\"\n");
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    let host = RunningHost::start(&cfg).await;

    let mut locker = account_73(&db).await;
    let lock_tx = lock_row(&mut locker).await;

    let js = nats.jetstream().await;
    for i in 0..EVENTS {
        publish(
            &js,
            "accounts.credit",
            &credit(&format!("evt_{i}"), 73, 10 + i),
            &[],
        )
        .await;
    }
    let waiting = || async {
        db.scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
            .await
            .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while waiting().await < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} messages in flight",
            waiting().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Give a would-be extra message time to start, then count again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(waiting().await, n, "messages in flight at once");
    assert_eq!(host.stats("credit-projector").processed, 0);
    lock_tx.rollback().await.unwrap();

    let s = host
        .wait_for("credit-projector", "every message applied", |s| {
            s.processed == EVENTS as u64
        })
        .await;
    assert_eq!(
        (
            s.delivered,
            s.processed,
            s.duplicates,
            s.retried,
            s.dead_lettered
        ),
        (EVENTS as u64, EVENTS as u64, 0, 0, 0)
    );
    // 10 + 11 + … + 17
    assert_eq!(
        db.balance(73).await,
        Some((0..EVENTS).map(|i| 10 + i).sum())
    );
    assert_eq!(db.receipts("credit-projector").await, EVENTS);
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_three_runs_three_at_once_postgres() {
    runs_exactly_concurrency_messages_at_once(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_one_runs_one_at_a_time_postgres() {
    runs_exactly_concurrency_messages_at_once(1).await;
}
