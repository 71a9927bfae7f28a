//! Partitions (`partitions = N`; ARCHITECTURE.md, "Partitions"): what idem
//! sets on the stream and on each partition's durable consumer, as pure
//! functions of the handler's config.
//!
//! JetStream's deterministic subject transform
//! (<https://docs.nats.io/nats-concepts/subject_mapping#deterministic-subject-token-partitioning>)
//! stores a message published to `accounts.42` under
//! `<p>.accounts.42`, where `p = {{partition(N, k)}}` hashes the k-th
//! wildcard token; the same key always lands in the same partition. Each
//! partition has a durable consumer filtering on `<p>.<subject>` with a
//! pinned-client priority group (ADR-42, nats-server 2.11+): the server
//! serves one host's pulls at a time and moves the pin to another host's
//! waiting pull once the pinned one has not pulled for `priority_timeout`.

use crate::config::{HandlerConfig, OrderKey};
use async_nats::jetstream::stream::SubjectTransform;

/// The one priority group of every partition's consumer (pull requests
/// name it).
pub const GROUP: &str = "idem";

/// The transform idem sets on a partitioned handler's stream: `subject`
/// (the handler's one subject) to `{{partition(N,w)}}.` followed by the
/// subject with each `*` written as `{{wildcard(i)}}`, where `w` is the
/// wildcard that `order_key = "subject:N"` names. `None` for a handler
/// without partitions.
///
/// # Errors
/// One line for the operator when the config cannot be partitioned: not
/// exactly one subject, a `>` in it, or an `order_key` that is not a `*`
/// token of it. (Also checked when the config is loaded.)
pub fn transform(h: &HandlerConfig) -> Result<Option<SubjectTransform>, String> {
    let Some(n) = h.partitions else {
        return Ok(None);
    };
    let [subject] = h.subjects.as_slice() else {
        return Err(format!(
            "handler `{}`: partitions needs exactly one subject (the stream's transform maps one pattern), not {}",
            h.name,
            h.subjects.len()
        ));
    };
    let Some(OrderKey::SubjectToken(token)) = h.order_key else {
        return Err(format!(
            "handler `{}`: partitions needs order_key = \"subject:N\" (JetStream hashes a subject token into the partition; it cannot read a payload or header)",
            h.name
        ));
    };
    let tokens: Vec<&str> = subject.split('.').collect();
    if tokens.contains(&">") {
        return Err(format!(
            "handler `{}`: partitions needs a subject without `>` (`{subject}`); name each token, e.g. accounts.*",
            h.name
        ));
    }
    if tokens.get(token - 1) != Some(&"*") {
        return Err(format!(
            "handler `{}`: order_key = \"subject:{token}\" must name a `*` token of `{subject}`",
            h.name
        ));
    }
    let wildcard = tokens[..token].iter().filter(|t| **t == "*").count();
    let mut dest = format!("{{{{partition({n},{wildcard})}}}}");
    let mut i = 0;
    for t in &tokens {
        dest.push('.');
        if *t == "*" {
            i += 1;
            dest.push_str(&format!("{{{{wildcard({i})}}}}"));
        } else {
            dest.push_str(t);
        }
    }
    Ok(Some(SubjectTransform {
        source: subject.clone(),
        destination: dest,
    }))
}

/// Gives back the pin this host holds on `consumer` (of `stream`), so that
/// JetStream pins another host's waiting request at once instead of after
/// `priority_timeout` (`$JS.API.CONSUMER.UNPIN.<stream>.<consumer>` with
/// the group, ADR-42). Only for a pin this host holds: the call unpins
/// whoever is pinned. Called at a stop, once the pull streams are closed
/// and the messages not run are given back.
///
/// # Errors
/// The request was not answered within 2 s, or JetStream refused it (the
/// consumer is gone); the pin then lapses after `priority_timeout`.
pub async fn unpin(
    js: &async_nats::jetstream::Context,
    stream: &str,
    consumer: &str,
) -> anyhow::Result<()> {
    let answer: serde_json::Value = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        js.request(
            format!("CONSUMER.UNPIN.{stream}.{consumer}"),
            &serde_json::json!({ "group": GROUP }),
        ),
    )
    .await
    .map_err(|_| anyhow::anyhow!("JetStream did not answer within 2s"))??;
    match answer.get("error") {
        Some(e) => anyhow::bail!(
            "JetStream refused: {}",
            crate::log_format::escape(&e.to_string())
        ),
        None => Ok(()),
    }
}

/// The filter of partition `partition`'s consumer: `<partition>.<subject>`.
pub fn filter(partition: u32, subject: &str) -> String {
    format!("{partition}.{subject}")
}

/// The subject a message was published to, from the one it is stored
/// under in a partitioned stream (`3.accounts.42` → `accounts.42`): the
/// first token dropped when it is a partition number. What the guest sees,
/// and what `subject:N` counts tokens of.
pub fn published_subject(stored: &str) -> &str {
    match stored.split_once('.') {
        Some((p, rest)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => rest,
        _ => stored,
    }
}

/// The `n`-th token (from 1) of `subject`; `None` past its end.
pub fn token(subject: &str, n: usize) -> Option<&str> {
    subject.split('.').nth(n.checked_sub(1)?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn handler(subjects: &[&str], key: &str, partitions: Option<u32>) -> HandlerConfig {
        let mut text = format!(
            "name = \"h\"\nmodule = \"m.wasm\"\nstream = \"S\"\nsubjects = {subjects:?}\norder_key = \"{key}\"\n"
        );
        if let Some(n) = partitions {
            text.push_str(&format!("partitions = {n}\n"));
        }
        toml::from_str(&text).unwrap()
    }

    #[test]
    fn the_key_token_is_hashed_and_every_wildcard_kept() {
        let t = transform(&handler(&["accounts.*"], "subject:2", Some(8)))
            .unwrap()
            .unwrap();
        assert_eq!(t.source, "accounts.*");
        assert_eq!(t.destination, "{{partition(8,1)}}.accounts.{{wildcard(1)}}");
        let t = transform(&handler(&["t.*.x.*"], "subject:4", Some(3)))
            .unwrap()
            .unwrap();
        assert_eq!(
            t.destination,
            "{{partition(3,2)}}.t.{{wildcard(1)}}.x.{{wildcard(2)}}"
        );
    }

    #[test]
    fn what_cannot_be_partitioned_says_why() {
        assert_eq!(
            transform(&handler(&["a.*"], "subject:1", Some(4))).unwrap_err(),
            "handler `h`: order_key = \"subject:1\" must name a `*` token of `a.*`"
        );
        assert_eq!(
            transform(&handler(&["a.*"], "subject:3", Some(4))).unwrap_err(),
            "handler `h`: order_key = \"subject:3\" must name a `*` token of `a.*`"
        );
        assert!(
            transform(&handler(&["a.*", "b.*"], "subject:2", Some(4)))
                .unwrap_err()
                .ends_with("not 2")
        );
        assert!(
            transform(&handler(&["a.>"], "subject:2", Some(4)))
                .unwrap_err()
                .contains("without `>`")
        );
        assert!(
            transform(&handler(&["a.*"], "json:/k", Some(4)))
                .unwrap_err()
                .contains("needs order_key = \"subject:N\"")
        );
        assert_eq!(
            transform(&handler(&["a.*"], "json:/k", None)).unwrap(),
            None
        );
    }

    #[test]
    fn the_partition_token_is_dropped_from_the_subject() {
        assert_eq!(published_subject("3.accounts.42"), "accounts.42");
        assert_eq!(published_subject("accounts.42"), "accounts.42");
        assert_eq!(published_subject("12x.a"), "12x.a");
        assert_eq!(published_subject(".a"), ".a");
        assert_eq!(published_subject("7"), "7");
        assert_eq!(filter(5, "accounts.*"), "5.accounts.*");
        assert_eq!(token("accounts.42", 2), Some("42"));
        assert_eq!(token("accounts.42", 3), None);
        assert_eq!(token("accounts.42", 0), None);
    }
}
