//! Unit tests of the SQL guard: what passes, what is refused, and the exact
//! text that reaches the database.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;

const BOTH: [DbKind; 2] = [DbKind::Postgres, DbKind::Sqlite];

fn guard(kind: DbKind) -> SqlGuard {
    SqlGuard::new(kind, &["accounts".to_string(), "Ledger".to_string()])
}

#[track_caller]
fn allowed(kind: DbKind, sql: &str) -> CheckedSql {
    match guard(kind).check(sql) {
        Ok(c) => c,
        Err(e) => panic!("{kind:?}: expected {sql:?} to pass, got {e:?}"),
    }
}

#[track_caller]
fn refused(kind: DbKind, sql: &str, expected: DbErrorKind, needle: &str) {
    match guard(kind).check(sql) {
        Ok(c) => panic!(
            "{kind:?}: expected {sql:?} to be refused, it passed as {:?}",
            c.as_str()
        ),
        Err(e) => {
            assert_eq!(e.kind, expected, "{kind:?} {sql:?}: {}", e.message);
            assert!(
                e.message.contains(needle),
                "{kind:?} {sql:?}: message {:?} lacks {needle:?}",
                e.message
            );
            assert!(!e.message.contains('\n'), "one line: {:?}", e.message);
        }
    }
}

#[test]
fn granted_statements_pass_with_canonical_text_and_param_count() {
    for kind in BOTH {
        let c = allowed(
            kind,
            "select balance from accounts where account_id = $2 and x = $1;",
        );
        assert_eq!(
            c.as_str(),
            "SELECT balance FROM accounts WHERE account_id = $2 AND x = $1"
        );
        assert_eq!(c.param_count(), 2);
        let c = allowed(
            kind,
            "INSERT INTO accounts (account_id, balance) VALUES ($1, $2)
             ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance
             RETURNING balance",
        );
        assert_eq!(
            c.as_str(),
            "INSERT INTO accounts (account_id, balance) VALUES ($1, $2) ON CONFLICT(account_id) DO UPDATE SET balance = accounts.balance + excluded.balance RETURNING balance"
        );
        assert_eq!(c.param_count(), 2);
        assert_eq!(allowed(kind, "SELECT 1").param_count(), 0);
        for sql in [
            "UPDATE accounts SET balance = balance - $1 WHERE account_id = $2",
            "DELETE FROM accounts WHERE balance = 0",
            "SELECT * FROM ACCOUNTS a JOIN ledger l ON l.id = a.account_id",
            "SELECT * FROM \"accounts\"",
            "SELECT count(*), sum(balance), coalesce(max(balance), 0) FROM accounts",
            "SELECT * FROM accounts WHERE account_id IN (SELECT id FROM ledger WHERE x > $1)",
            "SELECT * FROM accounts WHERE EXISTS (SELECT 1 FROM ledger)",
            "SELECT account_id FROM accounts UNION SELECT id FROM ledger",
            "WITH t AS (SELECT account_id FROM accounts) SELECT * FROM t",
            "WITH a AS (SELECT 1 AS x), b AS (SELECT x FROM a) SELECT * FROM b",
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT n FROM r",
            "UPDATE accounts SET balance = l.b FROM ledger l WHERE l.id = accounts.account_id",
            "INSERT INTO ledger (id) SELECT account_id FROM accounts",
            "SELECT 1 -- ; DROP TABLE accounts",
        ] {
            allowed(kind, sql);
        }
    }
    allowed(DbKind::Postgres, "SELECT * FROM public.accounts");
    allowed(DbKind::Sqlite, "SELECT * FROM main.accounts");
    allowed(DbKind::Sqlite, "SELECT 1 FROM accounts WHERE 1 IN ledger");
    allowed(
        DbKind::Postgres,
        "WITH d AS (DELETE FROM accounts WHERE balance = 0 RETURNING account_id) SELECT count(*) FROM d",
    );
}

#[test]
fn host_tables_are_always_refused() {
    for kind in BOTH {
        let g = SqlGuard::new(kind, &["idem_receipts".to_string(), "accounts".to_string()]);
        for sql in [
            "SELECT * FROM idem_receipts",
            "SELECT * FROM IDEM_RECEIPTS",
            "SELECT * FROM \"idem_receipts\"",
            "DELETE FROM idem_receipts",
            "UPDATE idem_dead_letters SET reason = 'x'",
            "INSERT INTO idem_receipts VALUES ('a', 'b', 1, 'd')",
            "SELECT * FROM accounts WHERE account_id IN (SELECT 1 FROM idem_receipts)",
            "SELECT * FROM accounts JOIN idem_dead_letters ON true",
            "WITH t AS (SELECT * FROM idem_receipts) SELECT * FROM t",
            "SELECT * FROM accounts AS idem_x",
            "SELECT * FROM idem_migrations_credit",
        ] {
            let e = g.check(sql).expect_err(sql);
            assert_eq!(e.kind, DbErrorKind::Denied, "{sql}");
            assert!(e.message.contains("host table"), "{sql}: {}", e.message);
        }
    }
    refused(
        DbKind::Postgres,
        "SELECT * FROM public.idem_receipts",
        DbErrorKind::Denied,
        "host table",
    );
    refused(
        DbKind::Sqlite,
        "SELECT * FROM main.idem_receipts",
        DbErrorKind::Denied,
        "host table",
    );
}

#[test]
fn ungranted_tables_are_refused_wherever_they_appear() {
    for kind in BOTH {
        for sql in [
            "SELECT * FROM secret",
            "SELECT * FROM accounts, secret",
            "SELECT * FROM accounts JOIN secret ON true",
            "SELECT * FROM accounts WHERE x IN (SELECT y FROM secret)",
            "SELECT * FROM accounts WHERE EXISTS (SELECT 1 FROM secret)",
            "SELECT (SELECT max(y) FROM secret) FROM accounts",
            "SELECT x FROM accounts UNION ALL SELECT y FROM secret",
            "SELECT * FROM (SELECT * FROM secret) s",
            "WITH t AS (SELECT * FROM secret) SELECT * FROM t",
            "INSERT INTO secret VALUES (1)",
            "INSERT INTO accounts SELECT * FROM secret",
            "UPDATE secret SET x = 1",
            "UPDATE accounts SET x = s.x FROM secret s",
            "DELETE FROM secret",
            "DELETE FROM accounts USING secret WHERE true",
            "SELECT * FROM \"ACCOUNTS2\"",
        ] {
            refused(
                kind,
                sql,
                DbErrorKind::Denied,
                "is not granted to this handler; grant it in [[handler]] tables",
            );
        }
    }
    // PostgreSQL keeps the case of quoted names: "ACCOUNTS" is another table.
    refused(
        DbKind::Postgres,
        "SELECT * FROM \"ACCOUNTS\"",
        DbErrorKind::Denied,
        "not granted",
    );
    allowed(DbKind::Sqlite, "SELECT * FROM \"ACCOUNTS\"");
    refused(
        DbKind::Sqlite,
        "SELECT 1 FROM accounts WHERE 1 IN secret",
        DbErrorKind::Denied,
        "not granted",
    );
}

#[test]
fn cte_names_shadow_tables_only_where_sql_resolves_them() {
    for kind in BOTH {
        for sql in [
            // A CTE in a subquery does not cover the outer FROM.
            "SELECT * FROM secret, (WITH secret AS (SELECT 1) SELECT * FROM secret) x",
            // A non-recursive CTE body sees the real table of its own name.
            "WITH secret AS (SELECT * FROM secret) SELECT * FROM secret",
            // ... and not the CTEs after it.
            "WITH a AS (SELECT * FROM b), b AS (SELECT 1) SELECT * FROM a",
            // A DML target is always a table.
            "WITH secret AS (SELECT 1) INSERT INTO secret VALUES (1)",
            "WITH secret AS (SELECT 1) DELETE FROM secret",
            // Qualified names never refer to a CTE.
            "WITH secret AS (SELECT 1) SELECT * FROM other.secret",
        ] {
            let e = guard(kind).check(sql).expect_err(sql);
            assert_eq!(e.kind, DbErrorKind::Denied, "{kind:?} {sql}: {}", e.message);
        }
    }
}

#[test]
fn one_statement_only() {
    for kind in BOTH {
        refused(
            kind,
            "SELECT 1; SELECT 2",
            DbErrorKind::Denied,
            "2 statements in one call",
        );
        refused(
            kind,
            "SELECT * FROM accounts; DROP TABLE accounts",
            DbErrorKind::Denied,
            "2 statements",
        );
        refused(kind, "", DbErrorKind::Denied, "empty statement");
        refused(kind, "-- nothing", DbErrorKind::Denied, "empty statement");
        refused(kind, "SELEC 1", DbErrorKind::Syntax, "does not parse");
        refused(kind, "SELECT * FROM", DbErrorKind::Syntax, "does not parse");
    }
}

#[test]
fn only_select_insert_update_delete() {
    for kind in BOTH {
        for (sql, word) in [
            ("CREATE TABLE t (x INT)", "CREATE"),
            ("DROP TABLE accounts", "DROP"),
            ("ALTER TABLE accounts ADD COLUMN y INT", "ALTER"),
            ("TRUNCATE accounts", "TRUNCATE"),
            ("CREATE INDEX i ON accounts (balance)", "CREATE"),
            ("COMMIT", "COMMIT"),
            ("ROLLBACK", "ROLLBACK"),
            ("BEGIN", "BEGIN"),
            ("SAVEPOINT x", "SAVEPOINT"),
            ("RELEASE SAVEPOINT idem_stmt", "RELEASE"),
            ("EXPLAIN SELECT * FROM accounts", "EXPLAIN"),
        ] {
            refused(
                kind,
                sql,
                DbErrorKind::Denied,
                &format!("{word} statements are not allowed"),
            );
        }
        refused(
            kind,
            "SELECT * INTO copy FROM accounts",
            DbErrorKind::Denied,
            "SELECT INTO",
        );
    }
    for sql in [
        "SET search_path = other",
        "SET LOCAL statement_timeout = 0",
        "RESET ALL",
    ] {
        let e = guard(DbKind::Postgres).check(sql).expect_err(sql);
        assert_eq!(e.kind, DbErrorKind::Denied, "{sql}: {}", e.message);
    }
    for sql in ["ATTACH DATABASE 'x.db' AS x", "VACUUM"] {
        let e = guard(DbKind::Sqlite).check(sql).expect_err(sql);
        assert!(
            matches!(e.kind, DbErrorKind::Denied | DbErrorKind::Syntax),
            "{sql}: {e:?}"
        );
    }
    for sql in [
        "COPY accounts TO '/tmp/x'",
        "LOCK TABLE accounts",
        "DO $$ BEGIN END $$",
        "GRANT ALL ON accounts TO public",
    ] {
        let e = guard(DbKind::Postgres).check(sql).expect_err(sql);
        assert!(
            matches!(e.kind, DbErrorKind::Denied | DbErrorKind::Syntax),
            "{sql}: {e:?}"
        );
    }
}

#[test]
fn functions_outside_the_allow_list_are_refused() {
    for kind in BOTH {
        for sql in [
            "SELECT pg_sleep(10)",
            "SELECT now()",
            "SELECT CURRENT_TIMESTAMP",
            "SELECT current_date",
            "SELECT random()",
            "SELECT current_setting('search_path')",
            "SELECT set_config('x', 'y', true)",
            "SELECT nextval('s')",
            "SELECT pg_read_file('/etc/passwd')",
            "SELECT datetime('now')",
            "SELECT load_extension('x')",
            "SELECT pg_catalog.lower('A')",
            "SELECT * FROM accounts WHERE balance > (SELECT pg_sleep(1))",
        ] {
            refused(
                kind,
                sql,
                DbErrorKind::Denied,
                "is not allowed in handler SQL",
            );
        }
        refused(
            kind,
            "SELECT * FROM generate_series(1, 3)",
            DbErrorKind::Denied,
            "table function",
        );
        refused(
            kind,
            "SELECT * FROM pragma_table_info('accounts')",
            DbErrorKind::Denied,
            "table function",
        );
        refused(
            kind,
            "SELECT * FROM json_each('[1]')",
            DbErrorKind::Denied,
            "table function",
        );
        allowed(
            kind,
            "SELECT lower(x), UPPER(y), abs(z), round(w, 2), nullif(a, b) FROM accounts",
        );
    }
}

#[test]
fn catalogs_and_other_schemas_are_refused() {
    for kind in BOTH {
        refused(
            kind,
            "SELECT * FROM pg_catalog.pg_class",
            DbErrorKind::Denied,
            "system catalog",
        );
        refused(
            kind,
            "SELECT * FROM information_schema.tables",
            DbErrorKind::Denied,
            "system catalog",
        );
        refused(
            kind,
            "SELECT * FROM sqlite_master",
            DbErrorKind::Denied,
            "system catalog",
        );
        refused(
            kind,
            "SELECT * FROM sqlite_schema",
            DbErrorKind::Denied,
            "system catalog",
        );
        refused(
            kind,
            "SELECT * FROM pg_class",
            DbErrorKind::Denied,
            "system table",
        );
        refused(
            kind,
            "SELECT * FROM sqlite_sequence",
            DbErrorKind::Denied,
            "system table",
        );
        refused(
            kind,
            "SELECT * FROM other.accounts",
            DbErrorKind::Denied,
            "schema `other` is not allowed",
        );
        refused(
            kind,
            "SELECT * FROM db.public.accounts",
            DbErrorKind::Denied,
            "too many parts",
        );
    }
    refused(
        DbKind::Sqlite,
        "SELECT * FROM temp.accounts",
        DbErrorKind::Denied,
        "schema `temp`",
    );
    refused(
        DbKind::Postgres,
        "SELECT * FROM main.accounts",
        DbErrorKind::Denied,
        "schema `main`",
    );
}

#[test]
fn comments_and_quotes_cannot_smuggle_statements() {
    for kind in BOTH {
        // What reaches the database is re-printed from the AST: comments are gone.
        assert_eq!(
            allowed(kind, "SELECT 1 -- ; DROP TABLE accounts").as_str(),
            "SELECT 1"
        );
        assert_eq!(
            allowed(kind, "SELECT /* ; DROP TABLE accounts; */ 1").as_str(),
            "SELECT 1"
        );
        assert_eq!(
            allowed(kind, "SELECT '; DROP TABLE accounts; --' FROM accounts").as_str(),
            "SELECT '; DROP TABLE accounts; --' FROM accounts"
        );
        assert_eq!(
            allowed(
                kind,
                "SELECT 'it''s' FROM accounts WHERE x = 'a'';DELETE FROM accounts;--'"
            )
            .as_str(),
            "SELECT 'it''s' FROM accounts WHERE x = 'a'';DELETE FROM accounts;--'"
        );
        refused(
            kind,
            "SELECT 'unterminated",
            DbErrorKind::Syntax,
            "does not parse",
        );
        refused(
            kind,
            "SELECT \"x\"\"; DROP TABLE accounts; --\" FROM secret",
            DbErrorKind::Denied,
            "not granted",
        );
    }
    // SQLite, like sqlparser's SQLite dialect, ends an unterminated comment at the end of input.
    assert_eq!(
        allowed(DbKind::Sqlite, "SELECT 1 /* unterminated").as_str(),
        "SELECT 1"
    );
    refused(
        DbKind::Postgres,
        "SELECT 1 /* unterminated",
        DbErrorKind::Syntax,
        "does not parse",
    );
    // PostgreSQL nests block comments: the whole first comment is one comment.
    assert_eq!(
        allowed(DbKind::Postgres, "SELECT /* /* */ 1; DROP TABLE x; */ 2").as_str(),
        "SELECT 2"
    );
    // A backslash does not escape a quote (standard_conforming_strings).
    assert_eq!(
        allowed(DbKind::Postgres, "SELECT 'a\\' FROM accounts --'").as_str(),
        "SELECT 'a\\' FROM accounts"
    );
    refused(
        DbKind::Postgres,
        "SELECT $$; DROP TABLE accounts; $$ FROM secret",
        DbErrorKind::Denied,
        "not granted",
    );
}

#[test]
fn placeholders_are_dollar_numbers() {
    for kind in BOTH {
        assert_eq!(
            allowed(kind, "SELECT $3, $1 FROM accounts").param_count(),
            3
        );
        for sql in [
            "SELECT $0",
            "SELECT $01",
            "SELECT $a",
            "SELECT :a",
            "SELECT $65536",
        ] {
            refused(kind, sql, DbErrorKind::Denied, "write parameters as $1..$n");
        }
        let e = guard(kind).check("SELECT ?").expect_err("?");
        assert!(
            matches!(e.kind, DbErrorKind::Denied | DbErrorKind::Syntax),
            "{e:?}"
        );
    }
    refused(
        DbKind::Sqlite,
        "SELECT ?1",
        DbErrorKind::Denied,
        "write parameters as $1..$n",
    );
    refused(
        DbKind::Sqlite,
        "SELECT @a",
        DbErrorKind::Denied,
        "write parameters as $1..$n",
    );
}

#[test]
fn typed_text_names_the_parameter_types() {
    let c = allowed(DbKind::Postgres, "SELECT $1, $2, $3, $4, $5, $6");
    let params = [
        SqlValue::Integer(1),
        SqlValue::Text("x".into()),
        SqlValue::Null,
        SqlValue::Float(1.5),
        SqlValue::Bytes(vec![1]),
        SqlValue::Boolean(true),
    ];
    assert_eq!(
        c.to_sqlx_typed(&params).0,
        "SELECT $1, $2, $3, $4, $5, $6\n-- idem:itnfbo"
    );
    let c = allowed(DbKind::Postgres, "SELECT 1");
    assert_eq!(c.to_sqlx_typed(&[]).0, "SELECT 1");
    assert_eq!(&*c.to_sqlx().0, "SELECT 1");
}

#[test]
fn verdicts_are_cached_and_the_size_is_bounded() {
    let g = guard(DbKind::Postgres);
    let a = g.check("SELECT * FROM accounts").unwrap();
    assert_eq!(g.check("SELECT * FROM accounts").unwrap(), a);
    let e = g.check("SELECT * FROM secret").unwrap_err();
    assert_eq!(g.check("SELECT * FROM secret").unwrap_err(), e);
    for i in 0..(CACHE_CAPACITY + 10) {
        g.check(&format!("SELECT {i} FROM accounts")).unwrap();
    }
    assert!(g.lock_cache().len() <= CACHE_CAPACITY);
    let long = format!(
        "SELECT 1 FROM accounts WHERE x = '{}'",
        "a".repeat(MAX_SQL_BYTES)
    );
    refused(
        DbKind::Postgres,
        &long,
        DbErrorKind::Denied,
        "the limit is 65536",
    );
}

#[test]
fn casts_to_plain_value_types_pass() {
    for kind in BOTH {
        for sql in [
            "SELECT CAST(balance AS INTEGER), CAST(balance AS REAL), CAST(balance AS TEXT) FROM accounts",
            "SELECT CAST(x AS BLOB), CAST(x AS NUMERIC), CAST(x AS NUMERIC(10, 2)) FROM accounts",
            "SELECT x::int, x::int4, x::int8, x::bigint, x::smallint, x::int2 FROM accounts",
            "SELECT x::decimal(10, 2), x::real, x::float, x::float8, x::double precision FROM accounts",
            "SELECT x::varchar(10), x::character varying, x::char(2), x::boolean, x::bool FROM accounts",
            "SELECT x::bytea, x::json, x::jsonb, x::uuid, x::interval FROM accounts",
            "SELECT x::date, x::time, x::timestamp, x::timestamptz, x::timestamp with time zone FROM accounts",
            "SELECT TRY_CAST(x AS bigint) FROM accounts",
            "SELECT $1::timestamptz, CAST($2 AS date)",
            "SELECT '2024-01-02 03:04:05+00'::timestamptz, CAST('2024-01-02' AS date)",
            "SELECT TIMESTAMP '2024-01-02 03:04:05', DATE '2024-01-02', TIME '10:00'",
            "SELECT 'epoch'::timestamp, 'allballs'::time, '1 day'::interval",
            "SELECT 'knowledge', 'nowhere', 'todays' FROM accounts",
        ] {
            allowed(kind, sql);
        }
    }
    assert_eq!(
        allowed(DbKind::Postgres, "SELECT x::int8 FROM accounts").as_str(),
        "SELECT x::INT8 FROM accounts"
    );
}

#[test]
fn casts_to_catalog_and_other_types_are_refused() {
    for kind in BOTH {
        for (sql, needle) in [
            (
                "SELECT 'idem_receipts'::regclass::oid::bigint AS o",
                "cast to `oid` is not allowed: oids identify system catalog objects",
            ),
            (
                "SELECT 'accounts'::regclass",
                "cast to `REGCLASS` is not allowed: reg* types look names up in the system catalogs",
            ),
            (
                "SELECT CAST('pg_authid' AS regclass)::text",
                "cast to `REGCLASS` is not allowed",
            ),
            ("SELECT TRY_CAST('x' AS regproc)", "cast to `regproc`"),
            ("SELECT 'int4'::regtype", "reg* types look names up"),
            ("SELECT 'public'::regnamespace", "reg* types"),
            ("SELECT 'postgres'::regrole", "reg* types"),
            ("SELECT 'now()'::regprocedure", "reg* types"),
            ("SELECT 'x'::\"regclass\"", "reg* types"),
            ("SELECT REGCLASS 'accounts'", "cast to `REGCLASS`"),
            (
                "SELECT '(0,1)'::tid",
                "cast to `tid` is not allowed: it exposes server internals",
            ),
            ("SELECT '1'::xid", "server internals"),
            ("SELECT '0/0'::pg_lsn", "cast to `pg_lsn`"),
            ("SELECT x::pg_snapshot FROM accounts", "server internals"),
            (
                "SELECT x::money FROM accounts",
                "casts may target only plain value types (",
            ),
            (
                "SELECT x::my_enum FROM accounts",
                "cast to `my_enum` is not allowed",
            ),
        ] {
            refused(kind, sql, DbErrorKind::Denied, needle);
        }
    }
    // On SQLite `oid '1'` is the rowid column with an alias, `[]` a quoted alias.
    for (sql, needle) in [
        (
            "SELECT oid '1'",
            "cast to `oid` is not allowed: oids identify system catalog objects",
        ),
        (
            "SELECT x::int[] FROM accounts",
            "cast to `INT[]` is not allowed",
        ),
        ("SELECT '{1}'::text[]", "cast to `TEXT[]` is not allowed"),
        (
            "SELECT 'accounts'::pg_catalog.regclass",
            "cast to `pg_catalog.regclass` is not allowed: reg* types",
        ),
    ] {
        refused(DbKind::Postgres, sql, DbErrorKind::Denied, needle);
    }
}

#[test]
fn clock_literals_are_refused_on_postgres() {
    let exact = "reads the database clock; pass times in the message instead";
    for (sql, literal) in [
        ("SELECT 'now'::timestamptz::text AS t", "now"),
        ("SELECT CAST(CAST('now' AS timestamp) AS text) AS t", "now"),
        ("SELECT 'today'::date::text AS d", "today"),
        ("SELECT TRY_CAST('Tomorrow' AS date)", "Tomorrow"),
        ("SELECT TIMESTAMP 'now'", "now"),
        ("SELECT DATE 'today'", "today"),
        ("SELECT TIME 'NOW'", "NOW"),
        ("SELECT ' yesterday '::date", "yesterday"),
        ("SELECT E'\\tnow\\n'::timestamptz", "now"),
        ("SELECT $$now$$::timestamptz", "now"),
        ("SELECT U&'n\\006Fw'::timestamp", "now"),
        ("INSERT INTO ledger (at) VALUES ('now')", "now"),
        (
            "UPDATE accounts SET balance = 1 WHERE created < 'today'",
            "today",
        ),
        ("SELECT * FROM accounts WHERE x = (SELECT 'now')", "now"),
    ] {
        refused(
            DbKind::Postgres,
            sql,
            DbErrorKind::Denied,
            &format!("the literal '{literal}' {exact}"),
        );
    }
    // Date/time input reads the clock word as one field among others.
    for (sql, word) in [
        ("SELECT 'today 10:00'::timestamp", "today"),
        ("SELECT '10:00today'::timestamp", "today"),
        (
            "SELECT 'tomorrow America/New_York'::timestamptz",
            "tomorrow",
        ),
        (
            "INSERT INTO ledger (at) VALUES ('yesterday allballs')",
            "yesterday",
        ),
        ("SELECT 'ship today' FROM accounts", "today"),
    ] {
        refused(
            DbKind::Postgres,
            sql,
            DbErrorKind::Denied,
            &format!("contains '{word}', which PostgreSQL reads from the database clock"),
        );
    }
    // Long or multi-line literals are shown shortened, on one line.
    let long = format!("SELECT 'now\n{}'", "x ".repeat(50));
    let e = guard(DbKind::Postgres).check(&long).unwrap_err();
    assert!(
        e.message.starts_with("the literal 'now x x"),
        "{}",
        e.message
    );
    assert!(e.message.contains("...' contains 'now'"), "{}", e.message);
    // The function check still names the function.
    refused(
        DbKind::Postgres,
        "SELECT datetime('now')",
        DbErrorKind::Denied,
        "function `datetime` is not allowed",
    );
}

#[test]
fn sqlite_casts_of_clock_words_are_plain_values() {
    // SQLite has no date/time input: CAST('now' AS TIMESTAMP) is 0 there.
    for sql in [
        "SELECT CAST('now' AS TIMESTAMP) AS t",
        "SELECT CAST('today' AS DATE) AS d",
        "INSERT INTO ledger (note) VALUES ('see you tomorrow')",
    ] {
        allowed(DbKind::Sqlite, sql);
    }
}

#[test]
fn clock_words_are_whole_letter_runs() {
    use casts::clock_word;
    assert_eq!(clock_word("now"), Some("now"));
    assert_eq!(clock_word(" NoW\t"), Some("now"));
    assert_eq!(clock_word("2024-01-01 today"), Some("today"));
    assert_eq!(clock_word("+tomorrow"), Some("tomorrow"));
    assert_eq!(clock_word("yesterday,12:00"), Some("yesterday"));
    for text in [
        "",
        "nowhere",
        "known",
        "todays",
        "n ow",
        "epoch",
        "2024-01-01",
        "tod",
    ] {
        assert_eq!(clock_word(text), None, "{text:?}");
    }
}
