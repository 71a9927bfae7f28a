//! Keeping deliveries ours while they are worked on: an in-progress ack
//! (`+WPI`, which restarts the server's `ack_wait` timer) every third of
//! `ack_wait`, for every delivery a [`KeepAlive`] holds, from one task.
//!
//! One task per handler, not one per delivery: a task spawned and aborted
//! for every message cost a timer registration, a cancellation and, on a
//! multi-threaded runtime, often the wake-up of another worker thread
//! (ARCHITECTURE.md, "Cost of a message"). The task runs only while a
//! delivery is held; the first delivery held after it ended starts it
//! again.

use async_nats::jetstream::{self, AckKind};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// The shortest time between two in-progress acks of one delivery.
pub const MIN_PERIOD: Duration = Duration::from_millis(100);

/// Sends `msg`'s in-progress ack (`+WPI`): the server restarts its
/// `ack_wait` timer (JetStream consumers, "AckProgress").
///
/// # Errors
/// The client could not queue the ack (connection closed).
pub async fn in_progress(msg: &jetstream::Message) -> Result<(), async_nats::Error> {
    msg.ack_with(AckKind::Progress).await
}

/// The deliveries of one handler kept in progress (module docs). Cheap to
/// clone: clones share the held deliveries and the task.
#[derive(Debug, Clone)]
pub struct KeepAlive(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    /// `ack_wait / 3`, at least [`MIN_PERIOD`].
    period: Duration,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    next_id: u64,
    /// Each held delivery, with when its next in-progress ack is due.
    /// Deliveries are added with the same period, so the earliest due is
    /// never later than a later-added one's.
    deliveries: HashMap<u64, (jetstream::Message, Instant)>,
    /// Whether the task runs.
    ticking: bool,
}

/// A delivery held by a [`KeepAlive`]: in-progress acks go out for it
/// until this is dropped.
#[derive(Debug)]
pub struct InProgress {
    keep: KeepAlive,
    id: u64,
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.keep.lock().deliveries.remove(&self.id);
    }
}

impl KeepAlive {
    /// A keep-alive for deliveries of a consumer with `ack_wait`; nothing
    /// runs until a delivery is held.
    pub fn new(ack_wait: Duration) -> Self {
        Self(Arc::new(Shared {
            period: (ack_wait / 3).max(MIN_PERIOD),
            held: Mutex::default(),
        }))
    }

    /// Holds `msg` (a cheap clone of the delivery): its first in-progress
    /// ack goes out one period from now. Must be called within a tokio
    /// runtime (the task is spawned on it when not running).
    pub fn hold(&self, msg: jetstream::Message) -> InProgress {
        let mut held = self.lock();
        let id = held.next_id;
        held.next_id += 1;
        held.deliveries
            .insert(id, (msg, Instant::now() + self.0.period));
        if !held.ticking {
            held.ticking = true;
            // The guard goes with the future, so a runtime that drops the
            // task, even before its first poll, marks it ended.
            let ticking = Ticking {
                keep: self.clone(),
                armed: true,
            };
            tokio::spawn(self.clone().tick(ticking));
        }
        drop(held);
        InProgress {
            keep: self.clone(),
            id,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.0.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The task: sleeps until the earliest due ack, sends the due ones,
    /// and ends when nothing is held.
    async fn tick(self, mut ticking: Ticking) {
        loop {
            let next = {
                let held = self.lock();
                held.deliveries.values().map(|(_, due)| *due).min()
            };
            let Some(next) = next else {
                let mut held = self.lock();
                if held.deliveries.is_empty() {
                    held.ticking = false;
                    ticking.armed = false;
                    return;
                }
                continue;
            };
            tokio::time::sleep_until(next).await;
            let now = Instant::now();
            let due: Vec<(u64, jetstream::Message)> = {
                let mut held = self.lock();
                held.deliveries
                    .iter_mut()
                    .filter(|(_, (_, due))| *due <= now)
                    .map(|(id, (msg, due))| {
                        *due = now + self.0.period;
                        (*id, msg.clone())
                    })
                    .collect()
            };
            for (id, msg) in &due {
                // One settled meanwhile gets none: a `+WPI` after its nak
                // would restart its `ack_wait` instead of the nak's delay.
                if !self.lock().deliveries.contains_key(id) {
                    continue;
                }
                if let Err(e) = in_progress(msg).await {
                    tracing::debug!(error = %e, "in-progress ack failed");
                }
            }
        }
    }
}

/// Marks the task ended when its future is dropped before it returned
/// (`armed`); a task that returned said so itself, under the lock.
struct Ticking {
    keep: KeepAlive,
    armed: bool,
}

impl Drop for Ticking {
    fn drop(&mut self) {
        if self.armed {
            self.keep.lock().ticking = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_a_third_of_ack_wait_and_at_least_the_minimum() {
        assert_eq!(
            KeepAlive::new(Duration::from_secs(30)).0.period,
            Duration::from_secs(10)
        );
        assert_eq!(
            KeepAlive::new(Duration::from_millis(90)).0.period,
            MIN_PERIOD
        );
    }
}
