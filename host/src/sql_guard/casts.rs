//! Casts and clock literals (DESIGN invariant 8: no catalogs, and no clock
//! beyond what the host passes).
//!
//! PostgreSQL reaches its catalogs through types as well as tables:
//! `'idem_receipts'::regclass::oid` is the host table's oid, and `regproc`,
//! `regtype`, `regrole`, ... look up functions, types and roles by name. Its
//! date/time input reads the clock: `'now'::timestamptz`, `DATE 'today'`, and
//! an untyped `'now'` inserted into a timestamptz column are the current time
//! ("Special Date/Time Inputs" in the PostgreSQL manual). So:
//! - every cast (`::`, `CAST`, `TRY_CAST`) and typed literal (`DATE '...'`)
//!   targets a plain value type ([`check_cast_type`]), on both databases;
//! - on PostgreSQL, no string literal anywhere in the statement contains a word
//!   that date/time input reads from the clock ([`clock_word`]). A literal is
//!   refused wherever it stands, because an untyped literal takes the type of
//!   its context; the price is that prose such as `'ship today'` must be passed
//!   as a parameter. SQLite has no such input (`CAST('now' AS TIMESTAMP)` is
//!   0 there), so its literals are left alone.
//!
//! Not caught here: text that spells `now` only when the statement runs. A
//! text *parameter* bound to `'now'` and cast (`$1::timestamptz`), a text
//! column holding `'now'`, or text the statement builds (`'n' || 'ow'`, JSON
//! `->>` of `"n\u006fw"`) is read by PostgreSQL's date/time input like a
//! literal, and the guard sees statement text, never values. That has to be
//! enforced where values are bound, in the store (`store/postgres.rs`, `bind`):
//! carry times as typed values bound in binary (no text input parsing), after
//! which this guard can refuse casts of anything but a literal to a date/time
//! type.

use super::one_line;
use crate::store::DbError;
use sqlparser::ast::{DataType, ObjectNamePart, Value};
use std::ops::ControlFlow;

/// Words PostgreSQL's date/time input replaces with a reading of the clock.
const CLOCK_WORDS: &[&str] = &["now", "today", "tomorrow", "yesterday"];

/// The cast targets a guest may use, as named in the refusal message.
const ALLOWED_TYPES: &str = "integer, bigint, smallint, numeric, decimal, real, double precision, \
    float, text, varchar, char, boolean, bytea, blob, date, time, timestamp, timestamptz, interval, \
    json, jsonb, uuid";

/// Allows a cast or typed literal to `data_type` only when it is a plain value
/// type; names the type and why otherwise.
pub(super) fn check_cast_type(data_type: &DataType) -> ControlFlow<DbError> {
    use DataType as T;
    match data_type {
        T::TinyInt(_)
        | T::SmallInt(_)
        | T::Int2(_)
        | T::MediumInt(_)
        | T::Int(_)
        | T::Int4(_)
        | T::Integer(_)
        | T::BigInt(_)
        | T::Int8(_)
        | T::Numeric(_)
        | T::Decimal(_)
        | T::Dec(_)
        | T::Real
        | T::Float(_)
        | T::Float4
        | T::Float8
        | T::Double(_)
        | T::DoublePrecision
        | T::Text
        | T::Varchar(_)
        | T::CharacterVarying(_)
        | T::CharVarying(_)
        | T::Char(_)
        | T::Character(_)
        | T::Bool
        | T::Boolean
        | T::Bytea
        | T::Blob(_)
        | T::Date
        | T::Time(..)
        | T::Timestamp(..)
        | T::Interval { .. }
        | T::JSON
        | T::JSONB
        | T::Uuid => ControlFlow::Continue(()),
        other => {
            let name = match other {
                T::Regclass => "regclass".to_owned(),
                T::Custom(name, _) => match name.0.last() {
                    Some(ObjectNamePart::Identifier(i)) => i.value.to_ascii_lowercase(),
                    _ => String::new(),
                },
                _ => String::new(),
            };
            let why = if name.starts_with("reg") {
                "reg* types look names up in the system catalogs".to_owned()
            } else if name == "oid" {
                "oids identify system catalog objects".to_owned()
            } else if name.starts_with("pg_") || ["tid", "xid", "xid8", "cid"].contains(&&*name) {
                "it exposes server internals (row, transaction or WAL positions)".to_owned()
            } else {
                format!("casts may target only plain value types ({ALLOWED_TYPES})")
            };
            ControlFlow::Break(DbError::denied(one_line(&format!(
                "cast to `{other}` is not allowed: {why}"
            ))))
        }
    }
}

/// The first word of `text` that PostgreSQL's date/time input reads from the
/// clock. The input splits text into fields at anything but a letter
/// (`'today 10:00'`, `'10:00today'`, `' NOW '` all read the clock), and
/// matches words case-insensitively, so any whole run of ASCII letters
/// counts.
pub(super) fn clock_word(text: &str) -> Option<&'static str> {
    text.split(|c: char| !c.is_ascii_alphabetic())
        .find_map(|field| {
            CLOCK_WORDS
                .iter()
                .copied()
                .find(|w| field.eq_ignore_ascii_case(w))
        })
}

/// Refuses a PostgreSQL string literal that names the clock (see [`clock_word`]).
pub(super) fn check_pg_literal(value: &Value) -> ControlFlow<DbError> {
    let Some(text) = literal_text(value) else {
        return ControlFlow::Continue(());
    };
    let Some(word) = clock_word(text) else {
        return ControlFlow::Continue(());
    };
    let trimmed = text.trim();
    let message = if trimmed.eq_ignore_ascii_case(word) {
        format!(
            "the literal '{trimmed}' reads the database clock; pass times in the message instead"
        )
    } else {
        let mut shown: String = text
            .chars()
            .take(40)
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if text.chars().nth(40).is_some() {
            shown.push_str("...");
        }
        format!(
            "the literal '{shown}' contains '{word}', which PostgreSQL reads from the database clock; \
             pass times in the message instead (other text as a parameter)"
        )
    };
    ControlFlow::Break(DbError::denied(message))
}

/// The text of a string literal, after sqlparser decoded its escapes.
fn literal_text(value: &Value) -> Option<&str> {
    match value {
        Value::SingleQuotedString(s)
        | Value::DoubleQuotedString(s)
        | Value::TripleSingleQuotedString(s)
        | Value::TripleDoubleQuotedString(s)
        | Value::SingleQuotedByteStringLiteral(s)
        | Value::DoubleQuotedByteStringLiteral(s)
        | Value::TripleSingleQuotedByteStringLiteral(s)
        | Value::TripleDoubleQuotedByteStringLiteral(s)
        | Value::SingleQuotedRawStringLiteral(s)
        | Value::DoubleQuotedRawStringLiteral(s)
        | Value::TripleSingleQuotedRawStringLiteral(s)
        | Value::TripleDoubleQuotedRawStringLiteral(s)
        | Value::EscapedStringLiteral(s)
        | Value::UnicodeStringLiteral(s)
        | Value::NationalStringLiteral(s)
        | Value::HexStringLiteral(s) => Some(s),
        Value::DollarQuotedString(s) => Some(&s.value),
        Value::QuoteDelimitedStringLiteral(s) | Value::NationalQuoteDelimitedStringLiteral(s) => {
            Some(&s.value)
        }
        Value::Number(..) | Value::Boolean(_) | Value::Null | Value::Placeholder(_) => None,
    }
}
