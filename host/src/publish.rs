//! `idem publish`: one JetStream message per line of a JSON Lines file, for
//! demos, tests and replays. Publishes are pipelined and each one is confirmed
//! by the stream's publish ack before the command reports success.

use crate::config::IdentityRule;
use crate::message_id;
use crate::progress::{Progress, Unit};
use anyhow::Context as _;
use std::collections::VecDeque;
use std::io::BufRead;
use std::path::Path;

/// Publish acks awaited at most this many at a time.
const IN_FLIGHT: usize = 256;

/// Publishes every non-empty line of `file` to `subject`. With `msg_id`
/// (a `json:/pointer`), each message carries that value in `Nats-Msg-Id`,
/// which JetStream also uses for its own duplicate window. Returns the count.
/// Shows its progress in bytes of the file on stderr ([`crate::progress`]).
/// Errors: unreadable file, a line that is not JSON when `msg_id` is set, no
/// stream capturing `subject`, broker unreachable.
pub async fn publish_file(
    broker_url: &str,
    subject: &str,
    file: &Path,
    msg_id: Option<&IdentityRule>,
) -> anyhow::Result<u64> {
    let js = crate::broker::connect(&crate::config::BrokerConfig::at(broker_url))
        .await?
        .js;
    let f = std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    let size = f.metadata().map(|m| m.len()).ok();
    let mut progress = Progress::new("publish", size, Unit::Bytes);
    let mut read = 0u64;
    let mut pending = VecDeque::new();
    let mut count = 0u64;
    for (lineno, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", file.display()))?;
        read += line.len() as u64 + 1;
        progress.update(read, &format!("{count} messages"));
        if line.trim().is_empty() {
            continue;
        }
        let mut headers = async_nats::HeaderMap::new();
        if let Some(rule) = msg_id {
            let id = message_id::extract(rule, None, line.as_bytes())
                .map_err(|e| anyhow::anyhow!("{}:{}: {e}", file.display(), lineno + 1))?;
            headers.insert("Nats-Msg-Id", id.as_str());
        }
        let ack = js
            .publish_with_headers(subject.to_string(), headers, line.into_bytes().into())
            .await
            .with_context(|| format!("cannot publish to `{subject}`"))?;
        pending.push_back(ack);
        if pending.len() >= IN_FLIGHT
            && let Some(a) = pending.pop_front()
        {
            a.await.with_context(|| no_stream_hint(subject))?;
        }
        count += 1;
    }
    for a in pending {
        a.await.with_context(|| no_stream_hint(subject))?;
    }
    progress.finish();
    Ok(count)
}

fn no_stream_hint(subject: &str) -> String {
    format!(
        "publish to `{subject}` not confirmed; is there a stream capturing it (start `idem run` once, or create it)?"
    )
}
