//! Key lanes (`order_key`): within one host, the messages of one key run one
//! at a time and in stream order, different keys in parallel
//! (ARCHITECTURE.md, "Key lanes"). This is the decision logic alone, pure
//! and unit-tested; `consume.rs` feeds it deliveries and outcomes and runs
//! what it hands back.
//!
//! Rules:
//! - A key's messages wait in its lane in stream-sequence order; the lowest
//!   runs once nothing of the key runs.
//! - A message that ran and was given back to the broker to run again (a
//!   retry, naked with a delay, or left unsettled) *blocks* its lane: no
//!   later message of the key runs until that message has come back and run
//!   to an end (committed, a duplicate, or dead-lettered), so a redelivery is
//!   never run after a later message of its key. Earlier ones still may.
//! - A block ends by itself at its deadline (the message did not come back:
//!   another host took it, or the consumer was made again), so a lane never
//!   waits for ever.
//! - A second delivery of a message already waiting replaces it (the newer
//!   delivery is the one the broker tracks); one of the message running
//!   waits behind it, and runs as the duplicate its receipt makes it.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// How a run of one message of a lane ended, as the lane sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Settled for good: committed, a duplicate, or dead-lettered.
    Settled,
    /// Given back to the broker to be delivered again; later messages of the
    /// key wait for it until `deadline`.
    Again {
        /// When the lane stops waiting for it.
        deadline: Instant,
    },
}

/// One key's messages: the one running, the one it waits for, those held.
#[derive(Debug)]
struct Lane<M> {
    /// Stream sequence of the message running now.
    running: Option<u64>,
    /// A message given back to the broker, and until when to wait for it.
    blocked: Option<(u64, Instant)>,
    /// Waiting messages by stream sequence.
    held: BTreeMap<u64, M>,
}

impl<M> Default for Lane<M> {
    fn default() -> Self {
        Self {
            running: None,
            blocked: None,
            held: BTreeMap::new(),
        }
    }
}

impl<M> Lane<M> {
    /// The next message to run, if the lane may run one now.
    fn next(&mut self) -> Option<(u64, M)> {
        if self.running.is_some() {
            return None;
        }
        let (&seq, _) = self.held.first_key_value()?;
        if let Some((blocked, _)) = self.blocked
            && seq > blocked
        {
            return None;
        }
        if self.blocked.is_some_and(|(b, _)| b == seq) {
            self.blocked = None;
        }
        let m = self.held.remove(&seq)?;
        self.running = Some(seq);
        Some((seq, m))
    }

    fn idle(&self) -> bool {
        self.running.is_none() && self.blocked.is_none() && self.held.is_empty()
    }
}

/// Every key's lane. `M` is what is run (a delivery).
#[derive(Debug)]
pub struct KeyLanes<M> {
    lanes: HashMap<String, Lane<M>>,
}

impl<M> Default for KeyLanes<M> {
    fn default() -> Self {
        Self {
            lanes: HashMap::new(),
        }
    }
}

impl<M> KeyLanes<M> {
    /// A delivery of stream sequence `seq` with key `key` arrived: returns
    /// it back when it may run now (the caller runs it and later calls
    /// [`KeyLanes::ended`]), or `None` when it waits in its lane. A
    /// replaced earlier delivery of the same message is dropped here (it is
    /// the newer delivery that is tracked and settled).
    pub fn arrived(&mut self, key: &str, seq: u64, m: M) -> Option<M> {
        let lane = self.lanes.entry(key.to_owned()).or_default();
        lane.held.insert(seq, m);
        lane.next().map(|(_, m)| m)
    }

    /// The message `seq` of `key` that was running ended as `how`: returns
    /// the key's next message to run, if any.
    pub fn ended(&mut self, key: &str, seq: u64, how: Ended) -> Option<M> {
        let lane = self.lanes.get_mut(key)?;
        if lane.running == Some(seq) {
            lane.running = None;
        }
        match how {
            Ended::Settled => {
                if lane.blocked.is_some_and(|(b, _)| b == seq) {
                    lane.blocked = None;
                }
            }
            Ended::Again { deadline } => {
                // An earlier block stays (it is the earlier message).
                if lane.blocked.is_none_or(|(b, _)| seq < b) {
                    lane.blocked = Some((seq, deadline));
                }
            }
        }
        let next = lane.next().map(|(_, m)| m);
        if lane.idle() {
            self.lanes.remove(key);
        }
        next
    }

    /// Ends every block whose deadline is at or before `now`: the keys
    /// whose message did not come back, and the next message of each that
    /// may run now.
    pub fn expire(&mut self, now: Instant) -> Vec<(String, u64, Option<M>)> {
        let mut out = Vec::new();
        for (key, lane) in &mut self.lanes {
            if let Some((seq, deadline)) = lane.blocked
                && deadline <= now
            {
                lane.blocked = None;
                out.push((key.clone(), seq, lane.next().map(|(_, m)| m)));
            }
        }
        self.lanes.retain(|_, l| !l.idle());
        out
    }

    /// The earliest block deadline, if any lane is blocked.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.lanes
            .values()
            .filter_map(|l| l.blocked.map(|(_, d)| d))
            .min()
    }

    /// Every waiting message (for keeping them in progress).
    pub fn held(&self) -> impl Iterator<Item = &M> {
        self.lanes.values().flat_map(|l| l.held.values())
    }

    /// How many messages wait.
    #[cfg(test)]
    pub fn held_count(&self) -> usize {
        self.lanes.values().map(|l| l.held.len()).sum()
    }

    /// Takes every waiting message out (shutdown: they are given back).
    pub fn take_held(&mut self) -> Vec<M> {
        let mut out = Vec::new();
        for lane in self.lanes.values_mut() {
            out.extend(std::mem::take(&mut lane.held).into_values());
        }
        self.lanes.retain(|_, l| !l.idle());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn again(at: Instant) -> Ended {
        Ended::Again { deadline: at }
    }

    #[test]
    fn one_key_runs_one_at_a_time_in_stream_order() {
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 1, "a1"), Some("a1"));
        assert_eq!(l.arrived("a", 3, "a3"), None);
        assert_eq!(l.arrived("a", 2, "a2"), None);
        // Another key runs beside it.
        assert_eq!(l.arrived("b", 4, "b4"), Some("b4"));
        assert_eq!(l.ended("a", 1, Ended::Settled), Some("a2"));
        assert_eq!(l.ended("a", 2, Ended::Settled), Some("a3"));
        assert_eq!(l.ended("a", 3, Ended::Settled), None);
        assert_eq!(l.ended("b", 4, Ended::Settled), None);
        assert!(l.lanes.is_empty(), "idle lanes are dropped");
    }

    #[test]
    fn a_message_given_back_blocks_later_ones_until_it_ran() {
        let now = Instant::now();
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 1, "a1"), Some("a1"));
        assert_eq!(l.arrived("a", 2, "a2"), None);
        // a1 retried: a2 must not run before a1's redelivery did.
        assert_eq!(l.ended("a", 1, again(now + Duration::from_secs(60))), None);
        assert_eq!(l.arrived("a", 3, "a3"), None);
        assert_eq!(l.held_count(), 2);
        // The redelivery of a1 runs first, then a2, then a3.
        assert_eq!(l.arrived("a", 1, "a1 again"), Some("a1 again"));
        assert_eq!(l.ended("a", 1, Ended::Settled), Some("a2"));
        assert_eq!(l.ended("a", 2, Ended::Settled), Some("a3"));
        assert_eq!(l.ended("a", 3, Ended::Settled), None);
    }

    #[test]
    fn an_earlier_message_runs_before_the_one_waited_for() {
        let now = Instant::now();
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 5, "a5"), Some("a5"));
        assert_eq!(l.ended("a", 5, again(now + Duration::from_secs(60))), None);
        assert_eq!(l.arrived("a", 7, "a7"), None);
        // An earlier sequence (a redelivery from before) may still run.
        assert_eq!(l.arrived("a", 4, "a4"), Some("a4"));
        assert_eq!(l.ended("a", 4, Ended::Settled), None, "a7 waits for a5");
        assert_eq!(l.arrived("a", 5, "a5 again"), Some("a5 again"));
        assert_eq!(l.ended("a", 5, Ended::Settled), Some("a7"));
    }

    #[test]
    fn a_block_ends_at_its_deadline() {
        let now = Instant::now();
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 1, "a1"), Some("a1"));
        assert_eq!(l.arrived("a", 2, "a2"), None);
        let deadline = now + Duration::from_secs(10);
        assert_eq!(l.ended("a", 1, again(deadline)), None);
        assert_eq!(l.next_deadline(), Some(deadline));
        assert!(l.expire(now).is_empty());
        assert_eq!(
            l.expire(deadline),
            vec![("a".to_string(), 1, Some("a2"))],
            "a1 did not come back: a2 runs"
        );
        assert_eq!(l.next_deadline(), None);
        assert_eq!(l.ended("a", 2, Ended::Settled), None);
        assert!(l.lanes.is_empty());
    }

    #[test]
    fn a_second_delivery_of_a_waiting_message_replaces_it() {
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 1, "a1"), Some("a1"));
        assert_eq!(l.arrived("a", 2, "a2 first"), None);
        assert_eq!(l.arrived("a", 2, "a2 second"), None);
        assert_eq!(l.held_count(), 1);
        // A copy of the running one waits behind it.
        assert_eq!(l.arrived("a", 1, "a1 copy"), None);
        assert_eq!(l.ended("a", 1, Ended::Settled), Some("a1 copy"));
        assert_eq!(l.ended("a", 1, Ended::Settled), Some("a2 second"));
    }

    #[test]
    fn taking_the_held_leaves_only_what_runs() {
        let now = Instant::now();
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 1, "a1"), Some("a1"));
        assert_eq!(l.arrived("a", 2, "a2"), None);
        assert_eq!(l.arrived("b", 3, "b3"), Some("b3"));
        assert_eq!(l.ended("b", 3, again(now)), None);
        assert_eq!(l.arrived("b", 4, "b4"), None);
        let mut held = l.take_held();
        held.sort_unstable();
        assert_eq!(held, vec!["a2", "b4"]);
        assert_eq!(l.held_count(), 0);
        assert_eq!(l.ended("a", 1, Ended::Settled), None);
    }
}
