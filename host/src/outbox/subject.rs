//! NATS subjects as the outbox admits them: a guest's subject is literal,
//! a grant may use the wildcards `*` (exactly one token) and `>` (one or
//! more tokens, last only), the rules of NATS subject-based messaging
//! (docs.nats.io, "Subject-Based Messaging": tokens separated by `.`, none
//! empty, no whitespace). Subjects whose first token starts with `$` (the
//! JetStream API `$JS.`, the system account `$SYS.`, KV and object store
//! buckets `$KV.` and `$O.`, where idem keeps its own deploy records) are
//! never granted and never published: a handler must not drive the broker.
//! Nor are `_INBOX.` subjects, where clients wait for replies to their
//! requests: a handler must not answer for the broker or another service.

/// The longest subject or grant pattern, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 256;

/// Why a subject or pattern is not admitted: one line for a person.
pub type Refusal = String;

/// Checks that `subject` is a literal NATS subject a handler may publish to.
///
/// # Errors
/// Empty, longer than [`MAX_SUBJECT_BYTES`], an empty token, a wildcard,
/// a byte outside printable ASCII (space and controls included), or a
/// first token starting with `$`.
pub fn check_literal(subject: &str) -> Result<(), Refusal> {
    check_tokens(subject, false)
}

/// Checks that `pattern` is a grant: a subject in which a token may be `*`
/// and the last may be `>`.
///
/// # Errors
/// As [`check_literal`], except that `*` and a last `>` are allowed.
pub fn check_pattern(pattern: &str) -> Result<(), Refusal> {
    check_tokens(pattern, true)
}

fn check_tokens(s: &str, wildcards: bool) -> Result<(), Refusal> {
    if s.is_empty() {
        return Err("the subject is empty".into());
    }
    if s.len() > MAX_SUBJECT_BYTES {
        return Err(format!(
            "the subject is {} bytes; at most {MAX_SUBJECT_BYTES}",
            s.len()
        ));
    }
    if let Some(b) = s.bytes().find(|b| !b.is_ascii_graphic()) {
        return Err(format!(
            "the subject holds byte 0x{b:02x}; only printable ASCII without spaces"
        ));
    }
    if s.starts_with('$') {
        return Err(
            "subjects starting with `$` (the broker's API and buckets) are never granted".into(),
        );
    }
    if s == "_INBOX" || s.starts_with("_INBOX.") {
        return Err("`_INBOX.` subjects (replies to requests) are never granted".into());
    }
    let tokens: Vec<&str> = s.split('.').collect();
    let last = tokens.len().saturating_sub(1);
    for (i, t) in tokens.iter().enumerate() {
        if t.is_empty() {
            return Err("the subject has an empty token (`..`, or a `.` at an end)".into());
        }
        let wild = *t == "*" || (*t == ">" && i == last);
        let holds_wildcard = t.contains('*') || t.contains('>');
        if !wildcards && holds_wildcard {
            return Err("a subject to publish to holds no wildcard (`*`, `>`)".into());
        }
        if wildcards && holds_wildcard && !wild {
            return Err(format!(
                "`{t}`: `*` must be a whole token and `>` the whole last token"
            ));
        }
    }
    Ok(())
}

/// Whether the literal `subject` matches the grant `pattern` (both already
/// checked): `*` takes one token, a last `>` one or more.
pub fn matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Whether some literal subject matches both patterns `a` and `b` (NATS
/// wildcards in either): whether a stream listening on one stores what a
/// grant of the other lets a handler publish.
pub fn overlap(a: &str, b: &str) -> bool {
    let mut a = a.split('.');
    let mut b = b.split('.');
    loop {
        match (a.next(), b.next()) {
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some("*"), Some(_)) | (Some(_), Some("*")) => {}
            (Some(x), Some(y)) if x == y => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_overlap_when_one_subject_matches_both() {
        assert!(overlap("orders.accepted", "orders.accepted"));
        assert!(overlap("orders.>", "orders.accepted"));
        assert!(overlap("orders.accepted", "orders.*"));
        assert!(overlap("*.accepted", "orders.*"));
        assert!(overlap(">", "a.b.c"));
        assert!(overlap("a.*.c", "a.b.>"));
        assert!(!overlap("orders.accepted", "orders.placed"));
        assert!(!overlap("orders.*", "orders.a.b"));
        assert!(!overlap("orders.>", "orders"));
        assert!(!overlap("a.*", "a"));
        assert!(!overlap("a.b", "a.b.c"));
    }

    #[test]
    fn wildcards_follow_nats_rules() {
        assert!(matches("orders.accepted", "orders.accepted"));
        assert!(!matches("orders.accepted", "orders.accepted.eu"));
        assert!(matches("audit.>", "audit.a"));
        assert!(matches("audit.>", "audit.a.b.c"));
        assert!(!matches("audit.>", "audit"), "`>` takes at least one token");
        assert!(matches("a.*.c", "a.b.c"));
        assert!(!matches("a.*.c", "a.b.b.c"));
        assert!(!matches("a.*", "a"));
        assert!(matches(">", "anything.at.all"));
        assert!(!matches("orders.*", "orders"));
    }

    #[test]
    fn literal_subjects_refuse_what_a_publish_cannot_carry() {
        assert_eq!(check_literal("orders.accepted"), Ok(()));
        for bad in [
            "",
            "orders..x",
            ".orders",
            "orders.",
            "orders.*",
            "orders.>",
            "a.b>",
            "with space",
            "tab\there",
            "$JS.API.STREAM.DELETE.orders",
            "$KV.idem-deployments.credit",
            "_INBOX.abc.1",
            "é.x",
        ] {
            assert!(check_literal(bad).is_err(), "{bad:?}");
        }
        assert!(check_literal(&"a".repeat(MAX_SUBJECT_BYTES)).is_ok());
        assert!(check_literal(&"a".repeat(MAX_SUBJECT_BYTES + 1)).is_err());
    }

    #[test]
    fn patterns_allow_whole_token_wildcards_only() {
        for good in ["orders.accepted", "audit.>", "a.*.c", ">", "*"] {
            assert_eq!(check_pattern(good), Ok(()), "{good}");
        }
        for bad in [
            "a.>.c", "a*", "a.b*", ">x", "$SYS.>", "_INBOX.>", "", "a..b",
        ] {
            assert!(check_pattern(bad).is_err(), "{bad:?}");
        }
    }
}
