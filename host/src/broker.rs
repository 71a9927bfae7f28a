//! The JetStream side: connect, make sure the stream and the durable pull
//! consumer exist, hand out messages, and ack / nak / term them.
//!
//! Facts this module is written around (async-nats 0.51, checked in DESIGN.md):
//! - `ack()` returning `Ok` only means queued in the client; `double_ack()`
//!   waits for the server's reply (a *confirmed* ack) but is still only a hint
//!   to stop redelivering: the receipt, not the ack, keeps an effect single.
//! - A consumer-stream error (missed heartbeat, consumer deleted, broker
//!   restart) is an `Err` item, not the end of the stream: [`Deliveries`]
//!   logs it and keeps pulling, re-creating the pull stream when needed.
//! - `Nak(Some(delay))` redelivers after the delay; past a consumer's
//!   `max_deliver` JetStream stops delivering without telling anyone, so
//!   consumers are created without one and the pipeline dead-letters on the
//!   handler's last allowed delivery itself.

use crate::config::HandlerConfig;
use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind, consumer::pull, stream};
use futures::StreamExt;
use std::time::Duration;
use tokio::sync::watch;

/// Heartbeat asked of the server for each pull request (JetStream sends an idle
/// heartbeat when no messages flow; two missed ones surface as an error item).
const PULL_HEARTBEAT: Duration = Duration::from_secs(5);
/// How long one pull request stays open on the server.
const PULL_EXPIRES: Duration = Duration::from_secs(30);

/// A connection to the broker: the JetStream context, and a counter of
/// (re)connections that [`Deliveries`] watches to start a fresh pull after a
/// reconnect instead of waiting for missed heartbeats.
#[derive(Clone)]
pub struct Broker {
    pub js: jetstream::Context,
    connections: watch::Receiver<u64>,
}

/// Connects to the broker. Error: one line naming the URL and what to check.
/// The client reconnects by itself for ever after a lost connection.
pub async fn connect(url: &str) -> anyhow::Result<Broker> {
    let (count, mut connections) = watch::channel(0u64);
    let client = async_nats::ConnectOptions::new()
        .name("idem")
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .event_callback(move |event| {
            let count = count.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        count.send_modify(|n| *n += 1);
                        tracing::info!("connected to NATS");
                    }
                    async_nats::Event::Disconnected => {
                        tracing::warn!("disconnected from NATS; reconnecting");
                    }
                    other => tracing::debug!(event = %other, "NATS client event"),
                }
            }
        })
        .connect(url)
        .await
        .with_context(|| format!("cannot connect to NATS at {url}; check [broker] url and that nats-server runs with -js"))?;
    // `retry_on_initial_connect` returns at once; prove the server answers.
    tokio::time::timeout(Duration::from_secs(10), client.flush())
        .await
        .map_err(|_| anyhow::anyhow!("cannot reach NATS at {url} within 10s; check [broker] url and that nats-server runs"))?
        .with_context(|| format!("cannot reach NATS at {url}"))?;
    // The client reports its first connection from another task, possibly
    // after the pull streams have started; seen then, it would read as a
    // reconnect and drop a pull stream with messages in it (they would wait
    // out `ack_wait`). Wait for it here and mark it seen, so only later
    // connections count as reconnects.
    if tokio::time::timeout(Duration::from_secs(5), connections.wait_for(|n| *n >= 1))
        .await
        .is_err()
    {
        tracing::debug!("the client's first connected event did not arrive within 5s");
    }
    Ok(Broker {
        js: jetstream::new(client),
        connections,
    })
}

/// Makes sure the handler's stream exists (creating it with the handler's
/// subjects and `max_age = retention` if not, so the broker never presents a
/// message older than the receipts that recognise it) and returns its
/// durable pull consumer, created if missing.
/// The consumer name is the handler name; it filters on the handler's
/// subjects, acks explicitly, and has no broker-side `max_deliver` (idem
/// enforces the handler's own); an existing consumer with other settings is
/// updated.
pub async fn ensure_consumer(
    js: &jetstream::Context,
    handler: &HandlerConfig,
    max_ack_pending: i64,
) -> anyhow::Result<jetstream::consumer::Consumer<pull::Config>> {
    let stream = js
        .get_or_create_stream(stream::Config {
            name: handler.stream.clone(),
            subjects: handler.subjects.clone(),
            max_age: handler.retention,
            ..Default::default()
        })
        .await
        .with_context(|| {
            format!(
                "handler `{}`: cannot get or create stream `{}`; check that JetStream is enabled and the subjects do not overlap another stream",
                handler.name, handler.stream
            )
        })?;
    let filter_subjects = if handler.subjects.len() == 1 {
        Vec::new()
    } else {
        handler.subjects.clone()
    };
    let filter_subject = if handler.subjects.len() == 1 {
        handler.subjects[0].clone()
    } else {
        String::new()
    };
    let config = pull::Config {
        durable_name: Some(handler.name.clone()),
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
        ..Default::default()
    };
    let consumer = stream
        .get_or_create_consumer(&handler.name, config.clone())
        .await
        .with_context(|| {
            format!(
                "handler `{}`: cannot get or create durable consumer on stream `{}`",
                handler.name, handler.stream
            )
        })?;
    let found = &consumer.cached_info().config;
    if found.max_deliver == -1 && found.ack_wait == handler.ack_wait {
        return Ok(consumer);
    }
    // A consumer made earlier (or by hand) with other settings: bring it in line.
    match stream.update_consumer(config).await {
        Ok(updated) => {
            tracing::info!(handler = %handler.name, "durable consumer updated: ack_wait from the config, no broker-side max_deliver");
            Ok(updated)
        }
        Err(e) => {
            tracing::warn!(handler = %handler.name, error = %e, max_deliver = found.max_deliver, "cannot update the durable consumer's settings; with a broker-side max_deliver JetStream may drop a message idem could not dead-letter. Delete the consumer (nats consumer rm) to let idem create it");
            Ok(consumer)
        }
    }
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

/// An endless source of deliveries for one consumer. Errors from the
/// underlying pull stream are logged and survived; only shutdown ends it.
pub struct Deliveries {
    consumer: jetstream::consumer::Consumer<pull::Config>,
    connections: watch::Receiver<u64>,
    batch: usize,
    stream: Option<pull::Stream>,
    handler: String,
}

impl Deliveries {
    /// `batch`: messages requested per pull; keep it small enough that a full
    /// batch is processed well within `ack_wait`.
    pub fn new(
        broker: &Broker,
        consumer: jetstream::consumer::Consumer<pull::Config>,
        batch: usize,
        handler: &str,
    ) -> Self {
        let mut connections = broker.connections.clone();
        connections.mark_unchanged();
        Self {
            consumer,
            connections,
            batch: batch.max(1),
            stream: None,
            handler: handler.to_string(),
        }
    }

    /// Drops the open pull request, so the server sends this host nothing
    /// while it cannot process (the database is down). Messages already
    /// buffered here are not acked: the server redelivers them after
    /// `ack_wait`. The next [`Deliveries::next`] pulls again.
    pub fn pause(&mut self) {
        if self.stream.take().is_some() {
            tracing::info!(handler = %self.handler, "fetching paused");
        }
    }

    /// The next message. Never returns on a broker error: it logs, waits with
    /// backoff and pulls again.
    pub async fn next(&mut self) -> jetstream::Message {
        let mut backoff = Duration::from_millis(100);
        loop {
            if self.stream.is_none() {
                match self
                    .consumer
                    .stream()
                    .max_messages_per_batch(self.batch)
                    .heartbeat(PULL_HEARTBEAT)
                    .expires(PULL_EXPIRES)
                    .messages()
                    .await
                {
                    Ok(s) => self.stream = Some(s),
                    Err(e) => {
                        tracing::warn!(handler = %self.handler, error = %e, "cannot start pulling; retrying in {backoff:?}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
            let Some(stream) = self.stream.as_mut() else {
                continue;
            };
            let item = tokio::select! {
                item = stream.next() => item,
                _ = self.connections.changed() => {
                    // Reconnected: the server forgot the open pull request.
                    tracing::info!(handler = %self.handler, "reconnected to NATS; pulling again");
                    self.stream = None;
                    continue;
                }
            };
            match item {
                Some(Ok(msg)) => return msg,
                Some(Err(e)) => {
                    use pull::MessagesErrorKind as K;
                    tracing::warn!(handler = %self.handler, error = %e, "consumer stream error; still pulling");
                    // A missed heartbeat also means no pull request is open on
                    // the server: async-nats 0.51 can miscount its pending
                    // messages (a reply arriving before its request's result)
                    // and then never pull again. Start a fresh pull stream.
                    if matches!(
                        e.kind(),
                        K::ConsumerDeleted
                            | K::RequestLimitExceeded
                            | K::PushBasedConsumer
                            | K::MissingHeartbeat
                    ) {
                        self.stream = None;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                None => {
                    tracing::warn!(handler = %self.handler, "consumer stream ended; pulling again");
                    self.stream = None;
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }
}

/// Confirmed ack: waits for the server's reply. See the module docs for why
/// even `Ok` is only a hint.
pub async fn ack(msg: &jetstream::Message) -> Result<(), async_nats::Error> {
    msg.double_ack().await
}

/// Negative ack: deliver again after `delay`.
pub async fn nak(msg: &jetstream::Message, delay: Duration) -> Result<(), async_nats::Error> {
    msg.ack_with(AckKind::Nak(Some(delay))).await
}

/// Terminate: never deliver this message again. Used only after a durable dead letter.
pub async fn term(msg: &jetstream::Message) -> Result<(), async_nats::Error> {
    msg.double_ack_with(AckKind::Term).await
}

/// Tells the server the message is still being worked on (resets `ack_wait`).
pub async fn in_progress(msg: &jetstream::Message) -> Result<(), async_nats::Error> {
    msg.ack_with(AckKind::Progress).await
}

/// Pending work of a consumer: messages not yet delivered plus delivered but
/// not yet acked (including naked ones waiting for their delay).
pub async fn outstanding(
    consumer: &mut jetstream::consumer::Consumer<pull::Config>,
) -> anyhow::Result<u64> {
    let info = consumer.info().await?;
    Ok(info.num_pending + info.num_ack_pending as u64)
}

/// Keeps a message ours while it is processed: sends an in-progress ack
/// (`+WPI`, which restarts the server's `ack_wait` timer) every third of
/// `ack_wait`, until dropped. Without it a message still being worked on past
/// `ack_wait` is redelivered (and, on another host, run concurrently: the
/// receipt keeps the effect single, but the work is wasted).
pub struct InProgress(tokio::task::JoinHandle<()>);

impl InProgress {
    /// Starts the keep-alive for `msg` (a cheap clone of the delivery).
    pub fn start(msg: jetstream::Message, ack_wait: Duration) -> Self {
        let period = (ack_wait / 3).max(Duration::from_millis(100));
        Self(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            loop {
                tick.tick().await;
                if let Err(e) = in_progress(&msg).await {
                    tracing::debug!(error = %e, "in-progress ack failed");
                }
            }
        }))
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.abort();
    }
}
