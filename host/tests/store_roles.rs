//! PostgreSQL defence in depth: a handler's statements run as its own role,
//! which holds privileges on its granted tables only. A statement that got
//! past the SQL guard (here: a guard granting more than the role) still
//! meets PostgreSQL's permission check, seen by the guest as `denied`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_test_support::pg_url;

use idem::sql_guard::SqlGuard;
use idem::store::{Database, DbError, DbErrorKind, Receipt, SqlValue, StatementError};
use sqlx::AssertSqlSafe;

async fn raw(db: &Database, sql: &str) {
    let Some(p) = db.postgres_pool() else {
        unreachable!()
    };
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(p)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The error of a statement that failed while its transaction goes on.
fn failed<T: std::fmt::Debug>(r: Result<T, StatementError>) -> DbError {
    match r {
        Err(StatementError::Failed(e)) => e,
        other => panic!("expected a failed statement, got {other:?}"),
    }
}

#[tokio::test]
async fn handler_role_holds_only_its_granted_tables() {
    let db = Database::connect(&pg_url(), 2).await.unwrap();
    db.prepare_host_tables().await.unwrap();
    let n = format!(
        "{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    let (mine, secret, handler) = (
        format!("mine_{n}"),
        format!("secret_{n}"),
        format!("role-test-{n}"),
    );
    raw(
        &db,
        &format!("CREATE TABLE {mine} (id BIGSERIAL PRIMARY KEY, v BIGINT NOT NULL)"),
    )
    .await;
    raw(&db, &format!("CREATE TABLE {secret} (v BIGINT)")).await;
    raw(&db, &format!("INSERT INTO {secret} VALUES (42)")).await;

    let prepared = db
        .prepare_handler_role(&handler, std::slice::from_ref(&mine))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(prepared.others, Vec::<String>::new());
    let role = prepared.name.clone();
    // Twice: idempotent, as when several hosts start.
    assert_eq!(
        db.prepare_handler_role(&handler, std::slice::from_ref(&mine))
            .await
            .unwrap(),
        Some(prepared)
    );

    // The guard is told both tables are granted; the role knows better.
    let guard = SqlGuard::new(db.kind(), &[mine.clone(), secret.clone()]);
    let mut tx = db.begin().await.unwrap();
    let receipt = Receipt {
        consumer: &handler,
        message_id: "m1",
        stream_sequence: 1,
        module_digest: "d",
        published_ms: 1_700_000_000_000,
    };
    assert!(tx.insert_receipt(&receipt).await.unwrap());
    tx.enter_handler_role(&role).await.unwrap();

    // Its own table, serial column included (sequence usage granted).
    let ins = guard
        .check(
            &mut tx,
            &format!("INSERT INTO {mine} (v) VALUES ($1)"),
            &[SqlValue::Integer(7)],
        )
        .await
        .unwrap();
    assert_eq!(tx.execute(&ins, &[SqlValue::Integer(7)]).await.unwrap(), 1);
    // Another table: PostgreSQL refuses, the transaction goes on.
    let sel = guard
        .check(&mut tx, &format!("SELECT v FROM {secret}"), &[])
        .await
        .unwrap();
    let err = failed(tx.query(&sel, &[], 10, 1024).await);
    assert_eq!(err.kind, DbErrorKind::Denied, "{err:?}");
    let upd = guard
        .check(&mut tx, &format!("UPDATE {secret} SET v = 0"), &[])
        .await
        .unwrap();
    assert_eq!(
        failed(tx.execute(&upd, &[]).await).kind,
        DbErrorKind::Denied
    );
    tx.commit().await.unwrap();

    assert_eq!(db.receipt_count(&handler).await.unwrap(), 1);
    let Some(p) = db.postgres_pool() else {
        unreachable!()
    };
    let v: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT v FROM {mine}")))
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(v, 7);
    let s: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT v FROM {secret}")))
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(s, 42);
    // The role has no privilege on the host's tables.
    let has: bool = sqlx::query_scalar("SELECT has_table_privilege($1, 'idem_receipts', 'SELECT')")
        .bind(&role)
        .fetch_one(p)
        .await
        .unwrap();
    assert!(!has);

    sqlx::query("DELETE FROM idem_receipts WHERE consumer = $1")
        .bind(&handler)
        .execute(p)
        .await
        .unwrap();
    // Another config grants the same handler both tables (a host started
    // later, or `idem replay` with a newer config): it gets a role of its
    // own and names the first; the first keeps exactly its grant.
    let both = [mine.clone(), secret.clone()];
    let wider = db
        .prepare_handler_role(&handler, &both)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(wider.name, role);
    assert_eq!(wider.others, vec![format!("{role} ({mine})")]);
    let grants = |r: &str, t: &str| {
        sqlx::query_scalar::<_, bool>("SELECT has_table_privilege($1, $2, 'SELECT')")
            .bind(r.to_owned())
            .bind(t.to_owned())
            .fetch_one(p)
    };
    assert!(grants(&role, &mine).await.unwrap());
    assert!(!grants(&role, &secret).await.unwrap());
    assert!(grants(&wider.name, &secret).await.unwrap());
    // The first config's host starting again leaves the wider role alone.
    let again = db
        .prepare_handler_role(&handler, std::slice::from_ref(&mine))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (again.name.as_str(), again.others.clone()),
        (
            role.as_str(),
            vec![format!("{} ({mine}, {secret})", wider.name)]
        )
    );
    assert!(grants(&wider.name, &secret).await.unwrap());
    let wide = wider.name;
    raw(
        &db,
        &format!("DROP OWNED BY \"{wide}\"; DROP ROLE \"{wide}\""),
    )
    .await;
    raw(
        &db,
        &format!(
            "DROP TABLE {mine}; DROP TABLE {secret}; DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""
        ),
    )
    .await;
}

/// Role set-up and pruning take distinct advisory locks: a host setting up
/// roles while another prunes waits for neither, in both orders.
#[tokio::test]
async fn role_setup_and_pruning_do_not_wait_for_each_other() {
    use idem::store::advisory;
    use std::time::Duration;
    let keys = advisory::ALL;
    assert!(
        keys.iter()
            .enumerate()
            .all(|(i, k)| !keys[i + 1..].contains(k)),
        "{keys:x?}"
    );
    let db = Database::connect(&pg_url(), 4).await.unwrap();
    db.prepare_host_tables().await.unwrap();
    let table = format!("lock_probe_{}", std::process::id());
    raw(
        &db,
        &format!("CREATE TABLE IF NOT EXISTS {table} (id BIGINT PRIMARY KEY)"),
    )
    .await;
    let handler = format!("lock_probe_{}", std::process::id());
    // A prune pass holds its lock: role set-up goes ahead.
    let prune = db.try_prune_lock().await.unwrap().expect("no other pruner");
    let role = tokio::time::timeout(
        Duration::from_secs(10),
        db.prepare_handler_role(&handler, std::slice::from_ref(&table)),
    )
    .await
    .expect("role set-up waited for the prune lock")
    .unwrap();
    let name = idem::store::handler_role(&handler, std::slice::from_ref(&table));
    assert_eq!(role.map(|r| r.name), Some(name.clone()));
    prune.release().await.unwrap();
    // Role set-up holds its lock (another session, mid-transaction): a
    // prune pass gets its own.
    let Some(pool) = db.postgres_pool() else {
        unreachable!()
    };
    let mut setup = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(advisory::ROLE_SETUP)
        .execute(&mut *setup)
        .await
        .unwrap();
    let prune = db.try_prune_lock().await.unwrap();
    assert!(prune.is_some(), "the prune lock is taken by role set-up");
    prune.unwrap().release().await.unwrap();
    setup.rollback().await.unwrap();
    raw(&db, &format!("DROP TABLE {table}")).await;
    raw(&db, &format!("DROP ROLE {name}")).await;
}

/// The switch to the handler's role can fail where no savepoint covers it:
/// sent with the SQL guard's catalog query (a statement naming `t.col` the
/// guard has not seen), for a role dropped under a running host. PostgreSQL
/// then aborts the transaction and would answer COMMIT with ROLLBACK and no
/// error; a guest that ignores the guard's error and returns ok must not
/// get its message acked as committed: COMMIT refuses, nothing is kept.
#[tokio::test]
async fn a_transaction_a_failed_role_switch_aborted_is_not_committed() {
    let db = Database::connect(&pg_url(), 2).await.unwrap();
    db.prepare_host_tables().await.unwrap();
    let n = format!("{}_{}", std::process::id(), line!());
    let t = format!("aborted_{n}");
    raw(
        &db,
        &format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (id BIGINT PRIMARY KEY, amount BIGINT)"
        ),
    )
    .await;
    let consumer = format!("aborted_{n}");
    let guard = SqlGuard::new(idem::store::DbKind::Postgres, std::slice::from_ref(&t));
    let mut tx = db
        .begin_bounded(std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let receipt = Receipt {
        consumer: &consumer,
        message_id: "m1",
        stream_sequence: 1,
        module_digest: "d",
        published_ms: 1,
    };
    assert!(tx.insert_receipt(&receipt).await.unwrap());
    tx.enter_handler_role(&format!("idem_no_such_role_{n}"))
        .await
        .unwrap();
    let verdict = guard
        .check(
            &mut tx,
            &format!("UPDATE {t} SET amount = 1 WHERE {t}.id = $1"),
            &[SqlValue::Integer(1)],
        )
        .await
        .unwrap_err();
    assert_eq!(verdict.kind, DbErrorKind::Other, "{verdict:?}");
    assert!(
        verdict
            .message
            .starts_with("cannot switch to the handler's role: "),
        "{verdict:?}"
    );
    let commit = tx.commit().await.unwrap_err().to_string();
    assert!(
        commit.starts_with(
            "database error: rolled back, not committed: the switch to the handler's role failed"
        ),
        "{commit}"
    );
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 0);
    raw(&db, &format!("DROP TABLE {t}")).await;
}
