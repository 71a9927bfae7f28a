//! PostgreSQL: the pool, the transaction and the prune lock behind the
//! `backend` traits (`store/backend.rs`), and the dialect SQL they send.
//! Host tables in `schema`, values in `values`, SQLSTATEs in `codes`, the
//! handler roles in `role`, the SQL guard's catalog question in `catalog`,
//! a batch's side in `batch`, the commit settings in `durability`.

mod batch;
mod catalog;
pub(super) mod codes;
mod durability;
pub(crate) mod listen;
mod role;
mod schema;
mod values;

use super::backend::{self, Param, bind_params};
use super::statement::ResultBounds;
use super::{Backend, DbKind, one_line, sql};
use crate::sql_value::{CheckedSql, DbError, Rows, SqlValue};
use codes::map_error;
use futures::TryStreamExt as _;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Column as _, Postgres, Row as _, SqlStr};
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

/// How long a pooled connection may sit idle before it is pinged again
/// when taken from the pool.
const IDLE_PING: Duration = Duration::from_secs(1);

/// `failed_at` as Unix milliseconds, with the other dead-letter columns
/// (`backend::HostRow::dead_letter`).
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
    tx: sqlx::Transaction<'static, Postgres>,
    /// The largest row (bytes as sent) the last query read; see
    /// [`SHRINK_AFTER_ROW_BYTES`].
    largest_row: usize,
    /// The handler's role, entered before the next guest statement or SQL
    /// guard catalog query (`TxRoles::enter_role`, module `role`).
    pending_role: Option<String>,
    /// The handler's role was entered in this transaction.
    role_entered: bool,
    /// The handler's role of this transaction, once one was given.
    role: Option<String>,
    /// A guest statement failed on a lock conflict since the last
    /// `Batch::take_conflict`.
    conflict: bool,
    /// A host statement sent outside any savepoint failed (the role switch
    /// or the guard's catalog query), which aborts the transaction: why.
    /// PostgreSQL answers a later COMMIT with ROLLBACK and no error (and
    /// sqlx does not read the answer), so `commit` refuses instead.
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
    pub fn postgres_tx(&mut self) -> Option<&mut sqlx::Transaction<'static, Postgres>> {
        match &mut self.0 {
            Backend::Postgres(t) => Some(&mut t.tx),
            _ => None,
        }
    }
}

impl Tx {
    /// A transaction just begun: no role, nothing read, nothing failed.
    fn begun(tx: sqlx::Transaction<'static, Postgres>) -> Self {
        Tx {
            tx,
            largest_row: 0,
            pending_role: None,
            role_entered: false,
            role: None,
            conflict: false,
            aborted: None,
        }
    }
}

impl Pool {
    /// `begin` (host-made SQL that starts with `BEGIN`) on a pooled
    /// connection, again on another while the one taken turns out closed
    /// since it was last used (the server restarted, or ended the backend:
    /// an I/O error or SQLSTATE class 57P), as the pool no longer pings a
    /// connection before handing it out; at most once per connection the
    /// pool may hold, plus one on a new connection.
    ///
    /// # Errors
    /// BEGIN failed otherwise, or on every try.
    async fn begin_on_live(
        &self,
        begin: String,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        let mut tries = self.0.options().get_max_connections() + 1;
        loop {
            // Numbers printed by the host: no outside text.
            match self.0.begin_with(AssertSqlSafe(begin.clone())).await {
                Err(e) if tries > 1 && codes::is_lost_connection(&e) => {
                    tracing::debug!(error = %e, "a pooled connection was closed; beginning on another");
                    tries -= 1;
                }
                done => return done,
            }
        }
    }
}

impl backend::Pool for Pool {
    type Tx = Tx;
    type PruneLock = PruneLock;
    type Row = PgRow;

    const KIND: DbKind = DbKind::Postgres;

    const LIST_DEAD_LETTERS: &'static str = concat!(
        "SELECT ",
        dead_letter_columns!(),
        " FROM idem_dead_letters WHERE $1::text IS NULL OR consumer = $1 ORDER BY id"
    );

    const DEAD_LETTER_BY_ID: &'static str = concat!(
        "SELECT ",
        dead_letter_columns!(),
        " FROM idem_dead_letters WHERE id = $1"
    );

    const SELECT_RECEIPT: &'static str = "SELECT stream_sequence, module_digest, (extract(epoch FROM processed_at) * 1000)::bigint, published_ms FROM idem_receipts WHERE consumer = $1 AND message_id = $2";

    /// The ids unpacked once into an array (an InitPlan), so the
    /// `(consumer, message_id)` key is probed with `= ANY` per id.
    const SELECT_EXISTING_RECEIPTS: &'static str = "SELECT message_id FROM idem_receipts WHERE consumer = $1 AND message_id = ANY(ARRAY(SELECT jsonb_array_elements_text($2::jsonb)))";

    /// `lock_wait` is not used: PostgreSQL waits on row locks, bounded per
    /// transaction ([`backend::Pool::begin_limited`]).
    async fn connect(
        url: &str,
        max_connections: u32,
        _lock_wait: Duration,
    ) -> Result<Self, sqlx::Error> {
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
            // A ping before a use only after the connection idled for
            // IDLE_PING (the reset below has just checked a busy one: a ping
            // each time cost a round trip a transaction). The ping runs
            // within the acquire timeout, so a connection whose peer vanished
            // without a reset fails it instead of hanging a BEGIN for TCP's
            // retransmission timeout; one closed since that is not idle yet
            // is found by `Pool::begin_on_live`.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= IDLE_PING {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
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

    async fn prepare_host_tables(&self) -> Result<(), sqlx::Error> {
        schema::prepare_host_tables(&self.0).await
    }

    async fn migrate(
        &self,
        migrator: &sqlx::migrate::Migrator,
    ) -> Result<(), sqlx::migrate::MigrateError> {
        migrator.run(&self.0).await
    }

    /// `SELECT 1` on a pooled connection.
    async fn probe(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1").execute(&self.0).await.map(drop)
    }

    async fn begin(&self) -> Result<Tx, sqlx::Error> {
        Ok(Tx::begun(self.begin_on_live("BEGIN".into()).await?))
    }

    /// `BEGIN; SET LOCAL statement_timeout = <ms>` as one simple query: one
    /// round trip. The timeout is in whole milliseconds (at least 1: 0 would
    /// mean none); PostgreSQL cancels a statement that runs longer with
    /// SQLSTATE 57014 (query_canceled). With `lock_wait` also `SET LOCAL
    /// lock_timeout` in the same round trip: a statement that waits longer
    /// for a lock fails with SQLSTATE 55P03 (lock_not_available).
    async fn begin_limited(
        &self,
        timeout: Duration,
        lock_wait: Option<Duration>,
    ) -> Result<Tx, sqlx::Error> {
        let ms = |d: Duration| d.as_millis().clamp(1, i32::MAX as u128);
        let mut begin = format!("BEGIN; SET LOCAL statement_timeout = {}", ms(timeout));
        if let Some(wait) = lock_wait {
            begin.push_str(&format!("; SET LOCAL lock_timeout = {}", ms(wait)));
        }
        Ok(Tx::begun(self.begin_on_live(begin).await?))
    }

    async fn close(&self) {
        self.0.close().await
    }

    async fn commit_settings(&self) -> Result<Vec<super::durability::CommitSettings>, sqlx::Error> {
        durability::commit_settings(&self.0).await
    }

    /// On the connection's `search_path`.
    async fn has_host_tables(&self) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT to_regclass('idem_receipts') IS NOT NULL
                        AND to_regclass('idem_dead_letters') IS NOT NULL",
        )
        .fetch_one(&self.0)
        .await
    }

    /// The planner's estimate of the consumer's receipts (the `rows=` of the
    /// plan's top node, from the statistics ANALYZE keeps; no row is read)
    /// and the oldest publish time through the `(consumer, published_ms)`
    /// index.
    async fn receipt_gauges(&self, consumer: &str) -> Result<(i64, Option<i64>), sqlx::Error> {
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

    /// `pg_try_advisory_lock` on a session of its own, not waiting.
    async fn try_prune_lock(&self) -> Result<Option<PruneLock>, sqlx::Error> {
        let mut conn = self.0.acquire().await?;
        let got = sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
            .bind(super::PRUNE_LOCK_KEY)
            .fetch_one(&mut *conn)
            .await?;
        Ok(got.then_some(PruneLock(Some(conn))))
    }

    fn is_undefined_table(e: &sqlx::Error) -> bool {
        codes::is_undefined_table(e)
    }

    async fn run(&self, sql: SqlStr, params: &[Param<'_>]) -> Result<u64, sqlx::Error> {
        let done = bind_params(sqlx::query(sql), params)
            .execute(&self.0)
            .await?;
        Ok(done.rows_affected())
    }

    /// [`backend::Pool::run`]: one autocommit statement is a transaction of
    /// its own.
    async fn run_alone(&self, sql: SqlStr, params: &[Param<'_>]) -> Result<u64, sqlx::Error> {
        self.run(sql, params).await
    }

    async fn fetch_all(
        &self,
        sql: SqlStr,
        params: &[Param<'_>],
    ) -> Result<Vec<PgRow>, sqlx::Error> {
        bind_params(sqlx::query(sql), params)
            .fetch_all(&self.0)
            .await
    }

    async fn fetch_optional(
        &self,
        sql: SqlStr,
        params: &[Param<'_>],
    ) -> Result<Option<PgRow>, sqlx::Error> {
        bind_params(sqlx::query(sql), params)
            .fetch_optional(&self.0)
            .await
    }
}

impl backend::PruneLock for PruneLock {
    /// `pg_advisory_unlock`; an unknown outcome closes the session rather
    /// than pooling it.
    async fn release(mut self) -> Result<(), sqlx::Error> {
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

impl backend::Transaction for Tx {
    type Row = PgRow;

    const KIND: DbKind = DbKind::Postgres;

    const TAKE_DEAD_LETTER: &'static str = concat!(
        "DELETE FROM idem_dead_letters WHERE id = $1 RETURNING ",
        dead_letter_columns!()
    );

    /// PostgreSQL has no bound on a value's size to set: results are counted
    /// as they arrive (`query`).
    async fn bound_guest_values(&mut self, _max_value_bytes: usize) -> Result<(), sqlx::Error> {
        Ok(())
    }

    /// Sent after the pending role's switch in the same round trip.
    async fn run_host_sql(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
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
    async fn still_open(&mut self) -> Result<bool, sqlx::Error> {
        Ok(true)
    }

    async fn execute(&mut self, sql: &CheckedSql, params: &[SqlValue]) -> Result<u64, DbError> {
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
    async fn query(
        &mut self,
        sql: &CheckedSql,
        params: &[SqlValue],
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

    /// A connection that read a row over [`SHRINK_AFTER_ROW_BYTES`] gives
    /// back its read buffer, which grew to hold the row and would keep that
    /// capacity while pooled.
    fn after_query(&mut self) {
        if std::mem::take(&mut self.largest_row) > SHRINK_AFTER_ROW_BYTES {
            sqlx::Connection::shrink_buffers(&mut *self.tx);
        }
    }

    /// Refuses (and rolls back) a transaction a failed host statement
    /// aborted (`aborted`): its COMMIT would roll back without an error.
    async fn commit(self) -> Result<(), sqlx::Error> {
        if let Some(why) = self.aborted {
            let _ = self.tx.rollback().await;
            return Err(sqlx::Error::InvalidArgument(one_line(&format!(
                "rolled back, not committed: {why}"
            ))));
        }
        self.tx.commit().await
    }

    async fn rollback(self) -> Result<(), sqlx::Error> {
        self.tx.rollback().await
    }

    async fn run(&mut self, sql: SqlStr, params: &[Param<'_>]) -> Result<u64, sqlx::Error> {
        let done = bind_params(sqlx::query(sql), params)
            .execute(&mut *self.tx)
            .await?;
        Ok(done.rows_affected())
    }

    async fn fetch_optional(
        &mut self,
        sql: SqlStr,
        params: &[Param<'_>],
    ) -> Result<Option<PgRow>, sqlx::Error> {
        bind_params(sqlx::query(sql), params)
            .fetch_optional(&mut *self.tx)
            .await
    }
}

/// SQLite's compile hook is absent here.
impl backend::CompileHook for Tx {}
