//! SQLite: host tables, receipts, dead letters, guest statements and the
//! mapping of extended result codes and storage classes to idem's values.

use super::{
    DeadLetter, RELEASE, Receipt, ResultBounds, SAVEPOINT, UNDO, one_line, savepoint_failed,
    sqlite_raw,
};
use crate::sql_guard::CheckedSql;
use crate::store::{DbError, DbErrorKind, Rows, SqlValue, StatementError};
use futures::TryStreamExt as _;
use sqlx::error::BoxDynError;
use sqlx::query::Query;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool,
    SqlitePoolOptions, SqliteRow, SqliteSynchronous, SqliteValueRef,
};
use sqlx::{
    AssertSqlSafe, Column as _, Decode, Row as _, Sqlite, Transaction, TypeInfo as _, ValueRef as _,
};
use std::str::FromStr as _;
use std::time::Duration;

/// The current time in Unix milliseconds, computed by SQLite (any version).
macro_rules! now_ms {
    () => {
        "(CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))"
    };
}

const HOST_TABLES: [&str; 6] = [
    concat!(
        "CREATE TABLE IF NOT EXISTS idem_receipts (
        consumer TEXT NOT NULL,
        message_id TEXT NOT NULL,
        stream_sequence INTEGER NOT NULL,
        module_digest TEXT NOT NULL,
        processed_at INTEGER NOT NULL DEFAULT ",
        now_ms!(),
        ",
        published_ms INTEGER NOT NULL,
        PRIMARY KEY (consumer, message_id)
    ) WITHOUT ROWID"
    ),
    // Pruning reads one consumer's oldest receipts by publish time (store::retention).
    "CREATE INDEX IF NOT EXISTS idem_receipts_consumer_published_ms
        ON idem_receipts (consumer, published_ms)",
    // Superseded by the index above; they only cost inserts.
    "DROP INDEX IF EXISTS idem_receipts_processed_at",
    "DROP INDEX IF EXISTS idem_receipts_consumer_processed_at",
    concat!(
        "CREATE TABLE IF NOT EXISTS idem_dead_letters (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        consumer TEXT NOT NULL,
        message_id TEXT,
        stream TEXT NOT NULL,
        stream_sequence INTEGER NOT NULL,
        subject TEXT NOT NULL,
        reason TEXT NOT NULL,
        headers TEXT NOT NULL,
        payload BLOB NOT NULL,
        failed_at INTEGER NOT NULL DEFAULT ",
        now_ms!(),
        ",
        published_ns INTEGER NOT NULL DEFAULT 0
    )"
    ),
    "CREATE UNIQUE INDEX IF NOT EXISTS idem_dead_letters_delivery
        ON idem_dead_letters (consumer, stream, stream_sequence, published_ns)",
];

/// Where `idem_dead_letters` is created in [`HOST_TABLES`].
const DEAD_LETTERS_DDL: usize = 4;

/// Columns of `idem_dead_letters` before `published_ns`, copied as they are
/// when [`upgrade_dead_letters`] rebuilds the table.
const DEAD_LETTER_COLUMNS_V1: &str = "id, consumer, message_id, stream, stream_sequence, subject, reason, headers, payload, failed_at";

/// A dead-letter table from before `published_ns` has the key
/// `UNIQUE (consumer, stream, stream_sequence)`, which a stream created
/// again (its sequences start over) collides with. SQLite cannot drop a
/// table constraint, so the table is rebuilt (the procedure of
/// <https://www.sqlite.org/lang_altertable.html#otheralter>): a new table,
/// every row copied with `published_ns = 0`, the old one dropped, the new one
/// renamed, inside the caller's transaction (SQLite's DDL is
/// transactional). A no-op on a current table or none.
async fn upgrade_dead_letters(tx: &mut Transaction<'static, Sqlite>) -> Result<(), sqlx::Error> {
    let current: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pragma_table_info('idem_dead_letters') WHERE name = 'published_ns'",
    )
    .fetch_one(&mut **tx)
    .await?;
    let exists: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'idem_dead_letters'",
    )
    .fetch_one(&mut **tx)
    .await?;
    if current == 1 || exists == 0 {
        return Ok(());
    }
    let create = HOST_TABLES[DEAD_LETTERS_DDL].replace(
        "CREATE TABLE IF NOT EXISTS idem_dead_letters (",
        "CREATE TABLE idem_dead_letters_v2 (",
    );
    for step in [
        create,
        format!(
            "INSERT INTO idem_dead_letters_v2 ({DEAD_LETTER_COLUMNS_V1}, published_ns)
             SELECT {DEAD_LETTER_COLUMNS_V1}, 0 FROM idem_dead_letters"
        ),
        "DROP TABLE idem_dead_letters".to_string(),
        "ALTER TABLE idem_dead_letters_v2 RENAME TO idem_dead_letters".to_string(),
    ] {
        sqlx::query(AssertSqlSafe(step)).execute(&mut **tx).await?;
    }
    tracing::info!(
        "idem_dead_letters upgraded: its key now includes the publish time (published_ns)"
    );
    Ok(())
}

/// A receipts table from before `published_ms` gets the column, each row
/// set to its `processed_at` (never earlier than its message's publish
/// time, give or take the skew between the database's and the broker's
/// clocks, once), inside the caller's transaction. A no-op on a current
/// table or none.
async fn upgrade_receipts(tx: &mut Transaction<'static, Sqlite>) -> Result<(), sqlx::Error> {
    let (exists, current): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'idem_receipts'),
                (SELECT count(*) FROM pragma_table_info('idem_receipts') WHERE name = 'published_ms')",
    )
    .fetch_one(&mut **tx)
    .await?;
    if current == 1 || exists == 0 {
        return Ok(());
    }
    for step in [
        "ALTER TABLE idem_receipts ADD COLUMN published_ms INTEGER NOT NULL DEFAULT 0",
        "UPDATE idem_receipts SET published_ms = processed_at",
    ] {
        sqlx::query(step).execute(&mut **tx).await?;
    }
    tracing::info!(
        "idem_receipts upgraded: receipts keep their message's publish time (published_ms), set to processed_at for the rows it held"
    );
    Ok(())
}

pub(super) async fn connect(
    url: &str,
    max_connections: u32,
    lock_wait: Duration,
) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(lock_wait)
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .acquire_timeout(lock_wait + Duration::from_secs(10))
        // A transaction's time budget (`set_time_budget`) and the guest's
        // value bound (`Tx::bound_guest_values`) end with it.
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
    let pool = if url.contains(":memory:") || url.contains("mode=memory") {
        pool.max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
    } else {
        pool.max_connections(max_connections.max(1))
    };
    pool.connect_with(options).await
}

pub(super) async fn prepare_host_tables(pool: &SqlitePool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    upgrade_dead_letters(&mut tx).await?;
    upgrade_receipts(&mut tx).await?;
    for ddl in HOST_TABLES {
        sqlx::query(ddl).execute(&mut *tx).await?;
    }
    tx.commit().await
}

pub(super) async fn insert_receipt(
    tx: &mut Transaction<'static, Sqlite>,
    r: &Receipt<'_>,
    seq: i64,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (consumer, message_id) DO NOTHING",
    )
    .bind(r.consumer)
    .bind(r.message_id)
    .bind(seq)
    .bind(r.module_digest)
    .bind(r.published_ms)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn dead_letter(
    pool: &SqlitePool,
    dl: &DeadLetter<'_>,
    seq: i64,
    headers: &str,
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query(
        "INSERT INTO idem_dead_letters
           (consumer, message_id, stream, stream_sequence, published_ns,
            subject, reason, headers, payload)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (consumer, stream, stream_sequence, published_ns) DO NOTHING",
    )
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

pub(super) async fn receipt_count(pool: &SqlitePool, consumer: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM idem_receipts WHERE consumer = $1")
        .bind(consumer)
        .fetch_one(pool)
        .await
}

/// Binds guest values in order; `$N` in the text is matched to value N by
/// sqlx-sqlite (it reads the number from the parameter's name). Booleans are
/// stored as integers 0/1, as SQLite has no boolean storage class.
fn bind<'q>(
    mut q: Query<'q, Sqlite, SqliteArguments>,
    params: &[SqlValue],
) -> Query<'q, Sqlite, SqliteArguments> {
    for p in params {
        q = match p {
            SqlValue::Null => q.bind(None::<i64>),
            SqlValue::Integer(i) => q.bind(*i),
            SqlValue::Float(f) => q.bind(*f),
            SqlValue::Text(s) => q.bind(s.clone()),
            SqlValue::Bytes(b) => q.bind(b.clone()),
            SqlValue::Boolean(b) => q.bind(*b),
        };
    }
    q
}

pub(super) async fn execute(
    tx: &mut Transaction<'static, Sqlite>,
    sql: &CheckedSql,
    params: &[SqlValue],
) -> Result<u64, StatementError> {
    let conn: &mut SqliteConnection = tx;
    sqlx::raw_sql(SAVEPOINT)
        .execute(&mut *conn)
        .await
        .map_err(|e| savepoint_failed(&e))?;
    let result = bind(sqlx::query(sql.to_sqlx()), params)
        .execute(&mut *conn)
        .await
        .map(|done| done.rows_affected())
        .map_err(map_error);
    finish(conn, result.is_ok()).await?;
    Ok(result?)
}

pub(super) async fn query(
    tx: &mut Transaction<'static, Sqlite>,
    sql: &CheckedSql,
    params: &[SqlValue],
    bounds: ResultBounds,
) -> Result<Rows, StatementError> {
    let conn: &mut SqliteConnection = tx;
    sqlx::raw_sql(SAVEPOINT)
        .execute(&mut *conn)
        .await
        .map_err(|e| savepoint_failed(&e))?;
    let result = async {
        let mut stream = bind(sqlx::query(sql.to_sqlx()), params).fetch(&mut *conn);
        let mut out = Rows::default();
        let mut used = 0;
        while let Some(row) = stream.try_next().await.map_err(map_error)? {
            if out.rows.is_empty() {
                out.columns = row.columns().iter().map(|c| c.name().to_owned()).collect();
            }
            bounds.push(&mut out, decode_row(&row)?, &mut used)?;
        }
        Ok::<_, DbError>(out)
    }
    .await;
    finish(conn, result.is_ok()).await?;
    Ok(result?)
}

/// Checks that the statement left the host's transaction open, then
/// releases the statement's savepoint, or rolls back to it after an error.
/// A statement can end SQLite's transaction without asking the authorizer
/// (a conflict resolved by ROLLBACK, which the guard refuses, is one way):
/// then nothing after it may run, since it would run outside the transaction.
async fn finish(conn: &mut SqliteConnection, ok: bool) -> Result<(), StatementError> {
    let open = {
        let mut handle = conn.lock_handle().await.map_err(|e| savepoint_failed(&e))?;
        sqlite_raw::in_transaction(handle.as_raw_handle())
    };
    if !open {
        return Err(StatementError::TransactionLost(
            "the statement ended the host's transaction; nothing after it may run".into(),
        ));
    }
    let sql = if ok { RELEASE } else { UNDO };
    sqlx::raw_sql(sql)
        .execute(conn)
        .await
        .map(|_| ())
        .map_err(|e| savepoint_failed(&e))
}

fn decode_row(row: &SqliteRow) -> Result<Vec<SqlValue>, DbError> {
    let mut values = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let raw = row.try_get_raw(i).map_err(map_error)?;
        values.push(decode_value(column.name(), raw)?);
    }
    Ok(values)
}

/// One value by its storage class (NULL, INTEGER, REAL, TEXT, BLOB), whatever
/// the column's declared type.
fn decode_value(column: &str, raw: SqliteValueRef<'_>) -> Result<SqlValue, DbError> {
    if raw.is_null() {
        return Ok(SqlValue::Null);
    }
    let class = raw.type_info().name().to_owned();
    let decoded: Result<SqlValue, BoxDynError> = match class.as_str() {
        "INTEGER" => <i64 as Decode<Sqlite>>::decode(raw).map(SqlValue::Integer),
        "REAL" => <f64 as Decode<Sqlite>>::decode(raw).map(SqlValue::Float),
        "TEXT" => <String as Decode<Sqlite>>::decode(raw).map(SqlValue::Text),
        "BLOB" => <Vec<u8> as Decode<Sqlite>>::decode(raw).map(SqlValue::Bytes),
        other => Err(format!("unexpected storage class {other}").into()),
    };
    decoded.map_err(|e| DbError {
        kind: DbErrorKind::Other,
        message: one_line(&format!("cannot decode column `{column}` ({class}): {e}")),
    })
}

/// Kind from the extended result code: 2067 (CONSTRAINT_UNIQUE) and 1555
/// (CONSTRAINT_PRIMARYKEY) unique; other SQLITE_CONSTRAINT (19) codes
/// constraint; 23 (SQLITE_AUTH) denied. SQLite reports syntax errors and
/// unknown tables/columns alike as SQLITE_ERROR (1), so those are `Other`
/// (the guard already rejected anything that does not parse).
fn map_error(e: sqlx::Error) -> DbError {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(0);
            let kind = match code {
                2067 | 1555 => DbErrorKind::UniqueViolation,
                c if c & 0xff == 19 => DbErrorKind::ConstraintViolation,
                c if c & 0xff == 23 => DbErrorKind::Denied,
                _ => DbErrorKind::Other,
            };
            DbError {
                kind,
                message: one_line(&format!("{} (SQLite code {code})", db.message())),
            }
        }
        _ => DbError {
            kind: DbErrorKind::Other,
            message: one_line(&e.to_string()),
        },
    }
}

/// Interrupts (SQLITE_INTERRUPT) any statement of `tx` still running
/// `budget` after now, checked every 1000 virtual machine instructions
/// (<https://www.sqlite.org/c3ref/progress_handler.html>).
pub(super) async fn set_time_budget(
    tx: &mut Transaction<'static, Sqlite>,
    budget: Duration,
) -> Result<(), sqlx::Error> {
    let until = std::time::Instant::now() + budget;
    tx.lock_handle()
        .await?
        .set_progress_handler(1000, move || std::time::Instant::now() < until);
    Ok(())
}
