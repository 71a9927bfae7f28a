//! SQLite: values bound as parameters (the guest's and the host's), values
//! decoded by their storage class, and the row a host query reads.

use crate::sql_value::{DbError, DbErrorKind, SqlValue};
use crate::store::DeadLetterRow;
use crate::store::backend::{HostRow, Param};
use crate::store::one_line;
use rusqlite::Statement;
use rusqlite::types::{Value, ValueRef};

/// The value number parameter `index` (1-based) of `stmt` takes: the
/// number in its name (`$3`, `?3`: SQLite numbers named parameters by
/// first appearance, so `$2 … $1` would otherwise be bound backwards), or
/// its position for a bare `?` or a name without a number.
fn value_number(stmt: &Statement<'_>, index: usize) -> usize {
    stmt.parameter_name(index)
        .and_then(|name| name.get(1..))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(index)
}

/// Binds `values` to `stmt`'s parameters by number ([`value_number`]),
/// each with `one`.
///
/// # Errors
/// A parameter's number has no value (`InvalidParameterCount`), or `one`
/// fails.
fn bind_each<T>(
    stmt: &mut Statement<'_>,
    values: &[T],
    one: impl Fn(&mut Statement<'_>, usize, &T) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    for index in 1..=stmt.parameter_count() {
        let Some(v) = value_number(stmt, index)
            .checked_sub(1)
            .and_then(|n| values.get(n))
        else {
            return Err(rusqlite::Error::InvalidParameterCount(index, values.len()));
        };
        one(stmt, index, v)?;
    }
    Ok(())
}

/// Binds a guest's `values` to `stmt`'s parameters by number. Booleans are
/// stored as integers 0/1, as SQLite has no boolean storage class.
///
/// # Errors
/// A parameter's number has no value (`InvalidParameterCount`), or SQLite
/// refuses a value (over the length limit: `SQLITE_TOOBIG`).
pub(super) fn bind(stmt: &mut Statement<'_>, values: &[SqlValue]) -> rusqlite::Result<()> {
    bind_each(stmt, values, |stmt, index, v| match v {
        SqlValue::Null => stmt.raw_bind_parameter(index, rusqlite::types::Null),
        SqlValue::Integer(i) => stmt.raw_bind_parameter(index, i),
        SqlValue::Float(f) => stmt.raw_bind_parameter(index, f),
        SqlValue::Text(s) => stmt.raw_bind_parameter(index, s.as_str()),
        SqlValue::Bytes(b) => stmt.raw_bind_parameter(index, b.as_slice()),
        SqlValue::Boolean(b) => stmt.raw_bind_parameter(index, i64::from(*b)),
    })
}

/// Binds the host's `params` to `stmt`'s parameters by number.
///
/// # Errors
/// As [`bind`].
pub(super) fn bind_host(stmt: &mut Statement<'_>, params: &[Param<'_>]) -> rusqlite::Result<()> {
    bind_each(stmt, params, |stmt, index, p| match *p {
        Param::Int(i) => stmt.raw_bind_parameter(index, i),
        Param::Text(s) => stmt.raw_bind_parameter(index, s),
        Param::OptText(s) => stmt.raw_bind_parameter(index, s),
        Param::Bytes(b) => stmt.raw_bind_parameter(index, b),
    })
}

/// The values of `row`'s `columns` first columns, each by its storage
/// class (NULL, INTEGER, REAL, TEXT, BLOB), whatever the column's declared
/// type.
///
/// # Errors
/// `Other`: text that is not UTF-8, or the row cannot be read.
pub(super) fn decode_row(
    row: &rusqlite::Row<'_>,
    names: &[String],
) -> Result<Vec<SqlValue>, DbError> {
    let mut values = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let value = match row.get_ref(i).map_err(super::codes::map_error)? {
            ValueRef::Null => SqlValue::Null,
            ValueRef::Integer(i) => SqlValue::Integer(i),
            ValueRef::Real(f) => SqlValue::Float(f),
            ValueRef::Text(t) => match std::str::from_utf8(t) {
                Ok(s) => SqlValue::Text(s.to_owned()),
                Err(e) => {
                    return Err(DbError {
                        kind: DbErrorKind::Other,
                        message: one_line(&format!("cannot decode column `{name}` (TEXT): {e}")),
                    });
                }
            },
            ValueRef::Blob(b) => SqlValue::Bytes(b.to_vec()),
        };
        values.push(value);
    }
    Ok(values)
}

/// A row a host query read on a message transaction's connection: its
/// columns' names and values.
pub struct Row {
    names: Vec<String>,
    values: Vec<Value>,
}

impl Row {
    /// The current row of a query on `stmt`'s columns.
    ///
    /// # Errors
    /// The row cannot be read.
    pub(super) fn read(row: &rusqlite::Row<'_>, names: &[String]) -> rusqlite::Result<Row> {
        let values = (0..names.len())
            .map(|i| row.get::<_, Value>(i))
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(Row {
            names: names.to_vec(),
            values,
        })
    }

    fn at(&self, i: usize) -> Result<&Value, sqlx::Error> {
        self.values
            .get(i)
            .ok_or_else(|| sqlx::Error::ColumnIndexOutOfBounds {
                index: i,
                len: self.values.len(),
            })
    }

    fn named(&self, name: &str) -> Result<usize, sqlx::Error> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| sqlx::Error::ColumnNotFound(name.to_owned()))
    }

    fn mismatch(&self, i: usize, wanted: &str) -> sqlx::Error {
        let name = self.names.get(i).map_or("?", String::as_str);
        sqlx::Error::ColumnDecode {
            index: name.to_owned(),
            source: format!("not {wanted}").into(),
        }
    }
}

impl HostRow for Row {
    fn int(&self, i: usize) -> Result<i64, sqlx::Error> {
        match self.at(i)? {
            Value::Integer(v) => Ok(*v),
            _ => Err(self.mismatch(i, "an integer")),
        }
    }

    fn opt_int(&self, i: usize) -> Result<Option<i64>, sqlx::Error> {
        match self.at(i)? {
            Value::Null => Ok(None),
            _ => self.int(i).map(Some),
        }
    }

    fn text(&self, i: usize) -> Result<String, sqlx::Error> {
        match self.at(i)? {
            Value::Text(v) => Ok(v.clone()),
            _ => Err(self.mismatch(i, "text")),
        }
    }

    fn opt_text(&self, i: usize) -> Result<Option<String>, sqlx::Error> {
        match self.at(i)? {
            Value::Null => Ok(None),
            _ => self.text(i).map(Some),
        }
    }

    fn bytes(&self, i: usize) -> Result<Vec<u8>, sqlx::Error> {
        match self.at(i)? {
            Value::Blob(v) => Ok(v.clone()),
            Value::Text(v) => Ok(v.clone().into_bytes()),
            _ => Err(self.mismatch(i, "bytes")),
        }
    }

    fn dead_letter(&self) -> Result<DeadLetterRow, sqlx::Error> {
        let int = |name| self.named(name).and_then(|i| self.int(i));
        let text = |name| self.named(name).and_then(|i| self.text(i));
        Ok(DeadLetterRow {
            id: int("id")?,
            consumer: text("consumer")?,
            message_id: self.named("message_id").and_then(|i| self.opt_text(i))?,
            stream: text("stream")?,
            stream_sequence: u64::try_from(int("stream_sequence")?).unwrap_or(0),
            subject: text("subject")?,
            reason: text("reason")?,
            headers: crate::store::dead_letters::decode_headers(&text("headers")?)?,
            payload: self.named("payload").and_then(|i| self.bytes(i))?,
            failed_at_ms: int("failed_at_ms")?,
            published_ns: int("published_ns")?,
        })
    }
}
