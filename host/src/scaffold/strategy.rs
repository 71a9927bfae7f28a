//! A strategy's description (`host/templates/strategies/<name>/strategy.toml`):
//! its payload fields and its statements with their parameters, described
//! once and rendered into every language's source (ARCHITECTURE.md,
//! "Handler scaffolding").

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One strategy as its `strategy.toml` describes it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Description {
    /// Its name in titles ("Natural unique key").
    pub title: String,
    /// What the handler does, one clause ("adds `amount` to ...").
    pub summary: String,
    /// Why it changes the database exactly once, a paragraph.
    pub how: String,
    /// The prefix of the reason a malformed payload is rejected with.
    pub reject_what: String,
    /// The JetStream stream of the generated `idem.toml`.
    pub stream: String,
    /// The handler's one subject.
    pub subject: String,
    /// The tables its SQL may touch.
    pub tables: Vec<String>,
    /// The file name of its one migration under `migrations/`.
    pub migration: String,
    /// The payload's fields, in order (`event_id` too when a statement uses it).
    pub field: Vec<Field>,
    /// The statements, run in order.
    pub statement: Vec<Statement>,
    /// Field name to type, filled by [`Description::parse`] for the templates.
    #[serde(default, skip_deserializing)]
    pub types: BTreeMap<String, FieldType>,
}

/// A payload field.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Field {
    /// The JSON member's name, also the identifier in every language.
    pub name: String,
    /// Its type.
    #[serde(rename = "type")]
    pub ty: FieldType,
}

/// The types a payload field may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldType {
    /// A JSON string.
    Text,
    /// A JSON integer within a signed 64-bit range.
    Integer,
}

/// One statement of the handler.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    /// Its constant's name in the source (`CREDIT`).
    pub name: String,
    /// A sentence on what it does.
    pub doc: String,
    /// Its SQL, one element a source line; joined with spaces.
    pub sql: Vec<String>,
    /// The fields bound to `$1..$n`, in order.
    pub params: Vec<String>,
    /// When set: if the statement changes no row, the handler logs this
    /// line and stops (the message is done, nothing more to write).
    #[serde(default)]
    pub unchanged: Option<String>,
    /// The SQL lines as the templates write them (each but the last ends
    /// with a space), filled by [`Description::parse`].
    #[serde(default, skip_deserializing)]
    pub parts: Vec<String>,
}

impl Description {
    /// Parses and checks a `strategy.toml`.
    ///
    /// # Errors
    /// The TOML does not parse, a field name is no plain lower-case
    /// identifier, a parameter names no field, or the SQL carries a
    /// character no language's plain string literal can hold.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut d: Description = toml::from_str(text).map_err(|e| e.to_string())?;
        for f in &d.field {
            let ident = f.name.starts_with(|c: char| c.is_ascii_lowercase())
                && f.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !ident {
                return Err(format!("field `{}` is not a lower-case identifier", f.name));
            }
            d.types.insert(f.name.clone(), f.ty);
        }
        for st in &mut d.statement {
            if let Some(p) = st.params.iter().find(|p| !d.types.contains_key(*p)) {
                return Err(format!(
                    "statement {}: parameter `{p}` is no field",
                    st.name
                ));
            }
            if st.sql.iter().any(|l| l.chars().any(char::is_control)) {
                return Err(format!("statement {}: a control character", st.name));
            }
            let last = st.sql.len().saturating_sub(1);
            st.parts = st
                .sql
                .iter()
                .enumerate()
                .map(|(i, l)| if i < last { format!("{l} ") } else { l.clone() })
                .collect();
        }
        Ok(d)
    }
}
