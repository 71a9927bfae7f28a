//! The deliveries of one in-flight task not yet settled: the bookkeeping a
//! batch shares with the consuming loop's wind-down (ARCHITECTURE.md,
//! "Shutdown"), so that an abandoned task gives back only what it had not
//! acked, naked or termed.

use async_nats::jetstream::Message;
use std::sync::{Arc, Mutex, PoisonError};

/// The deliveries of one task not yet settled (acked, naked or termed),
/// shared with the task, which crosses each off once it has settled it: an
/// abandoned task gives back only these (a batch's task may have settled
/// some of its messages already, and a second, immediate nak would undo a
/// nak's delay).
#[derive(Clone, Default)]
pub struct Unsettled(Arc<Mutex<Vec<Message>>>);

impl Unsettled {
    /// `msgs` (cheap copies of deliveries), none settled yet.
    pub fn new(msgs: Vec<Message>) -> Self {
        Self(Arc::new(Mutex::new(msgs)))
    }

    /// `msg` was settled: it is not to be given back.
    pub fn settled(&self, msg: &Message) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|m| m.reply != msg.reply);
    }

    /// The deliveries still unsettled, taken out (what an abandoned task
    /// gives back).
    pub fn take(&self) -> Vec<Message> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}
