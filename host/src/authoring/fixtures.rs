//! The fixtures file `idem test` reads (TOML; docs/handlers.md, "Testing
//! a handler"):
//!
//! ```toml
//! [[fixture]]
//! name = "one credit"
//! [[fixture.message]]
//! json = { event_id = "e-1", account = "alice", amount = 5 }  # or payload = "raw text"
//! # subject = "accounts.credit"         default: the handler's only subject
//! # headers = { "Nats-Msg-Id" = "e-1" }
//! # outcome = "ok"                       or "reject" / "retry": the verdict the handler must give
//! [[fixture.expect]]
//! query = "SELECT account, balance FROM accounts ORDER BY account"
//! rows = [["alice", 5]]                 # NULL is { null = true }, bytes { hex = "0a0b" }
//! ```

use super::MessageInput;
use crate::sql_value::SqlValue;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The largest fixtures file read, bytes.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// A fixtures file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixtureFile {
    /// The fixtures, run in order, each from an empty transaction.
    #[serde(default)]
    pub fixture: Vec<Fixture>,
}

/// Messages, run in order, and the rows expected after them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixture {
    /// Shown in the report.
    pub name: String,
    /// At least one.
    pub message: Vec<FixtureMessage>,
    /// Checked after the messages (none: only the outcomes are checked).
    #[serde(default)]
    pub expect: Vec<Expect>,
}

/// One message of a fixture.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixtureMessage {
    /// The subject (default: the handler's only literal subject).
    pub subject: Option<String>,
    /// Headers; a table, so each name once.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The payload as a TOML value, sent as its JSON text.
    pub json: Option<toml::Value>,
    /// The payload as text, sent as it is.
    pub payload: Option<String>,
    /// The verdict the handler must give.
    #[serde(default)]
    pub outcome: Expected,
}

/// The verdict a fixture's message must get.
#[derive(Debug, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Expected {
    /// The handler returns ok: its effects commit.
    #[default]
    Ok,
    /// The handler rejects it (dead letter).
    Reject,
    /// The handler asks for a retry.
    Retry,
}

impl std::fmt::Display for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Expected::Ok => "ok",
            Expected::Reject => "reject",
            Expected::Retry => "retry",
        })
    }
}

/// A query and the rows it must return, in order.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// A SELECT over the handler's tables (checked by its SQL guard).
    pub query: String,
    /// The rows, each a list of values.
    pub rows: Vec<Vec<toml::Value>>,
}

impl FixtureFile {
    /// Reads and checks `path`.
    ///
    /// # Errors
    /// One line: the file cannot be read, is over [`MAX_FILE_BYTES`], is
    /// not valid TOML of this shape, has no fixture, a fixture without
    /// messages, a message with both or neither of `json` and `payload`,
    /// or an expected value that is no SQL value.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        use std::io::Read as _;
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_string(&mut text))
            .map_err(|e| anyhow::anyhow!("cannot read fixtures {}: {e}", path.display()))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            anyhow::bail!("{} is over {MAX_FILE_BYTES} bytes", path.display());
        }
        Self::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Parses and checks fixtures text (see [`FixtureFile::load`]).
    ///
    /// # Errors
    /// As [`FixtureFile::load`], without the file's name.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let file: FixtureFile =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", one_line(&e.to_string())))?;
        if file.fixture.is_empty() {
            anyhow::bail!("no [[fixture]]: nothing to test");
        }
        for f in &file.fixture {
            if f.message.is_empty() {
                anyhow::bail!("fixture `{}` has no [[fixture.message]]", escape(&f.name));
            }
            for (i, m) in f.message.iter().enumerate() {
                if m.json.is_some() == m.payload.is_some() {
                    anyhow::bail!(
                        "fixture `{}`, message {}: give exactly one of `json` and `payload`",
                        escape(&f.name),
                        i + 1
                    );
                }
            }
            for e in &f.expect {
                for row in &e.rows {
                    for v in row {
                        expected_value(v).map_err(|why| {
                            anyhow::anyhow!(
                                "fixture `{}`, expect `{}`: {}",
                                escape(&f.name),
                                escape(&e.query),
                                escape(&why)
                            )
                        })?;
                    }
                }
            }
        }
        Ok(file)
    }
}

impl FixtureMessage {
    /// The message as `idem invoke` takes one.
    ///
    /// # Errors
    /// The `json` value cannot be written as JSON (a float that is not
    /// finite). A TOML date-time is written as its text.
    pub fn input(&self) -> anyhow::Result<MessageInput> {
        let payload = match (&self.json, &self.payload) {
            (Some(v), _) => serde_json::to_vec(&json_of(v)?)?,
            (None, Some(text)) => text.clone().into_bytes(),
            (None, None) => Vec::new(),
        };
        Ok(MessageInput {
            subject: self.subject.clone(),
            headers: self
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            payload,
        })
    }
}

/// A TOML value as the JSON it stands for: a date-time as its text.
///
/// # Errors
/// A float that JSON cannot hold (NaN, infinity).
fn json_of(v: &toml::Value) -> anyhow::Result<serde_json::Value> {
    Ok(match v {
        toml::Value::String(s) => s.clone().into(),
        toml::Value::Integer(i) => (*i).into(),
        toml::Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(serde_json::Value::Number)
            .ok_or_else(|| anyhow::anyhow!("{f} cannot be written as JSON"))?,
        toml::Value::Boolean(b) => (*b).into(),
        toml::Value::Datetime(d) => d.to_string().into(),
        toml::Value::Array(a) => a
            .iter()
            .map(json_of)
            .collect::<anyhow::Result<Vec<_>>>()?
            .into(),
        toml::Value::Table(t) => t
            .iter()
            .map(|(k, v)| Ok((k.clone(), json_of(v)?)))
            .collect::<anyhow::Result<serde_json::Map<_, _>>>()?
            .into(),
    })
}

/// An expected value as the SQL value it stands for: integers, floats,
/// booleans and strings as they are; `{ null = true }` for NULL; `{ hex =
/// "…" }` for bytes.
///
/// # Errors
/// Any other TOML value (arrays, dates, other tables).
pub fn expected_value(v: &toml::Value) -> Result<SqlValue, String> {
    Ok(match v {
        toml::Value::Integer(i) => SqlValue::Integer(*i),
        toml::Value::Float(f) => SqlValue::Float(*f),
        toml::Value::Boolean(b) => SqlValue::Boolean(*b),
        toml::Value::String(s) => SqlValue::Text(s.clone()),
        toml::Value::Table(t)
            if t.len() == 1 && t.get("null") == Some(&toml::Value::Boolean(true)) =>
        {
            SqlValue::Null
        }
        toml::Value::Table(t) if t.len() == 1 && t.get("hex").is_some_and(toml::Value::is_str) => {
            let hex = t
                .get("hex")
                .and_then(toml::Value::as_str)
                .unwrap_or_default();
            SqlValue::Bytes(hex::decode(hex).map_err(|e| format!("`{hex}` is not hex: {e}"))?)
        }
        other => {
            return Err(format!(
                "`{other}` is no SQL value: write a number, a boolean, a string, {{ null = true }} or {{ hex = \"…\" }}"
            ));
        }
    })
}

/// Whether `actual` (as the database returned it) is `expected`: numbers
/// compare by value (an INTEGER column read back as a float, or the
/// reverse, matches), a boolean matches SQLite's 0/1, everything else
/// exactly.
pub fn same_value(expected: &SqlValue, actual: &SqlValue) -> bool {
    #[allow(clippy::cast_precision_loss)]
    // a fixture's integers are compared as the float the column holds
    match (expected, actual) {
        (SqlValue::Integer(a), SqlValue::Float(b)) | (SqlValue::Float(b), SqlValue::Integer(a)) => {
            (*a as f64) == *b
        }
        (SqlValue::Boolean(b), SqlValue::Integer(i)) => i64::from(*b) == *i,
        (a, b) => a == b,
    }
}

/// `text` on one line, escaped.
fn one_line(text: &str) -> String {
    escape(&text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// `text` escaped for a line of output.
fn escape(text: &str) -> String {
    crate::log_format::escape(text).into_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_fixture_file_parses_with_its_values() {
        let file = FixtureFile::parse(
            r#"
            [[fixture]]
            name = "one"
            [[fixture.message]]
            json = { event_id = "e-1", amount = 5, at = 1979-05-27T07:32:00Z }
            [[fixture.message]]
            payload = "not json"
            outcome = "reject"
            headers = { "Nats-Msg-Id" = "x" }
            [[fixture.expect]]
            query = "SELECT a FROM t"
            rows = [["alice", 5, 1.5, true, { null = true }, { hex = "00ff" }]]
            "#,
        )
        .unwrap();
        let f = &file.fixture[0];
        assert_eq!(f.message.len(), 2);
        assert_eq!(f.message[1].outcome, Expected::Reject);
        let input = f.message[0].input().unwrap();
        let json: serde_json::Value = serde_json::from_slice(&input.payload).unwrap();
        assert_eq!(
            json,
            serde_json::json!({ "event_id": "e-1", "amount": 5, "at": "1979-05-27T07:32:00Z" })
        );
        assert_eq!(
            f.message[1].input().unwrap().headers,
            vec![("Nats-Msg-Id".into(), "x".into())]
        );
        let values: Vec<SqlValue> = f.expect[0].rows[0]
            .iter()
            .map(|v| expected_value(v).unwrap())
            .collect();
        assert_eq!(
            values,
            vec![
                SqlValue::Text("alice".into()),
                SqlValue::Integer(5),
                SqlValue::Float(1.5),
                SqlValue::Boolean(true),
                SqlValue::Null,
                SqlValue::Bytes(vec![0, 255]),
            ]
        );
    }

    #[test]
    fn bad_fixture_files_say_what_is_wrong() {
        let err = |text: &str| FixtureFile::parse(text).unwrap_err().to_string();
        assert!(err("").contains("no [[fixture]]"), "{}", err(""));
        let both = "[[fixture]]\nname = \"x\"\n[[fixture.message]]\njson = 1\npayload = \"a\"\n";
        assert!(
            err(both).contains("exactly one of `json` and `payload`"),
            "{}",
            err(both)
        );
        let none = "[[fixture]]\nname = \"x\"\nmessage = []\n";
        assert!(
            err(none).contains("has no [[fixture.message]]"),
            "{}",
            err(none)
        );
        let bad = "[[fixture]]\nname = \"x\"\n[[fixture.message]]\npayload = \"a\"\n[[fixture.expect]]\nquery = \"q\"\nrows = [[[1]]]\n";
        assert!(err(bad).contains("is no SQL value"), "{}", err(bad));
        let unknown = "[[fixture]]\nname = \"x\"\nmesage = []\n";
        assert!(err(unknown).contains("unknown field"), "{}", err(unknown));
    }

    #[test]
    fn values_compare_as_the_database_returns_them() {
        assert!(same_value(&SqlValue::Integer(5), &SqlValue::Float(5.0)));
        assert!(same_value(&SqlValue::Boolean(true), &SqlValue::Integer(1)));
        assert!(!same_value(
            &SqlValue::Integer(5),
            &SqlValue::Text("5".into())
        ));
        assert!(!same_value(&SqlValue::Null, &SqlValue::Text("NULL".into())));
    }
}
