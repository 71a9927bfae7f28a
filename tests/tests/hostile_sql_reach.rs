//! Issue 3's hostile guests, SQL reach: statements on the host's tables,
//! another handler's table, the catalogs (also through casts), transaction
//! control and `SET ROLE`. Each runs through the real host next to a
//! well-behaved handler ([`Arena`]), on PostgreSQL and SQLite, after the
//! message has credited [`Arena::VICTIM`]: a refusal must roll that credit
//! back too. Every refusal is asserted by its exact dead-letter reason
//! ([`Arena::refused`]); the tables of [`Arena::SQL_SETUP`] must be intact.
//! How statements are built and what they cost: `hostile_sql_shape.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use std::time::Duration;

async fn arena(backend: Backend, extra: &str) -> Arena {
    Arena::start(backend, extra, Arena::SQL_SETUP).await
}

fn host_table(op: &'static str, sql: &str, name: &str) -> Case {
    Case::exact(
        op,
        sql,
        format!(
            "rejected: denied: `{name}` names a host table; idem_* tables are never reachable from a handler"
        ),
    )
}

fn not_granted(op: &'static str, sql: &str, name: &str) -> Case {
    Case::exact(
        op,
        sql,
        format!(
            "rejected: denied: table `{name}` is not granted to this handler; grant it in [[handler]] tables"
        ),
    )
}

fn catalog(sql: &str, name: &str) -> Case {
    Case::exact(
        "query",
        sql,
        format!("rejected: denied: `{name}` names a system catalog; handlers cannot read catalogs"),
    )
}

/// The schema a guest may name on `backend`, and the other one.
fn schemas(backend: Backend) -> (&'static str, &'static str) {
    match backend {
        Backend::Postgres => ("public", "main"),
        Backend::Sqlite => ("main", "public"),
    }
}

async fn host_tables(backend: Backend) {
    let a = arena(backend, "").await;
    let (schema, _) = schemas(backend);
    let cases = [
        host_table(
            "query",
            "SELECT count(*) FROM idem_receipts",
            "idem_receipts",
        ),
        host_table("sql", "DELETE FROM idem_receipts", "idem_receipts"),
        host_table(
            "sql",
            "UPDATE idem_receipts SET message_id = 'x'",
            "idem_receipts",
        ),
        host_table(
            "sql",
            "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest) \
             VALUES ('hostile', 'evt_ok', 1, 'x')",
            "idem_receipts",
        ),
        host_table("query", "SELECT * FROM \"idem_receipts\"", "idem_receipts"),
        host_table(
            "query",
            &format!("SELECT * FROM {schema}.idem_receipts"),
            "idem_receipts",
        ),
        host_table(
            "query",
            "WITH accounts AS (SELECT * FROM idem_receipts) SELECT * FROM accounts",
            "idem_receipts",
        ),
        host_table(
            "query",
            "SELECT account_id FROM accounts WHERE EXISTS (SELECT 1 FROM idem_receipts)",
            "idem_receipts",
        ),
        host_table("sql", "DELETE FROM idem_dead_letters", "idem_dead_letters"),
        host_table(
            "query",
            "SELECT reason FROM idem_dead_letters",
            "idem_dead_letters",
        ),
        host_table(
            "query",
            "SELECT * FROM idem_migrations_hostile",
            "idem_migrations_hostile",
        ),
    ];
    a.refused(&cases, Duration::from_secs(10)).await;
    a.stop().await;
}
on_both_databases!(host_tables, host_tables);

async fn another_handlers_table(backend: Backend) {
    let a = arena(backend, "").await;
    let (schema, other) = schemas(backend);
    let t = "other_accounts";
    let cases = [
        not_granted("query", "SELECT * FROM other_accounts", t),
        not_granted("sql", "DELETE FROM other_accounts", t),
        not_granted("sql", "UPDATE other_accounts SET balance = 0", t),
        not_granted(
            "sql",
            "INSERT INTO other_accounts (account_id, balance) VALUES (3, 300)",
            t,
        ),
        not_granted(
            "sql",
            "INSERT INTO accounts (account_id, balance) SELECT account_id + 100, balance FROM other_accounts",
            t,
        ),
        not_granted(
            "sql",
            "UPDATE accounts SET balance = (SELECT max(balance) FROM other_accounts)",
            t,
        ),
        not_granted(
            "query",
            "SELECT account_id FROM accounts UNION SELECT account_id FROM other_accounts",
            t,
        ),
        not_granted(
            "sql",
            "DELETE FROM accounts WHERE account_id IN (SELECT account_id FROM other_accounts)",
            t,
        ),
        not_granted("query", "SELECT * FROM \"other_accounts\"", t),
        not_granted(
            "query",
            &format!("SELECT * FROM {schema}.other_accounts"),
            t,
        ),
        Case::exact(
            "query",
            format!("SELECT * FROM {other}.other_accounts"),
            format!(
                "rejected: denied: schema `{other}` is not allowed; use unqualified table names (or `{schema}.`)"
            ),
        ),
    ];
    a.refused(&cases, Duration::from_secs(10)).await;
    a.stop().await;
}
on_both_databases!(another_handlers_table, another_handlers_table);

async fn system_catalogs(backend: Backend) {
    let a = arena(backend, "").await;
    let system_table = |sql: &str, name: &str| {
        Case::exact(
            "query",
            sql,
            format!("rejected: denied: `{name}` is a system table; handlers cannot read it"),
        )
    };
    let cases = [
        catalog("SELECT * FROM pg_catalog.pg_tables", "pg_catalog"),
        catalog("SELECT * FROM \"pg_catalog\".\"pg_authid\"", "pg_catalog"),
        system_table("SELECT tablename FROM pg_tables", "pg_tables"),
        system_table("SELECT * FROM pg_shadow", "pg_shadow"),
        catalog(
            "SELECT * FROM information_schema.tables",
            "information_schema",
        ),
        catalog("SELECT name FROM sqlite_master", "sqlite_master"),
        catalog("SELECT * FROM sqlite_schema", "sqlite_schema"),
        catalog("SELECT * FROM sqlite_temp_master", "sqlite_temp_master"),
        Case::exact(
            "query",
            "SELECT * FROM pragma_table_info('accounts')",
            "rejected: denied: table function `pragma_table_info` is not allowed; read granted tables",
        ),
        not_granted(
            "query",
            "SELECT name FROM pragma_table_list",
            "pragma_table_list",
        ),
    ];
    a.refused(&cases, Duration::from_secs(10)).await;
    a.stop().await;
}
on_both_databases!(system_catalogs, system_catalogs);

/// Catalog lookups and clocks hidden in casts: `'name'::regclass` reads
/// `pg_class`, and `'now'` / `'today'` cast to a date/time type read the
/// clock. SQLite has neither: its casts give plain values.
async fn casts_reach_no_catalog_or_clock(backend: Backend) {
    let a = arena(backend, "").await;
    let cases = match backend {
        Backend::Postgres => vec![
            Case::prefix(
                "query",
                "SELECT 'idem_receipts'::regclass::oid::bigint AS o",
                "rejected: denied: ",
            ),
            Case::prefix(
                "query",
                "SELECT CAST('pg_authid' AS regclass)::oid::bigint AS o",
                "rejected: denied: ",
            ),
            Case::prefix(
                "query",
                "SELECT 'now'::timestamptz::text AS t",
                "rejected: denied: ",
            ),
            Case::prefix(
                "query",
                "SELECT CAST(CAST('now' AS timestamp) AS text) AS t",
                "rejected: denied: ",
            ),
            Case::prefix(
                "query",
                "SELECT 'today'::date::text AS d",
                "rejected: denied: ",
            ),
        ],
        Backend::Sqlite => vec![
            Case::exact(
                "query",
                "SELECT CAST('now' AS TIMESTAMP) AS t",
                "rejected: rows [\"t\"] [[0]]",
            ),
            Case::exact(
                "query",
                "SELECT CAST('today' AS DATE) AS d",
                "rejected: rows [\"d\"] [[0]]",
            ),
        ],
    };
    a.refused(&cases, Duration::from_secs(10)).await;
    a.stop().await;
}
on_both_databases!(
    casts_reach_no_catalog_or_clock,
    casts_reach_no_catalog_or_clock
);

async fn transaction_control(backend: Backend) {
    let a = arena(backend, "").await;
    let cases = [
        Case::not_dml("sql", "COMMIT", "COMMIT"),
        Case::not_dml("sql", "COMMIT AND CHAIN", "COMMIT"),
        Case::not_dml("sql", "END", "END"),
        Case::not_dml("sql", "ROLLBACK", "ROLLBACK"),
        Case::not_dml("sql", "ABORT", "ROLLBACK"),
        Case::not_dml("sql", "SAVEPOINT x", "SAVEPOINT"),
        // The host's own per-statement savepoint.
        Case::not_dml("sql", "RELEASE SAVEPOINT idem_stmt", "RELEASE"),
        Case::not_dml("sql", "ROLLBACK TO SAVEPOINT idem_stmt", "ROLLBACK"),
        Case::not_dml("sql", "BEGIN", "BEGIN"),
        Case::not_dml("sql", "START TRANSACTION", "START"),
        Case::syntax("sql", "PREPARE TRANSACTION 'x'"),
    ];
    // Had any COMMIT gone through, the victim's credit would have stayed.
    a.refused(&cases, Duration::from_secs(10)).await;
    a.stop().await;
}
on_both_databases!(transaction_control, transaction_control);

async fn set_role_and_settings(backend: Backend) {
    let a = arena(backend, "").await;
    let cases = [
        Case::not_dml("sql", "SET ROLE postgres", "SET"),
        Case::not_dml("sql", "RESET ROLE", "RESET"),
        Case::not_dml("sql", "SET SESSION AUTHORIZATION postgres", "SET"),
        Case::not_dml("sql", "SET LOCAL statement_timeout = 0", "SET"),
        Case::not_dml("sql", "SET search_path TO pg_catalog", "SET"),
        Case::not_dml("sql", "RESET ALL", "RESET"),
        Case::not_dml("sql", "DISCARD ALL", "DISCARD"),
        Case::function("SELECT set_config('role', 'postgres', true)", "set_config"),
        Case::not_dml("sql", "PRAGMA foreign_keys = 0", "PRAGMA"),
        Case::not_dml(
            "sql",
            "ATTACH DATABASE '/tmp/idem-evil.db' AS evil",
            "ATTACH",
        ),
        Case::syntax("sql", "DETACH DATABASE main"),
    ];
    a.refused(&cases, Duration::from_secs(10)).await;
    a.stop().await;
}
on_both_databases!(set_role_and_settings, set_role_and_settings);
