//! PostgreSQL: guest values bound as parameters, and column values decoded
//! by their type.

use super::codes::map_error;
use crate::sql_value::{DbError, DbErrorKind, SqlValue};
use crate::store::one_line;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgArgumentBuffer, PgArguments, PgRow, PgTypeInfo, PgValueRef};
use sqlx::query::Query;
use sqlx::{Column as _, Decode, Postgres, Row as _, TypeInfo as _, ValueRef as _};

/// A NULL parameter with no declared type (OID 0): PostgreSQL infers the
/// type from the statement, so `NULL` fits any column. (Binding `None::<i64>`
/// would declare `int8` and fail against a text column.)
struct UntypedNull;

impl sqlx::Type<Postgres> for UntypedNull {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(0))
    }
}

impl sqlx::Encode<'_, Postgres> for UntypedNull {
    fn encode_by_ref(&self, _buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        Ok(IsNull::Yes)
    }
}

/// Binds guest values in order: integer → `int8`, float → `float8`, text →
/// `text`, bytes → `bytea`, boolean → `bool`, null → untyped.
pub(super) fn bind<'q>(
    mut q: Query<'q, Postgres, PgArguments>,
    params: &[SqlValue],
) -> Query<'q, Postgres, PgArguments> {
    for p in params {
        q = match p {
            SqlValue::Null => q.bind(UntypedNull),
            SqlValue::Integer(i) => q.bind(*i),
            SqlValue::Float(f) => q.bind(*f),
            SqlValue::Text(s) => q.bind(s.as_str()),
            SqlValue::Bytes(b) => q.bind(b.as_slice()),
            SqlValue::Boolean(b) => q.bind(*b),
        };
    }
    q
}

/// The bytes of a row's values as PostgreSQL sent them (NULL: none).
pub(super) fn raw_size(row: &PgRow) -> usize {
    (0..row.len())
        .filter_map(|i| row.try_get_raw(i).ok())
        .filter_map(|raw| raw.as_bytes().ok().map(<[u8]>::len))
        .sum()
}

pub(super) fn decode_row(row: &PgRow) -> Result<Vec<SqlValue>, DbError> {
    let mut values = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let raw = row.try_get_raw(i).map_err(map_error)?;
        values.push(decode_value(column.name(), column.type_info(), raw)?);
    }
    Ok(values)
}

/// The column types idem decodes, by OID (stable built-in OIDs, `pg_type.h`).
#[derive(Clone, Copy)]
enum PgKind {
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Text,
    Bytea,
    Bool,
}

fn pg_kind(ty: &PgTypeInfo) -> Option<PgKind> {
    Some(match ty.oid()?.0 {
        21 => PgKind::Int2,
        23 => PgKind::Int4,
        20 => PgKind::Int8,
        700 => PgKind::Float4,
        701 => PgKind::Float8,
        // text, varchar, bpchar (char(n)), name, unknown
        25 | 1043 | 1042 | 19 | 705 => PgKind::Text,
        17 => PgKind::Bytea,
        16 => PgKind::Bool,
        _ => return None,
    })
}

/// One value by its column's type; unsupported types are refused even when
/// the value is NULL, so a query's success never depends on its data.
fn decode_value(column: &str, ty: &PgTypeInfo, raw: PgValueRef<'_>) -> Result<SqlValue, DbError> {
    let Some(kind) = pg_kind(ty) else {
        return Err(DbError {
            kind: DbErrorKind::Other,
            message: format!(
                "column `{column}` has type {}; cast it in SQL (e.g. ::text or ::bigint)",
                ty.name()
            ),
        });
    };
    if raw.is_null() {
        return Ok(SqlValue::Null);
    }
    let decoded: Result<SqlValue, BoxDynError> = match kind {
        PgKind::Int2 => <i16 as Decode<Postgres>>::decode(raw).map(|v| SqlValue::Integer(v.into())),
        PgKind::Int4 => <i32 as Decode<Postgres>>::decode(raw).map(|v| SqlValue::Integer(v.into())),
        PgKind::Int8 => <i64 as Decode<Postgres>>::decode(raw).map(SqlValue::Integer),
        PgKind::Float4 => <f32 as Decode<Postgres>>::decode(raw).map(|v| SqlValue::Float(v.into())),
        PgKind::Float8 => <f64 as Decode<Postgres>>::decode(raw).map(SqlValue::Float),
        PgKind::Text => <String as Decode<Postgres>>::decode(raw).map(SqlValue::Text),
        PgKind::Bytea => <Vec<u8> as Decode<Postgres>>::decode(raw).map(SqlValue::Bytes),
        PgKind::Bool => <bool as Decode<Postgres>>::decode(raw).map(SqlValue::Boolean),
    };
    decoded.map_err(|e| DbError {
        kind: DbErrorKind::Other,
        message: one_line(&format!(
            "cannot decode column `{column}` ({}): {e}",
            ty.name()
        )),
    })
}
