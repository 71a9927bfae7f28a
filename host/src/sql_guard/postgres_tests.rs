#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use super::judge;
use crate::sql_value::DbErrorKind;
use std::collections::HashSet;

/// The expected outcome of one statement.
#[derive(Debug)]
enum Want {
    /// Allowed; the highest placeholder.
    Allow(usize),
    /// Refused as denied; a substring of the message.
    Deny(&'static str),
    /// Refused by PostgreSQL's grammar; a substring of the message.
    Syntax(&'static str),
}
use Want::{Allow, Deny, Syntax};

/// The handler may use `accounts`, `ledger` and `events`; `secrets` exists in
/// the database but is not granted.
fn granted() -> HashSet<String> {
    ["accounts", "ledger", "events"]
        .into_iter()
        .map(String::from)
        .collect()
}

const SECRETS: &str =
    "table `secrets` is not granted to this handler; grant it in [[handler]] tables";
const HOST: &str = "names a host table; idem_* tables are never reachable from a handler";
const CATALOG: &str = "names a system catalog; handlers cannot read catalogs";
const VALUE_FN: &str = "SQL value functions read the clock or session state";
const FN: &str = "is not allowed in handler SQL (allowed: abs, avg, coalesce,";
const FROM_FN: &str = "functions in FROM (generate_series, ROWS FROM, ...) are not allowed";
const CLOCK: &str = "reads the database clock; pass times in the message instead";

const CASES: &[(&str, Want)] = &[
    // Plain reads and writes of granted tables.
    ("SELECT 1", Allow(0)),
    ("SELECT id, balance FROM accounts WHERE id = $1", Allow(1)),
    ("select * from public.accounts", Allow(0)),
    ("SELECT * FROM ACCOUNTS", Allow(0)),
    (r#"SELECT "id" FROM "accounts""#, Allow(0)),
    ("SELECT * FROM accounts;", Allow(0)),
    ("SELECT * FROM ONLY accounts", Allow(0)),
    ("TABLE accounts", Allow(0)),
    ("VALUES (1, 'a'), (2, 'b')", Allow(0)),
    ("SELECT $65535", Allow(65535)),
    (
        "SELECT * FROM accounts a JOIN ledger l ON l.account_id = a.id WHERE a.id = $2",
        Allow(2),
    ),
    (
        "SELECT * FROM accounts a NATURAL JOIN ledger LEFT JOIN events e USING (id)",
        Allow(0),
    ),
    (
        "INSERT INTO accounts (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE \
         SET balance = accounts.balance + excluded.balance RETURNING balance",
        Allow(2),
    ),
    (
        "INSERT INTO accounts (id) VALUES ($1) ON CONFLICT DO NOTHING",
        Allow(1),
    ),
    (
        "INSERT INTO accounts AS a (id, balance) VALUES ($1, $2) ON CONFLICT (id) WHERE id > 0 \
         DO UPDATE SET balance = a.balance + 1 WHERE a.balance < $3",
        Allow(3),
    ),
    (
        "INSERT INTO accounts (id, balance) VALUES ($1, DEFAULT)",
        Allow(1),
    ),
    ("INSERT INTO accounts DEFAULT VALUES", Allow(0)),
    (
        "INSERT INTO ledger (account_id, amount) SELECT id, balance FROM accounts WHERE balance > $1",
        Allow(1),
    ),
    (
        "UPDATE accounts SET balance = balance - $1 WHERE id = $2 RETURNING *",
        Allow(2),
    ),
    (
        "UPDATE accounts SET balance = l.amount FROM ledger l WHERE l.account_id = accounts.id",
        Allow(0),
    ),
    ("UPDATE accounts SET balance = DEFAULT", Allow(0)),
    (
        "UPDATE accounts SET (balance, name) = (SELECT amount, 'x' FROM ledger WHERE ledger.id = $1) WHERE id = $2",
        Allow(2),
    ),
    (
        "UPDATE accounts SET balance = 0 RETURNING WITH (OLD AS o) o.balance",
        Allow(0),
    ),
    (
        "DELETE FROM ledger USING accounts WHERE ledger.account_id = accounts.id AND accounts.id = $1",
        Allow(1),
    ),
    (
        "DELETE FROM ledger WHERE id IN (SELECT id FROM ledger WHERE amount < 0) RETURNING id",
        Allow(0),
    ),
    // Expressions, aggregates, windows, allowed functions.
    (
        "SELECT count(*), sum(balance), avg(balance), min(id), max(id) FROM accounts",
        Allow(0),
    ),
    (
        "SELECT count(DISTINCT account_id) FILTER (WHERE amount > 0) FROM ledger",
        Allow(0),
    ),
    (
        "SELECT id, sum(amount) OVER (PARTITION BY account_id ORDER BY id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM ledger",
        Allow(0),
    ),
    (
        "SELECT sum(amount) OVER w FROM ledger WINDOW w AS (PARTITION BY account_id)",
        Allow(0),
    ),
    (
        "SELECT upper(name), lower(name), length(name), substr(name, 1, 2), replace(name, 'a', 'b'), \
         round(balance, 2), abs(balance), coalesce(name, ''), nullif(name, ''), greatest(1, 2), least(1, 2) FROM accounts",
        Allow(0),
    ),
    (
        "SELECT TRIM(BOTH ' ' FROM name), TRIM(LEADING FROM name), TRIM(TRAILING 'x' FROM name), trim(name), \
         SUBSTRING(name FROM 2 FOR 3), substring(name, 1, 2) FROM accounts",
        Allow(0),
    ),
    (
        "SELECT pg_catalog.upper(name), pg_catalog.btrim(name) FROM accounts",
        Allow(0),
    ),
    (
        "SELECT * FROM accounts WHERE id = ANY($1) AND name LIKE $2 AND name ILIKE 'a%' AND balance BETWEEN 1 AND 10 \
         AND id NOT IN (1, 2) AND name IS NOT NULL AND (balance > 0) IS TRUE AND name IS DISTINCT FROM 'x'",
        Allow(2),
    ),
    (
        "SELECT * FROM accounts WHERE name ~ '^a' AND name !~* 'b' AND NOT (id <> 1 OR id >= 2)",
        Allow(0),
    ),
    (
        "SELECT CASE WHEN balance > 0 THEN 'credit' ELSE 'debit' END, CASE id WHEN 1 THEN 'one' END FROM accounts",
        Allow(0),
    ),
    (
        "SELECT ARRAY[1, 2], (ARRAY[1, 2])[1], ('{1,2,3}'::int[])[1:2], ROW(1, 'a'), (1, 2) = (1, 2)",
        Allow(0),
    ),
    (
        r#"SELECT name COLLATE "C" FROM accounts ORDER BY name COLLATE pg_catalog."default""#,
        Allow(0),
    ),
    (
        "SELECT account_id, sum(amount) FROM ledger GROUP BY ROLLUP (account_id) HAVING sum(amount) > 0",
        Allow(0),
    ),
    (
        "SELECT DISTINCT ON (account_id) * FROM ledger ORDER BY account_id, id DESC NULLS LAST",
        Allow(0),
    ),
    (
        "SELECT id FROM accounts UNION SELECT account_id FROM ledger ORDER BY 1 LIMIT 10 OFFSET $1",
        Allow(1),
    ),
    (
        "SELECT id FROM accounts INTERSECT SELECT account_id FROM ledger EXCEPT SELECT 3",
        Allow(0),
    ),
    (
        "SELECT * FROM accounts ORDER BY id FETCH FIRST 3 ROWS ONLY",
        Allow(0),
    ),
    ("SELECT x.v FROM (VALUES (1)) AS x(v)", Allow(0)),
    (
        "SELECT -0.5, 1e10, 1.5::numeric, B'101', X'1F', true, NULL",
        Allow(0),
    ),
    ("SELECT col1_x FROM accounts", Allow(0)),
    // Subqueries in every position.
    (
        "SELECT (SELECT max(id) FROM ledger), EXISTS (SELECT 1 FROM ledger), id = ANY (SELECT account_id FROM ledger), \
         ARRAY(SELECT id FROM ledger) FROM accounts",
        Allow(0),
    ),
    (
        "SELECT * FROM accounts a, LATERAL (SELECT * FROM ledger l WHERE l.account_id = a.id LIMIT 1) x",
        Allow(0),
    ),
    // Row locks are transaction-scoped.
    ("SELECT * FROM accounts WHERE id = $1 FOR UPDATE", Allow(1)),
    (
        "SELECT * FROM accounts a FOR NO KEY UPDATE OF a SKIP LOCKED",
        Allow(0),
    ),
    (
        "SELECT * FROM accounts FOR UPDATE OF idem_receipts",
        Deny(HOST),
    ),
    // Casts to plain value types.
    (
        "SELECT $1::int, $2::bigint, $3::text, $4::numeric(10,2), $5::timestamptz, $6::jsonb, $7::uuid, $8::boolean, \
         $9::bytea, $10::date, $11::interval, $12::varchar(5), $13::char(2), $14::double precision, $15::real, \
         $16::smallint, $17::time, $18::timestamp with time zone, $19::json, $20::text[], $21::decimal, $22::float",
        Allow(22),
    ),
    (
        "SELECT CAST($1 AS integer), DATE '2024-01-02', TIMESTAMP '2024-01-02 03:04:05', INTERVAL '1' DAY",
        Allow(1),
    ),
    (
        "SELECT 'accounts'::regclass",
        Deny("cast to `regclass` is not allowed: reg* types look names up in the system catalogs"),
    ),
    (
        "SELECT 'idem_receipts'::regclass::oid",
        Deny("cast to `oid` is not allowed"),
    ),
    (
        "SELECT 'idem_receipts'::regclass::text",
        Deny("cast to `regclass` is not allowed"),
    ),
    (
        "SELECT 1::oid",
        Deny("cast to `oid` is not allowed: oids identify system catalog objects"),
    ),
    ("SELECT 'upper'::regproc", Deny("reg* types look names up")),
    (
        "SELECT CAST('int4' AS pg_catalog.regtype)",
        Deny("cast to `pg_catalog.regtype` is not allowed: reg*"),
    ),
    ("SELECT $1::regrole[]", Deny("cast to `regrole`")),
    (
        r#"SELECT 'accounts'::"RegClass""#,
        Deny("cast to `RegClass` is not allowed: reg*"),
    ),
    (
        "SELECT '(0,1)'::tid",
        Deny("it exposes server internals (row, transaction or WAL positions)"),
    ),
    ("SELECT '1'::xid8", Deny("it exposes server internals")),
    (
        "SELECT '0/0'::pg_lsn",
        Deny("cast to `pg_lsn` is not allowed: it exposes server internals"),
    ),
    (
        "SELECT B'1'::bit(1)",
        Deny("cast to `pg_catalog.bit` is not allowed: casts may target only plain value types ("),
    ),
    (
        "SELECT NULL::accounts",
        Deny("cast to `accounts` is not allowed: casts may target only plain value types"),
    ),
    (
        "SELECT $1::public.int4",
        Deny("cast to `public.int4` is not allowed"),
    ),
    (
        "SELECT NULL::idem_receipts",
        Deny("cast to `idem_receipts` is not allowed"),
    ),
    // Quoting and comments are read exactly as PostgreSQL reads them.
    // With standard_conforming_strings on, `\` is an ordinary character and
    // `''` a quote inside the literal: each of these two is ONE string literal
    // running to the final `'` (PostgreSQL 15 returns the text
    // `\' AS a UNION ALL SELECT v FROM secrets --`), so nothing is read.
    (
        r"SELECT '\'' AS a UNION ALL SELECT v FROM secrets --'",
        Allow(0),
    ),
    (
        r"SELECT '\'' AS a, set_config($$role$$, $$postgres$$, true) AS r --'",
        Allow(0),
    ),
    // The mirror image, where a backslash-escaping reader sees one literal
    // but PostgreSQL ends the literal at `\'` and runs the rest.
    (
        r"SELECT 'a\' AS a UNION ALL SELECT v::text FROM secrets --'",
        Deny(SECRETS),
    ),
    (
        r"SELECT 'x\', set_config($$role$$, $$postgres$$, true) AS r --'",
        Deny("function `set_config` is not allowed"),
    ),
    (
        r"SELECT 'x\', pg_read_file('/etc/passwd') --'",
        Deny("function `pg_read_file`"),
    ),
    (r"SELECT E'\'' AS a, v FROM secrets --'", Deny(SECRETS)),
    (r"SELECT E'\\' AS a, v FROM secrets", Deny(SECRETS)),
    (r"SELECT 'a'' FROM secrets --' AS x", Allow(0)),
    (
        r"SELECT E'it\'s', $$dollar 'quoted'$$, $tag$ $$ nested $$ $tag$, U&'d\0061ta'",
        Allow(0),
    ),
    ("SELECT $x$ FROM secrets $x$ AS hidden", Allow(0)),
    ("SELECT $a$ $b$ $a$, v FROM secrets -- $b$", Deny(SECRETS)),
    ("SELECT 1 /* /* nested */ FROM secrets */", Allow(0)),
    ("SELECT 1 /* /* nested */ */ FROM secrets", Deny(SECRETS)),
    (
        "/* leading */ SELECT /* a /* b */ c */ id FROM accounts -- trailing",
        Allow(0),
    ),
    ("SELECT 1 -- FROM secrets", Allow(0)),
    ("SELECT 1 -- hidden\n FROM secrets", Deny(SECRETS)),
    (
        r#"SELECT * FROM U&"idem\005freceipts""#,
        Deny("`idem_receipts` names a host table"),
    ),
    (r#"SELECT * FROM U&"secr\0065ts""#, Deny(SECRETS)),
    (r#"SELECT * FROM U&"!0061ccounts" UESCAPE '!'"#, Allow(0)),
    (
        r"SELECT U&'\006eow'::timestamptz",
        Deny("the literal 'now' reads the database clock"),
    ),
    (r"SELECT E'n\157w'", Deny("the literal 'now' reads")),
    (
        r#"SELECT * FROM "Accounts""#,
        Deny("table `Accounts` is not granted to this handler"),
    ),
    (
        r#"SELECT * FROM "IDEM_receipts""#,
        Deny("`IDEM_receipts` names a host table"),
    ),
    // Host tables, catalogs, schemas: everywhere an identifier stands.
    (
        "SELECT * FROM idem_receipts",
        Deny(
            "`idem_receipts` names a host table; idem_* tables are never reachable from a handler",
        ),
    ),
    ("SELECT * FROM _idem_outbox", Deny(HOST)),
    ("SELECT idem_id FROM accounts", Deny(HOST)),
    ("SELECT 1 AS idem_x", Deny(HOST)),
    ("SELECT * FROM accounts AS idem_a", Deny(HOST)),
    ("SELECT * FROM accounts a(x, idem_y)", Deny(HOST)),
    (
        "INSERT INTO accounts (id) VALUES ($1) ON CONFLICT ON CONSTRAINT idem_pk DO NOTHING",
        Deny(HOST),
    ),
    ("WITH idem_x AS (SELECT 1) SELECT * FROM idem_x", Deny(HOST)),
    (
        "SELECT count(*) OVER idem_w FROM accounts WINDOW idem_w AS ()",
        Deny(HOST),
    ),
    (
        "SELECT * FROM accounts WHERE idem_receipts.id = 1",
        Deny(HOST),
    ),
    (
        "SELECT * FROM pg_catalog.pg_class",
        Deny("`pg_catalog` names a system catalog; handlers cannot read catalogs"),
    ),
    ("SELECT * FROM information_schema.tables", Deny(CATALOG)),
    ("SELECT * FROM information_schema", Deny(CATALOG)),
    ("SELECT pg_catalog FROM accounts", Deny(CATALOG)),
    (
        "SELECT * FROM pg_class",
        Deny("`pg_class` is a system table; handlers cannot read it"),
    ),
    ("SELECT * FROM pg_catalog.accounts", Deny(CATALOG)),
    (
        "SELECT * FROM other.accounts",
        Deny("schema `other` is not allowed; use unqualified table names (or `public.`)"),
    ),
    (
        r#"SELECT * FROM "PUBLIC".accounts"#,
        Deny("schema `PUBLIC` is not allowed"),
    ),
    (
        "SELECT * FROM db.public.accounts",
        Deny("`db.public.accounts` names a database"),
    ),
    (
        "SELECT 'idem_receipts' AS label, 'pg_catalog' AS other",
        Allow(0),
    ),
    // Ungranted tables in every position.
    ("SELECT * FROM secrets", Deny(SECRETS)),
    ("TABLE secrets", Deny(SECRETS)),
    ("SELECT * FROM ONLY secrets", Deny(SECRETS)),
    ("SELECT * FROM public.secrets", Deny(SECRETS)),
    ("SELECT * FROM accounts JOIN secrets ON true", Deny(SECRETS)),
    (
        "SELECT * FROM accounts a, LATERAL (SELECT * FROM secrets) s",
        Deny(SECRETS),
    ),
    (
        "SELECT * FROM accounts WHERE id IN (SELECT v FROM secrets)",
        Deny(SECRETS),
    ),
    ("SELECT (SELECT v FROM secrets LIMIT 1)", Deny(SECRETS)),
    (
        "SELECT * FROM accounts ORDER BY (SELECT v FROM secrets)",
        Deny(SECRETS),
    ),
    (
        "SELECT id FROM accounts GROUP BY id HAVING count(*) > (SELECT count(*) FROM secrets)",
        Deny(SECRETS),
    ),
    (
        "SELECT * FROM accounts LIMIT (SELECT count(*) FROM secrets)",
        Deny(SECRETS),
    ),
    (
        "SELECT sum(balance) FILTER (WHERE EXISTS (SELECT 1 FROM secrets)) FROM accounts",
        Deny(SECRETS),
    ),
    (
        "SELECT sum(id) OVER (ORDER BY (SELECT v FROM secrets)) FROM accounts",
        Deny(SECRETS),
    ),
    (
        "SELECT CASE WHEN true THEN (SELECT v FROM secrets) END",
        Deny(SECRETS),
    ),
    ("SELECT ARRAY(SELECT v FROM secrets)", Deny(SECRETS)),
    ("SELECT EXISTS (TABLE secrets)", Deny(SECRETS)),
    ("SELECT coalesce((SELECT v FROM secrets), 1)", Deny(SECRETS)),
    ("VALUES ((SELECT v FROM secrets))", Deny(SECRETS)),
    ("INSERT INTO secrets VALUES (1)", Deny(SECRETS)),
    ("INSERT INTO accounts SELECT * FROM secrets", Deny(SECRETS)),
    (
        "INSERT INTO accounts (id) VALUES ((SELECT v FROM secrets))",
        Deny(SECRETS),
    ),
    (
        "INSERT INTO accounts (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET balance = (SELECT v FROM secrets)",
        Deny(SECRETS),
    ),
    ("UPDATE secrets SET v = 1", Deny(SECRETS)),
    (
        "UPDATE accounts SET balance = 0 FROM secrets",
        Deny(SECRETS),
    ),
    (
        "UPDATE accounts SET balance = 1 RETURNING (SELECT v FROM secrets)",
        Deny(SECRETS),
    ),
    ("DELETE FROM secrets", Deny(SECRETS)),
    (
        "DELETE FROM accounts USING secrets WHERE accounts.id = secrets.v",
        Deny(SECRETS),
    ),
    (
        "SELECT id FROM accounts UNION SELECT v FROM secrets",
        Deny(SECRETS),
    ),
    // CTE scope follows PostgreSQL's.
    (
        "WITH recent AS (SELECT * FROM ledger WHERE id > $1) SELECT * FROM recent",
        Allow(1),
    ),
    (
        "WITH a AS (SELECT 1 AS v), b AS (SELECT v FROM a) SELECT * FROM b",
        Allow(0),
    ),
    (
        "WITH secrets AS (SELECT 1 AS v) SELECT v FROM secrets",
        Allow(0),
    ),
    (
        "SELECT * FROM (WITH secrets AS (SELECT 1 AS v) SELECT v FROM secrets) s",
        Allow(0),
    ),
    (
        "SELECT * FROM (WITH secrets AS (SELECT 1 AS v) SELECT v FROM secrets) a, (SELECT 1 FROM secrets) b",
        Deny(SECRETS),
    ),
    (
        "SELECT (WITH s AS (SELECT 1 AS v) SELECT v FROM s), (SELECT v FROM s)",
        Deny("table `s` is not granted"),
    ),
    (
        "WITH a AS (SELECT * FROM secrets), secrets AS (SELECT 1 AS v) SELECT * FROM a",
        Deny(SECRETS),
    ),
    (
        "WITH secrets AS (SELECT * FROM secrets) SELECT * FROM secrets",
        Deny(SECRETS),
    ),
    (
        "WITH RECURSIVE secrets AS (SELECT 1 AS v UNION ALL SELECT v + 1 FROM secrets WHERE v < 3) SELECT * FROM secrets",
        Allow(0),
    ),
    (
        "WITH RECURSIVE a AS (SELECT * FROM secrets), secrets AS (SELECT 1 AS v) SELECT * FROM a",
        Allow(0),
    ),
    (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SEARCH DEPTH FIRST BY n SET ord \
         SELECT * FROM r",
        Allow(0),
    ),
    (
        "WITH secrets AS (SELECT 1 AS v) SELECT * FROM public.secrets",
        Deny(SECRETS),
    ),
    (
        "WITH secrets AS (SELECT 1 AS v) INSERT INTO secrets VALUES (1)",
        Deny(SECRETS),
    ),
    (
        "WITH secrets AS (SELECT 1 AS v) UPDATE secrets SET v = 2",
        Deny(SECRETS),
    ),
    (
        "WITH secrets AS (SELECT 1 AS v) DELETE FROM secrets",
        Deny(SECRETS),
    ),
    (
        "WITH secrets AS (SELECT 1 AS v) SELECT v FROM secrets UNION SELECT v FROM secrets",
        Allow(0),
    ),
    (
        "SELECT v FROM secrets UNION (WITH secrets AS (SELECT 1 AS v) SELECT v FROM secrets)",
        Deny(SECRETS),
    ),
    (
        "(WITH secrets AS (SELECT 1 AS v) SELECT v FROM secrets) UNION SELECT v FROM secrets",
        Deny(SECRETS),
    ),
    (
        "WITH a AS (SELECT 1 AS v) SELECT * FROM (WITH b AS (SELECT * FROM a) SELECT * FROM b) x",
        Allow(0),
    ),
    (
        "WITH x AS (SELECT 1 AS v) SELECT * FROM accounts WHERE EXISTS (WITH y AS (SELECT * FROM x) SELECT * FROM y)",
        Allow(0),
    ),
    (
        "WITH secrets AS (SELECT 1 AS v) SELECT * FROM accounts WHERE id IN (SELECT v FROM secrets)",
        Allow(0),
    ),
    (
        "WITH w AS (INSERT INTO secrets VALUES (1) RETURNING *) SELECT * FROM w",
        Deny(SECRETS),
    ),
    (
        "WITH w AS (DELETE FROM secrets RETURNING *) SELECT 1",
        Deny(SECRETS),
    ),
    (
        "WITH w AS (UPDATE accounts SET balance = 0 RETURNING *) SELECT * FROM w",
        Allow(0),
    ),
    (
        "WITH moved AS (DELETE FROM ledger WHERE id = $1 RETURNING *) INSERT INTO accounts (id) SELECT account_id FROM moved",
        Allow(1),
    ),
    (
        "WITH s AS (SELECT 1 AS v) UPDATE accounts SET balance = s.v FROM s",
        Allow(0),
    ),
    (
        "WITH m AS (MERGE INTO accounts USING ledger ON false WHEN MATCHED THEN DELETE RETURNING *) SELECT 1",
        Deny("MERGE statements are not allowed"),
    ),
    // Functions outside the allow-list.
    (
        "SELECT set_config('role', 'postgres', true)",
        Deny("function `set_config` is not allowed in handler SQL (allowed: abs, avg,"),
    ),
    (
        "SELECT pg_catalog.set_config('role', 'postgres', false)",
        Deny("function `pg_catalog.set_config`"),
    ),
    ("SELECT pg_advisory_lock(1)", Deny(FN)),
    ("SELECT pg_advisory_xact_lock(1)", Deny(FN)),
    (
        "SELECT pg_read_file('/etc/passwd')",
        Deny("function `pg_read_file`"),
    ),
    (
        "SELECT lo_import('/etc/passwd')",
        Deny("function `lo_import`"),
    ),
    (
        "SELECT lo_export(1, '/tmp/x')",
        Deny("function `lo_export`"),
    ),
    (
        "SELECT dblink('host=x', 'SELECT 1')",
        Deny("function `dblink`"),
    ),
    ("SELECT pg_sleep(10)", Deny("function `pg_sleep`")),
    (
        "SELECT current_setting('role')",
        Deny("function `current_setting`"),
    ),
    ("SELECT txid_current()", Deny("function `txid_current`")),
    ("SELECT pg_current_xact_id()", Deny(FN)),
    (
        "SELECT nextval('accounts_id_seq')",
        Deny("function `nextval`"),
    ),
    ("SELECT now()", Deny("function `now`")),
    ("SELECT pg_catalog.now()", Deny("function `pg_catalog.now`")),
    ("SELECT random()", Deny("function `random`")),
    ("SELECT clock_timestamp()", Deny(FN)),
    ("SELECT gen_random_uuid()", Deny(FN)),
    ("SELECT pg_notify('c', 'x')", Deny(FN)),
    ("SELECT version()", Deny(FN)),
    (
        "SELECT row_number() OVER () FROM accounts",
        Deny("function `row_number`"),
    ),
    ("SELECT btrim(name) FROM accounts", Deny("function `btrim`")),
    (
        "SELECT public.upper(name) FROM accounts",
        Deny("function `public.upper`"),
    ),
    (
        r#"SELECT "UPPER"(name) FROM accounts"#,
        Deny("function `UPPER`"),
    ),
    ("SELECT upper(idem_x) FROM accounts", Deny(HOST)),
    (
        "SELECT SYSTEM_USER",
        Deny("function `pg_catalog.system_user`"),
    ),
    (
        "SELECT $1::timestamptz AT TIME ZONE 'UTC'",
        Deny("function `pg_catalog.timezone`"),
    ),
    (
        "SELECT EXTRACT(year FROM $1::date)",
        Deny("function `pg_catalog.extract`"),
    ),
    ("SELECT upper(a => 'x')", Deny("named function arguments")),
    // Attribute notation stays a column reference (see the module docs).
    (
        "SELECT a.pg_read_file, (a).to_json FROM accounts a",
        Allow(0),
    ),
    // Table functions and other refused node types.
    ("SELECT * FROM generate_series(1, 10)", Deny(FROM_FN)),
    (
        "SELECT * FROM ROWS FROM (generate_series(1, 3))",
        Deny(FROM_FN),
    ),
    ("SELECT * FROM pg_ls_dir('.')", Deny(FROM_FN)),
    ("SELECT * FROM accounts, unnest(ARRAY[1]) u", Deny(FROM_FN)),
    (
        "SELECT * FROM accounts TABLESAMPLE SYSTEM (10)",
        Deny("TABLESAMPLE is not allowed"),
    ),
    (
        "SELECT * FROM XMLTABLE('/a' PASSING '<a/>' COLUMNS x int)",
        Deny("XMLTABLE is not allowed"),
    ),
    (
        "SELECT * FROM JSON_TABLE('[]'::jsonb, '$[*]' COLUMNS (x int PATH '$')) j",
        Deny("SQL/JSON syntax (`JsonTable`)"),
    ),
    ("SELECT JSON_OBJECT('a': 1)", Deny("SQL/JSON syntax")),
    ("SELECT '{}'::jsonb IS JSON", Deny("SQL/JSON syntax")),
    (
        "SELECT XMLELEMENT(NAME a)",
        Deny("XML expressions are not allowed"),
    ),
    (
        "SELECT GROUPING(id) FROM accounts GROUP BY id",
        Deny("GROUPING() is not allowed"),
    ),
    (
        "UPDATE accounts SET balance = 0 WHERE CURRENT OF c",
        Deny("WHERE CURRENT OF"),
    ),
    ("SELECT CURRENT_TIMESTAMP", Deny(VALUE_FN)),
    ("SELECT CURRENT_DATE", Deny(VALUE_FN)),
    ("SELECT LOCALTIMESTAMP", Deny(VALUE_FN)),
    ("SELECT CURRENT_USER", Deny(VALUE_FN)),
    ("SELECT SESSION_USER", Deny(VALUE_FN)),
    ("SELECT USER", Deny(VALUE_FN)),
    ("SELECT CURRENT_SCHEMA", Deny(VALUE_FN)),
    (
        "INSERT INTO ledger (at) VALUES (CURRENT_TIMESTAMP)",
        Deny(VALUE_FN),
    ),
    // Operators.
    (
        "SELECT 1 OPERATOR(pg_catalog.+) 1",
        Deny("operator `OPERATOR(pg_catalog.+)` is not allowed; write operators unqualified"),
    ),
    (
        "SELECT * FROM accounts ORDER BY id USING OPERATOR(pg_catalog.<)",
        Deny("operator `OPERATOR(pg_catalog.<)`"),
    ),
    (
        "SELECT 1 WHERE 1 OPERATOR(pg_catalog.=) ANY (SELECT 1)",
        Deny("operator `OPERATOR(pg_catalog.=)`"),
    ),
    ("SELECT * FROM accounts ORDER BY id USING <", Allow(0)),
    (
        "SELECT 'a' SIMILAR TO 'b'",
        Deny("SIMILAR TO is not allowed"),
    ),
    (
        r#"SELECT 'x' COLLATE public."C""#,
        Deny("collation `public.C` is not allowed"),
    ),
    // Clock literals.
    (
        "SELECT 'now'::timestamptz",
        Deny("the literal 'now' reads the database clock; pass times in the message instead"),
    ),
    (
        "SELECT DATE 'today'",
        Deny("the literal 'today' reads the database clock"),
    ),
    (
        "SELECT TIMESTAMP 'Tomorrow'",
        Deny("the literal 'Tomorrow' reads"),
    ),
    ("INSERT INTO ledger (at) VALUES ('tomorrow')", Deny(CLOCK)),
    (
        "SELECT ' Yesterday '",
        Deny("the literal 'Yesterday' reads"),
    ),
    (
        "SELECT 'today 10:00'::timestamp",
        Deny(
            "the literal 'today 10:00' contains 'today', which PostgreSQL reads from the database clock; pass times in the message instead (other text as a parameter)",
        ),
    ),
    ("SELECT '10:00NOW'", Deny("contains 'now'")),
    (
        "SELECT 'the quick brown fox jumps over the lazy dog today'",
        Deny("the literal 'the quick brown fox jumps over the lazy ...' contains 'today'"),
    ),
    ("SELECT 'nowhere', 'snow', 'knowledge', 'todays'", Allow(0)),
    (
        "SELECT '{now}'::timestamptz[]",
        Deny("the literal '{now}' contains 'now'"),
    ),
    ("SELECT 'epoch'::timestamptz, 'infinity'::date", Allow(0)),
    // Placeholders.
    (
        "SELECT $0",
        Deny("placeholder `$0` is out of range; number them $1..$65535"),
    ),
    (
        "SELECT $65536",
        Deny("placeholder `$65536` is out of range"),
    ),
    ("SELECT $99999999999", Syntax("parameter number too large")),
    ("SELECT * FROM accounts WHERE id = $3 OR id = $1", Allow(3)),
    // PostgreSQL 16 numeric literals: the grammar here reads numbers, and
    // PostgreSQL 15 refuses them ("trailing junk after numeric literal").
    ("SELECT 0x1F, 1_000, 0o17, 0B101", Allow(0)),
    // Statements other than SELECT, INSERT, UPDATE, DELETE.
    (
        "LOCK accounts",
        Deny(
            "LOCK statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
        ),
    ),
    ("COPY accounts TO STDOUT", Deny("COPY statements")),
    ("COPY accounts FROM '/etc/passwd'", Deny("COPY statements")),
    ("SET role postgres", Deny("SET statements")),
    ("SET LOCAL statement_timeout = 0", Deny("SET statements")),
    ("SET ROLE postgres", Deny("SET statements")),
    ("SET SESSION AUTHORIZATION postgres", Deny("SET statements")),
    ("RESET ROLE", Deny("RESET statements")),
    ("DISCARD ALL", Deny("DISCARD statements")),
    ("PREPARE p AS SELECT 1", Deny("PREPARE statements")),
    ("EXECUTE p", Deny("EXECUTE statements")),
    ("DEALLOCATE p", Deny("DEALLOCATE statements")),
    ("LISTEN c", Deny("LISTEN statements")),
    ("NOTIFY c, 'x'", Deny("NOTIFY statements")),
    ("DO $$BEGIN PERFORM 1; END$$", Deny("DO statements")),
    ("CALL p()", Deny("CALL statements")),
    ("VACUUM accounts", Deny("VACUUM statements")),
    ("ANALYZE accounts", Deny("ANALYZE statements")),
    ("BEGIN", Deny("BEGIN statements")),
    ("START TRANSACTION", Deny("START statements")),
    ("COMMIT", Deny("COMMIT statements")),
    ("ROLLBACK", Deny("ROLLBACK statements")),
    ("SAVEPOINT s", Deny("SAVEPOINT statements")),
    ("RELEASE s", Deny("RELEASE statements")),
    ("ROLLBACK TO s", Deny("ROLLBACK statements")),
    ("/* hi */ COMMIT", Deny("COMMIT statements")),
    ("CREATE TEMP TABLE t (x int)", Deny("CREATE statements")),
    ("CREATE TABLE t AS SELECT 1", Deny("CREATE statements")),
    ("DROP TABLE accounts", Deny("DROP statements")),
    ("TRUNCATE accounts", Deny("TRUNCATE statements")),
    ("ALTER TABLE accounts ADD x int", Deny("ALTER statements")),
    (
        "GRANT SELECT ON secrets TO public",
        Deny("GRANT statements"),
    ),
    (
        "EXPLAIN ANALYZE DELETE FROM accounts",
        Deny("EXPLAIN statements"),
    ),
    ("SHOW search_path", Deny("SHOW statements")),
    ("DECLARE c CURSOR FOR SELECT 1", Deny("DECLARE statements")),
    (
        "MERGE INTO accounts USING ledger ON false WHEN MATCHED THEN DELETE",
        Deny("MERGE statements"),
    ),
    (
        "WITH l AS (SELECT 1) MERGE INTO accounts USING l ON false WHEN MATCHED THEN DELETE",
        Deny(
            "MERGE statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction",
        ),
    ),
    (
        "SELECT * INTO newtable FROM accounts",
        Deny("SELECT INTO creates a table; it is not allowed"),
    ),
    ("SELECT 1 INTO TEMP t", Deny("SELECT INTO creates a table")),
    // One statement per call; grammar errors.
    (
        "SELECT 1; SELECT 2",
        Deny("2 statements in one call; send exactly one"),
    ),
    (
        "SELECT 1; DELETE FROM accounts; SELECT 3",
        Deny("3 statements in one call"),
    ),
    ("SELECT 1 -- ; DELETE FROM accounts", Allow(0)),
    ("SELECT ';' AS x", Allow(0)),
    ("", Deny("empty statement; send exactly one")),
    (";", Deny("empty statement")),
    ("-- only a comment", Deny("empty statement")),
    (
        "SELEC 1",
        Syntax("statement does not parse: syntax error at or near \"SELEC\""),
    ),
    (
        "SELECT 'unterminated",
        Syntax("statement does not parse: unterminated quoted string"),
    ),
    ("SELECT 1abc", Syntax("trailing junk after numeric literal")),
    ("SELECT 1\0", Syntax("statement does not parse")),
    (
        "SELECT * FROM accounts WHERE",
        Syntax("statement does not parse"),
    ),
];

/// Runs one case; `None` when it came out as expected.
fn mismatch(sql: &str, want: &Want) -> Option<String> {
    let got = judge(sql, &granted());
    let ok = match (want, &got) {
        (Allow(n), Ok(m)) => *n == m.params,
        (Deny(text), Err(e)) => e.kind == DbErrorKind::Denied && e.message.contains(text),
        (Syntax(text), Err(e)) => e.kind == DbErrorKind::Syntax && e.message.contains(text),
        _ => false,
    };
    let one_line = match &got {
        Ok(_) => true,
        Err(e) => !e.message.contains('\n'),
    };
    (!ok || !one_line).then(|| format!("{sql:?}\n    want {want:?}\n    got  {got:?}"))
}

#[test]
fn judges_each_case_as_expected() {
    let failures: Vec<String> = CASES
        .iter()
        .filter_map(|(sql, want)| mismatch(sql, want))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

#[test]
fn has_enough_cases() {
    assert!(CASES.len() >= 120, "only {} cases", CASES.len());
}

/// `1+1+...` nests one `AExpr` per `+`; `pg_query` decodes trees up to 100
/// protobuf messages deep, PostgreSQL's parser stops far deeper ones.
#[test]
fn deep_trees_are_refused_not_overflowed() {
    let sum = |n: usize| format!("SELECT {}", vec!["1"; n].join("+"));
    assert_eq!(judge(&sum(40), &granted()).map(|j| j.params), Ok(0));
    let deep = judge(&sum(60), &granted()).unwrap_err();
    assert_eq!(deep.kind, DbErrorKind::Denied);
    assert!(deep.message.contains("nests too deeply"), "{deep:?}");
    let deeper = judge(&sum(100_000), &granted()).unwrap_err();
    assert!(
        matches!(deeper.kind, DbErrorKind::Syntax | DbErrorKind::Denied),
        "{deeper:?}"
    );
    let nested = format!("SELECT {}1{}", "(SELECT ".repeat(40), ")".repeat(40));
    assert!(judge(&nested, &granted()).is_err());
    let parens = format!("SELECT {}1{}", "(".repeat(5000), ")".repeat(5000));
    assert!(judge(&parens, &granted()).is_ok());
}

/// The walker (and dropping the tree) fits a small stack even for the
/// deepest trees `pg_query` decodes, in debug builds too. (`pg_query::parse`
/// itself needs more in debug builds: over 1 MiB at about 30 nested operators;
/// in release the whole of `judge` fits 256 KiB.)
#[test]
fn walker_fits_a_small_stack() {
    let sum = format!("SELECT {}", vec!["1"; 45].join("+"));
    let nested = format!("SELECT {}1{}", "(SELECT ".repeat(14), ")".repeat(14));
    for sql in [sum, nested] {
        let parsed = pg_query::parse(&sql, pg_query::ParserOptions::DEFAULT).unwrap();
        let tree = serde_json::to_value(&parsed.protobuf.stmts[0].stmt).unwrap();
        let walk = move || {
            let granted = granted();
            let (tag, body) = super::node_of(&tree).unwrap();
            let mut judge = super::Judge {
                granted: &granted,
                ctes: Vec::new(),
                max_param: 0,
                depth: 0,
                fields: std::collections::BTreeSet::new(),
            };
            judge.enter(tag, body)
        };
        let worker = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(walk)
            .unwrap();
        assert_eq!(worker.join().unwrap(), Ok(()), "{sql}");
    }
}

#[test]
fn messages_are_one_line() {
    let e = judge("SELECT * FROM \"a\nb\"", &granted()).unwrap_err();
    assert_eq!(
        e.message,
        "table `a b` is not granted to this handler; grant it in [[handler]] tables"
    );
    let e = judge("SELECT 'line one\nnow'", &granted()).unwrap_err();
    assert!(!e.message.contains('\n'), "{e:?}");
}

/// `cargo test --release -- --ignored --nocapture`: microseconds per `judge`
/// of a typical upsert.
#[test]
#[ignore = "timing, run in release mode"]
fn judge_timing() {
    let sql = "INSERT INTO accounts (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE \
               SET balance = accounts.balance + excluded.balance RETURNING balance";
    let granted = granted();
    let iterations: u32 = 10_000;
    for _ in 0..100 {
        judge(sql, &granted).unwrap();
    }
    let start = std::time::Instant::now();
    for _ in 0..iterations {
        std::hint::black_box(judge(std::hint::black_box(sql), &granted).unwrap());
    }
    let per_call = start.elapsed() / iterations;
    let parse_start = std::time::Instant::now();
    for _ in 0..iterations {
        std::hint::black_box(pg_query::parse(sql, pg_query::ParserOptions::DEFAULT).unwrap());
    }
    let parse = parse_start.elapsed() / iterations;
    println!("judge: {per_call:?} per upsert (pg_query::parse alone: {parse:?})");
}

/// Every field selected from a row is reported (it may be a function of the
/// row, attribute notation), except allowed function names; plain column
/// names, `*` and subscripts are not.
#[test]
fn selected_fields_are_reported_for_the_catalog() {
    for (sql, want) in [
        ("SELECT balance FROM accounts", vec![]),
        ("SELECT a.balance FROM accounts a", vec!["balance"]),
        ("SELECT a.* FROM accounts a", vec![]),
        (
            "SELECT (a).reveal, public.accounts.balance FROM accounts a",
            vec!["balance", "reveal"],
        ),
        ("SELECT a.\"Reveal\" FROM accounts a", vec!["Reveal"]),
        (
            "SELECT s.count FROM (SELECT count(*) FROM accounts) s",
            vec![],
        ),
        (
            "SELECT account_id FROM accounts a WHERE a.grab IS NULL AND (a).grab IS NULL",
            vec!["grab"],
        ),
        ("SELECT (ARRAY[1,2])[1]", vec![]),
    ] {
        let got = judge(sql, &granted()).map(|j| j.fields);
        assert_eq!(
            got,
            Ok(want.iter().map(|s| s.to_string()).collect()),
            "{sql}"
        );
    }
}
