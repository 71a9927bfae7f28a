//! [`Committed`]: the message ids of one handler whose receipts this process
//! saw committed in the last [`COMMITTED_TTL`], the most recent
//! [`COMMITTED_IDS`] of them: the likely duplicates (ARCHITECTURE.md,
//! "Duplicates found before the transaction"). A delivery of one of these
//! has its receipt looked up outside any transaction, and is acked as a
//! duplicate when the receipt is there, with no BEGIN, no receipt insert
//! and no ROLLBACK. The set only says where to look; the receipt decides,
//! so a receipt forgotten (`idem receipts forget`) or pruned since is seen.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long an id stays known after its receipt was seen committed: long
/// enough for the copies that cost throughput (a redelivery after a lost
/// ack, a producer's retry).
pub const COMMITTED_TTL: Duration = Duration::from_secs(60);

/// How many message ids [`Committed`] keeps per handler (the oldest go
/// first). A redelivery usually comes within `ack_wait` of its first
/// delivery; at 512 bytes per id at most this is 8 MiB per handler.
pub const COMMITTED_IDS: usize = 16_384;

/// The most recent committed message ids of one handler (module docs).
#[derive(Debug)]
pub struct Committed {
    capacity: usize,
    ttl: Duration,
    ids: Mutex<Ids>,
}

#[derive(Debug, Default)]
struct Ids {
    /// Each id, with when its receipt was last seen committed.
    seen: HashMap<Arc<str>, Instant>,
    /// Every noting, oldest first: an id noted again has a later entry,
    /// and its earlier one no longer removes it.
    order: VecDeque<(Arc<str>, Instant)>,
}

impl Default for Committed {
    fn default() -> Self {
        Self::new(COMMITTED_IDS, COMMITTED_TTL)
    }
}

impl Committed {
    /// Keeps the most recent `capacity` notings (at least 1), each for `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            capacity: capacity.max(1),
            ttl,
            ids: Mutex::default(),
        }
    }

    /// Whether `message_id`'s receipt was seen committed within the TTL.
    pub fn contains(&self, message_id: &str) -> bool {
        self.lock()
            .seen
            .get(message_id)
            .is_some_and(|at| at.elapsed() < self.ttl)
    }

    /// Notes that `message_id`'s receipt is committed (now), forgetting
    /// the oldest notings when full and those past the TTL.
    pub fn insert(&self, message_id: &str) {
        let now = Instant::now();
        let mut ids = self.lock();
        let id: Arc<str> = message_id.into();
        ids.seen.insert(id.clone(), now);
        ids.order.push_back((id, now));
        while let Some((_, at)) = ids.order.front() {
            if ids.order.len() <= self.capacity && now.duration_since(*at) < self.ttl {
                break;
            }
            if let Some((oldest, at)) = ids.order.pop_front()
                && ids.seen.get(&oldest) == Some(&at)
            {
                ids.seen.remove(&oldest);
            }
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
        let c = Committed::new(3, COMMITTED_TTL);
        for id in ["a", "b", "c", "d"] {
            c.insert(id);
        }
        assert_eq!(
            ["a", "b", "c", "d"].map(|id| c.contains(id)),
            [false, true, true, true]
        );
        // Noting "b" again makes it the newest: "c" goes first, then "d".
        c.insert("b");
        c.insert("e");
        assert_eq!(
            ["b", "c", "d", "e"].map(|id| c.contains(id)),
            [true, false, true, true]
        );
        assert!(!c.contains("x"));
    }

    #[test]
    fn forgets_an_id_after_the_ttl() {
        let c = Committed::new(10, Duration::from_millis(50));
        c.insert("a");
        assert!(c.contains("a"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!c.contains("a"));
        // The expired noting is dropped with the next one.
        c.insert("b");
        assert_eq!(c.lock().order.len(), 1);
        assert_eq!(c.lock().seen.len(), 1);
    }
}
