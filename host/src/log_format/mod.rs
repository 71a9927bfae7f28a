//! How a log line is written, whatever its fields hold (ARCHITECTURE.md,
//! "The protocol", invariant 9): every field value is escaped and length-capped at the
//! formatter, so a reason, a trap message, a message id or a deployment's
//! note that a sender, a guest or a deploy record chose can neither start a
//! line of its own nor write a control byte to the log.
//!
//! - [`text::TextFields`] formats the fields of the human-readable format
//!   (`--log-format pretty`): a character that could break or recolour a
//!   line (see [`needs_escape`]) is written as its Rust escape (`\n`,
//!   `\u{1b}`).
//! - [`json::JsonFields`] and [`json::JsonLines`] write one JSON object per
//!   line (`--log-format json`): JSON's own escapes, and `\u007f`-style ones
//!   for the characters JSON leaves raw (DEL, C1 controls, line separators,
//!   bidirectional overrides).
//!
//! In both, one field value is at most [`MAX_FIELD_BYTES`] as written and
//! the fields of one event (or of one span) at most [`MAX_RECORD_BYTES`];
//! what is cut ends in `…[+N bytes]`.

// Field values are guest-, sender- and deploy-record-supplied text: read
// with iterators and checked splits, never indexed or sliced
// (ARCHITECTURE.md, "The protocol", invariant 8).
#![deny(clippy::indexing_slicing, clippy::string_slice)]

pub mod json;
pub mod text;

/// The most one field value takes in a log line, in bytes as written
/// (escapes included): 4 KiB.
pub const MAX_FIELD_BYTES: usize = 4096;

/// The most the fields of one event, or of one span, take in a log line, in
/// bytes as written: 16 KiB. Fields past it are left out and counted
/// (`…[+N fields]`).
pub const MAX_RECORD_BYTES: usize = 16 * 1024;

/// What a guest log line costs besides its text and the handler and message
/// id it carries: the timestamp, level, target, the `delivery` span's name,
/// stream sequence and delivery count, the field names, quotes and
/// punctuation, and the newline, in either format (the JSON one, the longer,
/// takes 283 bytes with 20-digit numbers; the text one's colours on a
/// terminal take less than the difference). See [`guest_line_overhead`].
pub const GUEST_LINE_FIXED_BYTES: usize = 320;

/// Whether `c` is written escaped: a control character (C0, DEL, C1: a
/// newline, a carriage return, ESC, BEL, …), a Unicode line or paragraph
/// separator, or a bidirectional embedding, override or isolate (which
/// reorder what a terminal shows).
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `s` with every character [`needs_escape`] picks written as its Rust
/// escape (`\n`, `\t`, `\u{1b}`), the rest as it is: the text format's
/// escaping, for callers that want a line's text as it will be written.
pub fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The bytes `c` takes inside a JSON string as [`json`] writes it: 2 for
/// `"`, `\` and the short escapes, 6 for any other escaped character,
/// else its UTF-8 length.
pub fn json_char_cost(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if needs_escape(c) => 6,
        c => c.len_utf8(),
    }
}

/// The most bytes `value` takes as a quoted field value in either format:
/// the larger of its JSON string and its Rust `Debug` form (the text
/// format quotes string fields that way), capped at [`MAX_FIELD_BYTES`]
/// plus the cut marker.
pub fn field_cost(value: &str) -> usize {
    let json = 2 + value.chars().map(json_char_cost).sum::<usize>();
    let debug = format!("{value:?}").len();
    json.max(debug).min(MAX_FIELD_BYTES + CUT_MARKER_BYTES)
}

/// Room for `…[+N bytes]` after a value cut at [`MAX_FIELD_BYTES`].
const CUT_MARKER_BYTES: usize = 32;

/// The most a guest log line of `handler` for `message_id` costs the host
/// besides its text, in bytes: [`GUEST_LINE_FIXED_BYTES`] plus the handler
/// and the message id twice each (the `delivery` span carries them, and
/// so does the line, for lines logged inside a batch, whose span has no
/// message id). The per-message cap (`max_log_kib`) counts it for every line.
pub fn guest_line_overhead(handler: &str, message_id: &str) -> usize {
    GUEST_LINE_FIXED_BYTES + 2 * (field_cost(handler) + field_cost(message_id))
}

/// The longest prefix of `s` whose text, escaped by [`escape`], costs at
/// most `room` bytes in a JSON string ([`json_char_cost`] of each escaped
/// character; never less than the text format's bytes): that escaped
/// prefix, its cost, and how many bytes of `s` it covers.
pub fn escape_within(s: &str, room: usize) -> (String, usize, usize) {
    let mut out = String::new();
    let mut cost = 0;
    for (at, c) in s.char_indices() {
        let piece_cost: usize = if needs_escape(c) {
            c.escape_default().map(json_char_cost).sum()
        } else {
            json_char_cost(c)
        };
        if cost + piece_cost > room {
            return (out, cost, at);
        }
        cost += piece_cost;
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    (out, cost, s.len())
}

/// A `fmt::Write` that keeps at most `room` bytes of what is written to it
/// (cut on a char boundary; once one piece did not fit, nothing more is
/// kept) and counts the rest.
struct Bounded {
    kept: String,
    room: usize,
    over: usize,
}

impl Bounded {
    fn new(room: usize) -> Self {
        Self {
            kept: String::new(),
            room,
            over: 0,
        }
    }
}

impl std::fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.over > 0 {
            self.over += s.len();
            return Ok(());
        }
        let left = self.room.saturating_sub(self.kept.len());
        if s.len() <= left {
            self.kept.push_str(s);
            return Ok(());
        }
        let cut = (0..=left)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        let (head, tail) = s.split_at(cut);
        self.kept.push_str(head);
        self.over += tail.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
