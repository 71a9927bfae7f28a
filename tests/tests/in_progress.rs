//! A message that takes longer than `ack_wait` stays ours: the host sends
//! in-progress acks while it works, so JetStream does not redeliver it. The
//! test makes the work slow for real by holding a lock the message's
//! transaction needs (a row lock on PostgreSQL, the write lock on SQLite)
//! for three times `ack_wait`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use sqlx::Connection;
use std::time::Duration;

async fn slow_message_is_not_redelivered(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("credit-projector", "credit");
    h.extra = "ack_wait = \"1s\"\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    let hold = Duration::from_secs(3);

    match backend {
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::query("INSERT INTO accounts (account_id, balance) VALUES (73, 0)")
                .execute(&mut c)
                .await
                .unwrap();
            let mut lock = c.begin().await.unwrap();
            sqlx::query("SELECT balance FROM accounts WHERE account_id = 73 FOR UPDATE")
                .execute(&mut *lock)
                .await
                .unwrap();
            publish(&js, "accounts.credit", &credit("evt_slow", 73, 500), &[]).await;
            tokio::time::sleep(hold).await;
            lock.rollback().await.unwrap();
        }
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            sqlx::raw_sql("BEGIN IMMEDIATE")
                .execute(&mut c)
                .await
                .unwrap();
            publish(&js, "accounts.credit", &credit("evt_slow", 73, 500), &[]).await;
            tokio::time::sleep(hold).await;
            sqlx::raw_sql("ROLLBACK").execute(&mut c).await.unwrap();
        }
    }
    host.wait_for("credit-projector", "processed", |s| s.processed == 1)
        .await;
    // Room for a redelivery to show up, were there one.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = host.stats("credit-projector");
    assert_eq!(
        (s.delivered, s.processed, s.duplicates, s.retried),
        (1, 1, 0, 0),
        "{s}"
    );
    assert_eq!(db.balance(73).await, Some(500));
    assert_eq!(db.receipts("credit-projector").await, 1);
    host.stop().await;
}
on_both_databases!(
    slow_message_is_not_redelivered,
    slow_message_is_not_redelivered
);

/// Several deliveries in progress at once share one keep-alive task, which
/// ends when none is held and starts again with the next: three messages
/// wait together for a row lock held three times `ack_wait`, then a fourth
/// waits alone, and none is delivered twice.
#[tokio::test]
async fn several_slow_messages_stay_ours_and_so_does_a_later_one_postgres() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("credit-projector", "credit");
    h.extra = "ack_wait = \"1s\"\nconcurrency = 3\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    let hold = Duration::from_secs(3);
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("INSERT INTO accounts (account_id, balance) VALUES (73, 0)")
        .execute(&mut c)
        .await
        .unwrap();
    for round in [&["evt_a", "evt_b", "evt_c"][..], &["evt_e"][..]] {
        let mut lock = c.begin().await.unwrap();
        sqlx::query("SELECT balance FROM accounts WHERE account_id = 73 FOR UPDATE")
            .execute(&mut *lock)
            .await
            .unwrap();
        for id in round {
            publish(&js, "accounts.credit", &credit(id, 73, 10), &[]).await;
        }
        tokio::time::sleep(hold).await;
        lock.rollback().await.unwrap();
        let settled = if round.len() == 3 { 3 } else { 4 };
        host.wait_for("credit-projector", "processed", |s| s.processed == settled)
            .await;
        // Past a period (a third of `ack_wait`) with nothing held: the
        // keep-alive task has ended, and the next round starts it again.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Room for a redelivery to show up, were there one.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = host.stats("credit-projector");
    assert_eq!(
        (s.delivered, s.processed, s.duplicates, s.retried),
        (4, 4, 0, 0),
        "{s}"
    );
    assert_eq!(db.balance(73).await, Some(40));
    assert_eq!(db.receipts("credit-projector").await, 4);
    host.stop().await;
}
