//! One message's outbox calls as the guest makes them: each checked
//! against the handler's grants and caps before it is kept, numbered in
//! call order (the index the relay's message id is derived from).

use super::grants::OutboxGrants;
use super::subject;
use std::sync::Arc;

/// The most headers one publish or call may carry.
pub const MAX_HEADERS: usize = 32;
/// The longest header name, in bytes.
pub const MAX_HEADER_NAME_BYTES: usize = 64;
/// The longest header value, in bytes.
pub const MAX_HEADER_VALUE_BYTES: usize = 4096;
/// The longest ordering key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// Header names a guest may not set on a publish: the broker reads
/// `Nats-*` headers (message id, expected stream or sequence, batch,
/// TTL, rollup), and the relay sets the ones it needs itself.
const RESERVED_PUBLISH_PREFIX: &str = "nats-";
/// Header names a publish may not carry because NATS clients read them as
/// the message's status (nats.go exposes a status line as `Status` and
/// `Description` headers; a status of 100 is a heartbeat or flow control).
const STATUS_HEADERS: [&str; 2] = ["status", "description"];
/// Header names a guest may not set on a call: the relay sets the
/// idempotency key.
const HOST_CALL_HEADERS: [&str; 1] = ["idempotency-key"];
/// Header names of HTTP framing and hop-by-hop headers (RFC 9110 sections
/// 7.2, 7.6.1, 8.6, 10.1.1), which only the HTTP client sets.
const FRAMING_HEADERS: [&str; 10] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "expect",
];

/// Where an outbox entry goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A JetStream publish to this literal subject.
    Publish(String),
    /// An HTTP POST to the endpoint of this name.
    Call(String),
}

/// One admitted publish or call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// Its place among the message's calls, from 0.
    pub index: u32,
    /// Where it goes.
    pub target: Target,
    /// The message payload or request body.
    pub payload: Vec<u8>,
    /// Headers, in the guest's order.
    pub headers: Vec<(String, String)>,
    /// The ordering key: entries with the same key leave in commit order.
    pub key: Option<String>,
}

impl OutboxEntry {
    /// The bytes the entry counts against the per-message cap: target,
    /// payload, header names and values, and key.
    pub fn size(&self) -> usize {
        let target = match &self.target {
            Target::Publish(s) | Target::Call(s) => s.len(),
        };
        target
            + self.payload.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
            + self.key.as_ref().map_or(0, String::len)
    }
}

/// Why a call was not admitted (the WIT `outbox-error`), one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The subject or endpoint is not granted.
    NotGranted(String),
    /// Past the cap on calls or bytes.
    OverLimit(String),
    /// A subject, header or key that cannot be carried.
    Invalid(String),
}

/// One message's admitted outbox entries.
#[derive(Debug)]
pub struct OutboxCalls {
    grants: Arc<OutboxGrants>,
    entries: Vec<OutboxEntry>,
    bytes: usize,
    /// Calls made, admitted or not: each takes an index, so a guest that
    /// retries after a refusal does not shift the indexes of the rest.
    made: u32,
}

impl OutboxCalls {
    /// No calls yet, under `grants`.
    pub fn new(grants: Arc<OutboxGrants>) -> Self {
        Self {
            grants,
            entries: Vec::new(),
            bytes: 0,
            made: 0,
        }
    }

    /// Admits a publish of `payload` to `subject`.
    ///
    /// # Errors
    /// [`Refusal`]: the subject is not a literal subject, is not granted, a
    /// header or the key is not admitted, or the message is past its caps.
    pub fn publish(
        &mut self,
        subject: String,
        payload: Vec<u8>,
        headers: Vec<(String, String)>,
        key: Option<String>,
    ) -> Result<(), Refusal> {
        self.count()?;
        subject::check_literal(&subject).map_err(Refusal::Invalid)?;
        if !self.grants.allows_subject(&subject) {
            return Err(Refusal::NotGranted(format!(
                "subject `{subject}` is not granted to this handler (`publish` in its config)"
            )));
        }
        check_headers(&headers, |name| {
            if name
                .get(..RESERVED_PUBLISH_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_PUBLISH_PREFIX))
            {
                Some("is set by the host, not by a handler")
            } else if STATUS_HEADERS.iter().any(|r| r.eq_ignore_ascii_case(name)) {
                Some("is read by NATS clients as the message's status; use another name")
            } else {
                None
            }
        })?;
        self.keep(Target::Publish(subject), payload, headers, key)
    }

    /// Admits a call of the endpoint named `endpoint` with `body`.
    ///
    /// # Errors
    /// [`Refusal`]: the endpoint is not granted, a header or the key is
    /// not admitted, or the message is past its caps.
    pub fn call(
        &mut self,
        endpoint: String,
        body: Vec<u8>,
        headers: Vec<(String, String)>,
        key: Option<String>,
    ) -> Result<(), Refusal> {
        self.count()?;
        if self.grants.endpoint(&endpoint).is_none() {
            let shown: String = endpoint.chars().take(64).collect();
            return Err(Refusal::NotGranted(format!(
                "endpoint {shown:?} is not granted to this handler (`endpoints` in its config)"
            )));
        }
        check_headers(&headers, |name| {
            if HOST_CALL_HEADERS
                .iter()
                .any(|r| r.eq_ignore_ascii_case(name))
            {
                Some("is set by the host, not by a handler")
            } else if FRAMING_HEADERS.iter().any(|r| r.eq_ignore_ascii_case(name)) {
                Some("belongs to HTTP framing, which the host's HTTP client does")
            } else {
                None
            }
        })?;
        self.keep(Target::Call(endpoint), body, headers, key)
    }

    /// The admitted entries, in call order; none are left.
    pub fn take(&mut self) -> Vec<OutboxEntry> {
        self.bytes = 0;
        std::mem::take(&mut self.entries)
    }

    /// The admitted entries so far.
    pub fn entries(&self) -> &[OutboxEntry] {
        &self.entries
    }

    fn count(&mut self) -> Result<(), Refusal> {
        if self.made >= self.grants.max_calls {
            return Err(Refusal::OverLimit(format!(
                "at most {} outbox calls per message (max_outbox_calls)",
                self.grants.max_calls
            )));
        }
        self.made += 1;
        Ok(())
    }

    fn keep(
        &mut self,
        target: Target,
        payload: Vec<u8>,
        headers: Vec<(String, String)>,
        key: Option<String>,
    ) -> Result<(), Refusal> {
        if let Some(k) = &key
            && (k.is_empty() || k.len() > MAX_KEY_BYTES || k.chars().any(char::is_control))
        {
            return Err(Refusal::Invalid(format!(
                "a key is 1 to {MAX_KEY_BYTES} bytes without control characters"
            )));
        }
        let entry = OutboxEntry {
            index: self.made - 1,
            target,
            payload,
            headers,
            key,
        };
        let size = entry.size();
        if self.bytes.saturating_add(size) > self.grants.max_bytes {
            return Err(Refusal::OverLimit(format!(
                "this call's {size} bytes pass the cap of {} bytes of outbox calls per message (max_outbox_kib)",
                self.grants.max_bytes
            )));
        }
        self.bytes += size;
        self.entries.push(entry);
        Ok(())
    }
}

/// Checks header count, names (HTTP tokens, RFC 9110 section 5.6.2) and
/// values (visible ASCII, space and tab: no line breaks that could start
/// another header), and refuses names `reserved` gives a reason for.
fn check_headers(
    headers: &[(String, String)],
    reserved: impl Fn(&str) -> Option<&'static str>,
) -> Result<(), Refusal> {
    if headers.len() > MAX_HEADERS {
        return Err(Refusal::Invalid(format!(
            "{} headers; at most {MAX_HEADERS}",
            headers.len()
        )));
    }
    for (name, value) in headers {
        let token = !name.is_empty()
            && name.len() <= MAX_HEADER_NAME_BYTES
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(Refusal::Invalid(format!(
                "a header name is 1 to {MAX_HEADER_NAME_BYTES} token characters (RFC 9110)"
            )));
        }
        if let Some(why) = reserved(name) {
            return Err(Refusal::Invalid(format!("header `{name}` {why}")));
        }
        if value.len() > MAX_HEADER_VALUE_BYTES
            || value
                .bytes()
                .any(|b| !(b.is_ascii_graphic() || b == b' ' || b == b'\t'))
        {
            return Err(Refusal::Invalid(format!(
                "header `{name}`: a value is at most {MAX_HEADER_VALUE_BYTES} bytes of visible ASCII, space and tab"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use std::collections::BTreeMap;

    fn calls(max_calls: u32, max_bytes: usize) -> OutboxCalls {
        let endpoints: BTreeMap<String, String> =
            [("notify".to_owned(), "http://127.0.0.1:8088/n".to_owned())].into();
        OutboxCalls::new(Arc::new(OutboxGrants::new(
            &["orders.accepted".into(), "audit.>".into()],
            &endpoints,
            max_calls,
            max_bytes,
        )))
    }

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn granted_calls_are_kept_in_order_with_their_index() {
        let mut c = calls(16, 1 << 20);
        c.publish(
            "orders.accepted".into(),
            b"a".to_vec(),
            h(&[("X-Trace", "1")]),
            Some("o-1".into()),
        )
        .unwrap();
        assert!(matches!(
            c.publish("orders.rejected".into(), vec![], vec![], None),
            Err(Refusal::NotGranted(_))
        ));
        c.call(
            "notify".into(),
            b"{}".to_vec(),
            h(&[("Content-Type", "application/json")]),
            None,
        )
        .unwrap();
        let taken = c.take();
        assert_eq!(taken.len(), 2);
        assert_eq!(
            (taken[0].index, taken[1].index),
            (0, 2),
            "a refused call takes its index"
        );
        assert_eq!(taken[0].target, Target::Publish("orders.accepted".into()));
        assert_eq!(taken[1].target, Target::Call("notify".into()));
        assert_eq!(taken[0].size(), 15 + 1 + 8 + 3);
        assert!(c.entries().is_empty());
    }

    #[test]
    fn what_the_host_sets_or_cannot_carry_is_refused() {
        let mut c = calls(64, 1 << 20);
        for (headers, why) in [
            (h(&[("Nats-Msg-Id", "x")]), "set by the host"),
            (h(&[("nats-expected-stream", "x")]), "set by the host"),
            (h(&[("Status", "100")]), "as the message's status"),
            (h(&[("description", "x")]), "as the message's status"),
            (h(&[("Bad Name", "x")]), "token"),
            (h(&[("X", "a\r\nNats-Msg-Id: y")]), "visible ASCII"),
        ] {
            match c.publish("orders.accepted".into(), vec![], headers, None) {
                Err(Refusal::Invalid(m)) => assert!(m.contains(why), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        match c.call(
            "notify".into(),
            vec![],
            h(&[("Idempotency-Key", "mine")]),
            None,
        ) {
            Err(Refusal::Invalid(m)) => assert!(m.contains("set by the host"), "{m}"),
            other => panic!("{other:?}"),
        }
        for name in ["Transfer-Encoding", "TE", "keep-alive", "Expect"] {
            match c.call("notify".into(), vec![], h(&[(name, "x")]), None) {
                Err(Refusal::Invalid(m)) => assert!(m.contains("HTTP framing"), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        // A status header is a call's own business.
        let mut other = calls(64, 1 << 20);
        assert!(
            other
                .call("notify".into(), vec![], h(&[("Status", "ok")]), None)
                .is_ok()
        );
        assert!(matches!(
            c.call("http://127.0.0.1:8088/n".into(), vec![], vec![], None),
            Err(Refusal::NotGranted(_))
        ));
        assert!(matches!(
            c.publish("orders.*".into(), vec![], vec![], None),
            Err(Refusal::Invalid(_))
        ));
        assert!(matches!(
            c.publish(
                "orders.accepted".into(),
                vec![],
                vec![],
                Some("a\u{7}".into())
            ),
            Err(Refusal::Invalid(_))
        ));
        assert!(c.entries().is_empty());
    }

    #[test]
    fn caps_bound_calls_and_bytes() {
        let mut c = calls(2, 100);
        c.publish("audit.a".into(), vec![0; 50], vec![], None)
            .unwrap();
        match c.publish("audit.b".into(), vec![0; 50], vec![], None) {
            Err(Refusal::OverLimit(m)) => assert!(m.contains("max_outbox_kib"), "{m}"),
            other => panic!("{other:?}"),
        }
        match c.publish("audit.c".into(), vec![], vec![], None) {
            Err(Refusal::OverLimit(m)) => assert!(m.contains("max_outbox_calls"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.entries().len(), 1);
    }
}
