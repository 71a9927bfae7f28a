//! Reads a message's identity by the handler's [`IdentityRule`]. The identity
//! is the `message_id` half of the receipt key, so it must be stable across
//! redelivery; when it is missing the message is dead-lettered, never given
//! an invented one.
//!
//! The rule (docs/semantics.md, "The protocol"): the identity is text compared byte for
//! byte. A header's value loses the spaces and tabs around it (optional
//! whitespace is not part of an HTTP-style field value, RFC 9110 §5.5); a
//! JSON string is taken exactly; a JSON integer becomes its decimal digits,
//! so `42` and `"42"` are one message (receipts written with either stay
//! valid for the other).

// Guest- and message-supplied bytes are read with `get`, iterators and
// checked splits, never indexed or sliced: an offset out of range would
// panic the host (ARCHITECTURE.md, "The protocol", invariant 8).
#![deny(clippy::indexing_slicing, clippy::string_slice)]

use crate::config::IdentityRule;

/// Longest identity accepted, in bytes. Longer values are treated as missing
/// identity (they would bloat the receipts' primary key index).
pub const MAX_IDENTITY_BYTES: usize = 512;

/// A message's ordering key by `rule` (`order_key`): a header's or JSON
/// field's value read as an identity is, or token N of `subject` (the
/// subject it was published to, without a partition's number). `None`
/// when the message has none.
pub fn order_key(
    rule: &crate::config::OrderKey,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
) -> Option<String> {
    match rule {
        crate::config::OrderKey::Field(rule) => extract(rule, headers, payload).ok(),
        crate::config::OrderKey::SubjectToken(n) => {
            crate::broker::partition::token(subject, *n).map(str::to_string)
        }
    }
}

/// Extracts the identity from headers or payload. `Err` is the one-line
/// dead-letter reason.
pub fn extract(
    rule: &IdentityRule,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
) -> Result<String, String> {
    let id = match rule {
        IdentityRule::Header(name) => headers
            .and_then(|h| h.get(name.as_str()))
            .map(|v| v.as_str().trim().to_string())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("missing identity: no `{name}` header"))?,
        IdentityRule::JsonPointer(ptr) => {
            let doc: serde_json::Value = serde_json::from_slice(payload).map_err(|e| {
                format!("missing identity: payload is not JSON ({e}), so `{ptr}` cannot be read")
            })?;
            match doc.pointer(ptr) {
                Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
                Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                Some(other) => {
                    return Err(format!(
                        "missing identity: `{ptr}` is {}, not a non-empty string or integer",
                        json_kind(other)
                    ));
                }
                None => return Err(format!("missing identity: payload has no `{ptr}`")),
            }
        }
    };
    if id.chars().any(char::is_control) {
        // PostgreSQL text cannot hold NUL, and a control character in a key
        // is never meant: refuse it rather than fail on every delivery.
        return Err(format!(
            "missing identity: identity `{}` contains a control character",
            id.escape_default()
        ));
    }
    if id.len() > MAX_IDENTITY_BYTES {
        return Err(format!(
            "missing identity: identity is {} bytes, more than {MAX_IDENTITY_BYTES}",
            id.len()
        ));
    }
    Ok(id)
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a non-integer number",
        serde_json::Value::String(_) => "an empty string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn json_pointer_and_header() {
        let rule = IdentityRule::JsonPointer("/event_id".into());
        assert_eq!(
            extract(&rule, None, br#"{"event_id":"evt_1"}"#).unwrap(),
            "evt_1"
        );
        assert_eq!(extract(&rule, None, br#"{"event_id":42}"#).unwrap(), "42");
        assert!(
            extract(&rule, None, br#"{"event_id":""}"#)
                .unwrap_err()
                .contains("empty string")
        );
        assert!(
            extract(&rule, None, br#"{"x":1}"#)
                .unwrap_err()
                .contains("has no `/event_id`")
        );
        assert!(
            extract(&rule, None, b"nope")
                .unwrap_err()
                .contains("not JSON")
        );

        let rule = IdentityRule::Header("Nats-Msg-Id".into());
        let mut h = async_nats::HeaderMap::new();
        assert!(
            extract(&rule, Some(&h), b"")
                .unwrap_err()
                .contains("no `Nats-Msg-Id` header")
        );
        h.insert("Nats-Msg-Id", "m-7");
        assert_eq!(extract(&rule, Some(&h), b"").unwrap(), "m-7");
    }

    /// Both sides of the one rule, exactly.
    #[test]
    fn identity_is_text_compared_byte_for_byte() {
        let rule = IdentityRule::JsonPointer("/event_id".into());
        let id = |payload: &str| extract(&rule, None, payload.as_bytes());
        // An integer is its decimal digits: the same message as the string.
        assert_eq!(id(r#"{"event_id":42}"#), Ok("42".to_string()));
        assert_eq!(id(r#"{"event_id":"42"}"#), Ok("42".to_string()));
        assert_eq!(id(r#"{"event_id":-7}"#), Ok("-7".to_string()));
        assert_eq!(
            id(r#"{"event_id":18446744073709551615}"#),
            Ok("18446744073709551615".to_string())
        );
        // A JSON string is taken exactly: spaces and case are part of it.
        assert_eq!(id(r#"{"event_id":" e1 "}"#), Ok(" e1 ".to_string()));
        assert_eq!(id(r#"{"event_id":"E1"}"#), Ok("E1".to_string()));
        // Other numbers are no identity.
        for (payload, kind) in [
            (r#"{"event_id":42.0}"#, "a non-integer number"),
            (r#"{"event_id":1e2}"#, "a non-integer number"),
            (r#"{"event_id":null}"#, "null"),
            (r#"{"event_id":true}"#, "a boolean"),
        ] {
            assert_eq!(
                id(payload),
                Err(format!(
                    "missing identity: `/event_id` is {kind}, not a non-empty string or integer"
                )),
                "{payload}"
            );
        }
        // A header value loses the spaces and tabs around it, not inside it.
        let rule = IdentityRule::Header("Nats-Msg-Id".into());
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", " \tm 7\t ");
        assert_eq!(extract(&rule, Some(&h), b""), Ok("m 7".to_string()));
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", "   ");
        assert_eq!(
            extract(&rule, Some(&h), b""),
            Err("missing identity: no `Nats-Msg-Id` header".to_string())
        );
    }

    #[test]
    fn control_characters_are_refused() {
        let rule = IdentityRule::JsonPointer("/event_id".into());
        assert_eq!(
            extract(&rule, None, br#"{"event_id":"evt\u0000nul"}"#).unwrap_err(),
            r"missing identity: identity `evt\u{0}nul` contains a control character"
        );
        assert_eq!(
            extract(&rule, None, "{\"event_id\":\"évt ü\"}".as_bytes()).unwrap(),
            "évt ü"
        );
    }
}
