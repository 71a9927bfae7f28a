//! [`Deliveries`]: one handler's endless stream of deliveries from its
//! durable pull consumer, surviving broker errors and reconnects, and
//! creating the consumer (and an owned stream) again when it is deleted
//! under a running host (ARCHITECTURE.md, "Code map": broker).

use super::liveness::Liveness;
use super::pull_stream::{PullError, PullSettings, PullStream, SharedPin};
use super::surplus::Raise;
use super::{Broker, PULL_EXPIRES, PULL_HEARTBEAT, ensure_consumer_from};
use crate::backoff;
use crate::config::HandlerConfig;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::{self, consumer::pull};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long a durable consumer that is gone from the broker may stay
/// impossible to create again, while the broker connection is up, before
/// [`Deliveries::next`] gives up with [`ConsumerLost`].
pub const CONSUMER_LOST_GRACE: Duration = Duration::from_secs(60);

/// The handler's durable consumer (or its stream) is gone from the broker and
/// could not be created again for [`CONSUMER_LOST_GRACE`] while the broker
/// answered: one line saying why, for the operator; the host exits non-zero
/// so a supervisor restarts it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ConsumerLost(pub String);

/// An endless source of deliveries for one consumer. Errors from the
/// underlying pull stream are logged and survived; a consumer or stream
/// deleted on the broker is created again ([`super::ensure_consumer`]); only
/// shutdown, or a consumer that cannot be created again, ends it.
pub struct Deliveries {
    consumer: jetstream::consumer::Consumer<pull::Config>,
    connections: watch::Receiver<u64>,
    pull_size: usize,
    stream: Option<PullStream>,
    js: jetstream::Context,
    handler: HandlerConfig,
    max_ack_pending: i64,
    /// Since when the consumer could not be created again (broker connected).
    lost_since: Option<tokio::time::Instant>,
    /// JetStream's silence about the consumer was logged (until it answers).
    unanswered_said: bool,
    /// When the consumer's stream was created (see [`super::EnsuredConsumer`]).
    stream_created: time::OffsetDateTime,
    /// The consumer's ack floor (stream sequence) as last read, at most
    /// [`ACK_FLOOR_REFRESH`] old: every message after it may be unsettled,
    /// so a consumer made again after a deletion starts right after it.
    ack_floor: u64,
    /// When `ack_floor` was last read.
    ack_floor_read: tokio::time::Instant,
    /// An error item [`Deliveries::fill`] took, for the next pull to handle.
    failed: Option<PullError>,
    /// What the server said to this handler's pull requests, across the
    /// pull streams opened.
    liveness: Arc<Liveness>,
    /// The pin a partition's consumer gave this host, across the pull
    /// streams opened.
    pin: SharedPin,
    /// The size the consuming loop may raise for a while
    /// ([`Deliveries::raise_with`]), given to each pull stream opened.
    raise: Option<Arc<Raise>>,
}

/// How often [`Deliveries`] reads its consumer's ack floor again.
const ACK_FLOOR_REFRESH: Duration = Duration::from_secs(5);

impl Deliveries {
    /// `pull_size`: messages requested per pull; keep it small enough that a
    /// full pull is processed well within `ack_wait`. `handler` and
    /// `max_ack_pending` are what [`super::ensure_consumer`] made `consumer` from,
    /// to make it again if it is deleted. `liveness` is told what the
    /// server says and what is asked of it.
    pub fn new(
        broker: &Broker,
        consumer: jetstream::consumer::Consumer<pull::Config>,
        stream_created: time::OffsetDateTime,
        pull_size: usize,
        handler: &HandlerConfig,
        max_ack_pending: i64,
        liveness: Arc<Liveness>,
    ) -> Self {
        let mut connections = broker.connections.clone();
        connections.mark_unchanged();
        Self {
            ack_floor: consumer.cached_info().ack_floor.stream_sequence,
            ack_floor_read: tokio::time::Instant::now(),
            stream_created,
            consumer,
            connections,
            pull_size: pull_size.max(1),
            stream: None,
            js: broker.js.clone(),
            handler: handler.clone(),
            max_ack_pending,
            lost_since: None,
            unanswered_said: false,
            failed: None,
            liveness,
            pin: SharedPin::default(),
            raise: None,
        }
    }

    /// Lets the consuming loop raise the pull size for a while through
    /// `raise` ([`super::surplus`]): what the pull streams opened from now
    /// on buffer beyond the usual size is held in progress until taken.
    pub fn raise_with(&mut self, raise: Arc<Raise>) {
        self.raise = Some(raise);
    }

    /// The pin a partition's consumer gave this host (`None` while it
    /// stands by, and for a consumer without partitions), as it will be
    /// after the consuming loop ends.
    pub fn pin(&self) -> SharedPin {
        self.pin.clone()
    }

    /// Messages delivered to the open pull stream and not yet taken (0
    /// when none is open).
    pub fn buffered(&self) -> usize {
        self.stream.as_ref().map_or(0, PullStream::buffered)
    }

    /// What of this consumer is out now, to this host or any other, as the
    /// broker reports it (JetStream consumer info): see [`Out`].
    ///
    /// # Errors
    /// The consumer info could not be read (the broker did not answer).
    pub async fn out(&mut self) -> anyhow::Result<Out> {
        let info = self.consumer.info().await?;
        Ok(Out {
            pending: info.num_ack_pending,
            last_delivered: info.delivered.stream_sequence,
        })
    }

    /// Drops the open pull request, so the server sends this host nothing
    /// while it cannot process (the database is down). Messages already
    /// buffered here are not acked: the server redelivers them after
    /// `ack_wait`. The next [`Deliveries::next`] pulls again.
    ///
    /// A partition's pull stream stays open instead: it asks for no more
    /// than one message every pull expiry (what is buffered is not taken),
    /// and so keeps this host's pin. Were the pin to lapse, another host
    /// would run the partition's later messages while this one still holds
    /// earlier ones in its key lanes.
    pub fn pause(&mut self) {
        self.failed = None;
        self.liveness.satisfied();
        if self.handler.partition.is_some() {
            if self.stream.is_some() {
                tracing::info!(handler = %self.handler.name, consumer = %self.handler.durable_name(), "fetching paused; the partition's pull stays open (a message every 10 s at most) to keep this host's pin");
            }
            return;
        }
        if self.stream.take().is_some() {
            tracing::info!(handler = %self.handler.name, "fetching paused");
        }
    }

    /// Where a consumer made again should start, so that nothing its lost
    /// predecessor had not settled is skipped: right after the last ack
    /// floor read ([`ACK_FLOOR_REFRESH`]; what was applied since is skipped by
    /// its receipt) while the stream is the same one; at the first message
    /// when the stream is gone or was created again (its sequences start
    /// over and every message in it is new). The handler's `start` applies
    /// only to a consumer's first creation.
    ///
    /// # Errors
    /// The stream could not be read (other than "not found").
    async fn resume_policy(&self) -> anyhow::Result<DeliverPolicy> {
        match self.js.get_stream(&self.handler.stream).await {
            Ok(s) if s.cached_info().created == self.stream_created => {
                Ok(DeliverPolicy::ByStartSequence {
                    start_sequence: self.ack_floor + 1,
                })
            }
            Ok(_) => Ok(DeliverPolicy::All),
            Err(e)
                if matches!(
                    e.kind(),
                    jetstream::context::GetStreamErrorKind::JetStream(ref js)
                        if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
                ) =>
            {
                Ok(DeliverPolicy::All)
            }
            Err(e) => Err(anyhow::Error::new(e).context(format!(
                "handler `{}`: cannot read stream `{}`",
                self.handler.name, self.handler.stream
            ))),
        }
    }

    /// Reads the consumer's ack floor again once [`ACK_FLOOR_REFRESH`] has
    /// passed (errors keep the last one: an older floor only replays more).
    async fn refresh_ack_floor(&mut self) {
        if self.ack_floor_read.elapsed() < ACK_FLOOR_REFRESH {
            return;
        }
        self.ack_floor_read = tokio::time::Instant::now();
        if let Ok(info) = self.consumer.info().await {
            self.ack_floor = info.ack_floor.stream_sequence;
        }
    }

    /// Makes sure the consumer (and its stream) still exist, creating them
    /// again when they were deleted on the broker ([`Deliveries::resume_policy`]
    /// says from where). A failure while the broker connection is down, or
    /// a request JetStream did not answer ([`super::unanswered`]: a cluster
    /// electing a leader), is an outage, tried again; a refusal while it is
    /// up is logged once, and after [`CONSUMER_LOST_GRACE`] is
    /// [`ConsumerLost`].
    async fn restore(&mut self) -> Result<(), ConsumerLost> {
        let ensured = match self.resume_policy().await {
            Ok(policy) => {
                ensure_consumer_from(&self.js, &self.handler, self.max_ack_pending, policy)
                    .await
                    .map(|e| (e, policy))
            }
            Err(e) => Err(e),
        };
        match ensured {
            Ok((ensured, policy)) => {
                let consumer = ensured.consumer;
                if consumer.cached_info().created != self.consumer.cached_info().created {
                    match policy {
                        DeliverPolicy::ByStartSequence { start_sequence } => {
                            tracing::warn!(handler = %self.handler.name, stream = %self.handler.stream, start_sequence, "the durable consumer was gone from the broker (deleted?) and is created again after the last acknowledged message; a message applied since is skipped by its receipt");
                        }
                        _ => {
                            tracing::warn!(handler = %self.handler.name, stream = %self.handler.stream, "the stream was gone or created again, and the durable consumer with it: created again from the stream's first message");
                        }
                    }
                    self.stream = None;
                }
                if self.lost_since.take().is_some() || std::mem::take(&mut self.unanswered_said) {
                    tracing::info!(handler = %self.handler.name, "durable consumer back");
                }
                self.ack_floor = consumer.cached_info().ack_floor.stream_sequence;
                self.ack_floor_read = tokio::time::Instant::now();
                self.stream_created = ensured.stream_created;
                self.consumer = consumer;
                Ok(())
            }
            Err(e) => {
                let connected =
                    self.js.client().connection_state() == async_nats::connection::State::Connected;
                if !connected {
                    return Ok(());
                }
                // A request JetStream did not answer (a cluster electing a
                // leader, a node away) says nothing of the consumer: an
                // outage, tried again, never counted as the consumer lost.
                if super::unanswered::unanswered(&e) {
                    if !self.unanswered_said {
                        self.unanswered_said = true;
                        tracing::warn!(handler = %self.handler.name, error = %format!("{e:#}"), "JetStream does not answer about the durable consumer (a leader election, or a server away); trying again");
                    }
                    return Ok(());
                }
                let since = *self.lost_since.get_or_insert_with(|| {
                    tracing::error!(handler = %self.handler.name, error = %format!("{e:#}"), "the durable consumer is gone and cannot be created again; trying for {}s, then exiting", CONSUMER_LOST_GRACE.as_secs());
                    tokio::time::Instant::now()
                });
                if since.elapsed() >= CONSUMER_LOST_GRACE {
                    return Err(ConsumerLost(format!("{e:#}")));
                }
                Ok(())
            }
        }
    }

    /// Opens the pull stream (the server starts sending messages) unless it
    /// is open. Called once before the first [`Deliveries::next`], so that a
    /// handler counts as consuming (`READY=1`, see [`crate::service::systemd`]) only
    /// once its pull request is out; an error here is left for `next` to
    /// retry and report.
    ///
    /// # Errors
    /// [`PullError`]: the pull request could not be sent.
    pub async fn open(&mut self) -> Result<(), PullError> {
        if self.stream.is_none() {
            let info = self.consumer.cached_info();
            let stream = PullStream::open_raised(
                &self.js,
                &info.stream_name,
                &info.name,
                PullSettings {
                    size: self.pull_size,
                    expires: PULL_EXPIRES,
                    heartbeat: PULL_HEARTBEAT,
                    pinned: self.handler.partition.is_some(),
                },
                self.liveness.clone(),
                self.pin.clone(),
                self.raise.clone(),
            )
            .await?;
            self.stream = Some(stream);
        }
        Ok(())
    }

    /// Stops fetching at shutdown and hands back the messages already
    /// fetched but never given out by [`Deliveries::next`] (buffered in the
    /// pull stream, up to about one and a half `pull_size`, or `pull_batch`
    /// while the loop raised the size), for the caller to
    /// nak without delay so another host gets them at once
    /// (ARCHITECTURE.md, "Shutdown"). The pull stream is closed: a message
    /// the server sent after this is redelivered after `ack_wait`.
    pub fn release_buffered(&mut self) -> Vec<jetstream::Message> {
        self.failed = None;
        self.liveness.satisfied();
        self.stream
            .take()
            .map(PullStream::close)
            .unwrap_or_default()
    }

    /// Adds to `batch` the messages that arrive within `linger` (those
    /// already buffered at once, even with a `linger` of zero) until it
    /// holds `max`. Only takes from the open pull stream: an error item, or
    /// a stream not open, ends the filling, and the next
    /// [`Deliveries::next`] deals with it. Cancel-safe: a message taken is
    /// in `batch`.
    pub async fn fill(
        &mut self,
        batch: &mut Vec<jetstream::Message>,
        max: usize,
        linger: Duration,
    ) {
        let until = tokio::time::Instant::now() + linger;
        while batch.len() < max && self.failed.is_none() {
            let Some(stream) = self.stream.as_mut() else {
                break;
            };
            let item = match stream.try_next() {
                Some(item) => Some(item),
                None => match tokio::time::timeout_at(until, stream.next()).await {
                    Ok(item) => item,
                    Err(_) => break,
                },
            };
            match item {
                Some(Ok(msg)) => batch.push(msg),
                Some(Err(e)) => self.failed = Some(e),
                None => self.stream = None,
            }
        }
    }

    /// The next message. A broker error is logged, and the pull starts again
    /// after a backoff (the consumer created again first if it is gone).
    ///
    /// # Errors
    /// [`ConsumerLost`]: the consumer is gone and could not be created again
    /// for [`CONSUMER_LOST_GRACE`] while the broker was connected.
    pub async fn next(&mut self) -> Result<jetstream::Message, ConsumerLost> {
        self.refresh_ack_floor().await;
        self.pull().await
    }

    /// [`Deliveries::next`] without reading the ack floor again first (the
    /// batch's first message did).
    async fn pull(&mut self) -> Result<jetstream::Message, ConsumerLost> {
        let mut waits = backoff::doubling(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            if let Err(e) = self.open().await {
                let wait = next_wait(&mut waits);
                tracing::warn!(handler = %self.handler.name, error = %e, "cannot start pulling; retrying in {wait:?}");
                tokio::time::sleep(wait).await;
                self.restore().await?;
                continue;
            }
            let Some(stream) = self.stream.as_mut() else {
                continue;
            };
            let item = if let Some(e) = self.failed.take() {
                Some(Err(e))
            } else {
                tokio::select! {
                    item = stream.next() => item,
                    _ = self.connections.changed() => {
                        // Reconnected: the server forgot the open pull request.
                        tracing::info!(handler = %self.handler.name, "reconnected to NATS; pulling again");
                        self.stream = None;
                        continue;
                    }
                }
            };
            match item {
                Some(Ok(msg)) => {
                    self.lost_since = None;
                    return Ok(msg);
                }
                Some(Err(e)) => {
                    tracing::warn!(handler = %self.handler.name, error = %e, "consumer stream error; still pulling");
                    if !e.goes_on() {
                        self.stream = None;
                    }
                    tokio::time::sleep(next_wait(&mut waits)).await;
                    // A deleted consumer or stream shows as any of these
                    // (consumer deleted, no responders, missed heartbeats).
                    if matches!(
                        e,
                        PullError::ConsumerDeleted
                            | PullError::NoResponders
                            | PullError::MissingHeartbeat
                            | PullError::Other(_)
                    ) {
                        self.restore().await?;
                    }
                }
                None => {
                    tracing::warn!(handler = %self.handler.name, "consumer stream ended; pulling again");
                    self.stream = None;
                    tokio::time::sleep(next_wait(&mut waits)).await;
                    self.restore().await?;
                }
            }
        }
    }
}

/// The deliveries of a consumer out at one moment (JetStream consumer info).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Out {
    /// Deliveries not yet acked (`num_ack_pending`): sent to a client and
    /// neither acked nor termed, including those naked and waiting for
    /// their redelivery (nats-server keeps a naked message in the
    /// consumer's pending set until it is acked; `consumer.go`,
    /// `processNak`).
    pub pending: usize,
    /// The highest stream sequence delivered so far (`delivered.stream_seq`):
    /// every delivery out has a stream sequence at or below it, and a
    /// message first delivered later one above it.
    pub last_delivered: u64,
}

/// The next of `waits` (endless; 5 s should it ever end).
fn next_wait(waits: &mut impl Iterator<Item = Duration>) -> Duration {
    waits.next().unwrap_or(Duration::from_secs(5))
}
