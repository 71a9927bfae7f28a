//! What the host's integration tests share that takes idem's own types:
//! raw SQL on an `idem::store::Database`. Paths, the PostgreSQL URL and
//! unique names come from `idem-test-support` (ARCHITECTURE.md, Code map).
#![allow(clippy::panic)]

use idem::store::Database;
use sqlx::AssertSqlSafe;

/// Runs `sql` (one or more statements) outside any transaction.
///
/// # Panics
/// On the first error, with the SQL and the error.
pub async fn raw(db: &Database, sql: &str) {
    match (db.postgres_pool(), db.sqlite_pool()) {
        (Some(p), _) => sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(p)
            .await
            .map(|_| ()),
        (None, Some(p)) => sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(p)
            .await
            .map(|_| ()),
        (None, None) => unreachable!("no backend"),
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"));
}
