//! Guest statements through `Tx::execute` / `Tx::query` on real PostgreSQL
//! and SQLite: parameter binding, value decoding, error kinds, per-statement
//! savepoints and the row and byte bounds. Every test runs on both databases
//! unless its name says `pg_`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::raw;
use idem_test_support::{pg_url, pg_url_as, unique};

use idem::sql_guard::{CheckedSql, SqlGuard};
use idem::store::{
    Database, DbError, DbErrorKind, DbKind, Receipt, Rows, SqlValue, StatementError, Tx,
};
use std::time::Duration;

/// A byte bound no test query comes near (`Tx::query`'s `max_bytes`).
const MAX_BYTES: usize = 1 << 20;

/// `sql` judged as it will run in `tx` with values of `params`' types, with
/// only `table` granted; panics when it is refused.
async fn check(
    db: &Database,
    tx: &mut Tx,
    table: &str,
    sql: &str,
    params: &[SqlValue],
) -> CheckedSql {
    SqlGuard::new(db.kind(), &[table.to_string()])
        .check(tx, sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
}

/// Why `sql` is refused when judged in `tx` (only `table` granted); panics
/// when it passes.
async fn refused(db: &Database, tx: &mut Tx, table: &str, sql: &str) -> DbError {
    match SqlGuard::new(db.kind(), &[table.to_string()])
        .check(tx, sql, &[])
        .await
    {
        Ok(c) => panic!("{sql}: passed as {:?}", c.as_str()),
        Err(e) => e,
    }
}

/// The error of a statement that failed while its transaction goes on;
/// panics on success or on a lost transaction.
fn failed<T: std::fmt::Debug>(r: Result<T, StatementError>) -> DbError {
    match r {
        Err(StatementError::Failed(e)) => e,
        other => panic!("expected a failed statement, got {other:?}"),
    }
}

fn int(i: i64) -> SqlValue {
    SqlValue::Integer(i)
}

fn text(s: &str) -> SqlValue {
    SqlValue::Text(s.to_string())
}

/// A fresh database of `kind`: a pool on the PostgreSQL of `pg_url()`, or
/// a SQLite file in a temporary directory (which the second value keeps).
async fn fresh(kind: DbKind) -> (Database, Option<tempfile::TempDir>) {
    match kind {
        DbKind::Postgres => (Database::connect(&pg_url(), 4).await.unwrap(), None),
        DbKind::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("idem.db").display());
            (Database::connect(&url, 4).await.unwrap(), Some(dir))
        }
    }
}

/// Runs `body` on a fresh database of every kind the tests run on
/// ([`idem_test_support::with_backends!`]): tests `NAME::postgres`,
/// `NAME::sqlite`.
macro_rules! on_both {
    ($name:ident, $body:ident) => {
        idem_test_support::with_backends!([on_each_backend] $name, $body);
    };
}

/// [`on_both!`]'s expansion, given the list of databases.
macro_rules! on_each_backend {
    ($([$module:ident $variant:ident])* $name:ident, $body:ident) => {
        mod $name {
            $(
                #[tokio::test]
                async fn $module() {
                    let (db, _dir) = super::fresh(super::DbKind::$variant).await;
                    super::$body(&db, &super::unique("st")).await;
                }
            )*
        }
    };
}

/// A table both databases accept, with every kind of constraint.
async fn create_table(db: &Database, t: &str) {
    raw(
        db,
        &format!(
            "CREATE TABLE {t} (id BIGINT PRIMARY KEY, name TEXT NOT NULL, amount BIGINT CHECK (amount >= 0),
             parent BIGINT REFERENCES {t}(id))"
        ),
    )
    .await;
}

async fn select_all(tx: &mut Tx, db: &Database, t: &str) -> Rows {
    let q = check(
        db,
        tx,
        t,
        &format!("SELECT id, name, amount FROM {t} ORDER BY id"),
        &[],
    )
    .await;
    tx.query(&q, &[], 100, MAX_BYTES).await.unwrap()
}

on_both!(params_bind_by_number, params_bind_by_number);
async fn params_bind_by_number(db: &Database, t: &str) {
    create_table(db, t).await;
    let mut tx = db.begin().await.unwrap();
    // $2 appears before $1: each must take its own argument.
    let p = [int(7), text("seven"), int(70)];
    let ins = check(
        db,
        &mut tx,
        t,
        &format!("INSERT INTO {t} (name, id, amount) VALUES ($2, $1, $3)"),
        &p,
    )
    .await;
    assert_eq!(tx.execute(&ins, &p).await.unwrap(), 1);
    let p = [int(7), int(70)];
    let q = check(
        db,
        &mut tx,
        t,
        &format!("SELECT name, amount FROM {t} WHERE amount = $2 AND id = $1"),
        &p,
    )
    .await;
    let rows = tx.query(&q, &p, 10, MAX_BYTES).await.unwrap();
    assert_eq!(rows.columns, vec!["name", "amount"]);
    assert_eq!(rows.rows, vec![vec![text("seven"), int(70)]]);
    // One statement text, different parameter types, in one transaction:
    // each type signature is checked for its own (on PostgreSQL the checked
    // text names the types; on SQLite it is the text as given).
    let sql = format!("SELECT count(*) FROM {t} WHERE name = $1 OR $1 IS NULL");
    for (p, n, letter) in [
        (text("seven"), 1, "t"),
        (text("x"), 0, "t"),
        (SqlValue::Null, 1, "n"),
    ] {
        let p = [p];
        let q = check(db, &mut tx, t, &sql, &p).await;
        let judged = match db.kind() {
            DbKind::Postgres => format!("{sql}\n-- idem:{letter}"),
            DbKind::Sqlite => sql.clone(),
        };
        assert_eq!(q.as_str(), judged);
        let rows = tx.query(&q, &p, 10, MAX_BYTES).await.unwrap();
        assert_eq!(rows.rows, vec![vec![int(n)]]);
    }
    // NULL binds into integer and text columns alike.
    let p = [int(8), text("eight"), SqlValue::Null];
    let ins = check(
        db,
        &mut tx,
        t,
        &format!("INSERT INTO {t} (id, name, amount) VALUES ($1, $2, $3)"),
        &p,
    )
    .await;
    assert_eq!(tx.execute(&ins, &p).await.unwrap(), 1);
    let p = [int(5), int(7)];
    let upd = check(
        db,
        &mut tx,
        t,
        &format!("UPDATE {t} SET amount = $1 WHERE id >= $2"),
        &p,
    )
    .await;
    assert_eq!(tx.execute(&upd, &p).await.unwrap(), 2);
    assert_eq!(
        select_all(&mut tx, db, t).await.rows,
        vec![
            vec![int(7), text("seven"), int(5)],
            vec![int(8), text("eight"), int(5)]
        ]
    );
    // The wrong number of parameters is refused before the database.
    let e = failed(tx.execute(&ins, &[int(9)]).await);
    assert_eq!(e.kind, DbErrorKind::Other);
    assert_eq!(
        e.message,
        "the statement has 3 parameter(s) ($1..$n) but 1 value(s) were given"
    );
    // No row: no columns either.
    let p = [int(99)];
    let q = check(
        db,
        &mut tx,
        t,
        &format!("SELECT id FROM {t} WHERE id = $1"),
        &p,
    )
    .await;
    assert_eq!(
        tx.query(&q, &p, 10, MAX_BYTES).await.unwrap(),
        Rows::default()
    );
    tx.rollback().await.unwrap();
    raw(db, &format!("DROP TABLE {t}")).await;
}

on_both!(values_decode, values_decode);
async fn values_decode(db: &Database, t: &str) {
    let ddl = match db.kind() {
        DbKind::Postgres => format!(
            "CREATE TABLE {t} (i2 SMALLINT, i4 INTEGER, i8 BIGINT, f4 REAL, f8 DOUBLE PRECISION, tx TEXT,
             vc VARCHAR(10), bp CHAR(3), bt BYTEA, bo BOOLEAN, nu NUMERIC)"
        ),
        DbKind::Sqlite => format!(
            "CREATE TABLE {t} (i2 SMALLINT, i4 INTEGER, i8 BIGINT, f4 REAL, f8 DOUBLE, tx TEXT,
             vc VARCHAR(10), bp CHAR(3), bt BLOB, bo BOOLEAN, nu NUMERIC)"
        ),
    };
    raw(db, &ddl).await;
    let mut tx = db.begin().await.unwrap();
    let ins_sql = format!(
        "INSERT INTO {t} (i2, i4, i8, f4, f8, tx, vc, bp, bt, bo, nu) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
    );
    let params = vec![
        int(-2),
        int(2_147_483_647),
        int(i64::MIN),
        SqlValue::Float(1.5),
        SqlValue::Float(-0.25),
        text("héllo"),
        text("vc"),
        text("ab"),
        SqlValue::Bytes(vec![0, 255, 7]),
        SqlValue::Boolean(true),
        int(12),
    ];
    let ins = check(db, &mut tx, t, &ins_sql, &params).await;
    assert_eq!(tx.execute(&ins, &params).await.unwrap(), 1);
    let nulls = vec![SqlValue::Null; 11];
    let ins = check(db, &mut tx, t, &ins_sql, &nulls).await;
    assert_eq!(tx.execute(&ins, &nulls).await.unwrap(), 1);
    let q = check(
        db,
        &mut tx,
        t,
        &format!("SELECT i2, i4, i8, f4, f8, tx, vc, bp, bt, bo FROM {t} ORDER BY i2 NULLS LAST"),
        &[],
    )
    .await;
    let rows = tx.query(&q, &[], 10, MAX_BYTES).await.unwrap();
    assert_eq!(
        rows.columns,
        vec!["i2", "i4", "i8", "f4", "f8", "tx", "vc", "bp", "bt", "bo"]
    );
    let boolean = match db.kind() {
        DbKind::Postgres => SqlValue::Boolean(true),
        DbKind::Sqlite => int(1), // SQLite stores booleans as INTEGER
    };
    let padded = match db.kind() {
        DbKind::Postgres => text("ab "), // CHAR(3) pads
        DbKind::Sqlite => text("ab"),
    };
    assert_eq!(
        rows.rows,
        vec![
            vec![
                int(-2),
                int(2_147_483_647),
                int(i64::MIN),
                SqlValue::Float(1.5),
                SqlValue::Float(-0.25),
                text("héllo"),
                text("vc"),
                padded,
                SqlValue::Bytes(vec![0, 255, 7]),
                boolean,
            ],
            vec![SqlValue::Null; 10],
        ]
    );
    let q = check(
        db,
        &mut tx,
        t,
        &format!("SELECT nu FROM {t} ORDER BY i2 NULLS LAST"),
        &[],
    )
    .await;
    match db.kind() {
        DbKind::Postgres => {
            let e = failed(tx.query(&q, &[], 10, MAX_BYTES).await);
            assert_eq!(e.kind, DbErrorKind::Other);
            assert_eq!(
                e.message,
                "column `nu` has type NUMERIC; cast it in SQL (e.g. ::text or ::bigint)"
            );
            let q = check(
                db,
                &mut tx,
                t,
                &format!("SELECT nu::bigint AS n, nu::text AS s FROM {t} ORDER BY i2 NULLS LAST"),
                &[],
            )
            .await;
            let rows = tx.query(&q, &[], 10, MAX_BYTES).await.unwrap();
            assert_eq!(
                rows.rows,
                vec![
                    vec![int(12), text("12")],
                    vec![SqlValue::Null, SqlValue::Null]
                ]
            );
        }
        DbKind::Sqlite => {
            let rows = tx.query(&q, &[], 10, MAX_BYTES).await.unwrap();
            assert_eq!(rows.rows, vec![vec![int(12)], vec![SqlValue::Null]]);
            // Storage class, not declared type: a REAL column holding an integer value.
            let p = [SqlValue::Bytes(b"x".to_vec())];
            let q = check(
                db,
                &mut tx,
                t,
                &format!("SELECT tx, 1.0 * i2 AS r, $1 AS p FROM {t} WHERE i2 = -2"),
                &p,
            )
            .await;
            let rows = tx.query(&q, &p, 10, MAX_BYTES).await.unwrap();
            assert_eq!(
                rows.rows,
                vec![vec![
                    text("héllo"),
                    SqlValue::Float(-2.0),
                    SqlValue::Bytes(b"x".to_vec())
                ]]
            );
        }
    }
    tx.rollback().await.unwrap();
    raw(db, &format!("DROP TABLE {t}")).await;
}

on_both!(error_kinds, error_kinds);
async fn error_kinds(db: &Database, t: &str) {
    create_table(db, t).await;
    let mut tx = db.begin().await.unwrap();
    let ins_sql = format!("INSERT INTO {t} (id, name, amount, parent) VALUES ($1, $2, $3, $4)");
    let row = |id: i64, name: SqlValue, amount: i64, parent: SqlValue| {
        vec![int(id), name, int(amount), parent]
    };
    let first = row(1, text("a"), 10, SqlValue::Null);
    let ins = check(db, &mut tx, t, &ins_sql, &first).await;
    assert_eq!(tx.execute(&ins, &first).await.unwrap(), 1);
    let cases = [
        (
            row(1, text("dup"), 10, SqlValue::Null),
            DbErrorKind::UniqueViolation,
        ),
        (
            row(2, SqlValue::Null, 10, SqlValue::Null),
            DbErrorKind::ConstraintViolation,
        ),
        (
            row(3, text("c"), -1, SqlValue::Null),
            DbErrorKind::ConstraintViolation,
        ),
        (
            row(4, text("d"), 1, int(999)),
            DbErrorKind::ConstraintViolation,
        ),
    ];
    for (params, kind) in cases {
        let ins = check(db, &mut tx, t, &ins_sql, &params).await;
        let e = failed(tx.execute(&ins, &params).await);
        assert_eq!(e.kind, kind, "{params:?}: {}", e.message);
        assert!(!e.message.contains('\n'));
    }
    // The message names the code it was classified by.
    let dup = row(1, text("dup"), 10, SqlValue::Null);
    let ins = check(db, &mut tx, t, &ins_sql, &dup).await;
    let e = failed(tx.execute(&ins, &dup).await);
    let code = match db.kind() {
        DbKind::Postgres => "(SQLSTATE 23505)",
        DbKind::Sqlite => "(SQLite code 1555)",
    };
    assert!(e.message.ends_with(code), "{}", e.message);
    // Unknown column: PostgreSQL's parser does not resolve names, so it
    // fails when it runs (Other); SQLite compiles the statement to judge it,
    // so it is refused at check (Syntax).
    let bad = format!("SELECT nope FROM {t}");
    match db.kind() {
        DbKind::Postgres => {
            let bad = check(db, &mut tx, t, &bad, &[]).await;
            assert_eq!(
                failed(tx.query(&bad, &[], 10, MAX_BYTES).await).kind,
                DbErrorKind::Other
            );
        }
        DbKind::Sqlite => {
            let e = refused(db, &mut tx, t, &bad).await;
            assert_eq!(e.kind, DbErrorKind::Syntax);
            assert_eq!(
                e.message,
                "statement does not compile: no such column: nope (SQLite code 1)"
            );
        }
    }
    // The other database's dialect: the database's own grammar refuses it
    // at check.
    let e = match db.kind() {
        DbKind::Postgres => {
            refused(
                db,
                &mut tx,
                t,
                &format!("INSERT OR REPLACE INTO {t} VALUES (1, 'x', 1, NULL)"),
            )
            .await
        }
        DbKind::Sqlite => refused(db, &mut tx, t, &format!("SELECT id FROM {t} FOR UPDATE")).await,
    };
    assert_eq!(e.kind, DbErrorKind::Syntax, "{}", e.message);
    assert!(!e.message.contains('\n'), "{}", e.message);
    if db.kind() == DbKind::Sqlite {
        assert_eq!(
            e.message,
            "statement does not compile: near \"UPDATE\": syntax error (SQLite code 1)"
        );
    }
    // After all these failures the transaction goes on, and commits them not.
    let last = row(2, text("b"), 20, int(1));
    let ins = check(db, &mut tx, t, &ins_sql, &last).await;
    assert_eq!(tx.execute(&ins, &last).await.unwrap(), 1);
    tx.commit().await.unwrap();
    let mut tx = db.begin().await.unwrap();
    assert_eq!(
        select_all(&mut tx, db, t).await.rows,
        vec![
            vec![int(1), text("a"), int(10)],
            vec![int(2), text("b"), int(20)]
        ]
    );
    tx.rollback().await.unwrap();
    raw(db, &format!("DROP TABLE {t}")).await;
}

on_both!(receipt_survives_guest_errors, receipt_survives_guest_errors);
/// A handler that catches a unique violation and returns ok: the receipt and
/// its other writes commit (on PostgreSQL this needs the per-statement savepoint).
async fn receipt_survives_guest_errors(db: &Database, t: &str) {
    db.prepare_host_tables().await.unwrap();
    create_table(db, t).await;
    let consumer = unique("c");
    let mut tx = db.begin().await.unwrap();
    let receipt = Receipt {
        consumer: &consumer,
        message_id: "m1",
        stream_sequence: 1,
        module_digest: "d",
        published_ms: 1_700_000_000_000,
    };
    assert!(tx.insert_receipt(&receipt).await.unwrap());
    let ins = check(
        db,
        &mut tx,
        t,
        &format!("INSERT INTO {t} (id, name) VALUES ($1, $2)"),
        &[int(1), text("a")],
    )
    .await;
    tx.execute(&ins, &[int(1), text("a")]).await.unwrap();
    let e = failed(tx.execute(&ins, &[int(1), text("again")]).await);
    assert_eq!(e.kind, DbErrorKind::UniqueViolation);
    tx.execute(&ins, &[int(2), text("b")]).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 1);
    let mut tx = db.begin().await.unwrap();
    assert_eq!(select_all(&mut tx, db, t).await.rows.len(), 2);
    tx.rollback().await.unwrap();
    raw(db, &format!("DROP TABLE {t}")).await;
}

on_both!(
    savepoints_follow_each_statement,
    savepoints_follow_each_statement
);
/// Each statement's savepoint is released by the next statement or by
/// COMMIT: a long run of statements, every other one failing (the last one
/// too), keeps exactly what succeeded, and the transaction commits.
async fn savepoints_follow_each_statement(db: &Database, t: &str) {
    db.prepare_host_tables().await.unwrap();
    create_table(db, t).await;
    let consumer = unique("c");
    let mut tx = db.begin_bounded(Duration::from_secs(30)).await.unwrap();
    let receipt = Receipt {
        consumer: &consumer,
        message_id: "m1",
        stream_sequence: 1,
        module_digest: "d",
        published_ms: 1_700_000_000_000,
    };
    assert!(tx.insert_receipt(&receipt).await.unwrap());
    let ins = check(
        db,
        &mut tx,
        t,
        &format!("INSERT INTO {t} (id, name) VALUES ($1, $2)"),
        &[int(1), text("a")],
    )
    .await;
    for id in 1..=100 {
        tx.execute(&ins, &[int(id), text("first")]).await.unwrap();
        let e = failed(tx.execute(&ins, &[int(id), text("again")]).await);
        assert_eq!(e.kind, DbErrorKind::UniqueViolation);
    }
    tx.commit().await.unwrap();
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 1);
    let mut tx = db.begin().await.unwrap();
    let rows = select_all(&mut tx, db, t).await.rows;
    tx.rollback().await.unwrap();
    assert_eq!(rows.len(), 100);
    assert!(rows.iter().all(|r| r[1] == text("first")), "{rows:?}");
    // A transaction whose only statement failed commits the receipt alone.
    let mut tx = db.begin_bounded(Duration::from_secs(30)).await.unwrap();
    let receipt = Receipt {
        message_id: "m2",
        stream_sequence: 2,
        ..receipt
    };
    assert!(tx.insert_receipt(&receipt).await.unwrap());
    let e = failed(tx.execute(&ins, &[int(1), text("again")]).await);
    assert_eq!(e.kind, DbErrorKind::UniqueViolation);
    tx.commit().await.unwrap();
    assert_eq!(db.receipt_count(&consumer).await.unwrap(), 2);
    raw(db, &format!("DROP TABLE {t}")).await;
}

on_both!(row_limit, row_limit);
async fn row_limit(db: &Database, t: &str) {
    create_table(db, t).await;
    let mut tx = db.begin().await.unwrap();
    let ins = check(
        db,
        &mut tx,
        t,
        &format!("INSERT INTO {t} (id, name) VALUES (1, 'a'), (2, 'b'), (3, 'c')"),
        &[],
    )
    .await;
    assert_eq!(tx.execute(&ins, &[]).await.unwrap(), 3);
    let q = check(
        db,
        &mut tx,
        t,
        &format!("SELECT id FROM {t} ORDER BY id"),
        &[],
    )
    .await;
    assert_eq!(tx.query(&q, &[], 3, MAX_BYTES).await.unwrap().rows.len(), 3);
    let e = failed(tx.query(&q, &[], 2, MAX_BYTES).await);
    assert_eq!(e.kind, DbErrorKind::Other);
    assert_eq!(
        e.message,
        "query returned more than 2 rows; add a LIMIT or narrow the WHERE"
    );
    // A RETURNING statement past the limit is undone, not half-applied.
    let upd = check(
        db,
        &mut tx,
        t,
        &format!("UPDATE {t} SET name = 'changed' RETURNING id"),
        &[],
    )
    .await;
    assert_eq!(
        failed(tx.query(&upd, &[], 1, MAX_BYTES).await).kind,
        DbErrorKind::Other
    );
    let q = check(
        db,
        &mut tx,
        t,
        &format!("SELECT count(*) FROM {t} WHERE name = 'changed'"),
        &[],
    )
    .await;
    assert_eq!(
        tx.query(&q, &[], 1, MAX_BYTES).await.unwrap().rows,
        vec![vec![int(0)]]
    );
    let del = check(
        db,
        &mut tx,
        t,
        &format!("DELETE FROM {t} WHERE id = $1 RETURNING id, name"),
        &[int(2)],
    )
    .await;
    let rows = tx.query(&del, &[int(2)], 1, MAX_BYTES).await.unwrap();
    assert_eq!(rows.columns, vec!["id", "name"]);
    assert_eq!(rows.rows, vec![vec![int(2), text("b")]]);
    tx.rollback().await.unwrap();
    raw(db, &format!("DROP TABLE {t}")).await;
}

on_both!(byte_limit, byte_limit);
/// `max_bytes` bounds the values a query hands back (`SqlValue::size`
/// summed): past it the query fails and a RETURNING statement is undone.
async fn byte_limit(db: &Database, t: &str) {
    create_table(db, t).await;
    let mut tx = db.begin().await.unwrap();
    let (a, b) = (text(&"a".repeat(1000)), text(&"b".repeat(1000)));
    let p = [a.clone()];
    let ins = check(
        db,
        &mut tx,
        t,
        &format!("INSERT INTO {t} (id, name) VALUES (1, $1), (2, $1), (3, $1)"),
        &p,
    )
    .await;
    assert_eq!(tx.execute(&ins, &p).await.unwrap(), 3);
    // 3 rows of 1000 bytes: over 2500, within 3000.
    let p = [b.clone()];
    let upd = check(
        db,
        &mut tx,
        t,
        &format!("UPDATE {t} SET name = $1 RETURNING name"),
        &p,
    )
    .await;
    let e = failed(tx.query(&upd, &p, 10, 2500).await);
    assert_eq!(e.kind, DbErrorKind::Other);
    assert_eq!(
        e.message,
        "query results passed the 2 KiB this message may read (max_result_kib); select fewer columns or rows"
    );
    let q = check(
        db,
        &mut tx,
        t,
        &format!("SELECT name FROM {t} ORDER BY id"),
        &[],
    )
    .await;
    assert_eq!(
        tx.query(&q, &[], 10, MAX_BYTES).await.unwrap().rows,
        vec![vec![a.clone()]; 3],
        "the UPDATE past the bound is undone"
    );
    let rows = tx.query(&upd, &p, 10, 3000).await.unwrap();
    assert_eq!(rows.rows, vec![vec![b.clone()]; 3]);
    // A plain SELECT is bounded the same way.
    let e = failed(tx.query(&q, &[], 10, 2500).await);
    assert_eq!(e.kind, DbErrorKind::Other);
    assert!(e.message.starts_with("query results passed the 2 KiB"));
    assert_eq!(
        tx.query(&q, &[], 10, 3000).await.unwrap().rows,
        vec![vec![b]; 3]
    );
    tx.rollback().await.unwrap();
    raw(db, &format!("DROP TABLE {t}")).await;
}

/// On PostgreSQL a statement is checked for its parameters' types (the
/// checked text names them); the store refuses it with values of other
/// types until it is checked again with them.
#[tokio::test]
async fn pg_checked_types_must_match_the_values() {
    let db = Database::connect(&pg_url(), 1).await.unwrap();
    let t = unique("st");
    create_table(&db, &t).await;
    let mut tx = db.begin().await.unwrap();
    let ins_sql = format!("INSERT INTO {t} (id, name) VALUES ($1, $2)");
    let ins = check(&db, &mut tx, &t, &ins_sql, &[int(1), text("a")]).await;
    assert_eq!(ins.as_str(), format!("{ins_sql}\n-- idem:it"));
    assert_eq!(ins.param_count(), 2);
    assert!(ins.fits(&[int(2), text("b")]));
    assert!(!ins.fits(&[int(2), SqlValue::Null]));
    assert_eq!(tx.execute(&ins, &[int(1), text("a")]).await.unwrap(), 1);
    let e = failed(tx.execute(&ins, &[text("2"), text("b")]).await);
    assert_eq!(e.kind, DbErrorKind::Other);
    assert_eq!(
        e.message,
        "the statement was checked for other parameter types; check it again with these values"
    );
    let sql = format!("SELECT count(*) FROM {t} WHERE name = $1 OR $1 IS NULL");
    let q = check(&db, &mut tx, &t, &sql, &[text("a")]).await;
    assert_eq!(q.as_str(), format!("{sql}\n-- idem:t"));
    let e = failed(tx.query(&q, &[SqlValue::Null], 10, MAX_BYTES).await);
    assert_eq!(
        e.message,
        "the statement was checked for other parameter types; check it again with these values"
    );
    // The wrong number of values is told apart from the wrong types.
    let e = failed(tx.query(&q, &[], 10, MAX_BYTES).await);
    assert_eq!(
        e.message,
        "the statement has 1 parameter(s) ($1..$n) but 0 value(s) were given"
    );
    // Checked again with these values, it runs; the refusals changed nothing.
    let q = check(&db, &mut tx, &t, &sql, &[SqlValue::Null]).await;
    assert_eq!(q.as_str(), format!("{sql}\n-- idem:n"));
    assert_eq!(
        tx.query(&q, &[SqlValue::Null], 10, MAX_BYTES)
            .await
            .unwrap()
            .rows,
        vec![vec![int(1)]]
    );
    // Without parameters the text is the guest's own.
    let q = check(&db, &mut tx, &t, &format!("SELECT id FROM {t}"), &[]).await;
    assert_eq!(q.as_str(), format!("SELECT id FROM {t}"));
    tx.rollback().await.unwrap();
    raw(&db, &format!("DROP TABLE {t}")).await;
}

/// PostgreSQL's own permission check (SQLSTATE 42501) maps to `Denied`.
#[tokio::test]
async fn pg_permission_denied_is_denied() {
    let admin = Database::connect(&pg_url(), 1).await.unwrap();
    let role = unique("idemtest_role");
    let t = unique("st");
    raw(
        &admin,
        &format!("CREATE TABLE {t} (id BIGINT); CREATE ROLE {role} LOGIN"),
    )
    .await;
    let limited = Database::connect(&pg_url_as(&role), 1).await.unwrap();
    let mut tx = limited.begin().await.unwrap();
    let q = check(&limited, &mut tx, &t, &format!("SELECT id FROM {t}"), &[]).await;
    let e = failed(tx.query(&q, &[], 1, MAX_BYTES).await);
    assert_eq!(e.kind, DbErrorKind::Denied, "{}", e.message);
    assert!(e.message.ends_with("(SQLSTATE 42501)"), "{}", e.message);
    tx.rollback().await.unwrap();
    limited.close().await;
    raw(&admin, &format!("DROP TABLE {t}; DROP ROLE {role}")).await;
}
