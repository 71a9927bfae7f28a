//! The WIT types, re-exported with conversions and helpers.

use crate::bindings::idem::handler::types;
use std::fmt;

/// One SQL value: a statement parameter or a column of a result row.
///
/// Everything common converts into it, so parameters read naturally with
/// [`params!`](crate::params): integers, floats, `bool`, `&str` / `String`,
/// `Vec<u8>` / `&[u8]`, and `Option<T>` (`None` is SQL NULL).
pub use types::Value;

/// The rows a query returned: column names, then each row's values in column order.
pub use types::Rows;

/// Why a statement failed: a [`DbErrorKind`] and one line of text.
pub use types::DbError;

/// The kind of a [`DbError`], taken from the database's error code (never its text).
pub use types::DbErrorKind;

/// One delivered message: identity, subject, headers, payload bytes, stream
/// sequence, delivery count (1 on the first delivery) and publish time.
pub use types::Message;

/// How a handler says it did not finish; either way the host rolls back.
///
/// - `Retry(reason)`: transient, deliver the message again later.
/// - `Reject(reason)`: permanent, dead-letter the message.
pub use types::HandlerError;

macro_rules! value_from {
    ($($t:ty => $variant:ident via $conv:expr),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$variant($conv(v))
            }
        }
    )*};
}

value_from! {
    i64 => Integer via |v| v,
    i32 => Integer via i64::from,
    i16 => Integer via i64::from,
    i8 => Integer via i64::from,
    u32 => Integer via i64::from,
    u16 => Integer via i64::from,
    u8 => Integer via i64::from,
    f64 => Float via |v| v,
    f32 => Float via f64::from,
    bool => Boolean via |v| v,
    String => Text via |v| v,
    &str => Text via str::to_owned,
    &String => Text via String::clone,
    Vec<u8> => Bytes via |v| v,
    &[u8] => Bytes via <[u8]>::to_vec,
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Integer(a), Value::Integer(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a == b,
            (Value::Text(a), Value::Text(b)) => a == b,
            (Value::Bytes(a), Value::Bytes(b)) => a == b,
            (Value::Boolean(a), Value::Boolean(b)) => a == b,
            _ => false,
        }
    }
}

impl Value {
    /// Whether this is SQL NULL.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
    /// The integer, if this is one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Integer(v) => Some(*v),
            _ => None,
        }
    }
    /// The number as a float, if this is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(v) => Some(*v),
            Value::Integer(v) => Some(*v as f64),
            _ => None,
        }
    }
    /// The text, if this is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(v) => Some(v),
            _ => None,
        }
    }
    /// The bytes, if this is a byte string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(v) => Some(v),
            _ => None,
        }
    }
    /// The boolean, if this is one. (SQLite has no boolean type: there a
    /// boolean column reads back as an integer 0 or 1.)
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Boolean(v) => Some(*v),
            Value::Integer(v) => Some(*v != 0),
            _ => None,
        }
    }
}

impl Rows {
    /// The number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    /// Whether the query returned no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    /// The position of a column by name.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }
    /// The value of column `name` in row `row`, if both exist.
    pub fn get(&self, row: usize, name: &str) -> Option<&Value> {
        let col = self.column(name)?;
        self.rows.get(row)?.get(col)
    }
}

impl DbErrorKind {
    /// The kind's WIT name, e.g. `unique-violation`.
    pub fn as_str(self) -> &'static str {
        match self {
            DbErrorKind::UniqueViolation => "unique-violation",
            DbErrorKind::ConstraintViolation => "constraint-violation",
            DbErrorKind::Denied => "denied",
            DbErrorKind::Syntax => "syntax",
            DbErrorKind::Other => "other",
        }
    }
}

impl DbError {
    /// Whether a unique or primary-key constraint was violated: the natural way
    /// to notice "this business key was already applied".
    pub fn is_unique_violation(&self) -> bool {
        self.kind == DbErrorKind::UniqueViolation
    }
}

/// A failed statement becomes a handler error, so `?` works in a handler:
/// [`DbErrorKind::Other`] (connection lost, timeout, deadlock, ...) is worth a
/// retry; every other kind would fail the same way again, so it rejects.
impl From<DbError> for HandlerError {
    fn from(e: DbError) -> Self {
        let reason = format!("database {}: {}", e.kind.as_str(), e.message);
        match e.kind {
            DbErrorKind::Other => HandlerError::Retry(reason),
            _ => HandlerError::Reject(reason),
        }
    }
}

impl HandlerError {
    /// A transient failure: roll back and deliver the message again later.
    /// Takes anything printable, so `.map_err(HandlerError::retry)` works.
    pub fn retry(reason: impl fmt::Display) -> Self {
        HandlerError::Retry(reason.to_string())
    }
    /// A permanent failure: roll back and dead-letter the message.
    /// Takes anything printable, so `.map_err(HandlerError::reject)` works.
    pub fn reject(reason: impl fmt::Display) -> Self {
        HandlerError::Reject(reason.to_string())
    }
}

impl Message {
    /// The payload as UTF-8 text; a payload that is not UTF-8 is rejected.
    pub fn payload_str(&self) -> Result<&str, HandlerError> {
        std::str::from_utf8(&self.payload)
            .map_err(|e| HandlerError::reject(format!("payload is not UTF-8: {e}")))
    }
    /// The first value of header `name` (compared ASCII case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// Whether this is a redelivery (the broker delivered it before).
    pub fn is_redelivery(&self) -> bool {
        self.delivery_count > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_convert_from_rust_types() {
        assert_eq!(Value::from(7), Value::Integer(7));
        assert_eq!(Value::from(7u32), Value::Integer(7));
        assert_eq!(Value::from(1.5), Value::Float(1.5));
        assert_eq!(Value::from("a"), Value::Text("a".into()));
        assert_eq!(Value::from(vec![1u8]), Value::Bytes(vec![1]));
        assert_eq!(Value::from(true), Value::Boolean(true));
        assert_eq!(Value::from(None::<&str>), Value::Null);
        assert_eq!(Value::from(Some(3i64)), Value::Integer(3));
    }

    #[test]
    fn db_errors_become_handler_errors_by_kind() {
        let e = |kind| DbError {
            kind,
            message: "m".into(),
        };
        assert_eq!(
            HandlerError::from(e(DbErrorKind::Other)).to_string(),
            HandlerError::Retry("database other: m".into()).to_string()
        );
        assert!(matches!(
            HandlerError::from(e(DbErrorKind::UniqueViolation)),
            HandlerError::Reject(r) if r == "database unique-violation: m"
        ));
        assert!(e(DbErrorKind::UniqueViolation).is_unique_violation());
    }

    #[test]
    fn rows_and_messages_have_accessors() {
        let rows = Rows {
            columns: vec!["a".into(), "b".into()],
            rows: vec![vec![Value::Integer(1), Value::Text("x".into())]],
        };
        assert_eq!(rows.get(0, "b").and_then(Value::as_str), Some("x"));
        assert_eq!(rows.get(1, "a"), None);
        let msg = Message {
            identity: "i".into(),
            subject: "s".into(),
            headers: vec![("Nats-Msg-Id".into(), "i".into())],
            payload: b"{}".to_vec(),
            stream_sequence: 1,
            delivery_count: 2,
            published_ms: 0,
        };
        assert_eq!(msg.header("nats-msg-id"), Some("i"));
        assert_eq!(msg.payload_str().ok(), Some("{}"));
        assert!(msg.is_redelivery());
    }
}
