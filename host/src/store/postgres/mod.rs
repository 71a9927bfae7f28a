//! PostgreSQL: the pool and the transaction, with the inherent methods every
//! backend has (the store dispatches to them; see `store/mod.rs`), and the
//! dialect SQL they send. Host tables in `schema`, values in `values`,
//! SQLSTATEs in `codes`, the handler roles in `role`.

mod batch;
pub(super) mod codes;
mod deploy_marks;
mod durability;
mod role;
mod schema;
mod values;

use super::sql::{self, decode_dead_letter};
use super::statement::ResultBounds;
use super::{DeadLetter, DeadLetterRow, sqlite_raw};
use crate::sql_value::{CheckedSql, DbError, DbErrorKind, Rows};
use crate::store::{Backend, one_line};
use codes::map_error;
use futures::TryStreamExt as _;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Column as _, Postgres, Row as _, Transaction};
use std::time::Duration;
use values::{bind, decode_row, raw_size};

/// Undoes whatever session state a connection may carry into its next use,
/// run when it returns to the pool (every message, every host statement).
/// The guard lets no guest statement change settings, roles, locks or
/// session objects; this is the second line. Prepared statements are kept:
/// they are sqlx's statement cache, and guests cannot create any.
/// `pg_advisory_unlock_all` drops session-level advisory locks (the prune
/// lock is transaction-scoped, so a host never holds one here).
const RESET_SESSION: &str = "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; \
    UNLISTEN *; SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES";

/// `failed_at` as Unix milliseconds, with the other dead-letter columns
/// ([`decode_dead_letter`]).
macro_rules! dead_letter_columns {
    () => {
        "id, consumer, message_id, stream, stream_sequence, subject, reason, headers, payload, \
         (extract(epoch FROM failed_at) * 1000)::bigint AS failed_at_ms, published_ns"
    };
}

/// A row larger than this (as sent) leaves the connection's read buffer
/// that large; it is given back after the statement.
const SHRINK_AFTER_ROW_BYTES: usize = 1 << 20;

/// A PostgreSQL pool.
pub struct Pool(PgPool);

/// A PostgreSQL transaction (`BEGIN`, read committed).
pub struct Tx {
    tx: Transaction<'static, Postgres>,
    /// The largest row (bytes as sent) the last query read; see
    /// [`SHRINK_AFTER_ROW_BYTES`].
    largest_row: usize,
    /// The handler's role, entered before the next guest statement or SQL
    /// guard catalog query ([`Tx::enter_role`]).
    pending_role: Option<String>,
    /// The handler's role was entered in this transaction.
    role_entered: bool,
    /// A guest statement failed on a lock conflict since the last
    /// [`Tx::take_conflict`].
    conflict: bool,
    /// A host statement sent outside any savepoint failed (the role switch
    /// or the guard's catalog query), which aborts the transaction: why.
    /// PostgreSQL answers a later COMMIT with ROLLBACK and no error (and
    /// sqlx does not read the answer), so [`Tx::commit`] refuses instead.
    aborted: Option<String>,
}

/// The prune lock's session: it holds the session advisory lock
/// [`crate::store::PRUNE_LOCK_KEY`].
pub struct PruneLock(Option<PoolConnection<Postgres>>);

impl super::Database {
    /// The PostgreSQL pool, for tests and tools that run SQL of their own
    /// (never a guest's); `None` on another database.
    pub fn postgres_pool(&self) -> Option<&PgPool> {
        match &self.0 {
            Backend::Postgres(p) => Some(&p.0),
            _ => None,
        }
    }
}

impl super::Tx {
    /// The PostgreSQL transaction, for tests and tools that run SQL of their
    /// own in it (never a guest's); `None` on another database.
    pub fn postgres_tx(&mut self) -> Option<&mut Transaction<'static, Postgres>> {
        match &mut self.0 {
            Backend::Postgres(t) => Some(&mut t.tx),
            _ => None,
        }
    }
}

impl Pool {
    pub(super) async fn connect(url: &str, max_connections: u32) -> Result<Self, sqlx::Error> {
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
                Box::pin(
                    async move { Ok(sqlx::raw_sql(RESET_SESSION).execute(conn).await.is_ok()) },
                )
            })
            .connect_with(options)
            .await
            .map(Pool)
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

    /// `SELECT 1` on a pooled connection.
    pub(super) async fn probe(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1").execute(&self.0).await.map(drop)
    }

    pub(super) async fn begin(&self) -> Result<super::Tx, sqlx::Error> {
        Ok(super::Tx(
            Backend::Postgres(Tx {
                tx: self.0.begin().await?,
                largest_row: 0,
                pending_role: None,
                role_entered: false,
                conflict: false,
                aborted: None,
            }),
            super::Savepoints::default(),
        ))
    }

    /// `BEGIN; SET LOCAL statement_timeout = <ms>` as one simple query: one
    /// round trip. The timeout is in whole milliseconds (at least 1: 0 would
    /// mean none); PostgreSQL cancels a statement that runs longer with
    /// SQLSTATE 57014 (query_canceled).
    pub(super) async fn begin_bounded(&self, timeout: Duration) -> Result<super::Tx, sqlx::Error> {
        self.begin_limited(timeout, None).await
    }

    /// [`Pool::begin_bounded`], and with `lock_wait` also `SET LOCAL
    /// lock_timeout` in the same round trip: a statement that waits longer
    /// for a lock fails with SQLSTATE 55P03 (lock_not_available).
    pub(super) async fn begin_limited(
        &self,
        timeout: Duration,
        lock_wait: Option<Duration>,
    ) -> Result<super::Tx, sqlx::Error> {
        let ms = |d: Duration| d.as_millis().clamp(1, i32::MAX as u128);
        let mut begin = format!("BEGIN; SET LOCAL statement_timeout = {}", ms(timeout));
        if let Some(wait) = lock_wait {
            begin.push_str(&format!("; SET LOCAL lock_timeout = {}", ms(wait)));
        }
        Ok(super::Tx(
            Backend::Postgres(Tx {
                // Numbers printed by the host: no outside text.
                tx: self.0.begin_with(AssertSqlSafe(begin)).await?,
                largest_row: 0,
                pending_role: None,
                role_entered: false,
                conflict: false,
                aborted: None,
            }),
            super::Savepoints::default(),
        ))
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

    /// Creates or updates the handler's role; returns the handler's other
    /// roles (other grant sets), `role (tables)`.
    pub(super) async fn prepare_role(
        &self,
        role: &str,
        handler: &str,
        tables: &[String],
    ) -> Result<Option<Vec<String>>, sqlx::Error> {
        role::prepare(&self.0, role, handler, tables)
            .await
            .map(Some)
    }

    /// The connecting user's name, and whether it is a superuser (who can leave
    /// any role it switches to, so a handler role is no boundary for it).
    pub(super) async fn session_user(&self) -> Result<Option<(String, bool)>, sqlx::Error> {
        sqlx::query_as("SELECT rolname::text, rolsuper FROM pg_roles WHERE rolname = session_user")
            .fetch_one(&self.0)
            .await
            .map(Some)
    }

    pub(super) async fn dead_letter(
        &self,
        dl: &DeadLetter<'_>,
        seq: i64,
        headers: &str,
    ) -> Result<(), sqlx::Error> {
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
            .execute(&self.0)
            .await?;
        Ok(())
    }

    /// `(rows, oldest published_ms)`: the planner's estimate of the
    /// consumer's receipts (the `rows=` of the plan's top node, from the
    /// statistics ANALYZE keeps; no row is read) and the oldest publish time
    /// through the `(consumer, published_ms)` index.
    pub(super) async fn receipt_gauges(
        &self,
        consumer: &str,
    ) -> Result<(i64, Option<i64>), sqlx::Error> {
        let plan: Vec<String> =
            sqlx::query_scalar("EXPLAIN SELECT 1 FROM idem_receipts WHERE consumer = $1")
                .bind(consumer)
                .fetch_all(&self.0)
                .await?;
        let rows = plan
            .first()
            .and_then(|top| top.split("rows=").nth(1))
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|r| r.parse::<i64>().ok())
            .unwrap_or(0);
        let oldest = sqlx::query_scalar(sql::OLDEST_RECEIPT)
            .bind(consumer)
            .fetch_one(&self.0)
            .await?;
        Ok((rows, oldest))
    }

    pub(super) async fn receipt_count(&self, consumer: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(sql::RECEIPT_COUNT)
            .bind(consumer)
            .fetch_one(&self.0)
            .await
    }

    /// On the connection's `search_path`.
    pub(super) async fn has_host_tables(&self) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT to_regclass('idem_receipts') IS NOT NULL
                        AND to_regclass('idem_dead_letters') IS NOT NULL",
        )
        .fetch_one(&self.0)
        .await
    }

    pub(super) async fn list_dead_letters(
        &self,
        consumer: Option<&str>,
    ) -> Result<Vec<DeadLetterRow>, sqlx::Error> {
        sqlx::query(concat!(
            "SELECT ",
            dead_letter_columns!(),
            " FROM idem_dead_letters WHERE $1::text IS NULL OR consumer = $1 ORDER BY id"
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
            "SELECT stream_sequence, module_digest, (extract(epoch FROM processed_at) * 1000)::bigint, published_ms FROM idem_receipts WHERE consumer = $1 AND message_id = $2",
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

    /// `pg_try_advisory_lock` on a session of its own, not waiting.
    pub(super) async fn try_prune_lock(&self) -> Result<Option<super::PruneLock>, sqlx::Error> {
        let mut conn = self.0.acquire().await?;
        let got = sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
            .bind(super::PRUNE_LOCK_KEY)
            .fetch_one(&mut *conn)
            .await?;
        Ok(got.then_some(super::PruneLock(Backend::Postgres(PruneLock(Some(conn))))))
    }
}

impl PruneLock {
    pub(super) async fn release(mut self) -> Result<(), sqlx::Error> {
        let Some(mut conn) = self.0.take() else {
            return Ok(());
        };
        let unlocked = sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock($1)")
            .bind(super::PRUNE_LOCK_KEY)
            .fetch_one(&mut *conn)
            .await;
        match unlocked {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => {
                // Unknown state: close the session rather than pool it.
                conn.close_on_drop();
                unlocked.map(|_| ())
            }
        }
    }
}

impl Drop for PruneLock {
    fn drop(&mut self) {
        if let Some(mut conn) = self.0.take() {
            conn.close_on_drop();
        }
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
            .execute(&mut *self.tx)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// PostgreSQL has no bound on a value's size to set: results are counted
    /// as they arrive ([`Tx::query`]).
    pub(super) async fn bound_guest_values(
        &mut self,
        _max_value_bytes: usize,
    ) -> Result<(), sqlx::Error> {
        Ok(())
    }

    /// Remembers `role` for the next guest statement or guard catalog
    /// query; sends nothing.
    pub(super) async fn enter_role(&mut self, role: &str) -> Result<(), sqlx::Error> {
        self.pending_role = Some(role.to_owned());
        Ok(())
    }

    /// Enters the pending role, if any, on its own. Forgotten only once
    /// entered: after a failure the transaction is aborted (PostgreSQL
    /// refuses every later statement), so nothing runs as the host's user.
    async fn flush_role(&mut self) -> Result<(), sqlx::Error> {
        if let Some(role) = &self.pending_role {
            let entered = sqlx::raw_sql(AssertSqlSafe(role::enter_sql(role)))
                .execute(&mut *self.tx)
                .await;
            if let Err(e) = entered {
                self.aborted = Some(format!("the switch to the handler's role failed: {e}"));
                return Err(e);
            }
            self.pending_role = None;
            self.role_entered = true;
        }
        Ok(())
    }

    /// Runs one of the host's own statements (the savepoint's), after the
    /// pending role's switch in the same round trip.
    pub(super) async fn run_host_sql(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        match &self.pending_role {
            Some(role) => {
                let both = format!("{}; {sql}", role::enter_sql(role));
                sqlx::raw_sql(AssertSqlSafe(both))
                    .execute(&mut *self.tx)
                    .await?;
                self.pending_role = None;
                self.role_entered = true;
            }
            None => {
                sqlx::raw_sql(sql).execute(&mut *self.tx).await?;
            }
        }
        Ok(())
    }

    /// Always `true` without asking: the release before the next statement
    /// is the check (outside a transaction block PostgreSQL refuses it with
    /// SQLSTATE 25P01; `statement` module docs).
    pub(super) async fn still_open(&mut self) -> Result<bool, sqlx::Error> {
        Ok(true)
    }

    pub(super) async fn execute(
        &mut self,
        sql: &CheckedSql,
        params: &[crate::sql_value::SqlValue],
    ) -> Result<u64, DbError> {
        self.flush_role().await.map_err(map_error)?;
        let done = bind(sqlx::query(AssertSqlSafe(sql.shared_text())), params)
            .execute(&mut *self.tx)
            .await;
        match done {
            Ok(done) => Ok(done.rows_affected()),
            Err(e) => {
                self.note_conflict(&e);
                Err(map_error(e))
            }
        }
    }

    /// Rows are counted as they arrive, each before it is decoded.
    pub(super) async fn query(
        &mut self,
        sql: &CheckedSql,
        params: &[crate::sql_value::SqlValue],
        bounds: ResultBounds,
    ) -> Result<Rows, DbError> {
        self.flush_role().await.map_err(map_error)?;
        let conn: &mut PgConnection = &mut self.tx;
        let largest_row = &mut self.largest_row;
        let conflict = &mut self.conflict;
        let mut stream =
            bind(sqlx::query(AssertSqlSafe(sql.shared_text())), params).fetch(&mut *conn);
        let mut out = Rows::default();
        let mut used = 0;
        while let Some(row) = stream.try_next().await.map_err(|e| {
            *conflict |= codes::is_conflict(&e);
            map_error(e)
        })? {
            if out.rows.is_empty() {
                out.columns = row.columns().iter().map(|c| c.name().to_owned()).collect();
            }
            let raw = raw_size(&row);
            *largest_row = (*largest_row).max(raw);
            bounds.admit_raw(raw, used)?;
            bounds.push(&mut out, decode_row(&row)?, &mut used)?;
        }
        Ok(out)
    }

    /// After a query whose savepoint was closed: a connection that read a
    /// row over [`SHRINK_AFTER_ROW_BYTES`] gives back its read buffer, which
    /// grew to hold the row and would keep that capacity while pooled.
    pub(super) fn after_query(&mut self) {
        if std::mem::take(&mut self.largest_row) > SHRINK_AFTER_ROW_BYTES {
            sqlx::Connection::shrink_buffers(&mut *self.tx);
        }
    }

    pub(super) async fn compile_judged(
        &mut self,
        _sql: &str,
        _authorize: &mut sqlite_raw::SchemaPolicy<'_>,
        _flag_opcodes: &[&str],
    ) -> Result<Result<sqlite_raw::Compiled, sqlite_raw::CompileError>, DbError> {
        Err(DbError {
            kind: DbErrorKind::Other,
            message: "SQLite statements cannot be compiled on PostgreSQL".into(),
        })
    }

    /// See [`crate::store::Tx::row_functions`]. A function with defaults
    /// counts when one argument is enough to call it. Only catalogs PUBLIC may
    /// read, so it works as a handler role too.
    pub(super) async fn row_functions(
        &mut self,
        names: &[String],
        tables: &[String],
    ) -> Result<Vec<String>, DbError> {
        // Any failure here aborts the transaction (`aborted`), and is
        // `Other` for the guard, which never keeps such a verdict.
        self.flush_role().await.map_err(|e| DbError {
            kind: DbErrorKind::Other,
            message: one_line(&format!("cannot switch to the handler's role: {e}")),
        })?;
        let found = sqlx::query_scalar(
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
        .fetch_all(&mut *self.tx)
        .await;
        found.map_err(|e| {
            self.aborted = Some(format!("the SQL guard's catalog query failed: {e}"));
            DbError {
                kind: DbErrorKind::Other,
                message: one_line(&format!("cannot read the catalogs: {e}")),
            }
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
        .fetch_optional(&mut *self.tx)
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
            .execute(&mut *self.tx)
            .await?
            .rows_affected())
    }

    /// Refuses (and rolls back) a transaction a failed host statement
    /// aborted (`aborted`): its COMMIT would roll back without an error.
    pub(super) async fn commit(self) -> Result<(), sqlx::Error> {
        if let Some(why) = self.aborted {
            let _ = self.tx.rollback().await;
            return Err(sqlx::Error::InvalidArgument(one_line(&format!(
                "rolled back, not committed: {why}"
            ))));
        }
        self.tx.commit().await
    }

    pub(super) async fn rollback(self) -> Result<(), sqlx::Error> {
        self.tx.rollback().await
    }
}
