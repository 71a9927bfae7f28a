//! Which deliveries of the replay's consumer to run, and when the range is
//! done (pure, unit-tested).
//!
//! A consumer delivers a message the first time in stream order, so the
//! first pass over the range is over once a delivery past its end arrives,
//! or a delivery inside it says nothing matching is left after it
//! (`pending` 0), or the broker says nothing is left to deliver and no
//! delivery is on its way. A message that was naked (retry) or left
//! unsettled comes back later: the range is done when the first pass is over
//! and none of those is awaited any more.

use crate::pipeline::Outcome;
use std::collections::{HashMap, HashSet};
use std::fmt;

/// What to do with one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Run it through the pipeline.
    Run,
    /// Leave it alone (past the range, or the same message still running).
    Skip,
}

/// How the messages of the range ended, and what the replay counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Effects committed: messages new to the receipts' consumer.
    pub new: u64,
    /// Messages whose receipt existed: nothing changed.
    pub duplicates: u64,
    /// Messages written as dead letters.
    pub dead_lettered: u64,
    /// Attempts rolled back and naked to run again (not messages).
    pub retried: u64,
    /// Naked messages that never came back (gone from the stream).
    pub lost: u64,
}

impl Tally {
    /// Messages of the range that ended (new, duplicate or dead letter).
    pub fn messages(&self) -> u64 {
        self.new + self.duplicates + self.dead_lettered
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "new={} duplicates={} dead_lettered={} retried={}",
            self.new, self.duplicates, self.dead_lettered, self.retried
        )?;
        if self.lost > 0 {
            write!(f, " lost={}", self.lost)?;
        }
        Ok(())
    }
}

/// The replay's view of its range (module docs).
#[derive(Debug)]
pub struct Range {
    /// Last stream sequence of the range.
    end: u64,
    first_pass_over: bool,
    /// Highest consumer sequence delivered so far.
    consumer_seq: u64,
    /// Highest stream sequence of the range delivered so far.
    reached: u64,
    /// Messages of the range running now, and whether their outcome counts
    /// (not when a message that already ended comes again: its ack was lost).
    running: HashMap<u64, bool>,
    /// Messages of the range naked or left unsettled: they come back.
    awaited: HashSet<u64>,
    /// Messages past the range delivered and left unacked.
    past: HashSet<u64>,
    tally: Tally,
}

impl Range {
    /// A range ending at stream sequence `end`.
    pub fn new(end: u64) -> Self {
        Self {
            end,
            first_pass_over: false,
            consumer_seq: 0,
            reached: 0,
            running: HashMap::new(),
            awaited: HashSet::new(),
            past: HashSet::new(),
            tally: Tally::default(),
        }
    }

    /// A delivery of stream sequence `seq` (consumer sequence `consumer_seq`,
    /// `pending` matching messages after it, its `delivered`-th delivery).
    pub fn delivered(&mut self, seq: u64, consumer_seq: u64, pending: u64, delivered: u64) -> Take {
        self.consumer_seq = self.consumer_seq.max(consumer_seq);
        if seq > self.end {
            self.first_pass_over = true;
            self.past.insert(seq);
            return Take::Skip;
        }
        if pending == 0 {
            self.first_pass_over = true;
        }
        if self.running.contains_key(&seq) {
            return Take::Skip;
        }
        self.reached = self.reached.max(seq);
        let counts = delivered <= 1 || self.awaited.remove(&seq);
        self.running.insert(seq, counts);
        Take::Run
    }

    /// The run of `seq` ended with `outcome` (`None`: its task failed, the
    /// message comes back after `ack_wait`).
    pub fn settled(&mut self, seq: u64, outcome: Option<&Outcome>) {
        let counts = self.running.remove(&seq).unwrap_or(false);
        let comes_back = match outcome {
            Some(Outcome::Processed) => {
                self.tally.new += u64::from(counts);
                false
            }
            Some(Outcome::Duplicate) => {
                self.tally.duplicates += u64::from(counts);
                false
            }
            Some(Outcome::DeadLettered(_)) => {
                self.tally.dead_lettered += u64::from(counts);
                false
            }
            Some(Outcome::Retried(_) | Outcome::StoreFailed(_)) => {
                self.tally.retried += 1;
                true
            }
            Some(Outcome::Unsettled(_)) | None => true,
        };
        if comes_back && counts {
            self.awaited.insert(seq);
        }
    }

    /// Nothing arrived for a while; the broker says `num_pending` matching
    /// messages are yet to be delivered, the last delivery had consumer
    /// sequence `delivered`, and `ack_pending` are delivered but unsettled.
    pub fn idle(&mut self, num_pending: u64, delivered: u64, ack_pending: u64) {
        if num_pending == 0 && delivered <= self.consumer_seq {
            self.first_pass_over = true;
        }
        // Every unsettled message the broker holds is one past the range:
        // an awaited one is gone from the stream and will never come back.
        if self.first_pass_over
            && self.running.is_empty()
            && !self.awaited.is_empty()
            && ack_pending <= self.past.len() as u64
        {
            self.tally.lost += self.awaited.len() as u64;
            self.awaited.clear();
        }
    }

    /// Every message of the range has ended (none running, none awaited).
    pub fn done(&self) -> bool {
        self.first_pass_over && self.running.is_empty() && self.awaited.is_empty()
    }

    /// Highest stream sequence of the range delivered so far.
    pub fn reached(&self) -> u64 {
        self.reached
    }

    /// The counts so far.
    pub fn tally(&self) -> Tally {
        self.tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retried() -> Outcome {
        Outcome::Retried("retry: later".into())
    }

    #[test]
    fn a_range_ends_at_its_last_message_with_nothing_after_it() {
        let mut r = Range::new(3);
        for (seq, pending) in [(1, 2), (2, 1), (3, 0)] {
            assert_eq!(r.delivered(seq, seq, pending, 1), Take::Run);
            assert!(!r.done());
            r.settled(seq, Some(&Outcome::Duplicate));
        }
        assert!(r.done());
        assert_eq!(
            r.tally().to_string(),
            "new=0 duplicates=3 dead_lettered=0 retried=0"
        );
    }

    #[test]
    fn a_message_past_the_end_is_skipped_and_ends_the_first_pass() {
        let mut r = Range::new(2);
        assert_eq!(r.delivered(1, 1, 5, 1), Take::Run);
        assert_eq!(r.delivered(2, 2, 4, 1), Take::Run);
        assert_eq!(r.delivered(3, 3, 3, 1), Take::Skip);
        assert!(!r.done(), "two still running");
        r.settled(1, Some(&Outcome::Processed));
        r.settled(2, Some(&Outcome::DeadLettered("rejected: no".into())));
        assert!(r.done());
        assert_eq!(
            (r.tally().new, r.tally().dead_lettered, r.tally().messages()),
            (1, 1, 2)
        );
    }

    #[test]
    fn a_naked_message_is_awaited_and_counted_once_when_it_ends() {
        let mut r = Range::new(2);
        assert_eq!(r.delivered(1, 1, 1, 1), Take::Run);
        assert_eq!(r.delivered(2, 2, 0, 1), Take::Run);
        r.settled(2, Some(&Outcome::Processed));
        r.settled(1, Some(&retried()));
        assert!(!r.done(), "sequence 1 comes back");
        assert_eq!(r.delivered(1, 3, 0, 2), Take::Run);
        r.settled(1, Some(&Outcome::Processed));
        assert!(r.done());
        assert_eq!(
            r.tally().to_string(),
            "new=2 duplicates=0 dead_lettered=0 retried=1"
        );
    }

    #[test]
    fn a_message_that_ended_and_comes_again_runs_without_counting() {
        let mut r = Range::new(5);
        assert_eq!(r.delivered(1, 1, 4, 1), Take::Run);
        r.settled(1, Some(&Outcome::Processed));
        // Its ack was lost: the broker delivers it again.
        assert_eq!(r.delivered(1, 2, 4, 2), Take::Run);
        r.settled(1, Some(&Outcome::Duplicate));
        assert_eq!(r.tally().messages(), 1);
        // The same message delivered again while it still runs: left alone.
        assert_eq!(r.delivered(2, 3, 3, 1), Take::Run);
        assert_eq!(r.delivered(2, 4, 3, 2), Take::Skip);
    }

    #[test]
    fn the_broker_ends_the_first_pass_only_when_no_delivery_is_on_its_way() {
        let mut r = Range::new(9);
        assert_eq!(r.delivered(4, 1, 1, 1), Take::Run);
        r.settled(4, Some(&Outcome::Duplicate));
        // Consumer sequence 2 was sent but has not arrived yet.
        r.idle(0, 2, 1);
        assert!(!r.done());
        assert_eq!(r.delivered(7, 2, 0, 1), Take::Run);
        r.settled(7, Some(&Outcome::Duplicate));
        assert!(r.done());
        // An empty range: nothing pending, nothing delivered.
        let mut empty = Range::new(9);
        empty.idle(0, 0, 0);
        assert!(empty.done());
        assert_eq!(empty.tally().messages(), 0);
    }

    #[test]
    fn an_awaited_message_gone_from_the_stream_is_lost_not_waited_for() {
        let mut r = Range::new(3);
        assert_eq!(r.delivered(3, 1, 1, 1), Take::Run);
        assert_eq!(r.delivered(4, 2, 0, 1), Take::Skip);
        r.settled(3, Some(&retried()));
        // The broker still holds sequence 3 (and 4, past the range).
        r.idle(0, 2, 2);
        assert!(!r.done());
        // Only sequence 4 is left unsettled: 3 was deleted.
        r.idle(0, 2, 1);
        assert!(r.done());
        assert_eq!(r.tally().lost, 1);
        assert_eq!(
            r.tally().to_string(),
            "new=0 duplicates=0 dead_lettered=0 retried=1 lost=1"
        );
    }
}
