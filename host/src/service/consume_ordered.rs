//! One handler's consuming loop with key lanes (`order_key`; ARCHITECTURE.md,
//! "Key lanes"): every delivery goes through [`KeyLanes`], which says when
//! it may run; up to `concurrency` run at once, each in a task of its own
//! that reports how it ended. A message a lane lets go waits in the loop's
//! ready queue for a slot, served before anything new is fetched. Messages
//! waiting (in a lane or the ready queue) are kept in progress (`+WPI`,
//! every third of `ack_wait`) so that waiting spends no delivery. At stop
//! ([`stop_in_order`]) nothing is given back until the deliveries in
//! flight ended; then everything is given back in stream order, what lies
//! past a message its lane waits for with a delay, so the next host gets
//! each key's messages in order. A loop that starts, or is given a
//! partition, while deliveries of its consumer are out (a host before it
//! died holding them, or gave them back with a delay) holds everything
//! later until they are back ([`fence`]).

use super::consume::{Lost, Stopping};
use super::key_lanes::{Ended, KeyLanes};
use super::shutdown::{self, InFlight};
use crate::broker::{self, Deliveries, Out, Settlement};
use crate::config::OrderKey;
use crate::pipeline::db_gate::DbGate;
use crate::pipeline::{Outcome, Pipeline, Unsettled};
use async_nats::jetstream::Message;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// How long past its redelivery's due time a lane waits for a message it
/// gave back before the key's later messages run without it (it went to
/// another host, or its consumer was made again).
const COME_BACK_MARGIN: Duration = Duration::from_secs(5);

/// How a finished run is reported to the loop: key, stream sequence, end.
type Done = (String, u64, Ended);

/// Where a loop reads each message's ordering key.
#[derive(Debug, Clone)]
pub(super) struct KeyRule {
    /// The handler's `order_key`.
    pub(super) order_key: OrderKey,
    /// The handler has `partitions`: a stored subject starts with the
    /// partition number, which `subject:N` does not count.
    pub(super) partitioned: bool,
}

/// The key and stream sequence of `msg` by `rule`; `None` when it has no
/// key (or is not a JetStream delivery): it runs unordered.
fn key_of(rule: &KeyRule, msg: &Message) -> Option<(String, u64)> {
    let subject = if rule.partitioned {
        crate::broker::partition::published_subject(msg.subject.as_str())
    } else {
        msg.subject.as_str()
    };
    let key = crate::pipeline::message_id::order_key(
        &rule.order_key,
        subject,
        msg.headers.as_ref(),
        &msg.payload,
    )?;
    Some((key, msg.info().ok()?.stream_sequence))
}

/// The pin JetStream marked `msg` with (`Nats-Pin-Id`: a partition's
/// consumer, served to this host alone).
fn pin_of(msg: &Message) -> Option<&str> {
    msg.headers
        .as_ref()
        .and_then(|h| h.get("Nats-Pin-Id"))
        .map(|v| v.as_str())
}

/// [`super::consume::consume`] with key lanes: `rule` reads each message's
/// ordering key.
#[allow(clippy::too_many_arguments)]
pub(super) async fn consume_ordered(
    pipeline: Arc<Pipeline>,
    mut deliveries: Deliveries,
    gate: Arc<DbGate>,
    stop: CancellationToken,
    consuming: Arc<AtomicBool>,
    lost: Lost,
    stopping: Stopping,
    rule: KeyRule,
) {
    let slots = Arc::new(Semaphore::new(pipeline.config().concurrency.max(1)));
    let mut in_flight = InFlight::default();
    let mut lanes: KeyLanes<Message> = KeyLanes::default();
    // Let go by their lanes, each holding its lane's turn, waiting for a slot.
    let mut ready: VecDeque<(Message, Option<String>)> = VecDeque::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let keep_alive_every = (pipeline.config().ack_wait / 3).max(Duration::from_millis(100));
    let mut keep_alive = tokio::time::interval(keep_alive_every);
    keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let run = Runner {
        pipeline: pipeline.clone(),
        done: done_tx,
    };
    let mut started = Some(stopping.ready);
    // What was out when this loop began: read before the first pull, so a
    // message first delivered to this loop lies past it.
    let out_at_start = deliveries.out().await;
    match out_at_start {
        Ok(out) if out.pending == 0 => {}
        // A partition's loop fences when JetStream pins it (below): until
        // then it stands by, and what is out is the pinned host's.
        _ if rule.partitioned => {}
        // Not known: fenced as if the most were out, up to the bound.
        out => {
            let out = out.unwrap_or(UNKNOWN);
            let first = fence(
                &pipeline,
                &mut deliveries,
                &stop,
                Vec::new(),
                out,
                Own::default(),
            )
            .await;
            admit_sorted(&rule, &mut lanes, &mut ready, first);
        }
    }
    // Ready (`/readyz`, "every handler is consuming") once past the fence.
    consuming.store(true, Relaxed);
    if !stop.is_cancelled()
        && deliveries.open().await.is_ok()
        && let Some(started) = started.take()
    {
        let _ = started.send(());
    }
    // The pin JetStream serves this partition's consumer to this host
    // under (partitions only).
    let mut pin: Option<String> = None;
    let mut permit: Option<OwnedSemaphorePermit> = None;
    let mut keeper = Keeper::default();
    // Since when the database has been down (the pull paused).
    let mut down_since: Option<Instant> = None;
    loop {
        in_flight.reap(pipeline.name());
        if permit.is_some()
            && let Some((msg, key)) = ready.pop_front()
        {
            run.spawn(&mut in_flight, msg, key, permit.take());
            continue;
        }
        if !gate.is_up() && down_since.is_none() {
            deliveries.pause();
            down_since = Some(Instant::now());
        }
        let block_ends = lanes.next_deadline();
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            Some((key, seq, ended)) = done_rx.recv() => {
                if let Some(next) = lanes.ended(&key, seq, ended) {
                    ready.push_back((next, Some(key)));
                }
            }
            up = gate.ready(), if down_since.is_some() => {
                if !up {
                    break;
                }
                // Nothing could come back while the pull was paused.
                if let Some(since) = down_since.take() {
                    lanes.delay_deadlines(since.elapsed());
                }
            }
            () = sleep_until(block_ends), if block_ends.is_some() && down_since.is_none() => {
                for (key, seq, next) in lanes.expire(Instant::now()) {
                    tracing::warn!(handler = %pipeline.name(), key = %crate::log_format::escape(&key), stream_sequence = seq, "a message given back did not come back to this host in time; the key's later messages run without it (another host may have run it)");
                    if let Some(next) = next {
                        ready.push_back((next, Some(key)));
                    }
                }
            }
            _ = keep_alive.tick() => {
                keeper.round(lanes.held().chain(ready.iter().map(|(m, _)| m)).cloned().collect());
            }
            p = slots.clone().acquire_owned(), if permit.is_none() => {
                let Ok(p) = p else { break };
                permit = Some(p);
            }
            msg = deliveries.next(), if permit.is_some() && ready.is_empty() && down_since.is_none() => {
                let msg = match msg {
                    Ok(msg) => msg,
                    Err(e) => {
                        lost.consumer_gone(pipeline.name(), e);
                        break;
                    }
                };
                if let Some(started) = started.take() {
                    let _ = started.send(());
                }
                if let Some(now) = pin_of(&msg)
                    && pin.as_deref() != Some(now)
                {
                    // A partition just given to this host: what the host
                    // before held comes back first (priority_timeout is
                    // past its ack_wait), perhaps in several sets: gathered
                    // and admitted in stream order, as at a start.
                    pin = Some(now.to_string());
                    in_flight.reap(pipeline.name());
                    // What this loop holds is out too, and is its own:
                    // counted off, and kept in progress during the fence.
                    let held: Vec<Message> = lanes.held().chain(ready.iter().map(|(m, _)| m)).cloned().collect();
                    let own = Own { count: held.len() + in_flight.len(), held };
                    let out = deliveries.out().await.unwrap_or_else(|e| {
                        tracing::warn!(handler = %pipeline.name(), error = %e, "key lanes: cannot read what of the partition is out; holding later messages for the longest a delivery can take to come back");
                        UNKNOWN
                    });
                    let first = fence(&pipeline, &mut deliveries, &stop, vec![msg], out, own).await;
                    admit_sorted(&rule, &mut lanes, &mut ready, first);
                    continue;
                }
                match key_of(&rule, &msg) {
                    Some((key, seq)) => {
                        // Else it waits in its lane, and the slot stays free.
                        if let Some(now) = lanes.arrived(&key, seq, msg) {
                            run.spawn(&mut in_flight, now, Some(key), permit.take());
                        }
                    }
                    None => run.spawn(&mut in_flight, msg, None, permit.take()),
                }
            }
        }
    }
    drop(permit);
    keeper.stop().await;
    stop_in_order(
        &pipeline,
        &rule,
        &mut deliveries,
        in_flight,
        lanes,
        ready,
        done_rx,
        stopping.grace,
    )
    .await;
}

/// Most messages gathered by a [`fence`]: the consumers' `max_ack_pending`,
/// all that can be out.
const TAKEOVER_GATHER: usize = 1000;

/// What a [`fence`] assumes when the consumer info cannot be read: the
/// most that can be out, any sequence; it then waits its whole bound.
const UNKNOWN: Out = Out {
    pending: TAKEOVER_GATHER,
    last_delivered: u64::MAX,
};

/// What a loop already holds when it fences: out too, but its own.
#[derive(Default)]
struct Own {
    /// How many: waiting in its lanes or ready queue, or running.
    count: usize,
    /// Those waiting, kept in progress during the fence.
    held: Vec<Message>,
}

/// `first` and what else arrives within `linger`, up to `max` in all (or
/// until `stop`).
async fn gather(
    deliveries: &mut Deliveries,
    stop: &CancellationToken,
    mut first: Vec<Message>,
    max: usize,
    linger: Duration,
) -> Vec<Message> {
    tokio::select! {
        biased;
        () = stop.cancelled() => {}
        () = deliveries.fill(&mut first, max, linger) => {}
    }
    first
}

/// The deliveries that were `out` when this loop began to serve the
/// consumer (at its start, or when JetStream pinned it for a partition),
/// gathered before anything later is admitted: `first` and what arrives,
/// until as many distinct messages at or below `out.last_delivered` are
/// here as were out, less the count in `own` (what the loop already
/// holds; its messages are kept in progress meanwhile), or until
/// [`fence_bound`] has passed (or `stop`). Messages first delivered after
/// `out` was read lie past `out.last_delivered`; they are gathered too and
/// wait, kept in progress. Counting, not a fixed wait: a message given
/// back with a nak delay (behind a retried one of its key) or held by a
/// host that died comes back when it comes back, and a later message of
/// its key must not run before it. Pulls through [`Deliveries::next`], so
/// a pull that failed is opened again.
async fn fence(
    pipeline: &Pipeline,
    deliveries: &mut Deliveries,
    stop: &CancellationToken,
    mut first: Vec<Message>,
    out: Out,
    own: Own,
) -> Vec<Message> {
    let need = out.pending.saturating_sub(own.count);
    // What is already buffered counts at once.
    first = gather(deliveries, stop, first, TAKEOVER_GATHER, Duration::ZERO).await;
    // Distinct stream sequences at or below `last_delivered` gathered so
    // far, counted as they arrive.
    let mut back = std::collections::HashSet::new();
    count_back(&first, out.last_delivered, &mut back);
    if back.len() >= need {
        return first;
    }
    let bound = fence_bound(pipeline.config());
    let missing = need - back.len();
    tracing::info!(handler = %pipeline.name(), missing, "key lanes: {missing} deliveries of the consumer are out and not acked (another host has them, or had them); later messages wait until they are back, {} at most", humantime::format_duration(bound));
    let until = Instant::now() + bound;
    let every = (pipeline.config().ack_wait / 3).max(Duration::from_millis(100));
    let mut kept = Instant::now();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let missing = need - back.len();
            tracing::warn!(handler = %pipeline.name(), missing, "key lanes: {missing} deliveries out did not come back within {}; a later message of their keys may run before them (with `refuse_out_of_order` the earlier one is dead-lettered when it comes)", humantime::format_duration(bound));
            break;
        }
        let wait = left.min(every.saturating_sub(kept.elapsed()));
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            next = tokio::time::timeout(wait, deliveries.next()), if first.len() < TAKEOVER_GATHER => {
                match next {
                    Ok(Ok(msg)) => {
                        let counted = first.len();
                        first.push(msg);
                        first = gather(deliveries, stop, first, TAKEOVER_GATHER, Duration::ZERO).await;
                        count_back(&first[counted..], out.last_delivered, &mut back);
                    }
                    // Gone: the loop's next pull says so.
                    Ok(Err(_)) => break,
                    Err(_) => {}
                }
            }
            () = tokio::time::sleep(wait), if first.len() >= TAKEOVER_GATHER => {}
        }
        if back.len() >= need {
            break;
        }
        if kept.elapsed() >= every {
            kept = Instant::now();
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = async {
                    keep_in_progress(&first).await;
                    keep_in_progress(&own.held).await;
                } => {}
            }
        }
    }
    first
}

/// Adds to `back` the stream sequences of `msgs` at or below `last`.
fn count_back(msgs: &[Message], last: u64, back: &mut std::collections::HashSet<u64>) {
    back.extend(
        msgs.iter()
            .filter_map(|m| m.info().ok().map(|i| i.stream_sequence))
            .filter(|&s| s <= last),
    );
}

/// The longest a delivery out can take to come back: given back at a
/// stop with a nak delay until its lane's block ends (the longest nak
/// delay, `ack_wait` and [`COME_BACK_MARGIN`] after the retry), or held
/// by a host that died (`ack_wait` after its last in-progress), plus one
/// more `ack_wait` for the broker's redelivery timer and the pull.
fn fence_bound(config: &crate::config::HandlerConfig) -> Duration {
    config.longest_nak_delay() + config.ack_wait * 2 + COME_BACK_MARGIN
}

/// Admits `batch` to the lanes in stream order; what may run now goes to
/// `ready`.
fn admit_sorted(
    rule: &KeyRule,
    lanes: &mut KeyLanes<Message>,
    ready: &mut VecDeque<(Message, Option<String>)>,
    mut batch: Vec<Message>,
) {
    batch.sort_by_key(|m| m.info().map_or(u64::MAX, |i| i.stream_sequence));
    for msg in batch {
        match key_of(rule, &msg) {
            Some((key, seq)) => {
                if let Some(now) = lanes.arrived(&key, seq, msg) {
                    ready.push_back((now, Some(key)));
                }
            }
            None => ready.push_back((msg, None)),
        }
    }
}

/// Sends `+WPI` for each of `waiting`, each send bounded by a second.
async fn keep_in_progress(waiting: &[Message]) {
    for msg in waiting {
        let _ = tokio::time::timeout(Duration::from_secs(1), broker::in_progress(msg)).await;
    }
}

/// The task sending the loop's keep-alives: one at a time, so a slow broker
/// connection neither holds up the loop nor piles tasks up.
#[derive(Default)]
struct Keeper(Option<tokio::task::JoinHandle<()>>);

impl Keeper {
    /// Starts a round for `waiting` unless the last one is still going.
    fn round(&mut self, waiting: Vec<Message>) {
        if waiting.is_empty() || self.0.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        self.0 = Some(tokio::spawn(
            async move { keep_in_progress(&waiting).await },
        ));
    }

    /// Stops the round going, if any, and waits until it has stopped (a
    /// `+WPI` after a message's nak would restart its redelivery timer).
    async fn stop(self) {
        if let Some(t) = self.0 {
            t.abort();
            let _ = t.await;
        }
    }
}

/// The stop of a loop with key lanes: fetching stops; the deliveries in
/// flight get `grace` to end (the waiting ones kept in progress
/// meanwhile); what they reported is recorded in the lanes; then
/// everything not run (waiting in a lane or the ready queue, fetched,
/// abandoned) is given back in stream order. What lies past a message its
/// lane waits for goes back with a nak delay until that block's deadline,
/// so it cannot reach the next host before the message it follows; the rest
/// at once. A nak without delay queues the message for redelivery in the
/// order the naks arrive (nats-server `consumer.go`: `addToRedeliverQueue`
/// appends, `getNextToRedeliver` takes the first), ahead of new messages.
#[allow(clippy::too_many_arguments)]
async fn stop_in_order(
    pipeline: &Pipeline,
    rule: &KeyRule,
    deliveries: &mut Deliveries,
    in_flight: InFlight,
    mut lanes: KeyLanes<Message>,
    ready: VecDeque<(Message, Option<String>)>,
    mut done_rx: mpsc::UnboundedReceiver<Done>,
    grace: Duration,
) {
    let handler = pipeline.name();
    let mut back: Vec<(Message, Duration)> = Vec::new();
    let fetched = deliveries.release_buffered();
    let released = fetched.len() + ready.len();
    for msg in fetched {
        match key_of(rule, &msg) {
            Some((key, seq)) => lanes.hold(&key, seq, msg),
            None => back.push((msg, Duration::ZERO)),
        }
    }
    for (msg, key) in ready {
        match (key, msg.info().map(|i| i.stream_sequence)) {
            (Some(key), Ok(seq)) => lanes.put_back(&key, seq, msg),
            _ => back.push((msg, Duration::ZERO)),
        }
    }
    let waiting: Vec<Message> = lanes
        .held()
        .chain(back.iter().map(|(m, _)| m))
        .cloned()
        .collect();
    let every = (pipeline.config().ack_wait / 3).max(Duration::from_millis(100));
    let keeping = Keeper(Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            keep_in_progress(&waiting).await;
        }
    })));
    let abandoned = shutdown::finish_within(handler, in_flight, grace, released).await;
    keeping.stop().await;
    while let Ok((key, seq, ended)) = done_rx.try_recv() {
        lanes.record_end(&key, seq, ended);
    }
    for msg in abandoned {
        // Given back now, ahead of what follows it in its lane.
        match key_of(rule, &msg) {
            Some((key, seq)) => lanes.hold(&key, seq, msg),
            None => back.push((msg, Duration::ZERO)),
        }
    }
    back.extend(lanes.take_held(Instant::now()));
    back.sort_by_key(|(m, _)| m.info().map_or(u64::MAX, |i| i.stream_sequence));
    let delayed = back.iter().filter(|(_, d)| !d.is_zero()).count();
    // The next host's fence waits for every delivery out up to its
    // bound; a longer delay (a block deadline moved on by a database
    // outage) would come back after it. Within the cap the order holds:
    // the fence sorts what comes back.
    let cap = fence_bound(pipeline.config()).saturating_sub(pipeline.config().ack_wait);
    for (msg, delay) in &back {
        let settlement = if delay.is_zero() {
            Settlement::Release
        } else {
            Settlement::Nak((*delay).min(cap))
        };
        if let Err(e) = broker::settle(msg, settlement).await {
            tracing::warn!(%handler, error = %e, "cannot give a message back; it is redelivered after ack_wait");
        }
    }
    if !back.is_empty() {
        tracing::info!(%handler, given_back = back.len(), delayed, "stopped: {} messages not run given back in stream order ({delayed} after the message their key waits for)", back.len());
    }
}

/// `sleep_until(at)`, or pending for ever when `at` is `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Starts runs: each in its own task, holding a concurrency slot, telling
/// the loop how it ended.
struct Runner {
    pipeline: Arc<Pipeline>,
    done: mpsc::UnboundedSender<Done>,
}

/// Tells the loop how a run of a keyed message ended; when dropped without
/// having told (the task panicked, or was dropped at the end of the
/// grace), tells it the message is due again after `ack_wait`, so its lane
/// waits for it a while and then goes on instead of waiting for ever.
struct Report {
    to: mpsc::UnboundedSender<Done>,
    key: String,
    seq: u64,
    unsettled_after: Duration,
    told: bool,
}

impl Report {
    fn tell(mut self, ended: Ended) {
        self.told = true;
        let _ = self
            .to
            .send((std::mem::take(&mut self.key), self.seq, ended));
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        if !self.told {
            let deadline = Instant::now() + self.unsettled_after;
            let _ = self.to.send((
                std::mem::take(&mut self.key),
                self.seq,
                Ended::Again { deadline },
            ));
        }
    }
}

impl Runner {
    /// Runs `msg` (of `key`, if it has one) in a task of its own holding
    /// `permit` (a slot of the handler's `concurrency`).
    fn spawn(
        &self,
        in_flight: &mut InFlight,
        msg: Message,
        key: Option<String>,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let p = self.pipeline.clone();
        let config = p.config();
        let report = match (key, msg.info()) {
            (Some(key), Ok(info)) => Some(Report {
                to: self.done.clone(),
                key,
                seq: info.stream_sequence,
                unsettled_after: config.ack_wait * 2 + COME_BACK_MARGIN,
                told: false,
            }),
            _ => None,
        };
        let unsettled = Unsettled::new(vec![msg.clone()]);
        in_flight.spawn(unsettled, async move {
            let _slot = permit;
            let outcome = p.process(&msg).await;
            if let (Some(report), Ok(info)) = (report, msg.info()) {
                report.tell(ended_as(&outcome, p.config(), info.delivered));
            }
        });
    }
}

/// What `outcome` means for the message's lane: settled for good, or given
/// back and due again (after the nak delay of its `delivered`-th delivery,
/// or after `ack_wait` when left unsettled), waited for until then plus
/// `ack_wait` and [`COME_BACK_MARGIN`].
fn ended_as(outcome: &Outcome, config: &crate::config::HandlerConfig, delivered: i64) -> Ended {
    let due = match outcome {
        Outcome::Processed | Outcome::Duplicate | Outcome::DeadLettered(_) => {
            return Ended::Settled;
        }
        Outcome::Retried(_) | Outcome::StoreFailed(_) => {
            config.nak_delay(u64::try_from(delivered).unwrap_or(1))
        }
        Outcome::Unsettled(_) => config.ack_wait,
    };
    Ended::Again {
        deadline: Instant::now() + due + config.ack_wait + COME_BACK_MARGIN,
    }
}
