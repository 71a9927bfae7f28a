//! Reaching `secrets` or the host's tables: upserts and conflict clauses,
//! common table expressions, and views, triggers, subqueries, set
//! operations, RETURNING, joins and attribute notation.

use crate::outcome::{Ctx, Group, Outcome, int_row, q, qp, steps, text_row, x};
use serde_json::json;

pub(crate) fn conflicts(ctx: &Ctx) -> Group {
    let mut g = Group::new("conflict", ctx);
    let pg = g.pg();
    g.add(
        "",
        x("INSERT INTO accounts (account_id, balance) VALUES (1, 0) ON CONFLICT (account_id) DO NOTHING"),
        Outcome::Served,
    );
    g.refused(x("INSERT INTO accounts (account_id, balance) VALUES (1, 0) ON CONFLICT (account_id) DO UPDATE SET balance = (SELECT length(v) FROM secrets)"));
    g.add(
        "",
        x("INSERT INTO accounts (account_id, balance) VALUES (1, 5) ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance"),
        Outcome::Served,
    )
    .effect(1, 5);
    g.refused(x("INSERT INTO accounts (account_id, balance) SELECT id, length(v) FROM secrets ON CONFLICT DO NOTHING"));
    g.refused(x("INSERT INTO accounts (account_id, balance) VALUES (1, 0) ON CONFLICT (account_id) DO UPDATE SET balance = 0 WHERE EXISTS (SELECT 1 FROM secrets)"));
    g.refused(x("INSERT INTO accounts (account_id, balance) VALUES (1, 0) ON CONFLICT (account_id) DO UPDATE SET balance = excluded.balance RETURNING (SELECT v FROM secrets)"));
    g.refused(x("INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms) VALUES ('hostile', 'forged', 1, 'x', 0) ON CONFLICT DO NOTHING"));
    // A unique violation: the statement fails and the guest rejects.
    g.refused(x(
        "INSERT INTO accounts (account_id, balance) VALUES (1, 1)",
    ));
    g.refused(x(
        "INSERT OR ROLLBACK INTO accounts (account_id, balance) VALUES (1, 0)",
    ));
    g.refused(x(
        "INSERT OR ROLLBACK INTO accounts (account_id, balance) VALUES (11, 0)",
    ));
    g.refused(x(
        "INSERT OR ABORT INTO accounts (account_id, balance) VALUES (1, 0)",
    ));
    g.refused(x(
        "INSERT OR FAIL INTO accounts (account_id, balance) VALUES (1, 0)",
    ));
    let o = g.by(Outcome::Refused, Outcome::Served);
    g.add(
        "",
        x("INSERT OR IGNORE INTO accounts (account_id, balance) VALUES (1, 0)"),
        o,
    );
    let o = g.by(Outcome::Refused, Outcome::Served);
    let c = g.add(
        "",
        x("INSERT OR REPLACE INTO accounts (account_id, balance) VALUES (4, 44)"),
        o,
    );
    if !pg {
        c.effect(4, 44);
    }
    let o = g.by(Outcome::Refused, Outcome::Served);
    let c = g.add(
        "",
        x("REPLACE INTO accounts (account_id, balance) VALUES (5, 55)"),
        o,
    );
    if !pg {
        c.effect(5, 55);
    }
    g.refused(x(
        "UPDATE OR ROLLBACK accounts SET account_id = 500 WHERE account_id = 1",
    ));
    let o = g.by(Outcome::Refused, Outcome::Served);
    g.add(
        "",
        x("UPDATE OR REPLACE accounts SET balance = balance WHERE account_id = 1"),
        o,
    );
    // `ledger` ends the transaction on SQLite (an ON CONFLICT ROLLBACK key,
    // a RAISE(ROLLBACK) trigger for a negative amount); on PostgreSQL its
    // trigger raises an error.
    let plus_1000 = (
        "sql",
        "UPDATE accounts SET balance = balance + 1000 WHERE account_id = 1",
    );
    g.add(
        "raise-rollback-trigger",
        steps(
            &[
                plus_1000,
                ("sql", "INSERT INTO ledger (id, amount) VALUES (1, -1)"),
                plus_1000,
            ],
            false,
        ),
        Outcome::RefusedAt(1),
    );
    let o = g.by(Outcome::RefusedAt(1), Outcome::RefusedAt(0));
    g.add(
        "on-conflict-rollback-column",
        steps(
            &[
                ("sql", "INSERT INTO ledger (id, amount) VALUES (1, 5)"),
                ("sql", "INSERT INTO ledger (id, amount) VALUES (1, 6)"),
                plus_1000,
            ],
            false,
        ),
        o,
    );
    let o = g.by(
        Outcome::RefusedAt(1),
        Outcome::Reason("rejected: steps []".into()),
    );
    g.add(
        "",
        steps(
            &[
                plus_1000,
                (
                    "sql",
                    "INSERT OR REPLACE INTO accounts (account_id, balance) VALUES (6, 66)",
                ),
            ],
            true,
        ),
        o,
    );
    let o = g.by(Outcome::Served, Outcome::Refused);
    let c = g.add(
        "",
        x("WITH u AS (INSERT INTO accounts (account_id, balance) VALUES (7, 7) ON CONFLICT (account_id) DO UPDATE SET balance = 0 RETURNING *) SELECT * FROM u"),
        o,
    );
    if pg {
        c.effect(7, 7);
    }
    g.refused(x("INSERT INTO accounts (account_id, balance) VALUES (1, 0) ON CONFLICT ON CONSTRAINT accounts_pkey DO UPDATE SET balance = (SELECT id FROM secrets)"));
    g.refused(x("MERGE INTO accounts a USING secrets s ON a.account_id = s.id WHEN MATCHED THEN UPDATE SET balance = 0"));
    g
}

pub(crate) fn ctes(ctx: &Ctx) -> Group {
    let mut g = Group::new("cte", ctx);
    let schema = if g.pg() { "public" } else { "main" };
    g.refused(q(
        "WITH x AS (DELETE FROM secrets RETURNING *) SELECT * FROM x",
    ));
    g.refused(q("WITH x AS (SELECT v FROM secrets) SELECT * FROM x"));
    g.refused(x(
        "WITH x AS (DELETE FROM idem_receipts RETURNING *) SELECT count(*) FROM x",
    ));
    g.refused(x(
        "WITH x AS (UPDATE idem_dead_letters SET reason = 'x' RETURNING 1) SELECT 1",
    ));
    g.refused(x("WITH x AS (INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms) VALUES ('hostile', 'forged', 1, 'x', 0) RETURNING 1) SELECT 1"));
    g.refused(x(
        "WITH x AS (DELETE FROM idem_dead_letters RETURNING 1) SELECT 1",
    ));
    g.add(
        "",
        q("WITH secrets AS (SELECT 'shadow' AS v) SELECT v FROM secrets"),
        text_row("shadow"),
    );
    // A non-recursive WITH item sees only the items before it on PostgreSQL.
    let o = g.by(Outcome::Refused, text_row("shadow"));
    g.add(
        "",
        q("WITH a AS (SELECT v FROM secrets), secrets AS (SELECT 'shadow' AS v) SELECT v FROM a"),
        o,
    );
    g.add(
        "",
        q("WITH RECURSIVE a AS (SELECT v FROM secrets), secrets AS (SELECT 'shadow' AS v) SELECT v FROM a"),
        text_row("shadow"),
    );
    g.refused(q("SELECT * FROM (WITH secrets AS (SELECT 'shadow' AS v) SELECT v FROM secrets) s UNION ALL SELECT v FROM secrets"));
    g.refused(q(&format!(
        "WITH secrets AS (SELECT 'shadow' AS v) SELECT (SELECT v FROM secrets) AS a, (SELECT v FROM {schema}.secrets) AS b"
    )));
    g.refused(x("WITH secrets AS (SELECT 1 AS id) DELETE FROM secrets"));
    // SQLite compiles no unused CTE (nothing reads `secrets`, and the
    // UPDATE's target is the table); PostgreSQL's judge refuses its body.
    let o = g.by(Outcome::Refused, Outcome::Served);
    g.add(
        "unused-cte-reading-secrets",
        x("WITH accounts AS (SELECT * FROM secrets) UPDATE accounts SET balance = 0 WHERE account_id = 999999"),
        o,
    );
    g.refused(x(
        "WITH s AS (SELECT * FROM secrets) UPDATE accounts SET balance = (SELECT length(v) FROM s) WHERE account_id = 999999",
    ));
    g.refused(x(
        "WITH accounts AS (SELECT id AS account_id, length(v) AS balance FROM secrets) UPDATE accounts SET balance = 0 WHERE account_id IN (SELECT account_id FROM accounts)",
    ));
    g.refused(q(
        "WITH accounts AS (SELECT id AS account_id, v FROM secrets) SELECT v FROM accounts",
    ));
    g.add(
        "",
        q("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT n FROM r"),
        Outcome::Rows(json!([[1], [2], [3]])),
    );
    g.refused(q(
        "WITH RECURSIVE r(v) AS (SELECT v FROM secrets UNION SELECT v FROM r) SELECT v FROM r",
    ));
    g.refused(q(
        "WITH x AS MATERIALIZED (SELECT v FROM secrets) SELECT 1 AS n FROM x",
    ));
    let o = g.by(Outcome::Served, Outcome::Refused);
    g.add(
        "",
        x("WITH d AS (DELETE FROM accounts WHERE account_id = 999999 RETURNING account_id) INSERT INTO accounts (account_id, balance) SELECT account_id, 1 FROM d"),
        o,
    );
    // A CTE named like a host table: PostgreSQL's judge refuses the name;
    // on SQLite it is only the CTE.
    let o = g.by(Outcome::Refused, int_row(1));
    g.add(
        "cte-named-idem-receipts",
        q("WITH idem_receipts AS (SELECT 1 AS n) SELECT n FROM idem_receipts"),
        o,
    );
    g.refused(q(
        "WITH x AS (SELECT * FROM accounts) SELECT * FROM x, secrets",
    ));
    g.refused(q(
        "WITH x AS (SELECT 1 AS n) SELECT n FROM x WHERE n IN (SELECT id FROM secrets)",
    ));
    g
}

/// Reaching `secrets` (or the host's tables) through views, triggers,
/// subqueries, set operations, RETURNING, joins and attribute notation.
pub(crate) fn reach(ctx: &Ctx) -> Group {
    let mut g = Group::new("reach", ctx);
    let schema = if g.pg() { "public" } else { "main" };
    for sql in [
        "SELECT v FROM secrets",
        "SELECT count(*) AS n FROM secrets",
        "SELECT length(v) AS n FROM secrets",
        "SELECT account_id FROM accounts UNION SELECT id FROM secrets",
        "SELECT account_id FROM accounts UNION ALL SELECT length(v) FROM secrets",
        "SELECT account_id FROM accounts INTERSECT SELECT id FROM secrets",
        "SELECT account_id FROM accounts EXCEPT SELECT id FROM secrets",
        "SELECT * FROM accounts WHERE account_id IN (SELECT id FROM secrets)",
        "SELECT * FROM accounts WHERE EXISTS (SELECT 1 FROM secrets WHERE v LIKE 'C%')",
        "SELECT * FROM accounts a JOIN secrets s ON s.id = 1",
        "SELECT * FROM accounts NATURAL JOIN secrets",
        "SELECT * FROM accounts, secrets",
        "SELECT * FROM accounts LEFT JOIN secrets ON true",
        "SELECT (SELECT v FROM secrets ORDER BY 1 LIMIT 1) AS s",
        "SELECT account_id FROM accounts ORDER BY (SELECT length(v) FROM secrets)",
        "SELECT account_id FROM accounts GROUP BY account_id HAVING count(*) > (SELECT count(*) FROM secrets)",
        "SELECT account_id FROM accounts LIMIT (SELECT id FROM secrets)",
        "SELECT max(balance) OVER (ORDER BY (SELECT id FROM secrets)) AS m FROM accounts",
        "SELECT * FROM accounts WHERE account_id = 1 OR balance = (SELECT length(v) FROM secrets)",
        "SELECT CASE WHEN (SELECT v FROM secrets) LIKE 'C%' THEN 1 ELSE 0 END AS b",
        "SELECT s.v FROM (SELECT * FROM secrets) s",
        "SELECT secrets.v FROM accounts",
        "SELECT (s).v FROM secrets s",
        "SELECT s FROM secrets s",
        "TABLE secrets",
        "VALUES ((SELECT v FROM secrets))",
        "SELECT * FROM ONLY secrets",
        "SELECT * FROM secrets*",
        "SELECT * FROM test.public.secrets",
        "SELECT (SELECT v FROM secrets) IS NULL AS leaked",
        "SELECT coalesce((SELECT v FROM secrets), 'x') AS s",
        "SELECT * FROM secrets_view",
        "SELECT * FROM accounts WHERE balance = (SELECT count(*) FROM idem_receipts)",
        "SELECT reason FROM idem_dead_letters",
        "UPDATE accounts SET balance = balance WHERE account_id = 500 RETURNING (SELECT v FROM secrets)",
        "DELETE FROM accounts WHERE account_id = 999999 RETURNING (SELECT v FROM secrets)",
    ] {
        g.refused(q(sql));
    }
    g.refused(q(&format!("SELECT * FROM {schema}.secrets")));
    for sql in [
        "UPDATE accounts SET balance = (SELECT length(v) FROM secrets) WHERE account_id = 1",
        "UPDATE accounts SET balance = 0 FROM secrets WHERE account_id = 1",
        "DELETE FROM accounts USING secrets WHERE account_id = 1",
        "INSERT INTO accounts (account_id, balance) SELECT 8, length(v) FROM secrets",
        "INSERT INTO accounts (account_id, balance) VALUES (9, 9) RETURNING (SELECT v FROM secrets)",
        "UPDATE accounts SET balance = balance + 0 WHERE account_id IN (SELECT id FROM secrets_view)",
        "UPDATE secrets SET v = 'pwned'",
        "DELETE FROM secrets",
        "INSERT INTO secrets (id, v) VALUES (2, 'forged')",
        // Granted, but its trigger writes `secrets`: refused (SQLite) or
        // denied by the handler role (PostgreSQL).
        "INSERT INTO notes (id, body) VALUES (1, 'x')",
    ] {
        g.refused(x(sql));
    }
    // The trigger fires on INSERT only; an UPDATE of no row is harmless.
    g.add("", x("UPDATE notes SET body = 'x'"), Outcome::Served);
    g.add(
        "",
        q("SELECT accounts.balance FROM accounts WHERE account_id = 500"),
        int_row(5000),
    );
    g.add(
        "",
        q("SELECT * FROM accounts WHERE account_id = 500"),
        Outcome::Rows(json!([[500, 5000]])),
    );
    g.add(
        "",
        qp("SELECT * FROM accounts WHERE balance = $1", json!([5000])),
        Outcome::Rows(json!([[500, 5000]])),
    );
    g
}
