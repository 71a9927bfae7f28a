//! Retention policy (ARCHITECTURE.md invariant 7): how long a receipt is
//! kept and what follows from it, measured on the broker's clock
//! ([`crate::broker::clock`]).
//!
//! - The horizon: [`check_horizon`] refuses at start (and for `idem
//!   replay`) a stream that keeps messages longer than the window;
//!   [`beyond_horizon`] is the per-delivery admission check the pipeline
//!   runs after the receipt insert.
//! - Pruning: [`prune_cutoff`] (the window plus [`prune_margin`]), the
//!   running host's loop [`prune_forever`] every [`prune_interval`], and the
//!   prune chunk [`PRUNE_CHUNK`], which `idem receipts prune` uses too.
//!
//! The mechanism (the SQL, the one-pruner lock) is the store's
//! ([`crate::store::PruneLock`], [`Database::prune_pass`]).

use crate::broker::{self, clock::BrokerClock};
use crate::metrics::HandlerStats;
use crate::store::{Database, PrunePass};
use anyhow::Context as _;
use std::sync::Arc;
use std::time::Duration;

/// The prune chunk: receipts deleted per statement by a pruning pass
/// (the host's task and `idem receipts prune`).
pub const PRUNE_CHUNK: u32 = 1000;

/// Time between two pruning passes: a tenth of the shortest retention, at
/// most a minute (and at least 50 ms).
pub fn prune_interval(retentions: impl IntoIterator<Item = Duration>) -> Duration {
    retentions
        .into_iter()
        .map(|r| r / 10)
        .min()
        .unwrap_or(Duration::from_secs(60))
        .clamp(Duration::from_millis(50), Duration::from_secs(60))
}

/// How long before the broker's `now_ms` a message published at
/// `published_ms` was published, when that is longer than `retention`: it
/// is beyond the horizon, its receipt may have been pruned. `None` when it
/// is within the window (or published "after" now, a reading's error).
pub fn beyond_horizon(published_ms: i64, now_ms: i64, retention: Duration) -> Option<Duration> {
    let age = Duration::from_millis(u64::try_from(now_ms.saturating_sub(published_ms)).ok()?);
    (age > retention).then_some(age)
}

/// The margin pruning keeps beyond the retention window: a tenth of it, at
/// most a minute. It absorbs the difference between two hosts' readings of
/// the broker's clock (each within half a round trip), so a receipt is never
/// deleted while any host still judges its message inside the window.
pub fn prune_margin(retention: Duration) -> Duration {
    (retention / 10).min(Duration::from_secs(60))
}

/// Receipts published before this Unix ms are pruned when the broker's time
/// is `now_ms`: `now_ms - retention - prune_margin(retention)`.
pub fn prune_cutoff(now_ms: i64, retention: Duration) -> i64 {
    let keep = retention.saturating_add(prune_margin(retention));
    now_ms.saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX))
}

/// Refuses a stream that can present a message older than the handler's
/// retention window (its `max_age` unlimited or longer), unless the handler
/// sets `accept_horizon_risk` (then a warning): such a message could find its
/// receipt pruned and run twice. It would be quarantined by the pipeline, but
/// a deployment should not rely on that by accident. `idem replay` checks
/// it too, unless it replays under a fresh name.
///
/// # Errors
/// The stream keeps messages longer than the retention window (one line
/// saying what to change), or it cannot be read.
pub async fn check_horizon(
    js: &async_nats::jetstream::Context,
    h: &crate::config::HandlerConfig,
) -> anyhow::Result<()> {
    let max_age = broker::stream_max_age(js, &h.stream)
        .await
        .with_context(|| format!("handler `{}`", h.name))?;
    if max_age.is_some_and(|a| a <= h.retention) {
        return Ok(());
    }
    let keeps = max_age.map_or_else(
        || "ever".to_string(),
        |a| humantime::format_duration(a).to_string(),
    );
    let retention = humantime::format_duration(h.retention);
    if h.accept_horizon_risk {
        tracing::warn!(handler = %h.name, stream = %h.stream, "stream keeps messages for {keeps} but receipts are kept for {retention}; accept_horizon_risk = true, so a message older than that is dead-lettered (beyond-horizon) instead of run");
        return Ok(());
    }
    anyhow::bail!(
        "handler `{}`: stream `{}` keeps messages for {keeps} but receipts are kept for {retention}; a redelivered or replayed message older than that could run twice. Set the stream's max_age <= retention, raise retention, or set accept_horizon_risk = true",
        h.name,
        h.stream
    )
}

/// One handler as the pruning task sees it.
pub struct PruneTarget {
    /// The handler (its receipts' consumer).
    pub name: Arc<str>,
    /// Its retention window.
    pub retention: Duration,
    /// The broker's clock of its stream.
    pub clock: Arc<BrokerClock>,
    /// Its counters (`receipts_pruned`).
    pub stats: Arc<HandlerStats>,
}

/// The pruning task: every [`prune_interval`], one pass over every handler
/// (skipped while another host holds the prune lock), deleting receipts
/// published before [`prune_cutoff`] of the broker's clock now,
/// counted in each handler's `receipts_pruned`. Errors are logged; the next
/// pass tries again.
pub async fn prune_forever(db: Arc<Database>, handlers: Vec<PruneTarget>) {
    let mut tick = tokio::time::interval(prune_interval(handlers.iter().map(|h| h.retention)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let targets: Vec<(&str, i64)> = handlers
            .iter()
            .map(|h| (&*h.name, prune_cutoff(h.clock.now_ms(), h.retention)))
            .collect();
        match db.prune_pass(&targets, PRUNE_CHUNK).await {
            Ok(PrunePass::Pruned(counts)) => {
                for (h, n) in handlers.iter().zip(counts) {
                    if n > 0 {
                        h.stats.receipts_pruned.add(n);
                        tracing::info!(handler = %h.name, pruned = n, "pruned receipts older than the retention window");
                    }
                }
            }
            Ok(PrunePass::Skipped) => {
                tracing::debug!("another host holds the prune lock; pass skipped");
            }
            Err(e) => tracing::warn!(error = %e, "pruning receipts failed; retrying next pass"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn prune_interval_is_a_tenth_of_the_shortest_retention_within_bounds() {
        let s = Duration::from_secs;
        assert_eq!(prune_interval([s(7 * 86_400)]), s(60));
        assert_eq!(prune_interval([s(3600), s(100)]), s(10));
        assert_eq!(prune_interval([s(1)]), Duration::from_millis(100));
        assert_eq!(
            prune_interval([Duration::from_millis(10)]),
            Duration::from_millis(50)
        );
        assert_eq!(prune_interval([]), s(60));
    }

    #[test]
    fn only_a_message_older_than_the_window_is_beyond_the_horizon() {
        let r = 10 * S;
        assert_eq!(beyond_horizon(100_000, 110_000, r), None);
        assert_eq!(
            beyond_horizon(100_000, 110_001, r),
            Some(Duration::from_millis(10_001))
        );
        // Published "after" the broker's now (a reading's error): fresh.
        assert_eq!(beyond_horizon(200_000, 110_000, r), None);
    }

    #[test]
    fn pruning_keeps_the_window_plus_a_tenth_of_it_at_most_a_minute() {
        assert_eq!(prune_margin(10 * S), S);
        assert_eq!(prune_margin(7 * 86_400 * S), 60 * S);
        assert_eq!(prune_cutoff(100_000, 10 * S), 89_000);
        assert_eq!(prune_cutoff(i64::MIN + 5, 10 * S), i64::MIN);
        // Nothing the horizon check lets through is ever below the cutoff:
        // a message at the edge of the window, judged by a host whose
        // reading is behind the pruner's by less than the margin.
        let (pruner_now, checker_now, r) = (1_000_000, 999_100, 10 * S);
        let published = checker_now - 10_000;
        assert_eq!(beyond_horizon(published, checker_now, r), None);
        assert!(published >= prune_cutoff(pruner_now, r));
    }
}
