//! How a statement is spelled: quotes, dollar quotes, comments, Unicode,
//! several statements in one text, placeholders and parameter values.

use crate::outcome::{Ctx, Group, Outcome, int_row, q, qp, steps, text_row, x};
use serde_json::json;

pub(crate) fn quotes(ctx: &Ctx) -> Group {
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

pub(crate) fn dollar_quotes(ctx: &Ctx) -> Group {
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

pub(crate) fn comments(ctx: &Ctx) -> Group {
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

pub(crate) fn unicode(ctx: &Ctx) -> Group {
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

pub(crate) fn multi(ctx: &Ctx) -> Group {
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

/// Placeholders and parameter values.
pub(crate) fn params(ctx: &Ctx) -> Group {
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
