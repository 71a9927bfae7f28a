//! The SQL guard's question of PostgreSQL's catalogs
//! (`backend::RowFunctions`): which fields a statement selects from a row
//! PostgreSQL would read as a function call (attribute notation).

use super::Tx;
use crate::sql_value::{DbError, DbErrorKind};
use crate::store::backend::RowFunctions;
use crate::store::one_line;

impl RowFunctions for Tx {
    /// See [`crate::store::Tx::row_functions`]. A function with defaults
    /// counts when one argument is enough to call it. Only catalogs PUBLIC may
    /// read, so it works as a handler role too.
    async fn row_functions(
        &mut self,
        names: &[String],
        tables: &[String],
    ) -> Result<Vec<String>, DbError> {
        // Any failure here aborts the transaction (`aborted`), and is
        // `Other` for the guard, which never keeps such a verdict.
        self.flush_role().await.map_err(|e| DbError {
            kind: DbErrorKind::Other,
            message: one_line(&format!("cannot switch to the handler's role: {e}")),
        })?;
        let found = sqlx::query_scalar(
            "SELECT f FROM unnest($1::text[]) AS f
         WHERE EXISTS (
             SELECT 1 FROM pg_catalog.pg_proc p
             WHERE p.proname = f AND p.pronargs >= 1 AND p.pronargs - p.pronargdefaults <= 1)
           AND NOT EXISTS (
             SELECT 1 FROM pg_catalog.pg_attribute a
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
             WHERE c.relname = ANY($2::text[]) AND pg_catalog.pg_table_is_visible(c.oid)
               AND a.attname = f AND a.attnum > 0 AND NOT a.attisdropped)
         ORDER BY f",
        )
        .bind(names)
        .bind(tables)
        .fetch_all(&mut *self.tx)
        .await;
        found.map_err(|e| {
            self.aborted = Some(format!("the SQL guard's catalog query failed: {e}"));
            DbError {
                kind: DbErrorKind::Other,
                message: one_line(&format!("cannot read the catalogs: {e}")),
            }
        })
    }
}
