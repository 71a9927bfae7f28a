//! `Runtime::handle` against a real SQLite file: results, traps, limits, and
//! that the transaction comes back usable whatever the guest did.
//!
//! Needs the guests built: `scripts/build-guests.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_test_support::guest;

use idem::runtime::{
    GuestMessage, HandlerComponent, HandlerFailure, Invocation, Limits, LoadOptions, Runtime,
};
use idem::sql_guard::SqlGuard;
use idem::store::{Database, DbKind};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{Row, SqlitePool};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

static RUNTIME: LazyLock<Runtime> = LazyLock::new(|| Runtime::new().expect("runtime starts"));
static BEHAVE: LazyLock<Arc<HandlerComponent>> = LazyLock::new(|| {
    RUNTIME
        .load(&guest("behave"), LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"))
});

/// A SQLite file with the tables the guests use: read through `pool`,
/// written in the host's transactions of `database`.
struct Db {
    _dir: tempfile::TempDir,
    pool: SqlitePool,
    database: Database,
}

async fn db() -> Db {
    let dir = tempfile::tempdir().unwrap();
    let opts = SqliteConnectOptions::new()
        .filename(dir.path().join("t.db"))
        .create_if_missing(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(opts)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE accounts (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE idem_receipts (consumer TEXT, message_id TEXT)")
        .execute(&pool)
        .await
        .unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let database = Database::connect(&url, 2).await.unwrap();
    Db {
        _dir: dir,
        pool,
        database,
    }
}

fn invocation(limits: Limits) -> Invocation {
    Invocation {
        handler: Arc::from("behave"),
        message_id: "evt-1".into(),
        guard: Arc::new(SqlGuard::new(DbKind::Sqlite, &["accounts".to_string()])),
        limits,
        stats: Arc::default(),
        rehearsal: None,
    }
}

fn message(payload: serde_json::Value, delivery_count: u64) -> GuestMessage {
    GuestMessage {
        message_id: "evt-1".into(),
        subject: "test.behave".into(),
        headers: vec![("Nats-Msg-Id".into(), "evt-1".into())],
        payload: payload.to_string().into_bytes(),
        stream_sequence: 7,
        delivery_count,
        published_ms: 1_700_000_000_000,
    }
}

/// Runs one message in a fresh transaction, then commits it when the guest
/// succeeded and rolls it back otherwise (as the pipeline does).
async fn run(
    db: &Db,
    limits: Limits,
    payload: serde_json::Value,
    delivery: u64,
) -> Result<(), HandlerFailure> {
    let tx = db.database.begin().await.unwrap();
    let (result, tx) = RUNTIME
        .handle(&BEHAVE, &invocation(limits), tx, message(payload, delivery))
        .await;
    if result.is_ok() {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    // Behave makes no outbox calls here.
    result.map(|outbox| assert_eq!(outbox, vec![]))
}

async fn balance(db: &Db, account: i64) -> Option<i64> {
    sqlx::query("SELECT balance FROM accounts WHERE account_id = ?")
        .bind(account)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
        .map(|r| r.get::<i64, _>(0))
}

fn reject_reason(r: Result<(), HandlerFailure>) -> String {
    match r {
        Err(HandlerFailure::Reject(reason)) => reason,
        other => panic!("expected a reject, got {other:?}"),
    }
}

#[tokio::test]
async fn credit_commits() {
    let db = db().await;
    let credit = json!({"op": "credit", "account_id": 73, "amount": 500});
    run(&db, Limits::default(), credit.clone(), 1)
        .await
        .unwrap();
    run(&db, Limits::default(), credit, 1).await.unwrap();
    assert_eq!(balance(&db, 73).await, Some(1000));
}

#[tokio::test]
async fn retry_and_reject_roll_back() {
    let db = db().await;
    let r = run(
        &db,
        Limits::default(),
        json!({"op": "retry", "reason": "later"}),
        1,
    )
    .await;
    assert_eq!(r, Err(HandlerFailure::Retry("later".into())));
    let r = run(
        &db,
        Limits::default(),
        json!({"op": "reject", "reason": "never"}),
        1,
    )
    .await;
    assert_eq!(r, Err(HandlerFailure::Reject("never".into())));
    // A write followed by a failure leaves nothing behind.
    let sql = json!({"op": "sql", "sql": "INSERT INTO accounts (account_id, balance) VALUES (1, 1)", "repeat": 2});
    let reason = reject_reason(run(&db, Limits::default(), sql, 1).await);
    assert!(reason.starts_with("unique-violation:"), "{reason}");
    assert_eq!(balance(&db, 1).await, None);
}

#[tokio::test]
async fn retry_once_then_credit_reads_the_delivery_count() {
    let db = db().await;
    let p = json!({"op": "retry-once-then-credit", "account_id": 5, "amount": 10});
    assert!(matches!(
        run(&db, Limits::default(), p.clone(), 1).await,
        Err(HandlerFailure::Retry(_))
    ));
    run(&db, Limits::default(), p, 2).await.unwrap();
    assert_eq!(balance(&db, 5).await, Some(10));
}

#[tokio::test]
async fn bad_payload_rejects() {
    let db = db().await;
    let tx = db.database.begin().await.unwrap();
    let mut msg = message(json!({}), 1);
    msg.payload = b"not json".to_vec();
    let (r, _tx) = RUNTIME
        .handle(&BEHAVE, &invocation(Limits::default()), tx, msg)
        .await;
    assert!(reject_reason(r.map(drop)).starts_with("bad payload"));
}

#[tokio::test]
async fn trap_is_a_failure_and_the_host_goes_on() {
    let db = db().await;
    let r = run(&db, Limits::default(), json!({"op": "trap"}), 1).await;
    match r {
        Err(HandlerFailure::Trap(t)) => {
            assert!(t.contains("unreachable"), "{t}");
            // The SDK's panic hook logs the message; the host adds it to the reason.
            assert!(
                t.contains("guest panicked at") && t.ends_with("asked to trap"),
                "{t}"
            );
            assert!(!t.contains('\n'), "{t}");
        }
        other => panic!("expected a trap, got {other:?}"),
    }
    run(
        &db,
        Limits::default(),
        json!({"op": "credit", "account_id": 1, "amount": 2}),
        1,
    )
    .await
    .unwrap();
    assert_eq!(balance(&db, 1).await, Some(2));
}

#[tokio::test]
async fn infinite_loop_hits_the_deadline() {
    let db = db().await;
    LazyLock::force(&BEHAVE);
    let limits = Limits {
        deadline: Duration::from_millis(200),
        ..Limits::default()
    };
    let start = Instant::now();
    let r = run(&db, limits, json!({"op": "loop"}), 1).await;
    let took = start.elapsed();
    assert_eq!(
        r,
        Err(HandlerFailure::Trap("exceeded the 200ms deadline".into()))
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

#[tokio::test]
async fn a_loop_does_not_starve_the_executor() {
    // The guest yields at every epoch tick, so a timer on the same
    // single-threaded runtime still fires while it spins.
    let db = db().await;
    LazyLock::force(&BEHAVE); // compile first: that blocks, by design
    let limits = Limits {
        deadline: Duration::from_millis(500),
        ..Limits::default()
    };
    let ticker = tokio::spawn(async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Instant::now()
    });
    let start = Instant::now();
    let _ = run(&db, limits, json!({"op": "loop"}), 1).await;
    let fired = ticker.await.unwrap();
    let after = fired.duration_since(start);
    assert!(
        after < Duration::from_millis(400),
        "the timer fired after {after:?}"
    );
}

#[tokio::test]
async fn memory_bomb_hits_the_limit() {
    let db = db().await;
    let limits = Limits {
        max_memory_bytes: 16 << 20,
        ..Limits::default()
    };
    let r = run(&db, limits, json!({"op": "membomb"}), 1).await;
    match r {
        Err(HandlerFailure::Trap(t)) => assert!(
            t.starts_with("exceeded the memory limit of 16777216 bytes"),
            "{t}"
        ),
        other => panic!("expected a trap, got {other:?}"),
    }
}

#[tokio::test]
async fn denied_statements_are_error_values() {
    let db = db().await;
    for sql in ["DELETE FROM idem_receipts", "SELECT * FROM idem_receipts"] {
        let r = run(&db, Limits::default(), json!({"op": "sql", "sql": sql}), 1).await;
        let reason = reject_reason(r);
        assert!(reason.starts_with("denied:"), "{sql}: {reason}");
    }
}

#[tokio::test]
async fn statement_budget_is_enforced() {
    let db = db().await;
    let limits = Limits {
        max_statements: 3,
        ..Limits::default()
    };
    let sql = "UPDATE accounts SET balance = balance + 1 WHERE account_id = 1";
    run(
        &db,
        limits.clone(),
        json!({"op": "sql", "sql": sql, "repeat": 3}),
        1,
    )
    .await
    .unwrap();
    let reason = reject_reason(
        run(
            &db,
            limits,
            json!({"op": "sql", "sql": sql, "repeat": 4}),
            1,
        )
        .await,
    );
    assert!(
        reason.starts_with("denied: statement budget exhausted"),
        "{reason}"
    );
}

#[tokio::test]
async fn query_returns_typed_rows() {
    let db = db().await;
    run(
        &db,
        Limits::default(),
        json!({"op": "credit", "account_id": 9, "amount": 42}),
        1,
    )
    .await
    .unwrap();
    let q = json!({"op": "query", "sql": "SELECT account_id, balance FROM accounts WHERE account_id = $1", "params": [9]});
    let reason = reject_reason(run(&db, Limits::default(), q, 1).await);
    assert_eq!(reason, r#"rows ["account_id","balance"] [[9,42]]"#);
}

#[tokio::test]
async fn long_reasons_are_truncated() {
    let db = db().await;
    let long = "x".repeat(100_000);
    let reason = reject_reason(
        run(
            &db,
            Limits::default(),
            json!({"op": "reject", "reason": long}),
            1,
        )
        .await,
    );
    assert!(reason.len() < 4200, "{}", reason.len());
    assert!(reason.ends_with("more bytes)"));
}

#[tokio::test]
async fn log_flood_is_capped_not_fatal() {
    let db = db().await;
    let limits = Limits {
        max_log_bytes: 1024,
        ..Limits::default()
    };
    run(
        &db,
        limits,
        json!({"op": "log", "bytes": 300, "lines": 100}),
        1,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_full_pool_asks_for_a_retry() {
    let small = Runtime::with_capacity(1).unwrap();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let module = small
        .load(&target.join("guests/behave.wasm"), LoadOptions::default())
        .unwrap();
    // Two files: a host transaction holds SQLite's write lock, and the
    // second call must reach the runtime while the first still runs.
    let (db, other) = (db().await, db().await);
    let slow = Limits {
        deadline: Duration::from_millis(300),
        ..Limits::default()
    };
    let call = async |limits: Limits, payload: serde_json::Value, database: &Database| {
        let tx = database.begin().await.unwrap();
        small
            .handle(&module, &invocation(limits), tx, message(payload, 1))
            .await
            .0
    };
    let busy = call(slow, json!({"op": "loop"}), &db.database);
    let second = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        call(Limits::default(), json!({"op": "reject"}), &other.database).await
    };
    let (busy, second) = tokio::join!(busy, second);
    assert!(matches!(busy, Err(HandlerFailure::Trap(_))), "{busy:?}");
    match second {
        Err(HandlerFailure::Retry(r)) => assert!(r.starts_with("host at capacity"), "{r}"),
        other => panic!("expected a retry, got {other:?}"),
    }
    // Once the slot is free again, calls run.
    let r = call(Limits::default(), json!({"op": "reject"}), &db.database).await;
    assert!(matches!(r, Err(HandlerFailure::Reject(_))), "{r:?}");
}

#[tokio::test]
async fn a_module_from_another_runtime_is_refused() {
    let other = Runtime::new().unwrap();
    let db = db().await;
    let tx = db.database.begin().await.unwrap();
    let (r, _tx) = other
        .handle(
            &BEHAVE,
            &invocation(Limits::default()),
            tx,
            message(json!({"op": "reject"}), 1),
        )
        .await;
    assert!(matches!(r, Err(HandlerFailure::Trap(t)) if t.contains("another Runtime")));
}

#[tokio::test]
async fn credit_example_upserts_and_rejects_bad_json() {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let credit = RUNTIME
        .load(&target.join("guests/credit.wasm"), LoadOptions::default())
        .unwrap();
    let db = db().await;
    for payload in [
        json!({"event_id": "evt_8142", "account_id": 73, "amount": 500}),
        json!({"event_id": "evt_8143", "account_id": 73, "amount": -20}),
        json!({"account_id": "seventy-three"}),
    ] {
        let tx = db.database.begin().await.unwrap();
        let (r, tx) = RUNTIME
            .handle(
                &credit,
                &invocation(Limits::default()),
                tx,
                message(payload.clone(), 1),
            )
            .await;
        match r {
            Ok(_) => tx.commit().await.unwrap(),
            Err(HandlerFailure::Reject(reason)) => {
                assert!(reason.starts_with("not a credit event"), "{reason}");
                assert!(payload.get("event_id").is_none());
                tx.rollback().await.unwrap();
            }
            Err(other) => panic!("{payload}: {other}"),
        }
    }
    assert_eq!(balance(&db, 73).await, Some(480));
}

#[tokio::test]
async fn a_slow_statement_stops_at_the_deadline_not_the_budget() {
    let db = db().await;
    run(
        &db,
        Limits::default(),
        json!({"op": "credit", "account_id": 1, "amount": 1}),
        1,
    )
    .await
    .unwrap();
    let limits = Limits {
        deadline: Duration::from_millis(300),
        ..Limits::default()
    };
    // A budget far past the deadline: the statement runs on this task,
    // where only the store's interrupt at the deadline can stop it.
    let tx = db
        .database
        .begin_bounded(Duration::from_secs(60))
        .await
        .unwrap();
    let q = json!({"op": "query", "params": [],
        "sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c JOIN accounts"});
    let start = Instant::now();
    let (r, _tx) = RUNTIME
        .handle(&BEHAVE, &invocation(limits), tx, message(q, 1))
        .await;
    let took = start.elapsed();
    assert_eq!(
        r.map(drop),
        Err(HandlerFailure::Trap("exceeded the 300ms deadline".into()))
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[tokio::test]
async fn a_query_after_a_schema_change_reads_the_new_columns() {
    let db = db().await;
    run(
        &db,
        Limits::default(),
        json!({"op": "credit", "account_id": 9, "amount": 42}),
        1,
    )
    .await
    .unwrap();
    let q = json!({"op": "query", "sql": "SELECT * FROM accounts", "params": []});
    let reason = reject_reason(run(&db, Limits::default(), q.clone(), 1).await);
    assert_eq!(reason, r#"rows ["account_id","balance"] [[9,42]]"#);
    // Another connection changes the schema; the statement cached on the
    // transaction's connection is prepared again when it runs.
    sqlx::query("ALTER TABLE accounts ADD COLUMN note TEXT NOT NULL DEFAULT 'n'")
        .execute(&db.pool)
        .await
        .unwrap();
    let reason = reject_reason(run(&db, Limits::default(), q, 1).await);
    assert_eq!(
        reason,
        r#"rows ["account_id","balance","note"] [[9,42,"n"]]"#
    );
}
