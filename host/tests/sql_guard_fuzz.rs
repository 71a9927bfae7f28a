//! Property: whatever the SQL guard allows touches only granted tables.
//!
//! Statements that mention a non-granted table (`secrets`, holding a canary)
//! or a host table only inside strings, comments, dollar quotes and quoted
//! identifiers are mutated around exactly those places (quotes, backslashes,
//! comment markers, `;`, `E`/`U&` prefixes, newlines inserted or characters
//! deleted), judged by the guard, and every statement it allows is run in a
//! real transaction, on PostgreSQL as the handler's role (granted `accounts`
//! only) and on SQLite. A statement the guard allowed must then:
//! - not be refused by PostgreSQL's own permission check (SQLSTATE 42501: the
//!   role stopped what the guard let through);
//! - return no canary, leave `secrets` and the receipts exactly as they were
//!   and create no object (checked inside the same transaction);
//! - leave the host's transaction open.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::raw;
use idem_test_support::pg_url;

use idem::sql_guard::SqlGuard;
use idem::store::{Database, DbErrorKind, DbKind, StatementError, Tx};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sqlx::AssertSqlSafe;

const CANARY: &str = "CANARY-9b1f";

/// Statements that are harmless as written on both databases; `{a}` is the
/// granted table, `{s}` the secrets table.
const SEEDS: &[&str] = &[
    "SELECT 'a' AS x FROM {a} WHERE balance > 0 --' UNION SELECT v FROM {s}",
    "SELECT /* a */ balance FROM {a} /* UNION SELECT v FROM {s} */",
    "SELECT 'it''s' AS x, '\\' AS y FROM {a} -- ' UNION SELECT v FROM {s}",
    "UPDATE {a} SET balance = balance + 1 WHERE account_id = 1 -- ; DELETE FROM {s}",
    "SELECT \"balance\" FROM {a} WHERE 'x' <> '; DELETE FROM {s}; --'",
    "INSERT INTO {a} (account_id, balance) VALUES (7, length('x'' UNION SELECT v FROM {s} --')) ON CONFLICT (account_id) DO NOTHING",
    "SELECT count(*) AS n FROM {a} WHERE balance = 1 /* */ OR balance = 2 -- FROM {s}",
    "WITH t AS (SELECT balance FROM {a}) SELECT balance FROM t WHERE 'FROM {s}' = ''",
    "DELETE FROM {a} WHERE account_id = 99 AND 'x' = 'a''b -- OR 1 IN (SELECT 1 FROM {s})'",
    "SELECT 'FROM idem_receipts' AS x FROM {a} WHERE balance < 0",
];

/// PostgreSQL-only harmless statements: dollar quotes and escape strings.
const PG_SEEDS: &[&str] = &[
    "SELECT $$a$$ AS x UNION ALL SELECT 'SELECT v FROM {s}'",
    "SELECT $q$ SELECT v FROM {s} $q$ AS y FROM {a}",
    "SELECT E'\\' UNION SELECT v FROM {s} --' AS x",
    "SELECT U&'\\0041' AS x FROM {a} WHERE 'FROM {s}' <> ''",
];

/// What a mutation inserts.
const TOKENS: &[&str] = &[
    "'", "\\", "''", "\\'", "$$", "$q$", "/*", "*/", "--", "\n", ";", "E'", "U&'", "\"", " ", ",",
    "(", ")", "x", "0",
];

struct Arena {
    db: Database,
    guard: SqlGuard,
    role: Option<String>,
    accounts: String,
    secrets: String,
    _dir: Option<tempfile::TempDir>,
}

async fn arena(kind: DbKind) -> Arena {
    let (db, dir) = match kind {
        DbKind::Postgres => (Database::connect(&pg_url(), 2).await.unwrap(), None),
        DbKind::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("idem.db").display());
            (Database::connect(&url, 2).await.unwrap(), Some(dir))
        }
    };
    db.prepare_host_tables().await.unwrap();
    let tag = format!("{}_{}", std::process::id(), kind as u8);
    let (accounts, secrets) = (format!("fz_accounts_{tag}"), format!("fz_secrets_{tag}"));
    for sql in [
        format!("DROP TABLE IF EXISTS {accounts}"),
        format!("DROP TABLE IF EXISTS {secrets}"),
        format!("CREATE TABLE {accounts} (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)"),
        format!("INSERT INTO {accounts} VALUES (1, 1), (2, 2)"),
        format!("CREATE TABLE {secrets} (v TEXT)"),
        format!("INSERT INTO {secrets} VALUES ('{CANARY}')"),
    ] {
        raw(&db, &sql).await;
    }
    let role = db
        .prepare_handler_role(&format!("fuzz_{tag}"), std::slice::from_ref(&accounts))
        .await
        .unwrap()
        .map(|r| r.name);
    let guard = SqlGuard::new(kind, std::slice::from_ref(&accounts));
    Arena {
        db,
        guard,
        role,
        accounts,
        secrets,
        _dir: dir,
    }
}

/// `seed` with `mutations` applied: (position, token, delete instead).
fn mutate(seed: &str, mutations: &[(u16, usize, bool)]) -> String {
    let mut s = seed.to_owned();
    for &(pos, token, delete) in mutations {
        let mut at = usize::from(pos) % (s.len() + 1);
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        if delete && at < s.len() {
            s.remove(at);
        } else {
            s.insert_str(at, TOKENS[token]);
        }
    }
    s
}

/// The state the property checks, read inside the transaction as the host:
/// secrets' rows, receipts, and the number of schema objects.
async fn state(tx: &mut Tx, a: &Arena) -> (Vec<String>, i64, i64) {
    let secrets = format!("SELECT v FROM {} ORDER BY v", a.secrets);
    let receipts = "SELECT count(*) FROM idem_receipts";
    if let Some(t) = tx.postgres_tx() {
        sqlx::raw_sql("RESET ROLE").execute(&mut **t).await.unwrap();
        let objects = "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                           WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')";
        (
            sqlx::query_scalar(AssertSqlSafe(secrets))
                .fetch_all(&mut **t)
                .await
                .unwrap(),
            sqlx::query_scalar(receipts)
                .fetch_one(&mut **t)
                .await
                .unwrap(),
            sqlx::query_scalar(objects)
                .fetch_one(&mut **t)
                .await
                .unwrap(),
        )
    } else if let Some(c) = tx.sqlite_connection() {
        let mut stmt = c.prepare(&secrets).unwrap();
        let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
        let count = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
        (
            rows.collect::<Result<_, _>>().unwrap(),
            count(receipts),
            count("SELECT count(*) FROM sqlite_schema"),
        )
    } else {
        unreachable!("no backend")
    }
}

/// Judges `sql`; when allowed, runs it and checks the property. Returns
/// whether the guard allowed it.
async fn one(
    a: &Arena,
    sql: &str,
    before: &(Vec<String>, i64, i64),
) -> Result<bool, TestCaseError> {
    let mut tx = a.db.begin().await.unwrap();
    if let Some(role) = &a.role {
        tx.enter_handler_role(role).await.unwrap();
    }
    let allowed = match a.guard.check(&mut tx, sql, &[]).await {
        Err(_) => false,
        Ok(checked) => {
            match tx.query(&checked, &[], 1000, 1 << 20).await {
                Ok(rows) => {
                    let text = format!("{:?}", rows.rows);
                    prop_assert!(
                        !text.contains(CANARY),
                        "{sql:?} returned the canary: {text}"
                    );
                }
                Err(StatementError::Failed(e)) => {
                    prop_assert!(
                        e.kind != DbErrorKind::Denied,
                        "the guard allowed {sql:?} but the database refused it: {}",
                        e.message
                    );
                }
                Err(StatementError::TransactionLost(why)) => {
                    prop_assert!(false, "{sql:?} cost the host its transaction: {why}");
                }
            }
            let after = state(&mut tx, a).await;
            prop_assert_eq!(&after, before, "{:?} changed what it may not touch", sql);
            true
        }
    };
    tx.rollback().await.unwrap();
    Ok(allowed)
}

fn fuzz(kind: DbKind, cases: u32) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let a = rt.block_on(arena(kind));
    let before = rt.block_on(async {
        let mut tx = a.db.begin().await.unwrap();
        let s = state(&mut tx, &a).await;
        tx.rollback().await.unwrap();
        s
    });
    assert_eq!(before.0, vec![CANARY.to_string()]);
    let pg_seeds = if kind == DbKind::Postgres {
        PG_SEEDS
    } else {
        &[]
    };
    let seeds: Vec<String> = SEEDS
        .iter()
        .chain(pg_seeds)
        .map(|s| s.replace("{a}", &a.accounts).replace("{s}", &a.secrets))
        .collect();
    // Every seed as written is allowed: the mutations start from real passes.
    for seed in &seeds {
        assert!(
            rt.block_on(one(&a, seed, &before)).unwrap(),
            "{kind:?}: seed refused: {seed}"
        );
    }
    let allowed = std::sync::atomic::AtomicU32::new(0);
    let strategy = (
        0..seeds.len(),
        prop::collection::vec((any::<u16>(), 0..TOKENS.len(), any::<bool>()), 1..5),
    );
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |(seed, mutations)| {
        let sql = mutate(&seeds[seed], &mutations);
        if rt.block_on(one(&a, &sql, &before))? {
            allowed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{kind:?}: {e}");
    }
    let allowed = allowed.into_inner();
    eprintln!(
        "{kind:?}: {cases} mutated statements, {allowed} allowed and run, none touched more than granted"
    );
    // Enough of the mutants must pass for the property to mean something.
    assert!(
        allowed >= cases / 10,
        "{kind:?}: only {allowed} of {cases} allowed"
    );
    rt.block_on(async {
        raw(&a.db, &format!("DROP TABLE {}", a.accounts)).await;
        raw(&a.db, &format!("DROP TABLE {}", a.secrets)).await;
    });
}

#[test]
fn mutated_statements_allowed_by_the_guard_touch_only_granted_tables_postgres() {
    fuzz(DbKind::Postgres, 3000);
}

#[test]
fn mutated_statements_allowed_by_the_guard_touch_only_granted_tables_sqlite() {
    fuzz(DbKind::Sqlite, 3000);
}
