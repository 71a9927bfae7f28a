//! Transactions, receipts and dead letters: one implementation per database
//! (`postgres`, `sqlite`), dispatched here so the pipeline is written once.
//!
//! Host tables (created at start by [`Database::prepare_host_tables`], never
//! reachable from a guest: the SQL guard refuses every `idem_*` name):
//! - `idem_receipts(consumer, message_id, stream_sequence, module_digest, processed_at,
//!   published_ms)`, primary key `(consumer, message_id)`: the processed-message
//!   marker. `published_ms` is the message's publish time on the broker's
//!   clock (Unix ms), indexed by `(consumer, published_ms)` for pruning (module
//!   `retention`, [`crate::broker_clock`]); `processed_at` is informational, set by
//!   the database (`timestamptz` on PostgreSQL, Unix ms `INTEGER` on SQLite).
//! - `idem_dead_letters(id, consumer, message_id NULL, stream, stream_sequence, subject,
//!   reason, headers (JSON text), payload, failed_at, published_ns)`, unique
//!   `(consumer, stream, stream_sequence, published_ns)` so that dead-lettering
//!   one delivery twice writes one row, and a stream created again (sequences
//!   start over) never collides with an earlier one's rows.
//! - `idem_migrations_<handler>`: sqlx's migration record, one table per handler.
//!
//! Guest statements run inside a savepoint (`idem_stmt`) of the message's
//! transaction. A failing statement is rolled back alone and the transaction
//! stays usable on both databases, so a handler may catch a unique violation
//! and carry on (on PostgreSQL an error would otherwise abort the whole
//! transaction, and a later `COMMIT` would silently roll back).

mod admin;
pub mod advisory;
mod pg_role;
mod postgres;
mod retention;
mod sqlite;
pub(crate) mod sqlite_raw;
pub mod value;

pub use admin::{ReceiptRow, ReceiptSummary};
pub use retention::{PRUNE_LOCK_KEY, PruneLock, PrunePass};

pub use value::{DbError, DbErrorKind, Rows, SqlValue, StatementError};

use crate::sql_guard::CheckedSql;
use anyhow::Context as _;
use sha2::Digest as _;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

/// SQLite busy timeout used by [`Database::connect`].
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(5);

/// The receipt for one message: written first in its transaction.
#[derive(Debug, Clone)]
pub struct Receipt<'a> {
    /// The durable consumer (= handler name).
    pub consumer: &'a str,
    /// The message identity (header or JSON pointer value).
    pub message_id: &'a str,
    /// The JetStream stream sequence of the delivery being processed.
    pub stream_sequence: u64,
    /// Hex SHA-256 of the component bytes that handle the message.
    pub module_digest: &'a str,
    /// When the broker stored the message, Unix ms on the broker's clock
    /// (JetStream's `published` metadata): what the retention window is
    /// measured on ([`crate::broker_clock`]).
    pub published_ms: i64,
}

/// A message the host gave up on, with the reason. Written in its own
/// transaction before the message is termed.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// The durable consumer (= handler name).
    pub consumer: &'a str,
    /// `None` when the message had no identity (that is then the reason).
    pub message_id: Option<&'a str>,
    /// The JetStream stream the message came from.
    pub stream: &'a str,
    /// The message's sequence in `stream`.
    pub stream_sequence: u64,
    /// When the broker stored the message (JetStream's `published` metadata),
    /// in nanoseconds since the Unix epoch. With `consumer`, `stream` and
    /// `stream_sequence` the row's unique key: a stream deleted and created
    /// again starts its sequences over, so a sequence alone does not name
    /// one message, while a second dead letter of the same delivery (its
    /// term was lost) writes no second row.
    pub published_ns: i64,
    /// The subject the message was published on.
    pub subject: &'a str,
    /// One line for a person: why the host gave up.
    pub reason: &'a str,
    /// The message headers in order (stored as a JSON array of `[name, value]` pairs).
    pub headers: &'a [(String, String)],
    /// The payload bytes, unchanged.
    pub payload: &'a [u8],
}

/// One stored dead letter, as read back by [`Database::list_dead_letters`].
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterRow {
    /// Row id, increasing in insertion order.
    pub id: i64,
    /// The durable consumer (= handler name).
    pub consumer: String,
    /// The message identity, `None` when the message had none.
    pub message_id: Option<String>,
    /// The JetStream stream.
    pub stream: String,
    /// The message's sequence in `stream`.
    pub stream_sequence: u64,
    /// The subject the message was published on.
    pub subject: String,
    /// Why the host gave up.
    pub reason: String,
    /// The message headers in order.
    pub headers: Vec<(String, String)>,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// When the row was written, in milliseconds since the Unix epoch (database clock).
    pub failed_at_ms: i64,
    /// When the broker stored the message, ns since the Unix epoch (broker's
    /// clock); 0 for a row written before idem recorded it.
    pub published_ns: i64,
}

/// Which database a URL names; also picks the SQL dialect the guard parses with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    /// PostgreSQL (`postgres://` or `postgresql://`).
    Postgres,
    /// SQLite (`sqlite://path` or `sqlite::memory:`).
    Sqlite,
}

/// A failure of the host's own database work (begin, receipt, commit, dead letter).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The driver or the database failed; the message is sqlx's.
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
}

/// A connection pool to the one database idem writes receipts and effects to.
pub enum Database {
    /// A PostgreSQL pool.
    Postgres(sqlx::PgPool),
    /// A SQLite pool (WAL, `synchronous=FULL`, busy timeout 5 s, foreign keys on).
    Sqlite(sqlx::SqlitePool),
}

/// One open transaction: the receipt and every guest statement go through it.
/// Dropping it without [`Tx::commit`] rolls it back.
pub enum Tx {
    /// A PostgreSQL transaction (`BEGIN`, read committed).
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    /// A SQLite transaction started with `BEGIN IMMEDIATE` (holds the write lock).
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
}

/// The name of the table that records `handler`'s migrations:
/// `idem_migrations_<name>` with the name lower-cased and every character
/// outside `[a-z0-9_]` replaced by `_`; when that changed the name or it is
/// longer than 38 bytes (cut to 38), the first 8 hex digits of its SHA-256 are
/// appended, so distinct handlers never share a table and the name fits 63 bytes.
pub fn migrations_table(handler: &str) -> String {
    handler_ident("idem_migrations_", handler)
}

/// `prefix` + `handler` as a PostgreSQL identifier of at most 63 bytes; see
/// [`migrations_table`] for the rule.
fn handler_ident(prefix: &str, handler: &str) -> String {
    let clean: String = handler
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    // PostgreSQL truncates identifiers past 63 bytes: prefix + clean + '_' + 8 hex.
    let max_clean = 63 - prefix.len() - 9;
    if clean == handler && clean.len() <= max_clean {
        format!("{prefix}{clean}")
    } else {
        let digest = hex::encode(sha2::Sha256::digest(handler.as_bytes()));
        let short: String = clean.chars().take(max_clean).collect();
        format!("{prefix}{short}_{}", &digest[..8])
    }
}

impl Database {
    /// [`Database::connect_with`] with a 5 s SQLite lock wait.
    pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        Self::connect_with(url, max_connections, DEFAULT_LOCK_WAIT).await
    }

    /// Opens a pool of up to `max_connections` to `url`: `postgres://…` /
    /// `postgresql://…`, or `sqlite://path` (the file is created if missing;
    /// WAL journal, busy timeout `lock_wait`, `synchronous=FULL`, foreign keys on).
    /// `sqlite::memory:` uses one connection that is never closed.
    ///
    /// `lock_wait` must exceed the longest time a transaction may hold
    /// SQLite's single write lock (a handler's deadline), or other handlers'
    /// `BEGIN IMMEDIATE` give up with "database is locked" instead of waiting.
    ///
    /// Errors: one line, `cannot connect to database <url without password>:
    /// <cause>; check [database] url`.
    pub async fn connect_with(
        url: &str,
        max_connections: u32,
        lock_wait: Duration,
    ) -> anyhow::Result<Self> {
        let result = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            postgres::connect(url, max_connections)
                .await
                .map(Database::Postgres)
        } else if url.starts_with("sqlite:") {
            sqlite::connect(url, max_connections, lock_wait)
                .await
                .map(Database::Sqlite)
        } else {
            anyhow::bail!(
                "cannot connect to database {}: unsupported scheme (use postgres://… or sqlite://…); check [database] url",
                redact_url(url)
            );
        };
        result.map_err(|e| {
            anyhow::anyhow!(
                "cannot connect to database {}: {}; check [database] url",
                redact_url(url),
                one_line(&e.to_string())
            )
        })
    }

    /// Which database this is.
    pub fn kind(&self) -> DbKind {
        match self {
            Database::Postgres(_) => DbKind::Postgres,
            Database::Sqlite(_) => DbKind::Sqlite,
        }
    }

    /// Creates the host tables and their index if they do not exist.
    /// Idempotent and safe when several hosts start at once (PostgreSQL: under
    /// a transaction-scoped advisory lock; SQLite: under `BEGIN IMMEDIATE`).
    pub async fn prepare_host_tables(&self) -> anyhow::Result<()> {
        match self {
            Database::Postgres(pool) => postgres::prepare_host_tables(pool).await,
            Database::Sqlite(pool) => sqlite::prepare_host_tables(pool).await,
        }
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot create idem's host tables: {}",
                one_line(&e.to_string())
            )
        })
    }

    /// Applies `handler`'s SQL migrations from `dir` (sqlx's migrator layout:
    /// `<version>_<description>.sql`), recorded in the handler's own table
    /// [`migrations_table`]: handlers never see each other's versions.
    /// Idempotent; a changed, already applied migration is an error.
    pub async fn migrate_handler(&self, handler: &str, dir: &Path) -> anyhow::Result<()> {
        let context = || {
            format!(
                "migrations of handler `{handler}` in {} failed",
                dir.display()
            )
        };
        let mut migrator = sqlx::migrate::Migrator::new(dir)
            .await
            .map_err(|e| anyhow::anyhow!(one_line(&e.to_string())))
            .with_context(context)?;
        migrator.dangerous_set_table_name(migrations_table(handler));
        match self {
            Database::Postgres(pool) => migrator.run(pool).await,
            Database::Sqlite(pool) => migrator.run(pool).await,
        }
        .map_err(|e| anyhow::anyhow!(one_line(&e.to_string())))
        .with_context(context)
    }

    /// Begins the transaction for one message. On SQLite it takes the write
    /// lock at once (`BEGIN IMMEDIATE`), so concurrent transactions wait up to
    /// the busy timeout instead of failing with "database is locked" later.
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        Ok(match self {
            Database::Postgres(pool) => Tx::Postgres(pool.begin().await?),
            Database::Sqlite(pool) => Tx::Sqlite(pool.begin_with("BEGIN IMMEDIATE").await?),
        })
    }

    /// [`Database::begin`], with every statement of the transaction bounded in
    /// time, so a runaway guest statement cannot outlive its handler's deadline:
    /// - PostgreSQL: `SET LOCAL statement_timeout` (via `set_config(..., true)`),
    ///   each statement cancelled by the server after `timeout`
    ///   (SQLSTATE 57014); scoped to this transaction only.
    /// - SQLite: a progress handler interrupts any statement still running
    ///   `timeout` after BEGIN (SQLITE_INTERRUPT), so no transaction holds the
    ///   write lock much past it. Removed before COMMIT and when the
    ///   connection returns to the pool.
    pub async fn begin_bounded(&self, timeout: Duration) -> Result<Tx, StoreError> {
        let mut tx = self.begin().await?;
        match &mut tx {
            Tx::Postgres(tx) => postgres::set_statement_timeout(tx, timeout).await?,
            Tx::Sqlite(tx) => sqlite::set_time_budget(tx, timeout).await?,
        }
        Ok(tx)
    }

    /// Writes a dead letter in its own transaction, durable when this
    /// returns. A second call for the same `(consumer, stream,
    /// stream_sequence, published_ns)` (the same stored message) writes
    /// nothing and succeeds. NUL in `subject` and `reason` is stored
    /// as `\0` on every database: PostgreSQL `text` cannot hold it (SQLSTATE
    /// 22021), and a reason may quote anything a guest returned.
    pub async fn dead_letter(&self, dl: &DeadLetter<'_>) -> Result<(), StoreError> {
        let headers =
            serde_json::to_string(dl.headers).map_err(|e| sqlx::Error::Encode(e.into()))?;
        let seq = to_i64(dl.stream_sequence)?;
        let (subject, reason) = (without_nul(dl.subject), without_nul(dl.reason));
        let dl = DeadLetter {
            subject: &subject,
            reason: &reason,
            ..dl.clone()
        };
        match self {
            Database::Postgres(pool) => postgres::dead_letter(pool, &dl, seq, &headers).await,
            Database::Sqlite(pool) => sqlite::dead_letter(pool, &dl, seq, &headers).await,
        }?;
        Ok(())
    }

    /// Which of `tables` hold at least one row (names as in `[[handler]]
    /// tables`, read as unquoted identifiers: lower case). A table that
    /// cannot be read (missing, say) is left out.
    pub async fn tables_with_rows(&self, tables: &[String]) -> Vec<String> {
        let mut filled = Vec::new();
        for t in tables {
            let sql = format!(
                "SELECT 1 FROM \"{}\" LIMIT 1",
                t.to_lowercase().replace('"', "\"\"")
            );
            let row = match self {
                Database::Postgres(pool) => sqlx::query(sqlx::AssertSqlSafe(sql))
                    .fetch_optional(pool)
                    .await
                    .map(|r| r.is_some()),
                Database::Sqlite(pool) => sqlx::query(sqlx::AssertSqlSafe(sql))
                    .fetch_optional(pool)
                    .await
                    .map(|r| r.is_some()),
            };
            if let Ok(true) = row {
                filled.push(t.clone());
            }
        }
        filled
    }

    /// How many receipts `consumer` has (committed ones only).
    pub async fn receipt_count(&self, consumer: &str) -> Result<u64, StoreError> {
        let n = match self {
            Database::Postgres(pool) => postgres::receipt_count(pool, consumer).await,
            Database::Sqlite(pool) => sqlite::receipt_count(pool, consumer).await,
        }?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// `consumer`'s dead letters, oldest first
    /// ([`Database::list_dead_letters`] for one consumer).
    pub async fn dead_letters(&self, consumer: &str) -> Result<Vec<DeadLetterRow>, StoreError> {
        self.list_dead_letters(Some(consumer)).await
    }

    /// PostgreSQL only: prepares `handler`'s own role (see the `pg_role`
    /// module), holding privileges on `tables` only, and returns its name for
    /// [`Tx::enter_handler_role`]. `Ok(None)` on SQLite, which has no roles.
    /// Errors: the connecting user may not create roles or grant on a table.
    pub async fn prepare_handler_role(
        &self,
        handler: &str,
        tables: &[String],
    ) -> Result<Option<String>, StoreError> {
        match self {
            Database::Postgres(pool) => {
                let role = handler_ident("idem_handler_", handler);
                pg_role::prepare(pool, &role, tables).await?;
                Ok(Some(role))
            }
            Database::Sqlite(_) => Ok(None),
        }
    }

    /// PostgreSQL only: the connecting user and whether it is a superuser.
    /// A superuser session can leave any role it switches to, so with one the
    /// handler roles are not a boundary (the caller warns). `Ok(None)` on SQLite.
    ///
    /// # Errors
    /// The query fails (connection lost).
    pub async fn session_user(&self) -> Result<Option<(String, bool)>, StoreError> {
        match self {
            Database::Postgres(pool) => Ok(Some(postgres::session_user(pool).await?)),
            Database::Sqlite(_) => Ok(None),
        }
    }

    /// Closes the pool, waiting for connections to be returned.
    pub async fn close(&self) {
        match self {
            Database::Postgres(pool) => pool.close().await,
            Database::Sqlite(pool) => pool.close().await,
        }
    }
}

impl Tx {
    /// Inserts the receipt (`ON CONFLICT (consumer, message_id) DO NOTHING`).
    /// `true`: inserted, the message is new; `false`: a receipt exists, the
    /// message is a duplicate. On PostgreSQL, while another transaction holds
    /// an uncommitted receipt with the same key this waits for it; if that one
    /// commits this returns `false` without error (ARCHITECTURE.md invariant 5).
    pub async fn insert_receipt(&mut self, r: &Receipt<'_>) -> Result<bool, StoreError> {
        let seq = to_i64(r.stream_sequence)?;
        Ok(match self {
            Tx::Postgres(tx) => postgres::insert_receipt(tx, r, seq).await,
            Tx::Sqlite(tx) => sqlite::insert_receipt(tx, r, seq).await,
        }?)
    }

    /// Runs one checked guest statement with `params` bound to `$1..$n` in
    /// order; returns the rows affected. The statement runs in its own
    /// savepoint: on error its effects are undone and the transaction goes on.
    ///
    /// # Errors
    /// [`StatementError::Failed`]: kind from SQLSTATE / SQLite extended code;
    /// `Other` when the parameter count differs from the statement's highest
    /// `$n`. [`StatementError::TransactionLost`]: afterwards the host's
    /// transaction was no longer open or its savepoint could not be restored.
    pub async fn execute(
        &mut self,
        sql: &CheckedSql,
        params: &[SqlValue],
    ) -> Result<u64, StatementError> {
        check_arity(sql, params)?;
        match self {
            Tx::Postgres(tx) => postgres::execute(tx, sql, params).await,
            Tx::Sqlite(tx) => sqlite::execute(tx, sql, params).await,
        }
    }

    /// Runs one checked guest statement that returns rows (SELECT, or DML with
    /// RETURNING), in its own savepoint like [`Tx::execute`]. Values: PostgreSQL
    /// by column type (`int2/4/8`, `float4/8`, `text`/`varchar`/`bpchar`/`name`,
    /// `bytea`, `bool`; other types are an error asking for a cast), SQLite by
    /// each value's storage class. `columns` is empty when no row is returned.
    ///
    /// # Errors
    /// As [`Tx::execute`]; also `Other` (and the statement is undone) when it
    /// returns more than `max_rows` rows or more than `max_bytes` bytes of
    /// values ([`SqlValue::size`]).
    pub async fn query(
        &mut self,
        sql: &CheckedSql,
        params: &[SqlValue],
        max_rows: usize,
        max_bytes: usize,
    ) -> Result<Rows, StatementError> {
        check_arity(sql, params)?;
        let bounds = ResultBounds {
            max_rows,
            max_bytes,
        };
        match self {
            Tx::Postgres(tx) => postgres::query(tx, sql, params, bounds).await,
            Tx::Sqlite(tx) => sqlite::query(tx, sql, params, bounds).await,
        }
    }

    /// SQLite only: compiles `sql` on this transaction's connection with
    /// `authorize` consulted for everything it would touch, without running
    /// it (see [`sqlite_raw::compile_judged`]).
    ///
    /// # Errors
    /// `Other` when the connection cannot be locked, or on PostgreSQL.
    ///
    /// `authorize` gets the request and the names of the tables and views of
    /// the `main` schema, lower-cased (SQLite names a subquery or CTE in a
    /// `count(*)`-style read the way it names a table; see `sql_guard::sqlite`).
    pub(crate) async fn compile_judged(
        &mut self,
        sql: &str,
        authorize: &mut sqlite_raw::SchemaPolicy<'_>,
        flag_opcodes: &[&str],
    ) -> Result<Result<sqlite_raw::Compiled, sqlite_raw::CompileError>, DbError> {
        match self {
            Tx::Sqlite(tx) => {
                let mut handle = tx.lock_handle().await.map_err(|e| DbError {
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
            Tx::Postgres(_) => Err(DbError {
                kind: DbErrorKind::Other,
                message: "SQLite statements cannot be compiled on PostgreSQL".into(),
            }),
        }
    }

    /// PostgreSQL only: which of `names` (field names a statement selects
    /// from a row, `a.f`) PostgreSQL would resolve as a call `f(a)`
    /// (attribute notation, "Functions as Columns" in the PostgreSQL manual):
    /// a function named so that takes one argument exists, and no table of
    /// `tables` has a column named so. Read from the catalogs in this
    /// transaction, sorted.
    ///
    /// # Errors
    /// `Other` when the catalogs cannot be read, or on SQLite.
    pub(crate) async fn row_functions(
        &mut self,
        names: &[String],
        tables: &[String],
    ) -> Result<Vec<String>, DbError> {
        match self {
            Tx::Postgres(tx) => postgres::row_functions(tx, names, tables)
                .await
                .map_err(|e| DbError {
                    kind: DbErrorKind::Other,
                    message: one_line(&format!("cannot read the catalogs: {e}")),
                }),
            Tx::Sqlite(_) => Err(DbError {
                kind: DbErrorKind::Other,
                message: "attribute notation is PostgreSQL's".into(),
            }),
        }
    }

    /// Bounds what the guest's statements may create or read in this
    /// transaction: on SQLite no string, BLOB or row may exceed `max_value_bytes`
    /// (`SQLITE_LIMIT_LENGTH`, restored when the connection returns to the
    /// pool). PostgreSQL has no such setting: there results are counted as
    /// they arrive ([`Tx::query`]). Call it before the guest runs.
    ///
    /// # Errors
    /// The connection cannot be locked.
    pub async fn bound_guest_values(&mut self, max_value_bytes: usize) -> Result<(), StoreError> {
        if let Tx::Sqlite(tx) = self {
            let mut handle = tx.lock_handle().await?;
            sqlite_raw::set_length_limit(handle.as_raw_handle(), max_value_bytes);
        }
        Ok(())
    }

    /// Commits. Only after this returns `Ok` is the effect durable.
    pub async fn commit(self) -> Result<(), StoreError> {
        match self {
            Tx::Postgres(tx) => tx.commit().await?,
            Tx::Sqlite(mut tx) => {
                // A time budget running out must not interrupt the COMMIT itself.
                tx.lock_handle().await?.remove_progress_handler();
                tx.commit().await?
            }
        }
        Ok(())
    }

    /// Runs the rest of this transaction as `role` (from
    /// [`Database::prepare_handler_role`]): call it after the receipt insert,
    /// before the guest's statements. A no-op on SQLite.
    pub async fn enter_handler_role(&mut self, role: &str) -> Result<(), StoreError> {
        if let Tx::Postgres(tx) = self {
            pg_role::enter(tx, role).await?;
        }
        Ok(())
    }

    /// Rolls back: the receipt and every guest write disappear together.
    pub async fn rollback(self) -> Result<(), StoreError> {
        match self {
            Tx::Postgres(tx) => tx.rollback().await?,
            Tx::Sqlite(tx) => tx.rollback().await?,
        }
        Ok(())
    }
}

/// Opens the per-statement savepoint.
const SAVEPOINT: &str = "SAVEPOINT idem_stmt";
/// Closes it after a statement succeeded.
const RELEASE: &str = "RELEASE SAVEPOINT idem_stmt";
/// Undoes a failed statement and closes its savepoint.
const UNDO: &str = "ROLLBACK TO SAVEPOINT idem_stmt; RELEASE SAVEPOINT idem_stmt";

fn check_arity(sql: &CheckedSql, params: &[SqlValue]) -> Result<(), DbError> {
    if params.len() == sql.param_count() && sql.fits(params) {
        Ok(())
    } else if params.len() == sql.param_count() {
        Err(DbError {
            kind: DbErrorKind::Other,
            message: "the statement was checked for other parameter types; check it again with these values".into(),
        })
    } else {
        Err(DbError {
            kind: DbErrorKind::Other,
            message: format!(
                "the statement has {} parameter(s) ($1..$n) but {} value(s) were given",
                sql.param_count(),
                params.len()
            ),
        })
    }
}

/// The most rows and bytes of values a query may hand back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResultBounds {
    max_rows: usize,
    max_bytes: usize,
}

impl ResultBounds {
    /// Adds one decoded row to `out`, or fails when it would pass a bound;
    /// `used` carries the bytes counted so far.
    fn push(&self, out: &mut Rows, row: Vec<SqlValue>, used: &mut usize) -> Result<(), DbError> {
        if out.rows.len() >= self.max_rows {
            return Err(too_many_rows(self.max_rows));
        }
        *used = used.saturating_add(row.iter().map(SqlValue::size).sum());
        if *used > self.max_bytes {
            return Err(self.too_many_bytes());
        }
        out.rows.push(row);
        Ok(())
    }

    /// Fails before a row of `raw` bytes (as the database sent it) is even
    /// decoded when it alone would pass the byte bound after `used`: decoding
    /// would copy it.
    fn admit_raw(&self, raw: usize, used: usize) -> Result<(), DbError> {
        if used.saturating_add(raw) > self.max_bytes {
            return Err(self.too_many_bytes());
        }
        Ok(())
    }

    fn too_many_bytes(&self) -> DbError {
        DbError {
            kind: DbErrorKind::Other,
            message: format!(
                "query results passed the {} KiB this message may read (max_result_kib); \
                 select fewer columns or rows",
                self.max_bytes / 1024
            ),
        }
    }
}

fn too_many_rows(max_rows: usize) -> DbError {
    DbError {
        kind: DbErrorKind::Other,
        message: format!(
            "query returned more than {max_rows} rows; add a LIMIT or narrow the WHERE"
        ),
    }
}

/// A failure opening or restoring the statement's savepoint: the host's
/// transaction is in an unknown state (perhaps ended), so the guest stops.
fn savepoint_failed(e: &sqlx::Error) -> StatementError {
    StatementError::TransactionLost(one_line(&format!(
        "the host could not isolate the statement in a savepoint: {e}"
    )))
}

/// `s` with NUL written as `\0` (borrowed when there is none).
fn without_nul(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\\0"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

fn to_i64(n: u64) -> Result<i64, sqlx::Error> {
    i64::try_from(n).map_err(|_| {
        sqlx::Error::Encode(format!("stream sequence {n} does not fit a BIGINT").into())
    })
}

fn decode_headers(json: &str) -> Result<Vec<(String, String)>, sqlx::Error> {
    serde_json::from_str(json).map_err(|e| sqlx::Error::Decode(e.into()))
}

/// `s` on one line: lines trimmed and joined with a space.
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `url` with any password replaced by `***` (userinfo and `password=` query parameter).
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{user}:***@{host}")
        }
        _ => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(
            redact_url("postgres://u@h/db?password=x&sslmode=disable"),
            "postgres://u@h/db?password=***&sslmode=disable"
        );
        assert_eq!(redact_url("sqlite://idem.db"), "sqlite://idem.db");
    }

    #[test]
    fn migrations_table_names() {
        assert_eq!(
            migrations_table("credit_projector"),
            "idem_migrations_credit_projector"
        );
        let a = migrations_table("credit-projector");
        assert!(
            a.starts_with("idem_migrations_credit_projector_") && a.len() == 16 + 16 + 1 + 8,
            "{a}"
        );
        assert_ne!(a, migrations_table("credit_projector"));
    }
}
