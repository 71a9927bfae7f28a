//! The guest's log for one message: lines from the `log` interface and, for a
//! handler with WASI, bytes written to stdout and stderr, all under one
//! per-message cap ([`Limits::max_log_bytes`](super::Limits)) on what the
//! HOST writes for them, tagged with the handler and the message id (tracing
//! target `idem::guest`). Each line is charged its text as written (escaped,
//! [`crate::log_format::escape_within`]) plus its fixed part
//! ([`crate::log_format::guest_line_overhead`]: timestamp, level, target,
//! span fields, the handler and the message id), so a flood of empty lines
//! is bounded like one long line. A line is at most
//! [`crate::log_format::MAX_FIELD_BYTES`] of text. Output over the cap is
//! dropped and counted, and reported once when the message is done
//! ([`GuestLog::finish`]).
//!
//! The log is shared ([`LogSink`]) between the store's data and the WASI
//! output streams, which live in the WASI resource table and cannot reach the
//! store.

// Guest- and message-supplied bytes are read with `get`, iterators and
// checked splits, never indexed or sliced: an offset out of range would
// panic the host (ARCHITECTURE.md, "The protocol", invariant 8).
#![deny(clippy::indexing_slicing, clippy::string_slice)]

use super::bindings::Level;
use super::rehearsal::Rehearsal;
use crate::log_format;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Which WASI output stream bytes were written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    /// This stream's element of a per-stream pair (stdout first).
    fn of<T>(self, [stdout, stderr]: &mut [T; 2]) -> &mut T {
        match self {
            Stream::Stdout => stdout,
            Stream::Stderr => stderr,
        }
    }
}

/// The shared handle on one message's [`GuestLog`].
#[derive(Clone)]
pub(crate) struct LogSink(Arc<Mutex<GuestLog>>);

impl LogSink {
    pub(crate) fn new(handler: Arc<str>, message_id: String, cap: usize) -> Self {
        Self(Arc::new(Mutex::new(GuestLog::new(
            handler, message_id, cap,
        ))))
    }

    /// The log, locked. A panic while it was held elsewhere cannot leave
    /// it inconsistent enough to matter: use it anyway.
    pub(crate) fn lock(&self) -> MutexGuard<'_, GuestLog> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The bytes of a WASI stream's unfinished line.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    /// Some of this line was dropped (and counted); the line was logged, or
    /// left out, already: the rest of it up to its newline is dropped too.
    dropped: bool,
}

/// What the guest logged last that may explain a trap.
enum LastError {
    None,
    /// An error-level line from the `log` interface.
    Line(String),
    /// Whatever the guest wrote to stderr last (the tail of it).
    Stderr,
}

/// One message's guest output: the budget, the counters, and the unfinished
/// lines of stdout and stderr.
pub(crate) struct GuestLog {
    handler: Arc<str>,
    message_id: String,
    /// Bytes of host log the message may cause.
    cap: usize,
    used: usize,
    /// What every line costs besides its text.
    overhead: usize,
    dropped_bytes: usize,
    dropped_lines: usize,
    pending: [Pending; 2],
    last_error: LastError,
    /// The last [`MAX_REMEMBERED_ERROR_BYTES`] written to stderr, dropped
    /// bytes included: a panic message or traceback comes last.
    stderr_tail: Vec<u8>,
    /// Also keeps every line logged, for `idem invoke` and `idem test`.
    rehearsal: Option<Arc<Rehearsal>>,
}

/// How much of the last error line (or of stderr) is kept to explain a trap.
const MAX_REMEMBERED_ERROR_BYTES: usize = 512;

impl GuestLog {
    fn new(handler: Arc<str>, message_id: String, cap: usize) -> Self {
        Self {
            overhead: log_format::guest_line_overhead(&handler, &message_id),
            handler,
            message_id,
            cap,
            used: 0,
            dropped_bytes: 0,
            dropped_lines: 0,
            pending: Default::default(),
            last_error: LastError::None,
            stderr_tail: Vec::new(),
            rehearsal: None,
        }
    }

    /// Every line logged from now on is also kept in `rehearsal`.
    pub(crate) fn keep_lines(&mut self, rehearsal: Arc<Rehearsal>) {
        self.rehearsal = Some(rehearsal);
    }

    /// How many bytes of escaped text the next line may have: what is left
    /// of the cap after the line's overhead, at most a log line's field.
    /// `None` when not even an empty line fits.
    fn line_room(&self) -> Option<usize> {
        let left = self.cap.saturating_sub(self.used);
        let room = left.checked_sub(self.overhead)?;
        Some(room.min(log_format::MAX_FIELD_BYTES))
    }

    /// `text` escaped and cut to what fits, charged to the cap: the line to
    /// log and the bytes of `text` it leaves out, or `None` (nothing
    /// charged) when no line fits any more.
    fn charge(&mut self, text: &str) -> Option<(String, usize)> {
        let room = self.line_room()?;
        let (line, cost, kept) = log_format::escape_within(text, room);
        self.used += self.overhead + cost;
        Some((line, text.len() - kept))
    }

    /// One line from the `log` interface.
    pub(crate) fn log(&mut self, level: Level, message: &str) {
        if level == Level::Error {
            let cut = floor_char_boundary(message, MAX_REMEMBERED_ERROR_BYTES);
            let kept = message.get(..cut).unwrap_or_default();
            self.last_error = LastError::Line(log_format::escape(kept).into_owned());
        }
        let Some((line, dropped)) = self.charge(message) else {
            self.dropped_bytes += message.len();
            self.dropped_lines += 1;
            return;
        };
        if dropped > 0 {
            self.dropped_bytes += dropped;
            self.dropped_lines += 1;
        }
        if let Some(r) = &self.rehearsal {
            r.line(level_name(level), &line);
            if r.is_quiet() {
                return;
            }
        }
        let (handler, message_id) = (&*self.handler, self.message_id.as_str());
        let truncated = dropped > 0;
        match level {
            Level::Debug => {
                tracing::debug!(target: "idem::guest", handler, message_id, truncated, "{line}")
            }
            Level::Info => {
                tracing::info!(target: "idem::guest", handler, message_id, truncated, "{line}")
            }
            Level::Warn => {
                tracing::warn!(target: "idem::guest", handler, message_id, truncated, "{line}")
            }
            Level::Error => {
                tracing::error!(target: "idem::guest", handler, message_id, truncated, "{line}")
            }
        }
    }

    /// Bytes a guest wrote to a WASI output stream: each finished line is
    /// logged (stdout at info, stderr at warn, with `stream`) and charged as
    /// [`GuestLog::log`]'s are. A line is buffered only up to what could
    /// still fit; bytes past that are dropped and counted, never refused (a
    /// refused write would make most guest languages fail or panic).
    pub(crate) fn write(&mut self, stream: Stream, bytes: &[u8]) {
        if stream == Stream::Stderr && !bytes.is_empty() {
            self.remember_stderr(bytes);
        }
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            let (body, ends) = match piece.split_last() {
                Some((b'\n', body)) => (body, true),
                _ => (piece, false),
            };
            let room = self.line_room();
            let pending = stream.of(&mut self.pending);
            if pending.dropped {
                self.dropped_bytes += body.len();
                pending.dropped = !ends;
                continue;
            }
            let Some(room) = room else {
                // Not even an empty line fits: the line is dropped whole.
                self.dropped_bytes += pending.bytes.len() + body.len();
                self.dropped_lines += 1;
                pending.bytes.clear();
                pending.dropped = !ends;
                continue;
            };
            // Every byte costs at least one as written: more cannot fit.
            let fits = room.saturating_sub(pending.bytes.len()).min(body.len());
            let (kept, over) = body.split_at(fits);
            pending.bytes.extend_from_slice(kept);
            if !over.is_empty() {
                self.dropped_bytes += over.len();
                self.emit(stream, true);
                stream.of(&mut self.pending).dropped = !ends;
            } else if ends {
                self.emit(stream, false);
            }
        }
    }

    /// Logs one stream's pending line (`cut`: bytes of it were dropped
    /// already) and starts a new one.
    fn emit(&mut self, stream: Stream, cut: bool) {
        let pending = std::mem::take(stream.of(&mut self.pending));
        let bytes = pending.bytes.strip_suffix(b"\r").unwrap_or(&pending.bytes);
        let text = String::from_utf8_lossy(bytes);
        let Some((line, dropped)) = self.charge(&text) else {
            self.dropped_bytes += text.len();
            self.dropped_lines += 1;
            return;
        };
        self.dropped_bytes += dropped;
        let truncated = cut || dropped > 0;
        if truncated {
            self.dropped_lines += 1;
        }
        let name = stream.name();
        if let Some(r) = &self.rehearsal {
            r.line(name, &line);
            if r.is_quiet() {
                return;
            }
        }
        let (handler, message_id) = (&*self.handler, self.message_id.as_str());
        match stream {
            Stream::Stdout => {
                tracing::info!(target: "idem::guest", handler, message_id, stream = name, truncated, "{line}")
            }
            Stream::Stderr => {
                tracing::warn!(target: "idem::guest", handler, message_id, stream = name, truncated, "{line}")
            }
        }
    }

    fn remember_stderr(&mut self, bytes: &[u8]) {
        let tail = bytes.len().saturating_sub(MAX_REMEMBERED_ERROR_BYTES);
        self.stderr_tail
            .extend_from_slice(bytes.get(tail..).unwrap_or_default());
        let excess = self
            .stderr_tail
            .len()
            .saturating_sub(MAX_REMEMBERED_ERROR_BYTES);
        self.stderr_tail.drain(..excess);
        self.last_error = LastError::Stderr;
    }

    /// What the guest said last before it trapped, as one line: its last
    /// error-level `log` line, or the tail of stderr if it wrote there last.
    pub(crate) fn last_error(&self) -> Option<String> {
        match &self.last_error {
            LastError::None => None,
            LastError::Line(line) => Some(format!("the guest last logged: {line}")),
            LastError::Stderr => {
                // Skip a char cut in half at the front of the tail.
                let start = self
                    .stderr_tail
                    .iter()
                    .position(|b| (b & 0xC0) != 0x80)
                    .unwrap_or(0);
                let text = String::from_utf8_lossy(self.stderr_tail.get(start..)?);
                let text = text.trim();
                (!text.is_empty()).then(|| {
                    format!(
                        "the guest last wrote to stderr: {}",
                        log_format::escape(text)
                    )
                })
            }
        }
    }

    /// Logs the unfinished stdout/stderr lines and, once, that the
    /// per-message cap was reached and how much it dropped; returns the
    /// bytes of guest text dropped. A quiet rehearsal's call (a shadow
    /// candidate's) logs nothing and returns 0.
    pub(crate) fn finish(&mut self) -> usize {
        for stream in [Stream::Stdout, Stream::Stderr] {
            if !stream.of(&mut self.pending).bytes.is_empty() {
                self.emit(stream, false);
            }
        }
        if self.rehearsal.as_ref().is_some_and(|r| r.is_quiet()) {
            return 0;
        }
        if self.dropped_bytes > 0 || self.dropped_lines > 0 {
            tracing::warn!(
                target: "idem::guest",
                handler = %self.handler,
                message_id = %self.message_id,
                dropped_bytes = self.dropped_bytes,
                dropped_lines = self.dropped_lines,
                cap_bytes = self.cap,
                "guest log output over the per-message cap (max_log_kib) was dropped"
            );
        }
        self.dropped_bytes
    }
}

/// A `log` level as `idem invoke` prints it.
fn level_name(level: Level) -> &'static str {
    match level {
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}

/// The largest index `<= at` that is on a char boundary of `s`.
pub(crate) fn floor_char_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    (0..=at).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing)]
    use super::*;

    fn log(cap: usize) -> GuestLog {
        GuestLog::new(Arc::from("h"), "id".into(), cap)
    }

    #[test]
    fn char_boundary_never_splits_a_char() {
        let s = "aé€";
        assert_eq!(floor_char_boundary(s, 2), 1);
        assert_eq!(floor_char_boundary(s, 3), 3);
        assert_eq!(floor_char_boundary(s, 100), s.len());
        assert_eq!(floor_char_boundary(s, 0), 0);
    }

    /// What every line of [`log`]'s costs besides its text.
    fn overhead() -> usize {
        log_format::guest_line_overhead("h", "id")
    }

    #[test]
    fn a_line_costs_its_overhead_and_its_text_as_written() {
        let o = overhead();
        assert_eq!(o, log_format::GUEST_LINE_FIXED_BYTES + 2 * (3 + 4));
        // ESC is written `\u{1b}` (7 bytes in JSON): only "a" fits 7 bytes.
        let mut l = log(o + 7);
        l.log(Level::Info, "a\u{1b}b");
        assert_eq!((l.used, l.dropped_bytes, l.dropped_lines), (o + 1, 2, 1));
        let mut l = log(o + 8);
        l.log(Level::Info, "a\u{1b}b");
        assert_eq!((l.used, l.dropped_bytes, l.dropped_lines), (o + 8, 1, 1));
        // An empty line costs the overhead; when it no longer fits it is
        // counted, with no bytes.
        let mut l = log(2 * o + 1);
        for _ in 0..5 {
            l.log(Level::Info, "");
        }
        assert_eq!((l.used, l.dropped_bytes, l.dropped_lines), (2 * o, 0, 3));
        // No line is longer than a log line's field.
        let mut l = log(usize::MAX);
        l.log(Level::Info, &"x".repeat(10_000));
        assert_eq!(l.used, o + log_format::MAX_FIELD_BYTES);
        assert_eq!(l.dropped_bytes, 10_000 - log_format::MAX_FIELD_BYTES);
    }

    #[test]
    fn a_flood_of_empty_lines_stops_at_the_cap() {
        let id = "m".repeat(500);
        let o = log_format::guest_line_overhead("h", &id);
        let mut l = GuestLog::new(Arc::from("h"), id, 64 * 1024);
        for _ in 0..70_000 {
            l.log(Level::Info, "");
        }
        l.write(Stream::Stdout, &[b'\n'; 70_000]);
        let kept = 64 * 1024 / o;
        assert_eq!(kept, 49);
        assert_eq!(l.used, kept * o);
        assert_eq!((l.dropped_bytes, l.dropped_lines), (0, 140_000 - kept));
        assert_eq!(l.finish(), 0);
    }

    #[test]
    fn stream_bytes_share_the_cap_with_log_lines() {
        let o = overhead();
        let mut l = log(2 * o + 10);
        l.log(Level::Info, "abcd");
        l.write(Stream::Stdout, b"12\n34");
        // "12" fits; "34" cannot be a line any more: dropped whole.
        assert_eq!(
            (l.used, l.dropped_bytes, l.dropped_lines),
            (2 * o + 6, 2, 1)
        );
        assert!(l.pending[0].bytes.is_empty());
        l.write(Stream::Stdout, b"56\n78\n9");
        // "3456" was one line, counted; "78" and "9" are dropped lines.
        assert_eq!((l.dropped_bytes, l.dropped_lines), (7, 3));
        l.write(Stream::Stdout, b"more");
        // "9more" is one line, already counted.
        assert_eq!((l.dropped_bytes, l.dropped_lines), (11, 3));
        l.log(Level::Info, "x");
        assert_eq!((l.dropped_bytes, l.dropped_lines), (12, 4));
        assert_eq!(l.finish(), 12);
    }

    #[test]
    fn a_stream_line_is_buffered_only_as_far_as_it_can_fit() {
        let o = overhead();
        let mut l = log(o + 5);
        l.write(Stream::Stdout, b"abc");
        l.write(Stream::Stdout, &[b'x'; 1 << 20]);
        // "abcxx" was logged, cut; the rest of the line is dropped as it
        // comes, and nothing is kept for it.
        assert_eq!(
            (l.used, l.dropped_bytes, l.dropped_lines),
            (o + 5, (1 << 20) - 2, 1)
        );
        assert!(l.pending[0].bytes.is_empty());
        l.write(Stream::Stdout, b"yy\nz");
        assert_eq!((l.dropped_bytes, l.dropped_lines), ((1 << 20) + 1, 2));
        // The line's pending bytes, a carriage return off, at the finish.
        let mut l = log(2 * o + 10);
        l.write(Stream::Stderr, b"ab\r\ncd");
        l.finish();
        assert_eq!(
            (l.used, l.dropped_bytes, l.dropped_lines),
            (2 * o + 4, 0, 0)
        );
    }

    #[test]
    fn stderr_tail_explains_a_trap() {
        let mut l = log(4);
        assert_eq!(l.last_error(), None);
        l.write(Stream::Stderr, b"thread panicked at x.rs:1:\nboom\n");
        assert_eq!(
            l.last_error().as_deref(),
            Some("the guest last wrote to stderr: thread panicked at x.rs:1:\\nboom")
        );
        l.log(Level::Error, "later");
        assert_eq!(
            l.last_error().as_deref(),
            Some("the guest last logged: later")
        );
        l.write(Stream::Stderr, "é".repeat(400).as_bytes());
        let said = l.last_error().unwrap_or_default();
        assert_eq!(
            said,
            format!("the guest last wrote to stderr: {}", "é".repeat(256))
        );
    }
}
