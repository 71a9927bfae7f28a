//! The fields of the human-readable log format, escaped and capped
//! ([`super`]): `message` first and bare, then `name=value` pairs, string
//! values quoted as Rust `Debug` writes them, the others as their `Debug`
//! (a `%value` as its `Display`).

use super::{MAX_FIELD_BYTES, MAX_RECORD_BYTES, needs_escape};
use std::fmt::{self, Write as _};
use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// The text format's [`FormatFields`]: every value escaped
/// ([`needs_escape`] characters as `\n`, `\u{1b}`, …), at most
/// [`MAX_FIELD_BYTES`] each and [`MAX_RECORD_BYTES`] for an event's or a
/// span's fields together.
#[derive(Debug, Clone, Copy, Default)]
pub struct TextFields;

impl<'w> FormatFields<'w> for TextFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = TextVisitor {
            out: &mut writer,
            left: MAX_RECORD_BYTES,
            first: true,
            skipped: 0,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.finish()
    }
}

struct TextVisitor<'a, 'w> {
    out: &'a mut Writer<'w>,
    /// Bytes the record may still take.
    left: usize,
    first: bool,
    /// Fields left out once the record's bytes were spent.
    skipped: usize,
    result: fmt::Result,
}

impl TextVisitor<'_, '_> {
    fn field(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        // The `log` crate's metadata, already shown as the target.
        if name.starts_with("log.") {
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        let label = if name == "message" { 0 } else { name.len() + 1 };
        if self.left <= label {
            self.skipped += 1;
            return;
        }
        self.result = self.write(name, label, value);
    }

    fn write(&mut self, name: &str, label: usize, value: &dyn fmt::Debug) -> fmt::Result {
        if !self.first {
            self.out.write_char(' ')?;
        }
        self.first = false;
        if label > 0 {
            self.out.write_str(name)?;
            self.out.write_char('=')?;
        }
        self.left -= label;
        let mut escaper = Escaper {
            out: self.out,
            room: MAX_FIELD_BYTES.min(self.left),
            used: 0,
            over: 0,
        };
        write!(escaper, "{value:?}")?;
        let (used, over) = (escaper.used, escaper.over);
        self.left -= used;
        if over > 0 {
            write!(self.out, "…[+{over} bytes]")?;
        }
        Ok(())
    }

    fn finish(self) -> fmt::Result {
        self.result?;
        if self.skipped > 0 {
            write!(self.out, " …[+{} fields]", self.skipped)?;
        }
        Ok(())
    }
}

impl Visit for TextVisitor<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.field(field, &format_args!("{value}"));
        } else {
            self.field(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, value);
    }
}

/// Writes what it is given with [`needs_escape`] characters escaped, at
/// most `room` bytes; once a piece does not fit, nothing more is written
/// and the rest is counted in `over`.
struct Escaper<'a, 'w> {
    out: &'a mut Writer<'w>,
    room: usize,
    used: usize,
    over: usize,
}

impl fmt::Write for Escaper<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            let escaped = needs_escape(c);
            let len = if escaped {
                c.escape_default().len()
            } else {
                c.len_utf8()
            };
            if self.over > 0 || self.used + len > self.room {
                self.over += len;
                continue;
            }
            self.used += len;
            if escaped {
                for e in c.escape_default() {
                    self.out.write_char(e)?;
                }
            } else {
                self.out.write_char(c)?;
            }
        }
        Ok(())
    }
}
