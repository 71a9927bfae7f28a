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
use std::time::{Duration, Instant};

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

/// One key's messages: the one running, those it waits for, those held.
#[derive(Debug)]
struct Lane<M> {
    /// Stream sequence of the message running now.
    running: Option<u64>,
    /// Messages given back to the broker, each with until when to wait for
    /// it; nothing past the lowest of them runs.
    blocked: BTreeMap<u64, Instant>,
    /// Waiting messages by stream sequence.
    held: BTreeMap<u64, M>,
}

impl<M> Default for Lane<M> {
    fn default() -> Self {
        Self {
            running: None,
            blocked: BTreeMap::new(),
            held: BTreeMap::new(),
        }
    }
}

impl<M> Lane<M> {
    /// The next message to run, if the lane may run one now: the lowest
    /// held, unless it lies past the lowest blocked one.
    fn next(&mut self) -> Option<(u64, M)> {
        if self.running.is_some() {
            return None;
        }
        let (&seq, _) = self.held.first_key_value()?;
        if self
            .blocked
            .first_key_value()
            .is_some_and(|(&b, _)| seq > b)
        {
            return None;
        }
        // The redelivery of a blocked message, or one before it.
        self.blocked.remove(&seq);
        let m = self.held.remove(&seq)?;
        self.running = Some(seq);
        Some((seq, m))
    }

    fn end(&mut self, seq: u64, how: Ended) {
        if self.running == Some(seq) {
            self.running = None;
        }
        match how {
            Ended::Settled => {
                self.blocked.remove(&seq);
            }
            Ended::Again { deadline } => {
                self.blocked.insert(seq, deadline);
            }
        }
    }

    fn idle(&self) -> bool {
        self.running.is_none() && self.blocked.is_empty() && self.held.is_empty()
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

    /// Puts `m` in its lane without running anything (at stop).
    pub fn hold(&mut self, key: &str, seq: u64, m: M) {
        self.lanes
            .entry(key.to_owned())
            .or_default()
            .held
            .insert(seq, m);
    }

    /// `m`, handed out to run, did not start (at stop): it waits again.
    pub fn put_back(&mut self, key: &str, seq: u64, m: M) {
        let lane = self.lanes.entry(key.to_owned()).or_default();
        if lane.running == Some(seq) {
            lane.running = None;
        }
        lane.held.insert(seq, m);
    }

    /// The message `seq` of `key` that was running ended as `how`: returns
    /// the key's next message to run, if any.
    pub fn ended(&mut self, key: &str, seq: u64, how: Ended) -> Option<M> {
        let lane = self.lanes.get_mut(key)?;
        lane.end(seq, how);
        let next = lane.next().map(|(_, m)| m);
        if lane.idle() {
            self.lanes.remove(key);
        }
        next
    }

    /// [`KeyLanes::ended`] without handing out the next message (at stop).
    pub fn record_end(&mut self, key: &str, seq: u64, how: Ended) {
        if let Some(lane) = self.lanes.get_mut(key) {
            lane.end(seq, how);
        }
    }

    /// Ends every block whose deadline is at or before `now`: the keys and
    /// sequences that did not come back, and the next message of each key
    /// that may run now.
    pub fn expire(&mut self, now: Instant) -> Vec<(String, u64, Option<M>)> {
        let mut out = Vec::new();
        for (key, lane) in &mut self.lanes {
            let due: Vec<u64> = lane
                .blocked
                .iter()
                .filter(|&(_, &d)| d <= now)
                .map(|(&seq, _)| seq)
                .collect();
            if due.is_empty() {
                continue;
            }
            for seq in &due {
                lane.blocked.remove(seq);
            }
            let mut next = lane.next().map(|(_, m)| m);
            let last = due.len() - 1;
            for (i, seq) in due.into_iter().enumerate() {
                let run = if i == last { next.take() } else { None };
                out.push((key.clone(), seq, run));
            }
        }
        self.lanes.retain(|_, l| !l.idle());
        out
    }

    /// Moves every block's deadline `by` later (the time the pull was
    /// paused: nothing could come back meanwhile).
    pub fn delay_deadlines(&mut self, by: Duration) {
        for lane in self.lanes.values_mut() {
            for d in lane.blocked.values_mut() {
                *d += by;
            }
        }
    }

    /// The earliest block deadline, if any lane is blocked.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.lanes
            .values()
            .filter_map(|l| l.blocked.values().min().copied())
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

    /// Takes every waiting message out (at stop, to give back), each with
    /// how long the broker should wait before delivering it again: for one
    /// past messages its lane waits for, until the latest of those blocks'
    /// deadlines (from `now`), so they all come back first; zero for the
    /// others. A block whose own message is among those given back now does
    /// not count (it goes back at once, ahead of them).
    pub fn take_held(&mut self, now: Instant) -> Vec<(M, Duration)> {
        let mut out = Vec::new();
        for lane in self.lanes.values_mut() {
            let held = std::mem::take(&mut lane.held);
            for seq in held.keys() {
                lane.blocked.remove(seq);
            }
            for (seq, m) in held {
                let delay = lane
                    .blocked
                    .range(..seq)
                    .map(|(_, d)| d.saturating_duration_since(now))
                    .max()
                    .unwrap_or(Duration::ZERO);
                out.push((m, delay));
            }
        }
        self.lanes.retain(|_, l| !l.idle());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn taking_the_held_delays_those_past_a_block() {
        let now = Instant::now();
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 1, "a1"), Some("a1"));
        assert_eq!(l.arrived("a", 2, "a2"), None);
        assert_eq!(l.arrived("b", 3, "b3"), Some("b3"));
        let deadline = now + Duration::from_secs(9);
        assert_eq!(l.ended("b", 3, again(deadline)), None);
        assert_eq!(l.arrived("b", 4, "b4"), None);
        l.hold("c", 6, "c6");
        let mut held = l.take_held(now);
        held.sort_unstable();
        assert_eq!(
            held,
            vec![
                ("a2", Duration::ZERO),
                ("b4", Duration::from_secs(9)),
                ("c6", Duration::ZERO)
            ],
            "b4 comes back after b3 is due"
        );
        assert_eq!(l.held_count(), 0);
        assert_eq!(l.ended("a", 1, Ended::Settled), None);
    }

    #[test]
    fn a_lane_waits_for_every_message_it_gave_back() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 5, "a5"), Some("a5"));
        assert_eq!(l.ended("a", 5, again(later)), None);
        // An earlier message runs, and is given back too.
        assert_eq!(l.arrived("a", 3, "a3"), Some("a3"));
        assert_eq!(l.ended("a", 3, again(later)), None);
        assert_eq!(l.arrived("a", 6, "a6"), None);
        // a3 comes back and settles: a6 still waits for a5.
        assert_eq!(l.arrived("a", 3, "a3 again"), Some("a3 again"));
        assert_eq!(l.ended("a", 3, Ended::Settled), None);
        assert_eq!(l.arrived("a", 5, "a5 again"), Some("a5 again"));
        assert_eq!(l.ended("a", 5, Ended::Settled), Some("a6"));
    }

    #[test]
    fn what_did_not_start_waits_again_and_ends_are_recorded_at_stop() {
        let now = Instant::now();
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 1, "a1"), Some("a1"));
        assert_eq!(l.arrived("a", 2, "a2"), None);
        // a1 was handed out but never started.
        l.put_back("a", 1, "a1");
        // A message of another key ended as given back while stopping.
        assert_eq!(l.arrived("b", 3, "b3"), Some("b3"));
        assert_eq!(l.arrived("b", 4, "b4"), None);
        l.record_end("b", 3, again(now + Duration::from_secs(5)));
        let mut held = l.take_held(now);
        held.sort_unstable();
        assert_eq!(
            held,
            vec![
                ("a1", Duration::ZERO),
                ("a2", Duration::ZERO),
                ("b4", Duration::from_secs(5))
            ]
        );
    }

    #[test]
    fn at_stop_a_message_waits_for_every_block_before_it() {
        let now = Instant::now();
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 5, "a5"), Some("a5"));
        assert_eq!(l.ended("a", 5, again(now + Duration::from_secs(95))), None);
        assert_eq!(l.arrived("a", 3, "a3"), Some("a3"));
        assert_eq!(l.ended("a", 3, again(now + Duration::from_secs(36))), None);
        assert_eq!(l.arrived("a", 6, "a6"), None);
        assert_eq!(l.arrived("a", 4, "a4"), None);
        let mut held = l.take_held(now);
        held.sort_unstable();
        assert_eq!(
            held,
            vec![
                ("a4", Duration::from_secs(36)),
                ("a6", Duration::from_secs(95))
            ],
            "a6 waits for a5, the later of its blocks"
        );
    }

    #[test]
    fn a_blocked_message_given_back_with_the_rest_does_not_delay_them() {
        let now = Instant::now();
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 1, "a1"), Some("a1"));
        assert_eq!(l.ended("a", 1, again(now + Duration::from_secs(60))), None);
        assert_eq!(l.arrived("a", 2, "a2"), None);
        // a1's redelivery was fetched but not run when the host stopped.
        l.hold("a", 1, "a1 again");
        let mut held = l.take_held(now);
        held.sort_unstable();
        assert_eq!(
            held,
            vec![("a1 again", Duration::ZERO), ("a2", Duration::ZERO)]
        );
    }

    #[test]
    fn deadlines_move_by_a_pause() {
        let now = Instant::now();
        let mut l = KeyLanes::default();
        assert_eq!(l.arrived("a", 1, "a1"), Some("a1"));
        assert_eq!(l.ended("a", 1, again(now + Duration::from_secs(2))), None);
        l.delay_deadlines(Duration::from_secs(10));
        assert_eq!(l.next_deadline(), Some(now + Duration::from_secs(12)));
        assert!(l.expire(now + Duration::from_secs(5)).is_empty());
    }
}
