//! Hostile guests, SQL shape and cost: two statements in one
//! string, comment and quote injection, `pg_sleep`, a million rows, a
//! statement that never ends, the statement budget and size. Each runs
//! through the real host next to a well-behaved handler ([`Arena`]), on
//! PostgreSQL and SQLite; most after the message has credited
//! [`Arena::VICTIM`], so a refusal must roll that credit back too. Every
//! refusal is asserted by its exact dead-letter reason ([`Arena::refused`]).
//! What statements may touch: `hostile_sql_reach.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use serde_json::json;
use std::time::Duration;

async fn arena(backend: Backend, extra: &str) -> Arena {
    Arena::start(backend, extra, Arena::SQL_SETUP).await
}

async fn two_statements_in_one_string(backend: Backend) {
    let a = arena(backend, "").await;
    let cases = [
        Case::several(
            backend,
            "sql",
            "INSERT INTO accounts (account_id, balance) VALUES (3, 1); DELETE FROM accounts",
            2,
        ),
        Case::several(backend, "sql", "SELECT 1; DELETE FROM accounts", 2),
        Case::several(backend, "sql", "SELECT 1;;DELETE FROM accounts", 2),
        Case::several(backend, "query", "SELECT 1 AS n; SELECT 2 AS n", 2),
        Case::denied("sql", ";", "empty statement; send exactly one"),
    ];
    a.refused(&cases, Duration::from_secs(10)).await;
    assert_eq!(a.db.balance(3).await, None);
    a.stop().await;
}
on_both_databases!(two_statements_in_one_string, two_statements_in_one_string);

/// Strings built to smuggle a second statement past a naive check. The
/// database runs exactly the text its own grammar judged, so each one is
/// either one harmless SELECT (its exact rows show what ran) or refused.
async fn comment_and_quote_injection(backend: Backend) {
    let a = arena(backend, "").await;
    let pg = backend == Backend::Postgres;
    let rows_s = "rejected: rows [\"s\"] [[\"'; DELETE FROM accounts; --\"]]";
    let mut cases = vec![
        Case::exact(
            "query",
            "SELECT 'a' AS s --'; DROP TABLE accounts",
            "rejected: rows [\"s\"] [[\"a\"]]",
        ),
        Case::exact(
            "query",
            "SELECT 'x''; DELETE FROM accounts; --' AS s",
            "rejected: rows [\"s\"] [[\"x'; DELETE FROM accounts; --\"]]",
        ),
        Case::exact(
            "query",
            "SELECT 1 AS n /* ; DELETE FROM accounts; */",
            "rejected: rows [\"n\"] [[1]]",
        ),
        Case::exact(
            "query",
            "SELECT 1 AS \"a\"\"; DELETE FROM accounts; --\"",
            "rejected: rows [\"a\\\"; DELETE FROM accounts; --\"] [[1]]",
        ),
        Case::exact(
            "query",
            "SELECT 1 AS n WHERE 1 = 1 OR '1' = '1'",
            "rejected: rows [\"n\"] [[1]]",
        ),
        // Both databases read `\` as a plain character: the string ends
        // there, and a second statement (the DELETE) follows.
        Case::several(
            backend,
            "query",
            "SELECT 'a\\'; DELETE FROM accounts; --' AS s",
            2,
        ),
    ];
    if pg {
        cases.extend([
            // PostgreSQL nests block comments: all of it is one comment.
            Case::exact(
                "query",
                "SELECT 1 AS n /* /* */ ; DELETE FROM accounts; /* */ */",
                "rejected: rows [\"n\"] [[1]]",
            ),
            Case::exact(
                "query",
                "SELECT E'\\'; DELETE FROM accounts; --' AS s",
                rows_s,
            ),
            Case::exact(
                "query",
                "SELECT $$'; DELETE FROM accounts; --$$ AS s",
                rows_s,
            ),
            Case::exact(
                "query",
                "SELECT $q$ $$; DELETE FROM accounts; $$ $q$ AS s",
                "rejected: rows [\"s\"] [[\" $$; DELETE FROM accounts; $$ \"]]",
            ),
            Case::exact(
                "query",
                "SELECT U&'\\0027; DELETE FROM accounts; --' AS s",
                rows_s,
            ),
        ]);
    } else {
        cases.extend([
            // SQLite does not nest them: the comment ends at the first `*/`,
            // and a DELETE follows.
            Case::several(
                backend,
                "query",
                "SELECT 1 AS n /* /* */ ; DELETE FROM accounts; /* */ */",
                2,
            ),
            // SQLite has no `E''` strings: `E` is a column name (there is no
            // such column) and `'\'` its alias, so the first statement does
            // not compile.
            Case::syntax(
                backend,
                "query",
                "SELECT E'\\'; DELETE FROM accounts; --' AS s",
                "no such column: E",
            ),
            // Nor dollar quotes: `$$` is a parameter name to SQLite, and the
            // `'` after it opens a string that never ends.
            Case::syntax(
                backend,
                "query",
                "SELECT $$'; DELETE FROM accounts; --$$ AS s",
                "unrecognized token: \"'; DELETE FROM accounts; --$$ AS s\"",
            ),
        ]);
    }
    a.refused(&cases, Duration::from_secs(10)).await;
    a.stop().await;
}
on_both_databases!(comment_and_quote_injection, comment_and_quote_injection);

/// The same strings through `execute`, which commits when the statement
/// succeeds: nothing smuggled may have deleted a row.
async fn injection_through_execute_commits_nothing_else(backend: Backend) {
    let a = arena(backend, "").await;
    let mut harmless = vec![
        "SELECT 'a' AS s --'; DROP TABLE accounts",
        "SELECT 'x''; DELETE FROM accounts; --' AS s",
        "SELECT 1 AS n /* ; DELETE FROM accounts; */",
        "SELECT 1 AS \"a\"\"; DELETE FROM accounts; --\"",
    ];
    if backend == Backend::Postgres {
        harmless.extend([
            "SELECT 1 AS n /* /* */ ; DELETE FROM accounts; /* */ */",
            "SELECT E'\\'; DELETE FROM accounts; --' AS s",
            "SELECT $$'; DELETE FROM accounts; --$$ AS s",
            "SELECT U&'\\0027; DELETE FROM accounts; --' AS s",
        ]);
    }
    let ids: Vec<String> = (0..harmless.len()).map(|i| format!("evt_x{i}")).collect();
    let payloads: Vec<_> = harmless
        .iter()
        .zip(&ids)
        .map(|(sql, id)| json!({"op": "sql", "event_id": id, "sql": sql}))
        .collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let r = a.run(&payloads, &ids, Duration::from_secs(10)).await;
    let n = harmless.len() as u64;
    let s = r.stats;
    assert_eq!(
        (
            s.delivered,
            s.processed,
            s.retried,
            s.dead_lettered,
            s.traps
        ),
        (n + 1, n + 1, 0, 0, 0),
        "{s} {:?}",
        r.dead_letters
    );
    a.intact(3).await;
    a.stop().await;
}
on_both_databases!(
    injection_through_execute_commits_nothing_else,
    injection_through_execute_commits_nothing_else
);

/// `pg_sleep` in every spelling is refused before it runs: had one slept,
/// the 5 s deadline would have trapped it instead.
async fn pg_sleep_is_refused_before_it_runs(backend: Backend) {
    let a = arena(backend, "").await;
    let sql = [
        "SELECT pg_sleep(10)",
        "SELECT PG_SLEEP(10)",
        "SELECT \"pg_sleep\"(10)",
        "SELECT pg_catalog.pg_sleep(10)",
        "SELECT count(*) FROM accounts WHERE pg_sleep(10) IS NULL",
        "SELECT pg_sleep_for('10 seconds')",
        "SELECT * FROM pg_sleep(10)",
        "SELECT randomblob(1000000000)",
    ];
    let cases = match backend {
        // PostgreSQL's parser folds unquoted names, so every spelling is
        // `pg_sleep` to the judge.
        Backend::Postgres => vec![
            Case::function(sql[0], "pg_sleep"),
            Case::function(sql[1], "pg_sleep"),
            Case::function(sql[2], "pg_sleep"),
            Case::function(sql[3], "pg_catalog.pg_sleep"),
            Case::function(sql[4], "pg_sleep"),
            Case::function(sql[5], "pg_sleep_for"),
            Case::denied(
                "query",
                sql[6],
                "functions in FROM (generate_series, ROWS FROM, ...) are not allowed in \
                 handler SQL; read granted tables",
            ),
            Case::function(sql[7], "randomblob"),
        ],
        // SQLite has no pg_sleep: its compiler refuses the unknown names
        // (a schema-qualified call is no SQLite syntax). `randomblob` is a
        // SQLite function: the authorizer refuses it.
        Backend::Sqlite => {
            let no = |i: usize, what: &str| Case::syntax(backend, "query", sql[i], what);
            vec![
                no(0, "no such function: pg_sleep"),
                no(1, "no such function: PG_SLEEP"),
                no(2, "no such function: pg_sleep"),
                no(3, "near \"(\": syntax error"),
                no(4, "no such function: pg_sleep"),
                no(5, "no such function: pg_sleep_for"),
                no(6, "no such table: pg_sleep"),
                Case::function(sql[7], "randomblob"),
            ]
        }
    };
    let r = a.refused(&cases, Duration::from_secs(60)).await;
    eprintln!(
        "{backend:?}: {} pg_sleep-like statements refused, all settled in {:?}",
        cases.len(),
        r.elapsed
    );
    a.stop().await;
}
on_both_databases!(
    pg_sleep_is_refused_before_it_runs,
    pg_sleep_is_refused_before_it_runs
);

fn counting(n: u64) -> String {
    format!(
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < {n}) SELECT n FROM r"
    )
}

/// `generate_series` is refused (a function on PostgreSQL; SQLite has none),
/// so a recursive CTE makes the rows. The runtime caps a query at `Limits::default().max_rows`.
async fn a_million_rows(backend: Backend) {
    let a = arena(backend, "").await;
    let max = idem::runtime::Limits::default().max_rows as u64;
    let too_many = format!(
        "rejected: other: query returned more than {max} rows; add a LIMIT or narrow the WHERE"
    );
    let cases = [
        Case::exact("query", counting(1_000_000), too_many.clone()),
        Case::exact("query", counting(max + 1), too_many),
        // Exactly the cap is fine: the rows reach the guest (its reason is
        // cut to the runtime's 4096 bytes).
        Case::prefix(
            "query",
            counting(max),
            "rejected: rows [\"n\"] [[1],[2],[3],",
        ),
        match backend {
            Backend::Postgres => {
                Case::function("SELECT generate_series(1, 1000000) AS n", "generate_series")
            }
            // SQLite is built without generate_series.
            Backend::Sqlite => Case::syntax(
                backend,
                "query",
                "SELECT generate_series(1, 1000000) AS n",
                "no such function: generate_series",
            ),
        },
        match backend {
            Backend::Postgres => Case::denied(
                "query",
                "SELECT * FROM generate_series(1, 1000000)",
                "functions in FROM (generate_series, ROWS FROM, ...) are not allowed in \
                 handler SQL; read granted tables",
            ),
            Backend::Sqlite => Case::syntax(
                backend,
                "query",
                "SELECT * FROM generate_series(1, 1000000)",
                "no such table: generate_series",
            ),
        },
    ];
    let r = a.refused(&cases, Duration::from_secs(30)).await;
    let at_cap = &r.dead_letters[2].1;
    assert!(at_cap.ends_with(" more bytes)"), "{at_cap}");
    eprintln!(
        "{backend:?}: million-row queries settled in {:?}",
        r.elapsed
    );
    a.stop().await;
}
on_both_databases!(a_million_rows, a_million_rows);

/// One 32 MiB value (a doubling recursive CTE), for a guest limited to 16 MiB.
const BIG_VALUE: &str = "WITH RECURSIVE r(n, s) AS (SELECT 1, 'x' UNION ALL SELECT n + 1, s || s \
                         FROM r WHERE n < 26) SELECT s FROM r WHERE n = 26";

/// Runs [`BIG_VALUE`] as one hostile message (`max_memory_mib = 16`,
/// `max_deliver = 1` and `extra`) and returns its dead-letter reason, having
/// checked that it was the only one and that its credit was rolled back;
/// `trapped`: whether the guest trapped.
async fn big_value(backend: Backend, extra: &str, trapped: bool) -> String {
    let a = arena(
        backend,
        &format!("max_memory_mib = 16\nmax_deliver = 1\n{extra}"),
    )
    .await;
    let hostile = [Arena::credit_then(
        "evt_big",
        json!({"op": "query", "sql": BIG_VALUE}),
    )];
    let r = a.run(&hostile, &[], Duration::from_secs(20)).await;
    let s = r.stats;
    assert_eq!(
        (
            s.delivered,
            s.processed,
            s.retried,
            s.dead_lettered,
            s.traps
        ),
        (2, 1, 0, 1, u64::from(trapped)),
        "{s}"
    );
    assert_eq!(r.dead_letters.len(), 1, "{:?}", r.dead_letters);
    let (id, reason) = r.dead_letters[0].clone();
    assert_eq!(id.as_deref(), Some("evt_big"));
    assert_eq!(a.db.balance(Arena::VICTIM).await, None);
    a.intact(3).await;
    a.stop().await;
    reason
}

/// Few rows but many bytes. With the default `max_result_kib` (8192) the
/// value never reaches the guest: the statement fails with a `db-error` the
/// guest rejects with, not a trap. On PostgreSQL the row has arrived and
/// passes the message's result bound; on SQLite the value bound
/// (`SQLITE_LIMIT_LENGTH`, the larger of `max_result_kib` and
/// `max_param_kib`) stops the CTE while it builds the string.
async fn a_value_larger_than_guest_memory(backend: Backend) {
    let reason = big_value(backend, "", false).await;
    let want = match backend {
        Backend::Postgres => {
            "rejected: other: query results passed the 8192 KiB this message may read \
             (max_result_kib); select fewer columns or rows"
        }
        Backend::Sqlite => "rejected: other: string or blob too big (SQLite code 18)",
    };
    assert_eq!(reason, want);
}
on_both_databases!(
    a_value_larger_than_guest_memory,
    a_value_larger_than_guest_memory
);

/// The same value with `max_result_kib` above it (64 MiB): it reaches the
/// host, and lowering it into the guest's memory hits the memory limit: a
/// trap.
async fn a_value_larger_than_guest_memory_past_max_result_kib(backend: Backend) {
    let reason = big_value(backend, "max_result_kib = 65536", true).await;
    assert!(
        reason.starts_with("trap: exceeded the memory limit of 16777216 bytes (asked for ")
            && reason.ends_with(") (delivery 1 of max_deliver 1)"),
        "{reason}"
    );
}
on_both_databases!(
    a_value_larger_than_guest_memory_past_max_result_kib,
    a_value_larger_than_guest_memory_past_max_result_kib
);

/// A statement the guard allows that never ends by itself. The deadline
/// must stop it: the message is dead-lettered as a deadline trap, and the
/// handler (and, on SQLite, every handler: it holds the write lock) goes on.
async fn statement_that_never_ends(backend: Backend) {
    let a = arena(backend, "deadline = \"300ms\"\nmax_deliver = 1").await;
    let forever = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) AS c FROM r";
    let hostile = [Arena::credit_then(
        "evt_forever",
        json!({"op": "query", "sql": forever}),
    )];
    let r = a.run(&hostile, &[], Duration::from_secs(10)).await;
    assert_eq!(
        r.dead_letters,
        [(
            Some("evt_forever".to_string()),
            "trap: exceeded the 300ms deadline (delivery 1 of max_deliver 1)".to_string()
        )]
    );
    assert_eq!(a.db.balance(Arena::VICTIM).await, None);
    tokio::time::timeout(Duration::from_secs(10), a.stop())
        .await
        .expect("the host stops");
}
on_both_databases!(statement_that_never_ends, statement_that_never_ends);

async fn statement_budget_and_size(backend: Backend) {
    let a = arena(backend, "").await;
    let max = idem::runtime::Limits::default().max_statements;
    let long = format!("SELECT 1 AS n /* {} */", "x".repeat(70_000));
    let cases = [
        Case::exact(
            "sql",
            "UPDATE accounts SET balance = balance WHERE account_id = 500",
            format!(
                "rejected: denied: statement budget exhausted: at most {max} statements per message"
            ),
        ),
        Case::exact(
            "sql",
            long.clone(),
            format!(
                "rejected: denied: statement is {} bytes; the limit is {}",
                long.len(),
                idem::sql_guard::MAX_SQL_BYTES
            ),
        ),
    ];
    let mut payloads: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let then = json!({"op": c.op, "sql": c.sql});
            Arena::credit_then(&format!("evt_{i:02}"), then)
        })
        .collect();
    payloads[0]["then"]["repeat"] = json!(max + 1);
    let r = a.run(&payloads, &[], Duration::from_secs(20)).await;
    let s = r.stats;
    assert_eq!((s.processed, s.dead_lettered, s.traps), (1, 2, 0), "{s}");
    for (c, (_, reason)) in cases.iter().zip(&r.dead_letters) {
        assert!(c.reason.matches(reason), "{reason}");
    }
    assert_eq!(a.db.balance(Arena::VICTIM).await, None);
    a.intact(3).await;
    a.stop().await;
}
on_both_databases!(statement_budget_and_size, statement_budget_and_size);
