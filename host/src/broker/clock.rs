//! The one clock the retention window is measured on: the broker's
//! (ARCHITECTURE.md invariant 7).
//!
//! JetStream stamps every stored message with its publish time on the
//! clock of the server that leads the stream. Receipts keep that time
//! (`published_ms`), the horizon check compares a delivery's publish time
//! with the broker's "now", and pruning deletes receipts published more than
//! the retention window (plus a margin) before the broker's "now". Neither the
//! host's wall clock nor the database's takes part, so skew between the
//! three machines moves nothing. What is judged on this clock (the
//! horizon, the prune cutoff) is [`crate::retention`]'s.
//!
//! The broker's "now" is read from the `ts` field every JetStream stream
//! info response carries (nats-server 2.10 and later; the stream leader's
//! clock, the one that stamps publish times) and carried forward on this
//! host's monotonic clock, which no wall-clock step or NTP correction
//! moves. A reading is taken when a handler starts and refreshed every
//! [`REFRESH`]; its error is half the request's round trip.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a running host reads the broker's clock again.
pub const REFRESH: Duration = Duration::from_secs(30);

/// The broker's clock as this host last read it.
#[derive(Debug)]
pub struct BrokerClock {
    reading: Mutex<Reading>,
}

#[derive(Debug, Clone, Copy)]
struct Reading {
    /// The broker's time, Unix ms, at `at`.
    broker_ms: i64,
    /// When (this host's monotonic clock) the broker's time was `broker_ms`.
    at: Instant,
}

impl BrokerClock {
    /// A clock that read `broker_ms` (Unix ms) at the monotonic instant `at`.
    pub fn new(broker_ms: i64, at: Instant) -> Self {
        Self {
            reading: Mutex::new(Reading { broker_ms, at }),
        }
    }

    /// Replaces the reading with a newer one.
    pub fn set(&self, broker_ms: i64, at: Instant) {
        if let Ok(mut r) = self.reading.lock() {
            *r = Reading { broker_ms, at };
        }
    }

    /// The broker's time now, Unix ms: the last reading plus the monotonic
    /// time elapsed since.
    pub fn now_ms(&self) -> i64 {
        let r = self.reading.lock().map_or_else(|e| *e.into_inner(), |r| *r);
        let elapsed = i64::try_from(r.at.elapsed().as_millis()).unwrap_or(i64::MAX);
        r.broker_ms.saturating_add(elapsed)
    }
}

/// A stream info response's fields this module reads.
#[derive(serde::Deserialize)]
struct StreamInfoTime {
    /// RFC 3339 server time of the response; absent before nats-server 2.10.
    ts: Option<String>,
    error: Option<serde_json::Value>,
}

/// Why the broker's time could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    /// The request failed or the stream does not exist.
    #[error("cannot read the broker's clock from stream `{stream}`: {detail}")]
    Unreadable {
        /// The stream whose info was asked for.
        stream: String,
        /// The client's error.
        detail: String,
        /// Whether JetStream did not answer, or answered "not now" (a
        /// leader election: [`super::unanswered`]), so asking again may
        /// succeed.
        unanswered: bool,
    },
    /// The server answered without a time (nats-server before 2.10).
    #[error(
        "nats-server does not report its time in stream info (it is older than 2.10); upgrade nats-server, which idem's retention window is measured on"
    )]
    NoTime,
}

impl ClockError {
    /// Whether asking again may succeed: JetStream did not answer, or
    /// answered "not now" ([`ClockError::Unreadable`]'s `unanswered`).
    pub fn unanswered(&self) -> bool {
        matches!(
            self,
            ClockError::Unreadable {
                unanswered: true,
                ..
            }
        )
    }
}

/// Reads the broker's clock from `stream`'s info (`$JS.API.STREAM.INFO`),
/// taken to be at the midpoint of the request on this host's monotonic
/// clock.
///
/// # Errors
/// [`ClockError::Unreadable`] when the request fails or the stream does not
/// exist; [`ClockError::NoTime`] when the server does not send `ts`.
pub async fn read(
    js: &async_nats::jetstream::Context,
    stream: &str,
) -> Result<(i64, Instant), ClockError> {
    let unreadable = |detail: String, unanswered: bool| ClockError::Unreadable {
        stream: stream.to_owned(),
        detail,
        unanswered,
    };
    let sent = Instant::now();
    let info: StreamInfoTime = js
        .request(format!("STREAM.INFO.{stream}"), &())
        .await
        .map_err(|e| unreadable(e.to_string(), super::unanswered::unanswered_error(&e)))?;
    let received = Instant::now();
    if let Some(error) = info.error {
        let not_now = serde_json::from_value::<async_nats::jetstream::Error>(error.clone())
            .is_ok_and(|j| super::unanswered::unanswered_error(&j));
        let detail = error
            .get("description")
            .and_then(serde_json::Value::as_str)
            .map_or_else(|| error.to_string(), str::to_owned);
        return Err(unreadable(detail, not_now));
    }
    let ts = info.ts.ok_or(ClockError::NoTime)?;
    let broker_ms = parse_ts(&ts).ok_or_else(|| unreadable(format!("bad time `{ts}`"), false))?;
    Ok((broker_ms, sent + (received - sent) / 2))
}

/// An RFC 3339 time as Unix ms, `None` when it does not parse.
pub fn parse_ts(ts: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos().div_euclid(1_000_000)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_on_the_monotonic_clock_from_its_reading() {
        let at = Instant::now() - Duration::from_millis(1500);
        let clock = BrokerClock::new(1_000_000, at);
        let now = clock.now_ms();
        assert!((1_001_500..1_002_500).contains(&now), "{now}");
        clock.set(5_000, Instant::now());
        let now = clock.now_ms();
        assert!((5_000..5_500).contains(&now), "{now}");
    }

    #[test]
    fn server_times_parse_to_unix_milliseconds() {
        assert_eq!(
            parse_ts("2026-12-01T02:55:40.672965747Z"),
            Some(1_796_093_740_672)
        );
        assert_eq!(parse_ts("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(
            parse_ts("2026-12-01T03:55:40.5+01:00"),
            Some(1_796_093_740_500)
        );
        assert_eq!(parse_ts("yesterday"), None);
    }
}
