//! Each running host reports what it runs to the hosts bucket every
//! [`INTERVAL`]: per handler the digest in place, the version it refused
//! (if any), deliveries in flight and its counters. The bucket's entries
//! expire after [`super::store::HOST_REPORT_TTL`], so a host that stops
//! reporting (killed, partitioned) drops out of `idem status` by itself;
//! a host that stops cleanly deletes its entry.

use super::store::DeployStore;
use crate::component_slot::ComponentSlot;
use crate::metrics::HandlerStats;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio_util::sync::CancellationToken;

/// How often a host reports.
pub const INTERVAL: Duration = Duration::from_secs(3);

/// One host's report: the value of its key in the hosts bucket (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostReport {
    /// The host's id (its key): `<hostname>-<pid>`.
    pub host: String,
    /// Since when it runs, RFC 3339 UTC.
    pub started_at: String,
    /// When it wrote this report, RFC 3339 UTC.
    pub reported_at: String,
    /// Every handler it runs.
    pub handlers: Vec<HandlerReport>,
}

/// What a host runs for one handler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandlerReport {
    /// The handler's name.
    pub name: String,
    /// The digest of the component in place.
    pub digest: String,
    /// The last version this host refused since the current one went in:
    /// its digest (or the KV revision of a record that was not one) and
    /// why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<(String, String)>,
    /// Deliveries in flight now.
    pub in_flight: u64,
    /// Effects committed since the host started.
    pub processed: u64,
    /// Duplicates skipped since the host started.
    pub duplicates: u64,
    /// Dead letters written since the host started.
    pub dead_lettered: u64,
}

/// What the heartbeat reads for one handler.
pub struct Reported {
    /// The handler's name.
    pub name: String,
    /// Its component slot.
    pub slot: Arc<ComponentSlot>,
    /// Its counters.
    pub stats: Arc<HandlerStats>,
}

/// This process's id in the hosts bucket: `<hostname>-<pid>`, with every
/// character a KV key may not hold replaced by `_`.
pub fn host_id() -> String {
    let name = hostname();
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{clean}-{}", std::process::id())
}

/// This machine's host name (Linux's `/proc/sys/kernel/hostname`), or
/// `host` when it cannot be read.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "host".to_owned())
}

fn now() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// The report of `handlers` now.
pub fn report(host: &str, started_at: &str, handlers: &[Reported]) -> HostReport {
    HostReport {
        host: host.to_owned(),
        started_at: started_at.to_owned(),
        reported_at: now(),
        handlers: handlers
            .iter()
            .map(|h| {
                let s = h.stats.snapshot();
                HandlerReport {
                    name: h.name.clone(),
                    digest: h.slot.current().digest().to_owned(),
                    refused: h.slot.refused().map(|r| (r.digest, r.reason)),
                    in_flight: h.stats.in_flight_now(),
                    processed: s.processed,
                    duplicates: s.duplicates,
                    dead_lettered: s.dead_lettered,
                }
            })
            .collect(),
    }
}

/// Reports `handlers` every [`INTERVAL`] until `stop`, then deletes the
/// entry.
pub fn spawn(
    store: DeployStore,
    handlers: Vec<Reported>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let id = host_id();
        let started_at = now();
        let mut tick = tokio::time::interval(INTERVAL);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let value =
                serde_json::to_vec(&report(&id, &started_at, &handlers)).unwrap_or_default();
            if let Err(e) = store.hosts().put(&id, value.into()).await {
                tracing::debug!(error = %e, "cannot report to the hosts bucket; trying again");
            }
        }
        let _ = store.hosts().delete(&id).await;
    })
}
