//! Telling "JetStream did not answer" from "JetStream said no" in the
//! errors of its API requests (stream and consumer info, create, update).
//! On a cluster, a request times out, finds no responder, or is answered
//! "JetStream system temporarily unavailable" (10008) while the stream's or
//! the meta leader is being elected: the stream and its consumer still
//! exist, and the request works again once a leader is there. Only an
//! answer that says no (a JetStream error other than those) means the
//! durable consumer cannot be had. [`Broker::through_elections`] asks such
//! a request again until it is answered or a grace has passed.

use super::Broker;
use async_nats::jetstream::{self, context, stream};
use std::time::{Duration, Instant};

/// JetStream error codes that mean "not now", not "no" (nats-server
/// `server/errors.json`): 10008 cluster not available (no quorum, a
/// leader being elected), 10009 not the leader, 10004 cluster incomplete,
/// 10005 no suitable peers (a restarted peer not yet current: a replicated
/// stream cannot be placed until it is).
const NOT_NOW: [jetstream::ErrorCode; 4] = [
    jetstream::ErrorCode::CLUSTER_NOT_AVAILABLE,
    jetstream::ErrorCode::CLUSTER_NOT_LEADER,
    jetstream::ErrorCode::CLUSTER_INCOMPLETE,
    jetstream::ErrorCode::CLUSTER_NO_PEERS,
];

/// Codes answered with status 503 that are "no" all the same: JetStream
/// is not enabled on the server (10076) or for the account (10039).
const NOT_ENABLED: [jetstream::ErrorCode; 2] = [
    jetstream::ErrorCode::JETSTREAM_NOT_ENABLED,
    jetstream::ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
];

fn not_now(e: &jetstream::Error) -> bool {
    NOT_NOW.contains(&e.error_code()) || (e.code() == 503 && !NOT_ENABLED.contains(&e.error_code()))
}

/// Whether `e`'s chain says the stream asked for does not exist (10059):
/// an answer, so a bucket (a stream underneath) may be created.
pub fn stream_not_found(e: &anyhow::Error) -> bool {
    let missing = |j: &jetstream::Error| j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND;
    e.chain().any(|c| {
        if let Some(j) = c.downcast_ref::<jetstream::Error>() {
            return missing(j);
        }
        c.downcast_ref::<context::GetStreamError>().is_some_and(
            |g| matches!(g.kind(), context::GetStreamErrorKind::JetStream(j) if missing(&j)),
        )
    })
}

/// Whether any error in `e`'s chain is an API request JetStream did not
/// answer (timed out, no responders, offline, unreadable answer) or
/// answered "not now" (`NOT_NOW`).
pub fn unanswered(e: &anyhow::Error) -> bool {
    e.chain().any(answer_missing)
}

/// [`unanswered`] for a client error that is not (yet) an
/// [`anyhow::Error`]: `e` or any of its sources.
pub fn unanswered_error(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(answer_missing)
}

/// Whether this one error (not its sources: the callers walk the chain)
/// is a request JetStream did not answer, or answered "not now".
fn answer_missing(c: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(e) = c.downcast_ref::<jetstream::Error>() {
        return not_now(e);
    }
    if let Some(e) = c.downcast_ref::<context::RequestError>() {
        return matches!(
            e.kind(),
            context::RequestErrorKind::TimedOut | context::RequestErrorKind::NoResponders
        );
    }
    if let Some(e) = c.downcast_ref::<async_nats::RequestError>() {
        return matches!(
            e.kind(),
            async_nats::RequestErrorKind::TimedOut | async_nats::RequestErrorKind::NoResponders
        );
    }
    if let Some(e) = c.downcast_ref::<async_nats::jetstream::kv::EntryError>() {
        return e.kind() == async_nats::jetstream::kv::EntryErrorKind::TimedOut;
    }
    if let Some(e) = c.downcast_ref::<stream::DirectGetError>() {
        return match e.kind() {
            stream::DirectGetErrorKind::TimedOut | stream::DirectGetErrorKind::Request => true,
            stream::DirectGetErrorKind::ErrorResponse(status, _) => {
                matches!(
                    status,
                    async_nats::StatusCode::NO_RESPONDERS | async_nats::StatusCode::TIMEOUT
                )
            }
            _ => false,
        };
    }
    if let Some(e) = c.downcast_ref::<context::AccountError>() {
        return match e.kind() {
            context::AccountErrorKind::TimedOut
            | context::AccountErrorKind::JetStreamUnavailable => true,
            context::AccountErrorKind::JetStream(j) => not_now(&j),
            context::AccountErrorKind::Other => false,
        };
    }
    if let Some(e) = c.downcast_ref::<context::CreateKeyValueError>() {
        // Its other kinds carry the account or stream request's error as
        // their source, which the chain walk reaches next.
        return e.kind() == context::CreateKeyValueErrorKind::TimedOut;
    }
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
}

/// How long a request that JetStream does not answer is asked again
/// ([`Broker::through_elections`]) before the caller gets its error: a
/// cluster elects a stream or meta leader within seconds, and a server
/// restarts within this.
pub const ELECTION_GRACE: Duration = Duration::from_secs(60);

impl Broker {
    /// `op`, asked again with doubling waits (0.2 s up to 2 s) while its
    /// error says JetStream did not answer (`is_unanswered`, usually
    /// [`unanswered`] or [`unanswered_error`]), for up to
    /// [`ELECTION_GRACE`]. The first such error is logged once, naming
    /// `what`.
    ///
    /// A request the server drops because this connection may not publish
    /// its subject also goes unanswered (it times out); so a permissions
    /// violation reported on this connection while `op` runs ends the
    /// waiting at once, with `op`'s error (the violation itself is logged
    /// by the connection, [`super::connect`]). The violation may be of any
    /// request on the connection: a host makes its start-up requests one
    /// at a time, on connections nothing else uses yet. A server that says
    /// it runs no JetStream (its `INFO`) ends the waiting too.
    ///
    /// # Errors
    /// `op`'s error: an answer that says no, at once; no answer past the
    /// grace; or no answer after a permissions violation.
    pub async fn through_elections<T, E, Fut>(
        &self,
        what: &str,
        is_unanswered: impl Fn(&E) -> bool,
        mut op: impl FnMut() -> Fut,
    ) -> Result<T, E>
    where
        E: std::fmt::Display,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        // A server without JetStream has nothing to elect: its "no
        // responders" is final.
        let enabled = self.js.client().server_info().jetstream;
        let since = Instant::now();
        let mut denials = self.denials.clone();
        denials.mark_unchanged();
        let mut waits =
            crate::backoff::doubling(Duration::from_millis(200), Duration::from_secs(2));
        let mut said = false;
        loop {
            let e = match op().await {
                Ok(done) => return Ok(done),
                Err(e) => e,
            };
            let denied = denials.has_changed().unwrap_or(false);
            if !is_unanswered(&e) || denied || !enabled || since.elapsed() >= ELECTION_GRACE {
                return Err(e);
            }
            if !said {
                said = true;
                tracing::warn!(error = %format!("{e:#}"), "JetStream does not answer about {what} (a leader election, or a server away); asking again for up to {}s, then giving up with the last error", ELECTION_GRACE.as_secs());
            }
            tokio::time::sleep(waits.next().unwrap_or(Duration::from_secs(2))).await;
        }
    }
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

    #[test]
    fn a_bucket_that_cannot_be_had_now_is_no_answer_through_its_sources() {
        let timed_out =
            context::CreateKeyValueError::new(context::CreateKeyValueErrorKind::TimedOut);
        assert!(unanswered_error(&timed_out));
        // The stream request under the bucket, answered "not now" (10008)
        // or "no" (10065, subjects overlap).
        let electing = context::CreateKeyValueError::with_source(
            context::CreateKeyValueErrorKind::BucketCreate,
            context::CreateStreamError::new(context::CreateStreamErrorKind::JetStream(js_error(
                503, 10008,
            ))),
        );
        assert!(unanswered_error(&electing));
        let refused = context::CreateKeyValueError::with_source(
            context::CreateKeyValueErrorKind::BucketCreate,
            context::CreateStreamError::new(context::CreateStreamErrorKind::JetStream(js_error(
                400, 10065,
            ))),
        );
        assert!(!unanswered_error(&refused));
        let no_account = context::CreateKeyValueError::with_source(
            context::CreateKeyValueErrorKind::JetStream,
            context::AccountError::new(context::AccountErrorKind::TimedOut),
        );
        assert!(unanswered_error(&no_account));
        let info = context::RequestError::new(context::RequestErrorKind::TimedOut);
        assert!(unanswered(
            &anyhow::Error::new(info).context("cannot read stream `S`")
        ));
        let bad_subject = context::RequestError::new(context::RequestErrorKind::InvalidSubject);
        assert!(!unanswered_error(&bad_subject));
    }

    #[test]
    fn jetstream_not_enabled_is_a_refusal_and_no_peers_is_not_now() {
        let answered = |code, err_code| {
            anyhow::Error::new(stream::ConsumerError::new(
                stream::ConsumerErrorKind::JetStream(js_error(code, err_code)),
            ))
        };
        // 10039 and 10076 come with status 503 and still say no.
        assert!(!unanswered(&answered(503, 10039)));
        assert!(!unanswered(&answered(503, 10076)));
        assert!(unanswered(&answered(503, 10023)));
        assert!(unanswered(&answered(400, 10005)));
        let missing = anyhow::Error::new(context::GetStreamError::new(
            context::GetStreamErrorKind::JetStream(js_error(404, 10059)),
        ));
        assert!(stream_not_found(&missing));
        assert!(!stream_not_found(&answered(503, 10008)));
        let entry = async_nats::jetstream::kv::EntryError::new(
            async_nats::jetstream::kv::EntryErrorKind::TimedOut,
        );
        assert!(unanswered_error(&entry));
    }
}
