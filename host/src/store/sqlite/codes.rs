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
pub(super) fn map_error(e: sqlx::Error) -> DbError {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(0);
            let kind = match code {
                2067 | 1555 => DbErrorKind::UniqueViolation,
                c if c & 0xff == 19 => DbErrorKind::ConstraintViolation,
                c if c & 0xff == 23 => DbErrorKind::Denied,
                _ => DbErrorKind::Other,
            };
            DbError {
                kind,
                message: one_line(&format!("{} (SQLite code {code})", db.message())),
            }
        }
        _ => DbError {
            kind: DbErrorKind::Other,
            message: one_line(&e.to_string()),
        },
    }
}

/// Whether `e` says a table the statement names does not exist (SQLite
/// reports it as SQLITE_ERROR, 1, with the message `no such table: …`).
pub(super) fn is_undefined_table(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.message().starts_with("no such table"))
}

/// Whether a database error is SQLite's (its code is then a result code).
pub(in crate::store) fn is_sqlite(db: &dyn sqlx::error::DatabaseError) -> bool {
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
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
