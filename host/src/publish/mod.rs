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

mod line;
mod report;

use crate::admin::shortened;
use crate::config::{BrokerConfig, Config, IdentityRule};
use crate::progress::{Progress, Unit};
use anyhow::Context as _;
use async_nats::jetstream::context::{
    GetStreamByNameErrorKind, PublishAckFuture, PublishError, PublishErrorKind,
};
use line::{Message, check_line, check_subject, read_line};
use report::{BadLine, Failed, Stop, Tally, stop_line, summary};
use std::collections::VecDeque;
use std::io::BufRead;
use std::path::PathBuf;

/// Publish acks awaited at most this many at a time.
const IN_FLIGHT: usize = 256;
/// Longest broker text (an error's description) shown, in characters.
const MAX_BROKER_TEXT: usize = 200;

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
