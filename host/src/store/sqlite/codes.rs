//! SQLite's result codes, read two ways: the kind of a guest statement's
//! failure ([`map_error`]) and the class of a host step's failure
//! ([`class`]). Source: <https://sqlite.org/rescode.html>.

use crate::sql_value::{DbError, DbErrorKind};
use crate::store::{ErrorClass, one_line};

/// Kind from the extended result code: 2067 (CONSTRAINT_UNIQUE) and 1555
/// (CONSTRAINT_PRIMARYKEY) unique; other SQLITE_CONSTRAINT (19) codes
/// constraint; 23 (SQLITE_AUTH) denied. SQLite reports syntax errors and
/// unknown tables/columns alike as SQLITE_ERROR (1), so those are `Other`
/// (the guard already rejected anything that does not parse).
pub(super) fn map_error(e: rusqlite::Error) -> DbError {
    match &e {
        rusqlite::Error::SqliteFailure(failure, message) => {
            let code = failure.extended_code;
            let kind = match code {
                2067 | 1555 => DbErrorKind::UniqueViolation,
                c if c & 0xff == 19 => DbErrorKind::ConstraintViolation,
                c if c & 0xff == 23 => DbErrorKind::Denied,
                _ => DbErrorKind::Other,
            };
            let message = message.clone().unwrap_or_else(|| failure.to_string());
            DbError {
                kind,
                message: one_line(&format!("{message} (SQLite code {code})")),
            }
        }
        _ => DbError {
            kind: DbErrorKind::Other,
            message: one_line(&e.to_string()),
        },
    }
}

/// A SQLite error of a message transaction's connection (`direct`), as a
/// [`sqlx::error::DatabaseError`], so that the store reads its class as it
/// reads sqlx's own ([`class`], [`is_sqlite`]). `code` is the extended
/// result code; `None` for a failure that is not SQLite's (a value of the
/// wrong type, a parameter without a value).
#[derive(Debug)]
pub(in crate::store) struct DirectError {
    code: Option<i32>,
    code_text: Option<String>,
    message: String,
}

impl std::fmt::Display for DirectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code {
            Some(code) => write!(f, "{} (code: {code})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for DirectError {}

impl sqlx::error::DatabaseError for DirectError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        self.code_text.as_deref().map(std::borrow::Cow::Borrowed)
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    /// By extended result code (<https://sqlite.org/rescode.html>).
    fn kind(&self) -> sqlx::error::ErrorKind {
        use sqlx::error::ErrorKind;
        match self.code {
            Some(2067 | 1555) => ErrorKind::UniqueViolation,
            Some(787) => ErrorKind::ForeignKeyViolation,
            Some(1299) => ErrorKind::NotNullViolation,
            Some(275) => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

/// `e` as the store's driver error ([`DirectError`]).
pub(super) fn to_sqlx(e: rusqlite::Error) -> sqlx::Error {
    let (code, message) = match &e {
        rusqlite::Error::SqliteFailure(failure, message) => (
            Some(failure.extended_code),
            message.clone().unwrap_or_else(|| failure.to_string()),
        ),
        other => (None, other.to_string()),
    };
    sqlx::Error::Database(Box::new(DirectError {
        code,
        code_text: code.map(|c| c.to_string()),
        message,
    }))
}

/// Whether `e` says a table the statement names does not exist (SQLite
/// reports it as SQLITE_ERROR, 1, with the message `no such table: …`).
pub(super) fn is_undefined_table(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.message().starts_with("no such table"))
}

/// Whether a database error is SQLite's (its code is then a result code).
pub(in crate::store) fn is_sqlite(db: &dyn sqlx::error::DatabaseError) -> bool {
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
        || db.try_downcast_ref::<DirectError>().is_some()
}

/// The class of a SQLite error with (extended) result code `code`, by its
/// primary code (the low 8 bits; see [`ErrorClass`]): `SQLITE_READONLY`
/// (8), `SQLITE_IOERR` (10), `SQLITE_FULL` (13) and `SQLITE_CANTOPEN` (14)
/// are [`ErrorClass::Unavailable`]; `SQLITE_BUSY` (5) and `SQLITE_LOCKED` (6)
/// are [`ErrorClass::Busy`]; anything else, and a code that is no number,
/// is [`ErrorClass::Failed`].
pub(in crate::store) fn class(code: &str) -> ErrorClass {
    match code.parse::<i64>().ok().map(|c| c & 0xff) {
        Some(8 | 10 | 13 | 14) => ErrorClass::Unavailable,
        Some(5 | 6) => ErrorClass::Busy,
        _ => ErrorClass::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_by_primary_code() {
        // Primary codes and extended ones (primary in the low 8 bits):
        // READONLY_DBMOVED 1032, IOERR_READ 266, IOERR_SHORT_READ 522,
        // CANTOPEN_NOTEMPDIR 270; BUSY_SNAPSHOT 517, BUSY_TIMEOUT 773,
        // LOCKED_SHAREDCACHE 262.
        for code in ["8", "10", "13", "14", "1032", "266", "522", "270"] {
            assert_eq!(class(code), ErrorClass::Unavailable, "{code}");
        }
        for code in ["5", "6", "517", "773", "262"] {
            assert_eq!(class(code), ErrorClass::Busy, "{code}");
        }
        // ERROR, CONSTRAINT_UNIQUE, CONSTRAINT_PRIMARYKEY, AUTH, INTERRUPT,
        // CORRUPT, not a number.
        for code in ["1", "2067", "1555", "23", "9", "11", "", "08006"] {
            assert_eq!(class(code), ErrorClass::Failed, "{code}");
        }
    }
}
