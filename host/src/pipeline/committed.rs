//! [`Committed`]: the message ids of one handler whose receipts this process
//! saw committed, the most recent [`COMMITTED_IDS`] of them, so that a
//! redelivery of one is acked as a duplicate without a transaction
//! (ARCHITECTURE.md, "Duplicates this host committed").
//!
//! It only ever holds ids whose receipt was committed (this process's
//! COMMIT returned, or a receipt insert found a committed receipt), and a
//! committed receipt is never taken back by idem while its message can
//! still be delivered (retention keeps it past the stream's `max_age`). So
//! acking such an id without asking the database is what the receipt would
//! have decided. What it cannot know is a receipt removed behind idem's back
//! (a database restored from a backup, rows deleted by hand): a redelivery
//! of such a message to this process is acked, not applied again. A new
//! process starts empty.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

/// How many message ids [`Committed`] keeps per handler (the oldest go
/// first). A redelivery usually comes within `ack_wait` of its first
/// delivery; at 512 bytes per id at most this is 8 MiB per handler.
pub const COMMITTED_IDS: usize = 16_384;

/// The most recent committed message ids of one handler (module docs).
#[derive(Debug)]
pub struct Committed {
    capacity: usize,
    ids: Mutex<Ids>,
}

#[derive(Debug, Default)]
struct Ids {
    set: HashSet<Arc<str>>,
    order: VecDeque<Arc<str>>,
}

impl Default for Committed {
    fn default() -> Self {
        Self::with_capacity(COMMITTED_IDS)
    }
}

impl Committed {
    /// Keeps the most recent `capacity` ids (at least 1).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            ids: Mutex::default(),
        }
    }

    /// Whether `message_id`'s receipt is known to be committed.
    pub fn contains(&self, message_id: &str) -> bool {
        self.lock().set.contains(message_id)
    }

    /// Notes that `message_id`'s receipt is committed, forgetting the
    /// oldest id when full.
    pub fn insert(&self, message_id: &str) {
        let mut ids = self.lock();
        if ids.set.contains(message_id) {
            return;
        }
        let id: Arc<str> = message_id.into();
        ids.set.insert(id.clone());
        ids.order.push_back(id);
        if ids.order.len() > self.capacity
            && let Some(oldest) = ids.order.pop_front()
        {
            ids.set.remove(&oldest);
        }
    }

    /// The ids, also after a panic elsewhere held the lock (each change
    /// leaves them consistent).
    fn lock(&self) -> std::sync::MutexGuard<'_, Ids> {
        self.ids.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recent_ids() {
        let c = Committed::with_capacity(3);
        for id in ["a", "b", "c"] {
            c.insert(id);
        }
        // Noting a known id again does not make it newer or count twice.
        c.insert("a");
        c.insert("d");
        assert_eq!(
            ["a", "b", "c", "d"].map(|id| c.contains(id)),
            [false, true, true, true]
        );
        c.insert("e");
        assert_eq!(
            ["b", "c", "d", "e"].map(|id| c.contains(id)),
            [false, true, true, true]
        );
        assert!(!c.contains("x"));
    }
}
