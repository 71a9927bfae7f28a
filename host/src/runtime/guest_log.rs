//! The guest's log for one message: lines from the `log` interface and, for a
//! handler with WASI, bytes written to stdout and stderr, all under one
//! per-message byte cap ([`Limits::max_log_bytes`](super::Limits)), tagged
//! with the handler and the message id (tracing target `idem::guest`).
//! Output over the cap is dropped and counted, and reported once when the
//! message is done ([`GuestLog::finish`]).
//!
//! The log is shared ([`LogSink`]) between the store's data and the WASI
//! output streams, which live in the WASI resource table and cannot reach the
//! store.

// Guest- and message-supplied bytes are read with `get`, iterators and
// checked splits, never indexed or sliced: an offset out of range would
// panic the host (ARCHITECTURE.md, "The protocol", invariant 8).
#![deny(clippy::indexing_slicing, clippy::string_slice)]

use super::bindings::Level;
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
    /// Some of this line was dropped (and counted).
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
    cap: usize,
    used: usize,
    dropped_bytes: usize,
    dropped_lines: usize,
    pending: [Pending; 2],
    last_error: LastError,
    /// The last [`MAX_REMEMBERED_ERROR_BYTES`] written to stderr, dropped
    /// bytes included: a panic message or traceback comes last.
    stderr_tail: Vec<u8>,
}

/// How much of the last error line (or of stderr) is kept to explain a trap.
const MAX_REMEMBERED_ERROR_BYTES: usize = 512;

impl GuestLog {
    fn new(handler: Arc<str>, message_id: String, cap: usize) -> Self {
        Self {
            handler,
            message_id,
            cap,
            used: 0,
            dropped_bytes: 0,
            dropped_lines: 0,
            pending: Default::default(),
            last_error: LastError::None,
            stderr_tail: Vec::new(),
        }
    }

    /// One line from the `log` interface. Each line costs its bytes plus one
    /// (its newline), so a flood of empty lines is capped too.
    pub(crate) fn log(&mut self, level: Level, message: &str) {
        if level == Level::Error {
            let cut = floor_char_boundary(message, MAX_REMEMBERED_ERROR_BYTES);
            let kept = message.get(..cut).unwrap_or_default();
            self.last_error = LastError::Line(one_line(kept).into_owned());
        }
        let budget = self.cap.saturating_sub(self.used);
        let (line, dropped, charged) = fit(message, budget);
        self.used += charged;
        if dropped > 0 || charged == 0 {
            self.dropped_bytes += dropped;
            self.dropped_lines += 1;
            if line.is_empty() {
                return;
            }
        }
        let line = one_line(line);
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
    /// logged (stdout at info, stderr at warn, with `stream`); bytes are
    /// charged one for one, newlines included; bytes past the cap are dropped
    /// and counted, never refused (a refused write would make most guest
    /// languages fail or panic).
    pub(crate) fn write(&mut self, stream: Stream, bytes: &[u8]) {
        if stream == Stream::Stderr && !bytes.is_empty() {
            self.remember_stderr(bytes);
        }
        let keep = bytes.len().min(self.cap.saturating_sub(self.used));
        let (kept, dropped) = bytes.split_at(keep);
        self.used += keep;
        for piece in kept.split_inclusive(|b| *b == b'\n') {
            match piece.split_last() {
                Some((b'\n', line)) => {
                    stream.of(&mut self.pending).bytes.extend_from_slice(line);
                    self.emit(stream);
                }
                _ => stream.of(&mut self.pending).bytes.extend_from_slice(piece),
            }
        }
        if dropped.is_empty() {
            return;
        }
        self.dropped_bytes += dropped.len();
        // The budget is spent: what is pending will never grow, log it now.
        if !stream.of(&mut self.pending).bytes.is_empty() {
            self.dropped_lines += 1;
            stream.of(&mut self.pending).dropped = true;
            self.emit(stream);
            stream.of(&mut self.pending).dropped = true;
        }
        for piece in dropped.split_inclusive(|b| *b == b'\n') {
            let pending = stream.of(&mut self.pending);
            if !pending.dropped {
                self.dropped_lines += 1;
                pending.dropped = true;
            }
            if piece.ends_with(b"\n") {
                pending.dropped = false;
            }
        }
    }

    /// Logs one stream's pending line and starts a new one.
    fn emit(&mut self, stream: Stream) {
        let pending = std::mem::take(stream.of(&mut self.pending));
        let bytes = pending.bytes.strip_suffix(b"\r").unwrap_or(&pending.bytes);
        let text = String::from_utf8_lossy(bytes);
        let line = one_line(&text);
        let (handler, message_id) = (&*self.handler, self.message_id.as_str());
        let (name, truncated) = (stream.name(), pending.dropped);
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
                (!text.is_empty())
                    .then(|| format!("the guest last wrote to stderr: {}", one_line(text)))
            }
        }
    }

    /// Logs the unfinished stdout/stderr lines and, once, how much output the
    /// per-message cap dropped; returns that count in bytes.
    pub(crate) fn finish(&mut self) -> usize {
        for stream in [Stream::Stdout, Stream::Stderr] {
            if !stream.of(&mut self.pending).bytes.is_empty() {
                self.emit(stream);
            }
        }
        if self.dropped_bytes > 0 {
            tracing::warn!(
                target: "idem::guest",
                handler = %self.handler,
                message_id = %self.message_id,
                dropped_bytes = self.dropped_bytes,
                dropped_lines = self.dropped_lines,
                cap_bytes = self.cap,
                "guest log output over the per-message cap was dropped"
            );
        }
        self.dropped_bytes
    }
}

/// How much of a log line fits what is left of the budget: the kept prefix,
/// the bytes dropped, and the bytes charged. Each line costs its bytes plus
/// one (its newline), so a flood of empty lines is capped too.
fn fit(message: &str, budget: usize) -> (&str, usize, usize) {
    if budget == 0 {
        return ("", message.len(), 0);
    }
    let cut = floor_char_boundary(message, budget - 1);
    let kept = message.get(..cut).unwrap_or_default();
    (kept, message.len() - kept.len(), kept.len() + 1)
}

/// The largest index `<= at` that is on a char boundary of `s`.
pub(crate) fn floor_char_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    (0..=at).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

/// Escapes control characters so one guest line stays one log line.
fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().any(char::is_control) {
        std::borrow::Cow::Owned(
            s.chars()
                .map(|c| {
                    if c.is_control() {
                        c.escape_default().to_string()
                    } else {
                        c.to_string()
                    }
                })
                .collect(),
        )
    } else {
        std::borrow::Cow::Borrowed(s)
    }
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

    #[test]
    fn log_lines_fit_the_budget() {
        assert_eq!(fit("hello", 100), ("hello", 0, 6));
        assert_eq!(fit("hello", 6), ("hello", 0, 6));
        assert_eq!(fit("hello", 4), ("hel", 2, 4));
        assert_eq!(fit("", 3), ("", 0, 1));
        assert_eq!(fit("hello", 0), ("", 5, 0));
        assert_eq!(fit("é", 2), ("", 2, 1));
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(one_line("a\nb\tc"), "a\\nb\\tc");
        assert_eq!(one_line("plain"), "plain");
    }

    #[test]
    fn stream_bytes_share_the_cap_with_log_lines() {
        let mut l = log(10);
        l.log(Level::Info, "abcd"); // 5 bytes
        l.write(Stream::Stdout, b"12\n34"); // 5 bytes: the cap is reached
        assert_eq!((l.used, l.dropped_bytes, l.dropped_lines), (10, 0, 0));
        assert_eq!(l.pending[0].bytes, b"34");
        l.write(Stream::Stdout, b"56\n78\n9");
        // "34" was cut (the line "3456"), "78" and "9" are dropped lines.
        assert_eq!((l.dropped_bytes, l.dropped_lines), (7, 3));
        assert!(l.pending[0].bytes.is_empty());
        l.write(Stream::Stdout, b"more");
        // "9more" is one line, already counted.
        assert_eq!((l.dropped_bytes, l.dropped_lines), (11, 3));
        l.log(Level::Info, "x");
        assert_eq!((l.dropped_bytes, l.dropped_lines), (12, 4));
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
