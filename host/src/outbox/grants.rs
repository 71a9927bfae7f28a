//! What a handler's config lets its outbox reach: `publish` subjects
//! (NATS wildcards, [`super::subject`]) and named `endpoints` (the guest
//! names one, never a URL), and the per-message caps on calls and bytes.

use super::subject;
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

    /// Whether the literal `subject` is granted.
    pub fn allows_subject(&self, subject: &str) -> bool {
        self.publish.iter().any(|p| subject::matches(p, subject))
    }

    /// The URL of the endpoint named `name`, when granted.
    pub fn endpoint(&self, name: &str) -> Option<&url::Url> {
        self.endpoints.get(name)
    }

    /// Whether anything is granted at all.
    pub fn is_empty(&self) -> bool {
        self.publish.is_empty() && self.endpoints.is_empty()
    }
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
