//! Receipts, dead letters, host tables and connecting, on real PostgreSQL and
//! SQLite: ARCHITECTURE.md invariants 1, 3, 4 and 5 at the store level.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::raw;
use idem_test_support::{pg_url, unique};

use idem::sql_guard::SqlGuard;
use idem::store::{Database, DeadLetter, Receipt, SqlValue};
use std::sync::Arc;
use std::time::Duration;

async fn pg() -> Database {
    let db = Database::connect(&pg_url(), 8).await.unwrap();
    db.prepare_host_tables().await.unwrap();
    db
}

async fn sqlite(dir: &tempfile::TempDir) -> Database {
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let db = Database::connect(&url, 4).await.unwrap();
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

async fn insert_then_duplicate(db: &Database) {
    let consumer = unique("c");
    let other = unique("c");
    let mut tx = db.begin().await.unwrap();
    assert!(
        tx.insert_receipt(&receipt(&consumer, "evt_1"))
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    let mut tx = db.begin().await.unwrap();
    assert!(
        !tx.insert_receipt(&receipt(&consumer, "evt_1"))
            .await
            .unwrap()
    );
    // Another event id, or another consumer with the same event id, is new (invariant 4).
    assert!(
        tx.insert_receipt(&receipt(&consumer, "evt_2"))
            .await
            .unwrap()
    );
    assert!(tx.insert_receipt(&receipt(&other, "evt_1")).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 2);
    assert_eq!(db.receipt_count(&other).await.unwrap(), 1);
    assert_eq!(db.receipt_count(&unique("none")).await.unwrap(), 0);
}

#[tokio::test]
async fn receipt_insert_then_duplicate_pg() {
    insert_then_duplicate(&pg().await).await;
}

#[tokio::test]
async fn receipt_insert_then_duplicate_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    insert_then_duplicate(&sqlite(&dir).await).await;
}

/// Invariant 1: the receipt and the handler's writes roll back together.
async fn rollback_leaves_nothing(db: &Database) {
    let consumer = unique("c");
    let t = unique("rb");
    raw(db, &format!("CREATE TABLE {t} (id BIGINT PRIMARY KEY)")).await;
    let guard = SqlGuard::new(db.kind(), std::slice::from_ref(&t));

    let mut tx = db.begin().await.unwrap();
    // Checked once, in the first transaction; run in each of them.
    let ins = guard
        .check(
            &mut tx,
            &format!("INSERT INTO {t} (id) VALUES ($1)"),
            &[SqlValue::Integer(1)],
        )
        .await
        .unwrap();
    let count = guard
        .check(&mut tx, &format!("SELECT count(*) FROM {t}"), &[])
        .await
        .unwrap();
    assert!(
        tx.insert_receipt(&receipt(&consumer, "evt_1"))
            .await
            .unwrap()
    );
    assert_eq!(tx.execute(&ins, &[SqlValue::Integer(1)]).await.unwrap(), 1);
    tx.rollback().await.unwrap();
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 0);

    // Dropping a transaction without commit rolls it back too.
    let mut tx = db.begin().await.unwrap();
    assert!(
        tx.insert_receipt(&receipt(&consumer, "evt_1"))
            .await
            .unwrap()
    );
    assert_eq!(tx.execute(&ins, &[SqlValue::Integer(1)]).await.unwrap(), 1);
    drop(tx);
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 0);

    let mut tx = db.begin().await.unwrap();
    assert_eq!(
        tx.query(&count, &[], 1, 1024).await.unwrap().rows,
        vec![vec![SqlValue::Integer(0)]]
    );
    // The same message then commits once.
    assert!(
        tx.insert_receipt(&receipt(&consumer, "evt_1"))
            .await
            .unwrap()
    );
    assert_eq!(tx.execute(&ins, &[SqlValue::Integer(1)]).await.unwrap(), 1);
    tx.commit().await.unwrap();
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 1);
    raw(db, &format!("DROP TABLE {t}")).await;
}

#[tokio::test]
async fn rollback_leaves_no_receipt_pg() {
    rollback_leaves_nothing(&pg().await).await;
}

#[tokio::test]
async fn rollback_leaves_no_receipt_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    rollback_leaves_nothing(&sqlite(&dir).await).await;
}

/// Invariant 5: a second transaction inserting the same receipt waits for the
/// first; after the first commits it sees the conflict (false) without error,
/// after the first rolls back it wins (true).
#[tokio::test]
async fn pg_concurrent_receipt_waits_then_sees_duplicate() {
    let db = Arc::new(pg().await);
    for first_commits in [true, false] {
        let consumer = unique("c");
        let mut first = db.begin().await.unwrap();
        assert!(
            first
                .insert_receipt(&receipt(&consumer, "evt_1"))
                .await
                .unwrap()
        );

        let (db2, c2) = (db.clone(), consumer.clone());
        let second = tokio::spawn(async move {
            let mut tx = db2.begin().await.unwrap();
            let inserted = tx.insert_receipt(&receipt(&c2, "evt_1")).await;
            (inserted, tx)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !second.is_finished(),
            "the second insert must wait for the first transaction"
        );

        if first_commits {
            first.commit().await.unwrap();
        } else {
            first.rollback().await.unwrap();
        }
        let (inserted, tx) = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(inserted.unwrap(), !first_commits);
        tx.commit().await.unwrap();
        assert_eq!(db.receipt_count(&consumer).await.unwrap(), 1);
    }
}

/// SQLite takes the write lock at BEGIN: a second transaction waits (busy
/// timeout) instead of failing with "database is locked".
#[tokio::test]
async fn sqlite_concurrent_transactions_wait_for_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(sqlite(&dir).await);
    let consumer = unique("c");
    let mut first = db.begin().await.unwrap();
    assert!(
        first
            .insert_receipt(&receipt(&consumer, "evt_1"))
            .await
            .unwrap()
    );

    let (db2, c2) = (db.clone(), consumer.clone());
    let second = tokio::spawn(async move {
        let mut tx = db2.begin().await.unwrap();
        let inserted = tx.insert_receipt(&receipt(&c2, "evt_1")).await.unwrap();
        tx.commit().await.unwrap();
        inserted
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second BEGIN IMMEDIATE must wait"
    );
    first.commit().await.unwrap();
    let inserted = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .unwrap()
        .unwrap();
    assert!(!inserted);
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 1);
}

/// The receipt lookup finds committed receipts of its consumer only: not
/// another consumer's, not one inserted by a transaction still open on
/// another connection (`hold` begins it and returns its commit). On SQLite
/// the first lookup, before any transaction, has no idle connection and
/// reads through sqlx; the later ones run on the connection the
/// transaction left idle (`direct::Conns::read_now`).
async fn lookup_finds_committed_receipts<F, C>(db: &Database, hold: impl FnOnce(String) -> F)
where
    F: std::future::Future<Output = C>,
    C: std::future::Future<Output = ()>,
{
    let (consumer, other) = (unique("c"), unique("c"));
    let ids = ["evt_1", "evt_2", "evt_3", "evt_x"];
    let sorted = |found: std::collections::HashSet<String>| {
        let mut found: Vec<String> = found.into_iter().collect();
        found.sort();
        found
    };
    assert!(
        db.existing_receipts(&consumer, &ids)
            .await
            .unwrap()
            .is_empty()
    );
    let mut tx = db.begin().await.unwrap();
    for id in ["evt_1", "evt_2"] {
        assert!(tx.insert_receipt(&receipt(&consumer, id)).await.unwrap());
    }
    assert!(tx.insert_receipt(&receipt(&other, "evt_x")).await.unwrap());
    tx.commit().await.unwrap();
    let commit = hold(format!(
        "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms) VALUES ('{consumer}', 'evt_3', 7, 'abc', 0)"
    ))
    .await;
    let found = db.existing_receipts(&consumer, &ids).await.unwrap();
    assert_eq!(sorted(found), ["evt_1", "evt_2"]);
    commit.await;
    let found = db.existing_receipts(&consumer, &ids).await.unwrap();
    assert_eq!(sorted(found), ["evt_1", "evt_2", "evt_3"]);
}

#[tokio::test]
#[expect(
    clippy::async_yields_async,
    reason = "the hold yields the commit, awaited after a lookup"
)]
async fn lookup_finds_committed_receipts_pg() {
    use sqlx::Connection as _;
    lookup_finds_committed_receipts(&pg().await, |insert| async move {
        let mut c = sqlx::PgConnection::connect(&pg_url()).await.unwrap();
        sqlx::raw_sql("BEGIN").execute(&mut c).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(insert))
            .execute(&mut c)
            .await
            .unwrap();
        async move {
            sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap();
        }
    })
    .await;
}

#[tokio::test]
#[expect(
    clippy::async_yields_async,
    reason = "the hold yields the commit, awaited after a lookup"
)]
async fn lookup_finds_committed_receipts_sqlite() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    lookup_finds_committed_receipts(&sqlite(&dir).await, |insert| async move {
        let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut c)
            .await
            .unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(insert))
            .execute(&mut c)
            .await
            .unwrap();
        async move {
            sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap();
        }
    })
    .await;
}

async fn dead_letters_are_idempotent(db: &Database) {
    let consumer = unique("c");
    let headers = vec![
        ("Nats-Msg-Id".to_string(), "evt_9".to_string()),
        ("X-Dup".to_string(), "1".to_string()),
        ("X-Dup".to_string(), "2".to_string()),
    ];
    let dl = DeadLetter {
        consumer: &consumer,
        message_id: Some("evt_9"),
        stream: "ACCOUNTS",
        stream_sequence: 17,
        published_ns: 1_700_000_000_123_456_789,
        subject: "accounts.credit",
        reason: "rejected: unknown currency",
        headers: &headers,
        payload: &[0, 1, 2, 255],
    };
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    db.dead_letter(&dl).await.unwrap();
    db.dead_letter(&DeadLetter {
        reason: "second try",
        ..dl.clone()
    })
    .await
    .unwrap();
    db.dead_letter(&DeadLetter {
        message_id: None,
        stream_sequence: 18,
        headers: &[],
        reason: "no identity",
        ..dl.clone()
    })
    .await
    .unwrap();
    // The same sequence in another stream is another message.
    db.dead_letter(&DeadLetter {
        stream: "OTHER",
        ..dl.clone()
    })
    .await
    .unwrap();
    // So is the same sequence of a stream deleted and created again: its
    // message was published later.
    db.dead_letter(&DeadLetter {
        published_ns: dl.published_ns + 60_000_000_000,
        message_id: Some("evt_10"),
        reason: "after the stream was created again",
        ..dl.clone()
    })
    .await
    .unwrap();

    let rows = db.dead_letters(&consumer).await.unwrap();
    assert_eq!(rows.len(), 4);
    let first = &rows[0];
    assert_eq!(first.consumer, consumer);
    assert_eq!(first.message_id.as_deref(), Some("evt_9"));
    assert_eq!(
        (first.stream.as_str(), first.stream_sequence),
        ("ACCOUNTS", 17)
    );
    assert_eq!(first.subject, "accounts.credit");
    assert_eq!(first.reason, "rejected: unknown currency");
    assert_eq!(first.headers, headers);
    assert_eq!(first.payload, vec![0, 1, 2, 255]);
    let age = i128::from(first.failed_at_ms) - i128::try_from(before).unwrap();
    assert!(
        (-60_000..60_000).contains(&age),
        "failed_at_ms {} vs now {before}",
        first.failed_at_ms
    );
    assert_eq!(
        (rows[1].message_id.as_deref(), rows[1].stream_sequence),
        (None, 18)
    );
    assert_eq!(rows[1].reason, "no identity");
    assert!(rows[1].headers.is_empty());
    assert_eq!(
        (rows[2].stream.as_str(), rows[2].stream_sequence),
        ("OTHER", 17)
    );
    assert_eq!(
        (
            rows[3].stream.as_str(),
            rows[3].stream_sequence,
            rows[3].message_id.as_deref(),
            rows[3].reason.as_str()
        ),
        (
            "ACCOUNTS",
            17,
            Some("evt_10"),
            "after the stream was created again"
        )
    );
    assert!(rows[0].id < rows[1].id && rows[1].id < rows[2].id && rows[2].id < rows[3].id);
    assert!(db.dead_letters(&unique("none")).await.unwrap().is_empty());
}

#[tokio::test]
async fn dead_letter_idempotent_pg() {
    dead_letters_are_idempotent(&pg().await).await;
}

#[tokio::test]
async fn dead_letter_idempotent_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    dead_letters_are_idempotent(&sqlite(&dir).await).await;
}

/// Several hosts starting at once all succeed (advisory lock on PostgreSQL).
#[tokio::test]
async fn prepare_host_tables_is_idempotent_and_concurrent() {
    let url = pg_url();
    let dbs: Vec<Arc<Database>> =
        futures::future::join_all((0..4).map(|_| Database::connect(&url, 2)))
            .await
            .into_iter()
            .map(|db| Arc::new(db.unwrap()))
            .collect();
    let results = futures::future::join_all(dbs.iter().map(|db| db.prepare_host_tables())).await;
    for r in results {
        r.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let lite = sqlite(&dir).await;
    lite.prepare_host_tables().await.unwrap();
    lite.prepare_host_tables().await.unwrap();
}

#[tokio::test]
async fn connect_errors_are_one_line_without_password() {
    let e = Database::connect("postgres://postgres:hunter2@127.0.0.1:1/test", 1)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.starts_with("cannot connect to database postgres://postgres:***@127.0.0.1:1/test: "),
        "{e}"
    );
    assert!(e.ends_with("; check [database] url"), "{e}");
    assert!(!e.contains("hunter2") && !e.contains('\n'), "{e}");

    let e = Database::connect("mysql://x@h/db", 1)
        .await
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        e,
        "cannot connect to database mysql://x@h/db: unsupported scheme (use postgres://… or sqlite://…); check [database] url"
    );

    let e = Database::connect("sqlite:///nonexistent-dir/for/sure/idem.db", 1)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.starts_with("cannot connect to database sqlite:///nonexistent-dir/for/sure/idem.db: "),
        "{e}"
    );

    // A missing SQLite file is created, with WAL on.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let db = Database::connect(&format!("sqlite://{}", path.display()), 2)
        .await
        .unwrap();
    assert!(path.exists());
    if let Some(pool) = db.sqlite_pool() {
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(mode, "wal");
        let fk: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(fk, 1);
        let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(sync, 2); // FULL
    }
}
