//! Hostile guests, SQL reach: statements on the host's tables,
//! another handler's table, the catalogs (also through casts), transaction
//! control and `SET ROLE`. Each runs through the real host next to a
//! well-behaved handler ([`Arena`]), on PostgreSQL and SQLite, after the
//! message has credited [`Arena::VICTIM`]: a refusal must roll that credit
//! back too. Every refusal is asserted by its exact dead-letter reason
//! ([`Arena::refused`]); the tables of [`Arena::SQL_SETUP`] must be intact.
//! Each database judges by its own grammar (docs/handlers.md, "What a handler
//! can and cannot do"): a statement only the other database knows is refused as a
//! syntax error, and on SQLite a name that is no table is SQLite's own
//! compile error.
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
    // SQLite's authorizer names the FROM item a table is read through: here
    // the CTE that shadows `accounts`.
    let through_cte = match backend {
        Backend::Postgres => "",
        Backend::Sqlite => " (reached through `accounts`)",
    };
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
            "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms) \
             VALUES ('hostile', 'evt_ok', 1, 'x', 0)",
            "idem_receipts",
        ),
        host_table("query", "SELECT * FROM \"idem_receipts\"", "idem_receipts"),
        host_table(
            "query",
            &format!("SELECT * FROM {schema}.idem_receipts"),
            "idem_receipts",
        ),
        Case::denied(
            "query",
            "WITH accounts AS (SELECT * FROM idem_receipts) SELECT * FROM accounts",
            &format!(
                "`idem_receipts` names a host table; idem_* tables are never reachable \
                 from a handler{through_cte}"
            ),
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
        match backend {
            Backend::Postgres => Case::denied(
                "query",
                format!("SELECT * FROM {other}.other_accounts"),
                &format!(
                    "schema `{other}` is not allowed; use unqualified table names (or `{schema}.`)"
                ),
            ),
            // SQLite has no schema `public` (guests cannot attach one).
            Backend::Sqlite => Case::syntax(
                backend,
                "query",
                &format!("SELECT * FROM {other}.other_accounts"),
                &format!("no such table: {other}.other_accounts"),
            ),
        },
    ];
    a.refused(&cases, Duration::from_secs(10)).await;
    a.stop().await;
}
on_both_databases!(another_handlers_table, another_handlers_table);

async fn system_catalogs(backend: Backend) {
    let a = arena(backend, "").await;
    let system_table = |sql: &str, name: &str| {
        Case::denied(
            "query",
            sql,
            &format!("`{name}` is a system table; handlers cannot read it"),
        )
    };
    let cases = match backend {
        Backend::Postgres => vec![
            catalog("SELECT * FROM pg_catalog.pg_tables", "pg_catalog"),
            catalog("SELECT * FROM \"pg_catalog\".\"pg_authid\"", "pg_catalog"),
            system_table("SELECT tablename FROM pg_tables", "pg_tables"),
            system_table("SELECT * FROM pg_shadow", "pg_shadow"),
            catalog(
                "SELECT * FROM information_schema.tables",
                "information_schema",
            ),
            // SQLite's catalogs are plain names to PostgreSQL, and not granted.
            not_granted("query", "SELECT name FROM sqlite_master", "sqlite_master"),
            not_granted("query", "SELECT * FROM sqlite_schema", "sqlite_schema"),
            not_granted(
                "query",
                "SELECT * FROM sqlite_temp_master",
                "sqlite_temp_master",
            ),
            Case::denied(
                "query",
                "SELECT * FROM pragma_table_info('accounts')",
                "functions in FROM (generate_series, ROWS FROM, ...) are not allowed in \
                 handler SQL; read granted tables",
            ),
            not_granted(
                "query",
                "SELECT name FROM pragma_table_list",
                "pragma_table_list",
            ),
        ],
        Backend::Sqlite => {
            let no_table = |sql: &str, name: &str| {
                Case::syntax(backend, "query", sql, &format!("no such table: {name}"))
            };
            vec![
                // PostgreSQL's catalogs do not exist on SQLite (nor can a
                // guest attach a schema of that name).
                no_table("SELECT * FROM pg_catalog.pg_tables", "pg_catalog.pg_tables"),
                no_table(
                    "SELECT * FROM \"pg_catalog\".\"pg_authid\"",
                    "pg_catalog.pg_authid",
                ),
                no_table("SELECT tablename FROM pg_tables", "pg_tables"),
                no_table("SELECT * FROM pg_shadow", "pg_shadow"),
                no_table(
                    "SELECT * FROM information_schema.tables",
                    "information_schema.tables",
                ),
                catalog("SELECT name FROM sqlite_master", "sqlite_master"),
                // SQLite resolves `sqlite_schema` to the table it names,
                // `sqlite_master`, before asking the authorizer.
                catalog("SELECT * FROM sqlite_schema", "sqlite_master"),
                catalog("SELECT * FROM sqlite_temp_master", "sqlite_temp_master"),
                // Pragma table functions are eponymous virtual tables: reading
                // one is reading a table that is not granted.
                not_granted(
                    "query",
                    "SELECT * FROM pragma_table_info('accounts')",
                    "pragma_table_info",
                ),
                not_granted(
                    "query",
                    "SELECT name FROM pragma_table_list",
                    "pragma_table_list",
                ),
            ]
        }
    };
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
        Backend::Postgres => {
            let oid = "cast to `oid` is not allowed: oids identify system catalog objects";
            let regclass = "cast to `regclass` is not allowed: reg* types look names up in the \
                            system catalogs";
            let clock = |word: &str| {
                format!(
                    "the literal '{word}' reads the database clock; pass times in the message \
                     instead"
                )
            };
            // The judge refuses the first cast it meets from the outside in.
            vec![
                Case::denied(
                    "query",
                    "SELECT 'idem_receipts'::regclass::oid::bigint AS o",
                    oid,
                ),
                Case::denied(
                    "query",
                    "SELECT CAST('pg_authid' AS regclass)::oid::bigint AS o",
                    oid,
                ),
                Case::denied(
                    "query",
                    "SELECT 'idem_receipts'::regclass::text AS o",
                    regclass,
                ),
                Case::denied(
                    "query",
                    "SELECT CAST('pg_authid' AS regclass)::text AS o",
                    regclass,
                ),
                Case::denied(
                    "query",
                    "SELECT 'now'::timestamptz::text AS t",
                    &clock("now"),
                ),
                Case::denied(
                    "query",
                    "SELECT CAST(CAST('now' AS timestamp) AS text) AS t",
                    &clock("now"),
                ),
                Case::denied("query", "SELECT 'today'::date::text AS d", &clock("today")),
            ]
        }
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
    let pg = backend == Backend::Postgres;
    let cases = [
        Case::not_dml("sql", "COMMIT", "COMMIT"),
        Case::not_dml("sql", "COMMIT AND CHAIN", "COMMIT"),
        // SQLite's authorizer reports END as the COMMIT it is.
        Case::not_dml("sql", "END", if pg { "END" } else { "COMMIT" }),
        Case::not_dml("sql", "ROLLBACK", "ROLLBACK"),
        if pg {
            Case::not_dml("sql", "ABORT", "ABORT")
        } else {
            Case::syntax(backend, "sql", "ABORT", "near \"ABORT\": syntax error")
        },
        Case::not_dml("sql", "SAVEPOINT x", "SAVEPOINT"),
        // The host's own per-statement savepoint.
        Case::not_dml("sql", "RELEASE SAVEPOINT idem_stmt", "RELEASE"),
        Case::not_dml(
            "sql",
            "ROLLBACK TO SAVEPOINT idem_stmt",
            if pg { "ROLLBACK" } else { "ROLLBACK TO" },
        ),
        Case::not_dml("sql", "BEGIN", "BEGIN"),
        if pg {
            Case::not_dml("sql", "START TRANSACTION", "START")
        } else {
            Case::syntax(
                backend,
                "sql",
                "START TRANSACTION",
                "near \"START\": syntax error",
            )
        },
        if pg {
            Case::not_dml("sql", "PREPARE TRANSACTION 'x'", "PREPARE")
        } else {
            Case::syntax(
                backend,
                "sql",
                "PREPARE TRANSACTION 'x'",
                "near \"PREPARE\": syntax error",
            )
        },
    ];
    // Had any COMMIT gone through, the victim's credit would have stayed.
    a.refused(&cases, Duration::from_secs(10)).await;
    a.stop().await;
}
on_both_databases!(transaction_control, transaction_control);

async fn set_role_and_settings(backend: Backend) {
    let a = arena(backend, "").await;
    let pg = backend == Backend::Postgres;
    // A statement of the other database's dialect is its grammar's error.
    let foreign = |sql: &str, word: &str| {
        let message = if pg {
            format!("syntax error at or near \"{word}\"")
        } else {
            format!("near \"{word}\": syntax error")
        };
        Case::syntax(backend, "sql", sql, &message)
    };
    let postgres_only = |sql: &str, word: &str, refused_as: &str| {
        if pg {
            Case::not_dml("sql", sql, refused_as)
        } else {
            foreign(sql, word)
        }
    };
    let sqlite_only = |sql: &str, word: &str| {
        if pg {
            foreign(sql, word)
        } else {
            Case::not_dml("sql", sql, word)
        }
    };
    let cases = [
        postgres_only("SET ROLE postgres", "SET", "SET"),
        postgres_only("RESET ROLE", "RESET", "RESET"),
        postgres_only("SET SESSION AUTHORIZATION postgres", "SET", "SET"),
        postgres_only("SET LOCAL statement_timeout = 0", "SET", "SET"),
        postgres_only("SET search_path TO pg_catalog", "SET", "SET"),
        postgres_only("RESET ALL", "RESET", "RESET"),
        postgres_only("DISCARD ALL", "DISCARD", "DISCARD"),
        if pg {
            Case::function("SELECT set_config('role', 'postgres', true)", "set_config")
        } else {
            Case::syntax(
                backend,
                "query",
                "SELECT set_config('role', 'postgres', true)",
                "no such function: set_config",
            )
        },
        sqlite_only("PRAGMA foreign_keys = 0", "PRAGMA"),
        sqlite_only("ATTACH DATABASE '/tmp/idem-evil.db' AS evil", "ATTACH"),
        sqlite_only("DETACH DATABASE main", "DETACH"),
    ];
    a.refused(&cases, Duration::from_secs(10)).await;
    a.stop().await;
}
on_both_databases!(set_role_and_settings, set_role_and_settings);
