//! How one handler's consuming loop stops (ARCHITECTURE.md, "Shutdown"):
//! the deliveries it runs ([`InFlight`]), and [`wind_down`], which gives
//! back what was fetched but not started, lets what runs finish within the
//! grace, and abandons the rest (rolled back, given back for another host).

use crate::broker::{self, Deliveries, Settlement};
use crate::pipeline::Unsettled;
use async_nats::jetstream::Message;
use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;
use tokio::task::{Id, JoinError, JoinSet};

/// The deliveries one handler is running, each (or each batch) in its own
/// task, with copies of its messages not yet settled so that an abandoned
/// one can be given back to the broker.
#[derive(Default)]
pub struct InFlight {
    tasks: JoinSet<()>,
    messages: HashMap<Id, Unsettled>,
}

impl InFlight {
    /// Runs `work` (the protocol for the deliveries in `unsettled`: one, or
    /// a batch) in a task of its own.
    pub fn spawn(&mut self, unsettled: Unsettled, work: impl Future<Output = ()> + Send + 'static) {
        let task = self.tasks.spawn(work);
        self.messages.insert(task.id(), unsettled);
    }

    /// Forgets the deliveries that have finished, without waiting; a task
    /// that failed (panicked) is logged: its message is redelivered after
    /// `ack_wait`.
    pub fn reap(&mut self, handler: &str) {
        while let Some(done) = self.tasks.try_join_next_with_id() {
            self.finished(handler, done);
        }
    }

    /// Deliveries still running.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// No delivery is running.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    fn finished(&mut self, handler: &str, done: Result<(Id, ()), JoinError>) {
        match done {
            Ok((id, ())) => {
                self.messages.remove(&id);
            }
            Err(e) if e.is_cancelled() => {
                // Abandoned: its message stays to be given back.
            }
            Err(e) => {
                self.messages.remove(&e.id());
                tracing::error!(%handler, error = %e, "a message task failed; its message is redelivered after ack_wait");
            }
        }
    }
}

/// Stops one handler's consuming: naks without delay the messages fetched
/// but never started (`taken`, those the loop took from the pull stream,
/// and those still buffered there, [`Deliveries::release_buffered`]:
/// never run, so neither retried nor dead-lettered, and not counted); waits up to `grace`
/// for the deliveries in flight to finish their protocol (commit and ack,
/// their in-progress keep-alive running); then abandons the rest: their
/// tasks are dropped, which drops their transactions (rolled back), and
/// their messages are naked without delay for another host. One log line at
/// each phase. Returns how many deliveries were abandoned.
pub async fn wind_down(
    handler: &str,
    deliveries: &mut Deliveries,
    taken: Vec<Message>,
    in_flight: InFlight,
    grace: Duration,
) -> usize {
    let mut released = taken;
    released.extend(deliveries.release_buffered());
    for msg in &released {
        give_back(handler, msg).await;
    }
    let unsettled = finish_within(handler, in_flight, grace, released.len()).await;
    for msg in &unsettled {
        give_back(handler, msg).await;
    }
    unsettled.len()
}

/// The middle of [`wind_down`]: waits up to `grace` for the deliveries in
/// flight, then abandons the rest (their tasks dropped, so their
/// transactions rolled back) and returns their messages not yet settled,
/// for the caller to give back. `released`: how many fetched messages were
/// not run (for the log line).
pub async fn finish_within(
    handler: &str,
    mut in_flight: InFlight,
    grace: Duration,
    released: usize,
) -> Vec<Message> {
    in_flight.reap(handler);
    tracing::info!(
        %handler,
        released,
        in_flight = in_flight.len(),
        "stopping: fetching stopped, {released} fetched messages given back, {} in flight, grace {}",
        in_flight.len(),
        humantime::format_duration(grace)
    );
    let deadline = tokio::time::Instant::now() + grace;
    while !in_flight.is_empty() {
        match tokio::time::timeout_at(deadline, in_flight.tasks.join_next_with_id()).await {
            Ok(Some(done)) => in_flight.finished(handler, done),
            Ok(None) | Err(_) => break,
        }
    }
    if in_flight.is_empty() {
        tracing::info!(%handler, "stopped: every delivery in flight finished");
        return Vec::new();
    }
    in_flight.tasks.abort_all();
    while let Some(done) = in_flight.tasks.join_next_with_id().await {
        in_flight.finished(handler, done);
    }
    let unsettled: Vec<Message> = in_flight
        .messages
        .values()
        .flat_map(Unsettled::take)
        .collect();
    let abandoned = unsettled.len();
    if abandoned > 0 {
        tracing::warn!(
            %handler,
            abandoned,
            "stopped: grace of {} over; {abandoned} deliveries abandoned, rolled back and given back for redelivery",
            humantime::format_duration(grace)
        );
    } else {
        tracing::info!(%handler, "stopped: every delivery in flight finished");
    }
    unsettled
}

/// Naks `msg` without delay ([`Settlement::Release`]); a failure leaves it
/// to `ack_wait`.
async fn give_back(handler: &str, msg: &Message) {
    if let Err(e) = broker::settle(msg, Settlement::Release).await {
        tracing::warn!(%handler, error = %e, "cannot give a message back; it is redelivered after ack_wait");
    }
}

/// Waits for SIGINT or SIGTERM and says which came: the stop of `idem run`
/// and of `idem replay`.
pub async fn signal() -> &'static str {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = ctrl_c => return "SIGINT",
                _ = term.recv() => return "SIGTERM",
            }
        }
    }
    let _ = ctrl_c.await;
    "SIGINT"
}
