//! Doubling waits with jitter for the loops that retry a resource that is
//! not there yet (the database gate's probe, a delivery held while the
//! database is unavailable, a broker pull that cannot start), built on
//! [`backon`]. The jitter keeps several hosts from probing a recovering
//! database or broker in lockstep.

use std::time::Duration;

/// Endless waits: `first`, then doubling up to `max`, each plus a random
/// jitter of up to itself (backon's jitter: a wait of `d` becomes a value in
/// `[d, 2·d)`), so no wait is shorter than the doubling schedule and none is
/// longer than `2·max`.
pub fn doubling(first: Duration, max: Duration) -> impl Iterator<Item = Duration> + Send {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::new()
        .with_min_delay(first)
        .with_max_delay(max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_with_jitter_within_bounds_and_never_ends() {
        let first = Duration::from_millis(100);
        let max = Duration::from_secs(5);
        let waits: Vec<Duration> = doubling(first, max).take(50).collect();
        assert_eq!(waits.len(), 50);
        // Without jitter: 100, 200, 400, … ms, then 5 s for ever.
        let mut base = first;
        for w in &waits {
            assert!(*w >= base && *w < base * 2, "wait {w:?} for base {base:?}");
            base = (base * 2).min(max);
        }
        // Jitter: two schedules differ somewhere.
        let other: Vec<Duration> = doubling(first, max).take(50).collect();
        assert_ne!(waits, other);
    }
}
