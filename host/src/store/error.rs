//! What a failure of the host's own database work is, and what class it
//! falls in: the database could not be used at all, SQLite's write lock
//! stayed busy, or this transaction failed. The availability gate
//! ([`crate::pipeline::db_gate`]) and the pipeline act on the class, never on codes.
//! Which codes fall in which class is each backend's (`postgres::codes`,
//! `sqlite::codes`); the driver-level rule is here.

/// A failure of the host's own database work (begin, receipt, commit, dead letter).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The driver or the database failed; the message is sqlx's.
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
}

/// What a [`StoreError`] means for the message whose step met it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The database could not be reached or used at all, rather than
    /// refusing this transaction: not the message's fault. The message is
    /// held and runs again once the database answers.
    /// - driver level: I/O error, TLS failure, protocol error, pool timed
    ///   out (no connection could be opened within the acquire timeout),
    ///   pool closed, SQLite worker crashed;
    /// - PostgreSQL SQLSTATE class `08` (connection exception), `57P01`
    ///   (admin_shutdown, e.g. `pg_terminate_backend`), `57P02`
    ///   (crash_shutdown), `57P03` (cannot_connect_now, e.g. starting up),
    ///   class `53` insufficient resources (`53300` too_many_connections,
    ///   disk full, out of memory). Source: PostgreSQL manual, Appendix A;
    /// - SQLite primary result codes `SQLITE_READONLY` (8), `SQLITE_IOERR`
    ///   (10), `SQLITE_FULL` (13), `SQLITE_CANTOPEN` (14). Source:
    ///   <https://sqlite.org/rescode.html>.
    Unavailable,
    /// SQLite's `SQLITE_BUSY` (5) or `SQLITE_LOCKED` (6) (primary code):
    /// another transaction held the single write lock past the busy timeout.
    /// Nobody is at fault and nothing happened: the message runs again from
    /// BEGIN after a short backoff, spending no delivery. Source:
    /// <https://sqlite.org/rescode.html>.
    Busy,
    /// Everything else (a constraint violated at COMMIT, a serialization
    /// failure, a statement timeout): this transaction failed.
    Failed,
}

impl StoreError {
    /// This error's class; see [`ErrorClass`] for which codes fall where.
    pub fn class(&self) -> ErrorClass {
        let StoreError::Sqlx(e) = self;
        driver_class(e)
    }

    /// Whether a statement gave up on another transaction rather than
    /// failing on its own: PostgreSQL 57014 (query_canceled: the statement
    /// timeout ran out, for a statement that only waits on locks), 55P03
    /// (lock_not_available), 40P01 (deadlock_detected), 40001
    /// (serialization_failure). Never on SQLite (its waits are
    /// [`ErrorClass::Busy`]).
    pub fn is_lock_wait(&self) -> bool {
        let StoreError::Sqlx(e) = self;
        super::postgres::codes::is_conflict(e)
            || matches!(e, sqlx::Error::Database(db)
                if db.code().as_deref() == Some("57014")
                    && !super::sqlite::codes::is_sqlite(db.as_ref()))
    }
}

/// [`StoreError::class`] for a driver error: driver-level failures here,
/// database errors by their backend's codes.
fn driver_class(e: &sqlx::Error) -> ErrorClass {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => ErrorClass::Unavailable,
        sqlx::Error::Database(db) => match db.code() {
            None => ErrorClass::Failed,
            Some(code) if super::sqlite::codes::is_sqlite(db.as_ref()) => {
                super::sqlite::codes::class(&code)
            }
            Some(code) => super::postgres::codes::class(&code),
        },
        _ => ErrorClass::Failed,
    }
}

/// Why [`super::Database::probe`] found the database not (yet) usable.
#[derive(Debug, thiserror::Error)]
pub enum ProbeFailure {
    /// The probe's statement failed; the message is sqlx's.
    #[error("{0}")]
    Failed(sqlx::Error),
    /// No answer within the probe's timeout.
    #[error("database probe timed out")]
    TimedOut,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn driver_failures_are_unavailable() {
        let io = || std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        for e in [
            sqlx::Error::Io(io()),
            sqlx::Error::Tls("handshake".into()),
            sqlx::Error::Protocol("unexpected message".into()),
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed,
        ] {
            assert_eq!(StoreError::from(e).class(), ErrorClass::Unavailable);
        }
    }

    #[test]
    fn other_driver_errors_fail_the_transaction() {
        for e in [
            sqlx::Error::RowNotFound,
            sqlx::Error::ColumnNotFound("x".into()),
            sqlx::Error::Encode("does not fit".into()),
            sqlx::Error::Decode("bad".into()),
        ] {
            assert_eq!(StoreError::from(e).class(), ErrorClass::Failed);
        }
    }

    /// Real SQLite errors reach SQLite's codes: a read-only file is
    /// `SQLITE_READONLY` (8, unavailable), a missing table `SQLITE_ERROR`
    /// (1, failed).
    #[tokio::test]
    async fn sqlite_errors_are_classed_by_their_result_code() {
        use sqlx::Connection as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro.db");
        let url = format!("sqlite://{}", path.display());
        let mut rw = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
            .await
            .unwrap();
        sqlx::raw_sql("CREATE TABLE t (x INTEGER)")
            .execute(&mut rw)
            .await
            .unwrap();
        rw.close().await.unwrap();
        let mut ro = sqlx::SqliteConnection::connect(&format!("{url}?mode=ro"))
            .await
            .unwrap();
        let readonly = sqlx::raw_sql("INSERT INTO t VALUES (1)")
            .execute(&mut ro)
            .await
            .unwrap_err();
        assert_eq!(StoreError::from(readonly).class(), ErrorClass::Unavailable);
        let missing = sqlx::raw_sql("SELECT * FROM missing")
            .execute(&mut ro)
            .await
            .unwrap_err();
        assert_eq!(StoreError::from(missing).class(), ErrorClass::Failed);
    }
}
