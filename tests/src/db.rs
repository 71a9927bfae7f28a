//! A fresh database per test: a PostgreSQL database created from the admin
//! URL `IDEM_TEST_PG` ([`pg_url`]) and dropped afterwards, or a SQLite file in a
//! temporary directory; and the reads tests assert on.

use idem_test_support::{pg_url, pg_url_with_database, unique};
use sqlx::Row;
use std::process::{Command, Stdio};

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
    pub(crate) pg_name: Option<String>,
    pub(crate) _dir: tempfile::TempDir,
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
                let name = unique("idem_t");
                let mut c = sqlx::PgConnection::connect(&pg_url()).await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut c)
                    .await
                    .unwrap();
                TestDb {
                    url: pg_url_with_database(&pg_url(), &name),
                    backend,
                    pg_name: Some(name),
                    _dir: dir,
                }
            }
        }
    }

    /// The PostgreSQL database's name (`None` on SQLite).
    pub fn pg_database(&self) -> Option<&str> {
        self.pg_name.as_deref()
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

    /// (message_id, module_digest) of every receipt of `consumer`, by
    /// message id: which component applied each message.
    pub async fn receipt_digests(&self, consumer: &str) -> Vec<(String, String)> {
        let pool = self.pool().await;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT message_id, module_digest FROM idem_receipts WHERE consumer = '{consumer}' ORDER BY message_id"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        pool.close().await;
        rows.iter()
            .map(|r| (r.get::<String, _>(0), r.get::<String, _>(1)))
            .collect()
    }

    /// The credit-log example's `credit_log` table as (event id, version),
    /// by event id: which messages the logging version of the credit
    /// component applied.
    pub async fn credit_log(&self) -> Vec<(String, String)> {
        let pool = self.pool().await;
        let rows = sqlx::query("SELECT event_id, version FROM credit_log ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        rows.iter()
            .map(|r| (r.get::<String, _>(0), r.get::<String, _>(1)))
            .collect()
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
                    &pg_url(),
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
