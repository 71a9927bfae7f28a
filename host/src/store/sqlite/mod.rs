//! SQLite: the pool, the transaction and the prune lock behind the
//! `backend` traits (`store/backend.rs`), and the dialect SQL they send.
//! Host tables in `schema`, values in `values`, result codes in `codes`,
//! the compile hook in `compile`, a batch's side in `batch`, the commit
//! settings in `durability`; SQLite's C API only in `store::sqlite_raw`.
//! Message transactions run on connections of their own (`direct`), used
//! on the calling task; everything else goes through sqlx's pool.

mod batch;
pub(super) mod codes;
mod compile;
mod direct;
mod durability;
mod schema;
mod values;

use super::backend::{self, Param, bind_params};
use super::statement::ResultBounds;
use super::{Backend, DbKind, sqlite_raw};
use crate::sql_value::{CheckedSql, DbError, Rows, SqlValue};
use codes::{map_error, to_sqlx};
use sqlx::SqlStr;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use std::path::PathBuf;
use std::str::FromStr as _;
use std::time::Duration;
use values::{bind, bind_host, decode_row};

/// `failed_at` (stored as Unix milliseconds), with the other dead-letter
/// columns (`backend::HostRow::dead_letter`).
macro_rules! dead_letter_columns {
    () => {
        "id, consumer, message_id, stream, stream_sequence, subject, reason, headers, payload, \
         failed_at AS failed_at_ms, published_ns"
    };
}

/// A SQLite pool (WAL, `synchronous=FULL`, busy timeout, foreign keys on):
/// sqlx's, and the connections message transactions run on (`direct`).
pub struct Pool(SqlitePool, direct::Conns);

/// A SQLite transaction started with `BEGIN IMMEDIATE` (holds the write
/// lock), on a connection used on the calling task (`direct`), with when
/// its statements are interrupted: at the time budget or the message's
/// deadline, whichever comes first.
pub struct Tx(direct::Conn, Bounds);

/// When a transaction's statements are interrupted.
#[derive(Debug, Default, Clone, Copy)]
struct Bounds {
    /// The transaction's (or batch message's) time budget runs out.
    budget: Option<std::time::Instant>,
    /// The current message's deadline ([`backend::Transaction::cap_statements`]).
    deadline: Option<std::time::Instant>,
}

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

    /// How many SQLite transactions found the write lock held by another
    /// connection when they began, and waited for it (the count of
    /// `idem_sqlite_write_lock_waits_total` for this database); `None` on
    /// another database.
    pub fn sqlite_write_lock_waits(&self) -> Option<u64> {
        match &self.0 {
            Backend::Sqlite(p) => Some(p.1.lock_waits()),
            _ => None,
        }
    }

    /// On SQLite, the write gate's permit for a write that runs through
    /// sqlx's pool ([`direct::Conns::writer`]), to hold while it runs;
    /// `None` on another database.
    ///
    /// # Errors
    /// As [`direct::Conns::writer`].
    pub(in crate::store) async fn sqlite_writer(
        &self,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, sqlx::Error> {
        match &self.0 {
            Backend::Sqlite(p) => Ok(Some(p.1.writer().await?)),
            _ => Ok(None),
        }
    }
}

impl super::Tx {
    /// The SQLite connection of this transaction, for tests and tools that
    /// run SQL of their own in it (never a guest's); `None` on another
    /// database.
    pub fn sqlite_connection(&self) -> Option<std::sync::MutexGuard<'_, rusqlite::Connection>> {
        match &self.0 {
            Backend::Sqlite(t) => Some(t.0.get()),
            _ => None,
        }
    }
}

impl backend::Pool for Pool {
    type Tx = Tx;
    type PruneLock = PruneLock;
    type Row = SqliteRow;

    const KIND: DbKind = DbKind::Sqlite;

    const LIST_DEAD_LETTERS: &'static str = concat!(
        "SELECT ",
        dead_letter_columns!(),
        " FROM idem_dead_letters WHERE $1 IS NULL OR consumer = $1 ORDER BY id"
    );

    const DEAD_LETTER_BY_ID: &'static str = concat!(
        "SELECT ",
        dead_letter_columns!(),
        " FROM idem_dead_letters WHERE id = $1"
    );

    const SELECT_RECEIPT: &'static str = "SELECT stream_sequence, module_digest, processed_at, published_ms FROM idem_receipts WHERE consumer = $1 AND message_id = $2";

    /// `json_each` is SQLite's own (built in since 3.38).
    const SELECT_EXISTING_RECEIPTS: &'static str = "SELECT message_id FROM idem_receipts WHERE consumer = $1 AND message_id IN (SELECT value FROM json_each($2))";

    /// On an idle connection on the calling task when one is free
    /// ([`direct::Conns::read_now`]), else through sqlx: a lookup runs
    /// for every pull or batch while copies arrive.
    async fn existing_receipts(
        &self,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<Vec<String>, sqlx::Error> {
        let ids = backend::ids_json(message_ids)?;
        let read = self.1.read_now(|c| {
            let mut select = c.prepare_cached(Self::SELECT_EXISTING_RECEIPTS)?;
            let found = select.query_map(rusqlite::params![consumer, ids], |r| r.get(0))?;
            found.collect::<rusqlite::Result<Vec<String>>>()
        });
        match read {
            Some(Ok(found)) => Ok(found),
            Some(Err(e)) if !direct::is_busy(&e) => Err(to_sqlx(e)),
            _ => backend::existing_receipts_fetched(self, consumer, &ids).await,
        }
    }

    async fn connect(
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
        let acquire_timeout = lock_wait + Duration::from_secs(10);
        let parameter = |name: &str| {
            url::Url::parse(url).ok().and_then(|u| {
                u.query_pairs()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.into_owned())
            })
        };
        // Both pools must open one database: an in-memory one is shared
        // through its shared cache (`direct`), which `cache=private` denies.
        if in_memory(url) && parameter("cache").as_deref() == Some("private") {
            return Err(sqlx::Error::Configuration(
                "cache=private is not supported for an in-memory database: remove it".into(),
            ));
        }
        let direct = direct::Conns::new(
            direct::OpenSpec {
                path: options.get_filename().to_path_buf(),
                in_memory: in_memory(url),
                busy_timeout: lock_wait,
                vfs: parameter("vfs"),
            },
            if in_memory(url) { 1 } else { max_connections },
            acquire_timeout,
        );
        let pool = SqlitePoolOptions::new()
            .acquire_timeout(acquire_timeout)
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
        // sqlx's pool first: it creates the file and sets WAL on it.
        let pool = pool.connect_with(options).await?;
        Ok(Pool(pool, direct))
    }

    async fn prepare_host_tables(&self) -> Result<(), sqlx::Error> {
        schema::prepare_host_tables(&self.0).await
    }

    async fn migrate(
        &self,
        migrator: &sqlx::migrate::Migrator,
    ) -> Result<(), sqlx::migrate::MigrateError> {
        migrator.run(&self.0).await
    }

    /// `BEGIN IMMEDIATE` then `ROLLBACK`: a file that can be read but not
    /// written (read-only, disk full) is still "down".
    async fn probe(&self) -> Result<(), sqlx::Error> {
        self.0.begin_with("BEGIN IMMEDIATE").await?.rollback().await
    }

    /// `BEGIN IMMEDIATE`: takes the write lock at once.
    async fn begin(&self) -> Result<Tx, sqlx::Error> {
        Ok(Tx(self.1.begin().await?, Bounds::default()))
    }

    /// [`backend::Pool::begin`], then the progress handler that bounds every
    /// statement of the transaction ([`Tx::bound_statements`]). One writer
    /// holds the lock on the whole database, so there is no row lock to
    /// wait for: `lock_wait` is not used.
    async fn begin_limited(
        &self,
        timeout: Duration,
        _lock_wait: Option<Duration>,
    ) -> Result<Tx, sqlx::Error> {
        let mut tx = Tx(self.1.begin().await?, Bounds::default());
        tx.bound_statements(timeout)?;
        Ok(tx)
    }

    async fn close(&self) {
        self.1.close();
        self.0.close().await
    }

    async fn commit_settings(&self) -> Result<Vec<super::durability::CommitSettings>, sqlx::Error> {
        durability::commit_settings(&self.0).await
    }

    async fn has_host_tables(&self) -> Result<bool, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'
                       AND name IN ('idem_receipts', 'idem_dead_letters')",
        )
        .fetch_one(&self.0)
        .await?;
        Ok(n == 2)
    }

    /// SQLite keeps no row estimate, so the count is exact, read from the
    /// `(consumer, published_ms)` index (never the table's rows), as is the
    /// oldest publish time.
    async fn receipt_gauges(&self, consumer: &str) -> Result<(i64, Option<i64>), sqlx::Error> {
        let (rows, oldest, _newest) = self.receipt_summary(consumer, None).await?;
        Ok((rows, oldest))
    }

    /// Always got: SQLite has one writer anyway.
    async fn try_prune_lock(&self) -> Result<Option<PruneLock>, sqlx::Error> {
        Ok(Some(PruneLock))
    }

    fn is_undefined_table(e: &sqlx::Error) -> bool {
        codes::is_undefined_table(e)
    }

    /// Through the write gate ([`direct::Conns::writer`]): every caller
    /// writes (pruning, deploy marks, outbox marks, dead-letter admin).
    async fn run(&self, sql: SqlStr, params: &[Param<'_>]) -> Result<u64, sqlx::Error> {
        let _writer = self.1.writer().await?;
        let done = bind_params(sqlx::query(sql), params)
            .execute(&self.0)
            .await?;
        Ok(done.rows_affected())
    }

    /// In a `BEGIN IMMEDIATE` transaction of its own, through the write
    /// gate ([`direct::Conns::writer`]).
    async fn run_alone(&self, sql: SqlStr, params: &[Param<'_>]) -> Result<u64, sqlx::Error> {
        let _writer = self.1.writer().await?;
        let mut tx = self.0.begin_with("BEGIN IMMEDIATE").await?;
        let done = bind_params(sqlx::query(sql), params)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    async fn fetch_all(
        &self,
        sql: SqlStr,
        params: &[Param<'_>],
    ) -> Result<Vec<SqliteRow>, sqlx::Error> {
        bind_params(sqlx::query(sql), params)
            .fetch_all(&self.0)
            .await
    }

    async fn fetch_optional(
        &self,
        sql: SqlStr,
        params: &[Param<'_>],
    ) -> Result<Option<SqliteRow>, sqlx::Error> {
        bind_params(sqlx::query(sql), params)
            .fetch_optional(&self.0)
            .await
    }
}

/// SQLite has no roles or users: the absent answers.
impl backend::PoolRoles for Pool {}

impl backend::PruneLock for PruneLock {
    async fn release(self) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

impl Tx {
    /// Interrupts (SQLITE_INTERRUPT) any statement of the transaction still
    /// running `budget` after now, checked every 1000 virtual machine
    /// instructions (<https://www.sqlite.org/c3ref/progress_handler.html>).
    ///
    /// # Errors
    /// The handler cannot be set.
    ///
    /// A new budget drops the deadline of the message before (a batch's
    /// next message sets its own).
    pub(super) fn bound_statements(&mut self, budget: Duration) -> Result<(), sqlx::Error> {
        self.1 = Bounds {
            budget: Some(std::time::Instant::now() + budget),
            deadline: None,
        };
        self.interrupt_at()
    }

    /// Sets the progress handler to the earlier of the bounds (none: no
    /// handler).
    fn interrupt_at(&mut self) -> Result<(), sqlx::Error> {
        let conn = self.0.get();
        let until = match (self.1.budget, self.1.deadline) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(until) => until,
                None => {
                    return conn
                        .progress_handler(0, None::<fn() -> bool>)
                        .map_err(to_sqlx);
                }
            },
        };
        conn.progress_handler(1000, Some(move || std::time::Instant::now() >= until))
            .map_err(to_sqlx)
    }

    /// Runs host statement `sql` with `params`; the rows it affected, and
    /// the first row it returned when `first` asks for it.
    fn run_host(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
        first: bool,
    ) -> rusqlite::Result<(u64, Option<values::Row>)> {
        let conn = self.0.get();
        let mut stmt = conn.prepare_cached(sql)?;
        bind_host(&mut stmt, params)?;
        let readonly = stmt.readonly();
        let mut rows = stmt.raw_query();
        let mut row = None;
        while let Some(r) = rows.next()? {
            if first && row.is_none() {
                row = Some(values::Row::read(r, &column_names(r))?);
            }
        }
        drop(rows);
        let affected = if readonly { 0 } else { conn.changes() };
        Ok((affected, row))
    }
}

/// The columns of the statement `row` came from, as it ran: read after the
/// first step, since SQLite prepares a cached statement again when the
/// schema changed and its columns may have changed with it.
fn column_names(row: &rusqlite::Row<'_>) -> Vec<String> {
    row.as_ref()
        .column_names()
        .iter()
        .map(|n| (*n).to_owned())
        .collect()
}

impl backend::Transaction for Tx {
    type Row = values::Row;

    const KIND: DbKind = DbKind::Sqlite;

    const TAKE_DEAD_LETTER: &'static str = concat!(
        "DELETE FROM idem_dead_letters WHERE id = $1 RETURNING ",
        dead_letter_columns!()
    );

    /// The progress handler stops at the earlier of the time budget and
    /// `until`: a statement runs on the handler's task, where the
    /// runtime's timer cannot stop it.
    fn cap_statements(&mut self, until: Option<std::time::Instant>) -> Result<(), sqlx::Error> {
        self.1.deadline = until;
        self.interrupt_at()
    }

    /// `SQLITE_LIMIT_LENGTH` for the guest's statements.
    async fn bound_guest_values(&mut self, max_value_bytes: usize) -> Result<(), sqlx::Error> {
        let bytes = i32::try_from(max_value_bytes).unwrap_or(i32::MAX).max(1);
        self.0
            .get()
            .set_limit(rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH, bytes)
            .map(drop)
            .map_err(to_sqlx)
    }

    async fn run_host_sql(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        self.0.get().execute_batch(sql).map_err(to_sqlx)
    }

    /// Whether the connection is still inside the host's transaction
    /// (SQLite's autocommit flag is off).
    async fn still_open(&mut self) -> Result<bool, sqlx::Error> {
        Ok(!self.0.get().is_autocommit())
    }

    /// Runs the statement to its end (rows it returns are read and
    /// dropped); the rows it changed (`sqlite3_changes`), 0 for a
    /// statement that writes nothing.
    async fn execute(&mut self, sql: &CheckedSql, params: &[SqlValue]) -> Result<u64, DbError> {
        let conn = self.0.get();
        let run = || -> rusqlite::Result<u64> {
            let mut stmt = conn.prepare_cached(sql.as_str())?;
            bind(&mut stmt, params)?;
            let readonly = stmt.readonly();
            let mut rows = stmt.raw_query();
            while rows.next()?.is_some() {}
            drop(rows);
            Ok(if readonly { 0 } else { conn.changes() })
        };
        run().map_err(map_error)
    }

    async fn query(
        &mut self,
        sql: &CheckedSql,
        params: &[SqlValue],
        bounds: ResultBounds,
    ) -> Result<Rows, DbError> {
        let conn = self.0.get();
        let mut stmt = conn.prepare_cached(sql.as_str()).map_err(map_error)?;
        bind(&mut stmt, params).map_err(map_error)?;
        let mut rows = stmt.raw_query();
        let mut out = Rows::default();
        let mut used = 0;
        while let Some(row) = rows.next().map_err(map_error)? {
            if out.rows.is_empty() {
                out.columns = column_names(row);
            }
            let values = decode_row(row, &out.columns)?;
            bounds.push(&mut out, values, &mut used)?;
        }
        Ok(out)
    }

    /// Nothing to give back after a query.
    fn after_query(&mut self) {}

    /// Removes the time budget first: it must not interrupt the COMMIT itself.
    async fn commit(mut self) -> Result<(), sqlx::Error> {
        self.0
            .get()
            .progress_handler(0, None::<fn() -> bool>)
            .map_err(to_sqlx)?;
        self.0.commit().await
    }

    /// ROLLBACK of a WAL transaction discards its pages without a sync: on
    /// the calling task.
    async fn rollback(self) -> Result<(), sqlx::Error> {
        self.0.get().execute_batch("ROLLBACK").map_err(to_sqlx)
    }

    async fn run(&mut self, sql: SqlStr, params: &[Param<'_>]) -> Result<u64, sqlx::Error> {
        self.run_host(sql.as_str(), params, false)
            .map(|(n, _)| n)
            .map_err(to_sqlx)
    }

    async fn fetch_optional(
        &mut self,
        sql: SqlStr,
        params: &[Param<'_>],
    ) -> Result<Option<values::Row>, sqlx::Error> {
        self.run_host(sql.as_str(), params, true)
            .map(|(_, row)| row)
            .map_err(to_sqlx)
    }
}

/// SQLite has no roles: nothing to do.
impl backend::TxRoles for Tx {}

/// Attribute notation is PostgreSQL's: the absent answer.
impl backend::RowFunctions for Tx {}
