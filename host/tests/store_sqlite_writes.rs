//! SQLite's one write lock, as the host's message transactions take it:
//! the transactions of one pool queue for it at the pool's write gate, in
//! order, and a writer outside the pool is waited for with the busy
//! timeout (ARCHITECTURE.md, "SQLite on the handler's task").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::store::{Database, DeadLetter, ErrorClass, Receipt};
use idem_test_support::unique;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("idem.db").display())
}

async fn sqlite(dir: &tempfile::TempDir) -> Database {
    let db = Database::connect(&url(dir), 4).await.unwrap();
    db.prepare_host_tables().await.unwrap();
    db
}

fn receipt<'a>(consumer: &'a str, message_id: &'a str) -> Receipt<'a> {
    Receipt {
        consumer,
        message_id,
        stream_sequence: 42,
        module_digest: "abc123",
        published_ms: 1_700_000_000_000,
    }
}

/// Six transactions begun while a seventh holds the write lock wait for
/// it at the write gate, not in SQLite's busy handler (whose sleeping
/// tries would let them through in no particular order), and go through
/// in the order they asked once it commits.
#[tokio::test]
async fn the_pools_transactions_queue_for_the_write_lock_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(sqlite(&dir).await);
    let consumer = unique("c");
    let mut holder = db.begin().await.unwrap();
    assert!(
        holder
            .insert_receipt(&receipt(&consumer, "evt_0"))
            .await
            .unwrap()
    );
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiting = Vec::new();
    let ids = ["evt_1", "evt_2", "evt_3", "evt_4", "evt_5", "evt_6"];
    for id in ids {
        let (db, consumer, order) = (db.clone(), consumer.clone(), order.clone());
        waiting.push(tokio::spawn(async move {
            let mut tx = db.begin().await?;
            order.lock().unwrap().push(id);
            let inserted = tx.insert_receipt(&receipt(&consumer, id)).await?;
            tx.commit().await?;
            Ok::<_, anyhow::Error>(inserted)
        }));
        // This test's runtime has one thread: the task runs up to its
        // wait before the next one is spawned.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        waiting.iter().all(|t| !t.is_finished()),
        "a BEGIN went through while the write lock was held"
    );
    assert!(order.lock().unwrap().is_empty());
    holder.commit().await.unwrap();
    for task in waiting {
        let inserted = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(inserted);
    }
    assert_eq!(*order.lock().unwrap(), ids);
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 7);
    assert_eq!(db.sqlite_write_lock_waits(), Some(0));
}

/// A transaction that waits at the write gate for the whole busy timeout
/// gives up as a BEGIN does whose lock stayed held: `SQLITE_BUSY`, the
/// class the pipeline runs again after a backoff. The gate is free again
/// once the holder rolled back.
#[tokio::test]
async fn a_wait_at_the_write_gate_past_the_busy_timeout_is_busy() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::connect_with(&url(&dir), 4, Duration::from_millis(300))
        .await
        .unwrap();
    db.prepare_host_tables().await.unwrap();
    let consumer = unique("c");
    let holder = db.begin().await.unwrap();
    let started = std::time::Instant::now();
    let Err(e) = db.begin().await else {
        panic!("BEGIN went through while the write lock was held");
    };
    assert_eq!(e.class(), ErrorClass::Busy, "{e}");
    assert!(
        e.to_string().contains("this host's other writes"),
        "not the write gate's: {e}"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    holder.rollback().await.unwrap();
    let mut tx = db.begin().await.unwrap();
    assert!(
        tx.insert_receipt(&receipt(&consumer, "evt_1"))
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 1);
    assert_eq!(db.sqlite_write_lock_waits(), Some(0));
}

/// A write of the host's through sqlx's pool (a dead letter) queues at
/// the write gate with the message transactions, in order: it goes
/// through before a transaction that asked after it, rather than polling
/// in SQLite's busy handler while the transactions hand the lock on.
#[tokio::test]
async fn a_dead_letter_queues_for_the_write_lock_with_the_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(sqlite(&dir).await);
    let consumer = unique("c");
    let holder = db.begin().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let letter = {
        let (db, consumer, order) = (db.clone(), consumer.clone(), order.clone());
        tokio::spawn(async move {
            let headers: Vec<(String, String)> = Vec::new();
            db.dead_letter(&DeadLetter {
                consumer: &consumer,
                message_id: Some("evt_9"),
                stream: "ACCOUNTS",
                stream_sequence: 17,
                published_ns: 1_700_000_000_123_456_789,
                subject: "accounts.credit",
                reason: "rejected",
                headers: &headers,
                payload: &[1, 2, 3],
            })
            .await?;
            order.lock().unwrap().push("dead letter");
            Ok::<_, anyhow::Error>(())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = {
        let (db, consumer, order) = (db.clone(), consumer.clone(), order.clone());
        tokio::spawn(async move {
            let mut tx = db.begin().await?;
            order.lock().unwrap().push("transaction");
            tx.insert_receipt(&receipt(&consumer, "evt_1")).await?;
            // Held a while: a dead letter polling for the lock would find
            // it taken.
            tokio::time::sleep(Duration::from_millis(200)).await;
            tx.commit().await?;
            Ok::<_, anyhow::Error>(())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(order.lock().unwrap().is_empty());
    holder.commit().await.unwrap();
    for task in [letter, after] {
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["dead letter", "transaction"]);
    assert_eq!(db.dead_letters(&consumer).await.unwrap().len(), 1);
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 1);
}

/// A connection given back to the pool takes the write lock without
/// waiting when it is free; when another connection holds it, BEGIN waits
/// for it (the busy timeout), also on that connection afterwards: trying
/// without waiting leaves the connection's busy timeout as it was.
#[tokio::test]
async fn sqlite_begin_on_an_idle_connection_waits_for_a_lock_held_elsewhere() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(sqlite(&dir).await);
    let consumer = unique("c");
    // One connection, idle in the pool from now on.
    db.begin().await.unwrap().commit().await.unwrap();
    // Its next BEGIN, uncontended, takes the lock on this task.
    db.begin().await.unwrap().commit().await.unwrap();
    assert_eq!(db.sqlite_write_lock_waits(), Some(0));
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let mut holder = sqlx::SqliteConnection::connect(&url).await.unwrap();
    for id in ["evt_1", "evt_2"] {
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut holder)
            .await
            .unwrap();
        let (db2, c2) = (db.clone(), consumer.clone());
        let waiting = tokio::spawn(async move {
            let mut tx = db2.begin().await?;
            let inserted = tx.insert_receipt(&receipt(&c2, id)).await?;
            tx.commit().await?;
            Ok::<_, anyhow::Error>(inserted)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "BEGIN for {id} must wait for the lock"
        );
        sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
        let inserted = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(inserted, "{id}");
    }
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 2);
    // Both BEGINs found the lock held on the idle connection, and waited.
    assert_eq!(db.sqlite_write_lock_waits(), Some(2));
}
