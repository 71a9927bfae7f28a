//! A guest's statements in the message's transaction, written once for
//! every backend: each runs inside a savepoint (`idem_stmt`); after an error
//! the host rolls back to it (ARCHITECTURE.md, "The SQL sandbox": the
//! transaction stays the host's). A failing statement is thus undone alone
//! and the transaction stays usable on both databases, so a handler may
//! catch a unique violation and carry on (on PostgreSQL an error would
//! otherwise abort the whole transaction, and a later `COMMIT` would
//! silently roll back).
//!
//! Round trips: a statement's savepoint is released by the next statement,
//! in the same round trip that opens the next savepoint, or by COMMIT (which
//! ends every savepoint), so a statement costs two round trips (savepoint,
//! statement) instead of three, and on PostgreSQL the first savepoint also
//! carries the switch to the handler's role. The release is also the check
//! that the transaction is still the host's: outside a transaction block
//! PostgreSQL refuses it (SQLSTATE 25P01), so no statement ever runs after
//! one that ended the transaction. On SQLite the autocommit flag is checked
//! after every statement as well.

use super::backend::Transaction as _;
use super::sql::UNDO;
use super::{DbError, DbErrorKind, Rows, SqlValue, StatementError, Tx, dispatch, one_line};
use crate::sql_value::CheckedSql;

impl Tx {
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
        self.open_savepoint().await?;
        let result = dispatch!(&mut self.0, t => t.execute(sql, params).await);
        self.close_savepoint(result.is_ok()).await?;
        Ok(result?)
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
        self.open_savepoint().await?;
        let result = dispatch!(&mut self.0, t => t.query(sql, params, bounds).await);
        self.close_savepoint(result.is_ok()).await?;
        dispatch!(&mut self.0, t => t.after_query());
        Ok(result?)
    }

    /// Opens the statement's savepoint, releasing the previous statement's
    /// first when one is open (module docs), and in a batch the message's
    /// savepoint with its first statement (module `batch`).
    async fn open_savepoint(&mut self) -> Result<(), StatementError> {
        let sql = self.1.opening_sql();
        dispatch!(&mut self.0, t => t.run_host_sql(sql).await).map_err(|e| savepoint_failed(&e))?;
        self.1.opened();
        Ok(())
    }

    /// Checks that the statement left the host's transaction open, and
    /// after an error rolls back to the statement's savepoint (which stays
    /// open). A statement can end SQLite's transaction without asking the
    /// authorizer (a conflict resolved by ROLLBACK, which the guard refuses,
    /// is one way): then nothing after it may run, since it would run outside
    /// the transaction. On PostgreSQL the check is the release before the
    /// next statement (module docs); the rollback to the savepoint after an
    /// error is refused outside a transaction block too (SQLSTATE 25P01).
    async fn close_savepoint(&mut self, ok: bool) -> Result<(), StatementError> {
        let open =
            dispatch!(&mut self.0, t => t.still_open().await).map_err(|e| savepoint_failed(&e))?;
        if !open {
            return Err(StatementError::TransactionLost(
                "the statement ended the host's transaction; nothing after it may run".into(),
            ));
        }
        if ok {
            return Ok(());
        }
        dispatch!(&mut self.0, t => t.run_host_sql(UNDO).await).map_err(|e| savepoint_failed(&e))
    }
}

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
    pub(super) fn push(
        &self,
        out: &mut Rows,
        row: Vec<SqlValue>,
        used: &mut usize,
    ) -> Result<(), DbError> {
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
    pub(super) fn admit_raw(&self, raw: usize, used: usize) -> Result<(), DbError> {
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
