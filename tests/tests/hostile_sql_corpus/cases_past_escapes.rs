//! The table of past escapes: each statement or sequence that once got
//! past the guard, a named case (`past-escape/...`).

use crate::outcome::{Ctx, Group, Outcome, q, steps, text_row, x};

/// The rows of the table of past escapes: each one a named case.
pub(crate) fn past_escapes(ctx: &Ctx) -> Group {
    let mut g = Group::new("past-escape", ctx);
    // Both: one string literal on both databases (`''` inside quotes is a
    // quote; a backslash is a plain character), so the canary never shows.
    g.add(
        "both-backslash-quote-union-secrets",
        q(r"SELECT '\'' AS a UNION ALL SELECT v FROM secrets --'"),
        text_row(r"\' AS a UNION ALL SELECT v FROM secrets --"),
    );
    g.add(
        "both-backslash-quote-union-secrets-execute",
        x(r"SELECT '\'' AS a UNION ALL SELECT v FROM secrets --'"),
        Outcome::Served,
    );
    // SQLite: the same shape hid statements that deleted receipts, dropped
    // `secrets`, forged a receipt, set writable_schema, attached a file.
    for (label, hidden) in [
        ("delete-receipts", "DELETE FROM idem_receipts"),
        ("drop-secrets", "DROP TABLE secrets"),
        (
            "forge-receipt",
            "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms) VALUES ('hostile', 'forged', 1, 'x', 0)",
        ),
        ("writable-schema", "PRAGMA writable_schema = 1"),
        ("attach-file", "ATTACH DATABASE '{dir}/evil.db' AS evil"),
    ] {
        // Inside the literal the hidden statement's own quotes are doubled;
        // written plainly, its first quote ends the literal and the rest
        // does not compile.
        g.add(
            &format!("sqlite-backslash-quote-{label}"),
            x(&format!(
                r"SELECT '\''; {}; --'",
                hidden.replace('\'', "''")
            )),
            Outcome::Served,
        );
        if hidden.contains('\'') {
            g.add(
                &format!("sqlite-backslash-quote-{label}-plain-quotes"),
                x(&format!(r"SELECT '\''; {hidden}; --'")),
                Outcome::Refused,
            );
        }
        // The same statement bare, after a harmless one: refused.
        g.add(
            &format!("sqlite-backslash-quote-{label}-bare"),
            steps(&[("sql", "SELECT 1 AS n"), ("sql", hidden)], false),
            Outcome::RefusedAt(1),
        );
    }
    // SQLite: INSERT OR ROLLBACK ended the host's transaction; the UPDATE
    // after it committed although the message was dead-lettered.
    g.add(
        "sqlite-insert-or-rollback-then-update-then-reject",
        steps(
            &[
                (
                    "sql",
                    "INSERT OR ROLLBACK INTO accounts (account_id, balance) VALUES (1, 0)",
                ),
                (
                    "sql",
                    "UPDATE accounts SET balance = balance + 1000 WHERE account_id = 1",
                ),
            ],
            true,
        ),
        Outcome::RefusedAt(0),
    );
    g.add(
        "sqlite-update-then-insert-or-rollback-then-update",
        steps(
            &[
                (
                    "sql",
                    "UPDATE accounts SET balance = balance + 1000 WHERE account_id = 1",
                ),
                (
                    "sql",
                    "INSERT OR ROLLBACK INTO accounts (account_id, balance) VALUES (1, 0)",
                ),
                (
                    "sql",
                    "UPDATE accounts SET balance = balance + 1000 WHERE account_id = 1",
                ),
            ],
            false,
        ),
        Outcome::RefusedAt(1),
    );
    // PostgreSQL: a hidden set_config('role', ...) let later statements out.
    let role = r"SELECT '\'' AS a, set_config($$role$$, $$postgres$$, true) AS r --'";
    g.add("pg-role-hidden", x(role), Outcome::Served);
    for (label, then) in [
        ("read-secrets", "SELECT v FROM secrets"),
        ("delete-receipts", "DELETE FROM idem_receipts"),
        (
            "forge-receipt",
            "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms) VALUES ('hostile', 'forged', 1, 'x', 0)",
        ),
        ("read-file", "SELECT pg_read_file('/etc/passwd') AS f"),
        ("large-object", "SELECT lo_from_bytea(0, 'x') AS o"),
        // Granted, but its trigger writes `secrets`: the handler role stops it.
        (
            "trigger-reaches-secrets",
            "INSERT INTO notes (id, body) VALUES (1, 'x')",
        ),
    ] {
        g.add(
            &format!("pg-role-hidden-then-{label}"),
            steps(&[("query", role), ("sql", then)], true),
            Outcome::RefusedAt(1),
        );
    }
    g.add(
        "pg-role-bare-then-read-secrets",
        steps(
            &[
                ("query", "SELECT set_config('role', 'postgres', true) AS r"),
                ("query", "SELECT v FROM secrets"),
            ],
            true,
        ),
        Outcome::RefusedAt(0),
    );
    // PostgreSQL: statement_timeout 0, then a 25 s sleep that outlived the message.
    let timeout = r"SELECT '\'' AS a, set_config($$statement_timeout$$, $$0$$, true) AS t --'";
    g.add(
        "pg-statement-timeout-hidden-then-sleep",
        steps(
            &[
                ("query", timeout),
                ("query", "SELECT 1 AS n, pg_sleep(25) AS s"),
            ],
            true,
        ),
        Outcome::RefusedAt(1),
    );
    g.add(
        "pg-statement-timeout-bare-then-sleep",
        steps(
            &[
                (
                    "query",
                    "SELECT set_config('statement_timeout', '0', true) AS t",
                ),
                ("query", "SELECT pg_sleep(25) AS s"),
            ],
            true,
        ),
        Outcome::RefusedAt(0),
    );
    // PostgreSQL: a session setting and an advisory lock that outlived the
    // message on the pooled connection (checked after the group).
    g.add(
        "pg-application-name-hidden",
        x(r"SELECT '\'' AS a, set_config($$application_name$$, $$x$$, false) AS s --'"),
        Outcome::Served,
    );
    g.add(
        "pg-application-name-bare",
        q("SELECT set_config('application_name', 'x', false) AS s"),
        Outcome::Refused,
    );
    g.add(
        "pg-advisory-lock-hidden",
        x(r"SELECT '\'' AS a, pg_advisory_lock(424242) AS l --'"),
        Outcome::Served,
    );
    g.add(
        "pg-advisory-lock-bare",
        q("SELECT pg_advisory_lock(424242) AS l"),
        Outcome::Refused,
    );
    g.add(
        "pg-advisory-lock-attribute-notation",
        q("SELECT (balance).pg_advisory_lock FROM accounts WHERE account_id = 500"),
        Outcome::Refused,
    );
    // SQLite: a zeroblob-sized result (checked by the host's peak memory).
    g.add(
        "sqlite-zeroblob",
        q("SELECT zeroblob(2000000000) AS b"),
        Outcome::Refused,
    );
    g.add(
        "sqlite-zeroblob-per-row",
        q("SELECT zeroblob(100000000) AS b FROM accounts"),
        Outcome::Refused,
    );
    g
}
