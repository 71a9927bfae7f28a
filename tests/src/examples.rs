//! Harness for the shipped examples: an example's own
//! `examples/<example>/idem.toml` handler, run on a private nats-server and a
//! fresh database, and the two scenarios every example runs under
//! redelivery: [`redelivery_after_crash`] and [`replay_past_receipts`].
//!
//! Every handler's settings (name, stream, subjects, identity, tables,
//! module, migrations) come from the example's shipped `idem.toml`; the test
//! swaps in its own broker and database, may rename the handler, and may
//! load another build of the same source ([`Env::with_module`]).

use crate::{Backend, Nats, RunningHost, TestDb, create_stream, guest, publish, root};
use idem::config::{Config, HandlerConfig, IdentityRule};
use serde_json::Value;
use sqlx::Row;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The `[[handler]]` of `examples/<example>/idem.toml`, paths resolved.
pub fn shipped(example: &str) -> HandlerConfig {
    let path = root().join("examples").join(example).join("idem.toml");
    let mut config = Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(config.handlers.len(), 1, "{}", path.display());
    config.handlers.remove(0)
}

/// The identity rule as written in `idem.toml` (`json:/event_id`, `header:X`).
pub fn identity(rule: &IdentityRule) -> String {
    match rule {
        IdentityRule::Header(name) => format!("header:{name}"),
        IdentityRule::JsonPointer(ptr) => format!("json:{ptr}"),
    }
}

/// One example on its own nats-server and database.
pub struct Env {
    pub example: &'static str,
    pub handler: HandlerConfig,
    pub js: async_nats::jetstream::Context,
    pub nats: Nats,
    pub db: TestDb,
    dir: tempfile::TempDir,
}

impl Env {
    /// Starts the broker, makes the database and the example's stream (so
    /// events can be published before any host runs). The shipped module
    /// must be the build script's output, `target/guests/<example>.wasm`.
    pub async fn new(example: &'static str, backend: Backend) -> Self {
        let handler = shipped(example);
        assert_eq!(
            handler.module.canonicalize().unwrap(),
            guest(example).canonicalize().unwrap(),
            "examples/{example}/idem.toml does not load its build output"
        );
        let nats = Nats::start();
        let db = TestDb::new(backend).await;
        let subjects: Vec<&str> = handler.subjects.iter().map(String::as_str).collect();
        create_stream(&nats, &handler.stream, &subjects).await;
        let js = nats.jetstream().await;
        Env {
            example,
            handler,
            js,
            nats,
            db,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Loads `target/guests/<build>.wasm` instead of the shipped module: the
    /// same source built another way (another JavaScript engine).
    pub fn with_module(mut self, build: &str) -> Self {
        self.handler.module = guest(build);
        self
    }

    /// Writes `<file>.toml`: the shipped handler once per name in `names`
    /// (each its own durable consumer and receipts), with `extra` TOML lines.
    pub fn config(&self, file: &str, names: &[&str], extra: &str) -> PathBuf {
        let h = &self.handler;
        let migrations = h.migrations.as_ref().unwrap();
        assert!(migrations.is_dir(), "{}", migrations.display());
        let mut s = format!(
            "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nmax_connections = 4\n",
            self.nats.url(),
            self.db.url
        );
        for name in names {
            s.push_str(&format!(
                "[[handler]]\nname = \"{name}\"\nmodule = \"{}\"\nstream = \"{}\"\nsubjects = {:?}\n\
                 identity = \"{}\"\ntables = {:?}\nmigrations = \"{}\"\n{extra}\n",
                h.module.display(),
                h.stream,
                h.subjects,
                identity(&h.identity),
                h.tables,
                migrations.display(),
            ));
            s.push_str(&crate::test_batch_line(extra));
        }
        let path = self.dir.path().join(format!("{file}.toml"));
        std::fs::write(&path, s).unwrap();
        path
    }

    /// The shipped handler's name.
    pub fn name(&self) -> &str {
        &self.handler.name
    }

    /// Publishes `payload` as JSON on the handler's first subject.
    pub async fn publish(&self, payload: &Value) {
        publish(
            &self.js,
            &self.handler.subjects[0],
            &payload.to_string(),
            &[],
        )
        .await;
    }

    /// Every row of `sql`, each as its columns joined by `|` (integers and
    /// text as written, NULL as `NULL`).
    pub async fn rows(&self, sql: &str) -> Vec<String> {
        let pool = self.db.pool().await;
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
            .fetch_all(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        pool.close().await;
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| {
                        if let Ok(v) = r.try_get::<Option<i64>, _>(i) {
                            v.map_or("NULL".into(), |v| v.to_string())
                        } else {
                            r.try_get::<Option<String>, _>(i)
                                .unwrap_or_else(|e| panic!("{sql}: column {i}: {e}"))
                                .unwrap_or_else(|| "NULL".into())
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect()
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `&str`s as owned rows, to compare with [`Env::rows`].
pub fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Waits until `name` has processed `n` messages and asserts nothing else
/// happened to them (no duplicate, retry, trap or dead letter).
pub async fn processed(host: &RunningHost, name: &str, n: u64) {
    let s = host
        .wait_for(name, &format!("{n} processed"), |s| {
            s.processed >= n || s.dead_lettered > 0
        })
        .await;
    assert_eq!(
        (
            s.processed,
            s.duplicates,
            s.retried,
            s.traps,
            s.dead_lettered
        ),
        (n, 0, 0, 0, 0),
        "{name}: {s}"
    );
}

/// The host (a real `idem-test-host` process with
/// `IDEM_FAULT=abort-after-commit:1`) aborts right after committing `event`
/// and before its ack. What it committed must be exactly `expected` (rows of
/// `sql`); a fresh host then receives the redelivery after `ack_wait`, counts
/// it as a duplicate, and the rows stay exactly as they were. Returns the
/// config file (handler with `ack_wait = "2s"`) for further runs.
pub async fn redelivery_after_crash(
    e: &Env,
    event: Value,
    sql: &str,
    expected: &[&str],
) -> PathBuf {
    let name = e.name().to_string();
    let cfg = e.config("crash", &[&name], "ack_wait = \"2s\"");
    let mut child = std::process::Command::new(crate::test_host())
        .args(["run", "--config"])
        .arg(&cfg)
        .env("IDEM_FAULT", "abort-after-commit:1")
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    e.publish(&event).await;
    // A large component (Python, StarlingMonkey) compiles for a while first.
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{}: host did not reach the fault point", e.example);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(6),
        "{}: expected SIGABRT at the fault point, got {status}",
        e.example
    );
    // Committed, not acked.
    let committed = e.rows(sql).await;
    assert_eq!(committed, strs(expected), "{}", e.example);
    assert_eq!(e.db.receipts(&name).await, 1);

    let host = RunningHost::start(&cfg).await;
    let s = host
        .wait_for(&name, "the redelivery", |s| {
            s.processed + s.duplicates + s.retried + s.dead_lettered >= 1
        })
        .await;
    assert_eq!(
        (s.delivered, s.processed, s.duplicates, s.retried, s.traps),
        (1, 0, 1, 0, 0),
        "{}: {s}",
        e.example
    );
    assert_eq!(e.rows(sql).await, committed);
    assert_eq!(e.db.receipts(&name).await, 1);
    host.stop().await;
    cfg
}

/// Publishes `stream`; the shipped handler processes it and the rows of `sql`
/// are `expected`. Then a second handler, `<name>-replay` (new durable
/// consumer from the stream's start, new receipts, same module and tables),
/// consumes the whole stream again, every message a first time for it: the
/// rows must then be `after_replay`, the same as `expected` for a strategy
/// that is idempotent on its own. Each query of `unchanged` (columns whose
/// values the test cannot know, such as publish times) must return the same
/// rows after the replay as before it.
pub async fn replay_past_receipts(
    e: &Env,
    stream: &[Value],
    sql: &str,
    expected: &[&str],
    after_replay: &[&str],
    unchanged: &[&str],
) {
    let name = e.name().to_string();
    let replay = format!("{name}-replay");
    let n = stream.len() as u64;
    for event in stream {
        e.publish(event).await;
    }

    let cfg = e.config("first", &[&name], "");
    let host = RunningHost::start(&cfg).await;
    processed(&host, &name, n).await;
    host.stop().await;
    assert_eq!(e.rows(sql).await, strs(expected), "after the first pass");
    assert_eq!(e.db.receipts(&name).await, n as i64);
    let mut before = Vec::new();
    for q in unchanged {
        before.push(e.rows(q).await);
    }

    let started = Instant::now();
    let cfg = e.config("replay", &[&replay], "");
    let host = RunningHost::start(&cfg).await;
    processed(&host, &replay, n).await;
    host.stop().await;
    eprintln!(
        "{}: replay of {n} events in {:?}",
        e.example,
        started.elapsed()
    );
    // The receipts did not stop it: every event ran the handler again.
    assert_eq!(e.db.receipts(&replay).await, n as i64);
    assert_eq!(e.db.receipts(&name).await, n as i64);
    assert_eq!(e.rows(sql).await, strs(after_replay), "after the replay");
    for (q, rows) in unchanged.iter().zip(before) {
        assert_eq!(e.rows(q).await, rows, "changed by the replay: {q}");
    }
}

/// A migrations directory in `dir` for the credit tables plus `credit_log
/// (event_id, version)`, which the second credit version (`credit-log`)
/// writes.
pub fn credit_log_migrations(dir: &Path) -> PathBuf {
    let m = dir.join("migrations");
    std::fs::create_dir_all(&m).unwrap();
    std::fs::copy(
        root().join("examples/credit/migrations/0001_accounts.sql"),
        m.join("0001_accounts.sql"),
    )
    .unwrap();
    std::fs::write(
        m.join("0002_credit_log.sql"),
        "CREATE TABLE IF NOT EXISTS credit_log (event_id TEXT PRIMARY KEY, version TEXT NOT NULL);\n",
    )
    .unwrap();
    m
}

/// Hex SHA-256 of `bytes` (a component's digest as idem records it).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

/// Waits up to 20 s for `cond`, polling every 50 ms.
pub async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
