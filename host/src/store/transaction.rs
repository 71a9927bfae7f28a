//! A message's transaction: begin (bounded in time), the handler's role,
//! the guest's value bound, what the SQL guard asks of the transaction,
//! commit and rollback. The guest's statements are in `statement`.

use super::backend::{Batch as _, Transaction as _, TxRoles as _};
use super::backend::{CompileHook as _, Pool as _, PoolRoles as _, RowFunctions as _};
use super::{Database, DbError, Savepoints, StoreError, Tx, dispatch, sqlite_raw};
use std::time::Duration;

/// A handler's PostgreSQL role, as [`Database::prepare_handler_role`] left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerRole {
    /// The role's name ([`super::handler_role`]).
    pub name: String,
    /// The handler's other roles, made by configs that grant it other
    /// tables: `role (table, table)`, by name.
    pub others: Vec<String>,
}

impl Database {
    /// Begins the transaction for one message. On SQLite it takes the write
    /// lock at once (`BEGIN IMMEDIATE`), so concurrent transactions wait up to
    /// the busy timeout instead of failing with "database is locked" later.
    ///
    /// # Errors
    /// No connection, or `BEGIN` fails (see [`StoreError::class`]).
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        Ok(dispatch!(&self.0, b, wrap => Tx(wrap(b.begin().await?), Savepoints::default())))
    }

    /// [`Database::begin`], with every statement of the transaction bounded in
    /// time, so a runaway guest statement cannot outlive its handler's deadline:
    /// - PostgreSQL: `SET LOCAL statement_timeout`, sent with `BEGIN` in one
    ///   round trip, each statement cancelled by the server after `timeout`
    ///   (SQLSTATE 57014); scoped to this transaction only.
    /// - SQLite: a progress handler interrupts any statement still running
    ///   `timeout` after BEGIN (SQLITE_INTERRUPT), so no transaction holds the
    ///   write lock much past it. Removed before COMMIT and when the
    ///   connection returns to the pool.
    ///
    /// # Errors
    /// As [`Database::begin`], or the bound cannot be set.
    pub async fn begin_bounded(&self, timeout: Duration) -> Result<Tx, StoreError> {
        Ok(dispatch!(&self.0, b, wrap => {
            Tx(wrap(b.begin_bounded(timeout).await?), Savepoints::default())
        }))
    }

    /// PostgreSQL only: prepares `handler`'s own role for this grant set
    /// ([`super::handler_role`]; see the `postgres::role` module), holding
    /// privileges on `tables` only, and returns it for
    /// [`Tx::enter_handler_role`]. `Ok(None)` on SQLite, which has no roles.
    ///
    /// # Errors
    /// The connecting user may not create roles or grant on a table.
    pub async fn prepare_handler_role(
        &self,
        handler: &str,
        tables: &[String],
    ) -> Result<Option<HandlerRole>, StoreError> {
        let name = super::handler_role(handler, tables);
        let others = dispatch!(&self.0, b => b.prepare_role(&name, handler, tables).await)?;
        Ok(others.map(|others| HandlerRole { name, others }))
    }

    /// PostgreSQL only: the connecting user and whether it is a superuser.
    /// A superuser session can leave any role it switches to, so with one the
    /// handler roles are not a boundary (the caller warns). `Ok(None)` on SQLite.
    ///
    /// # Errors
    /// The query fails (connection lost).
    pub async fn session_user(&self) -> Result<Option<(String, bool)>, StoreError> {
        Ok(dispatch!(&self.0, b => b.session_user().await)?)
    }
}

impl Tx {
    /// Bounds what the guest's statements may create or read in this
    /// transaction: on SQLite no string, BLOB or row may exceed `max_value_bytes`
    /// (`SQLITE_LIMIT_LENGTH`, restored when the connection returns to the
    /// pool). PostgreSQL has no such setting: there results are counted as
    /// they arrive ([`Tx::query`]). Call it before the guest runs.
    ///
    /// # Errors
    /// The connection cannot be locked.
    pub async fn bound_guest_values(&mut self, max_value_bytes: usize) -> Result<(), StoreError> {
        Ok(dispatch!(&mut self.0, t => t.bound_guest_values(max_value_bytes).await)?)
    }

    /// Runs the rest of this transaction as `role` (from
    /// [`Database::prepare_handler_role`]): call it after the receipt insert,
    /// before the guest's statements. A no-op on SQLite. On PostgreSQL the
    /// switch (`SET LOCAL ROLE`) is sent with the first guest statement's
    /// savepoint, or before the SQL guard's first catalog query, whichever
    /// comes first, saving a round trip; a message whose guest runs no
    /// statement never switches.
    ///
    /// # Errors
    /// None today: a switch that fails (the role is gone, the connection is
    /// lost) fails the statement it precedes, as a lost transaction; one
    /// that fails before the SQL guard's catalog query makes the guard's
    /// verdict an error and [`Tx::commit`] refuse (the transaction is
    /// aborted).
    pub async fn enter_handler_role(&mut self, role: &str) -> Result<(), StoreError> {
        Ok(dispatch!(&mut self.0, t => t.enter_role(role).await)?)
    }

    /// Makes the host's own user the one the next statements run as: on
    /// PostgreSQL leaves the handler's role when a guest statement entered
    /// it (it is entered again before the next guest statement). Nothing on
    /// SQLite.
    ///
    /// # Errors
    /// The switch back cannot be sent (the transaction is then unusable).
    pub(crate) async fn host_turn(&mut self) -> Result<(), StoreError> {
        Ok(dispatch!(&mut self.0, t => t.host_turn().await)?)
    }

    /// After a rollback to a savepoint: the host's own user runs the next
    /// statements, whatever role switch the savepoint undid; the next guest
    /// statement enters the handler's role again. Nothing on SQLite.
    ///
    /// # Errors
    /// The switch cannot be sent (the transaction is then unusable).
    pub(crate) async fn reset_role(&mut self) -> Result<(), StoreError> {
        Ok(dispatch!(&mut self.0, t => t.reset_role().await)?)
    }

    /// Gives the next statements `budget` again where the bound is one for
    /// the whole transaction (SQLite); nothing on PostgreSQL, where
    /// `statement_timeout` bounds each statement.
    ///
    /// # Errors
    /// On SQLite, the connection cannot be locked.
    pub(crate) async fn renew_budget(&mut self, budget: Duration) -> Result<(), StoreError> {
        Ok(dispatch!(&mut self.0, t => t.renew_budget(budget).await)?)
    }

    /// SQLite only: compiles `sql` on this transaction's connection with
    /// `authorize` consulted for everything it would touch, without running
    /// it (see [`sqlite_raw::compile_judged`]).
    ///
    /// `authorize` gets the request and the names of the tables and views of
    /// the `main` schema, lower-cased (SQLite names a subquery or CTE in a
    /// `count(*)`-style read the way it names a table; see `sql_guard::sqlite`).
    ///
    /// # Errors
    /// `Other` when the connection cannot be locked, or on PostgreSQL.
    pub(crate) async fn compile_judged(
        &mut self,
        sql: &str,
        authorize: &mut sqlite_raw::SchemaPolicy<'_>,
        flag_opcodes: &[&str],
    ) -> Result<Result<sqlite_raw::Compiled, sqlite_raw::CompileError>, DbError> {
        dispatch!(&mut self.0, t => t.compile_judged(sql, authorize, flag_opcodes).await)
    }

    /// PostgreSQL only: which of `names` (field names a statement selects
    /// from a row, `a.f`) PostgreSQL would resolve as a call `f(a)`
    /// (attribute notation, "Functions as Columns" in the PostgreSQL manual):
    /// a function named so that takes one argument exists, and no table of
    /// `tables` has a column named so. Read from the catalogs in this
    /// transaction, sorted.
    ///
    /// # Errors
    /// `Other` when the catalogs cannot be read (or the pending role
    /// switch fails), or on SQLite. On PostgreSQL such a failure aborts the
    /// transaction, so [`Tx::commit`] then refuses: nothing of it may be
    /// acked as committed.
    pub(crate) async fn row_functions(
        &mut self,
        names: &[String],
        tables: &[String],
    ) -> Result<Vec<String>, DbError> {
        dispatch!(&mut self.0, t => t.row_functions(names, tables).await)
    }

    /// Interrupts any statement still running at `until`, the message's
    /// deadline, on a database whose statements run on the calling thread
    /// (SQLite: no timer can stop them there); `None` lifts it (the guest's
    /// call ended: the host's own statements after it keep the
    /// transaction's budget only). A batch's next message sets its budget
    /// again ([`Tx::begin_message`]). Nothing on PostgreSQL.
    ///
    /// # Errors
    /// The bound cannot be set.
    pub fn cap_statements(&mut self, until: Option<std::time::Instant>) -> Result<(), StoreError> {
        Ok(dispatch!(&mut self.0, t => t.cap_statements(until))?)
    }

    /// Commits. Only after this returns `Ok` is the effect durable.
    ///
    /// # Errors
    /// `COMMIT` failed or its outcome is unknown (see [`StoreError::class`]);
    /// on PostgreSQL also a transaction a failed host statement aborted
    /// (rolled back instead: PostgreSQL would answer its COMMIT with
    /// ROLLBACK, and no error).
    pub async fn commit(self) -> Result<(), StoreError> {
        Ok(dispatch!(self.0, t => t.commit().await)?)
    }

    /// Rolls back: the receipt and every guest write disappear together.
    ///
    /// # Errors
    /// `ROLLBACK` failed (the connection is discarded).
    pub async fn rollback(self) -> Result<(), StoreError> {
        Ok(dispatch!(self.0, t => t.rollback().await)?)
    }
}
