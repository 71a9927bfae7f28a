//! SQLite: the pool and the transaction, with the inherent methods every
//! backend has (the store dispatches to them; see `store/mod.rs`), and the
//! dialect SQL they send. Host tables in `schema`, values in `values`,
//! result codes in `codes`; SQLite's C API only in `store::sqlite_raw`.

mod batch;
pub(super) mod codes;
mod deploy_marks;
mod durability;
mod schema;
mod values;

use super::sql::{self, decode_dead_letter};
use super::statement::ResultBounds;
use super::{DeadLetter, DeadLetterRow, sqlite_raw};
use crate::sql_value::{CheckedSql, DbError, DbErrorKind, Rows, SqlValue};
use crate::store::{Backend, one_line};
use codes::map_error;
use futures::TryStreamExt as _;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Column as _, Row as _, Sqlite, Transaction};
use std::collections::HashSet;
use std::path::PathBuf;
use std::str::FromStr as _;
use std::time::Duration;
use values::{bind, decode_row};

/// `failed_at` (stored as Unix milliseconds), with the other dead-letter
/// columns ([`decode_dead_letter`]).
macro_rules! dead_letter_columns {
    () => {
        "id, consumer, message_id, stream, stream_sequence, subject, reason, headers, payload, \
         failed_at AS failed_at_ms, published_ns"
    };
}

/// A SQLite pool (WAL, `synchronous=FULL`, busy timeout, foreign keys on).
pub struct Pool(SqlitePool);

/// A SQLite transaction started with `BEGIN IMMEDIATE` (holds the write lock).
pub struct Tx(Transaction<'static, Sqlite>);

/// SQLite has one writer anyway: the prune lock holds nothing.
pub struct PruneLock;

/// Whether `url` names an in-memory database.
fn in_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// The file a `sqlite:` URL names; `None` for an in-memory database.
///
/// # Errors
/// The URL does not parse.
pub(super) fn file_of(url: &str) -> Result<Option<PathBuf>, sqlx::Error> {
    if in_memory(url) {
        return Ok(None);
    }
    let options = SqliteConnectOptions::from_str(url)?;
    Ok(Some(options.get_filename().to_path_buf()))
}

impl super::Database {
    /// The SQLite pool, for tests and tools that run SQL of their own (never
    /// a guest's); `None` on another database.
    pub fn sqlite_pool(&self) -> Option<&SqlitePool> {
        match &self.0 {
            Backend::Sqlite(p) => Some(&p.0),
            _ => None,
        }
    }
}

impl super::Tx {
    /// A transaction the caller began on a SQLite pool (tests and tools; the
    /// host begins its own with [`super::Database::begin`], `BEGIN IMMEDIATE`).
    pub fn from_sqlite(tx: Transaction<'static, Sqlite>) -> Self {
        super::Tx(Backend::Sqlite(Tx(tx)), super::Savepoints::default())
    }

    /// The SQLite transaction, for tests and tools that run SQL of their own
    /// in it (never a guest's); `None` on another database.
    pub fn sqlite_tx(&mut self) -> Option<&mut Transaction<'static, Sqlite>> {
        match &mut self.0 {
            Backend::Sqlite(t) => Some(&mut t.0),
            _ => None,
        }
    }

    /// The SQLite transaction itself, to commit or roll back with sqlx;
    /// `None` (and the transaction dropped, so rolled back) on another database.
    pub fn into_sqlite(self) -> Option<Transaction<'static, Sqlite>> {
        match self.0 {
            Backend::Sqlite(t) => Some(t.0),
            _ => None,
        }
    }
}

impl Pool {
    pub(super) async fn connect(
        url: &str,
        max_connections: u32,
        lock_wait: Duration,
    ) -> Result<Self, sqlx::Error> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(lock_wait)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .acquire_timeout(lock_wait + Duration::from_secs(10))
            // A transaction's time budget (`bound_statements`) and the guest's
            // value bound (`bound_guest_values`) end with it.
            .after_release(|conn, _| {
                Box::pin(async move {
                    let mut handle = conn.lock_handle().await?;
                    handle.remove_progress_handler();
                    sqlite_raw::set_length_limit(
                        handle.as_raw_handle(),
                        sqlite_raw::DEFAULT_LENGTH_LIMIT,
                    );
                    Ok(true)
                })
            });
        // An in-memory database lives and dies with its one connection.
        let pool = if in_memory(url) {
            pool.max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            pool.max_connections(max_connections.max(1))
        };
        pool.connect_with(options).await.map(Pool)
    }

    pub(super) async fn prepare_host_tables(&self) -> Result<(), sqlx::Error> {
        schema::prepare_host_tables(&self.0).await
    }

    pub(super) async fn migrate(
        &self,
        migrator: &sqlx::migrate::Migrator,
    ) -> Result<(), sqlx::migrate::MigrateError> {
        migrator.run(&self.0).await
    }

    /// `BEGIN IMMEDIATE` then `ROLLBACK`: a file that can be read but not
    /// written (read-only, disk full) is still "down".
    pub(super) async fn probe(&self) -> Result<(), sqlx::Error> {
        self.0.begin_with("BEGIN IMMEDIATE").await?.rollback().await
    }

    /// `BEGIN IMMEDIATE`: takes the write lock at once.
    pub(super) async fn begin(&self) -> Result<super::Tx, sqlx::Error> {
        Ok(super::Tx(
            Backend::Sqlite(Tx(self.0.begin_with("BEGIN IMMEDIATE").await?)),
            super::Savepoints::default(),
        ))
    }

    /// [`Pool::begin`], then the progress handler that bounds every
    /// statement of the transaction ([`Tx::bound_statements`]).
    pub(super) async fn begin_bounded(&self, timeout: Duration) -> Result<super::Tx, sqlx::Error> {
        let mut tx = Tx(self.0.begin_with("BEGIN IMMEDIATE").await?);
        tx.bound_statements(timeout).await?;
        Ok(super::Tx(Backend::Sqlite(tx), super::Savepoints::default()))
    }

    /// [`Pool::begin_bounded`]: one writer holds the lock on the whole
    /// database, so there is no row lock to wait for.
    pub(super) async fn begin_limited(
        &self,
        timeout: Duration,
        _lock_wait: Option<Duration>,
    ) -> Result<super::Tx, sqlx::Error> {
        self.begin_bounded(timeout).await
    }

    pub(super) async fn close(&self) {
        self.0.close().await
    }

    pub(super) async fn has_rows(&self, sql: String) -> Result<bool, sqlx::Error> {
        sqlx::query(AssertSqlSafe(sql))
            .fetch_optional(&self.0)
            .await
            .map(|r| r.is_some())
    }

    /// SQLite has no roles: `None`, nothing done.
    pub(super) async fn prepare_role(
        &self,
        _role: &str,
        _handler: &str,
        _tables: &[String],
    ) -> Result<Option<Vec<String>>, sqlx::Error> {
        Ok(None)
    }

    /// SQLite has no users: `None`.
    pub(super) async fn session_user(&self) -> Result<Option<(String, bool)>, sqlx::Error> {
        Ok(None)
    }

    /// In a `BEGIN IMMEDIATE` transaction of its own.
    pub(super) async fn dead_letter(
        &self,
        dl: &DeadLetter<'_>,
        seq: i64,
        headers: &str,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.0.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(sql::INSERT_DEAD_LETTER)
            .bind(dl.consumer)
            .bind(dl.message_id)
            .bind(dl.stream)
            .bind(seq)
            .bind(dl.published_ns)
            .bind(dl.subject)
            .bind(dl.reason)
            .bind(headers)
            .bind(dl.payload)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }

    /// `(rows, oldest published_ms)`: SQLite keeps no row estimate, so
    /// the count is exact, read from the `(consumer, published_ms)` index
    /// (never the table's rows), as is the oldest publish time.
    pub(super) async fn receipt_gauges(
        &self,
        consumer: &str,
    ) -> Result<(i64, Option<i64>), sqlx::Error> {
        let (rows, oldest, _newest) = self.receipt_summary(consumer, None).await?;
        Ok((rows, oldest))
    }

    pub(super) async fn receipt_count(&self, consumer: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(sql::RECEIPT_COUNT)
            .bind(consumer)
            .fetch_one(&self.0)
            .await
    }

    pub(super) async fn has_host_tables(&self) -> Result<bool, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'
                       AND name IN ('idem_receipts', 'idem_dead_letters')",
        )
        .fetch_one(&self.0)
        .await?;
        Ok(n == 2)
    }

    pub(super) async fn list_dead_letters(
        &self,
        consumer: Option<&str>,
    ) -> Result<Vec<DeadLetterRow>, sqlx::Error> {
        sqlx::query(concat!(
            "SELECT ",
            dead_letter_columns!(),
            " FROM idem_dead_letters WHERE $1 IS NULL OR consumer = $1 ORDER BY id"
        ))
        .bind(consumer)
        .fetch_all(&self.0)
        .await?
        .iter()
        .map(|row| decode_dead_letter!(row))
        .collect()
    }

    pub(super) async fn dead_letter_by_id(
        &self,
        id: i64,
    ) -> Result<Option<DeadLetterRow>, sqlx::Error> {
        sqlx::query(concat!(
            "SELECT ",
            dead_letter_columns!(),
            " FROM idem_dead_letters WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.0)
        .await?
        .map(|row| decode_dead_letter!(&row))
        .transpose()
    }

    pub(super) async fn drop_dead_letter(&self, id: i64) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(sql::DROP_DEAD_LETTER)
            .bind(id)
            .execute(&self.0)
            .await?
            .rows_affected())
    }

    pub(super) async fn drop_dead_letters(&self, consumer: &str) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(sql::DROP_DEAD_LETTERS)
            .bind(consumer)
            .execute(&self.0)
            .await?
            .rows_affected())
    }

    /// `(stream_sequence, module_digest, processed_at ms, published_ms)`.
    pub(super) async fn receipt(
        &self,
        consumer: &str,
        message_id: &str,
    ) -> Result<Option<(i64, String, i64, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT stream_sequence, module_digest, processed_at, published_ms FROM idem_receipts WHERE consumer = $1 AND message_id = $2",
        )
        .bind(consumer)
        .bind(message_id)
        .fetch_optional(&self.0)
        .await
    }

    /// `(count, oldest published_ms, newest published_ms)`.
    pub(super) async fn receipt_summary(
        &self,
        consumer: &str,
        digest: Option<&str>,
    ) -> Result<(i64, Option<i64>, Option<i64>), sqlx::Error> {
        match digest {
            None => sqlx::query_as(sql::RECEIPT_SUMMARY).bind(consumer),
            Some(d) => sqlx::query_as(sql::RECEIPT_SUMMARY_BY_DIGEST)
                .bind(consumer)
                .bind(d),
        }
        .fetch_one(&self.0)
        .await
    }

    pub(super) async fn prune_chunk(
        &self,
        consumer: &str,
        published_before_ms: i64,
        chunk: u32,
    ) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(sql::PRUNE_CHUNK)
            .bind(consumer)
            .bind(published_before_ms)
            .bind(i64::from(chunk))
            .execute(&self.0)
            .await?
            .rows_affected())
    }

    /// Always got: SQLite has one writer anyway.
    pub(super) async fn try_prune_lock(&self) -> Result<Option<super::PruneLock>, sqlx::Error> {
        Ok(Some(super::PruneLock(Backend::Sqlite(PruneLock))))
    }
}

impl PruneLock {
    pub(super) async fn release(self) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

impl Tx {
    pub(super) async fn insert_receipt(
        &mut self,
        r: &super::Receipt<'_>,
        seq: i64,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(sql::INSERT_RECEIPT)
            .bind(r.consumer)
            .bind(r.message_id)
            .bind(seq)
            .bind(r.module_digest)
            .bind(r.published_ms)
            .execute(&mut *self.0)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Interrupts (SQLITE_INTERRUPT) any statement of the transaction still
    /// running `budget` after now, checked every 1000 virtual machine
    /// instructions (<https://www.sqlite.org/c3ref/progress_handler.html>).
    pub(super) async fn bound_statements(&mut self, budget: Duration) -> Result<(), sqlx::Error> {
        let until = std::time::Instant::now() + budget;
        self.0
            .lock_handle()
            .await?
            .set_progress_handler(1000, move || std::time::Instant::now() < until);
        Ok(())
    }

    /// `SQLITE_LIMIT_LENGTH` for the guest's statements.
    pub(super) async fn bound_guest_values(
        &mut self,
        max_value_bytes: usize,
    ) -> Result<(), sqlx::Error> {
        let mut handle = self.0.lock_handle().await?;
        sqlite_raw::set_length_limit(handle.as_raw_handle(), max_value_bytes);
        Ok(())
    }

    /// SQLite has no roles: nothing to do.
    pub(super) async fn enter_role(&mut self, _role: &str) -> Result<(), sqlx::Error> {
        Ok(())
    }

    /// Runs one of the host's own statements (the savepoint's).
    pub(super) async fn run_host_sql(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(sql).execute(&mut *self.0).await.map(|_| ())
    }

    /// Whether the connection is still inside the host's transaction
    /// (SQLite's autocommit flag is off).
    pub(super) async fn still_open(&mut self) -> Result<bool, sqlx::Error> {
        let mut handle = self.0.lock_handle().await?;
        Ok(sqlite_raw::in_transaction(handle.as_raw_handle()))
    }

    pub(super) async fn execute(
        &mut self,
        sql: &CheckedSql,
        params: &[SqlValue],
    ) -> Result<u64, DbError> {
        bind(sqlx::query(AssertSqlSafe(sql.shared_text())), params)
            .execute(&mut *self.0)
            .await
            .map(|done| done.rows_affected())
            .map_err(map_error)
    }

    pub(super) async fn query(
        &mut self,
        sql: &CheckedSql,
        params: &[SqlValue],
        bounds: ResultBounds,
    ) -> Result<Rows, DbError> {
        let conn: &mut SqliteConnection = &mut self.0;
        let mut stream =
            bind(sqlx::query(AssertSqlSafe(sql.shared_text())), params).fetch(&mut *conn);
        let mut out = Rows::default();
        let mut used = 0;
        while let Some(row) = stream.try_next().await.map_err(map_error)? {
            if out.rows.is_empty() {
                out.columns = row.columns().iter().map(|c| c.name().to_owned()).collect();
            }
            bounds.push(&mut out, decode_row(&row)?, &mut used)?;
        }
        Ok(out)
    }

    /// Nothing to give back after a query.
    pub(super) fn after_query(&mut self) {}

    /// See [`crate::store::Tx::compile_judged`].
    pub(super) async fn compile_judged(
        &mut self,
        sql: &str,
        authorize: &mut sqlite_raw::SchemaPolicy<'_>,
        flag_opcodes: &[&str],
    ) -> Result<Result<sqlite_raw::Compiled, sqlite_raw::CompileError>, DbError> {
        let mut handle = self.0.lock_handle().await.map_err(|e| DbError {
            kind: DbErrorKind::Other,
            message: one_line(&format!("cannot reach the connection: {e}")),
        })?;
        let raw = handle.as_raw_handle();
        let tables: HashSet<String> = match sqlite_raw::main_tables(raw) {
            Ok(names) => names.iter().map(|n| n.to_ascii_lowercase()).collect(),
            Err(e) => return Ok(Err(e)),
        };
        Ok(sqlite_raw::compile_judged(
            raw,
            sql,
            &mut |r: &sqlite_raw::Request<'_>| authorize(r, &tables),
            flag_opcodes,
        ))
    }

    pub(super) async fn row_functions(
        &mut self,
        _names: &[String],
        _tables: &[String],
    ) -> Result<Vec<String>, DbError> {
        Err(DbError {
            kind: DbErrorKind::Other,
            message: "attribute notation is PostgreSQL's".into(),
        })
    }

    pub(super) async fn take_dead_letter(
        &mut self,
        id: i64,
    ) -> Result<Option<DeadLetterRow>, sqlx::Error> {
        sqlx::query(concat!(
            "DELETE FROM idem_dead_letters WHERE id = $1 RETURNING ",
            dead_letter_columns!()
        ))
        .bind(id)
        .fetch_optional(&mut *self.0)
        .await?
        .map(|row| decode_dead_letter!(&row))
        .transpose()
    }

    pub(super) async fn forget_receipt(
        &mut self,
        consumer: &str,
        message_id: &str,
    ) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(sql::FORGET_RECEIPT)
            .bind(consumer)
            .bind(message_id)
            .execute(&mut *self.0)
            .await?
            .rows_affected())
    }

    /// Removes the time budget first: it must not interrupt the COMMIT itself.
    pub(super) async fn commit(mut self) -> Result<(), sqlx::Error> {
        self.0.lock_handle().await?.remove_progress_handler();
        self.0.commit().await
    }

    pub(super) async fn rollback(self) -> Result<(), sqlx::Error> {
        self.0.rollback().await
    }
}
