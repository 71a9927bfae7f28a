//! Database-neutral values, rows and errors that cross between a guest and a
//! transaction. The runtime converts these to and from the WIT types in
//! `wit/handler.wit` (`idem:handler/types`).

/// One SQL value, bound to a `$n` placeholder or read from a result column.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    Null,
    Integer(i64),
    Float(f64),
    Text(String),
    Bytes(Vec<u8>),
    Boolean(bool),
}

/// Rows returned by a query: column names, then each row's values in column order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows {
    pub columns: Vec<String>,
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
    pub kind: DbErrorKind,
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
