//! PostgreSQL: host tables, receipts, dead letters, guest statements and the
//! mapping of SQLSTATEs and column types to idem's values.

use super::{
    DeadLetter, RELEASE, Receipt, ResultBounds, SAVEPOINT, UNDO, one_line, savepoint_failed,
};
use crate::sql_guard::CheckedSql;
use crate::store::{DbError, DbErrorKind, Rows, SqlValue, StatementError};
use futures::TryStreamExt as _;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{
    PgArgumentBuffer, PgArguments, PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow,
    PgTypeInfo, PgValueRef,
};
use sqlx::query::Query;
use sqlx::{Column as _, Decode, Postgres, Row as _, Transaction, TypeInfo as _, ValueRef as _};
use std::time::Duration;

/// Where `idem_receipts` is created in [`HOST_TABLES`]: [`upgrade_receipts`]
/// runs right after it.
const RECEIPTS_DDL: usize = 0;

const HOST_TABLES: [&str; 8] = [
    "CREATE TABLE IF NOT EXISTS idem_receipts (
        consumer TEXT NOT NULL,
        message_id TEXT NOT NULL,
        stream_sequence BIGINT NOT NULL,
        module_digest TEXT NOT NULL,
        processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        published_ms BIGINT NOT NULL,
        PRIMARY KEY (consumer, message_id)
    )",
    // Pruning reads one consumer's oldest receipts by publish time (store::retention).
    "CREATE INDEX IF NOT EXISTS idem_receipts_consumer_published_ms
        ON idem_receipts (consumer, published_ms)",
    // Superseded by the index above; they only cost inserts.
    "DROP INDEX IF EXISTS idem_receipts_processed_at",
    "DROP INDEX IF EXISTS idem_receipts_consumer_processed_at",
    "CREATE TABLE IF NOT EXISTS idem_dead_letters (
        id BIGSERIAL PRIMARY KEY,
        consumer TEXT NOT NULL,
        message_id TEXT,
        stream TEXT NOT NULL,
        stream_sequence BIGINT NOT NULL,
        subject TEXT NOT NULL,
        reason TEXT NOT NULL,
        headers TEXT NOT NULL,
        payload BYTEA NOT NULL,
        failed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        published_ns BIGINT NOT NULL DEFAULT 0
    )",
    // A table from before `published_ns`: add it (0 for the rows it holds)
    // and replace the key without it, which a stream created again (its
    // sequences start over) would collide with.
    "ALTER TABLE idem_dead_letters ADD COLUMN IF NOT EXISTS published_ns BIGINT NOT NULL DEFAULT 0",
    "CREATE UNIQUE INDEX IF NOT EXISTS idem_dead_letters_delivery
        ON idem_dead_letters (consumer, stream, stream_sequence, published_ns)",
    "ALTER TABLE idem_dead_letters
        DROP CONSTRAINT IF EXISTS idem_dead_letters_consumer_stream_stream_sequence_key",
];

/// Undoes whatever session state a connection may carry into its next use,
/// run when it returns to the pool (every message, every host statement).
/// The guard lets no guest statement change settings, roles, locks or
/// session objects; this is the second line. Prepared statements are kept:
/// they are sqlx's statement cache, and guests cannot create any.
/// `pg_advisory_unlock_all` drops session-level advisory locks (the prune
/// lock is transaction-scoped, so a host never holds one here).
const RESET_SESSION: &str = "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; \
    UNLISTEN *; SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES";

pub(super) async fn connect(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    // Guest SQL is judged by libpg_query, which reads a backslash in '...'
    // as a plain character (standard_conforming_strings = on, PostgreSQL's
    // default): the server must agree, whatever its configuration says.
    let options = url
        .parse::<PgConnectOptions>()?
        .options([("standard_conforming_strings", "on")]);
    // One direct attempt first: the pool retries a refused connection until
    // its acquire timeout and then reports only "pool timed out".
    let probe = <PgConnection as sqlx::Connection>::connect_with(&options).await?;
    let _ = sqlx::Connection::close(probe).await;
    PgPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
        // A connection whose reset fails is closed, never reused.
        .after_release(|conn, _| {
            Box::pin(async move { Ok(sqlx::raw_sql(RESET_SESSION).execute(conn).await.is_ok()) })
        })
        .connect_with(options)
        .await
}

/// The connecting user's name, and whether it is a superuser (who can leave
/// any role it switches to, so a handler role is no boundary for it).
pub(super) async fn session_user(pool: &PgPool) -> Result<(String, bool), sqlx::Error> {
    sqlx::query_as("SELECT rolname::text, rolsuper FROM pg_roles WHERE rolname = session_user")
        .fetch_one(pool)
        .await
}

pub(super) async fn prepare_host_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(super::advisory::HOST_TABLES)
        .execute(&mut *tx)
        .await?;
    for (i, ddl) in HOST_TABLES.iter().enumerate() {
        sqlx::query(*ddl).execute(&mut *tx).await?;
        if i == RECEIPTS_DDL {
            upgrade_receipts(&mut tx).await?;
        }
    }
    tx.commit().await
}

/// A receipts table from before `published_ms` gets the column, each row
/// set to its `processed_at` (never earlier than its message's publish
/// time, give or take the skew between the database's and the broker's
/// clocks, once), inside the caller's transaction. Checked in the catalog
/// first, so a current table costs no scan. A no-op on a current table.
async fn upgrade_receipts(tx: &mut Transaction<'static, Postgres>) -> Result<(), sqlx::Error> {
    let current: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                        WHERE attrelid = 'idem_receipts'::regclass
                          AND attname = 'published_ms' AND NOT attisdropped)",
    )
    .fetch_one(&mut **tx)
    .await?;
    if current {
        return Ok(());
    }
    for step in [
        "ALTER TABLE idem_receipts ADD COLUMN published_ms BIGINT NOT NULL DEFAULT 0",
        "UPDATE idem_receipts SET published_ms = (extract(epoch FROM processed_at) * 1000)::bigint",
        "ALTER TABLE idem_receipts ALTER COLUMN published_ms DROP DEFAULT",
    ] {
        sqlx::query(step).execute(&mut **tx).await?;
    }
    tracing::info!(
        "idem_receipts upgraded: receipts keep their message's publish time (published_ms), set to processed_at for the rows it held"
    );
    Ok(())
}

/// See [`super::Tx::row_functions`]. A function with defaults counts when
/// one argument is enough to call it. Only catalogs PUBLIC may read, so it
/// works as a handler role too.
pub(super) async fn row_functions(
    tx: &mut Transaction<'static, Postgres>,
    names: &[String],
    tables: &[String],
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT f FROM unnest($1::text[]) AS f
         WHERE EXISTS (
             SELECT 1 FROM pg_catalog.pg_proc p
             WHERE p.proname = f AND p.pronargs >= 1 AND p.pronargs - p.pronargdefaults <= 1)
           AND NOT EXISTS (
             SELECT 1 FROM pg_catalog.pg_attribute a
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
             WHERE c.relname = ANY($2::text[]) AND pg_catalog.pg_table_is_visible(c.oid)
               AND a.attname = f AND a.attnum > 0 AND NOT a.attisdropped)
         ORDER BY f",
    )
    .bind(names)
    .bind(tables)
    .fetch_all(&mut **tx)
    .await
}

pub(super) async fn insert_receipt(
    tx: &mut Transaction<'static, Postgres>,
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
    pool: &PgPool,
    dl: &DeadLetter<'_>,
    seq: i64,
    headers: &str,
) -> Result<(), sqlx::Error> {
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
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn receipt_count(pool: &PgPool, consumer: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM idem_receipts WHERE consumer = $1")
        .bind(consumer)
        .fetch_one(pool)
        .await
}

/// A NULL parameter with no declared type (OID 0): PostgreSQL infers the
/// type from the statement, so `NULL` fits any column. (Binding `None::<i64>`
/// would declare `int8` and fail against a text column.)
struct UntypedNull;

impl sqlx::Type<Postgres> for UntypedNull {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(0))
    }
}

impl sqlx::Encode<'_, Postgres> for UntypedNull {
    fn encode_by_ref(&self, _buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        Ok(IsNull::Yes)
    }
}

/// Binds guest values in order: integer → `int8`, float → `float8`, text →
/// `text`, bytes → `bytea`, boolean → `bool`, null → untyped.
fn bind<'q>(
    mut q: Query<'q, Postgres, PgArguments>,
    params: &[SqlValue],
) -> Query<'q, Postgres, PgArguments> {
    for p in params {
        q = match p {
            SqlValue::Null => q.bind(UntypedNull),
            SqlValue::Integer(i) => q.bind(*i),
            SqlValue::Float(f) => q.bind(*f),
            SqlValue::Text(s) => q.bind(s.as_str()),
            SqlValue::Bytes(b) => q.bind(b.as_slice()),
            SqlValue::Boolean(b) => q.bind(*b),
        };
    }
    q
}

pub(super) async fn execute(
    tx: &mut Transaction<'static, Postgres>,
    sql: &CheckedSql,
    params: &[SqlValue],
) -> Result<u64, StatementError> {
    let conn: &mut PgConnection = tx;
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
    tx: &mut Transaction<'static, Postgres>,
    sql: &CheckedSql,
    params: &[SqlValue],
    bounds: ResultBounds,
) -> Result<Rows, StatementError> {
    let conn: &mut PgConnection = tx;
    sqlx::raw_sql(SAVEPOINT)
        .execute(&mut *conn)
        .await
        .map_err(|e| savepoint_failed(&e))?;
    let mut largest_row = 0;
    let result = async {
        let mut stream = bind(sqlx::query(sql.to_sqlx()), params).fetch(&mut *conn);
        let mut out = Rows::default();
        let mut used = 0;
        while let Some(row) = stream.try_next().await.map_err(map_error)? {
            if out.rows.is_empty() {
                out.columns = row.columns().iter().map(|c| c.name().to_owned()).collect();
            }
            let raw = raw_size(&row);
            largest_row = largest_row.max(raw);
            bounds.admit_raw(raw, used)?;
            bounds.push(&mut out, decode_row(&row)?, &mut used)?;
        }
        Ok::<_, DbError>(out)
    }
    .await;
    finish(conn, result.is_ok()).await?;
    if largest_row > SHRINK_AFTER_ROW_BYTES {
        // The connection's read buffer grew to hold the row and would keep
        // that capacity while pooled.
        sqlx::Connection::shrink_buffers(conn);
    }
    Ok(result?)
}

/// A row larger than this (as sent) leaves the connection's read buffer
/// that large; it is given back after the statement.
const SHRINK_AFTER_ROW_BYTES: usize = 1 << 20;

/// Releases the statement's savepoint, or rolls back to it after an error.
/// This is also the check that the statement left the host's transaction
/// open: outside a transaction block PostgreSQL refuses both (SQLSTATE 25P01).
async fn finish(conn: &mut PgConnection, ok: bool) -> Result<(), StatementError> {
    let sql = if ok { RELEASE } else { UNDO };
    sqlx::raw_sql(sql)
        .execute(conn)
        .await
        .map(|_| ())
        .map_err(|e| savepoint_failed(&e))
}

/// The bytes of a row's values as PostgreSQL sent them (NULL: none).
fn raw_size(row: &PgRow) -> usize {
    (0..row.len())
        .filter_map(|i| row.try_get_raw(i).ok())
        .filter_map(|raw| raw.as_bytes().ok().map(<[u8]>::len))
        .sum()
}

fn decode_row(row: &PgRow) -> Result<Vec<SqlValue>, DbError> {
    let mut values = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let raw = row.try_get_raw(i).map_err(map_error)?;
        values.push(decode_value(column.name(), column.type_info(), raw)?);
    }
    Ok(values)
}

/// The column types idem decodes, by OID (stable built-in OIDs, `pg_type.h`).
#[derive(Clone, Copy)]
enum PgKind {
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Text,
    Bytea,
    Bool,
}

fn pg_kind(ty: &PgTypeInfo) -> Option<PgKind> {
    Some(match ty.oid()?.0 {
        21 => PgKind::Int2,
        23 => PgKind::Int4,
        20 => PgKind::Int8,
        700 => PgKind::Float4,
        701 => PgKind::Float8,
        // text, varchar, bpchar (char(n)), name, unknown
        25 | 1043 | 1042 | 19 | 705 => PgKind::Text,
        17 => PgKind::Bytea,
        16 => PgKind::Bool,
        _ => return None,
    })
}

/// One value by its column's type; unsupported types are refused even when
/// the value is NULL, so a query's success never depends on its data.
fn decode_value(column: &str, ty: &PgTypeInfo, raw: PgValueRef<'_>) -> Result<SqlValue, DbError> {
    let Some(kind) = pg_kind(ty) else {
        return Err(DbError {
            kind: DbErrorKind::Other,
            message: format!(
                "column `{column}` has type {}; cast it in SQL (e.g. ::text or ::bigint)",
                ty.name()
            ),
        });
    };
    if raw.is_null() {
        return Ok(SqlValue::Null);
    }
    let decoded: Result<SqlValue, BoxDynError> = match kind {
        PgKind::Int2 => <i16 as Decode<Postgres>>::decode(raw).map(|v| SqlValue::Integer(v.into())),
        PgKind::Int4 => <i32 as Decode<Postgres>>::decode(raw).map(|v| SqlValue::Integer(v.into())),
        PgKind::Int8 => <i64 as Decode<Postgres>>::decode(raw).map(SqlValue::Integer),
        PgKind::Float4 => <f32 as Decode<Postgres>>::decode(raw).map(|v| SqlValue::Float(v.into())),
        PgKind::Float8 => <f64 as Decode<Postgres>>::decode(raw).map(SqlValue::Float),
        PgKind::Text => <String as Decode<Postgres>>::decode(raw).map(SqlValue::Text),
        PgKind::Bytea => <Vec<u8> as Decode<Postgres>>::decode(raw).map(SqlValue::Bytes),
        PgKind::Bool => <bool as Decode<Postgres>>::decode(raw).map(SqlValue::Boolean),
    };
    decoded.map_err(|e| DbError {
        kind: DbErrorKind::Other,
        message: one_line(&format!(
            "cannot decode column `{column}` ({}): {e}",
            ty.name()
        )),
    })
}

/// Kind from the SQLSTATE: 23505 unique, other 23xxx constraint, 42501
/// denied, 42601 syntax, anything else (and non-database errors) other.
fn map_error(e: sqlx::Error) -> DbError {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let kind = match code.as_str() {
                "23505" => DbErrorKind::UniqueViolation,
                c if c.starts_with("23") => DbErrorKind::ConstraintViolation,
                "42501" => DbErrorKind::Denied,
                "42601" => DbErrorKind::Syntax,
                _ => DbErrorKind::Other,
            };
            DbError {
                kind,
                message: one_line(&format!("{} (SQLSTATE {code})", db.message())),
            }
        }
        _ => DbError {
            kind: DbErrorKind::Other,
            message: one_line(&e.to_string()),
        },
    }
}

/// `SET LOCAL statement_timeout` for the rest of `tx`, in whole milliseconds
/// (at least 1: 0 would mean no timeout). PostgreSQL cancels a statement that
/// runs longer with SQLSTATE 57014 (query_canceled).
pub(super) async fn set_statement_timeout(
    tx: &mut Transaction<'static, Postgres>,
    timeout: Duration,
) -> Result<(), sqlx::Error> {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128).to_string();
    sqlx::query("SELECT set_config('statement_timeout', $1, true)")
        .bind(ms)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
