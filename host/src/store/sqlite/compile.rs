//! SQLite's compile hook (`backend::CompileHook`): the SQL guard compiles a
//! statement on the transaction's own connection under an authorizer,
//! without running it (`store::sqlite_raw`, `sql_guard::sqlite`).

use super::Tx;
use crate::sql_value::{DbError, DbErrorKind};
use crate::store::backend::CompileHook;
use crate::store::{one_line, sqlite_raw};
use std::collections::HashSet;

impl CompileHook for Tx {
    /// See [`crate::store::Tx::compile_judged`].
    async fn compile_judged(
        &mut self,
        sql: &str,
        authorize: &mut sqlite_raw::SchemaPolicy<'_>,
        flag_opcodes: &[&str],
    ) -> Result<Result<sqlite_raw::Compiled, sqlite_raw::CompileError>, DbError> {
        let mut handle = self.0.lock_handle().await.map_err(|e| DbError {
            kind: DbErrorKind::Other,
            message: one_line(&format!("cannot reach the connection: {e}")),
        })?;
        let raw = handle.as_raw_handle();
        let tables: HashSet<String> = match sqlite_raw::main_tables(raw) {
            Ok(names) => names.iter().map(|n| n.to_ascii_lowercase()).collect(),
            Err(e) => return Ok(Err(e)),
        };
        Ok(sqlite_raw::compile_judged(
            raw,
            sql,
            &mut |r: &sqlite_raw::Request<'_>| authorize(r, &tables),
            flag_opcodes,
        ))
    }
}
