//! SQLite's compile hook (`backend::CompileHook`): the SQL guard compiles a
//! statement on the transaction's own connection under an authorizer,
//! without running it (`store::sqlite_raw`, `sql_guard::sqlite`).

use super::Tx;
use crate::sql_value::{DbError, DbErrorKind};
use crate::store::backend::CompileHook;
use crate::store::sqlite_raw;
use std::collections::HashSet;

impl CompileHook for Tx {
    /// See [`crate::store::Tx::compile_judged`].
    async fn compile_judged(
        &mut self,
        sql: &str,
        authorize: &mut sqlite_raw::SchemaPolicy<'_>,
        flag_opcodes: &[&str],
    ) -> Result<Result<sqlite_raw::Compiled, sqlite_raw::CompileError>, DbError> {
        let conn = self.0.get();
        let Some(raw) = sqlite_raw::handle_of(&conn) else {
            return Err(DbError {
                kind: DbErrorKind::Other,
                message: "the transaction's connection is closed".into(),
            });
        };
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
