//! What a handler's config lets its outbox reach: `publish` subjects
//! (NATS wildcards, [`super::subject`]) and named `endpoints` (the guest
//! names one, never a URL), and the per-message caps on calls and bytes.

use super::{Target, subject};
use crate::store::OutboxSummary;
use std::collections::BTreeMap;

/// The longest endpoint name, in bytes.
pub const MAX_ENDPOINT_NAME_BYTES: usize = 64;

/// One handler's outbox grants, checked at config load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxGrants {
    /// Subject patterns the handler may publish to.
    publish: Vec<String>,
    /// Endpoint name → URL (`http` or `https`).
    endpoints: BTreeMap<String, url::Url>,
    /// The most publishes and calls together one message may make.
    pub max_calls: u32,
    /// The most bytes (subjects or endpoint names, payloads, headers and
    /// keys together) one message's outbox calls may carry.
    pub max_bytes: usize,
}

impl OutboxGrants {
    /// The grants of a handler whose config lists `publish` patterns and
    /// `endpoints` (name → URL), with its caps. Entries that
    /// [`check`] refuses are left out (a loaded config has none).
    pub fn new(
        publish: &[String],
        endpoints: &BTreeMap<String, String>,
        max_calls: u32,
        max_bytes: usize,
    ) -> Self {
        Self {
            publish: publish
                .iter()
                .filter(|p| subject::check_pattern(p).is_ok())
                .cloned()
                .collect(),
            endpoints: endpoints
                .iter()
                .filter_map(|(name, u)| Some((name.clone(), parse_endpoint(u).ok()?)))
                .collect(),
            max_calls,
            max_bytes,
        }
    }

    /// The grants and caps of handler `cfg` (its `publish`, `endpoints`,
    /// `max_outbox_calls` and `max_outbox_kib`).
    pub fn of_handler(cfg: &crate::config::HandlerConfig) -> Self {
        Self::new(
            &cfg.publish,
            &cfg.endpoints,
            cfg.max_outbox_calls,
            cfg.max_outbox_kib.saturating_mul(1024),
        )
    }

    /// The `publish` patterns, in config order.
    pub fn publish(&self) -> &[String] {
        &self.publish
    }

    /// Whether the literal `subject` is granted.
    pub fn allows_subject(&self, subject: &str) -> bool {
        self.publish.iter().any(|p| subject::matches(p, subject))
    }

    /// The URL of the endpoint named `name`, when granted.
    pub fn endpoint(&self, name: &str) -> Option<&url::Url> {
        self.endpoints.get(name)
    }

    /// The grant `target` falls under, for a metric label: for a publish
    /// the first `publish` pattern that matches it, for a call the
    /// endpoint's name; `(ungranted)` for a row its config no longer
    /// grants. The labels are bounded by the config, whatever subjects
    /// guests choose within a wildcard grant.
    pub fn grant_of(&self, target: &Target) -> Target {
        const UNGRANTED: &str = "(ungranted)";
        match target {
            Target::Publish(s) => Target::Publish(
                self.publish
                    .iter()
                    .find(|p| subject::matches(p, s))
                    .map_or(UNGRANTED, String::as_str)
                    .to_owned(),
            ),
            Target::Call(e) => Target::Call(if self.endpoints.contains_key(e) {
                e.clone()
            } else {
                UNGRANTED.to_owned()
            }),
        }
    }

    /// Whether anything is granted at all.
    pub fn is_empty(&self) -> bool {
        self.publish.is_empty() && self.endpoints.is_empty()
    }
}

/// The grant `consumer`'s `target` falls under ([`OutboxGrants::grant_of`],
/// with `grants` per handler); `(not run here)` for a handler `grants` does
/// not hold.
pub fn grant_in(
    grants: &std::collections::HashMap<String, std::sync::Arc<OutboxGrants>>,
    consumer: &str,
    target: &Target,
) -> Target {
    match grants.get(consumer) {
        Some(g) => g.grant_of(target),
        None => match target {
            Target::Publish(_) => Target::Publish("(not run here)".into()),
            Target::Call(_) => Target::Call("(not run here)".into()),
        },
    }
}

/// `summary` (per handler and literal target) per handler and grant
/// ([`OutboxGrants::grant_of`], with `grants` per handler; a handler this
/// host does not run gets target `(not run here)`): counts added, the
/// oldest kept.
pub fn summary_by_grant(
    summary: &[OutboxSummary],
    grants: &std::collections::HashMap<String, std::sync::Arc<OutboxGrants>>,
) -> Vec<OutboxSummary> {
    let mut by: BTreeMap<(String, String, String), OutboxSummary> = BTreeMap::new();
    for s in summary {
        let target = grant_in(grants, &s.consumer, &s.target);
        let key = match &target {
            Target::Publish(t) => (s.consumer.clone(), "publish".to_owned(), t.clone()),
            Target::Call(t) => (s.consumer.clone(), "call".to_owned(), t.clone()),
        };
        let entry = by.entry(key).or_insert_with(|| OutboxSummary {
            consumer: s.consumer.clone(),
            target,
            pending: 0,
            parked: 0,
            oldest_ms: None,
        });
        entry.pending += s.pending;
        entry.parked += s.parked;
        entry.oldest_ms = match (entry.oldest_ms, s.oldest_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    by.into_values().collect()
}

/// The problems of a handler's outbox grants, one line each, for config
/// validation: a pattern [`subject::check_pattern`] refuses, an endpoint
/// name outside `[A-Za-z0-9_-]` (1 to [`MAX_ENDPOINT_NAME_BYTES`] bytes), a
/// URL that is not `http://` or `https://` with a host, or that carries a
/// user name or password (they would reach logs; send credentials as
/// headers).
pub fn check(publish: &[String], endpoints: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    for p in publish {
        if let Err(why) = subject::check_pattern(p) {
            problems.push(format!("publish {p:?}: {why}"));
        }
    }
    for (name, u) in endpoints {
        let good_name = !name.is_empty()
            && name.len() <= MAX_ENDPOINT_NAME_BYTES
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !good_name {
            problems.push(format!(
                "endpoints {name:?}: a name is 1 to {MAX_ENDPOINT_NAME_BYTES} of A-Z a-z 0-9 _ -"
            ));
        }
        if let Err(why) = parse_endpoint(u) {
            problems.push(format!("endpoints.{name}: {why}"));
        }
    }
    problems
}

fn parse_endpoint(u: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(u).map_err(|e| format!("{u:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("{u:?}: use http://HOST/… or https://HOST/…"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "the URL carries a user name or password, which would reach logs; remove it".into(),
        );
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn endpoints(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn gauges_count_per_grant_not_per_subject() {
        let g = OutboxGrants::new(
            &["audit.>".into(), "orders.accepted".into()],
            &endpoints(&[("notify", "http://127.0.0.1:1/n")]),
            16,
            1024,
        );
        let grants: std::collections::HashMap<String, std::sync::Arc<OutboxGrants>> =
            [("h".to_owned(), std::sync::Arc::new(g))].into();
        let row = |consumer: &str, target: Target, pending, parked, oldest| OutboxSummary {
            consumer: consumer.into(),
            target,
            pending,
            parked,
            oldest_ms: oldest,
        };
        let p = |s: &str| Target::Publish(s.into());
        let c = |s: &str| Target::Call(s.into());
        let summary = [
            row("h", p("audit.a"), 2, 0, Some(50)),
            row("h", p("audit.b.c"), 3, 0, Some(40)),
            row("h", p("orders.accepted"), 1, 0, Some(90)),
            row("h", p("gone.x"), 1, 0, Some(10)),
            row("h", c("notify"), 0, 1, None),
            row("h", c("old"), 1, 0, Some(70)),
            row("other", p("x.y"), 4, 0, Some(5)),
        ];
        assert_eq!(
            summary_by_grant(&summary, &grants),
            vec![
                row("h", c("(ungranted)"), 1, 0, Some(70)),
                row("h", c("notify"), 0, 1, None),
                row("h", p("(ungranted)"), 1, 0, Some(10)),
                row("h", p("audit.>"), 5, 0, Some(40)),
                row("h", p("orders.accepted"), 1, 0, Some(90)),
                row("other", p("(not run here)"), 4, 0, Some(5)),
            ]
        );
    }

    #[test]
    fn grants_admit_granted_subjects_and_named_endpoints_only() {
        let g = OutboxGrants::new(
            &["orders.accepted".into(), "audit.>".into()],
            &endpoints(&[("notify", "http://127.0.0.1:8088/notify")]),
            16,
            1 << 20,
        );
        assert!(g.allows_subject("orders.accepted"));
        assert!(g.allows_subject("audit.orders.1"));
        assert!(!g.allows_subject("orders.rejected"));
        assert!(!g.allows_subject("audit"));
        assert_eq!(
            g.endpoint("notify").map(url::Url::as_str),
            Some("http://127.0.0.1:8088/notify")
        );
        assert!(g.endpoint("http://127.0.0.1:8088/notify").is_none());
        assert!(OutboxGrants::default().is_empty());
    }

    #[test]
    fn config_problems_name_the_entry() {
        assert!(check(&["a.>".into()], &endpoints(&[("n", "https://x.example/p")])).is_empty());
        let problems = check(
            &["$JS.API.>".into(), "a.>.b".into()],
            &endpoints(&[
                ("bad name", "http://127.0.0.1/"),
                ("ftp", "ftp://127.0.0.1/"),
                ("creds", "http://user:pw@127.0.0.1/"),
                ("rel", "/notify"),
            ]),
        );
        assert_eq!(problems.len(), 6, "{problems:#?}");
        assert!(
            problems[0].starts_with("publish \"$JS.API.>\": "),
            "{}",
            problems[0]
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("endpoints \"bad name\": "))
        );
        assert!(problems.iter().any(|p| p.starts_with("endpoints.creds: ")));
    }
}
