//! One line of `idem publish`'s file: read with a bound, and checked whole
//! (UTF-8, JSON, message id, size on the wire) before it is sent.

use super::{MAX_BROKER_TEXT, Target};
use crate::admin::shortened;
use crate::config::IdentityRule;
use crate::pipeline::message_id;
use std::io::BufRead;

/// The header block of a message with one `Nats-Msg-Id` header, less the
/// id: `NATS/1.0\r\n`, `Nats-Msg-Id: `, `\r\n` after the value, `\r\n`.
const MSG_ID_HEADER_BYTES: usize = 10 + 13 + 2 + 2;

/// A subject a message can be published to: not empty, no wildcard token,
/// no whitespace.
pub(super) fn check_subject(subject: &str) -> anyhow::Result<()> {
    let bad = subject.is_empty()
        || subject.chars().any(char::is_whitespace)
        || subject
            .split('.')
            .any(|t| t.is_empty() || t == "*" || t == ">");
    if bad {
        anyhow::bail!(
            "`{}` is not a subject a message can be published to: dot-separated tokens, none empty, no `*`, `>` or whitespace",
            shortened(subject, MAX_BROKER_TEXT)
        );
    }
    Ok(())
}

/// One line read by [`read_line`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LineRead {
    /// Bytes the line took in the file, its newline included.
    pub(super) bytes: u64,
    /// The line is longer than the limit: `buf` holds only its start.
    pub(super) cut: bool,
}

/// Reads the next line into `buf` (without its `\n` or `\r\n`), keeping at
/// most `limit` bytes of it and skipping the rest: a line longer than
/// anything the server takes is never held whole. `None` at the end.
pub(super) fn read_line(
    reader: &mut impl BufRead,
    limit: usize,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<LineRead>> {
    buf.clear();
    let mut bytes = 0u64;
    let mut cut = false;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            if bytes == 0 {
                return Ok(None);
            }
            break;
        }
        let (part, newline) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], true),
            None => (chunk, false),
        };
        // One byte over the limit is kept, so that a `\r` before the
        // newline is told from content.
        let room = (limit + 1).saturating_sub(buf.len());
        if part.len() > room {
            cut = true;
        }
        buf.extend_from_slice(&part[..part.len().min(room)]);
        let used = part.len() + usize::from(newline);
        reader.consume(used);
        bytes += used as u64;
        if newline {
            break;
        }
    }
    if !cut && buf.last() == Some(&b'\r') {
        buf.pop();
    }
    if buf.len() > limit {
        cut = true;
    }
    Ok(Some(LineRead { bytes, cut }))
}

/// A line ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Message {
    /// Its `Nats-Msg-Id`, with `--msg-id`.
    pub(super) msg_id: Option<String>,
}

/// Checks one whole line: `Ok(None)` for a blank line (not sent), the
/// message to send, or why it cannot be stored.
pub(super) fn check_line(
    line: &[u8],
    msg_id: Option<&IdentityRule>,
    target: &Target,
) -> Result<Option<Message>, String> {
    let text = std::str::from_utf8(line).map_err(|e| {
        format!(
            "not JSON: invalid UTF-8 at byte {} of the line",
            e.valid_up_to() + 1
        )
    })?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
        let what = e.to_string();
        let what = what.split(" at line ").next().unwrap_or_default();
        return Err(format!("not JSON: {what} at column {}", e.column()));
    }
    let msg_id = match msg_id {
        Some(rule) => Some(message_id::extract(rule, None, line)?),
        None => None,
    };
    let size = wire_size(line.len(), msg_id.as_deref());
    if size > target.max_payload {
        return Err(format!(
            "max_payload exceeded: the message is {size} bytes, the server's max_payload is {}",
            target.max_payload
        ));
    }
    if let (Some(max), Some(stream)) = (target.max_msg_size, &target.stream)
        && size > max
    {
        return Err(format!(
            "message size exceeds maximum allowed: the message is {size} bytes, stream {stream}'s max_msg_size is {max}"
        ));
    }
    Ok(Some(Message { msg_id }))
}

/// Bytes a message takes against `max_payload` and `max_msg_size`: the
/// payload, and the header block when it has a `Nats-Msg-Id`.
pub(super) fn wire_size(payload: usize, msg_id: Option<&str>) -> usize {
    match msg_id {
        Some(id) => payload + MSG_ID_HEADER_BYTES + id.len(),
        None => payload,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn target(max_payload: usize, max_msg_size: Option<usize>) -> Target {
        Target {
            stream: Some("S".into()),
            max_payload,
            max_msg_size,
        }
    }

    fn lines(text: &[u8], limit: usize) -> Vec<(Vec<u8>, LineRead)> {
        let mut reader = std::io::BufReader::with_capacity(4, text);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        while let Some(read) = read_line(&mut reader, limit, &mut buf).unwrap() {
            out.push((buf.clone(), read));
        }
        out
    }

    #[test]
    fn lines_are_read_whole_and_cut_past_the_limit() {
        let got = lines(b"{}\r\nabcdefghij\n\nxyz", 8);
        let read = |bytes, cut| LineRead { bytes, cut };
        assert_eq!(
            got,
            vec![
                (b"{}".to_vec(), read(4, false)),
                (b"abcdefghi".to_vec(), read(11, true)),
                (b"".to_vec(), read(1, false)),
                (b"xyz".to_vec(), read(3, false)),
            ]
        );
        // Exactly the limit is no cut, with or without `\r`.
        let got = lines(b"12345678\r\n12345678\n", 8);
        assert_eq!(got[0], (b"12345678".to_vec(), read(10, false)));
        assert_eq!(got[1], (b"12345678".to_vec(), read(9, false)));
    }

    #[test]
    fn a_line_is_checked_whole() {
        let t = target(1024, None);
        assert_eq!(check_line(b"  ", None, &t), Ok(None));
        assert_eq!(
            check_line(br#"{"a":1}"#, None, &t),
            Ok(Some(Message { msg_id: None }))
        );
        assert_eq!(
            check_line(br#"{"a":1} x"#, None, &t),
            Err("not JSON: trailing characters at column 9".into())
        );
        assert_eq!(
            check_line(br#"{"a": oops"#, None, &t),
            Err("not JSON: expected value at column 7".into())
        );
        assert_eq!(
            check_line(b"\"\xff\"", None, &t),
            Err("not JSON: invalid UTF-8 at byte 2 of the line".into())
        );
        let rule: IdentityRule = "json:/id".parse().unwrap();
        assert_eq!(
            check_line(br#"{"id":"e1"}"#, Some(&rule), &t),
            Ok(Some(Message {
                msg_id: Some("e1".into())
            }))
        );
        assert_eq!(
            check_line(br#"{"x":1}"#, Some(&rule), &t),
            Err("missing identity: payload has no `/id`".into())
        );
    }

    #[test]
    fn the_size_counts_the_header_against_both_limits() {
        assert_eq!(wire_size(100, None), 100);
        assert_eq!(wire_size(100, Some("e1")), 100 + 29);
        let line = br#"{"id":"e1"}"#; // 11 bytes, 40 with its header
        let rule: IdentityRule = "json:/id".parse().unwrap();
        assert!(check_line(line, Some(&rule), &target(40, None)).is_ok());
        assert_eq!(
            check_line(line, Some(&rule), &target(39, None)),
            Err(
                "max_payload exceeded: the message is 40 bytes, the server's max_payload is 39"
                    .into()
            )
        );
        assert!(check_line(line, Some(&rule), &target(1024, Some(40))).is_ok());
        assert_eq!(
            check_line(line, Some(&rule), &target(1024, Some(39))),
            Err("message size exceeds maximum allowed: the message is 40 bytes, stream S's max_msg_size is 39".into())
        );
    }

    #[test]
    fn subjects_with_wildcards_are_refused() {
        assert!(check_subject("accounts.credit").is_ok());
        for bad in ["", "a.*", "a.>", "a..b", "a b", ".a"] {
            assert!(check_subject(bad).is_err(), "{bad:?}");
        }
    }
}
