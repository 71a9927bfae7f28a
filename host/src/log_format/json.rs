//! The JSON log format ([`super`]): one object per line, `timestamp`,
//! `level`, the event's fields at the top level (`message`, …), `target`,
//! and `spans`, the open spans outermost first, each an object of its
//! fields and `name`. Numbers and booleans stay JSON numbers and booleans;
//! every other value is a string, cut to [`MAX_FIELD_BYTES`] as written.

use super::{Bounded, MAX_FIELD_BYTES, MAX_RECORD_BYTES, json_char_cost, needs_escape};
use serde::ser::{SerializeMap, Serializer as _};
use serde_json::{Map, Value};
use std::fmt::{self, Write as _};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON format's [`FormatFields`], for spans: their fields as one JSON
/// object, capped as [`super`] says.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonFields;

impl<'w> FormatFields<'w> for JsonFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = JsonVisitor::new(MAX_RECORD_BYTES);
        fields.record(&mut visitor);
        writer.write_str(&to_json(&Value::Object(visitor.into_map()))?)
    }

    /// Adds to a span's object (`span.record(…)`): parsed, extended, written
    /// again.
    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let map: Map<String, Value> = if current.fields.is_empty() {
            Map::new()
        } else {
            serde_json::from_str(&current.fields).map_err(|_| fmt::Error)?
        };
        let mut visitor = JsonVisitor::new(MAX_RECORD_BYTES.saturating_sub(current.fields.len()));
        visitor.fields = map.into_iter().collect();
        fields.record(&mut visitor);
        current.fields = to_json(&Value::Object(visitor.into_map()))?;
        Ok(())
    }
}

/// The JSON format's [`FormatEvent`]: one object per event and line.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLines;

impl<S> FormatEvent<S, JsonFields> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        let mut fields = JsonVisitor::new(MAX_RECORD_BYTES);
        event.record(&mut fields);
        let spans: Vec<Value> = ctx
            .event_scope()
            .map(|scope| {
                scope
                    .from_root()
                    .map(|span| {
                        let mut object: Map<String, Value> = span
                            .extensions()
                            .get::<FormattedFields<JsonFields>>()
                            .and_then(|f| serde_json::from_str(&f.fields).ok())
                            .unwrap_or_default();
                        object.insert("name".into(), Value::from(span.name()));
                        Value::Object(object)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut out = Vec::with_capacity(256);
        serialize_line(&mut out, &timestamp, meta, &fields.into_entries(), &spans)
            .map_err(|_| fmt::Error)?;
        writer.write_str(&escape_rest(&String::from_utf8_lossy(&out)))?;
        writer.write_char('\n')
    }
}

/// One event's object, in the order the module's docs give.
fn serialize_line(
    out: &mut Vec<u8>,
    timestamp: &str,
    meta: &tracing::Metadata<'_>,
    fields: &[(String, Value)],
    spans: &[Value],
) -> Result<(), serde_json::Error> {
    let mut serializer = serde_json::Serializer::new(out);
    let mut map = serializer.serialize_map(None)?;
    map.serialize_entry("timestamp", timestamp)?;
    map.serialize_entry("level", meta.level().as_str())?;
    for (name, value) in fields {
        map.serialize_entry(name, value)?;
    }
    map.serialize_entry("target", meta.target())?;
    if !spans.is_empty() {
        map.serialize_entry("spans", spans)?;
    }
    map.end()
}

/// `value` as compact JSON, with [`escape_rest`] applied.
fn to_json(value: &Value) -> Result<String, fmt::Error> {
    let text = serde_json::to_string(value).map_err(|_| fmt::Error)?;
    Ok(escape_rest(&text).into_owned())
}

/// Serialized JSON with the characters serde_json leaves raw but
/// [`needs_escape`] picks (DEL, C1 controls, separators, bidirectional
/// controls) written as `\u` and four hex digits. They can stand only inside strings (no
/// JSON syntax uses them), so the result is the same JSON value.
fn escape_rest(json: &str) -> std::borrow::Cow<'_, str> {
    if !json.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if needs_escape(c) {
            // All of them are in the Basic Multilingual Plane.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Collects one record's fields as JSON values, in the order they come,
/// strings cut to what fits.
struct JsonVisitor {
    fields: Vec<(String, Value)>,
    /// Bytes the record may still take.
    left: usize,
    /// Fields left out once the record's bytes were spent.
    skipped: usize,
}

impl JsonVisitor {
    fn new(left: usize) -> Self {
        Self {
            fields: Vec::new(),
            left,
            skipped: 0,
        }
    }

    /// The fields, and `fields_left_out` (how many) when some did not fit.
    fn into_entries(mut self) -> Vec<(String, Value)> {
        if self.skipped > 0 {
            self.fields
                .push(("fields_left_out".into(), Value::from(self.skipped)));
        }
        self.fields
    }

    fn into_map(self) -> Map<String, Value> {
        self.into_entries().into_iter().collect()
    }

    /// The field's name as written, or `None` for one not written.
    fn name(field: &Field) -> Option<&'static str> {
        let name = field.name();
        // The `log` crate's metadata, already shown as the target.
        if name.starts_with("log.") {
            return None;
        }
        Some(name.strip_prefix("r#").unwrap_or(name))
    }

    fn put(&mut self, field: &Field, value: Value, cost: usize) {
        let Some(name) = Self::name(field) else {
            return;
        };
        let cost = cost + name.len() + 4;
        if cost > self.left {
            self.skipped += 1;
            return;
        }
        self.left -= cost;
        self.put_named(name, value);
    }

    fn put_named(&mut self, name: &str, value: Value) {
        match self.fields.iter_mut().find(|(n, _)| n == name) {
            Some((_, old)) => *old = value,
            None => self.fields.push((name.to_owned(), value)),
        }
    }

    fn put_text(&mut self, field: &Field, text: &dyn fmt::Display) {
        let Some(name) = Self::name(field) else {
            return;
        };
        let room = MAX_FIELD_BYTES.min(self.left.saturating_sub(name.len() + 4));
        if room == 0 {
            self.skipped += 1;
            return;
        }
        // At most `room` bytes of it are kept: each costs at least one.
        let mut raw = Bounded::new(room);
        let _ = write!(raw, "{text}");
        let mut cost = 0;
        let mut cut = raw.kept.len();
        for (at, c) in raw.kept.char_indices() {
            if cost + json_char_cost(c) > room {
                cut = at;
                break;
            }
            cost += json_char_cost(c);
        }
        let over = raw.over + raw.kept.len() - cut;
        raw.kept.truncate(cut);
        if over > 0 {
            let _ = write!(raw.kept, "…[+{over} bytes]");
            cost += 16;
        }
        self.left = self.left.saturating_sub(cost + name.len() + 4);
        self.put_named(name, Value::String(raw.kept));
    }
}

impl Visit for JsonVisitor {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value), 24);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value), 20);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value), 20);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value), 5);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put_text(field, &value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put_text(field, &format_args!("{value:?}"));
    }
}
