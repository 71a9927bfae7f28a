//! `idem publish`: one JetStream message per line of a JSON Lines file, for
//! demos, tests and replays (ARCHITECTURE.md, "Code map").
//!
//! Each line is checked whole before it is sent: UTF-8 and JSON, its
//! `Nats-Msg-Id` when asked for, its size on the wire against the server's
//! `max_payload` (from the connection's server info) and the capturing
//! stream's `max_msg_size`. Publishes are pipelined, and every PubAck still
//! outstanding is awaited before the command ends, so what it reports as
//! stored is what the stream confirmed. At the first line that cannot be
//! stored it stops sending (or, with `--skip-bad`, skips and lists it).

use crate::admin::shortened;
use crate::config::{BrokerConfig, Config, IdentityRule};
use crate::message_id;
use crate::progress::{Progress, Unit};
use anyhow::Context as _;
use async_nats::jetstream::context::{
    GetStreamByNameErrorKind, PublishAckFuture, PublishError, PublishErrorKind,
};
use std::collections::VecDeque;
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// Publish acks awaited at most this many at a time.
const IN_FLIGHT: usize = 256;
/// Bad lines `--skip-bad` lists one by one; past these it only counts them.
const MAX_LISTED: usize = 1000;
/// Longest broker text (an error's description) shown, in characters.
const MAX_BROKER_TEXT: usize = 200;
/// The header block of a message with one `Nats-Msg-Id` header, less the
/// id: `NATS/1.0\r\n`, `Nats-Msg-Id: `, `\r\n` after the value, `\r\n`.
const MSG_ID_HEADER_BYTES: usize = 10 + 13 + 2 + 2;

/// `idem publish`'s arguments.
#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// NATS URL of a server without credentials or TLS (else `--config`).
    #[arg(
        long,
        default_value = "nats://127.0.0.1:4222",
        conflicts_with = "config"
    )]
    pub broker: String,
    /// Connect as this config's `[broker]` says (URL, credentials, TLS;
    /// `IDEM_BROKER__*` variables apply) instead of `--broker`.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Subject to publish to (a stream must capture it).
    #[arg(long)]
    pub subject: String,
    /// Set `Nats-Msg-Id` from each line, e.g. `json:/event_id`.
    #[arg(long)]
    pub msg_id: Option<IdentityRule>,
    /// Skip a line that cannot be stored (not JSON, too large, refused by
    /// the stream), list it on stderr, and go on; without it publishing
    /// stops at that line.
    #[arg(long)]
    pub skip_bad: bool,
    /// The JSON Lines file.
    pub file: PathBuf,
}

/// Runs `idem publish`: prints on stdout what the stream stored, and with
/// `--skip-bad` one stderr line per skipped line.
///
/// # Errors
/// One line: the config cannot be loaded, the broker cannot be reached, no
/// stream captures the subject, the file cannot be opened or read (then
/// after the summary), or the first line that could not be stored (its
/// number and the reason, after the summary; nothing after it was sent
/// unless its refusal came back while later lines were in flight, which
/// the line counts).
pub async fn run(args: PublishArgs) -> anyhow::Result<()> {
    check_subject(&args.subject)?;
    let broker = match &args.config {
        Some(path) => Config::load(path)?.broker,
        None => BrokerConfig::at(&args.broker),
    };
    let js = crate::broker::connect(&broker).await?.js;
    let target = Target::find(&js, &args.subject).await?;
    let file = std::fs::File::open(&args.file)
        .with_context(|| format!("cannot open {}", args.file.display()))?;
    let size = file.metadata().map(|m| m.len()).ok();
    let mut publisher = Publisher {
        js: &js,
        target,
        args: &args,
        tally: Tally::default(),
        pending: VecDeque::new(),
    };
    let read = publisher.lines(std::io::BufReader::new(file), size).await;
    let Publisher { target, tally, .. } = publisher;
    for bad in &tally.skipped {
        eprintln!(
            "idem: {} line {} skipped: {}",
            args.file.display(),
            bad.line,
            bad.reason
        );
    }
    if tally.unlisted > 0 {
        eprintln!(
            "idem: {} more skipped lines of {} not listed",
            tally.unlisted,
            args.file.display()
        );
    }
    println!(
        "{}",
        summary(&tally, target.stream.as_deref(), &args.subject, &args.file)
    );
    read.with_context(|| format!("cannot read {}", args.file.display()))?;
    match &tally.stop {
        Some(stop) => anyhow::bail!("{}", stop_line(stop, &tally, &args.file)),
        None => Ok(()),
    }
}

/// A subject a message can be published to: not empty, no wildcard token,
/// no whitespace.
fn check_subject(subject: &str) -> anyhow::Result<()> {
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

/// Where the lines go and how large each may be.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// The stream capturing the subject (`None`: it could not be looked up;
    /// the first PubAck names it).
    stream: Option<String>,
    /// The server's `max_payload`, bytes (headers and payload).
    max_payload: usize,
    /// The stream's `max_msg_size`, bytes (`None`: unlimited or unknown).
    max_msg_size: Option<usize>,
}

impl Target {
    /// The stream capturing `subject` and the limits a line must keep.
    ///
    /// # Errors
    /// No stream captures `subject` (nothing is sent).
    async fn find(js: &async_nats::jetstream::Context, subject: &str) -> anyhow::Result<Self> {
        let max_payload = js.client().server_info().max_payload;
        let name = match js.stream_by_subject(subject).await {
            Ok(name) => name,
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => anyhow::bail!(
                "no stream captures subject `{subject}`, so nothing was sent; create one (`idem run` creates each handler's stream at its start)"
            ),
            Err(e) => {
                // A user allowed to publish but not to ask the JetStream
                // API still publishes; the PubAcks then tell what is stored.
                tracing::warn!(error = %e, "cannot look up the stream capturing `{subject}`; its max_msg_size is not checked before sending");
                return Ok(Self {
                    stream: None,
                    max_payload,
                    max_msg_size: None,
                });
            }
        };
        let max_msg_size = match js.get_stream(&name).await {
            Ok(stream) => usize::try_from(stream.cached_info().config.max_message_size)
                .ok()
                .filter(|&n| n > 0),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read stream {name}; its max_msg_size is not checked before sending");
                None
            }
        };
        Ok(Self {
            stream: Some(name),
            max_payload,
            max_msg_size,
        })
    }
}

/// One line that was not stored, and why (one line of text, escaped).
#[derive(Debug, Clone, PartialEq, Eq)]
struct BadLine {
    /// 1-based line number in the file.
    line: u64,
    /// Why, in the checker's or the broker's words.
    reason: String,
}

/// How a line failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failed {
    /// Refused before sending (not JSON, too large, no identity).
    NotSent,
    /// Sent, and the stream refused it.
    Refused,
    /// Sent, and no PubAck said whether it is stored.
    Unconfirmed,
}

/// The first line that could not be stored, where publishing stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stop {
    bad: BadLine,
    how: Failed,
    /// Whether `--skip-bad` would have skipped it (the line's fault, not
    /// the broker's or the connection's).
    skippable: bool,
    /// Messages stored before it (every line before it, but those
    /// `--skip-bad` skipped).
    stored_before: u64,
    /// Lines after it already sent when its refusal came back.
    sent_after: u64,
    /// Of those, how many the stream stored.
    stored_after: u64,
}

/// What happened to the lines so far.
#[derive(Debug, Default)]
struct Tally {
    /// Messages the stream confirmed (PubAck), duplicates included.
    stored: u64,
    /// Of those, PubAcks with `duplicate: true` (the stream already held a
    /// message with that `Nats-Msg-Id`).
    duplicates: u64,
    /// Lines `--skip-bad` skipped, listed up to [`MAX_LISTED`], in line order.
    skipped: Vec<BadLine>,
    /// Skipped lines past [`MAX_LISTED`].
    unlisted: u64,
    /// Where publishing stopped, if it did.
    stop: Option<Stop>,
}

impl Tally {
    fn skip(&mut self, bad: BadLine) {
        if self.skipped.len() < MAX_LISTED {
            let at = self.skipped.partition_point(|b| b.line < bad.line);
            self.skipped.insert(at, bad);
        } else {
            self.unlisted += 1;
        }
    }
}

struct Publisher<'a> {
    js: &'a async_nats::jetstream::Context,
    target: Target,
    args: &'a PublishArgs,
    tally: Tally,
    /// Sent lines whose PubAck is awaited, in file order.
    pending: VecDeque<(u64, PublishAckFuture)>,
}

impl Publisher<'_> {
    /// Reads, checks and sends every line until the end or a stop, then
    /// awaits every outstanding PubAck (also when reading failed).
    async fn lines(&mut self, mut reader: impl BufRead, size: Option<u64>) -> std::io::Result<()> {
        let mut progress = Progress::new("publish", size, Unit::Bytes);
        let mut position = 0u64;
        let mut buf = Vec::new();
        let mut lineno = 0u64;
        let limit = self.target.max_payload;
        let result = loop {
            if self.tally.stop.is_some() {
                break Ok(());
            }
            let read = match read_line(&mut reader, limit, &mut buf) {
                Ok(Some(read)) => read,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            lineno += 1;
            position += read.bytes;
            progress.update(position, &format!("{} messages", self.tally.stored));
            let checked = if read.cut {
                Err(format!(
                    "max_payload exceeded: the line is over {limit} bytes, the server's max_payload"
                ))
            } else {
                check_line(&buf, self.args.msg_id.as_ref(), &self.target)
            };
            match checked {
                Ok(Some(message)) => self.send(lineno, message, std::mem::take(&mut buf)).await,
                Ok(None) => continue,
                Err(reason) => self.failed(
                    BadLine {
                        line: lineno,
                        reason,
                    },
                    Failed::NotSent,
                    true,
                ),
            }
            if self.pending.len() >= IN_FLIGHT {
                self.settle_front().await;
            }
        };
        while !self.pending.is_empty() {
            self.settle_front().await;
        }
        progress.finish();
        result
    }

    /// Sends one checked line; a send that fails is that line's failure.
    async fn send(&mut self, line: u64, message: Message, payload: Vec<u8>) {
        let subject = self.args.subject.clone();
        let sent = match message.msg_id {
            Some(id) => {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", id.as_str());
                self.js
                    .publish_with_headers(subject, headers, payload.into())
                    .await
            }
            None => self.js.publish(subject, payload.into()).await,
        };
        match sent {
            Ok(ack) => self.pending.push_back((line, ack)),
            Err(e) => {
                let skippable = e.kind() == PublishErrorKind::MaxPayloadExceeded;
                let reason = broker_words(&e);
                self.failed(BadLine { line, reason }, Failed::NotSent, skippable);
            }
        }
    }

    /// Awaits the oldest outstanding PubAck and counts what it says.
    async fn settle_front(&mut self) {
        let Some((line, ack)) = self.pending.pop_front() else {
            return;
        };
        match ack.await {
            Ok(ack) => {
                self.tally.stored += 1;
                if ack.duplicate {
                    self.tally.duplicates += 1;
                }
                if self.target.stream.is_none() {
                    self.target.stream = Some(shortened(&ack.stream, MAX_BROKER_TEXT));
                }
                if let Some(stop) = &mut self.tally.stop {
                    if line > stop.bad.line {
                        stop.stored_after += 1;
                    } else {
                        stop.stored_before += 1;
                    }
                }
            }
            Err(e) => {
                let (how, skippable) = match e.kind() {
                    PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
                        (Failed::Unconfirmed, false)
                    }
                    PublishErrorKind::StreamNotFound => (Failed::Refused, false),
                    _ => (Failed::Refused, true),
                };
                let reason = match e.kind() {
                    PublishErrorKind::StreamNotFound => format!(
                        "no stream captures subject `{}` any more",
                        self.args.subject
                    ),
                    _ => broker_words(&e),
                };
                self.failed(BadLine { line, reason }, how, skippable);
            }
        }
    }

    /// A line that is not stored: skipped with `--skip-bad` when it is the
    /// line's fault, else the stop (the first such line; later ones were
    /// in flight and are counted there).
    fn failed(&mut self, bad: BadLine, how: Failed, skippable: bool) {
        if self.args.skip_bad && skippable {
            self.tally.skip(bad);
            return;
        }
        match &self.tally.stop {
            // A line sent before the stop that failed afterwards: it is the
            // first line not stored (a line checked later is never sent).
            Some(stop) if bad.line < stop.bad.line => {}
            Some(_) => return,
            None => {}
        }
        self.tally.stop = Some(Stop {
            sent_after: self.pending.iter().filter(|(l, _)| *l > bad.line).count() as u64,
            bad,
            how,
            skippable,
            stored_before: self.tally.stored,
            stored_after: 0,
        });
    }
}

/// The shown text of a publish error: the JetStream error as the server
/// worded it (`message size exceeds maximum allowed (code 400, error code
/// 10054)`), else the client's; escaped and bounded.
fn broker_words(e: &PublishError) -> String {
    let text = match std::error::Error::source(e) {
        Some(source) => source.to_string(),
        None => e.to_string(),
    };
    shortened(&text, MAX_BROKER_TEXT)
}

/// One line read by [`read_line`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LineRead {
    /// Bytes the line took in the file, its newline included.
    bytes: u64,
    /// The line is longer than the limit: `buf` holds only its start.
    cut: bool,
}

/// Reads the next line into `buf` (without its `\n` or `\r\n`), keeping at
/// most `limit` bytes of it and skipping the rest: a line longer than
/// anything the server takes is never held whole. `None` at the end.
fn read_line(
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
struct Message {
    /// Its `Nats-Msg-Id`, with `--msg-id`.
    msg_id: Option<String>,
}

/// Checks one whole line: `Ok(None)` for a blank line (not sent), the
/// message to send, or why it cannot be stored.
fn check_line(
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
fn wire_size(payload: usize, msg_id: Option<&str>) -> usize {
    match msg_id {
        Some(id) => payload + MSG_ID_HEADER_BYTES + id.len(),
        None => payload,
    }
}

/// The stdout line: `stored 999 messages in stream ACCOUNTS (subject
/// accounts.credit) from events.jsonl`, then the duplicates and the skipped
/// lines when there are any.
fn summary(tally: &Tally, stream: Option<&str>, subject: &str, file: &Path) -> String {
    let mut line = format!(
        "stored {} in stream {} (subject {subject}) from {}",
        crate::admin::count(tally.stored, "message", "messages"),
        stream.unwrap_or("?"),
        file.display()
    );
    if tally.duplicates > 0 {
        line.push_str(&match tally.duplicates {
            1 => "; 1 of them a duplicate the stream already held (same Nats-Msg-Id)".to_string(),
            n => format!("; {n} of them duplicates the stream already held (same Nats-Msg-Id)"),
        });
    }
    let skipped = tally.skipped.len() as u64 + tally.unlisted;
    if skipped > 0 {
        let shown: Vec<String> = tally
            .skipped
            .iter()
            .take(10)
            .map(|b| b.line.to_string())
            .collect();
        let more = if skipped > 10 { ", …" } else { "" };
        line.push_str(&format!(
            "; skipped {}: {}{more}",
            crate::admin::count(skipped, "line", "lines"),
            shown.join(", ")
        ));
    }
    line
}

/// The error line for where publishing stopped.
fn stop_line(stop: &Stop, tally: &Tally, file: &Path) -> String {
    let what = match stop.how {
        Failed::NotSent => "not sent",
        Failed::Refused => "not stored",
        Failed::Unconfirmed => "not confirmed (it may or may not be stored)",
    };
    let after = match stop.sent_after {
        0 => "nothing after it was sent".to_string(),
        n => format!(
            "{} after it already sent, {} of them stored ({} in all)",
            crate::admin::count(n, "line", "lines"),
            stop.stored_after,
            tally.stored
        ),
    };
    let hint = match (stop.skippable, stop.how) {
        (false, _) => "",
        (true, Failed::NotSent) => "; fix it, or pass --skip-bad to skip such lines",
        (true, _) => "; pass --skip-bad to go on past lines the stream refuses",
    };
    let skipped = tally.skipped.len() as u64 + tally.unlisted;
    let before = match skipped {
        0 => "every line before it is stored".to_string(),
        n => format!("every line before it but the {n} skipped is stored"),
    };
    format!(
        "{} line {} {what}: {}; publishing stopped there: {before} ({}), {after}{hint}",
        file.display(),
        stop.bad.line,
        stop.bad.reason,
        crate::admin::count(stop.stored_before, "message", "messages"),
    )
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

    #[test]
    fn the_stop_says_what_is_stored() {
        let tally = Tally {
            stored: 5,
            ..Tally::default()
        };
        let stop = Stop {
            bad: BadLine {
                line: 6,
                reason: "maximum messages exceeded".into(),
            },
            how: Failed::Refused,
            skippable: true,
            stored_before: 5,
            sent_after: 2,
            stored_after: 0,
        };
        assert_eq!(
            stop_line(&stop, &tally, Path::new("e.jsonl")),
            "e.jsonl line 6 not stored: maximum messages exceeded; publishing stopped there: every line before it is stored (5 messages), 2 lines after it already sent, 0 of them stored (5 in all); pass --skip-bad to go on past lines the stream refuses"
        );
        let mut tally = tally;
        tally.duplicates = 1;
        tally.skip(BadLine {
            line: 9,
            reason: String::new(),
        });
        tally.skip(BadLine {
            line: 3,
            reason: String::new(),
        });
        assert_eq!(
            summary(&tally, Some("S"), "s.x", Path::new("e.jsonl")),
            "stored 5 messages in stream S (subject s.x) from e.jsonl; 1 of them a duplicate the stream already held (same Nats-Msg-Id); skipped 2 lines: 3, 9"
        );
    }
}
