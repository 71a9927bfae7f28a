//! Where a handler's new durable consumer starts in its stream: the
//! handler's `start` setting, JetStream's deliver policy
//! (<https://docs.nats.io/nats-concepts/jetstream/consumers#deliverpolicy>).
//!
//! It applies only when idem creates the consumer: JetStream cannot change an
//! existing consumer's deliver policy, and an existing consumer goes on from
//! where it is.

use async_nats::jetstream::consumer::DeliverPolicy;
use std::fmt;
use std::str::FromStr;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The handler's `start`: `all` (default), `new`, `seq:N` or
/// `time:<RFC 3339>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum StartPosition {
    /// Every message the stream holds (`DeliverPolicy::All`).
    #[default]
    All,
    /// Only messages published after the consumer is created (`New`).
    New,
    /// From stream sequence N on (`ByStartSequence`), N ≥ 1.
    Sequence(u64),
    /// From the first message published at or after this time (`ByStartTime`).
    Time(OffsetDateTime),
}

impl StartPosition {
    /// The deliver policy a consumer created now gets.
    pub fn deliver_policy(self) -> DeliverPolicy {
        match self {
            StartPosition::All => DeliverPolicy::All,
            StartPosition::New => DeliverPolicy::New,
            StartPosition::Sequence(start_sequence) => {
                DeliverPolicy::ByStartSequence { start_sequence }
            }
            StartPosition::Time(start_time) => DeliverPolicy::ByStartTime { start_time },
        }
    }

    /// Whether a consumer starting here takes messages the stream already
    /// holds (all but `new`).
    pub fn takes_stored_messages(self) -> bool {
        self != StartPosition::New
    }
}

/// The messages a consumer created now at `policy` would never see, on a
/// stream whose last sequence is `last_sequence`: `Some((first, last))`,
/// the sequences not yet published that lie before its start, when its start
/// sequence is past `last_sequence + 1`; `None` for every other policy. A
/// consumer starts exactly at its start sequence, so the messages published
/// in between would be skipped without a trace (ARCHITECTURE.md, "Code map",
/// `broker/`: such a consumer is refused).
pub fn skipped_past_end(policy: &DeliverPolicy, last_sequence: u64) -> Option<(u64, u64)> {
    match *policy {
        DeliverPolicy::ByStartSequence { start_sequence }
            if start_sequence > last_sequence.saturating_add(1) =>
        {
            Some((last_sequence.saturating_add(1), start_sequence - 1))
        }
        _ => None,
    }
}

impl FromStr for StartPosition {
    type Err = String;

    /// # Errors
    /// One line saying which forms are accepted.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "start = \"{s}\" is not a start position; use \"all\", \"new\", \"seq:N\" (N >= 1) or \"time:2026-01-31T12:00:00Z\" (RFC 3339)"
            )
        };
        match s {
            "all" => Ok(StartPosition::All),
            "new" => Ok(StartPosition::New),
            _ => {
                if let Some(n) = s.strip_prefix("seq:") {
                    match n.parse::<u64>() {
                        Ok(n) if n >= 1 => Ok(StartPosition::Sequence(n)),
                        _ => Err(bad()),
                    }
                } else if let Some(t) = s.strip_prefix("time:") {
                    OffsetDateTime::parse(t, &Rfc3339)
                        .map(StartPosition::Time)
                        .map_err(|_| bad())
                } else {
                    Err(bad())
                }
            }
        }
    }
}

impl TryFrom<String> for StartPosition {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl fmt::Display for StartPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartPosition::All => f.write_str("all"),
            StartPosition::New => f.write_str("new"),
            StartPosition::Sequence(n) => write!(f, "seq:{n}"),
            StartPosition::Time(t) => match t.format(&Rfc3339) {
                Ok(text) => write!(f, "time:{text}"),
                Err(_) => write!(f, "time:{t}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_each_form_and_refuses_the_rest() {
        assert_eq!("all".parse(), Ok(StartPosition::All));
        assert_eq!("new".parse(), Ok(StartPosition::New));
        assert_eq!("seq:42".parse(), Ok(StartPosition::Sequence(42)));
        let t: StartPosition = "time:2026-01-31T12:00:00Z".parse().unwrap();
        assert_eq!(t.to_string(), "time:2026-01-31T12:00:00Z");
        assert_eq!(
            t.deliver_policy(),
            DeliverPolicy::ByStartTime {
                start_time: OffsetDateTime::from_unix_timestamp(1_769_860_800).unwrap()
            }
        );
        for bad in [
            "",
            "ALL",
            "seq:0",
            "seq:-1",
            "seq:x",
            "time:yesterday",
            "first",
        ] {
            assert_eq!(
                bad.parse::<StartPosition>(),
                Err(format!(
                    "start = \"{bad}\" is not a start position; use \"all\", \"new\", \"seq:N\" (N >= 1) or \"time:2026-01-31T12:00:00Z\" (RFC 3339)"
                )),
            );
        }
        assert_eq!(
            StartPosition::Sequence(7).deliver_policy(),
            DeliverPolicy::ByStartSequence { start_sequence: 7 }
        );
        assert!(!StartPosition::New.takes_stored_messages());
        assert!(StartPosition::All.takes_stored_messages());
    }

    #[test]
    fn a_start_past_the_next_message_skips_the_gap() {
        let seq = |n| StartPosition::Sequence(n).deliver_policy();
        assert_eq!(skipped_past_end(&seq(20), 5), Some((6, 19)));
        assert_eq!(skipped_past_end(&seq(7), 5), Some((6, 6)));
        assert_eq!(skipped_past_end(&seq(6), 5), None);
        assert_eq!(skipped_past_end(&seq(3), 5), None);
        assert_eq!(skipped_past_end(&seq(2), 0), Some((1, 1)));
        assert_eq!(skipped_past_end(&seq(1), 0), None);
        assert_eq!(skipped_past_end(&seq(u64::MAX), u64::MAX), None);
        for other in [
            StartPosition::All,
            StartPosition::New,
            StartPosition::Time(OffsetDateTime::UNIX_EPOCH),
        ] {
            assert_eq!(skipped_past_end(&other.deliver_policy(), 5), None);
        }
    }
}
