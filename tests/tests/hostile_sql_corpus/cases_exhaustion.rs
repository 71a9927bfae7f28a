//! Work built to exhaust the host: sleeps past the deadline, values and
//! results that would fill its memory, and nesting deep enough to exhaust
//! a parser's or the judge's stack.

use crate::outcome::{Ctx, Group, Outcome, int_row, q, qp, steps, x};
use serde_json::json;

pub(crate) fn sleeps(ctx: &Ctx) -> Group {
    let mut g = Group::new("sleeps", ctx);
    for sql in [
        "SELECT pg_sleep(25) AS s",
        "SELECT pg_sleep_for('25 seconds') AS s",
        "SELECT pg_sleep_until('2100-01-01') AS s",
        "SELECT count(*) AS n FROM accounts WHERE pg_sleep(25) IS NULL",
        "SELECT * FROM pg_sleep(25)",
    ] {
        g.refused(q(sql));
    }
    g.add(
        "",
        steps(
            &[
                ("sql", "SET LOCAL statement_timeout = 0"),
                ("query", "SELECT pg_sleep(25) AS s"),
            ],
            true,
        ),
        Outcome::RefusedAt(0),
    );
    g.refused(x("DO 'BEGIN PERFORM pg_sleep(25); END'"));
    // Allowed, and never ends by itself: the deadline stops it, and the
    // checks after the group find no backend still running it.
    let forever = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) AS c FROM r";
    g.add("never-ends", q(forever), Outcome::Trap);
    g.add(
        "statement-timeout-hidden-then-never-ends",
        steps(
            &[
                (
                    "query",
                    r"SELECT '\'' AS a, set_config($$statement_timeout$$, $$0$$, true) AS t --'",
                ),
                ("query", forever),
            ],
            true,
        ),
        Outcome::Trap,
    );
    g
}

/// Values and results built to exhaust the host's memory.
pub(crate) fn memory(ctx: &Ctx) -> Group {
    let mut g = Group::new("memory", ctx);
    for sql in [
        "SELECT zeroblob(2000000000) AS b",
        "SELECT randomblob(2000000000) AS b",
        "SELECT length(zeroblob(2000000000)) AS n",
        "SELECT printf('%.*c', 2000000000, 'x') AS s",
        "SELECT repeat('x', 1000000000) AS s",
        "SELECT lpad('x', 1000000000) AS s",
        "SELECT string_agg(v, ',') AS s FROM secrets",
        "SELECT array_fill(1, ARRAY[100000000]) AS a",
    ] {
        g.refused(q(sql));
    }
    // Allowed functions that multiply a value: each replace makes it ten
    // times longer (10^10 bytes). SQLite's value bound stops it; PostgreSQL
    // fails past its 1 GB field limit.
    let mut grow = "'xxxxxxxxxx'".to_owned();
    for _ in 0..9 {
        grow = format!("replace({grow}, 'x', 'xxxxxxxxxx')");
    }
    // PostgreSQL builds 1 GB before it fails, which may pass the deadline.
    let o = g.by(Outcome::Failed, Outcome::Refused);
    g.add(
        "replace-nesting",
        q(&format!("SELECT {grow} AS s")),
        o.clone(),
    );
    g.add(
        "replace-nesting-length",
        q(&format!("SELECT length({grow}) AS n")),
        o,
    );
    // A doubling CTE: 32 MiB in one value, returned (more than
    // max_result_kib) or only measured (PostgreSQL computes it; SQLite's
    // value bound stops it).
    let doubling = |n: u32, what: &str| {
        format!(
            "WITH RECURSIVE r(n, s) AS (SELECT 1, CAST('x' AS TEXT) UNION ALL SELECT n + 1, s || s FROM r WHERE n < {n}) SELECT {what} FROM r WHERE n = {n}"
        )
    };
    g.add("doubling-value", q(&doubling(26, "s")), Outcome::Refused);
    let o = g.by(int_row(1 << 25), Outcome::Refused);
    g.add("doubling-length", q(&doubling(26, "length(s) AS n")), o);
    // Many rows of 1 MiB each: the message's result bound stops them.
    g.add(
        "many-megabyte-rows",
        q("WITH RECURSIVE r(n, s) AS (SELECT 1, CAST('x' AS TEXT) UNION ALL SELECT n + 1, CASE WHEN n < 21 THEN s || s ELSE s END FROM r WHERE n < 100) SELECT s FROM r WHERE n > 21"),
        Outcome::Refused,
    );
    // More rows than max_rows.
    g.add(
        "million-rows",
        q("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 1000000) SELECT n FROM r"),
        Outcome::Refused,
    );
    // A parameter past max_param_kib (512 KiB here).
    g.add(
        "parameter-past-max-param-kib",
        qp(
            "SELECT length(CAST($1 AS TEXT)) AS n",
            json!(["x".repeat(600 * 1024)]),
        ),
        Outcome::Refused,
    );
    g
}

/// Statements nested deep enough to exhaust a parser's or the judge's
/// stack, and long flat ones that are fine.
pub(crate) fn nesting(ctx: &Ctx) -> Group {
    let mut g = Group::new("nesting", ctx);
    let n = 20_000;
    // SQLite's parser keeps no node for redundant parentheses.
    let o = g.by(Outcome::Refused, int_row(1));
    g.add(
        "parentheses",
        q(&format!("SELECT {}1{} AS n", "(".repeat(n), ")".repeat(n))),
        o,
    );
    g.add(
        "scalar-subqueries",
        q(&format!(
            "SELECT {}1{} AS n",
            "(SELECT ".repeat(5000),
            ")".repeat(5000)
        )),
        Outcome::Refused,
    );
    g.add(
        "plus-chain",
        q(&format!("SELECT 1{} AS n", "+1".repeat(n))),
        Outcome::Refused,
    );
    g.add(
        "not-chain",
        q(&format!("SELECT {}true AS b", "NOT ".repeat(n / 2))),
        Outcome::Refused,
    );
    g.add(
        "minus-chain",
        q(&format!("SELECT {}1 AS n", "- ".repeat(n))),
        Outcome::Refused,
    );
    g.add(
        "case-chain",
        q(&format!(
            "SELECT {}1{} AS n",
            "CASE WHEN 1 = 1 THEN ".repeat(2000),
            " END".repeat(2000)
        )),
        Outcome::Refused,
    );
    g.add(
        "union-chain",
        q(&format!(
            "SELECT 1 AS n{}",
            " UNION ALL SELECT 1".repeat(3000)
        )),
        Outcome::Refused,
    );
    g.add(
        "array-brackets",
        q(&format!(
            "SELECT ARRAY{}1{} AS a",
            "[".repeat(n),
            "]".repeat(n)
        )),
        Outcome::Refused,
    );
    g.add(
        "subquery-in-from",
        q(&format!(
            "SELECT * FROM {}(SELECT v FROM secrets) s0{}",
            "(SELECT * FROM ".repeat(3000),
            ") s".repeat(3000)
        )),
        Outcome::Refused,
    );
    // Long and flat: allowed.
    let list: Vec<String> = (1..=10_000).map(|i| i.to_string()).collect();
    g.add(
        "long-in-list",
        q(&format!("SELECT 1 AS n WHERE 1 IN ({})", list.join(","))),
        int_row(1),
    );
    g
}
