//! Typed reading of query results: [`FromValue`] for column values, and
//! [`Row`] for one row of [`Rows`], so a handler writes
//! `row.get::<i64>("balance")?` instead of matching on [`Value`].
//!
//! A value of the wrong type is a [`HandlerError::Reject`]: the same query
//! on the same data would fail the same way on every delivery, so the
//! message goes to the dead letters (fix the handler, then
//! `idem dlq redrive`).

use crate::value::{HandlerError, Rows, Value};

/// A Rust type a column value converts into.
///
/// Implemented for `i64`, `i32`, `u32`, `f64`, `bool`, `String`, `Vec<u8>`
/// and `Option<T>` (SQL NULL is `None`; for the others NULL is an error).
/// Integers convert to `f64`; SQLite stores booleans as 0 / 1, so integers
/// convert to `bool` too.
///
/// | Type | Accepts |
/// |------|---------|
/// | `i64` | [`Value::Integer`] |
/// | `i32`, `u32` | [`Value::Integer`] in the type's range |
/// | `f64` | [`Value::Float`], [`Value::Integer`] (see [`Value::as_f64`]) |
/// | `bool` | [`Value::Boolean`], [`Value::Integer`] (0 is `false`) |
/// | `String` | [`Value::Text`] |
/// | `Vec<u8>` | [`Value::Bytes`] |
/// | `Option<T>` | [`Value::Null`] as `None`, else what `T` accepts |
///
/// Implement it for a type of your own to read it with
/// [`Row::get`]; the error string becomes part of a
/// [`HandlerError::Reject`] reason.
pub trait FromValue: Sized {
    /// Converts `v`.
    ///
    /// # Errors
    ///
    /// One line saying what was expected and what was found instead, e.g.
    /// `expected an integer, found text` or `1099511627776 does not fit an
    /// i32`.
    fn from_value(v: &Value) -> Result<Self, String>;
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "NULL",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Text(_) => "text",
        Value::Bytes(_) => "bytes",
        Value::Boolean(_) => "a boolean",
    }
}

fn expected<T>(what: &str, v: &Value) -> Result<T, String> {
    Err(format!("expected {what}, found {}", kind(v)))
}

impl FromValue for i64 {
    fn from_value(v: &Value) -> Result<Self, String> {
        v.as_i64().map_or_else(|| expected("an integer", v), Ok)
    }
}

impl FromValue for i32 {
    fn from_value(v: &Value) -> Result<Self, String> {
        let n = i64::from_value(v)?;
        i32::try_from(n).map_err(|_| format!("{n} does not fit an i32"))
    }
}

impl FromValue for u32 {
    fn from_value(v: &Value) -> Result<Self, String> {
        let n = i64::from_value(v)?;
        u32::try_from(n).map_err(|_| format!("{n} does not fit a u32"))
    }
}

impl FromValue for f64 {
    fn from_value(v: &Value) -> Result<Self, String> {
        v.as_f64().map_or_else(|| expected("a number", v), Ok)
    }
}

impl FromValue for bool {
    fn from_value(v: &Value) -> Result<Self, String> {
        v.as_bool().map_or_else(|| expected("a boolean", v), Ok)
    }
}

impl FromValue for String {
    fn from_value(v: &Value) -> Result<Self, String> {
        v.as_str()
            .map_or_else(|| expected("text", v), |s| Ok(s.to_owned()))
    }
}

impl FromValue for Vec<u8> {
    fn from_value(v: &Value) -> Result<Self, String> {
        v.as_bytes()
            .map_or_else(|| expected("bytes", v), |b| Ok(b.to_vec()))
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: &Value) -> Result<Self, String> {
        if v.is_null() {
            Ok(None)
        } else {
            T::from_value(v).map(Some)
        }
    }
}

/// One row of a query result, borrowed from its [`Rows`]: the column names
/// and this row's values, read by column name. Made by [`Rows::iter`],
/// [`Rows::first`] and [`Rows::one`].
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    columns: &'a [String],
    values: &'a [Value],
}

impl<'a> Row<'a> {
    /// Column `name` as a `T` (any [`FromValue`] type). Names compare
    /// exactly, as [`Rows::column`] does; the first column of that name wins.
    ///
    /// # Errors
    ///
    /// [`HandlerError::Reject`], since the same query on the same data would
    /// fail the same way on every delivery:
    ///
    /// - no such column: ``query result has no column `name` (columns: a, b)``;
    /// - a value that is not a `T` (NULL included, unless `T` is an
    ///   `Option`): ``column `name`: expected an integer, found text``.
    pub fn get<T: FromValue>(&self, name: &str) -> Result<T, HandlerError> {
        let value = self
            .columns
            .iter()
            .position(|c| c == name)
            .and_then(|i| self.values.get(i))
            .ok_or_else(|| {
                HandlerError::reject(format!(
                    "query result has no column `{name}` (columns: {})",
                    self.columns.join(", ")
                ))
            })?;
        T::from_value(value).map_err(|e| HandlerError::reject(format!("column `{name}`: {e}")))
    }

    /// The raw value of column `name`, if there is one (the first column of
    /// that name); `None` when the row has no such column.
    pub fn value(&self, name: &str) -> Option<&'a Value> {
        let i = self.columns.iter().position(|c| c == name)?;
        self.values.get(i)
    }
}

impl Rows {
    /// The rows, in the order the query returned them (unordered unless the
    /// query says `ORDER BY`).
    pub fn iter(&self) -> impl Iterator<Item = Row<'_>> {
        self.rows.iter().map(|values| Row {
            columns: &self.columns,
            values,
        })
    }

    /// The first row, if any: for queries of at most one row, e.g. by
    /// primary key.
    pub fn first(&self) -> Option<Row<'_>> {
        self.iter().next()
    }

    /// Exactly one row: for a query that must find its row, e.g. one that
    /// the handler inserted earlier in the same message.
    ///
    /// # Errors
    ///
    /// [`HandlerError::Reject`] when the query returned no row or several
    /// (`expected exactly one row, the query returned <n>`). For a row that
    /// may be missing use [`Rows::first`].
    pub fn one(&self) -> Result<Row<'_>, HandlerError> {
        match self.rows.len() {
            1 => self.first().ok_or_else(|| HandlerError::reject("no row")),
            n => Err(HandlerError::reject(format!(
                "expected exactly one row, the query returned {n}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Rows {
        Rows {
            columns: vec!["id".into(), "name".into(), "note".into(), "ok".into()],
            rows: vec![
                vec![
                    Value::Integer(7),
                    Value::Text("a".into()),
                    Value::Null,
                    Value::Integer(1),
                ],
                vec![
                    Value::Integer(8),
                    Value::Text("b".into()),
                    Value::Text("n".into()),
                    Value::Boolean(false),
                ],
            ],
        }
    }

    #[test]
    fn rows_decode_by_column_name() {
        let r = rows();
        let got: Vec<(i64, String, Option<String>, bool)> = r
            .iter()
            .map(|row| {
                Ok((
                    row.get("id")?,
                    row.get("name")?,
                    row.get("note")?,
                    row.get("ok")?,
                ))
            })
            .collect::<Result<_, HandlerError>>()
            .unwrap_or_default();
        assert_eq!(
            got,
            vec![
                (7, "a".to_string(), None, true),
                (8, "b".to_string(), Some("n".to_string()), false)
            ]
        );
        assert_eq!(
            r.first().map(|row| row.get::<f64>("id").ok()),
            Some(Some(7.0))
        );
    }

    #[test]
    fn wrong_types_and_counts_reject_with_one_line() {
        let r = rows();
        let first = r.first();
        let err = |res: Result<i64, HandlerError>| match res {
            Err(HandlerError::Reject(m)) => m,
            other => format!("not a reject: {other:?}"),
        };
        assert_eq!(
            err(first.map_or(Ok(0), |row| row.get::<i64>("name"))),
            "column `name`: expected an integer, found text"
        );
        assert_eq!(
            err(first.map_or(Ok(0), |row| row.get::<i64>("note"))),
            "column `note`: expected an integer, found NULL"
        );
        assert_eq!(
            err(first.map_or(Ok(0), |row| row.get::<i64>("nope"))),
            "query result has no column `nope` (columns: id, name, note, ok)"
        );
        assert!(
            matches!(r.one(), Err(HandlerError::Reject(m)) if m == "expected exactly one row, the query returned 2")
        );
        assert_eq!(
            i32::from_value(&Value::Integer(1 << 40)),
            Err("1099511627776 does not fit an i32".into())
        );
    }
}
