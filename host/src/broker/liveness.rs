//! [`Liveness`]: how long JetStream has said nothing to a handler's pull
//! requests while the host waited on them (ARCHITECTURE.md, "Code map":
//! broker). `/readyz` and `idem_consumer_silence_seconds` read it; a pull
//! request the server lost (a consumer leader gone in an election, a node
//! killed) shows here before anything else notices.
//!
//! Silence counts only while something was asked of the server: a pull
//! request outstanding, or the consumer being asked for again after an
//! error. A handler that asked for nothing (its buffer is full, or it paused
//! while the database is down) is not silent, however long the server says
//! nothing.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use std::time::Instant;

/// What one handler's consumer has heard from the server. Shared between
/// its pull stream (which hears) and the readiness check (which asks);
/// cheap to update (one uncontended lock per message).
#[derive(Debug)]
pub struct Liveness {
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// Something is asked of the server and not yet answered in full.
    waiting: bool,
    /// When the server last said anything, or when waiting began after a
    /// time of asking for nothing, whichever is later.
    since: Instant,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                waiting: false,
                since: Instant::now(),
            }),
        }
    }
}

impl Liveness {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // The state is two plain values, whole after any panic.
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The server said something (a message, a heartbeat, a status).
    pub fn heard(&self) {
        self.heard_at(Instant::now());
    }

    fn heard_at(&self, now: Instant) {
        self.with(|s| s.since = now);
    }

    /// Something was asked of the server: silence counts from now unless it
    /// already counted (a request sent again after one was lost does not
    /// reset it).
    pub fn waiting(&self) {
        self.waiting_at(Instant::now());
    }

    fn waiting_at(&self, now: Instant) {
        self.with(|s| {
            if !s.waiting {
                s.waiting = true;
                s.since = now;
            }
        });
    }

    /// Nothing is asked of the server any more (everything asked for
    /// arrived, or the handler paused): its silence means nothing.
    pub fn satisfied(&self) {
        self.with(|s| s.waiting = false);
    }

    /// How long the server has said nothing while asked: under
    /// [`super::PULL_HEARTBEAT`] while it answers (an idle request hears a
    /// heartbeat that often), zero when nothing is asked.
    pub fn silence(&self) -> Duration {
        self.silence_at(Instant::now())
    }

    fn silence_at(&self, now: Instant) -> Duration {
        self.with(|s| {
            if s.waiting {
                now.saturating_duration_since(s.since)
            } else {
                Duration::ZERO
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_counts_only_while_waiting_and_from_the_last_word() {
        let l = Liveness::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(l.silence_at(at(5)), Duration::ZERO, "nothing asked yet");
        l.waiting_at(at(5));
        assert_eq!(l.silence_at(at(8)), Duration::from_secs(3));
        // A request sent again (one was lost) keeps counting.
        l.waiting_at(at(8));
        assert_eq!(l.silence_at(at(10)), Duration::from_secs(5));
        l.heard_at(at(10));
        assert_eq!(l.silence_at(at(11)), Duration::from_secs(1));
        l.satisfied();
        assert_eq!(l.silence_at(at(40)), Duration::ZERO, "nothing asked");
        // Asking again after asking nothing counts from the new request.
        l.waiting_at(at(40));
        assert_eq!(l.silence_at(at(42)), Duration::from_secs(2));
    }
}
