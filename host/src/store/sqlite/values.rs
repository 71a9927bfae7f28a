//! SQLite: guest values bound as parameters, and values decoded by their
//! storage class.

use super::codes::map_error;
use crate::sql_value::{DbError, DbErrorKind, SqlValue};
use crate::store::one_line;
use sqlx::error::BoxDynError;
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteRow, SqliteValueRef};
use sqlx::{Column as _, Decode, Row as _, Sqlite, TypeInfo as _, ValueRef as _};

/// Binds guest values in order; `$N` in the text is matched to value N by
/// sqlx-sqlite (it reads the number from the parameter's name). Booleans are
/// stored as integers 0/1, as SQLite has no boolean storage class.
pub(super) fn bind<'q>(
    mut q: Query<'q, Sqlite, SqliteArguments>,
    params: &[SqlValue],
) -> Query<'q, Sqlite, SqliteArguments> {
    for p in params {
        q = match p {
            SqlValue::Null => q.bind(None::<i64>),
            SqlValue::Integer(i) => q.bind(*i),
            SqlValue::Float(f) => q.bind(*f),
            SqlValue::Text(s) => q.bind(s.clone()),
            SqlValue::Bytes(b) => q.bind(b.clone()),
            SqlValue::Boolean(b) => q.bind(*b),
        };
    }
    q
}

pub(super) fn decode_row(row: &SqliteRow) -> Result<Vec<SqlValue>, DbError> {
    let mut values = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let raw = row.try_get_raw(i).map_err(map_error)?;
        values.push(decode_value(column.name(), raw)?);
    }
    Ok(values)
}

/// One value by its storage class (NULL, INTEGER, REAL, TEXT, BLOB), whatever
/// the column's declared type.
fn decode_value(column: &str, raw: SqliteValueRef<'_>) -> Result<SqlValue, DbError> {
    if raw.is_null() {
        return Ok(SqlValue::Null);
    }
    let class = raw.type_info().name().to_owned();
    let decoded: Result<SqlValue, BoxDynError> = match class.as_str() {
        "INTEGER" => <i64 as Decode<Sqlite>>::decode(raw).map(SqlValue::Integer),
        "REAL" => <f64 as Decode<Sqlite>>::decode(raw).map(SqlValue::Float),
        "TEXT" => <String as Decode<Sqlite>>::decode(raw).map(SqlValue::Text),
        "BLOB" => <Vec<u8> as Decode<Sqlite>>::decode(raw).map(SqlValue::Bytes),
        other => Err(format!("unexpected storage class {other}").into()),
    };
    decoded.map_err(|e| DbError {
        kind: DbErrorKind::Other,
        message: one_line(&format!("cannot decode column `{column}` ({class}): {e}")),
    })
}
