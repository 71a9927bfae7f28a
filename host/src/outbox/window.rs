//! The check a host makes at start for every handler that may publish:
//! each stream that stores a granted subject must keep message ids for
//! dropping copies (its `duplicate_window`, JetStream's "Message
//! Deduplication", docs.nats.io) at least as long as the relay may take
//! to send a row again ([`RESEND_HORIZON`]); otherwise a host that dies
//! between sending and deleting a row would store the message twice. A
//! shorter window is refused like a retention longer than the stream's
//! age. A granted subject no stream stores is said once (its rows wait,
//! failing, until one does). A running host checks again every
//! [`RECHECK_EVERY`] and warns ([`Recheck`]).

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
/// The streams cannot be listed (the client's error in the chain, for
/// [`crate::broker::unanswered::unanswered`]), or a stream's window is too
/// short (one line per problem).
pub async fn check_streams(
    js: &jetstream::Context,
    handlers: &[HandlerConfig],
) -> anyhow::Result<()> {
    let publishers: Vec<(String, Vec<String>)> = handlers
        .iter()
        .map(|h| (h.name.clone(), h.publish.clone()))
        .collect();
    let mut problems = Vec::new();
    for (handler, found) in findings(js, &publishers).await? {
        for grant in &found.unstored {
            tracing::warn!(handler = %handler, subject = %grant, "no stream stores this granted subject: its outbox publishes wait and are tried again until one does (add it to a stream's subjects)");
        }
        problems.extend(found.problems);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", problems.join("\n"))
    }
}

/// [`check`] for every `(handler, publish grants)` of `publishers` that
/// may publish, against the broker's streams as they are now.
///
/// # Errors
/// The streams cannot be listed.
pub async fn findings(
    js: &jetstream::Context,
    publishers: &[(String, Vec<String>)],
) -> anyhow::Result<Vec<(String, WindowFindings)>> {
    if publishers.iter().all(|(_, p)| p.is_empty()) {
        return Ok(Vec::new());
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
            anyhow::Error::new(e)
                .context("cannot list the broker's streams to check the outbox's targets")
        })?;
    Ok(publishers
        .iter()
        .filter(|(_, p)| !p.is_empty())
        .map(|(h, p)| (h.clone(), check(h, p, &streams)))
        .collect())
}

/// The same check while a host runs ([`RECHECK_EVERY`]): a stream changed
/// after the start (its `duplicate_window` shortened, `no_ack` turned on,
/// a granted subject no longer stored) is warned about once, and again
/// if it comes back after being put right; the host goes on (its relay
/// keeps sending).
#[derive(Default)]
pub struct Recheck {
    said: std::collections::HashSet<String>,
}

/// How often a running host checks the outbox's target streams again.
pub const RECHECK_EVERY: Duration = Duration::from_secs(60);

impl Recheck {
    /// Checks `publishers` against the streams now and warns what is new.
    pub async fn run(&mut self, js: &jetstream::Context, publishers: &[(String, Vec<String>)]) {
        let found =
            tokio::time::timeout(super::relay::SEND_TIMEOUT, findings(js, publishers)).await;
        let Ok(Ok(found)) = found else {
            // The broker is away: the relay's sends say so.
            return;
        };
        for (handler, line) in self.fresh(found) {
            tracing::warn!(handler = %handler, "{line}");
        }
    }

    /// The lines of `found` not said at the last check, with their
    /// handler; what is no longer found is forgotten.
    fn fresh(&mut self, found: Vec<(String, WindowFindings)>) -> Vec<(String, String)> {
        let mut now = std::collections::HashSet::new();
        let mut fresh = Vec::new();
        for (handler, f) in found {
            let lines = f
                .problems
                .into_iter()
                .map(|p| format!("{p}; a host starting now would refuse this config"))
                .chain(f.unstored.into_iter().map(|grant| {
                    format!("no stream stores the granted subject {grant:?} any more: its outbox publishes wait and are tried again until one does")
                }));
            for line in lines {
                if !self.said.contains(&line) {
                    fresh.push((handler.clone(), line.clone()));
                }
                now.insert(line);
            }
        }
        self.said = now;
        fresh
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
    fn a_running_host_says_a_new_problem_once_and_again_after_it_was_put_right() {
        let short = [stream("AUDIT", &["audit.>"], 10)];
        let fine = [stream("AUDIT", &["audit.>"], 120)];
        let publish = vec!["audit.x".to_string()];
        let mut r = Recheck::default();
        let at = |streams: &[StreamWindow]| vec![("h".to_string(), check("h", &publish, streams))];
        let first = r.fresh(at(&short));
        assert_eq!(first.len(), 1);
        assert!(
            first[0].1.contains("stream `AUDIT`")
                && first[0].1.ends_with("would refuse this config")
        );
        assert_eq!(r.fresh(at(&short)), vec![]);
        assert_eq!(r.fresh(at(&fine)), vec![]);
        assert_eq!(r.fresh(at(&short)), first);
        let gone = r.fresh(at(&[]));
        assert_eq!(gone.len(), 1);
        assert!(
            gone[0]
                .1
                .starts_with("no stream stores the granted subject \"audit.x\" any more")
        );
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
