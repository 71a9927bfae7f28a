//! One handler's consuming loop with key lanes (`order_key`; ARCHITECTURE.md,
//! "Key lanes"): every delivery goes through [`KeyLanes`], which says when
//! it may run; up to `concurrency` run at once, each in a task of its own
//! that reports how it ended. Messages waiting in a lane are kept in
//! progress (`+WPI`, every third of `ack_wait`) so that waiting does not
//! count as deliveries; at stop, once the deliveries in flight ended, they
//! are given back with the fetched and the abandoned ones in stream order
//! ([`shutdown::wind_down_as`]), so the next host gets them in that order.
//! A host that starts while deliveries are out (a host before it died
//! holding them) first lets them come back ([`start_fence`]).

use super::consume::{Lost, Stopping};
use super::key_lanes::{Ended, KeyLanes};
use super::shutdown::{self, GiveBack, InFlight};
use crate::broker::{self, Deliveries};
use crate::config::IdentityRule;
use crate::pipeline::db_gate::DbGate;
use crate::pipeline::{Outcome, Pipeline, Unsettled};
use async_nats::jetstream::Message;
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
    rule: IdentityRule,
) {
    consuming.store(true, Relaxed);
    let slots = Arc::new(Semaphore::new(pipeline.config().concurrency.max(1)));
    let mut in_flight = InFlight::default();
    let mut lanes: KeyLanes<Message> = KeyLanes::default();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut keep_alive =
        tokio::time::interval((pipeline.config().ack_wait / 3).max(Duration::from_millis(100)));
    keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let run = Runner {
        pipeline: pipeline.clone(),
        slots: slots.clone(),
        done: done_tx,
    };
    let mut ready = Some(stopping.ready);
    let Some(out) = start_fence(&pipeline, &mut deliveries, &stop).await else {
        shutdown::wind_down(pipeline.name(), &mut deliveries, in_flight, stopping.grace).await;
        return;
    };
    if deliveries.open().await.is_ok()
        && let Some(ready) = ready.take()
    {
        let _ = ready.send(());
    }
    if out > 0 {
        // What came back first is admitted in stream order, however the
        // broker's redeliveries were ordered among themselves.
        let mut first = Vec::new();
        tokio::select! {
            biased;
            () = stop.cancelled() => {}
            () = deliveries.fill(&mut first, out, GATHER_LINGER) => {}
        }
        first.sort_by_key(|m| m.info().map_or(u64::MAX, |i| i.stream_sequence));
        for msg in first {
            let key =
                crate::pipeline::message_id::extract(&rule, msg.headers.as_ref(), &msg.payload)
                    .ok();
            match (key, msg.info().map(|i| i.stream_sequence).ok()) {
                (Some(key), Some(seq)) => {
                    if let Some(now) = lanes.arrived(&key, seq, msg) {
                        run.spawn(&mut in_flight, now, Some(key), None);
                    }
                }
                _ => run.spawn(&mut in_flight, msg, None, None),
            }
        }
    }
    let mut permit: Option<OwnedSemaphorePermit> = None;
    loop {
        in_flight.reap(pipeline.name());
        if permit.is_some() && !gate.is_up() {
            deliveries.pause();
            if !gate.ready().await {
                break;
            }
        }
        let block_ends = lanes.next_deadline();
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            Some((key, seq, ended)) = done_rx.recv() => {
                if let Some(next) = lanes.ended(&key, seq, ended) {
                    run.spawn(&mut in_flight, next, Some(key), None);
                }
            }
            () = sleep_until(block_ends), if block_ends.is_some() => {
                for (key, seq, next) in lanes.expire(Instant::now()) {
                    tracing::warn!(handler = %pipeline.name(), key = %crate::log_format::escape(&key), stream_sequence = seq, "a message given back did not come back to this host in time; the key's later messages run without it (another host may have run it)");
                    if let Some(next) = next {
                        run.spawn(&mut in_flight, next, Some(key), None);
                    }
                }
            }
            _ = keep_alive.tick() => {
                for msg in lanes.held() {
                    let _ = broker::in_progress(msg).await;
                }
            }
            p = slots.clone().acquire_owned(), if permit.is_none() => {
                let Ok(p) = p else { break };
                permit = Some(p);
            }
            msg = deliveries.next(), if permit.is_some() => {
                let msg = match msg {
                    Ok(msg) => msg,
                    Err(e) => {
                        lost.consumer_gone(pipeline.name(), e);
                        break;
                    }
                };
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
                let key = crate::pipeline::message_id::extract(&rule, msg.headers.as_ref(), &msg.payload).ok();
                let seq = msg.info().map(|i| i.stream_sequence).ok();
                match (key, seq) {
                    (Some(key), Some(seq)) => {
                        if let Some(now) = lanes.arrived(&key, seq, msg) {
                            run.spawn(&mut in_flight, now, Some(key), permit.take());
                        } else {
                            // It waits in its lane: the slot stays free.
                            permit = None;
                        }
                    }
                    // No key (or not a JetStream delivery): unordered.
                    _ => run.spawn(&mut in_flight, msg, None, permit.take()),
                }
            }
        }
    }
    let held = lanes.take_held();
    if !held.is_empty() {
        tracing::info!(handler = %pipeline.name(), held = held.len(), "stopping: {} messages waiting in key lanes are given back once the deliveries in flight end", held.len());
    }
    shutdown::wind_down_as(
        pipeline.name(),
        &mut deliveries,
        in_flight,
        stopping.grace,
        GiveBack::InStreamOrder(held),
    )
    .await;
}

/// How long the first pull after a [`start_fence`] may take to bring back
/// the deliveries that were out, before the lanes take them in order.
const GATHER_LINGER: Duration = Duration::from_secs(2);

/// Before the first pull: when deliveries of the consumer are out and not
/// acked (a host that died held them, or another host runs them), waits
/// `ack_wait` and a second, so that those a dead host held are back in the
/// broker's redelivery queue, which it serves before any new message,
/// sorted by sequence (nats-server `consumer.go`, `checkPending`). Without
/// it, messages published after them would reach this host first and run
/// before them. Returns how many were out (0: none, nothing waited), or
/// `None` when the host stopped meanwhile.
async fn start_fence(
    pipeline: &Pipeline,
    deliveries: &mut Deliveries,
    stop: &CancellationToken,
) -> Option<usize> {
    let ack_wait = pipeline.config().ack_wait;
    let out = match deliveries.ack_pending().await {
        Ok(0) => return Some(0),
        Ok(n) => usize::try_from(n).unwrap_or(usize::MAX),
        // Not known: wait as if some were out.
        Err(_) => 1,
    };
    let wait = ack_wait + Duration::from_secs(1);
    tracing::info!(handler = %pipeline.name(), out, "key lanes: {out} deliveries of the consumer are out and not acked; waiting {} for them to come back first, so they run before later messages of their keys", humantime::format_duration(wait));
    tokio::select! {
        biased;
        () = stop.cancelled() => None,
        // No more can be out than the consumer's `max_ack_pending`.
        () = tokio::time::sleep(wait) => Some(out.min(usize::try_from(super::MAX_ACK_PENDING).unwrap_or(usize::MAX))),
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
    slots: Arc<Semaphore>,
    done: mpsc::UnboundedSender<Done>,
}

impl Runner {
    /// Runs `msg` (of `key`, if it has one) in a task of its own with
    /// `permit`, or with a slot it waits for.
    fn spawn(
        &self,
        in_flight: &mut InFlight,
        msg: Message,
        key: Option<String>,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let (p, slots, done) = (self.pipeline.clone(), self.slots.clone(), self.done.clone());
        let unsettled = Unsettled::new(vec![msg.clone()]);
        in_flight.spawn(unsettled, async move {
            let _slot = match permit {
                Some(permit) => permit,
                None => match slots.acquire_owned().await {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            let outcome = p.process(&msg).await;
            if let (Some(key), Ok(info)) = (key, msg.info()) {
                let ended = ended_as(&outcome, p.config(), info.delivered);
                let _ = done.send((key, info.stream_sequence, ended));
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
