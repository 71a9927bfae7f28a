//! What idem wants of a handler's stream and durable consumer on the broker,
//! and how an existing one differs from it: pure decisions, tested without a
//! server. [`crate::broker::ensure_consumer`] acts on them.
//!
//! Subject matching follows NATS subject rules
//! (<https://docs.nats.io/nats-concepts/subjects#wildcards>): subjects are
//! `.`-separated tokens; `*` matches exactly one token, `>` one or more
//! tokens at the end.

use async_nats::jetstream::consumer::{self, AckPolicy};
use std::time::Duration;

/// The metadata key and value idem writes on a stream it creates
/// (JetStream stream `metadata`, nats-server 2.10+). Only a stream carrying
/// it is changed by idem (subjects added); any other is the operator's.
pub const OWNER_KEY: &str = "idem.owner";
/// See [`OWNER_KEY`].
pub const OWNER_VALUE: &str = "idem";

/// The consumer settings idem sets for a handler, as it wants them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedConsumer {
    /// The handler's `ack_wait`.
    pub ack_wait: Duration,
    /// The broker's `max_ack_pending`.
    pub max_ack_pending: i64,
    /// The handler's `subjects`, the consumer's filter (a partition's:
    /// each prefixed with its number).
    pub subjects: Vec<String>,
    /// A partition's consumer: pinned-client priority group
    /// [`crate::broker::partition::GROUP`] with this `priority_timeout`;
    /// `None`: no priority group.
    pub priority_timeout: Option<Duration>,
}

/// A consumer filter as a sorted, de-duplicated list, whether the broker
/// holds it in `filter_subject` (one) or `filter_subjects` (several).
fn filters(single: &str, several: &[String]) -> Vec<String> {
    let mut all: Vec<String> = several.to_vec();
    if !single.is_empty() {
        all.push(single.to_string());
    }
    all.sort();
    all.dedup();
    all
}

/// The names of the settings in which `found` (an existing durable consumer)
/// differs from `want`; empty when it matches. Compared: `ack_policy`
/// (explicit), `ack_wait`, `max_deliver` (unlimited, -1: idem enforces its
/// own), `max_ack_pending`, the filter subjects as a set, and the priority
/// group with its timeout (a partition's consumer). A consumer's
/// deliver policy cannot be changed on the broker and is not compared.
pub fn consumer_drift(found: &consumer::Config, want: &WantedConsumer) -> Vec<&'static str> {
    let mut drift = Vec::new();
    if found.ack_policy != AckPolicy::Explicit {
        drift.push("ack_policy");
    }
    if found.ack_wait != want.ack_wait {
        drift.push("ack_wait");
    }
    if found.max_deliver != -1 {
        drift.push("max_deliver");
    }
    if found.max_ack_pending != want.max_ack_pending {
        drift.push("max_ack_pending");
    }
    if filters(&found.filter_subject, &found.filter_subjects) != filters("", &want.subjects) {
        drift.push("filter_subjects");
    }
    let (policy, groups) = match want.priority_timeout {
        Some(_) => (
            consumer::PriorityPolicy::PinnedClient,
            vec![crate::broker::partition::GROUP.to_string()],
        ),
        None => (consumer::PriorityPolicy::None, Vec::new()),
    };
    if found.priority_policy != policy || found.priority_groups != groups {
        drift.push("priority_groups");
    } else if let Some(timeout) = want.priority_timeout
        && found.priority_timeout != timeout
    {
        drift.push("priority_timeout");
    }
    drift
}

/// Whether a stream subject (`pattern`, possibly with wildcards) captures
/// every message a handler subject (`subject`, possibly with wildcards)
/// names. `a.>` captures `a.b`, `a.*` and `a.b.c`; `a.*` captures `a.b` and
/// `a.*` but not `a.>` or `a.b.c`.
pub fn captures(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(t)) if t != ">" => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The handler subjects that none of `stream_subjects` captures, in the
/// handler's order.
pub fn uncaptured<'a>(stream_subjects: &[String], subjects: &'a [String]) -> Vec<&'a str> {
    subjects
        .iter()
        .filter(|s| !stream_subjects.iter().any(|p| captures(p, s)))
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want() -> WantedConsumer {
        WantedConsumer {
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 1000,
            subjects: vec!["a.credit".into(), "a.debit".into()],
            priority_timeout: None,
        }
    }

    fn matching() -> consumer::Config {
        consumer::Config {
            durable_name: Some("h".into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            max_deliver: -1,
            max_ack_pending: 1000,
            filter_subjects: vec!["a.debit".into(), "a.credit".into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_matching_consumer_has_no_drift() {
        assert_eq!(consumer_drift(&matching(), &want()), Vec::<&str>::new());
        // One subject, held in `filter_subject`.
        let one = WantedConsumer {
            subjects: vec!["a.credit".into()],
            ..want()
        };
        let found = consumer::Config {
            filter_subject: "a.credit".into(),
            filter_subjects: Vec::new(),
            ..matching()
        };
        assert_eq!(consumer_drift(&found, &one), Vec::<&str>::new());
    }

    #[test]
    fn every_setting_idem_sets_is_compared() {
        let cases: [(&str, consumer::Config); 6] = [
            (
                "ack_policy",
                consumer::Config {
                    ack_policy: AckPolicy::All,
                    ..matching()
                },
            ),
            (
                "ack_wait",
                consumer::Config {
                    ack_wait: Duration::from_secs(5),
                    ..matching()
                },
            ),
            (
                "max_deliver",
                consumer::Config {
                    max_deliver: 5,
                    ..matching()
                },
            ),
            (
                "max_ack_pending",
                consumer::Config {
                    max_ack_pending: 20,
                    ..matching()
                },
            ),
            (
                "filter_subjects",
                consumer::Config {
                    filter_subjects: vec!["a.credit".into()],
                    ..matching()
                },
            ),
            (
                "filter_subjects",
                consumer::Config {
                    filter_subject: "a.credit".into(),
                    filter_subjects: Vec::new(),
                    ..matching()
                },
            ),
        ];
        for (name, found) in cases {
            assert_eq!(consumer_drift(&found, &want()), vec![name], "{found:?}");
        }
        let all = consumer::Config {
            ack_wait: Duration::from_secs(1),
            max_deliver: 3,
            filter_subjects: Vec::new(),
            ..matching()
        };
        assert_eq!(
            consumer_drift(&all, &want()),
            vec!["ack_wait", "max_deliver", "filter_subjects"]
        );
    }

    #[test]
    fn a_partition_consumer_needs_its_pinned_group_and_timeout() {
        let partition = WantedConsumer {
            priority_timeout: Some(Duration::from_secs(45)),
            ..want()
        };
        let pinned = consumer::Config {
            priority_policy: consumer::PriorityPolicy::PinnedClient,
            priority_groups: vec!["idem".into()],
            priority_timeout: Duration::from_secs(45),
            ..matching()
        };
        assert_eq!(consumer_drift(&pinned, &partition), Vec::<&str>::new());
        assert_eq!(
            consumer_drift(&matching(), &partition),
            vec!["priority_groups"]
        );
        assert_eq!(consumer_drift(&pinned, &want()), vec!["priority_groups"]);
        let shorter = consumer::Config {
            priority_timeout: Duration::from_secs(20),
            ..pinned
        };
        assert_eq!(
            consumer_drift(&shorter, &partition),
            vec!["priority_timeout"]
        );
    }

    #[test]
    fn stream_subjects_capture_by_nats_rules() {
        for (pattern, subject, want) in [
            ("a.credit", "a.credit", true),
            ("a.credit", "a.debit", false),
            ("a.*", "a.debit", true),
            ("a.*", "a.*", true),
            ("a.*", "a.>", false),
            ("a.*", "a.b.c", false),
            ("a.*", "a", false),
            ("a.>", "a.b", true),
            ("a.>", "a.b.c", true),
            ("a.>", "a.*", true),
            ("a.>", "a.>", true),
            ("a.>", "a", false),
            (">", "x.y", true),
            ("*.credit", "a.credit", true),
            ("*.credit", "a.debit", false),
            ("a.credit", "a.credit.x", false),
            ("a.credit.x", "a.credit", false),
        ] {
            assert_eq!(captures(pattern, subject), want, "{pattern} / {subject}");
        }
        let stream = vec!["a.credit".to_string(), "b.>".to_string()];
        let handler = vec![
            "a.credit".to_string(),
            "a.debit".to_string(),
            "b.x.y".to_string(),
        ];
        assert_eq!(uncaptured(&stream, &handler), vec!["a.debit"]);
    }
}
