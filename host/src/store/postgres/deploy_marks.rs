//! PostgreSQL: reading and raising deployment high-water marks
//! (`super::super::deploy_marks`).

use super::Pool;
use crate::store::deploy_marks::{RAISE_MARK, SELECT_MARK};

/// PostgreSQL's SQLSTATE for a relation that does not exist
/// (<https://www.postgresql.org/docs/current/errcodes-appendix.html>).
const UNDEFINED_TABLE: &str = "42P01";

impl Pool {
    pub(in crate::store) async fn deploy_mark(
        &self,
        handler: &str,
    ) -> Result<Option<(i64, i64, String)>, sqlx::Error> {
        match sqlx::query_as(SELECT_MARK)
            .bind(handler)
            .fetch_optional(&self.0)
            .await
        {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(UNDEFINED_TABLE) => {
                Ok(None)
            }
            other => other,
        }
    }

    pub(in crate::store) async fn raise_deploy_mark(
        &self,
        handler: &str,
        sequence: i64,
        revision: i64,
        record: &str,
    ) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(RAISE_MARK)
            .bind(handler)
            .bind(sequence)
            .bind(revision)
            .bind(record)
            .execute(&self.0)
            .await?
            .rows_affected())
    }
}
