//! `idem invoke` and `idem test` against real PostgreSQL and SQLite, no
//! broker: the report of a known message line by line (its SQL, parameters,
//! rows, log lines, verdict), `--commit` and the duplicate after it, and
//! fixtures checked as first delivery, redelivery and retry after a failed
//! attempt, with exact diffs, while the database keeps nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_test_support::root;
use idem_tests::*;
use std::path::Path;

/// A config with handler `h` on the behave guest over `accounts`
/// (the credit example's migrations), identity `json:/id`.
fn config(dir: &Path) -> String {
    config_on(dir, &guest("behave"))
}

/// [`config`] on `module`.
fn config_on(dir: &Path, module: &Path) -> String {
    let cfg = dir.join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"nats://127.0.0.1:1\"\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"S\"\nsubjects = [\"s.in\"]\nidentity = \"json:/id\"\ntables = [\"accounts\"]\nmigrations = \"{}\"\n",
            module.display(),
            root().join("examples/credit/migrations").display()
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_string()
}

/// `idem ARGS` with the database at `db`.
fn idem(db: &TestDb, args: &[&str]) -> (i32, String, String) {
    idem_cli(args, &[("IDEM_DATABASE__URL", &db.url)])
}

/// `out` without its lines that vary from run to run (the component's
/// digest, the time taken, the memory used).
fn stable(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| {
            !l.starts_with("component ") && !l.starts_with("time ") && !l.starts_with("limits ")
        })
        .collect()
}

fn message(dir: &Path, name: &str, json: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, json).unwrap();
    path.to_str().unwrap().to_string()
}

async fn invoke_shows_every_statement(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let steps = message(
        dir.path(),
        "steps.json",
        r#"{"id": "m-1", "op": "steps", "steps": [
            {"op": "sql", "sql": "INSERT INTO accounts (account_id, balance) VALUES ($1, $2)", "params": [7, 5]},
            {"op": "query", "sql": "SELECT account_id, balance FROM accounts WHERE account_id = $1", "params": [7]},
            {"op": "sql", "sql": "DELETE FROM idem_receipts"}
        ]}"#,
    );
    let (code, out, err) = idem(&db, &["invoke", "--config", &cfg, "h", &steps]);
    assert_eq!(code, 2, "stderr: {err}\n{out}");
    assert_eq!(err, "");
    let name = match backend {
        Backend::Postgres => "PostgreSQL",
        Backend::Sqlite => "SQLite",
    };
    let database = format!("database   {name}");
    let size = std::fs::metadata(&steps).unwrap().len();
    let about = format!("message    m-1 · s.in · {size} bytes · delivery 1");
    let lines = stable(&out);
    // The guard's and the guest's wording of the refusal differ by database.
    assert!(lines[13].starts_with("   → error denied: "), "{out}");
    assert!(
        lines[14].starts_with("verdict    rejected: step 2: denied: "),
        "{out}"
    );
    assert_eq!(
        lines,
        [
            "handler    h",
            &database,
            &about,
            "receipt    none: the message is new",
            "#1 execute INSERT INTO accounts (account_id, balance) VALUES ($1, $2)",
            "   $1 = 7",
            "   $2 = 5",
            "   → 1 row affected",
            "#2 query   SELECT account_id, balance FROM accounts WHERE account_id = $1",
            "   $1 = 7",
            "   → 1 row (account_id, balance)",
            "     (7, 5)",
            "#3 execute DELETE FROM idem_receipts",
            lines[13],
            lines[14],
            "outbox     0 messages",
            "ended      rolled back (--commit keeps what an ok handler did)",
        ]
    );
    assert_eq!(db.scalar("SELECT COUNT(*) FROM accounts").await, Some(0));

    // A credit that logs, committed: then the same message is a duplicate.
    let credit = message(
        dir.path(),
        "credit.json",
        r#"{"id": "m-2", "op": "credit-then", "account_id": 9, "amount": 4, "then": {"op": "log", "bytes": 3}}"#,
    );
    let (code, out, err) = idem(&db, &["invoke", "--config", &cfg, "h", &credit, "--commit"]);
    assert_eq!(code, 0, "stderr: {err}\n{out}");
    let lines = stable(&out);
    assert_eq!(
        lines[lines.len() - 4..],
        [
            "log        info: xxx",
            "verdict    ok",
            "outbox     0 messages",
            "ended      committed"
        ]
    );
    assert_eq!(db.balance(9).await, Some(4));
    assert_eq!(db.receipt_ids("h").await, ["m-2"]);
    let (code, out, _) = idem(&db, &["invoke", "--config", &cfg, "h", &credit, "--commit"]);
    assert_eq!(code, 0);
    assert_eq!(
        stable(&out)[3..],
        [
            "receipt    exists: a delivery of this message is acked as a duplicate; the handler does not run",
            "verdict    duplicate",
            "outbox     0 messages",
            "ended      rolled back (--commit keeps what an ok handler did)",
        ]
    );
    assert_eq!(db.balance(9).await, Some(4));

    // --json: the same facts, as one object.
    let (code, out, _) = idem(&db, &["invoke", "--config", &cfg, "h", &steps, "--json"]);
    assert_eq!(code, 2);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verdict"], "reject");
    assert_eq!(v["receipt_existed"], false);
    assert_eq!(v["statements"][0]["params"], serde_json::json!([7, 5]));
    assert_eq!(
        v["statements"][0]["result"],
        serde_json::json!({ "rows_affected": 1 })
    );
    assert_eq!(
        v["statements"][1]["result"],
        serde_json::json!({ "columns": ["account_id", "balance"], "rows": [[7, 5]] })
    );
    assert_eq!(v["statements"][2]["result"]["error"]["kind"], "denied");
    assert_eq!(v["limits"]["statements"]["used"], 3);

    // A message without its identity is what the host dead-letters.
    let anon = message(
        dir.path(),
        "anon.json",
        r#"{"op": "credit", "account_id": 1, "amount": 1}"#,
    );
    let (code, out, err) = idem(&db, &["invoke", "--config", &cfg, "h", &anon]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err.trim(),
        "idem: missing identity: payload has no `/id`: a delivery of this message would be dead-lettered (identity = \"json:/id\")"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_shows_every_statement_sqlite() {
    invoke_shows_every_statement(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_shows_every_statement_postgres() {
    invoke_shows_every_statement(Backend::Postgres).await;
}

const FIXTURES: &str = r#"
[[fixture]]
name = "two credits and a bad one"
[[fixture.message]]
json = { id = "a", op = "credit", account_id = 1, amount = 5 }
[[fixture.message]]
json = { id = "b", op = "credit", account_id = 1, amount = 7 }
[[fixture.message]]
json = { id = "c", op = "reject", reason = "bad" }
outcome = "reject"
[[fixture.message]]
payload = "no identity"
outcome = "reject"
[[fixture.expect]]
query = "SELECT account_id, balance FROM accounts ORDER BY account_id"
rows = [[1, 12]]

[[fixture]]
name = "a handler that retries its first delivery"
[[fixture.message]]
json = { id = "d", op = "retry-once-then-credit", account_id = 2, amount = 3 }
[[fixture.expect]]
query = "SELECT account_id, balance FROM accounts ORDER BY account_id"
rows = [[2, 3]]

[[fixture]]
name = "a wrong expectation"
[[fixture.message]]
json = { id = "e", op = "credit", account_id = 3, amount = 5 }
[[fixture.expect]]
query = "SELECT account_id, balance FROM accounts ORDER BY account_id"
rows = [[3, 6], [4, 1]]
"#;

async fn fixtures_are_checked_three_ways(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let fixtures = message(dir.path(), "fixtures.toml", FIXTURES);
    let (code, out, err) = idem(&db, &["test", "--config", &cfg, "h", &fixtures]);
    assert_eq!(code, 2, "stderr: {err}\n{out}");
    assert_eq!(err, "");
    let query = "SELECT account_id, balance FROM accounts ORDER BY account_id";
    let wrong = [
        format!("        {query}"),
        "          expected 2 row(s), got 1:".into(),
        "          - (3, 6)".into(),
        "          + (3, 5)".into(),
        "          - (4, 1)".into(),
    ];
    let mut expected: Vec<String> = [
        "fixture `two credits and a bad one`",
        "  ok    first delivery",
        "  ok    redelivery",
        "  ok    retry after a failed attempt (2 attempts failed after their last statement)",
        "fixture `a handler that retries its first delivery`",
        "  FAIL  first delivery",
        "        message 1: expected ok, got retry: first delivery",
        &format!("        {query}"),
        "          expected 1 row(s), got 0:",
        "          - (2, 3)",
        "  FAIL  redelivery",
        "        message 1: expected a duplicate (its receipt committed with it), got ok",
        "  ok    retry after a failed attempt (0 attempts failed after their last statement)",
        "fixture `a wrong expectation`",
        "  FAIL  first delivery",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    for run in [
        "  FAIL  redelivery",
        "  FAIL  retry after a failed attempt (1 attempt failed after its last statement)",
    ] {
        expected.extend(wrong.iter().cloned());
        expected.push(run.into());
    }
    expected.extend(wrong.iter().cloned());
    expected.push("3 fixture(s): 1 passed, 2 failed".into());
    assert_eq!(out.lines().collect::<Vec<_>>(), expected);
    // Nothing is kept: no rows, no receipts.
    assert_eq!(db.scalar("SELECT COUNT(*) FROM accounts").await, Some(0));
    assert_eq!(db.receipts("h").await, 0);

    // Only the passing fixture: exit 0.
    let passing = FIXTURES
        .split("\n[[fixture]]\nname = \"a handler")
        .next()
        .unwrap();
    let only = message(dir.path(), "passing.toml", passing);
    let (code, out, err) = idem(&db, &["test", "--config", &cfg, "h", &only]);
    assert_eq!(code, 0, "stderr: {err}\n{out}");
    assert_eq!(out.lines().last(), Some("1 fixture(s): 1 passed, 0 failed"));

    // A fixtures file that is not one: one line, exit 1.
    let bad = message(
        dir.path(),
        "bad.toml",
        "[[fixture]]\nname = \"x\"\n[[fixture.message]]\npayload = \"a\"\njson = 1\n",
    );
    let (code, out, err) = idem(&db, &["test", "--config", &cfg, "h", &bad]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err.trim(),
        format!("idem: {bad}: fixture `x`, message 1: give exactly one of `json` and `payload`")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixtures_are_checked_three_ways_sqlite() {
    fixtures_are_checked_three_ways(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixtures_are_checked_three_ways_postgres() {
    fixtures_are_checked_three_ways(Backend::Postgres).await;
}

/// A guest built with DWARF debug info (scripts/build-guests.sh:
/// `guests/debug/behave.wasm`) names the function and source line of its
/// trap; the same guest built without names neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_names_its_source_line() {
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let source = root()
        .join("tests/guests/behave/src/lib.rs")
        .canonicalize()
        .unwrap();
    let line = std::fs::read_to_string(&source)
        .unwrap()
        .lines()
        .position(|l| l.contains(r#""trap" => panic!("asked to trap")"#))
        .unwrap()
        + 1;
    let trap = message(dir.path(), "trap.json", r#"{"id": "t-1", "op": "trap"}"#);
    let debug = idem_test_support::guests_dir().join("debug/behave.wasm");
    let cfg = config_on(dir.path(), &debug);
    let (code, out, err) = idem(&db, &["invoke", "--config", &cfg, "h", &trap]);
    assert_eq!(code, 2, "stderr: {err}\n{out}");
    let verdict = out.lines().find(|l| l.starts_with("verdict ")).unwrap();
    let at = format!(
        "verdict    trap: wasm trap: wasm `unreachable` instruction executed (in behave at {}:{line}:19); the guest last logged: guest panicked at ",
        source.display()
    );
    assert!(
        verdict.starts_with(&at),
        "{verdict}\nexpected it to start with\n{at}"
    );

    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let cfg = config(&plain);
    let (code, out, _) = idem(&db, &["invoke", "--config", &cfg, "h", &trap]);
    assert_eq!(code, 2);
    let verdict = out.lines().find(|l| l.starts_with("verdict ")).unwrap();
    assert!(
        verdict.starts_with("verdict    trap: wasm trap: wasm `unreachable` instruction executed; the guest last logged: "),
        "{verdict}"
    );
}

/// What a fixture or a message cannot be is an error (exit 1, one line),
/// and an expectation that writes changes nothing.
async fn bad_inputs_are_errors(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let credit = message(
        dir.path(),
        "credit.json",
        r#"{"id": "m-1", "op": "credit", "account_id": 1, "amount": 2}"#,
    );
    let (code, out, err) = idem(
        &db,
        &[
            "invoke",
            "--config",
            &cfg,
            "h",
            &credit,
            "--header",
            "bad:name=1",
        ],
    );
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(err.starts_with("idem: header name `bad:name`: "), "{err}");
    let (code, _, err) = idem(
        &db,
        &["invoke", "--config", &cfg, "h", &credit, "--subject", "s.*"],
    );
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        "idem: subject `s.*` has a wildcard; a message's subject is literal"
    );

    let writes = message(
        dir.path(),
        "writes.toml",
        r#"
[[fixture]]
name = "an expectation that writes"
[[fixture.message]]
json = { id = "a", op = "credit", account_id = 1, amount = 5 }
[[fixture.expect]]
query = "DELETE FROM accounts RETURNING account_id"
rows = [[1]]
[[fixture.expect]]
query = "SELECT account_id, balance FROM accounts"
rows = [[1, 5]]
"#,
    );
    let (code, out, err) = idem(&db, &["test", "--config", &cfg, "h", &writes]);
    assert_eq!(code, 0, "stderr: {err}\n{out}");
    assert_eq!(out.lines().last(), Some("1 fixture(s): 1 passed, 0 failed"));
    assert_eq!(db.scalar("SELECT COUNT(*) FROM accounts").await, Some(0));

    let subject = message(
        dir.path(),
        "subject.toml",
        "[[fixture]]\nname = \"x\"\n[[fixture.message]]\nsubject = \"t.other\"\npayload = \"{}\"\n",
    );
    let (code, out, err) = idem(&db, &["test", "--config", &cfg, "h", &subject]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err.trim(),
        "idem: fixture `x`, message 1: subject `t.other` is not one handler `h` consumes (s.in); give one of those"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_errors_sqlite() {
    bad_inputs_are_errors(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_errors_postgres() {
    bad_inputs_are_errors(Backend::Postgres).await;
}
