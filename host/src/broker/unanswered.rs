//! Telling "JetStream did not answer" from "JetStream said no" in the
//! errors of its API requests (stream and consumer info, create, update).
//! On a cluster, a request times out, finds no responder, or is answered
//! "JetStream system temporarily unavailable" (10008) while the stream's or
//! the meta leader is being elected: the stream and its consumer still
//! exist, and the request works again once a leader is there. Only an
//! answer that says no (a JetStream error other than those) means the
//! durable consumer cannot be had.

use async_nats::jetstream::{self, context, stream};

/// JetStream error codes that mean "not now", not "no" (nats-server
/// `server/errors.json`): 10008 cluster not available (no quorum, a
/// leader being elected), 10009 not the leader, 10004 cluster incomplete.
const NOT_NOW: [jetstream::ErrorCode; 3] = [
    jetstream::ErrorCode::CLUSTER_NOT_AVAILABLE,
    jetstream::ErrorCode::CLUSTER_NOT_LEADER,
    jetstream::ErrorCode::CLUSTER_INCOMPLETE,
];

fn not_now(e: &jetstream::Error) -> bool {
    NOT_NOW.contains(&e.error_code()) || e.code() == 503
}

/// Whether any error in `e`'s chain is an API request JetStream did not
/// answer (timed out, no responders, offline, unreadable answer) or
/// answered "not now" (`NOT_NOW`).
pub fn unanswered(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        if let Some(e) = c.downcast_ref::<context::GetStreamError>() {
            return match e.kind() {
                context::GetStreamErrorKind::Request => true,
                context::GetStreamErrorKind::JetStream(j) => not_now(&j),
                _ => false,
            };
        }
        if let Some(e) = c.downcast_ref::<context::CreateStreamError>() {
            return match e.kind() {
                context::CreateStreamErrorKind::TimedOut
                | context::CreateStreamErrorKind::Response
                | context::CreateStreamErrorKind::ResponseParse
                | context::CreateStreamErrorKind::JetStreamUnavailable => true,
                context::CreateStreamErrorKind::JetStream(j) => not_now(&j),
                _ => false,
            };
        }
        if let Some(e) = c.downcast_ref::<context::ConsumerInfoError>() {
            return match e.kind() {
                context::ConsumerInfoErrorKind::Request
                | context::ConsumerInfoErrorKind::TimedOut
                | context::ConsumerInfoErrorKind::NoResponders
                | context::ConsumerInfoErrorKind::Offline => true,
                context::ConsumerInfoErrorKind::JetStream(j) => not_now(&j),
                _ => false,
            };
        }
        if let Some(e) = c.downcast_ref::<stream::ConsumerError>() {
            return match e.kind() {
                stream::ConsumerErrorKind::TimedOut | stream::ConsumerErrorKind::Request => true,
                stream::ConsumerErrorKind::JetStream(j) => not_now(&j),
                _ => false,
            };
        }
        if let Some(e) = c.downcast_ref::<stream::ConsumerUpdateError>() {
            return match e.kind() {
                stream::ConsumerUpdateErrorKind::TimedOut
                | stream::ConsumerUpdateErrorKind::Request => true,
                stream::ConsumerUpdateErrorKind::JetStream(j) => not_now(&j),
                _ => false,
            };
        }
        false
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn js_error(code: u64, err_code: u64) -> jetstream::Error {
        serde_json::from_value(serde_json::json!({
            "code": code, "err_code": err_code, "description": "x"
        }))
        .unwrap()
    }

    #[test]
    fn a_timeout_or_an_election_is_no_answer_and_a_refusal_is_one() {
        let timed_out = anyhow::Error::new(context::ConsumerInfoError::new(
            context::ConsumerInfoErrorKind::TimedOut,
        ))
        .context("handler `h`: cannot read durable consumer");
        assert!(unanswered(&timed_out));
        let request = anyhow::Error::new(context::GetStreamError::new(
            context::GetStreamErrorKind::Request,
        ));
        assert!(unanswered(&request));
        let electing = anyhow::Error::new(stream::ConsumerError::new(
            stream::ConsumerErrorKind::JetStream(js_error(503, 10008)),
        ));
        assert!(unanswered(&electing));
        // The broker said no: stream subjects overlap (10065).
        let refused = anyhow::Error::new(context::CreateStreamError::new(
            context::CreateStreamErrorKind::JetStream(js_error(400, 10065)),
        ));
        assert!(!unanswered(&refused));
        assert!(!unanswered(&anyhow::anyhow!("subjects are not captured")));
    }
}
