//! Two copies of one event in flight at once on two hosts: the database's
//! unique constraint on the receipt arbitrates (DESIGN.md invariant 5). The
//! test holds a row lock so that both transactions provably overlap.
//! PostgreSQL only: SQLite takes its single write lock at BEGIN, so two
//! transactions there never overlap in the first place.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use sqlx::Connection;
use std::time::{Duration, Instant};

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

    let mut locker = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("INSERT INTO accounts (account_id, balance) VALUES (73, 0)")
        .execute(&mut locker)
        .await
        .unwrap();
    let mut lock_tx = locker.begin().await.unwrap();
    sqlx::query("SELECT balance FROM accounts WHERE account_id = 73 FOR UPDATE")
        .execute(&mut *lock_tx)
        .await
        .unwrap();

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
