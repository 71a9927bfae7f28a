//! The server's own reach: catalog, file, large-object, extension and
//! server functions and tables, session settings, roles and locks.

use crate::outcome::{Ctx, Group, Outcome, q, steps, x};
use serde_json::json;

/// Catalog, file, large-object, extension and server functions and tables.
/// Each is run on both databases: on the other one it is a name that does
/// not exist (or does not parse), refused all the same.
pub(crate) fn catalogs(ctx: &Ctx) -> Group {
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

pub(crate) fn settings(ctx: &Ctx) -> Group {
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

pub(crate) fn roles(ctx: &Ctx) -> Group {
    let mut g = Group::new("roles", ctx);
    for sql in [
        "SET ROLE postgres",
        "SET ROLE NONE",
        "RESET ROLE",
        "SET LOCAL ROLE postgres",
        "SET SESSION AUTHORIZATION postgres",
        "SET SESSION AUTHORIZATION DEFAULT",
        "GRANT SELECT ON secrets TO PUBLIC",
        "GRANT postgres TO idem_handler_hostile_12dbf8f3",
        "CREATE ROLE evil SUPERUSER",
        "ALTER ROLE idem_handler_hostile_12dbf8f3 SUPERUSER",
        "REVOKE ALL ON accounts FROM PUBLIC",
        "ALTER TABLE secrets OWNER TO idem_handler_hostile_12dbf8f3",
        "SECURITY LABEL ON TABLE secrets IS 'x'",
        "ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO PUBLIC",
        "REASSIGN OWNED BY postgres TO idem_handler_hostile_12dbf8f3",
        "DROP OWNED BY idem_handler_hostile_12dbf8f3",
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

pub(crate) fn locks(ctx: &Ctx) -> Group {
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
