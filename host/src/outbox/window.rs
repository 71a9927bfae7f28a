//! The check a host makes at start for every handler that may publish:
//! each stream that stores a granted subject must keep message ids for
//! dropping copies (its `duplicate_window`, JetStream's "Message
//! Deduplication", docs.nats.io) at least as long as the relay may take
//! to send a row again ([`RESEND_HORIZON`]); otherwise a host that dies
//! between sending and deleting a row would store the message twice. A
//! shorter window is refused like a retention longer than the stream's
//! age. A granted subject no stream stores is said once (its rows wait,
//! failing, until one does).

use super::relay::RESEND_HORIZON;
use super::subject;
use crate::config::HandlerConfig;
use async_nats::jetstream;
use futures::TryStreamExt as _;
use std::time::Duration;

/// A stream as the check sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamWindow {
    /// Its name.
    pub name: String,
    /// The subjects it stores.
    pub subjects: Vec<String>,
    /// How long it keeps message ids (`duplicate_window`).
    pub window: Duration,
    /// It answers no publish (`no_ack`): the relay would never see a
    /// send acknowledged and would send again for ever.
    pub no_ack: bool,
}

/// What the check found for one handler: problems (one line each) and
/// granted subjects no stream stores.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct WindowFindings {
    /// Lines to refuse the config with.
    pub problems: Vec<String>,
    /// Granted patterns that no stream stores.
    pub unstored: Vec<String>,
}

/// Checks `handler`'s `publish` grants against `streams`.
pub fn check(handler: &str, publish: &[String], streams: &[StreamWindow]) -> WindowFindings {
    let mut found = WindowFindings::default();
    for grant in publish {
        let mut stored = false;
        for s in streams {
            // A handler never publishes to `$…` or `_INBOX.` subjects
            // (`subject`), so streams on them (idem's own buckets, any
            // KV bucket) are not its targets.
            let reachable = |sub: &&String| {
                !(sub.starts_with('$') || *sub == "_INBOX" || sub.starts_with("_INBOX."))
            };
            if !s
                .subjects
                .iter()
                .filter(reachable)
                .any(|sub| subject::overlap(sub, grant))
            {
                continue;
            }
            stored = true;
            if s.no_ack {
                found.problems.push(format!(
                    "handler `{handler}` may publish to {grant:?}, which stream `{}` stores without acknowledging publishes (no_ack); the outbox relay deletes a row only once its publish is acknowledged, so it would store copies for ever: turn no_ack off on the stream or take the subject out of `publish`",
                    s.name
                ));
            }
            if s.window < RESEND_HORIZON {
                found.problems.push(format!(
                    "handler `{handler}` may publish to {grant:?}, which stream `{}` stores with a duplicate_window of {}; the outbox relay may send a message again up to {} later, so raise the stream's duplicate_window to at least that (`nats stream edit {} --dupe-window {}s`)",
                    s.name,
                    humantime::format_duration(s.window),
                    humantime::format_duration(RESEND_HORIZON),
                    s.name,
                    RESEND_HORIZON.as_secs(),
                ));
            }
        }
        if !stored {
            found.unstored.push(grant.clone());
        }
    }
    found
}

/// Reads every stream and checks every handler of `handlers` that may
/// publish; says the unstored grants as warnings.
///
/// # Errors
/// The streams cannot be listed, or a stream's window is too short (one
/// line per problem).
pub async fn check_streams(
    js: &jetstream::Context,
    handlers: &[HandlerConfig],
) -> anyhow::Result<()> {
    if handlers.iter().all(|h| h.publish.is_empty()) {
        return Ok(());
    }
    let streams: Vec<StreamWindow> = js
        .streams()
        .map_ok(|info| StreamWindow {
            name: info.config.name,
            subjects: info.config.subjects,
            window: info.config.duplicate_window,
            no_ack: info.config.no_ack,
        })
        .try_collect()
        .await
        .map_err(|e| {
            anyhow::anyhow!("cannot list the broker's streams to check the outbox's targets: {e}")
        })?;
    let mut problems = Vec::new();
    for h in handlers {
        let found = check(&h.name, &h.publish, &streams);
        for grant in &found.unstored {
            tracing::warn!(handler = %h.name, subject = %grant, "no stream stores this granted subject: its outbox publishes wait and are tried again until one does (add it to a stream's subjects)");
        }
        problems.extend(found.problems);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", problems.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(name: &str, subjects: &[&str], secs: u64) -> StreamWindow {
        StreamWindow {
            name: name.into(),
            subjects: subjects.iter().map(|s| (*s).to_string()).collect(),
            window: Duration::from_secs(secs),
            no_ack: false,
        }
    }

    #[test]
    fn streams_on_broker_subjects_are_no_targets_and_no_ack_is_refused() {
        let mut silent = stream("SILENT", &["audit.x"], 120);
        silent.no_ack = true;
        let streams = [
            stream("KV_idem-hosts", &["$KV.idem-hosts.>"], 15),
            stream("INBOXES", &["_INBOX.>"], 1),
            silent,
        ];
        let publish = vec![">".to_string()];
        let found = check("h", &publish, &streams);
        assert_eq!(found.problems.len(), 1, "{:?}", found.problems);
        assert!(found.problems[0].contains("stream `SILENT`"));
        assert!(found.problems[0].contains("no_ack"));
        let found = check("h", &["other.>".to_string()], &streams[..2]);
        assert_eq!((found.problems.len(), found.unstored.len()), (0, 1));
    }

    #[test]
    fn a_window_shorter_than_the_resend_horizon_is_refused() {
        let streams = [
            stream("ACCEPTED", &["orders.accepted"], 120),
            stream("AUDIT", &["audit.>"], 10),
            stream("OTHER", &["other.x"], 1),
        ];
        let publish = vec!["orders.*".to_string(), "audit.orders".to_string()];
        let found = check("orders", &publish, &streams);
        assert_eq!(found.unstored, Vec::<String>::new());
        assert_eq!(found.problems.len(), 1, "{:?}", found.problems);
        assert!(found.problems[0].contains("stream `AUDIT`"));
        assert!(found.problems[0].contains("--dupe-window 41s"));
    }

    #[test]
    fn the_horizon_itself_is_enough_and_unstored_grants_are_named() {
        let streams = [stream("A", &["a.>"], RESEND_HORIZON.as_secs())];
        let publish = vec!["a.b".to_string(), "b.c".to_string()];
        let found = check("h", &publish, &streams);
        assert_eq!(found.problems, Vec::<String>::new());
        assert_eq!(found.unstored, vec!["b.c".to_string()]);
    }
}
