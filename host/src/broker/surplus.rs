//! A pull stream's raised size: for a while (copies arriving after a
//! restart, ARCHITECTURE.md, "Duplicates found before the transaction")
//! its requests ask for more than its usual size, and every message that
//! arrives while it is raised, or while more is buffered than the usual
//! size lets be, is kept in progress until it is taken, so that nothing
//! waits past `ack_wait` because the size was raised.
//!
//! The usual size is what [`crate::config::HandlerConfig::pull_size`]
//! allows: with at most one and a half requests' worth buffered or on its
//! way, no message waits in the client past `ack_wait`. A raised request
//! breaks that bound, so the stream holds (with the handler's
//! [`KeepAlive`]) each message that arrives while the size is raised, or
//! while more than that bound is buffered or on its way (a raised request
//! still answering after the size fell back), or while the consuming loop
//! asks for it ([`Raise::keep_arrivals`]: it holds deliveries of its own
//! that run before the buffered ones). The hold ends when the message is
//! taken from the stream; the consuming loop keeps it in progress from
//! there as it keeps any delivery.

use super::in_progress::{InProgress, KeepAlive};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

/// A pull stream's raised size and the keep-alive for what it buffers
/// beyond its usual size (module docs). Shared between the consuming loop,
/// which sets it, and the stream's task, which reads it before each
/// request and on each arrival.
#[derive(Debug)]
pub struct Raise {
    /// Messages per request while raised; 0: the usual size.
    size: AtomicUsize,
    /// Hold every arrival, raised or not ([`Raise::keep_arrivals`]).
    keep_all: AtomicBool,
    keep: KeepAlive,
}

impl Raise {
    /// Not raised; arrivals are held by `keep` (the handler's keep-alive)
    /// when [`keeps`] says so.
    pub fn new(keep: KeepAlive) -> Self {
        Self {
            size: AtomicUsize::new(0),
            keep_all: AtomicBool::new(false),
            keep,
        }
    }

    /// Asks for `size` messages per request from the next request on
    /// (`None`, or a size not above the usual one: the usual size). The
    /// stream's task reads it when it next asks, after a message is taken
    /// or arrives.
    pub fn set(&self, size: Option<usize>) {
        self.size.store(size.unwrap_or(0), Relaxed);
    }

    /// Whether every message that arrives is held until taken, raised or
    /// not: the consuming loop has deliveries of its own waiting to run
    /// before the stream's.
    pub fn keep_arrivals(&self, all: bool) {
        self.keep_all.store(all, Relaxed);
    }

    /// The request size now: the raised size, or `usual` when that is not
    /// above it.
    pub(super) fn size(&self, usual: usize) -> usize {
        self.size.load(Relaxed).max(usual)
    }

    /// Holds `msg` in progress when [`keeps`] says an arrival must be, with
    /// `in_flight` messages buffered or on their way before it came.
    pub(super) fn hold(
        &self,
        msg: &async_nats::jetstream::Message,
        usual: usize,
        in_flight: usize,
    ) -> Option<InProgress> {
        let raised = self.size(usual) > usual;
        keeps(raised, self.keep_all.load(Relaxed), usual, in_flight)
            .then(|| self.keep.hold(msg.clone()))
    }
}

/// Whether a message arriving on a pull stream of `usual` size is held in
/// progress until taken: the size is `raised`, the consuming loop asks for
/// it (`keep_all`), or more was buffered or on its way (`in_flight`) than
/// the usual size lets be: one and a half requests.
pub fn keeps(raised: bool, keep_all: bool, usual: usize, in_flight: usize) -> bool {
    let usual = usual.max(1);
    raised || keep_all || in_flight > usual + usual / 2
}

#[cfg(test)]
mod tests {
    use super::keeps;

    #[test]
    fn an_arrival_is_kept_while_raised_asked_or_beyond_the_usual_bound() {
        // The usual size of 3 lets 4 be buffered or on their way.
        assert!(!keeps(false, false, 3, 0));
        assert!(!keeps(false, false, 3, 4));
        assert!(keeps(false, false, 3, 5));
        assert!(keeps(true, false, 3, 0));
        assert!(keeps(false, true, 3, 0));
        // A size of 0 counts as 1: one and nothing more.
        assert!(!keeps(false, false, 0, 1));
        assert!(keeps(false, false, 0, 2));
    }
}
