//! Host tables from an earlier idem are upgraded at start, their rows kept,
//! on real PostgreSQL and SQLite: the dead-letter key that now includes the
//! publish time, and receipts that now keep their message's publish time
//! (what the retention window is measured on, ARCHITECTURE.md invariant 7).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::raw;
use idem_test_support::{pg_url, pg_url_in_schema, unique};

use idem::store::{Database, DeadLetter, Receipt};

async fn pg() -> Database {
    let db = Database::connect(&pg_url(), 8).await.unwrap();
    db.prepare_host_tables().await.unwrap();
    db
}

/// A database in a fresh schema of the test PostgreSQL (dropped by the caller).
async fn pg_schema(prefix: &str) -> (Database, String, String) {
    let schema = unique(prefix);
    let admin = pg().await;
    raw(&admin, &format!("CREATE SCHEMA {schema}")).await;
    admin.close().await;
    let url = pg_url_in_schema(&schema);
    let db = Database::connect(&url, 1).await.unwrap();
    (db, url, schema)
}

async fn drop_schema(schema: &str) {
    let admin = pg().await;
    raw(&admin, &format!("DROP SCHEMA {schema} CASCADE")).await;
    admin.close().await;
}

/// The dead-letter table as idem created it before `published_ns`, with one
/// row, in the database `db` names.
const OLD_DEAD_LETTERS: &str = "CREATE TABLE idem_dead_letters (
    id {serial} PRIMARY KEY,
    consumer TEXT NOT NULL,
    message_id TEXT,
    stream TEXT NOT NULL,
    stream_sequence BIGINT NOT NULL,
    subject TEXT NOT NULL,
    reason TEXT NOT NULL,
    headers TEXT NOT NULL,
    payload {bytes} NOT NULL,
    failed_at {time} NOT NULL DEFAULT {now},
    UNIQUE (consumer, stream, stream_sequence)
);
INSERT INTO idem_dead_letters
    (id, consumer, message_id, stream, stream_sequence, subject, reason, headers, payload, failed_at)
    VALUES (7, 'h', 'p1', 'S', 1, 's', 'rejected: old', '[]', {payload}, {failed_at});";

/// A table from before `published_ns` is upgraded at start: its rows kept
/// (ids too), and a message at a sequence it already holds, published
/// after the stream was created again, gets its own row.
async fn old_dead_letter_table_is_upgraded(db: &Database) {
    db.prepare_host_tables().await.unwrap();
    db.prepare_host_tables().await.unwrap();
    let rows = db.dead_letters("h").await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (
            rows[0].id,
            rows[0].message_id.as_deref(),
            rows[0].stream_sequence,
            rows[0].reason.as_str()
        ),
        (7, Some("p1"), 1, "rejected: old")
    );
    assert_eq!(rows[0].failed_at_ms, 1_700_000_000_000);
    assert_eq!(rows[0].payload, b"{}".to_vec());
    let p2 = DeadLetter {
        consumer: "h",
        message_id: Some("p2"),
        stream: "S",
        stream_sequence: 1,
        published_ns: 1_800_000_000_000_000_000,
        subject: "s",
        reason: "rejected: new",
        headers: &[],
        payload: b"{}",
    };
    db.dead_letter(&p2).await.unwrap();
    db.dead_letter(&p2).await.unwrap();
    let rows = db.dead_letters("h").await.unwrap();
    let got: Vec<_> = rows
        .iter()
        .map(|r| (r.id, r.message_id.as_deref(), r.stream_sequence))
        .collect();
    assert_eq!(got, vec![(7, Some("p1"), 1), (8, Some("p2"), 1)]);
}

#[tokio::test]
async fn old_dead_letter_table_is_upgraded_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let url = format!("sqlite://{}", path.display());
    {
        let old = Database::connect(&url, 1).await.unwrap();
        raw(
            &old,
            &OLD_DEAD_LETTERS
                .replace("{serial}", "INTEGER")
                .replace(
                    "PRIMARY KEY,\n    consumer",
                    "PRIMARY KEY AUTOINCREMENT,\n    consumer",
                )
                .replace("{bytes}", "BLOB")
                .replace("{time}", "INTEGER")
                .replace("{now}", "(strftime('%s', 'now') * 1000)")
                .replace("{payload}", "X'7B7D'")
                .replace("{failed_at}", "1700000000000"),
        )
        .await;
    }
    let db = Database::connect(&url, 2).await.unwrap();
    old_dead_letter_table_is_upgraded(&db).await;
}

#[tokio::test]
async fn old_dead_letter_table_is_upgraded_pg() {
    let (old, url, schema) = pg_schema("upgrade").await;
    raw(
        &old,
        &OLD_DEAD_LETTERS
            .replace("{serial}", "BIGSERIAL")
            .replace("{bytes}", "BYTEA")
            .replace("{time}", "TIMESTAMPTZ")
            .replace("{now}", "now()")
            .replace("{payload}", "'\\x7b7d'")
            .replace("{failed_at}", "to_timestamp(1700000000)"),
    )
    .await;
    // As before the upgrade: the next id comes from the serial's sequence.
    raw(&old, "SELECT setval('idem_dead_letters_id_seq', 7)").await;
    let db = Database::connect(&url, 2).await.unwrap();
    old_dead_letter_table_is_upgraded(&db).await;
    db.close().await;
    drop_schema(&schema).await;
}

/// The receipts table as idem created it before `published_ms`, with two
/// receipts processed at Unix ms 1_700_000_000_000 and 1_700_000_001_000.
const OLD_RECEIPTS: &str = "CREATE TABLE idem_receipts (
    consumer TEXT NOT NULL,
    message_id TEXT NOT NULL,
    stream_sequence BIGINT NOT NULL,
    module_digest TEXT NOT NULL,
    processed_at {time} NOT NULL DEFAULT {now},
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX idem_receipts_consumer_processed_at ON idem_receipts (consumer, processed_at);
INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, processed_at)
    VALUES ('h', 'm1', 1, 'd1', {t1}), ('h', 'm2', 2, 'd2', {t2});";

/// Receipts from before `published_ms` are kept, each with its
/// `processed_at` as publish time; they still recognise their messages, and
/// pruning measures them (and new ones) by publish time.
async fn old_receipts_table_is_upgraded(db: &Database) {
    db.prepare_host_tables().await.unwrap();
    db.prepare_host_tables().await.unwrap();
    let m1 = db.receipt("h", "m1").await.unwrap().unwrap();
    assert_eq!(
        (
            m1.stream_sequence,
            m1.module_digest.as_str(),
            m1.processed_at_ms,
            m1.published_ms
        ),
        (1, "d1", 1_700_000_000_000, 1_700_000_000_000)
    );
    let m2 = db.receipt("h", "m2").await.unwrap().unwrap();
    assert_eq!(m2.published_ms, 1_700_000_001_000);
    let receipt = |id: &'static str, published_ms: i64| Receipt {
        consumer: "h",
        message_id: id,
        stream_sequence: 3,
        module_digest: "d3",
        published_ms,
    };
    let mut tx = db.begin().await.unwrap();
    assert!(
        !tx.insert_receipt(&receipt("m1", 1_800_000_000_000))
            .await
            .unwrap()
    );
    assert!(
        tx.insert_receipt(&receipt("m3", 1_700_000_002_000))
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    let summary = db.receipt_summary("h", None).await.unwrap();
    assert_eq!(
        (summary.count, summary.oldest_ms, summary.newest_ms),
        (3, Some(1_700_000_000_000), Some(1_700_000_002_000))
    );
    assert_eq!(
        db.prune_receipts("h", 1_700_000_001_000, 1000)
            .await
            .unwrap(),
        1
    );
    assert!(db.receipt("h", "m1").await.unwrap().is_none());
    assert_eq!(db.receipt_summary("h", None).await.unwrap().count, 2);
}

#[tokio::test]
async fn old_receipts_table_is_upgraded_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    {
        let old = Database::connect(&url, 1).await.unwrap();
        raw(
            &old,
            &OLD_RECEIPTS
                .replace(");\nCREATE INDEX", ") WITHOUT ROWID;\nCREATE INDEX")
                .replace("{time}", "INTEGER")
                .replace("{now}", "(strftime('%s', 'now') * 1000)")
                .replace("{t1}", "1700000000000")
                .replace("{t2}", "1700000001000"),
        )
        .await;
        old.close().await;
    }
    let db = Database::connect(&url, 2).await.unwrap();
    old_receipts_table_is_upgraded(&db).await;
    db.close().await;
}

#[tokio::test]
async fn old_receipts_table_is_upgraded_pg() {
    let (old, url, schema) = pg_schema("upgrade_r").await;
    raw(
        &old,
        &OLD_RECEIPTS
            .replace("{time}", "TIMESTAMPTZ")
            .replace("{now}", "now()")
            .replace("{t1}", "to_timestamp(1700000000)")
            .replace("{t2}", "to_timestamp(1700000001)"),
    )
    .await;
    old.close().await;
    let db = Database::connect(&url, 2).await.unwrap();
    old_receipts_table_is_upgraded(&db).await;
    db.close().await;
    drop_schema(&schema).await;
}
