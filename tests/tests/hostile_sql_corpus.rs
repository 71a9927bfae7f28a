//! A corpus of hostile SQL, judged by effect.
//!
//! Each database (PostgreSQL, SQLite) gets one real host: the `idem` binary
//! (`idem-test-host`, a child process so its memory can be read), a private
//! nats-server and a fresh database holding a table no handler is granted,
//! `secrets`, whose one row is a canary. The `behave` guest runs every case as
//! it says: one statement (`sql`, which commits when it succeeds; `query`,
//! which rejects with the rows it read), or several statements in one message
//! (`steps`, stopping at the first error). Every hostile message is followed
//! by a well-behaved credit on the same handler, and the `credit` example
//! handler is served alongside.
//!
//! Cases run in groups (one publish burst, one wait, one round of checks).
//! Nothing is judged by the guard's wording; after each group:
//! - every case ended as expected: served (a receipt, no dead letter) or
//!   dead-lettered (refused or failed, with no rows read; with exactly the
//!   rows given; as a trap), by the exact set of receipts and dead letters;
//! - the canary was not read: no dead-letter reason holds it in any spelling,
//!   and it was not changed (one row, same value);
//! - `idem_receipts` and `idem_dead_letters` hold exactly the expected rows
//!   (nothing deleted, nothing forged), every account its exact balance (each
//!   follow-up credit applied exactly once), and `notes` and `ledger`
//!   (granted, with triggers that reach `secrets` or end the transaction) are
//!   empty;
//! - no new objects: PostgreSQL's catalogs (relations, functions, large
//!   objects, schemas, triggers, rules, privileges, roles, databases,
//!   prepared transactions) and SQLite's schema and header are unchanged,
//!   and no file appeared next to the SQLite database or at the paths cases
//!   name;
//! - no session state left: on PostgreSQL no advisory lock, no backend busy
//!   or renamed (`application_name`) once the group is settled, and a guest
//!   reading setting-dependent values (date and bytea output, time zone,
//!   float digits; SQLite's `LIKE` case) sees a fresh session's values;
//! - the host is alive, its peak memory (`VmHWM`) stays under 1 GiB (twice
//!   PostgreSQL's 1 GB field limit in the one case built to reach that
//!   limit) and its resident memory comes back under it after each group.
//!
//! At the end the host's own counters (processed, dead-lettered, traps,
//! retries) must match exactly. Failures are collected and reported together.
//! `IDEM_CORPUS_CASES=<substring>` runs only the cases whose name or payload
//! contains it (the checks still run).
//!
//! The statements of past escapes are the cases named `past-escape/...`;
//! the last group sends 20,000 distinct statement texts (the guard's verdict
//! cache is bounded). Two PostgreSQL cases need a host of their own:
//! `postgres_row_near_field_limit` (one huge value, so the peak memory is its
//! own) and `postgres_attribute_notation_calls_no_function_outside_the_allow_list`
//! (functions the application defined on a granted table's row type).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::chaos::HostProcess;
use idem_tests::*;
use serde_json::{Value, json};
use sqlx::Row;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The value no guest may read or change.
const CANARY: &str = "CANARY-5f1c2e9a";
const HOSTILE: &str = "hostile";
const WELL: &str = "well-behaved";
/// The well-behaved handler's account.
const WELL_ACCOUNT: i64 = 900;
/// Case `i`'s follow-up credit goes to account `FOLLOW_UP + i`, amount `i + 1`.
const FOLLOW_UP: i64 = 100_000;
/// Account 1 starts at 10; cases that would add 1000 to it must not.
const ACCOUNT_1: i64 = 10;
/// The host's peak resident memory must stay below this.
const MEMORY_LIMIT_KIB: u64 = 1 << 20;
/// The hostile handler's deadline (a statement that never ends traps here).
const DEADLINE: &str = "2s";

/// How a case must end.
#[derive(Debug, Clone)]
enum Outcome {
    /// Committed: a receipt, no dead letter; its `effects` applied.
    Served,
    /// Dead-lettered by a refusal or a database error: no rows reached the
    /// guest and it did not trap.
    Refused,
    /// A `steps` case refused or failed at exactly this step (from 0).
    RefusedAt(usize),
    /// Dead-lettered by a `query` that read exactly these rows.
    Rows(Value),
    /// Dead-lettered with exactly this reason.
    Reason(String),
    /// Dead-lettered as a trap (deadline or memory).
    Trap,
    /// Dead-lettered by a refusal, a database error or a trap: no rows
    /// reached the guest (for work whose speed decides which comes first).
    Failed,
}

/// One hostile message.
struct Hostile {
    name: String,
    payload: Value,
    outcome: Outcome,
    /// (account, amount) added to `accounts` when the case is served.
    effects: Vec<(i64, i64)>,
}

/// A `query` payload.
fn q(sql: &str) -> Value {
    json!({"op": "query", "sql": sql})
}

/// An `sql` (execute) payload.
fn x(sql: &str) -> Value {
    json!({"op": "sql", "sql": sql})
}

/// A `query` payload with parameters.
fn qp(sql: &str, params: Value) -> Value {
    json!({"op": "query", "sql": sql, "params": params})
}

/// A `steps` payload of (`sql` | `query`, text); `reject`: the guest rejects
/// after the last step (so nothing may commit).
fn steps(list: &[(&str, &str)], reject: bool) -> Value {
    let list: Vec<Value> = list
        .iter()
        .map(|(op, sql)| json!({"op": op, "sql": sql}))
        .collect();
    let mut p = json!({"op": "steps", "steps": list});
    if reject {
        p["end"] = json!("reject");
    }
    p
}

/// Rows of one text value.
fn text_row(s: &str) -> Outcome {
    Outcome::Rows(json!([[s]]))
}

/// Rows of one integer value.
fn int_row(n: i64) -> Outcome {
    Outcome::Rows(json!([[n]]))
}

/// The cases of one group, named `group/label`.
struct Group {
    name: &'static str,
    backend: Backend,
    cases: Vec<Hostile>,
    /// Placeholders: `{dir}` (the SQLite database's directory) and `{tmp}`
    /// (a path prefix in /tmp no file may start with).
    dir: String,
    tmp: String,
}

impl Group {
    fn new(name: &'static str, ctx: &Ctx) -> Self {
        Group {
            name,
            backend: ctx.backend,
            cases: Vec::new(),
            dir: ctx.dir.clone(),
            tmp: ctx.tmp.clone(),
        }
    }

    /// Whether the group is for PostgreSQL.
    fn pg(&self) -> bool {
        self.backend == Backend::Postgres
    }

    /// `pg` on PostgreSQL, `sqlite` on SQLite.
    fn by(&self, pg: Outcome, sqlite: Outcome) -> Outcome {
        if self.pg() { pg } else { sqlite }
    }

    /// `v` with the placeholders in its strings replaced.
    fn fill(&self, v: Value) -> Value {
        match v {
            Value::String(s) => {
                Value::String(s.replace("{dir}", &self.dir).replace("{tmp}", &self.tmp))
            }
            Value::Array(a) => Value::Array(a.into_iter().map(|v| self.fill(v)).collect()),
            Value::Object(o) => {
                Value::Object(o.into_iter().map(|(k, v)| (k, self.fill(v))).collect())
            }
            other => other,
        }
    }

    /// Adds a case named `label` (or its position when empty).
    fn add(&mut self, label: &str, payload: Value, outcome: Outcome) -> &mut Hostile {
        let label = if label.is_empty() {
            format!("{:02}", self.cases.len())
        } else {
            label.to_owned()
        };
        let payload = self.fill(payload);
        self.cases.push(Hostile {
            name: format!("{}/{label}", self.name),
            payload,
            outcome,
            effects: Vec::new(),
        });
        self.cases.last_mut().unwrap()
    }

    /// A statement refused (or failed) on both databases.
    fn refused(&mut self, payload: Value) {
        self.add("", payload, Outcome::Refused);
    }
}

impl Hostile {
    /// Declares that the case, served, adds `amount` to `account`.
    fn effect(&mut self, account: i64, amount: i64) -> &mut Self {
        self.effects.push((account, amount));
        self
    }
}

/// What the case lists need to know of the database under test.
struct Ctx {
    backend: Backend,
    /// The SQLite database's directory (empty on PostgreSQL).
    dir: String,
    /// A path prefix in /tmp that no file may start with.
    tmp: String,
}

// ---------------------------------------------------------------------------
// The corpus.
// ---------------------------------------------------------------------------

/// The rows of the table of past escapes: each one a named case.
fn past_escapes(ctx: &Ctx) -> Group {
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
            "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest) VALUES ('hostile', 'forged', 1, 'x')",
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
            "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest) VALUES ('hostile', 'forged', 1, 'x')",
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

fn quotes(ctx: &Ctx) -> Group {
    let mut g = Group::new("quotes", ctx);
    g.add("", q("SELECT 'it''s' AS s"), text_row("it's"));
    g.add(
        "",
        x("SELECT 'a' AS s --'; DELETE FROM secrets"),
        Outcome::Served,
    );
    g.refused(q(r"SELECT 'a\' AS s, (SELECT v FROM secrets) AS t --'"));
    g.add(
        "",
        q(r"SELECT 'a\'' AS s, (SELECT v FROM secrets) AS t --'"),
        text_row(r"a\' AS s, (SELECT v FROM secrets) AS t --"),
    );
    g.add("", q(r"SELECT '\' AS s"), text_row(r"\"));
    g.add("", q(r"SELECT '\\' AS s"), text_row(r"\\"));
    g.add(
        "",
        x("SELECT 'x''; DELETE FROM secrets; --' AS s"),
        Outcome::Served,
    );
    g.add(
        "",
        x("SELECT '''; DELETE FROM secrets; --' AS s"),
        Outcome::Served,
    );
    g.refused(x("SELECT ''; DELETE FROM secrets; --'"));
    g.refused(q(r"SELECT E'\'' AS s, (SELECT v FROM secrets) AS t --'"));
    g.refused(q(r"SELECT E'\\' AS s, (SELECT v FROM secrets) AS t --'"));
    let o = g.by(text_row("'; DELETE FROM secrets; --"), Outcome::Refused);
    g.add("", q(r"SELECT E'\x27; DELETE FROM secrets; --' AS s"), o);
    let o = g.by(
        text_row("' UNION SELECT v FROM secrets --"),
        Outcome::Refused,
    );
    g.add(
        "",
        q(r"SELECT E'\u0027 UNION SELECT v FROM secrets --' AS s"),
        o,
    );
    g.refused(q(r"SELECT U&'\0027' AS s UNION ALL SELECT v FROM secrets"));
    let o = g.by(
        text_row("' UNION SELECT v FROM secrets --"),
        Outcome::Refused,
    );
    g.add(
        "",
        q("SELECT U&'!0027 UNION SELECT v FROM secrets --' UESCAPE '!' AS s"),
        o,
    );
    g.refused(q("SELECT 'a' || (SELECT v FROM secrets) AS s"));
    // An error message that would carry the value.
    g.refused(q("SELECT CAST((SELECT v FROM secrets) AS bigint) AS n"));
    g.add(
        "",
        x("INSERT INTO accounts (account_id, balance) VALUES (3, length('it''s; DELETE FROM secrets; --'))"),
        Outcome::Served,
    )
    .effect(3, "it's; DELETE FROM secrets; --".len() as i64);
    g.add(
        "param-holds-injection",
        qp(
            "SELECT CAST($1 AS TEXT) AS s",
            json!([r"\'; DELETE FROM secrets; --"]),
        ),
        text_row(r"\'; DELETE FROM secrets; --"),
    );
    // An unterminated comment does not compile. With a parameter,
    // PostgreSQL's text gets the host's type comment appended, inside the
    // open comment.
    g.refused(q("SELECT 'a' AS s /*"));
    g.refused(qp("SELECT CAST($1 AS TEXT) AS s /*", json!(["x"])));
    // standard_conforming_strings cannot be turned off to re-read a literal.
    g.add(
        "",
        steps(
            &[
                (
                    "query",
                    "SELECT set_config('standard_conforming_strings', 'off', true) AS s",
                ),
                (
                    "query",
                    r"SELECT 'a\' AS s, (SELECT v FROM secrets) AS t --'",
                ),
            ],
            true,
        ),
        Outcome::RefusedAt(0),
    );
    g.add(
        "",
        steps(
            &[
                ("query", r"SELECT '\'' AS a, set_config($$standard_conforming_strings$$, $$off$$, true) AS s --'"),
                ("query", r"SELECT 'a\' AS s, (SELECT v FROM secrets) AS t --'"),
            ],
            true,
        ),
        Outcome::RefusedAt(1),
    );
    g.add(
        "",
        steps(
            &[
                ("sql", "SET standard_conforming_strings = off"),
                (
                    "query",
                    r"SELECT 'a\' AS s, (SELECT v FROM secrets) AS t --'",
                ),
            ],
            true,
        ),
        Outcome::RefusedAt(0),
    );
    g
}

fn dollar_quotes(ctx: &Ctx) -> Group {
    let mut g = Group::new("dollar", ctx);
    let o = g.by(Outcome::Served, Outcome::Refused);
    g.add("", x("SELECT $$'; DELETE FROM secrets; --$$ AS s"), o);
    let o = g.by(text_row(" $$ ; DELETE FROM secrets; $$ "), Outcome::Refused);
    g.add(
        "",
        q("SELECT $tag$ $$ ; DELETE FROM secrets; $$ $tag$ AS s"),
        o,
    );
    g.refused(q(
        "SELECT $a$ $b$ ' $b$ $a$ AS s, (SELECT v FROM secrets) AS t",
    ));
    g.refused(q("SELECT $$ $$ || (SELECT v FROM secrets) AS s"));
    g.refused(q("SELECT $1$ AS s"));
    g.refused(q("SELECT $_$'$_$ AS s UNION ALL SELECT v FROM secrets"));
    g.refused(x("SELECT $q$$q$ AS s; DELETE FROM secrets"));
    let o = g.by(text_row(" x $tag$ y "), Outcome::Refused);
    g.add("", q("SELECT $Tag$ x $tag$ y $Tag$ AS s"), o);
    g.refused(q(
        "SELECT 1 AS n WHERE $$a$$ = 'a' UNION ALL SELECT length(v) FROM secrets",
    ));
    let o = g.by(text_row("--"), Outcome::Refused);
    g.add(
        "",
        q("SELECT $$--$$ AS s -- $$ UNION ALL SELECT v FROM secrets"),
        o,
    );
    g
}

fn comments(ctx: &Ctx) -> Group {
    let mut g = Group::new("comments", ctx);
    g.add("", q("SELECT 1 AS n -- ; DELETE FROM secrets"), int_row(1));
    g.add(
        "",
        q("SELECT 1 AS n /* ; DELETE FROM secrets; */"),
        int_row(1),
    );
    // PostgreSQL nests block comments, SQLite does not.
    let o = g.by(int_row(1), Outcome::Refused);
    g.add(
        "",
        q("SELECT 1 AS n /* /* */ ; DELETE FROM secrets; /* */ */"),
        o,
    );
    g.refused(x("SELECT 1 AS n /* /* */ */ ; DELETE FROM secrets"));
    g.refused(q(
        "SELECT 1 AS n /* */ UNION ALL SELECT length(v) FROM secrets",
    ));
    g.refused(q(
        "SELECT 1 AS n --\nUNION ALL SELECT length(v) FROM secrets",
    ));
    // A carriage return ends a PostgreSQL line comment, not a SQLite one.
    let o = g.by(Outcome::Refused, int_row(1));
    g.add("", q("SELECT 1 AS n --\r; DELETE FROM secrets"), o);
    g.add(
        "",
        q("SELECT 1 AS n /*/ UNION ALL SELECT length(v) FROM secrets --*/"),
        int_row(1),
    );
    g.refused(x("/* leading */ DELETE FROM secrets"));
    g.refused(x("-- only a comment"));
    g.refused(q(
        "SELECT 1 AS \"n--\" /* \"*/ , (SELECT v FROM secrets) AS t",
    ));
    g.refused(q(
        "SELECT '/*' AS a, (SELECT v FROM secrets) AS b, '*/' AS c",
    ));
    g.refused(q("SELECT '--' AS a, (SELECT v FROM secrets) AS b"));
    g.add("", x("SELECT 1 AS n;"), Outcome::Served);
    g.add(
        "",
        x("SELECT 1 AS n; -- DELETE FROM secrets"),
        Outcome::Served,
    );
    g.add(
        "",
        x("SELECT 1 AS n; /* DELETE FROM secrets */ ;"),
        Outcome::Served,
    );
    g.refused(x("SELECT 1 AS n; /* */ DELETE FROM secrets"));
    g
}

fn unicode(ctx: &Ctx) -> Group {
    let mut g = Group::new("unicode", ctx);
    g.refused(q(r#"SELECT * FROM U&"\0073ecrets""#));
    g.refused(q(r#"SELECT * FROM U&"!0073ecrets" UESCAPE '!'"#));
    let o = g.by(Outcome::Rows(json!([[500, 5000]])), Outcome::Refused);
    g.add(
        "",
        q(r#"SELECT * FROM U&"\0061ccounts" WHERE account_id = 500"#),
        o,
    );
    g.refused(q(r#"SELECT * FROM "SECRETS""#));
    g.refused(q(r#"SELECT * FROM "Secrets""#));
    g.refused(q("SELECT v FROM SECRETS"));
    // Homoglyphs: Cyrillic ѕ and а.
    g.refused(q("SELECT v FROM \u{0455}ecrets"));
    g.refused(q(
        "SELECT balance FROM \u{0430}ccounts WHERE account_id = 500",
    ));
    // Zero-width and direction characters.
    g.refused(q("SELECT v FROM secrets\u{200b}"));
    g.refused(q("SELECT v FROM \"secrets\u{200b}\""));
    g.refused(q("SELECT v FROM \u{200b}secrets"));
    g.refused(q("SELECT v FROM se\u{200d}crets"));
    g.refused(q("SEL\u{200b}ECT v FROM secrets"));
    g.refused(q("SELECT v FROM \"\u{202e}sterces\""));
    g.add("", q("SELECT 1 AS \"ＳＥＬＥＣＴ\""), int_row(1));
    g.add("", q("SELECT 'é' || 'ﬁ' AS s"), text_row("éﬁ"));
    g.add(
        "",
        q("SELECT balance AS \"bal\u{202e}ance\" FROM accounts WHERE account_id = 500"),
        int_row(5000),
    );
    g.add(
        "",
        x("DELETE FROM accounts WHERE account_id = 999999 OR 'ᴬ' = 'A'"),
        Outcome::Served,
    );
    g.refused(q(r#"SELECT v FROM "secrets" AS "accounts""#));
    g.refused(q(r#"SELECT * FROM U&"\0069dem_receipts""#));
    g.refused(q("SELECT * FROM \"IDEM_RECEIPTS\""));
    g.refused(q("SELECT * FROM Idem_Receipts"));
    g.refused(q("SELECT * FROM \u{0456}dem_receipts"));
    g
}

fn conflicts(ctx: &Ctx) -> Group {
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
    g.refused(x("INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest) VALUES ('hostile', 'forged', 1, 'x') ON CONFLICT DO NOTHING"));
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

fn ctes(ctx: &Ctx) -> Group {
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
    g.refused(x("WITH x AS (INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest) VALUES ('hostile', 'forged', 1, 'x') RETURNING 1) SELECT 1"));
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

/// Catalog, file, large-object, extension and server functions and tables.
/// Each is run on both databases: on the other one it is a name that does
/// not exist (or does not parse), refused all the same.
fn catalogs(ctx: &Ctx) -> Group {
    let mut g = Group::new("catalog", ctx);
    for sql in [
        // PostgreSQL.
        "SELECT pg_read_file('/etc/passwd') AS f",
        "SELECT pg_read_binary_file('/etc/passwd') AS f",
        "SELECT * FROM pg_ls_dir('.')",
        "SELECT pg_ls_dir('.') AS f",
        "SELECT pg_stat_file('/etc/passwd') AS f",
        "SELECT (pg_stat_file('/etc/passwd')).size AS f",
        "SELECT convert_from(pg_read_binary_file('/etc/passwd'), 'UTF8') AS f",
        "SELECT * FROM ROWS FROM (pg_ls_dir('.'))",
        "SELECT lo_import('/etc/passwd') AS o",
        "SELECT lo_export(lo_from_bytea(0, 'x'), '{tmp}-lo') AS o",
        "SELECT lo_from_bytea(0, 'x') AS o",
        "SELECT lo_create(0) AS o",
        "SELECT lo_get(1) AS o",
        "SELECT * FROM pg_largeobject",
        "SELECT relname FROM pg_class",
        "SELECT * FROM pg_catalog.pg_authid",
        "SELECT rolname FROM pg_roles",
        "SELECT table_name FROM information_schema.tables",
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'secrets'",
        "SELECT * FROM pg_settings",
        "SELECT * FROM pg_stat_activity",
        "SELECT current_setting('role') AS r",
        "SELECT version() AS v",
        "SELECT current_user AS u",
        "SELECT session_user AS u",
        "SELECT pg_catalog.current_database() AS d",
        "SELECT inet_server_addr() AS a",
        "SELECT pg_backend_pid() AS p",
        "SELECT txid_current() AS t",
        "SELECT pg_terminate_backend(1) AS t",
        "SELECT pg_reload_conf() AS r",
        "SELECT query_to_xml('SELECT v FROM secrets', true, false, '') AS x",
        "SELECT dblink('dbname=test', 'SELECT v FROM secrets') AS d",
        "SELECT 'secrets'::regclass::oid::bigint AS o",
        "SELECT to_regclass('secrets')::text AS o",
        "SELECT nextval('idem_dead_letters_id_seq') AS n",
        "SELECT pg_notify('c', 'x') AS n",
        "SELECT row_to_json(s) AS j FROM secrets s",
        "SELECT format('%s', 1) AS f",
        "SELECT pg_catalog.upper(v) AS u FROM secrets",
        "SELECT xmlparse(document '<a/>') AS x",
        "SELECT a.pg_read_file FROM accounts a",
        "SELECT (a).pg_read_file FROM accounts a",
        "SELECT a.pg_advisory_lock FROM accounts a",
        "SELECT s.v FROM accounts a, LATERAL (SELECT v FROM secrets) s",
        "SELECT (SELECT s FROM secrets s LIMIT 1) AS r",
        "SELECT * FROM secrets_view",
        "SELECT v FROM public.secrets_view",
        // SQLite.
        "SELECT * FROM sqlite_schema",
        "SELECT sql FROM sqlite_master WHERE name = 'secrets'",
        "SELECT * FROM sqlite_temp_master",
        "SELECT * FROM main.sqlite_master",
        "SELECT * FROM temp.sqlite_master",
        "SELECT * FROM pragma_table_info('secrets')",
        "SELECT * FROM pragma_index_list('secrets')",
        "SELECT name FROM pragma_table_list",
        "SELECT * FROM pragma_database_list",
        "SELECT * FROM pragma_function_list",
        "SELECT * FROM pragma_compile_options",
        "SELECT * FROM pragma_user_version",
        "SELECT load_extension('/tmp/evil.so') AS e",
        "SELECT readfile('/etc/passwd') AS f",
        "SELECT writefile('{dir}/w.txt', 'x') AS f",
        "SELECT fts3_tokenizer('simple') AS t",
        "SELECT * FROM json_each('[1,2]')",
        "SELECT * FROM dbstat",
        "SELECT * FROM sqlite_dbpage",
        "SELECT * FROM sqlite_sequence",
        "SELECT sqlite_version() AS v",
        "SELECT sqlite_compileoption_used('ENABLE_FTS5') AS c",
        "SELECT changes() AS c",
        "SELECT last_insert_rowid() AS r",
        "SELECT quote(v) AS q FROM secrets",
        "SELECT hex(v) AS h FROM secrets",
        "SELECT json(v) AS j FROM secrets",
        "SELECT typeof(v) AS t FROM secrets",
        "SELECT unlikely(1) AS u",
        "SELECT printf('%s', 1) AS p",
        "SELECT sqlite_offset(v) AS o FROM secrets",
        "SELECT rowid, * FROM secrets",
        "SELECT * FROM [secrets]",
        "SELECT * FROM `secrets`",
        "SELECT * FROM \"main\".\"secrets\"",
        "SELECT * FROM accounts INDEXED BY sqlite_autoindex_secrets_1",
        "SELECT * FROM generate_series(1, 3)",
    ] {
        g.refused(q(sql));
    }
    for sql in [
        "CREATE VIRTUAL TABLE f USING fts5(a)",
        "CREATE VIRTUAL TABLE f USING fts4(a)",
        "CREATE VIRTUAL TABLE temp.f USING fts5(a)",
    ] {
        g.refused(x(sql));
    }
    g
}

fn settings(ctx: &Ctx) -> Group {
    let mut g = Group::new("settings", ctx);
    for sql in [
        "SET statement_timeout = 0",
        "SET LOCAL statement_timeout = 0",
        "RESET ALL",
        "RESET statement_timeout",
        "SET standard_conforming_strings = off",
        "SET search_path = pg_catalog, public",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SET CONSTRAINTS ALL DEFERRED",
        "SET datestyle = 'German'",
        "SET bytea_output = 'escape'",
        "SET TIME ZONE 'Pacific/Kiritimati'",
        "SET application_name = 'evil'",
        "SET extra_float_digits = -15",
        "SHOW ALL",
        "ALTER SYSTEM SET statement_timeout = 0",
        "ALTER ROLE ALL SET statement_timeout = 0",
        "ALTER DATABASE test SET datestyle = 'German'",
        "DISCARD ALL",
        "PRAGMA writable_schema = 1",
        "PRAGMA writable_schema = RESET",
        "PRAGMA foreign_keys = 0",
        "PRAGMA case_sensitive_like = 1",
        "PRAGMA journal_mode = DELETE",
        "PRAGMA user_version = 7",
        "PRAGMA schema_version = 1",
        "PRAGMA query_only = 0",
        "PRAGMA trusted_schema = 1",
        "PRAGMA locking_mode = EXCLUSIVE",
        "PRAGMA recursive_triggers = 1",
        "PRAGMA main.application_id = 1",
        "PRAGMA hard_heap_limit = 0",
        "PRAGMA temp_store_directory = '{dir}'",
        "PRAGMA cell_size_check = 0",
        "PRAGMA ignore_check_constraints = 1",
    ] {
        g.refused(x(sql));
    }
    for sql in [
        "SELECT set_config('application_name', 'x', false) AS s",
        "SELECT set_config('statement_timeout', '0', true) AS s",
        "SELECT set_config('search_path', 'pg_catalog', false) AS s",
        "SELECT set_config('DateStyle', 'German', false) AS s",
        "SELECT current_setting('statement_timeout') AS s",
        "SELECT * FROM pragma_writable_schema",
        "SELECT * FROM pragma_case_sensitive_like(1)",
    ] {
        g.refused(q(sql));
    }
    g.add(
        "",
        x(r"SELECT '\'' AS a, set_config($$search_path$$, $$pg_catalog$$, false) AS s --'"),
        Outcome::Served,
    );
    g.add(
        "",
        x(r"SELECT '\'' AS a, set_config($$DateStyle$$, $$German$$, false) AS s --'"),
        Outcome::Served,
    );
    g
}

fn roles(ctx: &Ctx) -> Group {
    let mut g = Group::new("roles", ctx);
    for sql in [
        "SET ROLE postgres",
        "SET ROLE NONE",
        "RESET ROLE",
        "SET LOCAL ROLE postgres",
        "SET SESSION AUTHORIZATION postgres",
        "SET SESSION AUTHORIZATION DEFAULT",
        "GRANT SELECT ON secrets TO PUBLIC",
        "GRANT postgres TO idem_handler_hostile",
        "CREATE ROLE evil SUPERUSER",
        "ALTER ROLE idem_handler_hostile SUPERUSER",
        "REVOKE ALL ON accounts FROM PUBLIC",
        "ALTER TABLE secrets OWNER TO idem_handler_hostile",
        "SECURITY LABEL ON TABLE secrets IS 'x'",
        "ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO PUBLIC",
        "REASSIGN OWNED BY postgres TO idem_handler_hostile",
        "DROP OWNED BY idem_handler_hostile",
    ] {
        g.refused(x(sql));
    }
    for sql in [
        "SELECT set_config('role', 'postgres', true) AS r",
        "SELECT set_config('role', 'none', false) AS r",
        "SELECT set_config('session_authorization', 'postgres', false) AS r",
        "SELECT pg_has_role('postgres', 'member') AS m",
    ] {
        g.refused(q(sql));
    }
    g.add(
        "",
        steps(
            &[
                ("sql", "SET ROLE postgres"),
                ("query", "SELECT v FROM secrets"),
            ],
            true,
        ),
        Outcome::RefusedAt(0),
    );
    g.add(
        "",
        steps(
            &[
                (
                    "query",
                    r"SELECT '\'' AS a, set_config($$role$$, $$none$$, true) AS r --'",
                ),
                ("sql", "UPDATE notes SET body = 'x'"),
                ("sql", "INSERT INTO notes (id, body) VALUES (2, 'y')"),
            ],
            true,
        ),
        Outcome::RefusedAt(2),
    );
    g
}

fn locks(ctx: &Ctx) -> Group {
    let mut g = Group::new("locks", ctx);
    for sql in [
        "SELECT pg_advisory_lock(424242) AS l",
        "SELECT pg_advisory_xact_lock(424242) AS l",
        "SELECT pg_try_advisory_lock(424242) AS l",
        "SELECT pg_advisory_lock_shared(1, 2) AS l",
        "SELECT pg_catalog.pg_advisory_lock(424242) AS l",
        "SELECT \"pg_advisory_lock\"(424242) AS l",
        "SELECT count(*) AS n FROM accounts WHERE pg_try_advisory_lock(account_id)",
        "SELECT * FROM accounts a FOR UPDATE OF secrets",
    ] {
        g.refused(q(sql));
    }
    for sql in [
        "LOCK TABLE accounts IN ACCESS EXCLUSIVE MODE",
        "LOCK TABLE secrets",
        "LOCK accounts",
        "BEGIN EXCLUSIVE",
        "BEGIN IMMEDIATE",
    ] {
        g.refused(x(sql));
    }
    let o = g.by(Outcome::Rows(json!([[500, 5000]])), Outcome::Refused);
    g.add(
        "",
        q("SELECT * FROM accounts WHERE account_id = 500 FOR UPDATE"),
        o,
    );
    let o = g.by(Outcome::Rows(json!([[500, 5000]])), Outcome::Refused);
    g.add(
        "",
        q("SELECT * FROM accounts WHERE account_id = 500 FOR UPDATE NOWAIT"),
        o,
    );
    g.add(
        "",
        steps(
            &[
                ("sql", r"SELECT '\'' AS a, pg_advisory_lock(7) AS l --'"),
                ("query", "SELECT pg_advisory_lock(7) AS l"),
            ],
            false,
        ),
        Outcome::RefusedAt(1),
    );
    g
}

fn sleeps(ctx: &Ctx) -> Group {
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

fn multi(ctx: &Ctx) -> Group {
    let mut g = Group::new("multi", ctx);
    for sql in [
        "SELECT 1 AS n; DELETE FROM secrets",
        "SELECT 1 AS n;DELETE FROM idem_receipts",
        "SELECT 1 AS n; COMMIT; DELETE FROM accounts",
        "SELECT 1 AS n -- \n; DELETE FROM accounts WHERE account_id = 1",
        "SELECT 'a;' AS s; DELETE FROM accounts WHERE account_id = 1",
        "SELECT \"a;b\" FROM accounts; DELETE FROM accounts WHERE account_id = 1",
        "UPDATE accounts SET balance = balance + 1 WHERE account_id = 1; UPDATE accounts SET balance = balance + 1 WHERE account_id = 1",
        "SELECT $$;$$ AS s; DELETE FROM accounts WHERE account_id = 1",
        "SELECT 1 AS n /* ; */ ; /* ; */ DELETE FROM accounts WHERE account_id = 1",
        "SELECT 1 AS n\u{0};DELETE FROM secrets",
        "SELECT 1 AS n;\u{2028}DELETE FROM secrets",
        "SELECT 1 AS n; PRAGMA writable_schema = 1",
        "SELECT 1 AS n; ATTACH DATABASE '{dir}/multi.db' AS m",
        "SELECT 1 AS n; SET ROLE postgres",
        "SELECT 1 AS n\n;\nSELECT v FROM secrets",
    ] {
        g.refused(x(sql));
    }
    g.refused(q("SELECT 1 AS n UNION ALL SELECT 2; SELECT v FROM secrets"));
    g
}

fn attach(ctx: &Ctx) -> Group {
    let mut g = Group::new("attach", ctx);
    for sql in [
        "ATTACH DATABASE '{dir}/evil.db' AS evil",
        "ATTACH '{dir}/idem.db' AS twin",
        "ATTACH 'file:{dir}/uri.db?mode=rwc' AS u",
        "ATTACH ':memory:' AS m",
        "ATTACH '{tmp}-attach.db' AS t",
        "DETACH DATABASE main",
        "DETACH temp",
        "VACUUM INTO '{dir}/copy.db'",
        "VACUUM main INTO '{tmp}-vacuum.db'",
        "VACUUM",
        "ANALYZE",
        "REINDEX",
        "CREATE TEMP TABLE t (a)",
    ] {
        g.refused(x(sql));
    }
    g.refused(q("SELECT * FROM temp.accounts"));
    g.refused(q("SELECT * FROM evil.secrets"));
    g.add(
        "",
        steps(
            &[
                ("sql", "ATTACH DATABASE '{dir}/evil3.db' AS evil3"),
                ("sql", "CREATE TABLE evil3.t (a)"),
                ("sql", "INSERT INTO evil3.t VALUES (1)"),
            ],
            false,
        ),
        Outcome::RefusedAt(0),
    );
    g.add(
        "",
        x(r"SELECT '\''; ATTACH ''{dir}/evil2.db'' AS evil2; --'"),
        Outcome::Served,
    );
    g.refused(x(r"SELECT '\''; ATTACH '{dir}/evil2.db' AS evil2; --'"));
    g
}

fn transactions(ctx: &Ctx) -> Group {
    let mut g = Group::new("txn", ctx);
    for sql in [
        "BEGIN",
        "COMMIT",
        "END",
        "ROLLBACK",
        "SAVEPOINT s",
        "RELEASE SAVEPOINT idem_stmt",
        "ROLLBACK TO SAVEPOINT idem_stmt",
        "COMMIT AND CHAIN",
        "ABORT",
        "START TRANSACTION",
        "PREPARE TRANSACTION 'x'",
        "COMMIT PREPARED 'x'",
        "ROLLBACK PREPARED 'x'",
    ] {
        g.refused(x(sql));
    }
    let plus_1000 = (
        "sql",
        "UPDATE accounts SET balance = balance + 1000 WHERE account_id = 1",
    );
    for (i, then) in [
        "COMMIT",
        "END",
        "ROLLBACK TO SAVEPOINT idem_stmt",
        "RELEASE SAVEPOINT idem_stmt",
        "SAVEPOINT s",
    ]
    .into_iter()
    .enumerate()
    {
        g.add(
            &format!("update-then-{i}"),
            steps(&[plus_1000, ("sql", then), plus_1000], false),
            Outcome::RefusedAt(1),
        );
    }
    // Rejected after everything ran: nothing commits.
    g.add(
        "",
        steps(&[plus_1000, plus_1000], true),
        Outcome::Reason("rejected: steps []".into()),
    );
    // A failed statement after a good one: the message is rolled back whole.
    g.add(
        "",
        steps(
            &[
                plus_1000,
                (
                    "sql",
                    "INSERT INTO accounts (account_id, balance) VALUES (1, 0)",
                ),
            ],
            false,
        ),
        Outcome::RefusedAt(1),
    );
    // Served: both statements commit together.
    g.add(
        "",
        steps(
            &[
                (
                    "sql",
                    "UPDATE accounts SET balance = balance + 3 WHERE account_id = 1",
                ),
                ("query", "SELECT balance FROM accounts WHERE account_id = 1"),
            ],
            false,
        ),
        Outcome::Served,
    )
    .effect(1, 3);
    g
}

fn utility(ctx: &Ctx) -> Group {
    let mut g = Group::new("utility", ctx);
    for sql in [
        "COPY secrets TO STDOUT",
        "COPY (SELECT v FROM secrets) TO '{tmp}-copy'",
        "COPY accounts FROM '/etc/passwd'",
        "COPY accounts FROM PROGRAM 'touch {tmp}-program'",
        "COPY accounts TO PROGRAM 'touch {tmp}-program2'",
        "DO $$ BEGIN DELETE FROM secrets; END $$",
        "DO $$ BEGIN EXECUTE 'DELETE FROM idem_receipts'; END $$",
        "PREPARE p AS SELECT v FROM secrets",
        "EXECUTE p",
        "DEALLOCATE ALL",
        "LISTEN c",
        "NOTIFY c, 'x'",
        "UNLISTEN *",
        "CALL p()",
        "DECLARE c CURSOR FOR SELECT v FROM secrets",
        "FETCH ALL FROM c",
        "CLOSE ALL",
        "CHECKPOINT",
        "LOAD 'auto_explain'",
        "EXPLAIN ANALYZE DELETE FROM secrets",
        "EXPLAIN SELECT 1",
        "EXPLAIN QUERY PLAN SELECT * FROM secrets",
        "TRUNCATE secrets",
        "TRUNCATE accounts",
        "CLUSTER",
        "REFRESH MATERIALIZED VIEW x",
        "IMPORT FOREIGN SCHEMA x FROM SERVER y INTO public",
        "VALUES (1); DELETE FROM secrets",
    ] {
        g.refused(x(sql));
    }
    g
}

fn ddl(ctx: &Ctx) -> Group {
    let mut g = Group::new("ddl", ctx);
    for sql in [
        "CREATE TABLE t (a int)",
        "CREATE TABLE IF NOT EXISTS accounts (a int)",
        "CREATE TEMP TABLE t AS SELECT v FROM secrets",
        "CREATE TEMPORARY TABLE accounts (account_id bigint, balance bigint)",
        "CREATE UNLOGGED TABLE t (a int)",
        "CREATE TABLE stolen AS SELECT 1 AS n",
        "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "CREATE OR REPLACE FUNCTION upper(text) RETURNS text LANGUAGE sql AS 'SELECT v FROM secrets'",
        "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "CREATE TRIGGER t AFTER INSERT ON accounts BEGIN DELETE FROM secrets; END",
        "CREATE TEMP TRIGGER t AFTER INSERT ON accounts BEGIN DELETE FROM secrets; END",
        "CREATE TRIGGER t AFTER INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION notes_leak()",
        "CREATE VIEW v AS SELECT v FROM secrets",
        "CREATE TEMP VIEW v AS SELECT v FROM secrets",
        "CREATE MATERIALIZED VIEW mv AS SELECT v FROM secrets",
        "CREATE INDEX i ON accounts (balance)",
        "DROP TABLE secrets",
        "DROP TABLE IF EXISTS idem_receipts",
        "DROP VIEW secrets_view",
        "DROP TRIGGER notes_leak ON notes",
        "DROP TRIGGER notes_leak",
        "ALTER TABLE accounts ADD COLUMN x int",
        "ALTER TABLE secrets RENAME TO accounts2",
        "ALTER TABLE accounts DISABLE TRIGGER ALL",
        "ALTER TABLE notes RENAME TO notes2",
        "CREATE SCHEMA evil",
        "CREATE EXTENSION dblink",
        "CREATE RULE r AS ON INSERT TO accounts DO ALSO DELETE FROM secrets",
        "CREATE POLICY p ON secrets USING (true)",
        "COMMENT ON TABLE secrets IS 'x'",
        "CREATE SEQUENCE s",
        "CREATE DATABASE evil_db",
        "CREATE TYPE t AS (a int)",
        "CREATE DOMAIN d AS int",
        "CREATE EVENT TRIGGER e ON ddl_command_start EXECUTE FUNCTION notes_leak()",
        "CREATE SERVER s FOREIGN DATA WRAPPER x",
        "CREATE PUBLICATION p FOR ALL TABLES",
    ] {
        g.refused(x(sql));
    }
    g.refused(q("SELECT v INTO TEMP stolen FROM secrets"));
    g.refused(q("SELECT 1 AS n INTO stolen"));
    g.refused(q("SELECT balance INTO stolen FROM accounts"));
    g
}

/// Reaching `secrets` (or the host's tables) through views, triggers,
/// subqueries, set operations, RETURNING, joins and attribute notation.
fn reach(ctx: &Ctx) -> Group {
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

/// Values and results built to exhaust the host's memory.
fn memory(ctx: &Ctx) -> Group {
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

/// A statement whose results depend on session settings, for the reader.
fn reader_sql(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => {
            "SELECT CAST(DATE '2020-01-02' AS text) AS d, CAST(CAST('\\x41' AS bytea) AS text) AS b, \
             CAST(TIMESTAMPTZ '2020-01-02 03:04:05+00' AS text) AS t, \
             CAST(INTERVAL '1 day 2 hours' AS text) AS i, CAST(CAST(0.1 AS float8) AS text) AS f, \
             CAST(CAST(12345.678 AS numeric(10, 3)) AS text) AS n"
        }
        Backend::Sqlite => "SELECT 'a' LIKE 'A' AS l, CAST(0.1 AS TEXT) AS f",
    }
}

/// Statements nested deep enough to exhaust a parser's or the judge's
/// stack, and long flat ones that are fine.
fn nesting(ctx: &Ctx) -> Group {
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

/// Placeholders and parameter values.
fn params(ctx: &Ctx) -> Group {
    let mut g = Group::new("params", ctx);
    g.add(
        "",
        qp(
            "SELECT CAST($1 AS BIGINT) AS a, CAST($2 AS TEXT) AS b",
            json!([1, "x"]),
        ),
        Outcome::Rows(json!([[1, "x"]])),
    );
    g.refused(qp("SELECT CAST($2 AS TEXT) AS b", json!([1])));
    g.refused(qp("SELECT CAST($1 AS TEXT) AS a", json!([1, 2])));
    g.refused(q("SELECT $0 AS a"));
    g.refused(qp("SELECT $65536 AS a", json!([1])));
    // PostgreSQL reads `$01` as `$1`; SQLite's judge takes only `$n`.
    let o = g.by(int_row(1), Outcome::Refused);
    g.add("", qp("SELECT $01 AS a", json!([1])), o);
    for p in ["?", "?1", ":a", "@a", "$a"] {
        g.refused(qp(&format!("SELECT {p} AS a"), json!([1])));
    }
    let o = g.by(Outcome::Refused, Outcome::Rows(json!([])));
    g.add(
        "",
        qp(
            "SELECT * FROM accounts WHERE account_id = $1",
            json!(["500 OR 1=1"]),
        ),
        o,
    );
    g.add(
        "",
        qp(
            "SELECT CAST($1 AS TEXT) AS s",
            json!(["'); DELETE FROM secrets; --"]),
        ),
        text_row("'); DELETE FROM secrets; --"),
    );
    g.add(
        "",
        qp(
            "SELECT CAST($1 AS TEXT) AS s",
            json!(["$$; DELETE FROM secrets; $$"]),
        ),
        text_row("$$; DELETE FROM secrets; $$"),
    );
    g.add(
        "",
        qp("SELECT CAST($1 AS BIGINT) AS n", json!([i64::MAX])),
        int_row(i64::MAX),
    );
    g.refused(qp(
        "SELECT * FROM accounts WHERE account_id = $1 UNION ALL SELECT id, length(v) FROM secrets",
        json!([500]),
    ));
    // To SQLite `regclass` is only a name with numeric affinity.
    let o = g.by(Outcome::Refused, int_row(0));
    g.add(
        "",
        qp("SELECT CAST($1 AS regclass) AS r", json!(["secrets"])),
        o,
    );
    g
}

fn corpus(ctx: &Ctx) -> Vec<Group> {
    vec![
        past_escapes(ctx),
        quotes(ctx),
        dollar_quotes(ctx),
        comments(ctx),
        unicode(ctx),
        conflicts(ctx),
        ctes(ctx),
        catalogs(ctx),
        settings(ctx),
        roles(ctx),
        locks(ctx),
        sleeps(ctx),
        multi(ctx),
        attach(ctx),
        transactions(ctx),
        utility(ctx),
        ddl(ctx),
        reach(ctx),
        nesting(ctx),
        params(ctx),
        memory(ctx),
    ]
}

// ---------------------------------------------------------------------------
// The arena: a host process, its broker and database, and what must hold.
// ---------------------------------------------------------------------------

fn setup_sql(backend: Backend) -> Vec<String> {
    let mut s: Vec<String> = vec![
        "CREATE TABLE accounts (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)".into(),
        format!("INSERT INTO accounts (account_id, balance) VALUES (1, {ACCOUNT_1}), (500, 5000)"),
        "CREATE TABLE secrets (id BIGINT PRIMARY KEY, v TEXT NOT NULL)".into(),
        format!("INSERT INTO secrets (id, v) VALUES (1, '{CANARY}')"),
        "CREATE VIEW secrets_view AS SELECT id, v FROM secrets".into(),
        "CREATE TABLE notes (id BIGINT PRIMARY KEY, body TEXT NOT NULL)".into(),
    ];
    match backend {
        Backend::Postgres => s.extend([
            "CREATE TABLE ledger (id BIGINT PRIMARY KEY, amount BIGINT NOT NULL)".into(),
            "CREATE FUNCTION notes_leak() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN UPDATE secrets SET v = 'pwned by trigger'; RETURN NEW; END $$"
                .into(),
            "CREATE TRIGGER notes_leak AFTER INSERT ON notes FOR EACH ROW EXECUTE FUNCTION notes_leak()"
                .into(),
            "CREATE FUNCTION ledger_check() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN IF NEW.amount < 0 THEN RAISE EXCEPTION 'negative'; END IF; RETURN NEW; END $$"
                .into(),
            "CREATE TRIGGER ledger_check BEFORE INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION ledger_check()"
                .into(),
        ]),
        Backend::Sqlite => s.extend([
            "CREATE TABLE ledger (id INTEGER PRIMARY KEY ON CONFLICT ROLLBACK, amount BIGINT NOT NULL)"
                .into(),
            "CREATE TRIGGER notes_leak AFTER INSERT ON notes BEGIN UPDATE secrets SET v = 'pwned by trigger'; END"
                .into(),
            "CREATE TRIGGER ledger_check BEFORE INSERT ON ledger WHEN NEW.amount < 0 \
             BEGIN SELECT RAISE(ROLLBACK, 'negative'); END"
                .into(),
        ]),
    }
    s
}

/// What the database's objects and session state look like, compared
/// before and after each group.
async fn fingerprint(db: &TestDb) -> String {
    let sql = match db.backend {
        Backend::Postgres => {
            "SELECT concat_ws(' ', \
              'class', (SELECT count(*) FROM pg_class), \
              'proc', (SELECT count(*) FROM pg_proc), \
              'largeobjects', (SELECT count(*) FROM pg_largeobject_metadata), \
              'namespaces', (SELECT count(*) FROM pg_namespace), \
              'triggers', (SELECT count(*) FROM pg_trigger), \
              'rules', (SELECT count(*) FROM pg_rewrite), \
              'types', (SELECT count(*) FROM pg_type), \
              'attributes', (SELECT count(*) FROM pg_attribute), \
              'policies', (SELECT count(*) FROM pg_policy), \
              'extensions', (SELECT count(*) FROM pg_extension), \
              'event_triggers', (SELECT count(*) FROM pg_event_trigger), \
              'descriptions', (SELECT count(*) FROM pg_description), \
              'default_acl', (SELECT count(*) FROM pg_default_acl), \
              'publications', (SELECT count(*) FROM pg_publication), \
              'servers', (SELECT count(*) FROM pg_foreign_server), \
              'temp', (SELECT count(*) FROM pg_class WHERE relpersistence = 't'), \
              'relations', (SELECT md5(string_agg(relname || ':' || relkind::text || ':' || relowner::text || ':' \
                 || coalesce(relacl::text, '') || ':' || relhastriggers::text || ':' || relrowsecurity::text, \
                 ',' ORDER BY relname)) FROM pg_class WHERE relnamespace = 'public'::regnamespace), \
              'schemas', (SELECT md5(string_agg(nspname || ':' || coalesce(nspacl::text, ''), ',' ORDER BY nspname)) \
                 FROM pg_namespace), \
              'database', (SELECT coalesce(datacl::text, '') || datallowconn::text FROM pg_database \
                 WHERE datname = current_database()), \
              'role_settings', (SELECT count(*) FROM pg_db_role_setting WHERE setdatabase = \
                 (SELECT oid FROM pg_database WHERE datname = current_database()) OR setrole IN (0, \
                 (SELECT oid FROM pg_roles WHERE rolname = session_user), \
                 (SELECT oid FROM pg_roles WHERE rolname = 'idem_handler_hostile'))), \
              'evil_roles', (SELECT count(*) FROM pg_roles WHERE rolname LIKE 'evil%'), \
              'evil_databases', (SELECT count(*) FROM pg_database WHERE datname LIKE 'evil%'), \
              'handler_role', (SELECT string_agg(rolsuper::text || rolcreaterole::text || rolcreatedb::text \
                 || rolbypassrls::text || rolcanlogin::text, ',') FROM pg_roles WHERE rolname = 'idem_handler_hostile'), \
              'handler_memberships', (SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member \
                 WHERE r.rolname = 'idem_handler_hostile'), \
              'prepared_xacts', (SELECT count(*) FROM pg_prepared_xacts), \
              'triggers_enabled', (SELECT string_agg(tgname || tgenabled::text, ',' ORDER BY tgname) FROM pg_trigger \
                 WHERE NOT tgisinternal))"
        }
        Backend::Sqlite => {
            "SELECT (SELECT group_concat(entry, char(10)) FROM (SELECT type || ':' || name || ':' \
               || tbl_name || ':' || coalesce(sql, '') AS entry FROM sqlite_schema ORDER BY name)) \
               || ' user_version=' || (SELECT user_version FROM pragma_user_version) \
               || ' application_id=' || (SELECT application_id FROM pragma_application_id) \
               || ' schema_version=' || (SELECT schema_version FROM pragma_schema_version) \
               || ' journal_mode=' || (SELECT journal_mode FROM pragma_journal_mode) \
               || ' databases=' || (SELECT count(*) FROM pragma_database_list)"
        }
    };
    let pool = db.pool().await;
    let s: String = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    pool.close().await;
    s
}

/// Files next to the SQLite database (its own journal files aside).
fn db_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !["idem.db-wal", "idem.db-shm", "idem.db-journal"].contains(&n.as_str()))
        .collect()
}

/// Files in /tmp whose path starts with `prefix`.
fn tmp_files(prefix: &str) -> Vec<String> {
    let name = Path::new(prefix)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&name))
        .collect()
}

/// Whether `reason` shows the canary in any spelling a query could give it.
fn shows_canary(reason: &str) -> bool {
    let lower = reason.to_ascii_lowercase();
    let canary = CANARY.to_ascii_lowercase();
    let hex: String = CANARY.bytes().map(|b| format!("{b:02x}")).collect();
    let reversed: String = canary.chars().rev().collect();
    lower.contains(&canary)
        || lower.contains("5f1c2e9a")
        || lower.contains(&hex)
        || lower.contains(&reversed)
        || lower.contains("pwned")
}

/// `s` cut to `max` characters.
fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        format!("{}...", s.chars().take(max).collect::<String>())
    }
}

/// The rows of a `query` op's reason (`rejected: rows <columns> <rows>`).
fn rows_of(reason: &str) -> Option<Value> {
    let rest = reason.strip_prefix("rejected: rows ")?;
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
    values.next()?.ok()?;
    values.next()?.ok()
}

fn ended_as(outcome: &Outcome, receipt: bool, dead: Option<&str>) -> bool {
    let refused = |r: &str| {
        r.starts_with("rejected: ")
            && !r.starts_with("rejected: rows ")
            && !r.starts_with("rejected: steps ")
    };
    match (outcome, receipt, dead) {
        (Outcome::Served, true, None) => true,
        (_, false, Some(r)) => match outcome {
            Outcome::Served => false,
            Outcome::Refused => refused(r),
            Outcome::RefusedAt(i) => r.starts_with(&format!("rejected: step {i}: ")),
            Outcome::Rows(want) => rows_of(r).as_ref() == Some(want),
            Outcome::Reason(want) => r == want,
            Outcome::Trap => r.starts_with("trap: "),
            Outcome::Failed => r.starts_with("trap: ") || refused(r),
        },
        _ => false,
    }
}

/// The host's counters for one handler from its shutdown summary.
fn summary_stats(out: &Path, handler: &str) -> Option<String> {
    let text = std::fs::read_to_string(out).ok()?;
    let prefix = format!("handler {handler}: ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
}

/// One host process with its broker and database, and everything the
/// checks expect of them so far.
struct CorpusHost {
    backend: Backend,
    host: HostProcess,
    js: async_nats::jetstream::Context,
    db: TestDb,
    /// The SQLite database's directory (empty on PostgreSQL).
    db_dir: PathBuf,
    /// A path prefix in /tmp that no file may start with.
    tmp: String,
    /// The config file and the host's log and output.
    dir: tempfile::TempDir,
    /// [`fingerprint`] after the warm-up.
    baseline: String,
    /// SQLite: the files next to the database after the warm-up.
    files: BTreeSet<String>,
    /// PostgreSQL: the sessions' `application_name`s after the warm-up.
    app_names: BTreeSet<String>,
    /// Cases published so far (case `i` is message `cNNNN`, its follow-up
    /// `fNNNN`).
    next_case: usize,
    /// The hostile handler's receipts and dead letters expected.
    served: BTreeSet<String>,
    dead: BTreeSet<String>,
    /// Dead letters that were traps.
    traps: u64,
    /// Corpus cases (not the settings readers) served and dead-lettered.
    cases_served: usize,
    cases_dead: usize,
    /// Credits published to the well-behaved handler (credit `i` adds `i`).
    well: i64,
    /// Every row `accounts` must hold.
    accounts: BTreeMap<i64, i64>,
    /// What the checks found, reported together at the end.
    problems: Vec<String>,
    /// The host's peak resident memory must stay below this (KiB).
    memory_limit_kib: u64,
    /// After each group the host's resident memory must be back below this
    /// (KiB): nothing a guest made the host hold is kept.
    resident_limit_kib: u64,
    _nats: Nats,
}

impl CorpusHost {
    /// Starts the host; the hostile handler's deadline is `deadline`;
    /// `setup` runs after [`setup_sql`].
    async fn start(backend: Backend, deadline: &str, setup: &[&str]) -> Self {
        let nats = Nats::start();
        let db = TestDb::new(backend).await;
        for sql in setup_sql(backend) {
            db.execute(&sql).await;
        }
        for sql in setup {
            db.execute(sql).await;
        }
        let db_dir = match backend {
            Backend::Sqlite => PathBuf::from(db.url.strip_prefix("sqlite://").unwrap())
                .parent()
                .unwrap()
                .to_path_buf(),
            Backend::Postgres => PathBuf::new(),
        };
        create_stream(&nats, "ACCOUNTS", &["accounts.>"]).await;
        let dir = tempfile::tempdir().unwrap();
        let mut hostile = HandlerSpec::new(HOSTILE, "behave");
        hostile.subjects = vec!["accounts.hostile".into()];
        hostile.tables = vec!["accounts".into(), "notes".into(), "ledger".into()];
        hostile.extra = format!(
            "max_deliver = 1\nretry_delay = \"100ms\"\ndeadline = \"{deadline}\"\nmax_statements = 5000\nmax_param_kib = 512\n"
        );
        let mut well = HandlerSpec::new(WELL, "credit");
        well.extra = String::new();
        let cfg = write_config(dir.path(), &nats, &db, &[hostile, well]);
        let host = HostProcess::spawn(
            Path::new(env!("CARGO_BIN_EXE_idem-test-host")),
            &cfg,
            "",
            dir.path(),
            "host",
        );
        let js = nats.jetstream().await;
        let tmp = format!(
            "/tmp/idem-corpus-{}-{}",
            std::process::id(),
            match backend {
                Backend::Postgres => "pg",
                Backend::Sqlite => "sqlite",
            }
        );
        let mut accounts = BTreeMap::new();
        accounts.insert(1, ACCOUNT_1);
        accounts.insert(500, 5000);
        let mut a = CorpusHost {
            backend,
            host,
            js,
            db,
            db_dir,
            tmp,
            dir,
            baseline: String::new(),
            files: BTreeSet::new(),
            app_names: BTreeSet::new(),
            next_case: 0,
            served: BTreeSet::new(),
            dead: BTreeSet::new(),
            traps: 0,
            cases_served: 0,
            cases_dead: 0,
            well: 0,
            accounts,
            problems: Vec::new(),
            memory_limit_kib: MEMORY_LIMIT_KIB,
            resident_limit_kib: MEMORY_LIMIT_KIB,
            _nats: nats,
        };
        // Warm up: one message on each handler, so the host has set up its
        // tables, roles and connections before the baseline is taken.
        a.run_group(&Group::new("warm-up", &a.ctx())).await;
        a.baseline = fingerprint(&a.db).await;
        if backend == Backend::Sqlite {
            a.files = db_files(&a.db_dir);
        } else {
            a.app_names = a.application_names().await;
        }
        a
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            backend: self.backend,
            dir: self.db_dir.display().to_string(),
            tmp: self.tmp.clone(),
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.host.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    async fn application_names(&self) -> BTreeSet<String> {
        let pool = self.db.pool().await;
        let rows = sqlx::query(
            "SELECT coalesce(application_name, '') FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        pool.close().await;
        rows.iter().map(|r| r.get::<String, _>(0)).collect()
    }

    /// What a fresh session reads for [`reader_sql`], as the guest's reason.
    async fn fresh_reading(&self) -> Value {
        let pool = self.db.pool().await;
        let row = sqlx::query(reader_sql(self.backend))
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        let values: Vec<Value> = (0..row.len())
            .map(|i| match row.try_get::<String, _>(i) {
                Ok(s) => json!(s),
                Err(_) => json!(row.get::<i64, _>(i)),
            })
            .collect();
        json!([values])
    }

    async fn publish_hostile(&self, p: &Value) {
        publish(&self.js, "accounts.hostile", &p.to_string(), &[]).await;
    }

    /// Publishes `group`'s cases, each followed by a credit on the same
    /// handler and every fifth by a credit on the well-behaved one, waits
    /// until all are settled, then checks every case and the effects.
    async fn run_group(&mut self, group: &Group) {
        let filter = std::env::var("IDEM_CORPUS_CASES").unwrap_or_default();
        let mut cases: Vec<&Hostile> = group
            .cases
            .iter()
            .filter(|c| {
                filter.is_empty()
                    || c.name.contains(&filter)
                    || c.payload.to_string().contains(&filter)
            })
            .collect();
        let reader = Hostile {
            name: format!("{}/settings-reader", group.name),
            payload: q(reader_sql(self.backend)),
            outcome: Outcome::Rows(self.fresh_reading().await),
            effects: Vec::new(),
        };
        cases.push(&reader);
        let started = Instant::now();
        let mut ids = Vec::new();
        for (k, case) in cases.iter().enumerate() {
            let i = self.next_case;
            self.next_case += 1;
            let id = format!("c{i:04}");
            let mut p = case.payload.clone();
            p["event_id"] = json!(id);
            self.publish_hostile(&p).await;
            let follow = json!({"op": "credit", "event_id": format!("f{i:04}"),
                                "account_id": FOLLOW_UP + i as i64, "amount": i as i64 + 1});
            self.publish_hostile(&follow).await;
            if k % 5 == 0 {
                self.well += 1;
                let c = credit(&format!("w{:04}", self.well), WELL_ACCOUNT, self.well);
                publish(&self.js, "accounts.credit", &c, &[]).await;
            }
            ids.push((id, i, *case));
        }
        // Wait until every message is settled.
        let want_hostile = (self.served.len() + self.dead.len() + 2 * cases.len()) as i64;
        let want_well = self.well;
        let patience =
            Duration::from_secs(60) + Duration::from_millis(2500) * self.count_traps(&cases);
        let deadline = Instant::now() + patience;
        loop {
            let (settled, well) = self.settled().await.unwrap_or((0, 0));
            if settled >= want_hostile && well >= want_well {
                break;
            }
            if let Some(status) = self.host.exited() {
                panic!(
                    "{}: the host exited ({status}) during group {}; log:\n{}",
                    self.label(),
                    group.name,
                    self.log_tail()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "{}: group {} not settled in {patience:?} ({settled} of {want_hostile} hostile, \
                     {well} of {want_well} well-behaved); log:\n{}",
                    self.label(),
                    group.name,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let elapsed = started.elapsed();
        // Each case: its own outcome.
        let receipts: BTreeSet<String> = self.db.receipt_ids(HOSTILE).await.into_iter().collect();
        let dead_letters: BTreeMap<String, String> = self
            .db
            .dead_letters(HOSTILE)
            .await
            .into_iter()
            .map(|(id, r)| (id.unwrap_or_default(), r))
            .collect();
        for (id, i, case) in &ids {
            let receipt = receipts.contains(id);
            let dead = dead_letters.get(id).map(String::as_str);
            if !ended_as(&case.outcome, receipt, dead) {
                self.problems.push(format!(
                    "{} {}: expected {:?}, got receipt={receipt} dead letter={:?}; payload {}",
                    self.label(),
                    case.name,
                    case.outcome,
                    dead.map(|r| shorten(r, 300)),
                    shorten(&case.payload.to_string(), 300)
                ));
            }
            if !case.name.ends_with("/settings-reader") {
                if receipt {
                    self.cases_served += 1;
                } else {
                    self.cases_dead += 1;
                }
            }
            if receipt {
                self.served.insert(id.clone());
                for (account, amount) in &case.effects {
                    *self.accounts.entry(*account).or_insert(0) += amount;
                }
            } else {
                self.dead.insert(id.clone());
                if dead.is_some_and(|r| r.starts_with("trap: ")) {
                    self.traps += 1;
                }
            }
            self.served.insert(format!("f{i:04}"));
            self.accounts.insert(FOLLOW_UP + *i as i64, *i as i64 + 1);
        }
        if self.well > 0 {
            self.accounts
                .insert(WELL_ACCOUNT, (1..=self.well).sum::<i64>());
        }
        self.check_effects(group.name, &receipts, &dead_letters)
            .await;
        let (hwm, rss) = process_memory_kib(self.host.pid()).unwrap_or((0, 0));
        eprintln!(
            "{} {:<10} {:>3} cases settled in {:>6.2?}; host VmHWM {} MiB, VmRSS {} MiB",
            self.label(),
            group.name,
            cases.len(),
            elapsed,
            hwm / 1024,
            rss / 1024
        );
    }

    /// Hostile messages settled (receipts plus dead letters) and
    /// well-behaved receipts; `None` until the host has made its tables.
    async fn settled(&self) -> Option<(i64, i64)> {
        let pool = self.db.pool().await;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM idem_receipts WHERE consumer = '{HOSTILE}') \
             + (SELECT count(*) FROM idem_dead_letters WHERE consumer = '{HOSTILE}'), \
             (SELECT count(*) FROM idem_receipts WHERE consumer = '{WELL}')"
        )))
        .fetch_one(&pool)
        .await;
        pool.close().await;
        let row = row.ok()?;
        Some((row.get(0), row.get(1)))
    }

    fn count_traps(&self, cases: &[&Hostile]) -> u32 {
        cases
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Trap))
            .count() as u32
    }

    fn label(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }

    fn problem(&mut self, group: &str, what: String) {
        self.problems
            .push(format!("{} after group {group}: {what}", self.label()));
    }

    async fn check_effects(
        &mut self,
        group: &str,
        receipts: &BTreeSet<String>,
        dead_letters: &BTreeMap<String, String>,
    ) {
        // The host is alive and its memory bounded.
        if let Some(status) = self.host.exited() {
            panic!(
                "{}: the host exited ({status}) after group {group}; log:\n{}",
                self.label(),
                self.log_tail()
            );
        }
        let (hwm, rss) = process_memory_kib(self.host.pid()).expect("host memory");
        if hwm >= self.memory_limit_kib {
            self.problem(
                group,
                format!("host VmHWM {hwm} KiB passed {} KiB", self.memory_limit_kib),
            );
        }
        if rss >= self.resident_limit_kib {
            self.problem(
                group,
                format!(
                    "host VmRSS {rss} KiB stayed above {} KiB",
                    self.resident_limit_kib
                ),
            );
        }
        // The canary: unread, unchanged.
        for (id, reason) in dead_letters {
            if shows_canary(reason) {
                self.problem(
                    group,
                    format!("dead letter {id} shows the canary: {reason}"),
                );
            }
        }
        let pool = self.db.pool().await;
        let secrets: Vec<(i64, String)> = sqlx::query("SELECT id, v FROM secrets ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        if secrets != [(1, CANARY.to_owned())] {
            self.problem(group, format!("secrets changed: {secrets:?}"));
        }
        // Receipts and dead letters: exactly the expected ones.
        if *receipts != self.served {
            let extra: Vec<_> = receipts.difference(&self.served).collect();
            let missing: Vec<_> = self.served.difference(receipts).collect();
            self.problem(
                group,
                format!("hostile receipts differ: extra {extra:?}, missing {missing:?}"),
            );
        }
        let dead: BTreeSet<String> = dead_letters.keys().cloned().collect();
        if dead != self.dead {
            self.problem(
                group,
                format!("hostile dead letters differ: {dead:?} vs {:?}", self.dead),
            );
        }
        let totals: (i64, i64) = sqlx::query(
            "SELECT (SELECT count(*) FROM idem_receipts), (SELECT count(*) FROM idem_dead_letters)",
        )
        .fetch_one(&pool)
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
        let want = (
            (self.served.len() as i64) + self.well,
            self.dead.len() as i64,
        );
        if totals != want {
            self.problem(
                group,
                format!("idem_receipts / idem_dead_letters hold {totals:?} rows, want {want:?}"),
            );
        }
        let well_ids = self.db.receipt_ids(WELL).await;
        let want_well: Vec<String> = (1..=self.well).map(|i| format!("w{i:04}")).collect();
        if well_ids != want_well {
            self.problem(group, format!("well-behaved receipts {well_ids:?}"));
        }
        // Every balance exact: follow-ups applied once, effects as declared.
        let accounts: BTreeMap<i64, i64> =
            sqlx::query("SELECT account_id, balance FROM accounts ORDER BY account_id")
                .fetch_all(&pool)
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
        if accounts != self.accounts {
            let diff: Vec<String> = accounts
                .keys()
                .chain(self.accounts.keys())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .filter(|k| accounts.get(k) != self.accounts.get(k))
                .map(|k| format!("{k}: {:?} want {:?}", accounts.get(k), self.accounts.get(k)))
                .collect();
            self.problem(group, format!("accounts differ: {diff:?}"));
        }
        let others: (i64, i64) =
            sqlx::query("SELECT (SELECT count(*) FROM notes), (SELECT count(*) FROM ledger)")
                .fetch_one(&pool)
                .await
                .map(|r| (r.get(0), r.get(1)))
                .unwrap();
        if others != (0, 0) {
            self.problem(group, format!("notes / ledger rows: {others:?}"));
        }
        pool.close().await;
        // No new objects.
        let now = fingerprint(&self.db).await;
        if !self.baseline.is_empty() && now != self.baseline {
            self.problem(
                group,
                format!(
                    "objects changed:\n  before {}\n  after  {now}",
                    self.baseline
                ),
            );
        }
        let stray = tmp_files(&self.tmp);
        if !stray.is_empty() {
            self.problem(group, format!("files in /tmp: {stray:?}"));
        }
        match self.backend {
            Backend::Sqlite => {
                let files = db_files(&self.db_dir);
                if !self.files.is_empty() && files != self.files {
                    self.problem(
                        group,
                        format!(
                            "files next to the database: {files:?}, were {:?}",
                            self.files
                        ),
                    );
                }
            }
            Backend::Postgres => self.check_sessions(group).await,
        }
    }

    /// No advisory lock, no busy backend, no renamed session. The host's
    /// own housekeeping (receipt pruning, under a transaction advisory lock)
    /// may be caught in passing, so locks and busy backends count only when
    /// every one of three samples, 150 ms apart, shows the same ones.
    async fn check_sessions(&mut self, group: &str) {
        let pool = self.db.pool().await;
        let mut lasting: Option<(BTreeSet<String>, BTreeSet<String>)> = None;
        for sample in 0..3 {
            if sample > 0 {
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            let locks: BTreeSet<String> = sqlx::query(
                "SELECT pid::text || ' ' || mode || ' ' || coalesce(classid::text, '') || ':' \
                 || coalesce(objid::text, '') FROM pg_locks WHERE locktype = 'advisory' \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
            let busy: BTreeSet<String> = sqlx::query(
                "SELECT pid::text || ' ' || state || ' since ' || coalesce(query_start::text, '') \
                 || ': ' || left(query, 120) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                 AND state IS NOT NULL AND state <> 'idle'",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
            lasting = Some(match lasting {
                None => (locks, busy),
                Some((l, b)) => (
                    l.intersection(&locks).cloned().collect(),
                    b.intersection(&busy).cloned().collect(),
                ),
            });
        }
        pool.close().await;
        let (locks, busy) = lasting.unwrap();
        if !locks.is_empty() {
            self.problem(group, format!("advisory locks held: {locks:?}"));
        }
        if !busy.is_empty() {
            self.problem(group, format!("backends still busy: {busy:?}"));
        }
        let names = self.application_names().await;
        let odd: Vec<_> = names
            .iter()
            .filter(|n| !n.is_empty() && !self.app_names.contains(*n))
            .collect();
        if !odd.is_empty() {
            self.problem(group, format!("sessions renamed: {odd:?}"));
        }
    }

    /// Stops the host and checks its own counters.
    fn finish(mut self) {
        let label = self.label();
        let out = self.dir.path().join("host.out");
        let ended = self.host.terminate(Duration::from_secs(20));
        let hostile = summary_stats(&out, HOSTILE).unwrap_or_default();
        let well = summary_stats(&out, WELL).unwrap_or_default();
        let processed = self.served.len();
        let dead = self.dead.len();
        let want_hostile = format!(
            "processed={processed} duplicates=0 retried=0 dead_lettered={dead} traps={}",
            self.traps
        );
        if !hostile.contains(&want_hostile) {
            self.problems.push(format!(
                "{}: hostile stats `{hostile}`, want `{want_hostile}` (status {:?})",
                label, ended.status
            ));
        }
        let want_well = format!(
            "processed={} duplicates=0 retried=0 dead_lettered=0 traps=0",
            self.well
        );
        if !well.contains(&want_well) {
            self.problems.push(format!(
                "{}: well-behaved stats `{well}`, want `{want_well}`",
                label
            ));
        }
        eprintln!(
            "{label}: {} cases served, {} dead-lettered ({} traps)\n{label} hostile: {hostile}\n\
             {label} well-behaved: {well}",
            self.cases_served, self.cases_dead, self.traps
        );
        assert!(
            self.problems.is_empty(),
            "{} problem(s):\n{}",
            self.problems.len(),
            self.problems.join("\n")
        );
    }
}

async fn run_corpus(backend: Backend) {
    let started = Instant::now();
    let mut a = CorpusHost::start(backend, DEADLINE, &[]).await;
    let groups = corpus(&a.ctx());
    let total: usize = groups.iter().map(|g| g.cases.len()).sum();
    eprintln!(
        "{backend:?}: {total} hostile cases in {} groups",
        groups.len()
    );
    assert!(total >= 150, "{total} cases");
    for g in &groups {
        a.run_group(g).await;
    }
    a.verdict_cache().await;
    a.finish();
    eprintln!("{backend:?}: corpus done in {:?}", started.elapsed());
}

impl CorpusHost {
    /// Many distinct statement texts: the guard's verdict cache is bounded
    /// (entries and bytes), so the host's memory does not grow with them.
    async fn verdict_cache(&mut self) {
        let filter = std::env::var("IDEM_CORPUS_CASES").unwrap_or_default();
        if !filter.is_empty() && !"verdict-cache/distinct-texts".contains(&filter) {
            return;
        }
        let (messages, per_message) = match self.backend {
            Backend::Sqlite => (100, 200),
            Backend::Postgres => (100, 200),
        };
        let pad = 16_000;
        let mut g = Group::new("verdict-cache", &self.ctx());
        for m in 0..messages {
            g.add(
                &format!("distinct-texts-{m}"),
                json!({"op": "many-texts", "count": per_message, "start": m * per_message, "pad": pad}),
                Outcome::Served,
            );
        }
        let before = process_memory_kib(self.host.pid()).expect("host memory");
        self.run_group(&g).await;
        let after = process_memory_kib(self.host.pid()).expect("host memory");
        eprintln!(
            "{} verdict cache: {} texts of {pad} bytes; VmRSS {} -> {} MiB, VmHWM {} -> {} MiB",
            self.label(),
            messages * per_message,
            before.1 / 1024,
            after.1 / 1024,
            before.0 / 1024,
            after.0 / 1024
        );
        if after.1 > before.1 + 128 * 1024 {
            self.problem(
                "verdict-cache",
                format!(
                    "host VmRSS grew from {} to {} KiB and stayed",
                    before.1, after.1
                ),
            );
        }
    }
}

on_both_databases!(corpus, run_corpus);

/// PostgreSQL sends a row whole, and the host counts it against
/// `max_result_kib` once it has arrived (before decoding it): one 900 MB
/// value (under PostgreSQL's 1 GB field limit, built by allowed `replace`
/// calls) is refused, the host's peak memory stays within twice
/// PostgreSQL's limit (the driver's read buffer, README "What a handler can
/// and cannot do"), and its resident memory comes back down (the
/// connection's buffer is given back). Its own host, so the peak is this
/// message's, with a deadline long enough for PostgreSQL to build the value
/// on a busy machine (on an idle one, a 400 MB value arrives within the
/// default 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_row_near_field_limit() {
    let mut a = CorpusHost::start(Backend::Postgres, "30s", &[]).await;
    a.memory_limit_kib = 2 * (1 << 20) + (1 << 18);
    a.resident_limit_kib = 256 << 10;
    let mut grow = "'xxxxxxxxx'".to_owned();
    for _ in 0..8 {
        grow = format!("replace({grow}, 'x', 'xxxxxxxxxx')");
    }
    let mut g = Group::new("row-near-field-limit", &a.ctx());
    g.add(
        "value-900-mb",
        q(&format!("SELECT {grow} AS s")),
        Outcome::Refused,
    );
    a.run_group(&g).await;
    a.finish();
}

/// PostgreSQL reads `row.f` as `f(row)` when the row has no column `f`
/// ("Functions as Columns" in its manual), so a function the application
/// defined on a granted table's row type is callable through attribute
/// notation, although the allow-list refuses the same call written
/// `f(row)`. Here `reveal(accounts)` is SECURITY DEFINER and reads
/// `secrets`; `peek(accounts)` reads it as the caller (the handler role
/// stops it); `grab(accounts)` takes a session advisory lock. Each call must
/// be refused like the direct one, and the canary must stay unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_attribute_notation_calls_no_function_outside_the_allow_list() {
    let mut a = CorpusHost::start(
        Backend::Postgres,
        DEADLINE,
        &[
            "CREATE FUNCTION reveal(accounts) RETURNS text LANGUAGE sql STABLE SECURITY DEFINER \
             AS 'SELECT v FROM secrets'",
            "CREATE FUNCTION grab(accounts) RETURNS bigint LANGUAGE plpgsql \
             AS 'BEGIN PERFORM pg_advisory_lock(424242); RETURN 1; END'",
            "CREATE FUNCTION peek(accounts) RETURNS text LANGUAGE sql STABLE \
             AS 'SELECT v FROM secrets'",
        ],
    )
    .await;
    let mut g = Group::new("attribute-notation", &a.ctx());
    g.refused(q(
        "SELECT reveal(a) AS r FROM accounts a WHERE account_id = 500",
    ));
    g.refused(q(
        "SELECT grab(a) AS g FROM accounts a WHERE account_id = 500",
    ));
    g.add(
        "definer-function-as-column",
        q("SELECT a.reveal FROM accounts a WHERE account_id = 500"),
        Outcome::Refused,
    );
    g.add(
        "definer-function-as-field",
        q("SELECT (a).reveal FROM accounts a WHERE account_id = 500"),
        Outcome::Refused,
    );
    g.add(
        "definer-function-in-where",
        q("SELECT account_id FROM accounts a WHERE a.reveal LIKE 'C%'"),
        Outcome::Refused,
    );
    g.add(
        "invoker-function-as-column",
        q("SELECT a.peek FROM accounts a WHERE account_id = 500"),
        Outcome::Refused,
    );
    g.add(
        "lock-function-as-column",
        q("SELECT a.grab FROM accounts a WHERE account_id = 500"),
        Outcome::Refused,
    );
    a.run_group(&g).await;
    a.finish();
}
