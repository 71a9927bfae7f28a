//! Test harness for idem's integration tests: a private `nats-server` per test
//! (free loopback port, temporary store), a fresh PostgreSQL database or SQLite
//! file per test, config files, and an in-process host.
//!
//! Environment: `IDEM_NATS_SERVER` (default `.tools/venv/bin/nats-server`, put
//! there by `scripts/setup.sh`), `IDEM_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/test`: the admin URL used to create and
//! drop one database per test).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

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
pub struct RunningHost {
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<Summary>>,
    stats: Vec<(Arc<str>, Arc<HandlerStats>)>,
}

impl RunningHost {
    pub async fn start(config: &Path) -> Self {
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
        let deadline = Instant::now() + Duration::from_secs(10);
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

/// A credit event payload.
pub fn credit(event_id: &str, account: i64, amount: i64) -> String {
    serde_json::json!({"event_id": event_id, "account_id": account, "amount": amount}).to_string()
}

/// Expands to one `#[tokio::test]` per backend: `NAME_postgres`, `NAME_sqlite`.
#[macro_export]
macro_rules! on_both_databases {
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
