//! A backend's transaction (`Transaction`), its batch side and its
//! optional capabilities: see the `backend` module docs.

use super::{HostRow, Param};
use crate::sql_value::{CheckedSql, DbError, DbErrorKind, Rows, SqlValue};
use crate::store::batch::BatchRow;
use crate::store::statement::ResultBounds;
use crate::store::{DbKind, DeadLetterRow, Receipt, sql, sqlite_raw};
use sqlx::{SqlSafeStr as _, SqlStr};
use std::time::Duration;

/// A backend's transaction: the receipt, the guest's statements and the
/// host's savepoints (`store::statement`), COMMIT and ROLLBACK. Dropped
/// without either, it rolls back.
pub(in crate::store) trait Transaction: Send + Sized + 'static {
    /// A row of a host query ([`Transaction::fetch_optional`]).
    type Row: HostRow;

    /// Which database this is.
    const KIND: DbKind;

    /// Deletes the dead letter with id `$1` and returns it, columns as
    /// [`super::Pool::LIST_DEAD_LETTERS`].
    const TAKE_DEAD_LETTER: &'static str;

    /// Bounds what the guest's statements may create or read: no value
    /// over `max_value_bytes` bytes, where the database has such a limit
    /// (results are also counted as they arrive, [`ResultBounds`]).
    ///
    /// # Errors
    /// The connection cannot be reached.
    async fn bound_guest_values(&mut self, max_value_bytes: usize) -> Result<(), sqlx::Error>;

    /// Interrupts any statement still running at `until` (a message's
    /// deadline; `None`: no longer), where statements run on the calling
    /// thread and no timer can stop them (SQLite); until the next time
    /// budget is set. Nothing where the server bounds each statement and
    /// the caller's timeout can fire (PostgreSQL).
    ///
    /// # Errors
    /// The bound cannot be set.
    fn cap_statements(&mut self, _until: Option<std::time::Instant>) -> Result<(), sqlx::Error> {
        Ok(())
    }

    /// Runs one of the host's own statements (a savepoint's, `store::sql`),
    /// after whatever the transaction owes first (a pending role switch).
    ///
    /// # Errors
    /// The statement fails.
    async fn run_host_sql(&mut self, sql: &'static str) -> Result<(), sqlx::Error>;

    /// Whether the connection is still inside the host's transaction after
    /// a guest statement (`true` where the next savepoint's release is the
    /// check; `store::statement`).
    ///
    /// # Errors
    /// The connection cannot be reached.
    async fn still_open(&mut self) -> Result<bool, sqlx::Error>;

    /// Runs checked guest statement `sql` with `params` bound to `$1..$n`;
    /// the rows it affected.
    ///
    /// # Errors
    /// The statement fails: its kind from the backend's codes (`codes.rs`).
    async fn execute(&mut self, sql: &CheckedSql, params: &[SqlValue]) -> Result<u64, DbError>;

    /// Runs checked guest query `sql` with `params`, its rows decoded into
    /// guest values within `bounds` (rows, bytes).
    ///
    /// # Errors
    /// As [`Transaction::execute`], or a bound is passed (`Other`).
    async fn query(
        &mut self,
        sql: &CheckedSql,
        params: &[SqlValue],
        bounds: ResultBounds,
    ) -> Result<Rows, DbError>;

    /// After a query whose savepoint was closed: gives back what reading
    /// its rows left the connection holding.
    fn after_query(&mut self);

    /// Commits; only after `Ok` is the effect durable.
    ///
    /// # Errors
    /// COMMIT failed or its outcome is unknown, or the transaction was
    /// aborted by a failed host statement (rolled back instead).
    async fn commit(self) -> Result<(), sqlx::Error>;

    /// Rolls back.
    ///
    /// # Errors
    /// ROLLBACK failed.
    async fn rollback(self) -> Result<(), sqlx::Error>;

    /// Runs one host statement `sql` with `params` in this transaction (as
    /// the host's user: no pending role is entered); the rows it affected.
    ///
    /// # Errors
    /// The statement fails.
    async fn run(&mut self, sql: SqlStr, params: &[Param<'_>]) -> Result<u64, sqlx::Error>;

    /// The first row of host query `sql` with `params` in this
    /// transaction, `None` without rows.
    ///
    /// # Errors
    /// The query fails.
    async fn fetch_optional(
        &mut self,
        sql: SqlStr,
        params: &[Param<'_>],
    ) -> Result<Option<Self::Row>, sqlx::Error>;

    /// Inserts receipt `r` at stream sequence `seq` (`ON CONFLICT DO
    /// NOTHING`): `true` inserted, `false` a receipt exists.
    ///
    /// # Errors
    /// The insert fails.
    async fn insert_receipt(&mut self, r: &Receipt<'_>, seq: i64) -> Result<bool, sqlx::Error> {
        let params = [
            Param::Text(r.consumer),
            Param::Text(r.message_id),
            Param::Int(seq),
            Param::Text(r.module_digest),
            Param::Int(r.published_ms),
        ];
        let n = self
            .run(sql::INSERT_RECEIPT.into_sql_str(), &params)
            .await?;
        Ok(n == 1)
    }

    /// Records `seq` as `consumer`'s last applied stream sequence for
    /// ordering key `key` unless one at least as high is recorded
    /// ([`sql::ADVANCE_KEY_SEQUENCE`]): `true` recorded, `false` out of
    /// order.
    ///
    /// # Errors
    /// The statement fails.
    async fn advance_key_sequence(
        &mut self,
        consumer: &str,
        key: &str,
        seq: i64,
    ) -> Result<bool, sqlx::Error> {
        let params = [Param::Text(consumer), Param::Text(key), Param::Int(seq)];
        let n = self
            .run(sql::ADVANCE_KEY_SEQUENCE.into_sql_str(), &params)
            .await?;
        Ok(n == 1)
    }

    /// Deletes `consumer`'s receipt for `message_id`; how many (0 or 1).
    ///
    /// # Errors
    /// The statement fails.
    async fn forget_receipt(
        &mut self,
        consumer: &str,
        message_id: &str,
    ) -> Result<u64, sqlx::Error> {
        let params = [Param::Text(consumer), Param::Text(message_id)];
        self.run(sql::FORGET_RECEIPT.into_sql_str(), &params).await
    }

    /// Deletes the dead letter with id `id` in this transaction and
    /// returns it; `None` if there is none.
    ///
    /// # Errors
    /// The statement fails or the row does not decode.
    async fn take_dead_letter(&mut self, id: i64) -> Result<Option<DeadLetterRow>, sqlx::Error> {
        let sql = Self::TAKE_DEAD_LETTER.into_sql_str();
        let row = self.fetch_optional(sql, &[Param::Int(id)]).await?;
        row.as_ref().map(HostRow::dead_letter).transpose()
    }
}

/// A transaction's side of a batch of messages (`store::batch`).
pub(in crate::store) trait Batch: Transaction {
    /// Inserts the receipts `rows` of consumer `consumer` and component
    /// `digest` in one statement, in the order given (message id order, the
    /// lock order); the message ids that were inserted (had no receipt).
    ///
    /// # Errors
    /// The insert fails.
    async fn insert_receipts(
        &mut self,
        consumer: &str,
        digest: &str,
        rows: &[BatchRow<'_>],
    ) -> Result<Vec<String>, sqlx::Error>;

    /// The next message starts: its statements get `budget` again where the
    /// bound is one for the whole transaction (not per statement).
    ///
    /// # Errors
    /// The connection cannot be reached.
    async fn renew_budget(&mut self, budget: Duration) -> Result<(), sqlx::Error>;

    /// Whether a guest statement lost a lock conflict (deadlock,
    /// serialization failure, lock wait) since the last call; never on a
    /// single-writer database.
    fn take_conflict(&mut self) -> bool;

    /// The current message's savepoint was rolled back to: whatever failed
    /// inside it (and aborted the transaction) is undone.
    fn message_undone(&mut self) {}

    /// Deletes `consumer`'s receipts of `message_ids` as the host's own
    /// user (leaving the handler's role first where it was entered).
    ///
    /// # Errors
    /// A statement fails.
    async fn forget_receipts(
        &mut self,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<(), sqlx::Error>;
}

/// Optional: running a transaction's guest part as the handler's role
/// (PostgreSQL). Absent: nothing to do.
pub(in crate::store) trait TxRoles: Transaction {
    /// Runs the rest of the transaction as `role`, from before the next
    /// guest statement or catalog query on.
    ///
    /// # Errors
    /// The switch cannot be sent.
    async fn enter_role(&mut self, _role: &str) -> Result<(), sqlx::Error> {
        Ok(())
    }

    /// Makes the next host statement run as the host's own user (leaving
    /// the handler's role where it was entered); the next guest statement
    /// enters the role again.
    ///
    /// # Errors
    /// The switch cannot be sent.
    async fn host_turn(&mut self) -> Result<(), sqlx::Error> {
        Ok(())
    }

    /// After a rollback to a savepoint, which may have undone a role
    /// switch this transaction remembers making: makes the host's own user
    /// the one the next statements run as, whatever the remembered state;
    /// the next guest statement enters the role again.
    ///
    /// # Errors
    /// The switch cannot be sent.
    async fn reset_role(&mut self) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

/// Optional: the SQL guard's question of PostgreSQL's catalogs. Absent:
/// an error, as the guard asks it only of PostgreSQL.
pub(in crate::store) trait RowFunctions: Transaction {
    /// Which of `names` (fields selected from a row, `a.f`) would be read as
    /// a call `f(a)` (attribute notation): a one-argument function named so
    /// exists and no table of `tables` has such a column; sorted.
    ///
    /// # Errors
    /// `Other` when the catalogs cannot be read, or the database has none.
    async fn row_functions(
        &mut self,
        _names: &[String],
        _tables: &[String],
    ) -> Result<Vec<String>, DbError> {
        Err(DbError {
            kind: DbErrorKind::Other,
            message: "attribute notation is PostgreSQL's".into(),
        })
    }
}

/// Optional: compiling a statement on the transaction's own connection
/// under an authorizer, without running it (SQLite). Absent: an error, as
/// the guard asks it only of SQLite.
pub(in crate::store) trait CompileHook: Transaction {
    /// Compiles `sql` with `authorize` consulted for everything it would
    /// touch (given the `main` schema's tables and views, lower-cased),
    /// reporting `flag_opcodes` (`sqlite_raw::compile_judged`).
    ///
    /// # Errors
    /// `Other` when the connection cannot be reached, or the database
    /// compiles no SQLite statements.
    async fn compile_judged(
        &mut self,
        _sql: &str,
        _authorize: &mut sqlite_raw::SchemaPolicy<'_>,
        _flag_opcodes: &[&str],
    ) -> Result<Result<sqlite_raw::Compiled, sqlite_raw::CompileError>, DbError> {
        Err(DbError {
            kind: DbErrorKind::Other,
            message: format!(
                "SQLite statements cannot be compiled on {}",
                Self::KIND.name()
            ),
        })
    }
}
