//! The SQLite judge on a real SQLite file: SQLite's own compiler and an
//! authorizer decide what a guest statement touches, so quoting, comments,
//! CTE names, views and triggers are read exactly as SQLite reads them.
//! Each case is judged inside an open transaction, as in `idem run`, and the
//! verdict is exact; statements that pass are then run and their effect
//! checked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::sql_guard::SqlGuard;
use idem::store::{Database, DbErrorKind, SqlValue, StatementError, Tx};
use sqlx::AssertSqlSafe;

struct Lite {
    db: Database,
    _dir: tempfile::TempDir,
}

const SETUP: &[&str] = &[
    "CREATE TABLE accounts (account_id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
    "INSERT INTO accounts VALUES (1, 100)",
    "CREATE TABLE secrets (v TEXT)",
    "INSERT INTO secrets VALUES ('CANARY')",
    "CREATE TABLE strict_ids (id INTEGER PRIMARY KEY ON CONFLICT ROLLBACK)",
    "CREATE TABLE audited (id INTEGER PRIMARY KEY)",
    "CREATE TABLE audit (id INTEGER)",
    "CREATE TRIGGER audited_log AFTER INSERT ON audited BEGIN INSERT INTO audit VALUES (new.id); END",
    "CREATE TABLE guarded (id INTEGER PRIMARY KEY)",
    "CREATE TRIGGER guarded_no AFTER INSERT ON guarded WHEN new.id < 0 BEGIN SELECT RAISE(ROLLBACK, 'no'); END",
    "CREATE VIEW secret_view AS SELECT v FROM secrets",
];

async fn lite() -> Lite {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let db = Database::connect(&url, 2).await.unwrap();
    db.prepare_host_tables().await.unwrap();
    let Some(pool) = db.sqlite_pool() else {
        unreachable!()
    };
    for sql in SETUP {
        sqlx::raw_sql(AssertSqlSafe(*sql))
            .execute(pool)
            .await
            .unwrap();
    }
    Lite { db, _dir: dir }
}

fn guard() -> SqlGuard {
    let granted = [
        "accounts",
        "strict_ids",
        "audited",
        "guarded",
        "secret_view",
    ];
    SqlGuard::new(idem::store::DbKind::Sqlite, &granted.map(str::to_string))
}

/// A judge's verdict: the parameter count, or the refusal's kind and message.
type Verdict = Result<usize, (DbErrorKind, String)>;

async fn verdict(tx: &mut Tx, sql: &str) -> Verdict {
    guard()
        .check(tx, sql, &[])
        .await
        .map(|c| {
            assert_eq!(c.as_str(), sql, "runs exactly the judged text");
            c.param_count()
        })
        .map_err(|e| (e.kind, e.message))
}

const NOT_GRANTED_SECRETS: &str =
    "table `secrets` is not granted to this handler; grant it in [[handler]] tables";

#[tokio::test]
async fn sqlite_judges_by_its_own_grammar() {
    let l = lite().await;
    let mut tx = l.db.begin().await.unwrap();
    let denied = |m: &str| Err((DbErrorKind::Denied, m.to_string()));
    let cases: Vec<(&str, Verdict)> = vec![
        ("SELECT balance FROM accounts WHERE account_id = $1", Ok(1)),
        (
            "select balance from ACCOUNTS where account_id = $2 and $1 = 1;",
            Ok(2),
        ),
        ("SELECT 1", Ok(0)),
        ("SELECT 1; -- trailing comment", Ok(0)),
        ("SELECT 1 /* block */ ;;  ", Ok(0)),
        // A CTE named like a table is the CTE where SQLite resolves it so.
        (
            "WITH secrets AS (SELECT 1 AS v) SELECT v FROM secrets",
            Ok(0),
        ),
        (
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 5) SELECT n FROM r",
            Ok(0),
        ),
        (
            "INSERT INTO accounts (account_id, balance) VALUES ($1, $2) ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance",
            Ok(2),
        ),
        ("INSERT OR IGNORE INTO accounts VALUES (2, 0)", Ok(0)),
        (
            "UPDATE accounts SET balance = abs(balance) WHERE account_id IN (SELECT account_id FROM accounts)",
            Ok(0),
        ),
        // Backslash is no escape in SQLite and '' is a quote: each is one
        // string literal (run below: one harmless row).
        (
            r"SELECT '\'' AS a UNION ALL SELECT v FROM secrets --'",
            Ok(0),
        ),
        (r"SELECT '\''; DELETE FROM idem_receipts; --'", Ok(0)),
        // An unused CTE is never read: SQLite asks nothing about it.
        ("WITH s AS (SELECT v FROM secrets) SELECT 1", Ok(0)),
        (
            "WITH s AS (SELECT v FROM secrets) SELECT v FROM s",
            denied(
                "table `secrets` is not granted to this handler; grant it in [[handler]] tables (reached through `s`)",
            ),
        ),
        (
            "SELECT 1; DELETE FROM accounts",
            denied("more than one statement in one call (or text after it); send exactly one"),
        ),
        (
            "SELECT 1;;SELECT 2",
            denied("more than one statement in one call (or text after it); send exactly one"),
        ),
        (";", denied("empty statement; send exactly one")),
        (
            "-- only a comment",
            denied("empty statement; send exactly one"),
        ),
        ("SELECT v FROM secrets", denied(NOT_GRANTED_SECRETS)),
        ("SELECT count(*) FROM secrets", denied(NOT_GRANTED_SECRETS)),
        (
            "SELECT count(*) FROM sqlite_master",
            denied("`sqlite_master` names a system catalog; handlers cannot read catalogs"),
        ),
        (
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 3) SELECT count(*) FROM r",
            Ok(0),
        ),
        ("SELECT count(*) FROM (SELECT 1) AS sub", Ok(0)),
        (
            "SELECT accounts.* FROM accounts, secrets",
            denied(NOT_GRANTED_SECRETS),
        ),
        (
            "SELECT * FROM (SELECT 1) JOIN secrets",
            denied(NOT_GRANTED_SECRETS),
        ),
        (
            "UPDATE accounts SET balance = (SELECT length(v) FROM secrets)",
            denied(NOT_GRANTED_SECRETS),
        ),
        (
            "SELECT v FROM secret_view",
            denied(
                "table `secrets` is not granted to this handler; grant it in [[handler]] tables (reached through `secret_view`)",
            ),
        ),
        (
            "SELECT count(*) FROM idem_receipts",
            denied(
                "`idem_receipts` names a host table; idem_* tables are never reachable from a handler",
            ),
        ),
        (
            "SELECT name FROM sqlite_master",
            denied("`sqlite_master` names a system catalog; handlers cannot read catalogs"),
        ),
        (
            "SELECT name FROM main.sqlite_schema",
            denied("`sqlite_master` names a system catalog; handlers cannot read catalogs"),
        ),
        (
            "INSERT INTO audited VALUES (1)",
            denied(
                "table `audit` is not granted to this handler; grant it in [[handler]] tables (reached through `audited_log`)",
            ),
        ),
        (
            "INSERT OR ROLLBACK INTO accounts (account_id, balance) VALUES (1, 0)",
            denied(
                "a conflict resolution of ROLLBACK would end the host's transaction; use ABORT, FAIL, IGNORE or REPLACE (or catch the error)",
            ),
        ),
        (
            "INSERT INTO strict_ids VALUES (1)",
            denied(
                "a conflict resolution of ROLLBACK would end the host's transaction; use ABORT, FAIL, IGNORE or REPLACE (or catch the error)",
            ),
        ),
        (
            "INSERT INTO guarded VALUES (1)",
            denied(
                "a conflict resolution of ROLLBACK would end the host's transaction; use ABORT, FAIL, IGNORE or REPLACE (or catch the error)",
            ),
        ),
        (
            "UPDATE OR ROLLBACK accounts SET balance = 0",
            denied(
                "a conflict resolution of ROLLBACK would end the host's transaction; use ABORT, FAIL, IGNORE or REPLACE (or catch the error)",
            ),
        ),
        (
            "SELECT zeroblob(2000000000)",
            denied(
                "function `zeroblob` is not allowed in handler SQL (allowed: abs, avg, coalesce, count, greatest, least, length, lower, ltrim, max, min, nullif, replace, round, rtrim, substr, substring, sum, trim, upper)",
            ),
        ),
        (
            "PRAGMA writable_schema = 1",
            denied(
                "PRAGMA statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "ATTACH DATABASE 'x.db' AS x",
            denied(
                "ATTACH statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "COMMIT",
            denied(
                "COMMIT statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "SAVEPOINT x",
            denied(
                "SAVEPOINT statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "CREATE TEMP TABLE t (x)",
            denied(
                "CREATE, DROP and ALTER statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "DROP TABLE accounts",
            denied(
                "CREATE, DROP and ALTER statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "VACUUM",
            denied(
                "VACUUM statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "VACUUM INTO 'copy.db'",
            denied(
                "VACUUM statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "ALTER TABLE accounts ADD COLUMN x",
            denied(
                "ALTER statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "DETACH x",
            denied(
                "DETACH statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "BEGIN",
            denied(
                "BEGIN statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "ROLLBACK TO x",
            denied(
                "ROLLBACK TO statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "SELECT load_extension('x')",
            denied(
                "function `load_extension` is not allowed in handler SQL (allowed: abs, avg, coalesce, count, greatest, least, length, lower, ltrim, max, min, nullif, replace, round, rtrim, substr, substring, sum, trim, upper)",
            ),
        ),
        ("REPLACE INTO accounts VALUES (1, 5)", Ok(0)),
        (
            "SELECT a.balance FROM accounts AS a WHERE a.account_id LIKE '1%'",
            Ok(0),
        ),
        (
            "EXPLAIN SELECT 1",
            denied(
                "EXPLAIN statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
            ),
        ),
        (
            "SELECT ?",
            denied("placeholder `?` is not supported; write parameters as $1..$n (at most $65535)"),
        ),
        (
            "SELECT :a",
            denied(
                "placeholder `:a` is not supported; write parameters as $1..$n (at most $65535)",
            ),
        ),
    ];
    let mut wrong = Vec::new();
    for (sql, want) in &cases {
        let got = verdict(&mut tx, sql).await;
        if &got != want {
            wrong.push(format!("{sql}\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // What passed runs as SQLite read it: one string literal, no canary.
    let g = guard();
    let q = g
        .check(
            &mut tx,
            r"SELECT '\'' AS a UNION ALL SELECT v FROM secrets --'",
            &[],
        )
        .await
        .unwrap();
    let rows = tx.query(&q, &[], 10, 1 << 20).await.unwrap();
    assert_eq!(
        rows.rows,
        vec![vec![SqlValue::Text(
            r"\' AS a UNION ALL SELECT v FROM secrets --".into()
        )]]
    );
    // Nothing ran while judging.
    tx.rollback().await.unwrap();
    let Some(pool) = l.db.sqlite_pool() else {
        unreachable!()
    };
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert!(!l._dir.path().join("copy.db").exists());
    assert!(!l._dir.path().join("x.db").exists());
}

#[tokio::test]
async fn sqlite_compile_errors_are_syntax() {
    let l = lite().await;
    let mut tx = l.db.begin().await.unwrap();
    for (sql, want) in [
        (
            "SELEC 1",
            "statement does not compile: near \"SELEC\": syntax error (SQLite code 1)",
        ),
        (
            "SELECT nope FROM accounts",
            "statement does not compile: no such column: nope (SQLite code 1)",
        ),
        (
            "SELECT 1 FROM missing",
            "statement does not compile: no such table: missing (SQLite code 1)",
        ),
    ] {
        assert_eq!(
            verdict(&mut tx, sql).await,
            Err((DbErrorKind::Syntax, want.to_string())),
            "{sql}"
        );
    }
}

#[tokio::test]
async fn sqlite_values_are_bounded_while_the_guest_runs() {
    let l = lite().await;
    let mut tx = l.db.begin().await.unwrap();
    tx.bound_guest_values(1000).await.unwrap();
    let g = guard();
    let big = SqlValue::Text("x".repeat(2000));
    let ins = g
        .check(
            &mut tx,
            "UPDATE accounts SET balance = length($1)",
            std::slice::from_ref(&big),
        )
        .await
        .unwrap();
    match tx.execute(&ins, &[big]).await {
        Err(StatementError::Failed(e)) => {
            assert_eq!(e.kind, DbErrorKind::Other);
            assert!(e.message.contains("too big"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    let small = SqlValue::Text("x".repeat(900));
    assert_eq!(tx.execute(&ins, &[small]).await.unwrap(), 1);
    // A doubling recursive CTE stops at the bound inside SQLite.
    let q = g
        .check(
            &mut tx,
            "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r LIMIT 40) SELECT length(s) FROM r",
            &[],
        )
        .await
        .unwrap();
    match tx.query(&q, &[], 100, 1 << 20).await {
        Err(StatementError::Failed(e)) => assert!(e.message.contains("too big"), "{}", e.message),
        other => panic!("{other:?}"),
    }
    tx.rollback().await.unwrap();
    // The bound ends with the transaction: the host's own writes are not held to it.
    let Some(pool) = l.db.sqlite_pool() else {
        unreachable!()
    };
    sqlx::query("INSERT INTO secrets VALUES ($1)")
        .bind("y".repeat(5000))
        .execute(pool)
        .await
        .unwrap();
}

/// A foreign key's check reads the parent table inside SQLite; that is the
/// schema's rule, not the handler's read: a write to a granted child table
/// passes without the parent granted, the constraint still holds (deferred:
/// at COMMIT), and reading the parent in the statement itself is refused.
#[tokio::test]
async fn sqlite_foreign_key_checks_are_not_reads_of_the_parent() {
    let l = lite().await;
    let Some(pool) = l.db.sqlite_pool() else {
        unreachable!()
    };
    for sql in [
        "CREATE TABLE parents (id INTEGER PRIMARY KEY)",
        "INSERT INTO parents VALUES (1)",
        "CREATE TABLE children (id INTEGER PRIMARY KEY, parent_id INTEGER NOT NULL \
         REFERENCES parents (id))",
        "CREATE TABLE late_children (id INTEGER PRIMARY KEY, parent_id INTEGER NOT NULL \
         REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)",
    ] {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(pool)
            .await
            .unwrap();
    }
    let g = SqlGuard::new(
        idem::store::DbKind::Sqlite,
        &["children".to_string(), "late_children".to_string()],
    );
    let mut tx = l.db.begin().await.unwrap();
    let ok = g
        .check(&mut tx, "INSERT INTO children VALUES (10, 1)", &[])
        .await
        .unwrap();
    assert_eq!(tx.execute(&ok, &[]).await.unwrap(), 1);
    // Enforced at once (immediate constraint), and the transaction goes on.
    let orphan = g
        .check(&mut tx, "INSERT INTO children VALUES (11, 999)", &[])
        .await
        .unwrap();
    match tx.execute(&orphan, &[]).await {
        Err(StatementError::Failed(e)) => {
            assert!(e.message.contains("FOREIGN KEY"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    let moved = g
        .check(
            &mut tx,
            "UPDATE children SET parent_id = 1 WHERE id = 10",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(tx.execute(&moved, &[]).await.unwrap(), 1);
    for sql in [
        "INSERT INTO children SELECT 12, id FROM parents",
        "SELECT id FROM parents",
        "DELETE FROM parents",
    ] {
        let e = g.check(&mut tx, sql, &[]).await.unwrap_err();
        assert_eq!(
            (e.kind, e.message.as_str()),
            (
                DbErrorKind::Denied,
                "table `parents` is not granted to this handler; grant it in [[handler]] tables"
            ),
            "{sql}"
        );
    }
    tx.commit().await.unwrap();
    // Deferred: the statement passes, the COMMIT fails.
    let mut tx = l.db.begin().await.unwrap();
    let late = g
        .check(&mut tx, "INSERT INTO late_children VALUES (1, 999)", &[])
        .await
        .unwrap();
    assert_eq!(tx.execute(&late, &[]).await.unwrap(), 1);
    let e = tx.commit().await.unwrap_err().to_string();
    assert!(e.contains("FOREIGN KEY"), "{e}");
    let n: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM children), (SELECT count(*) FROM late_children)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(n, (1, 0));
}
