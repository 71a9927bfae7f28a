//! A backend's pool (`Pool`), its prune lock and its optional roles: see
//! the `backend` module docs.

use super::{HostRow, Param, Transaction};
use crate::store::deploy_marks::{RAISE_MARK, SELECT_MARK};
use crate::store::durability::CommitSettings;
use crate::store::{DbKind, DeadLetter, DeadLetterRow, sql};
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{AssertSqlSafe, SqlSafeStr as _, SqlStr};
use std::time::Duration;

/// A backend's connection pool: connecting, the host tables, beginning a
/// message's transaction, and the operator's queries.
pub(in crate::store) trait Pool: Send + Sync + Sized + 'static {
    /// The backend's transaction, from [`Pool::begin`].
    type Tx: Transaction;
    /// The backend's prune lock, from [`Pool::try_prune_lock`].
    type PruneLock: PruneLock;
    /// A row of a host query ([`Pool::fetch_all`]).
    type Row: HostRow;

    /// Which database this is.
    const KIND: DbKind;

    /// Selects the dead letters in id order, the columns
    /// [`HostRow::dead_letter`] reads (`failed_at` as Unix ms): every
    /// consumer's when `$1` (text) is NULL, else consumer `$1`'s.
    const LIST_DEAD_LETTERS: &'static str;

    /// Selects the dead letter with id `$1`, columns as
    /// [`Pool::LIST_DEAD_LETTERS`].
    const DEAD_LETTER_BY_ID: &'static str;

    /// Selects consumer `$1`'s receipt for message `$2`: `stream_sequence,
    /// module_digest, processed_at` (as Unix ms)`, published_ms`.
    const SELECT_RECEIPT: &'static str;

    /// Selects the `message_id` of consumer `$1`'s receipts whose message
    /// id is in `$2`, a JSON array of strings (one statement text for any
    /// number of ids, so one prepared statement).
    const SELECT_EXISTING_RECEIPTS: &'static str;

    /// Opens a pool of up to `max_connections` (at least 1) to `url`, one
    /// of this backend's [`crate::store::SCHEMES`]; `lock_wait` is how long a
    /// statement waits for a database-wide write lock (SQLite's busy
    /// timeout), where the backend has one.
    ///
    /// # Errors
    /// The URL does not parse or the database cannot be reached.
    async fn connect(
        url: &str,
        max_connections: u32,
        lock_wait: Duration,
    ) -> Result<Self, sqlx::Error>;

    /// Creates the host tables and their indexes if missing and upgrades
    /// those of earlier versions (`schema.rs`); idempotent and safe when
    /// several hosts start at once.
    ///
    /// # Errors
    /// A DDL statement fails.
    async fn prepare_host_tables(&self) -> Result<(), sqlx::Error>;

    /// Runs `migrator` (a handler's migrations, its own record table set).
    ///
    /// # Errors
    /// A migration fails, or an applied one changed.
    async fn migrate(&self, migrator: &Migrator) -> Result<(), MigrateError>;

    /// One check that the database can take a message's transaction now
    /// (a file that can be read but not written is not).
    ///
    /// # Errors
    /// It cannot.
    async fn probe(&self) -> Result<(), sqlx::Error>;

    /// Begins a message's transaction (on a single-writer database, taking
    /// the write lock at once).
    ///
    /// # Errors
    /// No connection, or BEGIN fails.
    async fn begin(&self) -> Result<Self::Tx, sqlx::Error>;

    /// [`Pool::begin`] with every statement bounded by `timeout` (whole
    /// milliseconds, at least 1) and, where the database waits on row
    /// locks, each lock wait by `lock_wait`.
    ///
    /// # Errors
    /// As [`Pool::begin`], or a bound cannot be set.
    async fn begin_limited(
        &self,
        timeout: Duration,
        lock_wait: Option<Duration>,
    ) -> Result<Self::Tx, sqlx::Error>;

    /// Closes the pool, waiting for connections to be returned.
    async fn close(&self);

    /// What the pool's connections commit under, one entry per connection
    /// read (at least one); `store::durability` judges them.
    ///
    /// # Errors
    /// A connection or a settings query fails.
    async fn commit_settings(&self) -> Result<Vec<CommitSettings>, sqlx::Error>;

    /// Whether both `idem_receipts` and `idem_dead_letters` exist.
    ///
    /// # Errors
    /// The catalog query fails.
    async fn has_host_tables(&self) -> Result<bool, sqlx::Error>;

    /// `(rows, oldest published_ms)` of `consumer`'s receipts, cheap on a
    /// large table: `rows` may be an estimate (it is read as 0 when there is
    /// no oldest), `oldest` is exact (`None`: no receipt).
    ///
    /// # Errors
    /// A query fails.
    async fn receipt_gauges(&self, consumer: &str) -> Result<(i64, Option<i64>), sqlx::Error>;

    /// Tries to become the one pruner of the database, without waiting:
    /// `None` when another session is (always got where there is one writer).
    ///
    /// # Errors
    /// No connection, or the lock query fails.
    async fn try_prune_lock(&self) -> Result<Option<Self::PruneLock>, sqlx::Error>;

    /// Whether `e` says that a table the statement names does not exist.
    fn is_undefined_table(e: &sqlx::Error) -> bool;

    /// Runs one host statement `sql` with `params` on a pooled connection
    /// (autocommit); the rows it affected.
    ///
    /// # Errors
    /// The statement fails.
    async fn run(&self, sql: SqlStr, params: &[Param<'_>]) -> Result<u64, sqlx::Error>;

    /// [`Pool::run`] in a write transaction of its own, durable when this
    /// returns (on a single-writer database taking the write lock first).
    ///
    /// # Errors
    /// The statement or the COMMIT fails.
    async fn run_alone(&self, sql: SqlStr, params: &[Param<'_>]) -> Result<u64, sqlx::Error>;

    /// Every row of host query `sql` with `params`.
    ///
    /// # Errors
    /// The query fails.
    async fn fetch_all(
        &self,
        sql: SqlStr,
        params: &[Param<'_>],
    ) -> Result<Vec<Self::Row>, sqlx::Error>;

    /// The first row of host query `sql` with `params`, `None` without rows.
    ///
    /// # Errors
    /// The query fails.
    async fn fetch_optional(
        &self,
        sql: SqlStr,
        params: &[Param<'_>],
    ) -> Result<Option<Self::Row>, sqlx::Error>;

    /// Which database this is ([`Pool::KIND`]).
    fn kind(&self) -> DbKind {
        Self::KIND
    }

    /// [`Pool::begin_limited`] without a lock wait.
    ///
    /// # Errors
    /// As [`Pool::begin_limited`].
    async fn begin_bounded(&self, timeout: Duration) -> Result<Self::Tx, sqlx::Error> {
        self.begin_limited(timeout, None).await
    }

    /// The first row of `sql`.
    ///
    /// # Errors
    /// The query fails, or [`sqlx::Error::RowNotFound`] without rows.
    async fn fetch_one(&self, sql: SqlStr, params: &[Param<'_>]) -> Result<Self::Row, sqlx::Error> {
        self.fetch_optional(sql, params)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// Whether `sql` (host-made, no guest text) returns a row.
    ///
    /// # Errors
    /// The query fails.
    async fn has_rows(&self, sql: String) -> Result<bool, sqlx::Error> {
        let row = self
            .fetch_optional(AssertSqlSafe(sql).into_sql_str(), &[])
            .await?;
        Ok(row.is_some())
    }

    /// Writes dead letter `dl` at stream sequence `seq` with `headers` (the
    /// JSON text) in its own transaction ([`Pool::run_alone`]); a second
    /// write of the same stored message changes nothing.
    ///
    /// # Errors
    /// The insert or its COMMIT fails.
    async fn dead_letter(
        &self,
        dl: &DeadLetter<'_>,
        seq: i64,
        headers: &str,
    ) -> Result<(), sqlx::Error> {
        let params = [
            Param::Text(dl.consumer),
            Param::OptText(dl.message_id),
            Param::Text(dl.stream),
            Param::Int(seq),
            Param::Int(dl.published_ns),
            Param::Text(dl.subject),
            Param::Text(dl.reason),
            Param::Text(headers),
            Param::Bytes(dl.payload),
        ];
        self.run_alone(sql::INSERT_DEAD_LETTER.into_sql_str(), &params)
            .await
            .map(drop)
    }

    /// Dead letters in id order: every consumer's, or only `consumer`'s.
    ///
    /// # Errors
    /// The query fails or a row does not decode.
    async fn list_dead_letters(
        &self,
        consumer: Option<&str>,
    ) -> Result<Vec<DeadLetterRow>, sqlx::Error> {
        let sql = Self::LIST_DEAD_LETTERS.into_sql_str();
        let rows = self.fetch_all(sql, &[Param::OptText(consumer)]).await?;
        rows.iter().map(HostRow::dead_letter).collect()
    }

    /// The dead letter with row id `id`, `None` if there is none.
    ///
    /// # Errors
    /// The query fails or the row does not decode.
    async fn dead_letter_by_id(&self, id: i64) -> Result<Option<DeadLetterRow>, sqlx::Error> {
        let sql = Self::DEAD_LETTER_BY_ID.into_sql_str();
        let row = self.fetch_optional(sql, &[Param::Int(id)]).await?;
        row.as_ref().map(HostRow::dead_letter).transpose()
    }

    /// Deletes the dead letter with row id `id`; how many rows (0 or 1).
    ///
    /// # Errors
    /// The statement fails.
    async fn drop_dead_letter(&self, id: i64) -> Result<u64, sqlx::Error> {
        let sql = sql::DROP_DEAD_LETTER.into_sql_str();
        self.run(sql, &[Param::Int(id)]).await
    }

    /// Deletes every dead letter of `consumer`; how many.
    ///
    /// # Errors
    /// The statement fails.
    async fn drop_dead_letters(&self, consumer: &str) -> Result<u64, sqlx::Error> {
        let sql = sql::DROP_DEAD_LETTERS.into_sql_str();
        self.run(sql, &[Param::Text(consumer)]).await
    }

    /// `consumer`'s receipt for `message_id`: `(stream_sequence,
    /// module_digest, processed_at ms, published_ms)`, `None` if none.
    ///
    /// # Errors
    /// The query fails or the row does not decode.
    async fn receipt(
        &self,
        consumer: &str,
        message_id: &str,
    ) -> Result<Option<(i64, String, i64, i64)>, sqlx::Error> {
        let sql = Self::SELECT_RECEIPT.into_sql_str();
        let params = [Param::Text(consumer), Param::Text(message_id)];
        match self.fetch_optional(sql, &params).await? {
            None => Ok(None),
            Some(r) => Ok(Some((r.int(0)?, r.text(1)?, r.int(2)?, r.int(3)?))),
        }
    }

    /// Which of `message_ids` have a receipt of `consumer` (committed
    /// ones: read outside any transaction), in no particular order.
    ///
    /// # Errors
    /// The query fails or a row does not decode.
    async fn existing_receipts(
        &self,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<Vec<String>, sqlx::Error> {
        existing_receipts_fetched(self, consumer, &ids_json(message_ids)?).await
    }

    /// `(count, oldest published_ms, newest published_ms)` of `consumer`'s
    /// receipts, only those of component `digest` when given.
    ///
    /// # Errors
    /// The query fails.
    async fn receipt_summary(
        &self,
        consumer: &str,
        digest: Option<&str>,
    ) -> Result<(i64, Option<i64>, Option<i64>), sqlx::Error> {
        let r = match digest {
            None => {
                let sql = sql::RECEIPT_SUMMARY.into_sql_str();
                self.fetch_one(sql, &[Param::Text(consumer)]).await?
            }
            Some(d) => {
                let sql = sql::RECEIPT_SUMMARY_BY_DIGEST.into_sql_str();
                self.fetch_one(sql, &[Param::Text(consumer), Param::Text(d)])
                    .await?
            }
        };
        Ok((r.int(0)?, r.opt_int(1)?, r.opt_int(2)?))
    }

    /// How many receipts `consumer` has (exact).
    ///
    /// # Errors
    /// The query fails.
    async fn receipt_count(&self, consumer: &str) -> Result<i64, sqlx::Error> {
        let sql = sql::RECEIPT_COUNT.into_sql_str();
        self.fetch_one(sql, &[Param::Text(consumer)]).await?.int(0)
    }

    /// Deletes at most `chunk` of `consumer`'s receipts published before
    /// `published_before_ms` (one autocommit statement); how many.
    ///
    /// # Errors
    /// The statement fails.
    async fn prune_chunk(
        &self,
        consumer: &str,
        published_before_ms: i64,
        chunk: u32,
    ) -> Result<u64, sqlx::Error> {
        let params = [
            Param::Text(consumer),
            Param::Int(published_before_ms),
            Param::Int(i64::from(chunk)),
        ];
        self.run(sql::PRUNE_CHUNK.into_sql_str(), &params).await
    }

    /// `handler`'s deployment high-water mark: `(sequence, revision,
    /// record)`; `None` when it has none or the table is not there yet
    /// ([`Pool::is_undefined_table`]).
    ///
    /// # Errors
    /// The query fails otherwise, or the row does not decode.
    async fn deploy_mark(&self, handler: &str) -> Result<Option<(i64, i64, String)>, sqlx::Error> {
        match self
            .fetch_optional(SELECT_MARK.into_sql_str(), &[Param::Text(handler)])
            .await
        {
            Ok(None) => Ok(None),
            Ok(Some(r)) => Ok(Some((r.int(0)?, r.int(1)?, r.text(2)?))),
            Err(e) if Self::is_undefined_table(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Raises `handler`'s mark to `sequence` (its `record` at KV `revision`)
    /// unless it is there or higher; how many rows changed (1: it rose).
    ///
    /// # Errors
    /// The statement fails.
    async fn raise_deploy_mark(
        &self,
        handler: &str,
        sequence: i64,
        revision: i64,
        record: &str,
    ) -> Result<u64, sqlx::Error> {
        let params = [
            Param::Text(handler),
            Param::Int(sequence),
            Param::Int(revision),
            Param::Text(record),
        ];
        self.run(RAISE_MARK.into_sql_str(), &params).await
    }
}

/// A backend's right to prune, from [`Pool::try_prune_lock`]. Dropped
/// unreleased, whatever holds the lock is closed rather than reused.
pub(in crate::store) trait PruneLock: Send + Sized + 'static {
    /// Releases the lock.
    ///
    /// # Errors
    /// The unlock failed (its session is closed, which releases it too).
    async fn release(self) -> Result<(), sqlx::Error>;
}

/// Optional: one database role per handler and grant set (PostgreSQL).
/// Absent: no roles, nothing prepared.
pub(in crate::store) trait PoolRoles: Pool {
    /// Creates or updates `role`, `handler`'s role for `tables`, holding
    /// privileges on those tables only; the handler's other roles (other
    /// grant sets) as `role (tables)`. `None`: the database has no roles.
    ///
    /// # Errors
    /// The connecting user may not create the role or grant on a table.
    async fn prepare_role(
        &self,
        _role: &str,
        _handler: &str,
        _tables: &[String],
    ) -> Result<Option<Vec<String>>, sqlx::Error> {
        Ok(None)
    }

    /// The connecting user and whether it is a superuser (who can leave any
    /// role it switches to); `None`: the database has no users.
    ///
    /// # Errors
    /// The query fails.
    async fn session_user(&self) -> Result<Option<(String, bool)>, sqlx::Error> {
        Ok(None)
    }
}

/// `message_ids` as the JSON array [`Pool::SELECT_EXISTING_RECEIPTS`] binds.
///
/// # Errors
/// Never in practice (strings always encode); `Encode` if one did not.
pub(in crate::store) fn ids_json(message_ids: &[&str]) -> Result<String, sqlx::Error> {
    serde_json::to_string(message_ids).map_err(|e| sqlx::Error::Encode(Box::new(e)))
}

/// [`Pool::existing_receipts`] through [`Pool::fetch_all`], `ids` the JSON
/// array of the message ids ([`ids_json`]): the provided method, and a backend's fallback
/// when it overrides it.
///
/// # Errors
/// The query fails.
pub(in crate::store) async fn existing_receipts_fetched<P: Pool>(
    pool: &P,
    consumer: &str,
    ids: &str,
) -> Result<Vec<String>, sqlx::Error> {
    let sql = P::SELECT_EXISTING_RECEIPTS.into_sql_str();
    let rows = pool
        .fetch_all(sql, &[Param::Text(consumer), Param::Text(ids)])
        .await?;
    rows.iter().map(|r| r.text(0)).collect()
}
