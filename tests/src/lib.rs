//! Test harness for idem's integration tests: a private `nats-server` per test
//! (free loopback port, temporary store), a fresh PostgreSQL database or SQLite
//! file per test, config files, and an in-process host.
//!
//! Environment: `IDEM_NATS_SERVER` (default `.tools/venv/bin/nats-server`, put
//! there by `scripts/setup.sh`), `IDEM_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/test`: the admin URL used to create and
//! drop one database per test).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod chaos;
pub mod clock;
pub mod examples;
pub mod pg_cluster;

use idem::config::Config;
use idem::metrics::{HandlerStats, StatsSnapshot};
use idem::service::{Host, RunMode, Summary};
use sqlx::Row;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Path of a built guest component, `target/guests/NAME.wasm`.
pub fn guest(name: &str) -> PathBuf {
    let p = root().join("target/guests").join(format!("{name}.wasm"));
    assert!(
        p.exists(),
        "{} is missing: run `bash scripts/build-guests.sh` first (scripts/test.sh does)",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A private nats-server with JetStream, killed on drop.
pub struct Nats {
    child: Option<Child>,
    pub port: u16,
    store: tempfile::TempDir,
}

impl Nats {
    pub fn start() -> Self {
        let store = tempfile::tempdir().unwrap();
        let mut n = Nats {
            child: None,
            port: free_port(),
            store,
        };
        n.spawn();
        n
    }

    fn spawn(&mut self) {
        let bin = std::env::var("IDEM_NATS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root().join(".tools/venv/bin/nats-server"));
        let child = Command::new(&bin)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}); run `bash scripts/setup.sh`",
                    bin.display()
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL) and starts it again on the same port and
    /// store directory: JetStream state (streams, consumers) persists.
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        async_nats::jetstream::new(async_nats::connect(self.url()).await.unwrap())
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// A fresh database: its own PostgreSQL database (dropped on drop) or SQLite file.
pub struct TestDb {
    pub url: String,
    pub backend: Backend,
    pg_name: Option<String>,
    _dir: tempfile::TempDir,
}

fn pg_admin() -> String {
    std::env::var("IDEM_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        let dir = tempfile::tempdir().unwrap();
        match backend {
            Backend::Sqlite => TestDb {
                url: format!("sqlite://{}", dir.path().join("idem.db").display()),
                backend,
                pg_name: None,
                _dir: dir,
            },
            Backend::Postgres => {
                use sqlx::Connection;
                let name = format!(
                    "idem_t_{}_{}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_nanos()
                );
                let mut c = sqlx::PgConnection::connect(&pg_admin()).await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut c)
                    .await
                    .unwrap();
                let base = pg_admin();
                let (prefix, _) = base.rsplit_once('/').unwrap();
                TestDb {
                    url: format!("{prefix}/{name}"),
                    backend,
                    pg_name: Some(name),
                    _dir: dir,
                }
            }
        }
    }

    /// A pool of one connection for assertions.
    pub async fn pool(&self) -> sqlx::AnyPool {
        sqlx::any::install_default_drivers();
        sqlx::pool::PoolOptions::new()
            .max_connections(2)
            .connect(&self.url)
            .await
            .unwrap()
    }

    /// Runs a query returning one integer (NULL and no row read as `None`).
    pub async fn scalar(&self, sql: &str) -> Option<i64> {
        let pool = self.pool().await;
        let row = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
            .fetch_optional(&pool)
            .await
            .unwrap();
        pool.close().await;
        row.and_then(|r| r.try_get::<Option<i64>, _>(0).unwrap())
    }

    pub async fn balance(&self, account: i64) -> Option<i64> {
        self.scalar(&format!(
            "SELECT balance FROM accounts WHERE account_id = {account}"
        ))
        .await
    }

    pub async fn receipts(&self, consumer: &str) -> i64 {
        self.scalar(&format!(
            "SELECT count(*) FROM idem_receipts WHERE consumer = '{consumer}'"
        ))
        .await
        .unwrap()
    }

    /// Runs one statement (test setup, e.g. tables no handler owns). Unlike
    /// [`TestDb::pool`], creates the SQLite file if the host has not yet.
    pub async fn execute(&self, sql: &str) {
        sqlx::any::install_default_drivers();
        let url = match self.backend {
            Backend::Sqlite => format!("{}?mode=rwc", self.url),
            Backend::Postgres => self.url.clone(),
        };
        let pool: sqlx::AnyPool = sqlx::pool::PoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }

    /// The message ids of `consumer`'s receipts, sorted.
    pub async fn receipt_ids(&self, consumer: &str) -> Vec<String> {
        let pool = self.pool().await;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT message_id FROM idem_receipts WHERE consumer = '{consumer}' ORDER BY message_id"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        pool.close().await;
        rows.iter().map(|r| r.get::<String, _>(0)).collect()
    }

    /// (message_id, reason) of every dead letter of `consumer`, by id.
    pub async fn dead_letters(&self, consumer: &str) -> Vec<(Option<String>, String)> {
        let pool = self.pool().await;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT message_id, reason FROM idem_dead_letters WHERE consumer = '{consumer}' ORDER BY id"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        pool.close().await;
        rows.iter()
            .map(|r| (r.get::<Option<String>, _>(0), r.get::<String, _>(1)))
            .collect()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            let _ = Command::new("psql")
                .args([
                    &pg_admin(),
                    "-q",
                    "-c",
                    &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// One `[[handler]]` table for [`write_config`].
pub struct HandlerSpec {
    pub name: String,
    pub guest: String,
    pub stream: String,
    pub subjects: Vec<String>,
    pub identity: String,
    pub tables: Vec<String>,
    /// Extra TOML lines, e.g. `max_deliver = 2`.
    pub extra: String,
}

impl HandlerSpec {
    /// A credit-style handler on stream ACCOUNTS, subject `accounts.credit`,
    /// identity `json:/event_id`, table `accounts`, with the credit migrations.
    pub fn new(name: &str, guest: &str) -> Self {
        HandlerSpec {
            name: name.into(),
            guest: guest.into(),
            stream: "ACCOUNTS".into(),
            subjects: vec!["accounts.credit".into()],
            identity: "json:/event_id".into(),
            tables: vec!["accounts".into()],
            extra: "retry_delay = \"200ms\"\n".into(),
        }
    }
}

/// Writes an idem.toml into `dir` and returns its path.
pub fn write_config(dir: &Path, nats: &Nats, db: &TestDb, handlers: &[HandlerSpec]) -> PathBuf {
    let mut s = format!(
        "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nmax_connections = 4\n",
        nats.url(),
        db.url
    );
    let migrations = root().join("examples/credit/migrations");
    for h in handlers {
        s.push_str(&format!(
            "[[handler]]\nname = \"{}\"\nmodule = \"{}\"\nstream = \"{}\"\nsubjects = {:?}\nidentity = \"{}\"\ntables = {:?}\nmigrations = \"{}\"\n{}\n",
            h.name,
            guest(&h.guest).display(),
            h.stream,
            h.subjects,
            h.identity,
            h.tables,
            migrations.display(),
            h.extra
        ));
    }
    let path = dir.join("idem.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// A host running in this process until dropped or stopped.
/// Sends the in-process host's log (`RUST_LOG`, default `info`) to the test's
/// captured output, so a failing test prints what the host did.
fn capture_host_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,async_nats=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

pub struct RunningHost {
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<Summary>>,
    stats: Vec<(Arc<str>, Arc<HandlerStats>)>,
}

impl RunningHost {
    pub async fn start(config: &Path) -> Self {
        capture_host_logs();
        let config = Config::load(config).unwrap();
        let host = Host::start(&config).await.unwrap();
        let stats = host.stats();
        let (stop, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(host.run(RunMode::Forever, rx));
        RunningHost {
            stop,
            task: Some(task),
            stats,
        }
    }

    pub fn stats(&self, handler: &str) -> StatsSnapshot {
        self.stats
            .iter()
            .find(|(n, _)| &**n == handler)
            .map(|(_, s)| s.snapshot())
            .unwrap_or_else(|| panic!("no handler {handler}"))
    }

    /// Waits until `cond` holds for `handler`'s stats (10 s at most).
    pub async fn wait_for(
        &self,
        handler: &str,
        what: &str,
        cond: impl Fn(&StatsSnapshot) -> bool,
    ) -> StatsSnapshot {
        self.wait_for_within(handler, what, Duration::from_secs(10), cond)
            .await
    }

    /// [`RunningHost::wait_for`] with its own time limit.
    pub async fn wait_for_within(
        &self,
        handler: &str,
        what: &str,
        limit: Duration,
        cond: impl Fn(&StatsSnapshot) -> bool,
    ) -> StatsSnapshot {
        let deadline = Instant::now() + limit;
        loop {
            let s = self.stats(handler);
            if cond(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; stats {s}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(mut self) -> Summary {
        let _ = self.stop.send(true);
        self.task.take().unwrap().await.unwrap()
    }
}

impl Drop for RunningHost {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Publishes one message (optionally with headers) and waits for the stream's ack.
pub async fn publish(
    js: &async_nats::jetstream::Context,
    subject: &str,
    payload: &str,
    headers: &[(&str, &str)],
) {
    let mut h = async_nats::HeaderMap::new();
    for (k, v) in headers {
        h.insert(*k, *v);
    }
    js.publish_with_headers(subject.to_string(), h, payload.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Creates stream `name` over `subjects`, so several handlers can share it
/// with different filter subjects (the host creates a missing stream with the
/// first handler's subjects only). Its `max_age` is 7 days, idem's default
/// retention, so a host with the default starts on it.
pub async fn create_stream(nats: &Nats, name: &str, subjects: &[&str]) {
    create_stream_with_max_age(nats, name, subjects, DEFAULT_RETENTION).await;
}

/// idem's default `retention`.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// [`create_stream`] with the given `max_age` (`Duration::ZERO`: kept for ever).
pub async fn create_stream_with_max_age(
    nats: &Nats,
    name: &str,
    subjects: &[&str],
    max_age: Duration,
) {
    nats.jetstream()
        .await
        .create_stream(async_nats::jetstream::stream::Config {
            name: name.into(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            max_age,
            ..Default::default()
        })
        .await
        .unwrap();
}

/// The hostile-guest arena: one host running a hostile handler and
/// a well-behaved one side by side on stream `ACCOUNTS` (`accounts.>`).
///
/// - `hostile`: the `behave` guest on `accounts.hostile`, granted `accounts`
///   only, `retry_delay = "100ms"` plus the test's extra TOML lines;
/// - `well-behaved`: the `credit` guest on `accounts.credit`, defaults.
///
/// [`Arena::run`] surrounds the hostile messages with well-behaved traffic
/// and checks that the well-behaved handler was served exactly.
pub struct Arena {
    // Dropped in this order: the host stops before its broker and database go.
    pub host: RunningHost,
    pub js: async_nats::jetstream::Context,
    pub nats: Nats,
    pub db: TestDb,
    _dir: tempfile::TempDir,
}

/// What [`Arena::run`] observed of the hostile handler.
pub struct ArenaRun {
    /// The hostile handler's counters once every hostile message was settled.
    pub stats: StatsSnapshot,
    /// (message_id, reason) of the hostile handler's dead letters, in order.
    pub dead_letters: Vec<(Option<String>, String)>,
    /// From the first hostile publish until everything was settled.
    pub elapsed: Duration,
}

impl Arena {
    /// The well-behaved handler's account.
    pub const WELL_ACCOUNT: i64 = 900;
    /// The account of the `credit` op [`Arena::run`] sends the hostile handler last.
    pub const HOSTILE_ACCOUNT: i64 = 1;
    /// The amount of that credit.
    pub const HOSTILE_AMOUNT: i64 = 7;
    /// The account a hostile message credits before it misbehaves
    /// ([`Arena::credit_then`]): its balance stays NULL when the
    /// misbehaviour rolls the message back.
    pub const VICTIM: i64 = 2;

    /// A hostile payload, message `event_id`: the `behave` guest credits 5
    /// to [`Self::VICTIM`], then behaves as `then` says.
    pub fn credit_then(event_id: &str, then: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"op": "credit-then", "event_id": event_id,
                           "account_id": Self::VICTIM, "amount": 5, "then": then})
    }

    /// Starts the arena; `setup` statements run on the fresh database first
    /// (the host's migrations create `accounts` afterwards).
    pub async fn start(backend: Backend, hostile_extra: &str, setup: &[&str]) -> Self {
        let nats = Nats::start();
        let db = TestDb::new(backend).await;
        for sql in setup {
            db.execute(sql).await;
        }
        create_stream(&nats, "ACCOUNTS", &["accounts.>"]).await;
        let dir = tempfile::tempdir().unwrap();
        let mut hostile = HandlerSpec::new("hostile", "behave");
        hostile.subjects = vec!["accounts.hostile".into()];
        hostile.extra = format!("retry_delay = \"100ms\"\n{hostile_extra}\n");
        let mut well = HandlerSpec::new("well-behaved", "credit");
        well.extra = String::new();
        let cfg = write_config(dir.path(), &nats, &db, &[hostile, well]);
        let host = RunningHost::start(&cfg).await;
        let js = nats.jetstream().await;
        Arena {
            host,
            js,
            nats,
            db,
            _dir: dir,
        }
    }

    /// Stops the host (clean shutdown), then drops the broker and database.
    pub async fn stop(self) -> Summary {
        let Arena { host, .. } = self;
        host.stop().await
    }

    async fn well_behaved(&self, from: i64, to: i64) {
        for i in from..=to {
            let p = credit(&format!("evt_w{i}"), Self::WELL_ACCOUNT, i);
            publish(&self.js, "accounts.credit", &p, &[]).await;
        }
    }

    /// Publishes 10 well-behaved credits, the `hostile` payloads (each with
    /// its own `event_id`), 10 more credits, and last a `credit` op of
    /// [`Self::HOSTILE_AMOUNT`] to [`Self::HOSTILE_ACCOUNT`] on the hostile
    /// handler. Waits (`patience` at most) until every hostile message is
    /// processed or dead-lettered, then asserts that the well-behaved handler
    /// processed exactly its 20 credits, the hostile handler's final credit
    /// committed, and the only hostile receipt is that credit's. Hostile
    /// messages that end processed are listed in `processed_ids`.
    pub async fn run(
        &self,
        hostile: &[serde_json::Value],
        processed_ids: &[&str],
        patience: Duration,
    ) -> ArenaRun {
        self.well_behaved(1, 10).await;
        let started = Instant::now();
        for p in hostile {
            publish(&self.js, "accounts.hostile", &p.to_string(), &[]).await;
        }
        self.well_behaved(11, 20).await;
        let ok = serde_json::json!({
            "op": "credit", "event_id": "evt_ok",
            "account_id": Self::HOSTILE_ACCOUNT, "amount": Self::HOSTILE_AMOUNT,
        });
        publish(&self.js, "accounts.hostile", &ok.to_string(), &[]).await;
        let settled = hostile.len() as u64 + 1;
        let deadline = Instant::now() + patience;
        let stats = loop {
            let s = self.host.stats("hostile");
            if s.processed + s.dead_lettered >= settled {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "hostile messages not settled within {patience:?}; stats {s}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let elapsed = started.elapsed();
        let well = self
            .host
            .wait_for("well-behaved", "20 credits", |s| s.processed == 20)
            .await;
        assert_eq!(
            (
                well.delivered,
                well.duplicates,
                well.retried,
                well.dead_lettered,
                well.traps
            ),
            (20, 0, 0, 0, 0),
            "well-behaved: {well}"
        );
        assert_eq!(self.db.balance(Self::WELL_ACCOUNT).await, Some(210));
        assert_eq!(self.db.receipts("well-behaved").await, 20);
        assert!(self.db.dead_letters("well-behaved").await.is_empty());
        assert_eq!(
            self.db.balance(Self::HOSTILE_ACCOUNT).await,
            Some(Self::HOSTILE_AMOUNT)
        );
        let mut ids: Vec<&str> = processed_ids.to_vec();
        ids.push("evt_ok");
        ids.sort_unstable();
        assert_eq!(self.db.receipt_ids("hostile").await, ids);
        ArenaRun {
            stats,
            dead_letters: self.db.dead_letters("hostile").await,
            elapsed,
        }
    }
}

/// What the dead-letter reason of one hostile message must be.
pub enum Reason {
    Exact(String),
    Prefix(String),
}

impl Reason {
    pub fn matches(&self, reason: &str) -> bool {
        match self {
            Reason::Exact(want) => reason == want,
            Reason::Prefix(want) => reason.starts_with(want.as_str()),
        }
    }
}

/// One hostile statement for [`Arena::refused`]: the `behave` op that runs
/// it (`sql`: execute, rejects with `"<kind>: <message>"` on an error;
/// `query`: rejects with `"rows <columns> <rows>"`), its text, and the
/// dead-letter reason expected.
pub struct Case {
    pub op: &'static str,
    pub sql: String,
    pub reason: Reason,
}

impl Case {
    pub fn exact(op: &'static str, sql: impl Into<String>, reason: impl Into<String>) -> Self {
        Case {
            op,
            sql: sql.into(),
            reason: Reason::Exact(reason.into()),
        }
    }

    pub fn prefix(op: &'static str, sql: impl Into<String>, reason: impl Into<String>) -> Self {
        Case {
            op,
            sql: sql.into(),
            reason: Reason::Prefix(reason.into()),
        }
    }

    /// Refused by the host's judge: `rejected: denied: {message}`.
    pub fn denied(op: &'static str, sql: impl Into<String>, message: &str) -> Self {
        Self::exact(op, sql, format!("rejected: denied: {message}"))
    }

    /// Refused as not SELECT / INSERT / UPDATE / DELETE; `word` names the
    /// statement as the judge does: on PostgreSQL its first keyword
    /// (`ABORT`, `START`, `PREPARE`), on SQLite the action SQLite's
    /// authorizer reports (`END` is a `COMMIT`, `ROLLBACK TO` a savepoint).
    pub fn not_dml(op: &'static str, sql: &str, word: &str) -> Self {
        Self::denied(
            op,
            sql,
            &format!(
                "{word} statements are not allowed; a handler runs only \
                 SELECT, INSERT, UPDATE or DELETE in the host's transaction"
            ),
        )
    }

    /// A query refused for calling function `name` as the judge names it:
    /// PostgreSQL's parser folds unquoted names to lower case (`PG_SLEEP` is
    /// `pg_sleep`, `"pg_sleep"` too) and keeps a schema
    /// (`pg_catalog.pg_sleep`); SQLite's authorizer names a function it
    /// knows as written. The reason lists the allowed functions.
    pub fn function(sql: &str, name: &str) -> Self {
        Self::denied(
            "query",
            sql,
            &format!(
                "function `{name}` is not allowed in handler SQL (allowed: {})",
                idem::sql_guard::ALLOWED_FUNCTIONS.join(", ")
            ),
        )
    }

    /// Refused by the database's own grammar before anything ran, with its
    /// own `message`: on PostgreSQL libpg_query's (`syntax error at or near
    /// "X"`), on SQLite its compiler's (`near "X": syntax error`, `no such
    /// table: t`, `no such function: f`), which ends with SQLite's code 1.
    pub fn syntax(backend: Backend, op: &'static str, sql: &str, message: &str) -> Self {
        let reason = match backend {
            Backend::Postgres => {
                format!("rejected: syntax: statement does not parse: {message}")
            }
            Backend::Sqlite => {
                format!("rejected: syntax: statement does not compile: {message} (SQLite code 1)")
            }
        };
        Self::exact(op, sql, reason)
    }

    /// Refused as several statements in one string. PostgreSQL's parser
    /// counts them (`n`); SQLite compiles the first and refuses any tail that
    /// is not whitespace, comments or `;`.
    pub fn several(backend: Backend, op: &'static str, sql: &str, n: usize) -> Self {
        let message = match backend {
            Backend::Postgres => format!("{n} statements in one call; send exactly one"),
            Backend::Sqlite => {
                "more than one statement in one call (or text after it); send exactly one".into()
            }
        };
        Self::denied(op, sql, &message)
    }
}

impl Arena {
    /// The tables an arena for SQL cases starts with: `accounts` with a
    /// canary row 500 (the credit migrations find the table there), and
    /// `other_accounts`, which exists but no handler is granted.
    pub const SQL_SETUP: &[&str] = &[
        "CREATE TABLE accounts (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "INSERT INTO accounts (account_id, balance) VALUES (500, 5000)",
        "CREATE TABLE other_accounts (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "INSERT INTO other_accounts (account_id, balance) VALUES (1, 100), (2, 200)",
    ];

    /// Runs every case as [`Arena::credit_then`] (message `evt_NN`) through
    /// [`Arena::run`], and asserts: each is dead-lettered with its reason,
    /// in order; nothing else failed, trapped or retried; every credit was
    /// rolled back; [`Arena::intact`] with 3 rows (canary, well-behaved,
    /// the hostile handler's final credit). For arenas started with
    /// [`Arena::SQL_SETUP`].
    pub async fn refused(&self, cases: &[Case], patience: Duration) -> ArenaRun {
        let payloads: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let then = serde_json::json!({"op": c.op, "sql": c.sql});
                Self::credit_then(&format!("evt_{i:02}"), then)
            })
            .collect();
        let r = self.run(&payloads, &[], patience).await;
        let n = cases.len() as u64;
        let s = r.stats;
        assert_eq!(
            (
                s.delivered,
                s.processed,
                s.retried,
                s.dead_lettered,
                s.traps
            ),
            (n + 1, 1, 0, n, 0),
            "{s}"
        );
        assert_eq!(r.dead_letters.len(), cases.len(), "{:?}", r.dead_letters);
        let mut wrong = Vec::new();
        for (i, (c, (id, reason))) in cases.iter().zip(&r.dead_letters).enumerate() {
            assert_eq!(id.as_deref(), Some(format!("evt_{i:02}").as_str()));
            if !c.reason.matches(reason) {
                wrong.push(format!("{}: {:?} gave {reason:?}", c.op, c.sql));
            }
        }
        assert!(
            wrong.is_empty(),
            "unexpected reasons:\n{}",
            wrong.join("\n")
        );
        assert_eq!(self.db.balance(Self::VICTIM).await, None);
        self.intact(3).await;
        r
    }

    /// The canary row and `other_accounts` ([`Arena::SQL_SETUP`]) are
    /// unchanged and `accounts` holds `rows` rows.
    pub async fn intact(&self, rows: i64) {
        assert_eq!(self.db.balance(500).await, Some(5000));
        assert_eq!(
            self.db.scalar("SELECT count(*) FROM accounts").await,
            Some(rows)
        );
        assert_eq!(
            self.db
                .scalar("SELECT CAST(count(*) * 1000 + sum(balance) AS BIGINT) FROM other_accounts")
                .await,
            Some(2300)
        );
    }
}

/// A credit event payload.
pub fn credit(event_id: &str, account: i64, amount: i64) -> String {
    serde_json::json!({"event_id": event_id, "account_id": account, "amount": amount}).to_string()
}

/// Expands to one `#[tokio::test]` per backend: `NAME_postgres`, `NAME_sqlite`.
/// The long form adds attributes to one backend's test, e.g.
/// `on_both_databases!(n, n, postgres: [], sqlite: [#[ignore = "bug: ..."]]);`
#[macro_export]
macro_rules! on_both_databases {
    ($name:ident, $body:ident, postgres: [$(#[$pg:meta])*], sqlite: [$(#[$sq:meta])*]) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$pg])*
            async fn postgres() {
                super::$body($crate::Backend::Postgres).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$sq])*
            async fn sqlite() {
                super::$body($crate::Backend::Sqlite).await
            }
        }
    };
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$body($crate::Backend::Postgres).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$body($crate::Backend::Sqlite).await
            }
        }
    };
}

/// Peak and current resident memory of process `pid` in KiB: `VmHWM` and
/// `VmRSS` from `/proc/<pid>/status` (Linux). `None` when the process is
/// gone or the file lacks them.
pub fn process_memory_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status.lines().find_map(|l| {
            l.strip_prefix(name)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}
