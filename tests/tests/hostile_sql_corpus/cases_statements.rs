//! Statements no handler may run: ATTACH, DETACH and VACUUM, transaction
//! control, utility commands and DDL.

use crate::outcome::{Ctx, Group, Outcome, q, steps, x};

pub(crate) fn attach(ctx: &Ctx) -> Group {
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

pub(crate) fn transactions(ctx: &Ctx) -> Group {
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

pub(crate) fn utility(ctx: &Ctx) -> Group {
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

pub(crate) fn ddl(ctx: &Ctx) -> Group {
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
