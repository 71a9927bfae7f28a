//! Per-handler counters of the protocol's outcomes (the signals an operator watches:
//! duplicates skipped, retries, dead letters). Cheap atomics, read by the
//! periodic stats line, the shutdown summary and the tests.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters for one handler since the host started. All counts are messages
/// (deliveries), not rows, except `log_bytes_dropped` and `receipts_pruned`.
#[derive(Debug, Default)]
pub struct HandlerStats {
    /// Deliveries taken from the broker.
    pub delivered: AtomicU64,
    /// Effects committed (new receipt + handler writes).
    pub processed: AtomicU64,
    /// Deliveries whose message id already had a receipt: rolled back and acked.
    pub duplicates: AtomicU64,
    /// Deliveries rolled back and naked for a later delivery (guest retry, trap, store error).
    pub retried: AtomicU64,
    /// Messages written to the dead-letter table and termed.
    pub dead_lettered: AtomicU64,
    /// Guest traps (deadline, memory, panic): each also counted as retried or dead-lettered.
    pub traps: AtomicU64,
    /// Confirmed acks that failed after a commit (the receipt covers the redelivery).
    pub ack_failures: AtomicU64,
    /// Guest log output (bytes) dropped by the per-message cap.
    pub log_bytes_dropped: AtomicU64,
    /// Times a delivery was held and run again instead of naked: the
    /// database was unreachable (held until it answered) or, on SQLite, its
    /// write lock stayed busy past the busy timeout (run again after a
    /// short backoff).
    pub db_pauses: AtomicU64,
    /// Receipts deleted by the pruning task because they were older than the
    /// handler's `retention` (rows, not messages).
    pub receipts_pruned: AtomicU64,
}

/// A point-in-time copy of [`HandlerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Deliveries received (every copy, duplicates included).
    pub delivered: u64,
    /// Deliveries whose effect committed.
    pub processed: u64,
    /// Deliveries whose receipt existed: acked, nothing changed.
    pub duplicates: u64,
    /// Deliveries rolled back and naked to run again.
    pub retried: u64,
    /// Deliveries written as dead letters, then termed.
    pub dead_lettered: u64,
    /// Guest calls that trapped (deadline, limit, panic).
    pub traps: u64,
    /// Acks after COMMIT the broker did not confirm.
    pub ack_failures: u64,
    /// Guest log bytes dropped by the per-message cap.
    pub log_bytes_dropped: u64,
    /// Times a delivery was held because the database was unavailable or busy.
    pub db_pauses: u64,
    /// Receipts deleted by pruning.
    pub receipts_pruned: u64,
}

impl HandlerStats {
    /// Adds one to a counter.
    pub fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            delivered: self.delivered.load(Relaxed),
            processed: self.processed.load(Relaxed),
            duplicates: self.duplicates.load(Relaxed),
            retried: self.retried.load(Relaxed),
            dead_lettered: self.dead_lettered.load(Relaxed),
            traps: self.traps.load(Relaxed),
            ack_failures: self.ack_failures.load(Relaxed),
            log_bytes_dropped: self.log_bytes_dropped.load(Relaxed),
            db_pauses: self.db_pauses.load(Relaxed),
            receipts_pruned: self.receipts_pruned.load(Relaxed),
        }
    }
}

impl std::fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "delivered={} processed={} duplicates={} retried={} dead_lettered={} traps={} ack_failures={} log_bytes_dropped={} db_pauses={} receipts_pruned={}",
            self.delivered,
            self.processed,
            self.duplicates,
            self.retried,
            self.dead_lettered,
            self.traps,
            self.ack_failures,
            self.log_bytes_dropped,
            self.db_pauses,
            self.receipts_pruned
        )
    }
}
