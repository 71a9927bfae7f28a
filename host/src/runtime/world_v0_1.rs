//! The imports of world `idem:handler/handler@0.1.0` (before `outbox`),
//! served by the 0.2.0 ones on the same [`HostState`]: a component built
//! for 0.1.0 runs unchanged, through the same statement budget, SQL guard,
//! deadline and log as any other. Only the value types are converted; the
//! two versions' types are the same shapes.

use super::bindings::{self, handler as now, handler_v0_1 as old};
use super::host_impl::HostState;

impl old::types::Host for HostState {}

impl old::transaction::Host for HostState {
    async fn execute(
        &mut self,
        sql: String,
        params: Vec<old::types::Value>,
    ) -> wasmtime::Result<Result<u64, old::types::DbError>> {
        let params = params.into_iter().map(value).collect();
        let done = now::transaction::Host::execute(self, sql, params).await?;
        Ok(done.map_err(db_error))
    }

    async fn query(
        &mut self,
        sql: String,
        params: Vec<old::types::Value>,
    ) -> wasmtime::Result<Result<old::types::Rows, old::types::DbError>> {
        let params = params.into_iter().map(value).collect();
        let rows = now::transaction::Host::query(self, sql, params).await?;
        Ok(rows.map(rows_of).map_err(db_error))
    }
}

impl old::log::Host for HostState {
    async fn log(&mut self, level: old::log::Level, message: String) -> wasmtime::Result<()> {
        let level = match level {
            old::log::Level::Debug => bindings::Level::Debug,
            old::log::Level::Info => bindings::Level::Info,
            old::log::Level::Warn => bindings::Level::Warn,
            old::log::Level::Error => bindings::Level::Error,
        };
        now::log::Host::log(self, level, message).await
    }
}

fn value(v: old::types::Value) -> bindings::Value {
    use old::types::Value as V;
    match v {
        V::Null => bindings::Value::Null,
        V::Integer(i) => bindings::Value::Integer(i),
        V::Float(f) => bindings::Value::Float(f),
        V::Text(s) => bindings::Value::Text(s),
        V::Bytes(b) => bindings::Value::Bytes(b),
        V::Boolean(b) => bindings::Value::Boolean(b),
    }
}

fn value_back(v: bindings::Value) -> old::types::Value {
    use bindings::Value as V;
    match v {
        V::Null => old::types::Value::Null,
        V::Integer(i) => old::types::Value::Integer(i),
        V::Float(f) => old::types::Value::Float(f),
        V::Text(s) => old::types::Value::Text(s),
        V::Bytes(b) => old::types::Value::Bytes(b),
        V::Boolean(b) => old::types::Value::Boolean(b),
    }
}

fn rows_of(r: bindings::Rows) -> old::types::Rows {
    old::types::Rows {
        columns: r.columns,
        rows: r
            .rows
            .into_iter()
            .map(|row| row.into_iter().map(value_back).collect())
            .collect(),
    }
}

fn db_error(e: bindings::DbError) -> old::types::DbError {
    use bindings::DbErrorKind as K;
    old::types::DbError {
        kind: match e.kind {
            K::UniqueViolation => old::types::DbErrorKind::UniqueViolation,
            K::ConstraintViolation => old::types::DbErrorKind::ConstraintViolation,
            K::Denied => old::types::DbErrorKind::Denied,
            K::Syntax => old::types::DbErrorKind::Syntax,
            K::Other => old::types::DbErrorKind::Other,
        },
        message: e.message,
    }
}
