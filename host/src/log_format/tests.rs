#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::indexing_slicing, clippy::string_slice)]

use super::json::{JsonFields, JsonLines};
use super::text::TextFields;
use super::*;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// A log writer into memory.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buf {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// What `f` logs in the text format (no colours, as to a file).
fn text_log(f: impl FnOnce()) -> String {
    let buf = Buf::default();
    let w = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .fmt_fields(TextFields)
        .with_ansi(false)
        .with_writer(move || w.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    buf.text()
}

/// What `f` logs in the JSON format.
fn json_log(f: impl FnOnce()) -> String {
    let buf = Buf::default();
    let w = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .fmt_fields(JsonFields)
        .event_format(JsonLines)
        .with_writer(move || w.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    buf.text()
}

const FORGED: &str = "no\n2026-12-02T00:00:00.000000Z  INFO idem::pipeline: committed; acked\x1b[31m\x07\x7f\u{85}\u{2028}\u{202e}";

/// A delivery-shaped span, a message id recorded into it later, and an
/// event whose message, string field and `%` field all carry `FORGED`.
fn hostile_event() {
    let span = tracing::info_span!(
        "delivery",
        handler = "h",
        stream_sequence = 7u64,
        message_id = tracing::field::Empty
    );
    span.record("message_id", FORGED);
    let _entered = span.enter();
    tracing::warn!(reason = FORGED, error = %FORGED, "rejected: {FORGED}");
}

/// No byte below 0x20 but the line ends, no DEL, no C1 control, no
/// separator or bidirectional control.
fn assert_clean(log: &str) {
    for (i, c) in log.char_indices() {
        assert!(c == '\n' || !needs_escape(c), "raw {c:?} at {i} in {log:?}");
    }
}

#[test]
fn text_fields_escape_what_could_break_a_line() {
    let log = text_log(hostile_event);
    assert_clean(&log);
    assert_eq!(log.lines().count(), 1, "{log}");
    let forged = "2026-12-02T00:00:00.000000Z  INFO idem::pipeline: committed; acked";
    assert!(!log.lines().any(|l| l.starts_with(forged)), "{log}");
    // The message bare, the `%` field as its Display, both escaped; the
    // string fields quoted by `Debug`.
    let escaped = r"no\n2026-12-02T00:00:00.000000Z  INFO idem::pipeline: committed; acked\u{1b}[31m\u{7}\u{7f}\u{85}\u{2028}\u{202e}";
    assert!(
        log.contains(&format!(": rejected: {escaped} reason=\"")),
        "{log}"
    );
    assert!(log.contains(&format!(" error={escaped}\n")), "{log}");
    assert!(
        log.contains(r#"delivery{handler="h" stream_sequence=7 message_id="no\n2026"#),
        "{log}"
    );
}

#[test]
fn json_lines_stay_json_and_carry_the_value_faithfully() {
    let log = json_log(hostile_event);
    assert_clean(&log);
    assert_eq!(log.lines().count(), 1, "{log}");
    let v: serde_json::Value = serde_json::from_str(log.trim_end()).unwrap();
    assert_eq!(v["message"], format!("rejected: {FORGED}"));
    assert_eq!(v["reason"], FORGED);
    assert_eq!(v["error"], FORGED);
    assert_eq!(v["level"], "WARN");
    assert_eq!(
        v["spans"],
        serde_json::json!([{"name": "delivery", "handler": "h", "stream_sequence": 7, "message_id": FORGED}])
    );
    assert!(log.contains(r"\u007f\u0085\u2028\u202e"), "{log}");
}

#[test]
fn a_huge_value_is_cut_and_says_by_how_much() {
    let huge = "x".repeat(1 << 20);
    let log = text_log(|| tracing::info!(field = huge.as_str(), "{huge}"));
    // The message: 4096 bytes kept; the field: the quote and 4095 more.
    let cut = 1_048_576 - 4096;
    assert_eq!(
        log.split_once(": ").unwrap().1,
        format!(
            "{}…[+{cut} bytes] field=\"{}…[+{} bytes]\n",
            "x".repeat(4096),
            "x".repeat(4095),
            cut + 2
        )
    );
    let log = json_log(|| tracing::info!(field = huge.as_str(), "{huge}"));
    let v: serde_json::Value = serde_json::from_str(log.trim_end()).unwrap();
    let want = format!("{}…[+{cut} bytes]", "x".repeat(4096));
    assert_eq!(v["message"], want);
    assert_eq!(v["field"], want);
    assert!(log.len() < 2 * MAX_FIELD_BYTES + 200, "{}", log.len());
}

#[test]
fn a_record_is_capped_as_a_whole() {
    let big = "y".repeat(MAX_FIELD_BYTES);
    let (a, b, c, d, e) = (&*big, &*big, &*big, &*big, &*big);
    let log = text_log(|| tracing::info!(a, b, c, d, e, "m"));
    assert!(log.len() < MAX_RECORD_BYTES + 200, "{}", log.len());
    assert!(
        log.ends_with(" …[+1 fields]\n"),
        "{}",
        &log[log.len() - 40..]
    );
    let log = json_log(|| tracing::info!(a, b, c, d, e, "m"));
    assert!(log.len() < MAX_RECORD_BYTES + 200, "{}", log.len());
    let v: serde_json::Value = serde_json::from_str(log.trim_end()).unwrap();
    assert_eq!(v["fields_left_out"], 1, "{log}");
}

/// A guest's log line as `runtime::guest_log` writes it, inside the
/// `delivery` span with the longest numbers.
fn guest_line(message_id: &str, text: &str) {
    let span = tracing::info_span!(
        "delivery",
        handler = %"handler-name",
        stream_sequence = u64::MAX,
        delivery = u64::MAX,
        message_id = tracing::field::Empty,
    );
    span.record("message_id", message_id);
    let _entered = span.enter();
    tracing::error!(target: "idem::guest", handler = "handler-name", message_id, stream = "stderr", truncated = false, "{text}");
}

#[test]
fn a_guest_line_costs_at_most_its_overhead_and_its_text() {
    for id in [
        "e1",
        &"i".repeat(512),
        &"\"\\\u{1b}".repeat(170),
        &"€".repeat(170),
    ] {
        for text in ["", "hello", "a\"b\\c"] {
            let (escaped, cost, _) = escape_within(text, usize::MAX);
            assert_eq!(escaped, text);
            let most = guest_line_overhead("handler-name", id) + cost;
            let (text_line, json_line) = (
                text_log(|| guest_line(id, text)),
                json_log(|| guest_line(id, text)),
            );
            for log in [&text_line, &json_line] {
                assert!(log.len() <= most, "{} > {most}: {log}", log.len());
            }
            // Not much less either: the estimate is close for a plain id.
            if id == "e1" {
                assert!(
                    json_line.len() + 100 > most,
                    "{} vs {most}",
                    json_line.len()
                );
            }
        }
    }
}

#[test]
fn escape_within_counts_what_the_json_format_writes() {
    assert_eq!(escape("plain"), "plain");
    assert_eq!(escape("a\nb\t\u{1b}"), r"a\nb\t\u{1b}");
    assert_eq!(escape_within("abc", 2), ("ab".into(), 2, 2));
    // `\n` is written `\\n` in JSON: 3 bytes.
    assert_eq!(escape_within("a\nb", 3), ("a".into(), 1, 1));
    assert_eq!(escape_within("a\nb", 4), (r"a\n".into(), 4, 2));
    assert_eq!(escape_within("é€", 4), ("é".into(), 2, 2));
    assert_eq!(json_char_cost('"'), 2);
    assert_eq!(json_char_cost('\u{7f}'), 6);
    assert_eq!(field_cost("ab"), 4);
    assert_eq!(field_cost("\u{1b}"), 8);
    assert_eq!(field_cost(&"x".repeat(1 << 20)), MAX_FIELD_BYTES + 32);
}
