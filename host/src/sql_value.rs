//! Database-neutral values, rows and errors that cross between a guest and a
//! transaction, and [`CheckedSql`], the proof that a statement was judged.
//! The runtime converts the values to and from the WIT types in
//! `wit/handler.wit` (`idem:handler/types`).
//!
//! A leaf: it imports nothing from `store` or `sql_guard`, so both can use it
//! without importing each other in a cycle. `sql_guard` depends on `store`
//! (it judges a statement in the message's [`crate::store::Tx`]); `store`
//! never imports `sql_guard`. What `store` needs from the guard is only its
//! verdict, [`CheckedSql`]: its constructor is `pub(crate)` and only
//! `sql_guard` calls it (ARCHITECTURE.md, "The SQL sandbox": exactly the
//! judged text runs).

use std::sync::Arc;

/// One SQL value, bound to a `$n` placeholder or read from a result column.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    /// SQL NULL. As a PostgreSQL parameter it has no declared type, so it fits any column.
    Null,
    /// A 64-bit integer (PostgreSQL `int2/int4/int8`, SQLite INTEGER).
    Integer(i64),
    /// A double (PostgreSQL `float4/float8`, SQLite REAL).
    Float(f64),
    /// UTF-8 text (PostgreSQL `text/varchar/char(n)/name`, SQLite TEXT).
    Text(String),
    /// Raw bytes (PostgreSQL `bytea`, SQLite BLOB).
    Bytes(Vec<u8>),
    /// A boolean (PostgreSQL `bool`; SQLite stores it as INTEGER 0/1 and reads it back as `Integer`).
    Boolean(bool),
}

impl SqlValue {
    /// The bytes this value costs in a result: the length of text and
    /// bytes, 8 for numbers, 1 for NULL and booleans (a rough measure of the
    /// host memory it takes, used by the per-message result bound).
    pub fn size(&self) -> usize {
        match self {
            SqlValue::Null | SqlValue::Boolean(_) => 1,
            SqlValue::Integer(_) | SqlValue::Float(_) => 8,
            SqlValue::Text(s) => s.len(),
            SqlValue::Bytes(b) => b.len(),
        }
    }
}

/// Rows returned by a query: column names, then each row's values in column order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows {
    /// Column names in order; empty when the query returned no row.
    pub columns: Vec<String>,
    /// Each row's values, in column order.
    pub rows: Vec<Vec<SqlValue>>,
}

/// What kind of failure a statement met. Derived from PostgreSQL's SQLSTATE or
/// SQLite's extended result code, never from message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbErrorKind {
    /// SQLSTATE 23505; SQLite 2067 (CONSTRAINT_UNIQUE) or 1555 (CONSTRAINT_PRIMARYKEY).
    UniqueViolation,
    /// Other class-23 SQLSTATEs; other SQLITE_CONSTRAINT_* codes.
    ConstraintViolation,
    /// Refused by the host's SQL check, or SQLSTATE class 42501 / SQLITE_AUTH.
    Denied,
    /// SQLSTATE 42601; SQLite syntax errors; statements the parser rejects.
    Syntax,
    /// Everything else.
    Other,
}

/// A statement's failure as the guest sees it: a kind and one line of text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct DbError {
    /// What kind of failure (from the code, never the text).
    pub kind: DbErrorKind,
    /// One line for a person; database errors end with `(SQLSTATE xxxxx)` or `(SQLite code n)`.
    pub message: String,
}

impl DbError {
    /// A statement the host refused before it reached the database.
    pub fn denied(message: impl Into<String>) -> Self {
        Self {
            kind: DbErrorKind::Denied,
            message: message.into(),
        }
    }
}

/// Why a guest statement did not complete.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StatementError {
    /// The statement failed or was refused; its effects are undone and the
    /// transaction goes on. The guest sees this as its `db-error`.
    #[error("{0}")]
    Failed(DbError),
    /// The host's transaction is no longer usable: the statement ended it,
    /// or its savepoint could not be restored. The guest is stopped (a trap)
    /// and the message rolled back; one line saying what happened.
    #[error("{0}")]
    TransactionLost(String),
}

impl From<DbError> for StatementError {
    fn from(e: DbError) -> Self {
        StatementError::Failed(e)
    }
}

/// SQL text that passed [`crate::sql_guard::SqlGuard::check`], exactly as it
/// is sent to the database. Holding one proves the text was judged: the store
/// runs guest statements only from it, and only `sql_guard` builds one
/// (`CheckedSql::judged`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedSql {
    text: Arc<str>,
    params: usize,
    /// PostgreSQL: the parameter types it was judged for ([`type_letters`]);
    /// the store refuses other ones. `None` on SQLite.
    types: Option<Arc<str>>,
}

impl CheckedSql {
    /// The verdict "allowed" for `text` with `params` placeholders, judged for
    /// the parameter types `types` ([`type_letters`]; `None`: any). Only
    /// `sql_guard` builds one, after judging `text`.
    pub(crate) fn judged(text: Arc<str>, params: usize, types: Option<Arc<str>>) -> Self {
        Self {
            text,
            params,
            types,
        }
    }

    /// The judged statement text, exactly as it is sent to the database.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The judged text, shared (for the driver, which keeps it in its
    /// statement cache).
    pub(crate) fn shared_text(&self) -> Arc<str> {
        self.text.clone()
    }

    /// The highest `$n` placeholder in the statement (0 when it has none).
    /// The store requires exactly this many parameters.
    pub fn param_count(&self) -> usize {
        self.params
    }

    /// Whether `params` have the types this text was judged for (always on
    /// SQLite; on PostgreSQL the text names them, see
    /// [`crate::sql_guard::SqlGuard::check`]).
    pub fn fits(&self, params: &[SqlValue]) -> bool {
        self.types
            .as_deref()
            .is_none_or(|t| t == type_letters(params).as_str())
    }
}

/// One letter per parameter type: `n`ull, `i`nteger, `f`loat, `t`ext,
/// `b`ytes, bo`o`lean.
pub(crate) fn type_letters(params: &[SqlValue]) -> String {
    params
        .iter()
        .map(|p| match p {
            SqlValue::Null => 'n',
            SqlValue::Integer(_) => 'i',
            SqlValue::Float(_) => 'f',
            SqlValue::Text(_) => 't',
            SqlValue::Bytes(_) => 'b',
            SqlValue::Boolean(_) => 'o',
        })
        .collect()
}
