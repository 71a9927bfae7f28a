//! PostgreSQL's SQLSTATEs, read two ways: the kind of a guest statement's
//! failure ([`map_error`]) and the class of a host step's failure
//! ([`class`]). Source: PostgreSQL manual, Appendix A "PostgreSQL Error
//! Codes" (<https://www.postgresql.org/docs/current/errcodes-appendix.html>).

use crate::sql_value::{DbError, DbErrorKind};
use crate::store::{ErrorClass, one_line};

/// Kind from the SQLSTATE: 23505 unique, other 23xxx constraint, 42501
/// denied, 42601 syntax, anything else (and non-database errors) other.
pub(super) fn map_error(e: sqlx::Error) -> DbError {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let kind = match code.as_str() {
                "23505" => DbErrorKind::UniqueViolation,
                c if c.starts_with("23") => DbErrorKind::ConstraintViolation,
                "42501" => DbErrorKind::Denied,
                "42601" => DbErrorKind::Syntax,
                _ => DbErrorKind::Other,
            };
            DbError {
                kind,
                message: one_line(&format!("{} (SQLSTATE {code})", db.message())),
            }
        }
        _ => DbError {
            kind: DbErrorKind::Other,
            message: one_line(&e.to_string()),
        },
    }
}

/// PostgreSQL's SQLSTATE for a relation that does not exist
/// (<https://www.postgresql.org/docs/current/errcodes-appendix.html>).
const UNDEFINED_TABLE: &str = "42P01";

/// Whether `e` says a table the statement names does not exist (SQLSTATE
/// 42P01, undefined_table).
pub(super) fn is_undefined_table(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some(UNDEFINED_TABLE))
}

/// Whether `e` is a lost lock conflict: SQLSTATE 40P01 (deadlock_detected),
/// 40001 (serialization_failure) or 55P03 (lock_not_available, a lock
/// waited for past `lock_timeout`). The statement lost to another
/// transaction; run again, it may well succeed.
pub(in crate::store) fn is_conflict(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40P01" | "40001" | "55P03")))
}

/// Whether `e` says the connection was closed under the statement: an I/O
/// error, or SQLSTATE class 57P (operator intervention: 57P01
/// admin_shutdown, a terminated backend; 57P02 crash_shutdown; 57P03
/// cannot_connect_now), so another connection may do.
pub(super) fn is_lost_connection(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| c.starts_with("57P")),
        _ => false,
    }
}

/// The class of a database error with SQLSTATE `code` (see
/// [`ErrorClass`]): class `08` (connection exception), class `53`
/// (insufficient resources: `53300` too_many_connections, disk full, out
/// of memory), `57P01` (admin_shutdown, e.g. `pg_terminate_backend`),
/// `57P02` (crash_shutdown) and `57P03` (cannot_connect_now, e.g. starting
/// up) are [`ErrorClass::Unavailable`]; PostgreSQL has no busy class, so
/// anything else is [`ErrorClass::Failed`].
pub(in crate::store) fn class(code: &str) -> ErrorClass {
    if code.starts_with("08")
        || code.starts_with("53")
        || matches!(code, "57P01" | "57P02" | "57P03")
    {
        ErrorClass::Unavailable
    } else {
        ErrorClass::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_sqlstates() {
        for code in [
            "08000", "08003", "08006", "08001", "08004", "08P01", "53000", "53100", "53200",
            "53300", "53400", "57P01", "57P02", "57P03",
        ] {
            assert_eq!(class(code), ErrorClass::Unavailable, "{code}");
        }
    }

    #[test]
    fn other_sqlstates_fail_the_transaction() {
        // Serialization failure, deadlock, statement timeout (query_canceled),
        // unique violation, deferred FK at COMMIT, no transaction, privilege,
        // and the 57P class members that are not shutdowns.
        for code in [
            "40001", "40P01", "57014", "23505", "23503", "25P01", "42501", "57000", "57P04", "",
            "XX000",
        ] {
            assert_eq!(class(code), ErrorClass::Failed, "{code}");
        }
    }
}
