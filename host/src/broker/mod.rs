//! The JetStream side: connect, make sure the stream and the durable pull
//! consumer exist, hand out messages, and ack / nak / term them.
//!
//! Facts this module is written around (async-nats 0.51, checked against a running nats-server):
//! - `ack()` returning `Ok` only means queued in the client; `double_ack()`
//!   waits for the server's reply (a *confirmed* ack) but is still only a hint
//!   to stop redelivering: the receipt, not the ack, keeps an effect single.
//! - A consumer-stream error (missed heartbeat, consumer deleted, broker
//!   restart) is an `Err` item, not the end of the stream: [`Deliveries`]
//!   logs it and keeps pulling, re-creating the pull stream when needed.
//! - async-nats's `Consumer::stream()` adds a pull request to its count of
//!   messages to come only after the request went out; a reply that
//!   overtakes that count leaves the stream waiting, with no request open,
//!   until a heartbeat is missed. `pull_stream.rs` speaks the pull protocol itself
//!   and counts a request before sending it.
//! - `Nak(Some(delay))` redelivers after the delay; past a consumer's
//!   `max_deliver` JetStream stops delivering without telling anyone, so
//!   consumers are created without one and the pipeline dead-letters on the
//!   handler's last allowed delivery itself.

use crate::config::HandlerConfig;
use anyhow::Context as _;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::{self, AckKind, consumer::pull, stream};
use std::time::Duration;
use tokio::sync::watch;

pub mod clock;
mod connect;
mod deliveries;
pub mod drift;
mod in_progress;
pub mod liveness;
pub mod partition;
mod pull_stream;
pub mod surplus;
pub mod unanswered;
pub use connect::connect;
pub use deliveries::{CONSUMER_LOST_GRACE, ConsumerLost, Deliveries, Out};
pub use in_progress::{InProgress, KeepAlive, in_progress};
pub use pull_stream::{PullError, PullSettings, PullStream, SharedPin};
pub use surplus::Raise;

/// Heartbeat asked of the server for each pull request (JetStream sends an idle
/// heartbeat when no messages flow; two missed ones surface as an error item
/// and the request is sent again). Short, for a cluster: a request held by a
/// consumer leader that died or lost an election is answered by nobody, and
/// is found lost within two of these (nats.go and async-nats default to
/// 15–30 s). A server sends one small message per interval per idle request.
pub const PULL_HEARTBEAT: Duration = Duration::from_secs(2);
/// How long one pull request stays open on the server (JetStream requires
/// over twice the heartbeat). It bounds how long a request from a host that
/// died without a word takes up one of the consumer's waiting requests.
pub const PULL_EXPIRES: Duration = Duration::from_secs(10);
/// A handler whose pull requests heard nothing (no message, no heartbeat)
/// for this long is not ready (`/readyz`): three heartbeats missed, one
/// more than the pull stream needs to ask again.
pub const SILENCE_NOT_READY: Duration = Duration::from_secs(6);
/// How long a confirmed ack (or term) waits for the server's reply. The
/// reply is only a hint (the receipt keeps the effect single): one that
/// does not come (a consumer leader stepping down drops it) must not hold
/// the delivery's concurrency slot for the JetStream context's 5 s.
pub const CONFIRM_WAIT: Duration = Duration::from_secs(2);

/// A connection to the broker: the JetStream context, a counter of
/// (re)connections that [`Deliveries`] watches to start a fresh pull after a
/// reconnect instead of waiting for missed heartbeats, and a counter of the
/// permissions violations the server reported on it
/// ([`Broker::through_elections`] stops waiting at one).
#[derive(Clone)]
pub struct Broker {
    /// The JetStream context every stream, consumer and clock read goes through.
    pub js: jetstream::Context,
    connections: watch::Receiver<u64>,
    denials: watch::Receiver<u64>,
}

/// Makes sure the handler's stream exists and captures the handler's
/// subjects, and returns its durable pull consumer, created if missing and
/// brought in line with the config when it differs.
///
/// - A missing stream is created with the handler's subjects, `max_age =
///   retention` (so the broker never presents a message older than the
///   receipts that recognise it), and idem's owner mark in its metadata
///   ([`drift::OWNER_KEY`]).
/// - A handler subject the stream does not capture is added to the stream
///   when idem owns it; on any other stream the start stops (messages on it
///   would never be stored).
/// - The consumer is named after the handler; it filters on the handler's
///   subjects, acks explicitly, and has no broker-side `max_deliver` (idem
///   enforces the handler's own). Every one of these settings is compared
///   ([`drift::consumer_drift`]) and a differing consumer updated.
///
/// # Errors
/// One line naming the handler and what to do: the stream or consumer cannot
/// be read or created, a subject is not captured by a stream idem does not
/// own, or a differing consumer cannot be updated.
pub async fn ensure_consumer(
    js: &jetstream::Context,
    handler: &HandlerConfig,
    max_ack_pending: i64,
) -> anyhow::Result<EnsuredConsumer> {
    ensure_consumer_from(js, handler, max_ack_pending, handler.start.deliver_policy()).await
}

/// [`ensure_consumer`], creating a missing consumer at `deliver_policy`
/// instead of the handler's `start` (an existing consumer keeps its own).
///
/// # Errors
/// As [`ensure_consumer`].
pub async fn ensure_consumer_from(
    js: &jetstream::Context,
    handler: &HandlerConfig,
    max_ack_pending: i64,
    deliver_policy: DeliverPolicy,
) -> anyhow::Result<EnsuredConsumer> {
    let transform = partition::transform(handler).map_err(anyhow::Error::msg)?;
    let mut stream = js
        .get_or_create_stream(stream::Config {
            name: handler.stream.clone(),
            subjects: handler.subjects.clone(),
            max_age: handler.retention,
            num_replicas: handler.stream_replicas,
            // What another handler's outbox publishes here in one
            // delivery is stored together (JetStream atomic batch).
            allow_atomic_publish: true,
            subject_transform: transform.clone(),
            metadata: [(
                drift::OWNER_KEY.to_string(),
                drift::OWNER_VALUE.to_string(),
            )]
            .into(),
            ..Default::default()
        })
        .await
        .with_context(|| {
            format!(
                "handler `{}`: cannot get or create stream `{}`; check that JetStream is enabled and the subjects do not overlap another stream",
                handler.name, handler.stream
            )
        })?;
    let stream_config = stream.cached_info().config.clone();
    if let Some(want) = &transform
        && stream_config.subject_transform.as_ref() != Some(want)
    {
        anyhow::bail!(
            "handler `{}`: stream `{}` does not partition its messages as partitions = {} needs (subject transform {} -> {}; it has {}); idem sets the transform only on a stream it creates: create the stream with it, or let idem create the stream",
            handler.name,
            handler.stream,
            handler.partitions.unwrap_or(0),
            want.source,
            want.destination,
            stream_config
                .subject_transform
                .as_ref()
                .map_or("none".to_string(), |t| format!(
                    "{} -> {}",
                    t.source, t.destination
                ))
        );
    }
    if transform.is_none()
        && let Some(t) = &stream_config.subject_transform
        && handler
            .subjects
            .iter()
            .any(|s| drift::captures(&t.source, s) || drift::captures(s, &t.source))
    {
        anyhow::bail!(
            "handler `{}`: stream `{}` stores what is published to `{}` under `{}` (a subject transform, as for partitions), so a consumer filtering on {:?} would never see a message; set the handler's partitions to match, or use a stream without the transform",
            handler.name,
            handler.stream,
            t.source,
            t.destination,
            handler.subjects
        );
    }
    let missing = drift::uncaptured(&stream_config.subjects, &handler.subjects);
    if !missing.is_empty() {
        let owned = stream_config
            .metadata
            .get(drift::OWNER_KEY)
            .map(String::as_str)
            == Some(drift::OWNER_VALUE);
        if !owned {
            anyhow::bail!(
                "handler `{}`: stream `{}` captures {:?}, not {:?}, and idem did not create it; add the subjects to the stream (nats stream edit {} --subjects ...) or change the handler's subjects",
                handler.name,
                handler.stream,
                stream_config.subjects,
                missing,
                handler.stream
            );
        }
        let mut config = stream_config.clone();
        config
            .subjects
            .extend(missing.iter().map(|s| (*s).to_string()));
        js.update_stream(config).await.with_context(|| {
            format!(
                "handler `{}`: cannot add {:?} to stream `{}` (which captures {:?}); check that they do not overlap its subjects or another stream's",
                handler.name, missing, handler.stream, stream_config.subjects
            )
        })?;
        tracing::info!(handler = %handler.name, stream = %handler.stream, added = ?missing, "stream subjects added from the config");
        stream = js.get_stream(&handler.stream).await.with_context(|| {
            format!(
                "handler `{}`: cannot read stream `{}`",
                handler.name, handler.stream
            )
        })?;
    }
    // A partition's consumer filters on its own share of the transformed
    // subjects and is served to one host at a time.
    let (subjects, priority_timeout) = match handler.partition {
        Some(p) => (
            handler
                .subjects
                .iter()
                .map(|s| partition::filter(p, s))
                .collect::<Vec<_>>(),
            Some(handler.priority_timeout()),
        ),
        None => (handler.subjects.clone(), None),
    };
    let durable = handler.durable_name();
    let want = drift::WantedConsumer {
        ack_wait: handler.ack_wait,
        max_ack_pending,
        subjects: subjects.clone(),
        priority_timeout,
    };
    let (filter_subject, filter_subjects) = if subjects.len() == 1 {
        (subjects[0].clone(), Vec::new())
    } else {
        (String::new(), subjects.clone())
    };
    let config = pull::Config {
        durable_name: Some(durable.clone()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: handler.ack_wait,
        // Unlimited on the broker: idem enforces `max_deliver` itself (a dead
        // letter on the last delivery), so a message whose dead letter cannot
        // be written, or that was fetched but never started (shutdown,
        // outage), always comes back instead of being dropped by JetStream
        // after its last delivery.
        max_deliver: -1,
        max_ack_pending,
        filter_subject,
        filter_subjects,
        deliver_policy,
        priority_policy: if priority_timeout.is_some() {
            jetstream::consumer::PriorityPolicy::PinnedClient
        } else {
            jetstream::consumer::PriorityPolicy::None
        },
        priority_groups: if priority_timeout.is_some() {
            vec![partition::GROUP.to_string()]
        } else {
            Vec::new()
        },
        priority_timeout: priority_timeout.unwrap_or_default(),
        ..Default::default()
    };
    let existed = match stream.consumer_info(&durable).await {
        Ok(_) => true,
        Err(e) if e.kind() == jetstream::context::ConsumerInfoErrorKind::NotFound => false,
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "handler `{}`: cannot read durable consumer `{}` on stream `{}`",
                handler.name, durable, handler.stream
            )));
        }
    };
    if !existed {
        refuse_start_past_end(handler, &deliver_policy, &stream)?;
    }
    let consumer = stream
        .get_or_create_consumer(&durable, config.clone())
        .await
        .with_context(|| {
            format!(
                "handler `{}`: cannot get or create durable consumer on stream `{}`",
                handler.name, handler.stream
            )
        })?;
    if !existed {
        tracing::info!(handler = %handler.name, consumer = %durable, start = %handler.start, "durable consumer created");
    }
    let found = consumer.cached_info().config.clone();
    let drift = drift::consumer_drift(&found, &want);
    let stream_created = stream.cached_info().created;
    if drift.is_empty() {
        let stored = consumer.cached_info().num_pending;
        return Ok(EnsuredConsumer {
            consumer,
            created: !existed,
            stored,
            stream_created,
        });
    }
    // A consumer made earlier (or by hand) with other settings: bring it in
    // line. Its start position stays (JetStream cannot change it).
    let config = pull::Config {
        deliver_policy: found.deliver_policy,
        ..config
    };
    let updated = stream.update_consumer(config).await.with_context(|| {
        format!(
            "handler `{}`: durable consumer `{}` differs from the config in {} and cannot be updated; delete it (nats consumer rm {} {}) to let idem create it",
            handler.name,
            durable,
            drift.join(", "),
            handler.stream,
            durable
        )
    })?;
    tracing::info!(handler = %handler.name, changed = ?drift, "durable consumer updated to match the config");
    Ok(EnsuredConsumer {
        consumer: updated,
        created: !existed,
        stored: 0,
        stream_created,
    })
}

/// Refuses to create a consumer whose start sequence lies past the next
/// message of `stream` ([`crate::config::start::skipped_past_end`]): the messages
/// published up to it would be skipped, with no dead letter and nothing
/// pending. Read before the consumer is created: a message published
/// meanwhile only moves the stream's end closer to the start.
///
/// # Errors
/// One line: the stream's last sequence, the messages that would be
/// skipped, and the `start` values that skip nothing.
fn refuse_start_past_end(
    handler: &HandlerConfig,
    deliver_policy: &DeliverPolicy,
    stream: &stream::Stream,
) -> anyhow::Result<()> {
    let last = stream.cached_info().state.last_sequence;
    let Some((first, until)) = crate::config::start::skipped_past_end(deliver_policy, last) else {
        return Ok(());
    };
    let skipped = until - first + 1;
    anyhow::bail!(
        "handler `{}`: start = \"seq:{}\" is past the end of stream `{}`, whose last sequence is {last}: the new durable consumer would skip {} ({}) as they arrive; set start = \"seq:{}\" (the next message) or \"new\"",
        handler.name,
        until + 1,
        handler.stream,
        if skipped == 1 {
            format!("message {first}")
        } else {
            format!("messages {first} to {until}")
        },
        if skipped == 1 {
            "1 message".to_string()
        } else {
            format!("{skipped} messages")
        },
        first
    )
}

/// What [`ensure_consumer`] found or made.
pub struct EnsuredConsumer {
    /// The handler's durable pull consumer.
    pub consumer: jetstream::consumer::Consumer<pull::Config>,
    /// idem created it just now (it did not exist), at the handler's `start`.
    pub created: bool,
    /// Messages it has yet to deliver (`num_pending`) as the broker reported
    /// when it was read or created; 0 after an update.
    pub stored: u64,
    /// When the broker created its stream: a stream deleted and created
    /// again under the same name has another (its sequences start over).
    pub stream_created: time::OffsetDateTime,
}

/// The stream's `max_age`: how long it keeps a message. `None`: for ever
/// (JetStream's 0, the default of a stream created without one).
pub async fn stream_max_age(
    js: &jetstream::Context,
    stream: &str,
) -> anyhow::Result<Option<Duration>> {
    let mut s = js
        .get_stream(stream)
        .await
        .with_context(|| format!("cannot read stream `{stream}`"))?;
    let info = s
        .info()
        .await
        .with_context(|| format!("cannot read stream `{stream}`"))?;
    let max_age = info.config.max_age;
    Ok((!max_age.is_zero()).then_some(max_age))
}

/// What the broker is told about a delivery once its attempt is decided
/// (see [`crate::pipeline::verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Confirmed ack (`+ACK`, waiting for the server's reply; see the module
    /// docs for why even `Ok` is only a hint): the effect is committed.
    Ack,
    /// Negative ack (`-NAK` with a delay): deliver again after it.
    Nak(Duration),
    /// Negative ack without delay (`-NAK`): a delivery this host fetched but
    /// did not run, or abandoned at the end of the shutdown grace, given
    /// back so another host takes it at once.
    Release,
    /// Terminate (`+TERM`, confirmed): never deliver it again. Only after a
    /// durable dead letter.
    Term,
}

/// Tells the broker `settlement` for `msg`: the one place a delivery is
/// acked, naked or termed.
///
/// # Errors
/// The client's error when the request could not be sent or (for the
/// confirmed kinds) was not answered within [`CONFIRM_WAIT`].
pub async fn settle(
    msg: &jetstream::Message,
    settlement: Settlement,
) -> Result<(), async_nats::Error> {
    match settlement {
        Settlement::Ack => confirmed(msg.double_ack()).await,
        Settlement::Nak(delay) => msg.ack_with(AckKind::Nak(Some(delay))).await,
        Settlement::Release => msg.ack_with(AckKind::Nak(None)).await,
        Settlement::Term => confirmed(msg.double_ack_with(AckKind::Term)).await,
    }
}

/// Acks `msgs` together: a plain `+ACK` each but the last, whose ack is
/// confirmed. The server reads a connection's messages in order, so its
/// reply to the last says it has read the others sent on that connection:
/// the deliveries of one committed batch, or the copies a lookup found,
/// cost one round trip together instead of one each. An ack is only a
/// hint to stop redelivering (module docs): a delivery whose ack is lost
/// (a reconnect between the plain acks and the last drops what the old
/// connection had not sent) comes again and its receipt absorbs it.
///
/// # Errors
/// The client's error when an ack could not be queued (the others are
/// still sent), or the whole did not finish, the last confirmed, within
/// [`CONFIRM_WAIT`].
pub async fn ack_together(msgs: &[&jetstream::Message]) -> Result<(), async_nats::Error> {
    let Some((last, rest)) = msgs.split_last() else {
        return Ok(());
    };
    confirmed(async {
        let mut failed = None;
        for msg in rest {
            if let Err(e) = msg.ack().await {
                failed.get_or_insert(e);
            }
        }
        let last = last.double_ack().await;
        failed.map_or(last, Err)
    })
    .await
}

/// `reply`, or a timeout error once [`CONFIRM_WAIT`] has passed.
async fn confirmed(
    reply: impl std::future::Future<Output = Result<(), async_nats::Error>>,
) -> Result<(), async_nats::Error> {
    tokio::time::timeout(CONFIRM_WAIT, reply)
        .await
        .unwrap_or_else(|_| {
            Err(Box::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the server did not confirm within {}s",
                    CONFIRM_WAIT.as_secs()
                ),
            )))
        })
}

/// Pending work of a consumer: messages not yet delivered plus delivered but
/// not yet acked (including naked ones waiting for their delay).
pub async fn outstanding(
    consumer: &mut jetstream::consumer::Consumer<pull::Config>,
) -> anyhow::Result<u64> {
    let info = consumer.info().await?;
    Ok(info.num_pending + info.num_ack_pending as u64)
}
