//! One handler's consuming loop: pulls, takes a concurrency slot, fills a
//! batch, and runs each delivery (or batch) in a task of its own; at stop,
//! [`shutdown::wind_down`].

use super::shutdown::{self, InFlight};
use crate::broker::{self, Deliveries};
use crate::pipeline::Pipeline;
use crate::pipeline::db_gate::DbGate;
use async_nats::jetstream::Message;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// One handler's consuming loop: up to `concurrency` messages in flight,
/// each running the whole protocol in its own task. Fetches nothing while the
/// database is down (the open pull request is dropped, see
/// [`Deliveries::pause`]). Says it consumes through `stopping.ready` once
/// its pull request is out. At stop, [`shutdown::wind_down`].
pub(super) async fn consume(
    pipeline: Arc<Pipeline>,
    mut deliveries: Deliveries,
    gate: Arc<DbGate>,
    stop: CancellationToken,
    consuming: Arc<AtomicBool>,
    lost: Lost,
    stopping: Stopping,
) {
    consuming.store(true, Relaxed);
    let slots = Arc::new(tokio::sync::Semaphore::new(
        pipeline.config().concurrency.max(1),
    ));
    let mut in_flight = InFlight::default();
    let (batch, linger) = (
        pipeline.config().batch.most(),
        pipeline
            .config()
            .batch
            .linger(pipeline.config().batch_linger),
    );
    // Unbatched, the pull size is raised while copies arrive, so that one
    // lookup takes more of them (ARCHITECTURE.md, "Duplicates found before
    // the transaction"); what the pull stream buffers beyond its usual size
    // meanwhile is held in progress.
    let raise = (batch == 1).then(|| {
        let raise = pipeline.raise();
        deliveries.raise_with(raise.clone());
        raise
    });
    let mut ready = Some(stopping.ready);
    if deliveries.open().await.is_ok()
        && let Some(ready) = ready.take()
    {
        let _ = ready.send(());
    }
    // Deliveries a receipt lookup found new, taken from the pull stream
    // with a likely copy (ARCHITECTURE.md, "Duplicates found before the
    // transaction"), each kept in progress while it waits: they run before
    // the next pull.
    let mut looked_up: VecDeque<(Message, broker::InProgress)> = VecDeque::new();
    loop {
        let slot = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            slot = slots.clone().acquire_owned() => slot,
        };
        let Ok(slot) = slot else { break };
        if !gate.is_up() {
            // What the loop took from the pull stays kept in progress, as
            // a delivery held through an outage is: it runs when the
            // database is back, with no delivery spent.
            deliveries.pause();
            if !gate.ready().await {
                break;
            }
        }
        if let Some(raise) = &raise {
            raise.set(pipeline.raised_pull_size());
            raise.keep_arrivals(!looked_up.is_empty());
        }
        // Whether `msgs` is one delivery a lookup has found new.
        let mut from_lookup = !looked_up.is_empty();
        let mut msgs = if let Some((msg, _kept)) = looked_up.pop_front() {
            vec![msg]
        } else {
            let msg = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                m = deliveries.next() => m,
            };
            match msg {
                Ok(msg) => vec![msg],
                Err(e) => {
                    lost.consumer_gone(pipeline.name(), e);
                    break;
                }
            }
        };
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        if batch > 1 {
            // A stop while the batch fills ends the filling: what was taken
            // runs (or is given back by the wind-down).
            tokio::select! {
                biased;
                () = stop.cancelled() => {}
                () = deliveries.fill(&mut msgs, batch, linger) => {}
            }
        } else if !from_lookup && pipeline.likely_duplicate(&msgs[0]) {
            // Likely a copy: one lookup for it and what its pull stream has
            // buffered; the copies are acked together, the rest run one by
            // one before the next pull.
            // One size for the fill and the pull stream; and what arrives
            // from here until the next pass sets the raise again is held,
            // as it may wait behind what the lookup finds new.
            let size = pipeline.lookup_size();
            if let Some(raise) = &raise {
                raise.set(Some(size));
                raise.keep_arrivals(true);
            }
            deliveries.fill(&mut msgs, size, Duration::ZERO).await;
            let (copies, rest) = pipeline.split_duplicates(std::mem::take(&mut msgs)).await;
            if !copies.is_empty() {
                let p = pipeline.clone();
                let unsettled = crate::pipeline::Unsettled::new(
                    copies.iter().map(|(m, _)| m.clone()).collect(),
                );
                let settling = unsettled.clone();
                in_flight.spawn(unsettled, async move {
                    p.ack_duplicates(&copies, &settling).await;
                });
            }
            looked_up.extend(rest.into_iter().map(|m| {
                let kept = pipeline.keep_in_progress(&m);
                (m, kept)
            }));
            match looked_up.pop_front() {
                Some((msg, _kept)) => msgs.push(msg),
                None => continue,
            }
            from_lookup = true;
        }
        let p = pipeline.clone();
        let unsettled = crate::pipeline::Unsettled::new(msgs.clone());
        let settling = unsettled.clone();
        in_flight.spawn(unsettled, async move {
            match msgs.as_slice() {
                // The slot is given back once only the ack is left.
                [msg] => drop(p.process_in_slot(msg, from_lookup, Some(slot)).await),
                msgs => {
                    p.process_batch(msgs, &settling).await;
                    drop(slot);
                }
            }
        });
        in_flight.reap(pipeline.name());
    }
    shutdown::wind_down(
        pipeline.name(),
        &mut deliveries,
        looked_up.into_iter().map(|(m, _)| m).collect(),
        in_flight,
        stopping.grace,
    )
    .await;
}

/// What a handler's consuming loop needs for its start and stop: the
/// shutdown grace, and where to say it consumes.
pub(super) struct Stopping {
    pub(super) grace: Duration,
    pub(super) ready: tokio::sync::oneshot::Sender<()>,
}

/// How a handler's consuming loop stops the whole host when its consumer is
/// lost for good ([`broker::ConsumerLost`]).
pub(super) struct Lost {
    pub(super) stop: CancellationToken,
    pub(super) failure: Arc<std::sync::OnceLock<String>>,
}

impl Lost {
    /// `handler`'s consumer is gone for good: says so, and stops the host.
    pub(super) fn consumer_gone(&self, handler: &str, e: broker::ConsumerLost) {
        tracing::error!(%handler, error = %e, "stopping the host: the durable consumer is gone and cannot be created again");
        let _ = self.failure.set(e.0);
        self.stop.cancel();
    }
}
