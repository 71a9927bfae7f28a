//! SQL values as `idem invoke` and `idem test` show them: escaped, so that
//! nothing a guest or a database returns can forge a line of the report.

use crate::sql_value::SqlValue;

/// The most bytes of a blob shown (as hex); the rest is counted.
const MAX_SHOWN_BYTES: usize = 64;

/// The most bytes of a text value shown; the rest is counted.
const MAX_SHOWN_TEXT: usize = 1024;

/// `value` as SQL-like text: `NULL`, `5`, `1.5`, `true`, `'text'` (quotes
/// doubled, control characters escaped), `x'0a0b'` (at most
/// [`MAX_SHOWN_BYTES`], then `… (N bytes)`).
pub(crate) fn value(value: &SqlValue) -> String {
    match value {
        SqlValue::Null => "NULL".into(),
        SqlValue::Integer(i) => i.to_string(),
        SqlValue::Float(f) => format!("{f:?}"),
        SqlValue::Boolean(b) => b.to_string(),
        SqlValue::Text(s) => {
            let mut cut = s.len().min(MAX_SHOWN_TEXT);
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            let shown = s.get(..cut).unwrap_or_default();
            let mut out = format!("'{}'", crate::log_format::escape(shown).replace('\'', "''"));
            if cut < s.len() {
                out.push_str(&format!("… ({} bytes)", s.len()));
            }
            out
        }
        SqlValue::Bytes(b) => {
            let shown = b.get(..MAX_SHOWN_BYTES).unwrap_or(b);
            let mut out = format!("x'{}'", hex::encode(shown));
            if shown.len() < b.len() {
                out.push_str(&format!("… ({} bytes)", b.len()));
            }
            out
        }
    }
}

/// `values` as one row: `(a, b, c)`.
pub(crate) fn row(values: &[SqlValue]) -> String {
    let shown: Vec<String> = values.iter().map(value).collect();
    format!("({})", shown.join(", "))
}

/// `value` as JSON: `null`, a number, a boolean, a string, or
/// `{"hex": "…"}` for bytes.
pub(crate) fn json(value: &SqlValue) -> serde_json::Value {
    match value {
        SqlValue::Null => serde_json::Value::Null,
        SqlValue::Integer(i) => (*i).into(),
        SqlValue::Float(f) => serde_json::Number::from_f64(*f)
            .map_or_else(|| f.to_string().into(), serde_json::Value::Number),
        SqlValue::Boolean(b) => (*b).into(),
        SqlValue::Text(s) => s.clone().into(),
        SqlValue::Bytes(b) => serde_json::json!({ "hex": hex::encode(b) }),
    }
}

/// A byte count as people read it: `512 B`, `1.5 KiB`, `64 MiB`.
pub(crate) fn bytes(n: usize) -> String {
    #[allow(clippy::cast_precision_loss)] // shown with one decimal
    let f = n as f64;
    if n < 1024 {
        format!("{n} B")
    } else if n < 1024 * 1024 {
        format!("{:.1} KiB", f / 1024.0)
    } else {
        format!("{:.1} MiB", f / (1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn values_are_escaped_and_bounded() {
        assert_eq!(value(&SqlValue::Text("it's\nx".into())), "'it''s\\nx'");
        assert_eq!(value(&SqlValue::Null), "NULL");
        assert_eq!(value(&SqlValue::Float(1.5)), "1.5");
        assert_eq!(value(&SqlValue::Bytes(vec![0, 255])), "x'00ff'");
        let long = value(&SqlValue::Bytes(vec![1; 100]));
        assert!(long.ends_with("… (100 bytes)"), "{long}");
        assert_eq!(
            row(&[SqlValue::Integer(5), SqlValue::Boolean(true)]),
            "(5, true)"
        );
        assert_eq!(bytes(1536), "1.5 KiB");
    }
}
