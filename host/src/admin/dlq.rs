//! `idem dlq list|show|drop`: read and remove dead letters (`redrive` is
//! in [`super::redrive`]).

use super::{count, printable, shortened, time};
use crate::store::DeadLetterRow;
use std::fmt::Write as _;
use std::path::Path;

/// Longest reason `idem dlq list` prints (characters); `show` prints it whole.
const LIST_REASON_CHARS: usize = 100;

/// Payload bytes per line of hex in `idem dlq show`.
const HEX_BYTES_PER_LINE: usize = 32;

/// `idem dlq list [--handler NAME]`: a header line, then one aligned line
/// per dead letter in id order (id, handler, message id or `-`, stream
/// sequence, subject, dead-lettered time, reason shortened to one line);
/// `no dead letters` when there are none.
pub async fn list(config: &Path, handler: Option<&str>) -> anyhow::Result<()> {
    let (_, db) = super::open(config).await?;
    let rows = db.list_dead_letters(handler).await;
    db.close().await;
    print!("{}", list_text(&rows?, handler));
    Ok(())
}

/// What `idem dlq list` prints for `rows`.
pub fn list_text(rows: &[DeadLetterRow], handler: Option<&str>) -> String {
    if rows.is_empty() {
        return match handler {
            Some(h) => format!("no dead letters of handler {}\n", printable(h)),
            None => "no dead letters\n".to_string(),
        };
    }
    let header = [
        "ID",
        "HANDLER",
        "MESSAGE",
        "SEQ",
        "SUBJECT",
        "DEAD-LETTERED",
        "REASON",
    ]
    .map(str::to_string);
    let mut lines = vec![header];
    for r in rows {
        lines.push([
            r.id.to_string(),
            printable(&r.consumer),
            r.message_id.as_deref().map_or("-".to_string(), printable),
            r.stream_sequence.to_string(),
            printable(&r.subject),
            time(r.failed_at_ms),
            shortened(&r.reason, LIST_REASON_CHARS),
        ]);
    }
    let mut widths = [0usize; 6];
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for line in &lines {
        for (cell, w) in line.iter().zip(widths) {
            let _ = write!(out, "{cell:<w$}  ");
        }
        out.push_str(&line[6]);
        out.push('\n');
    }
    out
}

/// `idem dlq show ID`: every field of one dead letter.
pub async fn show(config: &Path, id: i64) -> anyhow::Result<()> {
    let (_, db) = super::open(config).await?;
    let row = db.dead_letter_by_id(id).await;
    db.close().await;
    match row? {
        Some(row) => {
            print!("{}", show_text(&row));
            Ok(())
        }
        None => Err(no_such(id)),
    }
}

/// What `idem dlq show` prints: one `field: value` line per field, headers
/// one per line, the payload as text when it is UTF-8 without control
/// characters (other than newline, tab, carriage return), else as hex.
pub fn show_text(r: &DeadLetterRow) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "id: {}", r.id);
    let _ = writeln!(out, "handler: {}", printable(&r.consumer));
    match &r.message_id {
        Some(m) => {
            let _ = writeln!(out, "message id: {}", printable(m));
        }
        None => out.push_str("message id: - (none: the message's identity could not be read)\n"),
    }
    let _ = writeln!(out, "stream: {}", printable(&r.stream));
    let _ = writeln!(out, "stream sequence: {}", r.stream_sequence);
    let _ = writeln!(out, "subject: {}", printable(&r.subject));
    let _ = writeln!(out, "dead-lettered: {}", time(r.failed_at_ms));
    let _ = writeln!(out, "reason: {}", printable(&r.reason));
    if r.headers.is_empty() {
        out.push_str("headers: none\n");
    } else {
        out.push_str("headers:\n");
        for (name, value) in &r.headers {
            let _ = writeln!(out, "  {}: {}", printable(name), printable(value));
        }
    }
    let n = r.payload.len();
    match std::str::from_utf8(&r.payload) {
        _ if n == 0 => out.push_str("payload: 0 bytes\n"),
        Ok(text)
            if !text
                .chars()
                .any(|c| c.is_control() && !"\n\t\r".contains(c)) =>
        {
            let _ = writeln!(out, "payload: {n} bytes, UTF-8 text:");
            out.push_str(text);
            if !text.ends_with('\n') {
                out.push('\n');
            }
        }
        _ => {
            let _ = writeln!(out, "payload: {n} bytes, hex:");
            for chunk in r.payload.chunks(HEX_BYTES_PER_LINE) {
                out.push_str(&hex::encode(chunk));
                out.push('\n');
            }
        }
    }
    out
}

/// `idem dlq drop ID`: deletes one dead letter; an unknown id is an error.
pub async fn drop_one(config: &Path, id: i64) -> anyhow::Result<()> {
    let (_, db) = super::open(config).await?;
    let dropped = db.drop_dead_letter(id).await;
    db.close().await;
    if !dropped? {
        return Err(no_such(id));
    }
    println!("dropped 1 dead letter (id {id})");
    Ok(())
}

/// `idem dlq drop --handler NAME --all`: deletes every dead letter of one
/// handler (none is not an error).
pub async fn drop_all(config: &Path, handler: &str) -> anyhow::Result<()> {
    let (_, db) = super::open(config).await?;
    let dropped = db.drop_dead_letters(handler).await;
    db.close().await;
    println!(
        "dropped {} of handler {}",
        count(dropped?, "dead letter", "dead letters"),
        printable(handler)
    );
    Ok(())
}

/// The error for a dead-letter id that does not exist.
pub fn no_such(id: i64) -> anyhow::Error {
    anyhow::anyhow!("no dead letter with id {id}; `idem dlq list` shows the ids")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn row(payload: &[u8]) -> DeadLetterRow {
        DeadLetterRow {
            id: 7,
            consumer: "behave".into(),
            message_id: Some("evt_1".into()),
            stream: "ACCOUNTS".into(),
            stream_sequence: 12,
            subject: "accounts.credit".into(),
            reason: "rejected: no\naccount".into(),
            headers: vec![("Nats-Msg-Id".into(), "m1".into())],
            payload: payload.to_vec(),
            failed_at_ms: 0,
            published_ns: 0,
        }
    }

    #[test]
    fn list_aligns_columns_and_shortens_reasons() {
        let mut b = row(b"{}");
        b.id = 10;
        b.message_id = None;
        b.reason = "x".repeat(150);
        assert_eq!(
            list_text(&[row(b"{}"), b], None),
            format!(
                "ID  HANDLER  MESSAGE  SEQ  SUBJECT          DEAD-LETTERED         REASON\n\
                 7   behave   evt_1    12   accounts.credit  1970-01-01T00:00:00Z  rejected: no account\n\
                 10  behave   -        12   accounts.credit  1970-01-01T00:00:00Z  {}…\n",
                "x".repeat(99)
            )
        );
        assert_eq!(list_text(&[], None), "no dead letters\n");
        assert_eq!(list_text(&[], Some("h")), "no dead letters of handler h\n");
    }

    #[test]
    fn show_prints_text_or_hex() {
        assert_eq!(
            show_text(&row(b"{\"a\":1}")),
            "id: 7\nhandler: behave\nmessage id: evt_1\nstream: ACCOUNTS\nstream sequence: 12\n\
             subject: accounts.credit\ndead-lettered: 1970-01-01T00:00:00Z\n\
             reason: rejected: no account\nheaders:\n  Nats-Msg-Id: m1\n\
             payload: 7 bytes, UTF-8 text:\n{\"a\":1}\n"
        );
        let hex = show_text(&row(&[0, 0xff, 0x1b]));
        assert!(hex.ends_with("payload: 3 bytes, hex:\n00ff1b\n"), "{hex}");
        let esc = show_text(&row(b"a\x1b[2Jb"));
        assert!(
            esc.ends_with("payload: 6 bytes, hex:\n611b5b324a62\n"),
            "{esc}"
        );
        let mut none = row(b"");
        none.headers.clear();
        none.message_id = None;
        let t = show_text(&none);
        assert!(t.contains("\nmessage id: - (none: "), "{t}");
        assert!(t.ends_with("headers: none\npayload: 0 bytes\n"), "{t}");
    }
}
