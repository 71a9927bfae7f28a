//! `idem deploy --wait`: waits until every live host that runs the handler
//! runs the version just recorded, judged from the hosts' reports
//! ([`crate::deploy::heartbeat`]).
//!
//! A report answers the deployment when the host says it has acted on the
//! record's KV revision or a later one (`seen_revision`): revisions are the
//! bucket's own sequence, so a host whose clock runs behind or ahead of the
//! deploying machine is judged like any other. Only a report without a
//! revision (a host that has read no record yet, or an older idem) is
//! judged by its time, written after the deploy started.

use super::deploy::{Report, reports};
use crate::deploy::heartbeat::HandlerReport;
use crate::deploy::record::{bounded, escaped};
use crate::deploy::store::DeployStore;
use std::time::{Duration, Instant};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Where one host stands on a deployment, from its report for the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// It runs the deployed version.
    On,
    /// It acted on the record and refused the version: why (escaped,
    /// bounded).
    Refused(String),
    /// It acted on the record (or a later one) and runs another version:
    /// its digest (bounded).
    Runs(String),
    /// Its report does not answer the record yet.
    NotYet,
    /// It runs its module file (`watch = true`) and follows no deployment:
    /// waiting cannot change that.
    Watched,
}

/// Where the host whose report for the handler is `h` stands on the
/// deployment of `digest` recorded at KV `revision`. `written_since`:
/// whether the report was written after the deploy started, by the
/// report's own time (used only when it names no revision).
pub fn standing(h: &HandlerReport, digest: &str, revision: u64, written_since: bool) -> Standing {
    if h.watched {
        return Standing::Watched;
    }
    let answers = match h.seen_revision {
        Some(seen) => seen >= revision,
        None => written_since,
    };
    if !answers {
        return Standing::NotYet;
    }
    if h.digest == digest {
        return Standing::On;
    }
    match &h.refused {
        Some((d, reason)) if d == digest => Standing::Refused(escaped(reason, 400)),
        _ => Standing::Runs(bounded(&h.digest)),
    }
}

/// Waits until every live host that runs `handler` runs `digest`, the
/// version recorded at KV `revision` (at `since` by this machine's clock).
/// With `[deploy] trusted_hosts`, only verified reports count (the others
/// are named once, as ignored), and at least one verified host must run
/// `digest`: no verified report is never success.
///
/// # Errors
/// A host runs the handler from its module file (`watch = true`), at
/// once; after `timeout`, not every host runs `digest` (one line naming
/// each host that does not and what it runs or why it refused) or, with
/// `trusted_hosts`, no verified host reported; the hosts bucket cannot be
/// read.
pub async fn wait_for_hosts(
    store: &DeployStore,
    handler: &str,
    digest: &str,
    revision: u64,
    timeout: Duration,
    since: OffsetDateTime,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let verified_only = !store.config().trusted_hosts.is_empty();
    loop {
        let (mut on, mut behind, mut watched, mut ignored) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for Report {
            key,
            report: r,
            verified,
            ..
        } in reports(store).await?
        {
            let host = bounded(&key);
            if verified_only && !verified {
                ignored.push(host);
                continue;
            }
            let written_since =
                OffsetDateTime::parse(&r.reported_at, &Rfc3339).is_ok_and(|at| at >= since);
            for h in r.handlers.iter().filter(|h| h.name == handler) {
                match standing(h, digest, revision, written_since) {
                    Standing::On => on.push(host.clone()),
                    Standing::Refused(why) => behind.push(format!("{host} (refused it: {why})")),
                    Standing::Runs(other) => behind.push(format!("{host} (runs {other})")),
                    Standing::NotYet => {
                        behind.push(format!("{host} (has not answered revision {revision} yet)"))
                    }
                    Standing::Watched => watched.push(host.clone()),
                }
            }
        }
        if !watched.is_empty() {
            anyhow::bail!(
                "not every host can run {digest}: {} run `{handler}` from the module file (`watch = true`) and follow no deployment; remove `watch` from their config and restart them to follow `idem deploy`",
                watched.join(", ")
            );
        }
        // With `trusted_hosts`, success needs a verified host on the
        // version: reports deleted or overwritten by whoever can write the
        // hosts bucket must not read as "every host runs it".
        let proven = !verified_only || !on.is_empty();
        if behind.is_empty() && proven {
            if on.is_empty() {
                println!("no live host runs `{handler}`");
            } else {
                println!("every live host runs {digest}: {}", on.join(", "));
            }
            if !ignored.is_empty() {
                println!(
                    "ignored {} unverified report(s), not signed by a key of [deploy] trusted_hosts: {}",
                    ignored.len(),
                    ignored.join(", ")
                );
            }
            return Ok(());
        }
        if Instant::now() >= deadline {
            let waited = humantime::format_duration(timeout);
            if behind.is_empty() {
                anyhow::bail!(
                    "after {waited}, no host whose report is signed by a key of [deploy] trusted_hosts runs `{handler}` (ignored {} unverified report(s): {}); check that the hosts run with a [deploy] host_key this config trusts",
                    ignored.len(),
                    ignored.join(", ")
                );
            }
            anyhow::bail!(
                "after {waited}, not every host runs {digest}: {}",
                behind.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn report(digest: &str, seen: Option<u64>) -> HandlerReport {
        HandlerReport {
            name: "h".into(),
            digest: digest.into(),
            refused: None,
            in_flight: 0,
            processed: 0,
            duplicates: 0,
            dead_lettered: 0,
            seen_revision: seen,
            watched: false,
            shadow: None,
        }
    }

    #[test]
    fn a_revision_answers_whatever_the_clocks_say() {
        // Written "before" the deploy by a clock running behind, yet it
        // has acted on the record: on.
        assert_eq!(standing(&report("b", Some(7)), "b", 7, false), Standing::On);
        assert_eq!(standing(&report("b", Some(9)), "b", 7, false), Standing::On);
        // Written "after" the deploy by a clock running ahead, yet it has
        // not acted on the record: not yet, even though it runs the old one.
        assert_eq!(
            standing(&report("a", Some(6)), "b", 7, true),
            Standing::NotYet
        );
        // A later deploy of another version answered: runs it.
        assert_eq!(
            standing(&report("c", Some(8)), "b", 7, false),
            Standing::Runs("c".into())
        );
    }

    #[test]
    fn without_a_revision_the_report_time_decides() {
        assert_eq!(standing(&report("b", None), "b", 7, true), Standing::On);
        assert_eq!(
            standing(&report("b", None), "b", 7, false),
            Standing::NotYet
        );
        assert_eq!(
            standing(&report("a", None), "b", 7, true),
            Standing::Runs("a".into())
        );
    }

    #[test]
    fn a_refusal_and_a_watched_file_are_told_apart() {
        let mut r = report("a", Some(7));
        r.refused = Some(("b".into(), "line one\nline two".into()));
        assert_eq!(
            standing(&r, "b", 7, false),
            Standing::Refused("line one\\nline two".into())
        );
        // Refused another version: it runs `a`, not `b`.
        r.refused = Some(("x".into(), "no".into()));
        assert_eq!(standing(&r, "b", 7, false), Standing::Runs("a".into()));
        let mut w = report("b", None);
        w.watched = true;
        assert_eq!(standing(&w, "b", 7, true), Standing::Watched);
    }
}
