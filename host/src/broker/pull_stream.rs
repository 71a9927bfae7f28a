//! [`PullStream`]: the messages of one durable pull consumer over one inbox,
//! with the pull requests kept outstanding by a task that counts what it
//! asked for before it asks (ARCHITECTURE.md, "Code map": broker).
//!
//! Why not async-nats 0.51's own `Consumer::stream()`: its task sends a pull
//! request and only then reports it to the stream, which adds the request's
//! size to its count of messages still to come. When the request's messages
//! arrive before that report (a busy runtime, a fast server), they are taken
//! off a count that does not hold them yet (it saturates at zero), and the
//! report then adds the whole request again: the stream believes messages
//! are on their way that the server has already sent, asks for no more, and
//! waits until a heartbeat is missed (10 s) or its request expires. With
//! small pulls drained fast (batching) this happened in about one run in
//! three. Here the count is raised before the request is published, so a
//! reply can never arrive before its request is counted.
//!
//! The JetStream pull protocol this speaks (nats-server's
//! `server/consumer.go`, ADR-13 "Pull Subscribe internals"): a request is
//! published to `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>` with the
//! inbox as reply subject and `{"batch", "expires", "idle_heartbeat"}`
//! (durations in nanoseconds); the server answers on the inbox with up to
//! `batch` messages, status 100 (idle heartbeat) while it holds the request
//! with nothing to send, 408 when the request expired and 409 when it was
//! ended early (both with `Nats-Pending-Messages`, what was left of it),
//! and 503 when nothing answers the subject. A request the server drops
//! without a word (nats-server 2.15 does so with one over the consumer's
//! `max_waiting`) is found by the silence: no message and no heartbeat for
//! two heartbeat intervals.
//!
//! A partition's consumer has a pinned-client priority group (ADR-42,
//! nats-server 2.11+, `server/consumer.go` `nextWaiting`): every request
//! names the group, the server marks the messages it sends the pinned
//! client with a `Nats-Pin-Id` header, and the client names that id in
//! its later requests. A request naming an id that is no longer the pin
//! is answered 423; the client then asks without one and waits as a
//! standby. The pin lasts while the pinned client sends a new request at
//! least every `priority_timeout`: a pinned stream sends one (of a single
//! message) every `expires` even when it has enough buffered. A stream that
//! gains the pin counts off its other requests (the server serves only the
//! one it pinned) and asks again with the pin.

use super::in_progress::InProgress;
use super::liveness::Liveness;
use super::surplus::Raise;
use async_nats::jetstream;
use async_nats::{StatusCode, Subscriber};
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

/// The subject prefix of the JetStream API (async-nats's default; idem sets
/// no domain or other prefix).
const API_PREFIX: &str = "$JS.API";

/// Why a [`PullStream`] stopped or missed something: one item in its
/// sequence of messages.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PullError {
    /// The server said the consumer was deleted (409 "Consumer Deleted").
    /// The stream has ended.
    #[error("consumer deleted")]
    ConsumerDeleted,
    /// Nothing answers the consumer's pull subject (503): the stream or
    /// JetStream is gone or not reachable. The stream has ended.
    #[error("no responders")]
    NoResponders,
    /// The server refused the request: the consumer is push based, or the
    /// request exceeds one of its limits (409 with the server's words). The
    /// stream has ended.
    #[error("pull request refused: {0}")]
    Refused(String),
    /// Nothing came from the server (no message, no heartbeat) for two
    /// heartbeat intervals while requests were outstanding: they are taken
    /// as lost and asked for again. The stream goes on.
    #[error("missed idle heartbeat")]
    MissingHeartbeat,
    /// The request could not be published, or the inbox closed. The stream
    /// has ended.
    #[error("{0}")]
    Other(String),
}

impl PullError {
    /// Whether the stream goes on after this item ([`PullError::MissingHeartbeat`]
    /// only); after any other it has ended and must be opened again.
    pub fn goes_on(&self) -> bool {
        matches!(self, Self::MissingHeartbeat)
    }
}

/// What the pull requests ask of the server.
#[derive(Debug, Clone, Copy)]
pub struct PullSettings {
    /// Messages per pull request (at least 1). The next request goes out
    /// once at most half of one is buffered or still to come, so up to one
    /// and a half requests' worth can wait in the client.
    pub size: usize,
    /// How long the server holds a request (JetStream `expires`).
    pub expires: Duration,
    /// How often the server says it still holds a request with nothing to
    /// send (JetStream `idle_heartbeat`); under half of `expires`.
    pub heartbeat: Duration,
    /// The consumer has a pinned-client priority group
    /// ([`super::partition::GROUP`]): requests name it and the pin.
    pub pinned: bool,
}

/// The messages of one durable pull consumer, in delivery order, with an
/// [`PullError`] item where something went wrong. Dropping it stops the
/// task; messages delivered to it and not taken are not acked, so the server
/// delivers them again after `ack_wait`.
pub struct PullStream {
    /// Each message with its hold while it waits here, when the stream's
    /// [`Raise`] made one.
    items: mpsc::UnboundedReceiver<Result<Held, PullError>>,
    /// Messages sent into `items` and not yet taken.
    buffered: Arc<AtomicUsize>,
    /// Tells the task a message was taken (it may ask for more).
    taken: Arc<Notify>,
    task: tokio::task::AbortHandle,
}

impl Drop for PullStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PullStream {
    /// Subscribes to a fresh inbox, publishes the first pull request for
    /// `consumer` (of `stream`) and starts the task that keeps requests
    /// outstanding. Returns once the first request is out.
    ///
    /// # Errors
    /// [`PullError::Other`]: the inbox subscription or the first request
    /// could not be sent (the client is closed).
    pub async fn open(
        js: &jetstream::Context,
        stream: &str,
        consumer: &str,
        settings: PullSettings,
    ) -> Result<Self, PullError> {
        Self::open_heard(js, stream, consumer, settings, Arc::default()).await
    }

    /// [`PullStream::open`], telling `liveness` what the server says and
    /// what is asked of it (a handler keeps one across the pull streams it
    /// opens, so a silence that outlives a stream keeps counting).
    ///
    /// # Errors
    /// As [`PullStream::open`].
    pub async fn open_heard(
        js: &jetstream::Context,
        stream: &str,
        consumer: &str,
        settings: PullSettings,
        liveness: Arc<Liveness>,
    ) -> Result<Self, PullError> {
        Self::open_raised(
            js,
            stream,
            consumer,
            settings,
            liveness,
            Arc::default(),
            None,
        )
        .await
    }

    /// [`PullStream::open_heard`], also:
    ///
    /// - for a consumer with a priority group ([`PullSettings::pinned`]),
    ///   starting from the pin in `pin` and keeping there the one the server
    ///   gives or takes back, so a pull stream opened again (a reconnect, a
    ///   pause) keeps this host's pin instead of waiting `priority_timeout`
    ///   for it to lapse;
    /// - with a size the caller may raise for a while through `raise` (read
    ///   before each request), what is buffered beyond the usual size held
    ///   in progress until it is taken ([`super::surplus`]).
    ///
    /// # Errors
    /// As [`PullStream::open`].
    pub async fn open_raised(
        js: &jetstream::Context,
        stream: &str,
        consumer: &str,
        settings: PullSettings,
        liveness: Arc<Liveness>,
        pin: SharedPin,
        raise: Option<Arc<Raise>>,
    ) -> Result<Self, PullError> {
        let client = js.client();
        let inbox = client.new_inbox();
        let subscriber = client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| PullError::Other(format!("cannot subscribe to the pull inbox: {e}")))?;
        let mut puller = Puller {
            client,
            context: js.clone(),
            subject: format!("{API_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{consumer}"),
            inbox: inbox.into(),
            request: request_body(settings, settings.size, current(&pin).as_deref()),
            pin,
            last_request: tokio::time::Instant::now(),
            settings,
            raise,
            largest_sent: 0,
            outstanding: 0,
            buffered: Arc::new(AtomicUsize::new(0)),
            taken: Arc::new(Notify::new()),
            not_before: tokio::time::Instant::now(),
            liveness,
        };
        puller.request().await?;
        let (tx, items) = mpsc::unbounded_channel();
        let (buffered, taken) = (puller.buffered.clone(), puller.taken.clone());
        let task = tokio::spawn(puller.run(subscriber, tx)).abort_handle();
        Ok(Self {
            items,
            buffered,
            taken,
            task,
        })
    }

    /// The next item: waits for it. `None` once the stream has ended and
    /// everything before the end was taken. Cancel-safe: an item is either
    /// returned or stays for the next call.
    pub async fn next(&mut self) -> Option<Result<jetstream::Message, PullError>> {
        let item = self.items.recv().await?;
        Some(self.took(item))
    }

    /// An item already here, without waiting (`None` when there is none).
    pub fn try_next(&mut self) -> Option<Result<jetstream::Message, PullError>> {
        let item = self.items.try_recv().ok()?;
        Some(self.took(item))
    }

    /// Counts a message taken (its hold, if any, ends: the caller keeps it
    /// from here) and tells the task.
    fn took(&self, item: Result<Held, PullError>) -> Result<jetstream::Message, PullError> {
        let (msg, _hold) = item?;
        self.buffered.fetch_sub(1, Relaxed);
        self.taken.notify_one();
        Ok(msg)
    }

    /// Messages delivered to this stream and not yet taken.
    pub fn buffered(&self) -> usize {
        self.buffered.load(Relaxed)
    }

    /// Stops the task (no more requests, nothing more received) and returns
    /// the messages delivered but not yet taken.
    pub fn close(mut self) -> Vec<jetstream::Message> {
        self.task.abort();
        self.items.close();
        let mut left = Vec::new();
        while let Ok(item) = self.items.try_recv() {
            if let Ok((msg, _hold)) = item {
                left.push(msg);
            }
        }
        left
    }
}

/// The JSON body of a pull request for `size` messages (JetStream's
/// `JSApiConsumerGetNextRequest`), with the priority group and `pin` when
/// the consumer has one.
fn request_body(settings: PullSettings, size: usize, pin: Option<&str>) -> bytes::Bytes {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let mut body = serde_json::json!({
        "batch": size.max(1),
        "expires": nanos(settings.expires),
        "idle_heartbeat": nanos(settings.heartbeat),
    });
    if settings.pinned {
        body["group"] = super::partition::GROUP.into();
        if let Some(pin) = pin {
            body["id"] = pin.into();
        }
    }
    body.to_string().into()
}

/// A message waiting in a [`PullStream`], with its hold when one was made
/// ([`super::surplus`]).
type Held = (jetstream::Message, Option<InProgress>);

/// The pin the server gave a consumer's pull requests (`Nats-Pin-Id`), kept
/// across the pull streams a handler opens; `None` while standing by.
pub type SharedPin = Arc<std::sync::Mutex<Option<String>>>;

/// The pin in `pin` now.
fn current(pin: &SharedPin) -> Option<String> {
    pin.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// The task's state: what it asked for and what is waiting to be taken.
struct Puller {
    client: async_nats::Client,
    context: jetstream::Context,
    subject: String,
    inbox: async_nats::Subject,
    request: bytes::Bytes,
    settings: PullSettings,
    /// A size the consuming loop may raise for a while, and the hold of
    /// what arrives beyond the usual one ([`super::surplus`]).
    raise: Option<Arc<Raise>>,
    /// The largest request sent since nothing was outstanding: what a
    /// request the server ended without saying what was left is taken to
    /// have asked for.
    largest_sent: usize,
    /// The pin the server gave this consumer's requests (`Nats-Pin-Id`),
    /// while this host holds it.
    pin: SharedPin,
    /// When the latest request went out.
    last_request: tokio::time::Instant,
    /// Messages asked for and neither received nor given up by the server.
    outstanding: usize,
    buffered: Arc<AtomicUsize>,
    taken: Arc<Notify>,
    /// No request goes out before this (see [`REFUSED_PAUSE`]).
    not_before: tokio::time::Instant,
    /// Told of every word from the server and every request.
    liveness: Arc<Liveness>,
}

/// How long the next pull request waits after the server ended one early
/// (409: `Exceeded MaxWaiting`, `Leadership Change`, ...).
const REFUSED_PAUSE: Duration = Duration::from_millis(100);

impl Puller {
    /// Publishes one pull request, counted before it is sent.
    async fn request(&mut self) -> Result<(), PullError> {
        let size = self.size();
        let body = if size == self.settings.size.max(1) {
            self.request.clone()
        } else {
            request_body(self.settings, size, current(&self.pin).as_deref())
        };
        self.send(size, body).await
    }

    /// Messages per request now: the usual size, or the raised one.
    fn size(&self) -> usize {
        let usual = self.settings.size.max(1);
        self.raise.as_ref().map_or(usual, |r| r.size(usual))
    }

    /// Publishes a request for one message, so that the server hears from
    /// a pinned stream that has enough buffered (its pin would lapse).
    async fn keep_pin(&mut self) -> Result<(), PullError> {
        let body = request_body(self.settings, 1, current(&self.pin).as_deref());
        self.send(1, body).await
    }

    /// Publishes `body`, a request for `size` messages, counted first.
    async fn send(&mut self, size: usize, body: bytes::Bytes) -> Result<(), PullError> {
        if self.outstanding == 0 {
            self.largest_sent = 0;
        }
        self.largest_sent = self.largest_sent.max(size);
        self.outstanding += size;
        self.client
            .publish_with_reply(self.subject.clone(), self.inbox.clone(), body)
            .await
            .map_err(|e| {
                self.outstanding = self.outstanding.saturating_sub(size);
                PullError::Other(format!("cannot send a pull request: {e}"))
            })?;
        self.last_request = tokio::time::Instant::now();
        self.liveness.waiting();
        Ok(())
    }

    /// Takes `pin` (or none) as this stream's pin: later requests name it.
    fn set_pin(&mut self, pin: Option<String>) {
        self.request = request_body(self.settings, self.settings.size, pin.as_deref());
        *self
            .pin
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = pin;
    }

    /// Whether at most half a request is buffered or still to come.
    fn wants_more(&self) -> bool {
        self.outstanding + self.buffered.load(Relaxed) <= self.size() / 2
    }

    /// Receives until an error ends the stream or the receiver is dropped.
    async fn run(
        mut self,
        mut subscriber: Subscriber,
        tx: mpsc::UnboundedSender<Result<Held, PullError>>,
    ) {
        let silence = self.settings.heartbeat * 2;
        let mut heard = tokio::time::Instant::now();
        loop {
            let held_back = tokio::time::Instant::now() < self.not_before;
            if self.wants_more() && !held_back {
                if let Err(e) = self.request().await {
                    let _ = tx.send(Err(e));
                    return;
                }
                // The silence that means a lost request counts from the
                // latest request (none may have been out for long).
                heard = tokio::time::Instant::now();
            }
            let waiting = self.outstanding > 0;
            let keep_pin_at = self.last_request + self.settings.expires;
            let msg = tokio::select! {
                msg = subscriber.next() => msg,
                () = tokio::time::sleep_until(keep_pin_at), if self.settings.pinned && !held_back && current(&self.pin).is_some() => {
                    if let Err(e) = self.keep_pin().await {
                        let _ = tx.send(Err(e));
                        return;
                    }
                    continue;
                }
                () = self.taken.notified() => continue,
                () = tokio::time::sleep_until(self.not_before), if held_back => continue,
                () = tokio::time::sleep_until(heard + silence), if waiting => {
                    heard = tokio::time::Instant::now();
                    if self.client.connection_state() != async_nats::connection::State::Connected {
                        // Nothing can come while the client reconnects, and
                        // a request sent now would wait in the client and go
                        // out with the others on reconnect: wait.
                        continue;
                    }
                    // The server holds none of our requests any more (it
                    // restarted, lost them, or their answers were lost): ask
                    // again.
                    self.outstanding = 0;
                    if tx.send(Err(PullError::MissingHeartbeat)).is_err() {
                        return;
                    }
                    continue;
                }
            };
            let Some(msg) = msg else {
                let _ = tx.send(Err(PullError::Other("the pull inbox closed".into())));
                return;
            };
            heard = tokio::time::Instant::now();
            // Buffered or on the way when it came: the same sum after it.
            let in_flight = self.outstanding + self.buffered.load(Relaxed);
            match self.answer(msg) {
                Ok(Some(msg)) => {
                    let hold = self
                        .raise
                        .as_ref()
                        .and_then(|r| r.hold(&msg, self.settings.size.max(1), in_flight));
                    self.buffered.fetch_add(1, Relaxed);
                    if tx.send(Ok((msg, hold))).is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    }

    /// What one message on the inbox means, with the count brought up to
    /// date: a delivery, nothing for the consumer (a heartbeat, a request
    /// ended), or the end of the stream.
    fn answer(
        &mut self,
        msg: async_nats::Message,
    ) -> Result<Option<jetstream::Message>, PullError> {
        self.liveness.heard();
        match msg.status {
            None | Some(StatusCode::OK) => {
                self.outstanding = self.outstanding.saturating_sub(1);
                if self.settings.pinned {
                    let pin = msg
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("Nats-Pin-Id"))
                        .map(|v| v.as_str().to_string());
                    if pin.is_some() && pin != current(&self.pin) {
                        tracing::info!(subject = %self.subject, "this host is now pinned for the consumer (JetStream serves it alone until it stops pulling)");
                        self.set_pin(pin);
                        // The server serves the request it pinned, and no
                        // other of ours without the pin (they wait out their
                        // expiry): count them off so that the next request,
                        // with the pin, goes out at once.
                        self.outstanding = 0;
                    }
                }
                if self.outstanding == 0 {
                    self.liveness.satisfied();
                }
                Ok(Some(jetstream::Message {
                    message: msg,
                    context: self.context.clone(),
                }))
            }
            Some(StatusCode::IDLE_HEARTBEAT) => Ok(None),
            Some(StatusCode::PIN_ID_MISMATCH) => {
                // The pin moved to another host: ask again without it, as
                // a standby.
                tracing::info!(subject = %self.subject, "another host is pinned for the consumer now (423); this one waits as a standby");
                self.set_pin(None);
                self.settle_ended(&msg);
                Ok(None)
            }
            Some(StatusCode::TIMEOUT | StatusCode::REQUEST_TERMINATED) => {
                let description = msg.description.clone().unwrap_or_default();
                match description.as_str() {
                    "Consumer Deleted" => return Err(PullError::ConsumerDeleted),
                    d if d == "Consumer is push based" || d.starts_with("Exceeded MaxRequest") => {
                        return Err(PullError::Refused(description));
                    }
                    _ => {}
                }
                if msg.status == Some(StatusCode::REQUEST_TERMINATED) {
                    // Ended early (too many waiting requests, a leader
                    // change): the next request waits a little, so a
                    // refusal that repeats is not a busy loop.
                    self.not_before = tokio::time::Instant::now() + REFUSED_PAUSE;
                    if description == "Leadership Change" {
                        // The consumer's leader stepped down: its requests
                        // end here, and the next goes to the new leader.
                        tracing::info!(subject = %self.subject, "the consumer's leader changed (409 Leadership Change); pulling from the new leader");
                    } else {
                        tracing::debug!(subject = %self.subject, reason = %crate::log_format::escape(&description), "the server ended a pull request early (409); pulling again");
                    }
                }
                self.settle_ended(&msg);
                Ok(None)
            }
            Some(StatusCode::NO_RESPONDERS) => Err(PullError::NoResponders),
            Some(status) => Err(PullError::Other(format!(
                "unexpected status {status} on the pull inbox: {}",
                msg.description.unwrap_or_default()
            ))),
        }
    }

    /// Takes off the count what was left of a request the server ended
    /// (`Nats-Pending-Messages`; when it does not say, the largest request
    /// that may be out: counting too little makes the next request go out
    /// early, and with a [`Raise`] what it brings beyond the usual bound
    /// is held, where counting too much would ask for nothing until the
    /// silence is noticed).
    fn settle_ended(&mut self, msg: &async_nats::Message) {
        let left = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Pending-Messages"))
            .and_then(|v| v.as_str().parse().ok())
            .unwrap_or(self.largest_sent.max(1));
        self.outstanding = self.outstanding.saturating_sub(left);
        if self.outstanding == 0 {
            self.liveness.satisfied();
        }
    }
}
