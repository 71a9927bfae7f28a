//! The host side of `wit/handler.wit` (0.2.0) and of the 0.1.0 world kept
//! beside it, generated in one place, and the conversions between their
//! types and the store's database-neutral ones.

#![allow(unsafe_code, missing_docs, clippy::all)]
// Guest- and message-supplied bytes are read with `get`, iterators and
// checked splits, never indexed or sliced: an offset out of range would
// panic the host (ARCHITECTURE.md, "The protocol", invariant 8).
#![deny(clippy::indexing_slicing, clippy::string_slice)]

use crate::store::{
    DbError as StoreDbError, DbErrorKind as StoreDbErrorKind, Rows as StoreRows, SqlValue,
};

/// The world `idem:handler/handler@0.2.0` (`wit/handler.wit`): the one the
/// host is written against.
mod v0_2 {
    wasmtime::component::bindgen!({
        world: "handler",
        path: "../wit",
        // Host imports are async (they await the database) and trappable (a
        // deadline that runs out inside a statement stops the guest).
        imports: { default: async | trappable },
        exports: { default: async },
    });
}

/// The world `idem:handler/handler@0.1.0` (`wit/versions/0.1.0`), without
/// `outbox`: its imports are served by the 0.2.0 ones (`world_v0_1`), so a
/// component built for it runs unchanged.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        world: "handler",
        path: "../wit/versions/0.1.0",
        imports: { default: async | trappable },
        exports: { default: async },
    });
}

pub use v0_2::*;

/// The 0.1.0 interfaces.
pub use v0_1::idem::handler as handler_v0_1;
/// The 0.2.0 interfaces.
pub use v0_2::idem::handler;

pub use self::handler::log::Level;
pub use self::handler::outbox::OutboxError;
pub use self::handler::types::{DbError, DbErrorKind, Rows, Value};

/// The import names the host provides; a component may import no others.
/// Both versions of the world are served: 0.1.0's interfaces by the same
/// code as 0.2.0's.
pub const PROVIDED_IMPORTS: [&str; 7] = [
    "idem:handler/types@0.2.0",
    "idem:handler/transaction@0.2.0",
    "idem:handler/log@0.2.0",
    "idem:handler/outbox@0.2.0",
    "idem:handler/types@0.1.0",
    "idem:handler/transaction@0.1.0",
    "idem:handler/log@0.1.0",
];

impl From<Value> for SqlValue {
    fn from(v: Value) -> Self {
        match v {
            Value::Null => SqlValue::Null,
            Value::Integer(i) => SqlValue::Integer(i),
            Value::Float(f) => SqlValue::Float(f),
            Value::Text(s) => SqlValue::Text(s),
            Value::Bytes(b) => SqlValue::Bytes(b),
            Value::Boolean(b) => SqlValue::Boolean(b),
        }
    }
}

impl From<SqlValue> for Value {
    fn from(v: SqlValue) -> Self {
        match v {
            SqlValue::Null => Value::Null,
            SqlValue::Integer(i) => Value::Integer(i),
            SqlValue::Float(f) => Value::Float(f),
            SqlValue::Text(s) => Value::Text(s),
            SqlValue::Bytes(b) => Value::Bytes(b),
            SqlValue::Boolean(b) => Value::Boolean(b),
        }
    }
}

impl From<StoreRows> for Rows {
    fn from(r: StoreRows) -> Self {
        Rows {
            columns: r.columns,
            rows: r
                .rows
                .into_iter()
                .map(|row| row.into_iter().map(Value::from).collect())
                .collect(),
        }
    }
}

impl From<StoreDbErrorKind> for DbErrorKind {
    fn from(k: StoreDbErrorKind) -> Self {
        match k {
            StoreDbErrorKind::UniqueViolation => DbErrorKind::UniqueViolation,
            StoreDbErrorKind::ConstraintViolation => DbErrorKind::ConstraintViolation,
            StoreDbErrorKind::Denied => DbErrorKind::Denied,
            StoreDbErrorKind::Syntax => DbErrorKind::Syntax,
            StoreDbErrorKind::Other => DbErrorKind::Other,
        }
    }
}

impl From<StoreDbError> for DbError {
    fn from(e: StoreDbError) -> Self {
        DbError {
            kind: e.kind.into(),
            message: e.message,
        }
    }
}

impl DbError {
    /// A statement the host refused before it reached the database.
    pub fn denied(message: impl Into<String>) -> Self {
        DbError {
            kind: DbErrorKind::Denied,
            message: message.into(),
        }
    }
}
