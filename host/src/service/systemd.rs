//! The service manager's notification protocol (`Type=notify` under
//! systemd, through the `sd-notify` crate): `READY=1` once every handler is
//! consuming, `STOPPING=1` at the first shutdown signal, and `WATCHDOG=1`
//! every half of the watchdog timeout the manager set (ARCHITECTURE.md,
//! "Shutdown"). Every call is a no-op when `NOTIFY_SOCKET` is unset, so idem
//! runs the same outside systemd.

use sd_notify::NotifyState;
use std::time::Duration;

/// Tells the service manager that startup is finished (`READY=1`).
pub fn ready() {
    send(&[NotifyState::Ready], "READY=1");
}

/// Tells the service manager that the service is stopping (`STOPPING=1`).
pub fn stopping() {
    send(&[NotifyState::Stopping], "STOPPING=1");
}

fn send(state: &[NotifyState], what: &str) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::warn!(error = %e, "cannot send {what} to the service manager (NOTIFY_SOCKET)");
    }
}

/// How often to send `WATCHDOG=1`, from the environment the service manager
/// set: half of `WATCHDOG_USEC` (microseconds), when `WATCHDOG_PID` is
/// unset or names `own_pid`. `None`: no watchdog asked of this process
/// (`WATCHDOG_USEC` unset, zero or not a number, or `WATCHDOG_PID` names
/// another process or is not a number).
pub fn watchdog_interval(
    watchdog_usec: Option<&str>,
    watchdog_pid: Option<&str>,
    own_pid: u32,
) -> Option<Duration> {
    let usec: u64 = watchdog_usec?.trim().parse().ok()?;
    if usec == 0 {
        return None;
    }
    if let Some(pid) = watchdog_pid {
        let pid: u32 = pid.trim().parse().ok()?;
        if pid != own_pid {
            return None;
        }
    }
    Some(Duration::from_micros(usec) / 2)
}

/// Starts sending `WATCHDOG=1` every [`watchdog_interval`] of this
/// process's environment, until the returned task is aborted (or the
/// process ends). `None` when no watchdog is asked for.
pub fn spawn_watchdog() -> Option<tokio::task::JoinHandle<()>> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    let period = watchdog_interval(usec.as_deref(), pid.as_deref(), std::process::id())?;
    tracing::info!(
        "service manager watchdog: WATCHDOG=1 every {}",
        humantime::format_duration(period)
    );
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            send(&[NotifyState::Watchdog], "WATCHDOG=1");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_interval_is_half_the_timeout_for_this_process() {
        let ms = Duration::from_millis;
        assert_eq!(watchdog_interval(Some("200000"), None, 7), Some(ms(100)));
        assert_eq!(
            watchdog_interval(Some("30000000"), Some("7"), 7),
            Some(ms(15_000))
        );
        assert_eq!(
            watchdog_interval(Some("3"), None, 7),
            Some(Duration::from_nanos(1500))
        );
    }

    #[test]
    fn no_watchdog_when_unset_zero_malformed_or_for_another_process() {
        assert_eq!(watchdog_interval(None, None, 7), None);
        assert_eq!(watchdog_interval(None, Some("7"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("-5"), None, 7), None);
        assert_eq!(watchdog_interval(Some("30s"), None, 7), None);
        assert_eq!(watchdog_interval(Some("200000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("200000"), Some("x"), 7), None);
    }
}
