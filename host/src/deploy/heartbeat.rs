//! Each running host reports what it runs to the hosts bucket every
//! [`INTERVAL`]: per handler the digest in place, the version it refused
//! (if any), the latest deployment revision it acted on, deliveries in
//! flight and its counters. The bucket's entries
//! expire after [`super::store::HOST_REPORT_TTL`], so a host that stops
//! reporting (killed, partitioned) drops out of `idem status` by itself;
//! a host that stops cleanly deletes its entry.
//!
//! Anyone who can write to the bucket can put a report there, so a host
//! with `[deploy] host_key` signs its reports ([`HostReport::sign`]), and
//! `idem status` and `idem deploy --wait` tell a report signed by a key of
//! `[deploy] trusted_hosts` ([`HostReport::verified`]) from any other.
//! A signature proves who wrote a report, not when: a writer could put a
//! dead host's last signed report back. So a report is also judged fresh
//! ([`HostReport::fresh`]) by the time the broker stored it, which the
//! writer does not choose, against the signed time it was made.

use super::store::DeployStore;
use crate::metrics::HandlerStats;
use crate::runtime::component_slot::ComponentSlot;
use crate::shadow::{ShadowReport, ShadowSlot};
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
    /// The public key of the host key that signed it (`N…`), empty when
    /// unsigned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signer: String,
    /// Hex ed25519 signature of [`HostReport::signed_bytes`], empty when
    /// unsigned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature: String,
}

/// The most a fresh report's signed `reported_at` may lie before the time
/// the broker stored it: the bucket's entry lifetime
/// ([`super::store::HOST_REPORT_TTL`]) plus this much for the host's clock
/// being behind the broker's.
pub const CLOCK_TOLERANCE: Duration = Duration::from_secs(10);

/// What a report's signature is made over, first.
const SIGNED_CONTEXT: &str = "idem-host-report/1";

impl HostReport {
    /// What the signature covers: every field but the signature, after a
    /// context string of its own (a JSON array).
    pub fn signed_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&(
            SIGNED_CONTEXT,
            &self.host,
            &self.started_at,
            &self.reported_at,
            &self.handlers,
            &self.signer,
        ))
        .unwrap_or_default()
    }

    /// Signs the report with `key` (a host key).
    ///
    /// # Errors
    /// The key has no seed.
    pub fn sign(&mut self, key: &nkeys::KeyPair) -> Result<(), String> {
        self.signer = key.public_key();
        self.signature = super::keys::sign(key, &self.signed_bytes())?;
        Ok(())
    }

    /// Whether the report, read under KV key `key`, is signed by one of
    /// `trusted` (host keys) and names itself `key`.
    pub fn verified(&self, key: &str, trusted: &[nkeys::KeyPair]) -> bool {
        self.host == key
            && trusted.iter().any(|k| {
                k.public_key() == self.signer
                    && super::keys::verifies(k, &self.signed_bytes(), &self.signature)
            })
    }
}

impl HostReport {
    /// Whether the report was made recently enough before `stored_ms`, the
    /// broker's time (Unix ms) when its bucket entry was written: its
    /// signed `reported_at` is at most [`super::store::HOST_REPORT_TTL`] +
    /// [`CLOCK_TOLERANCE`] earlier. A report put back after its host
    /// stopped is stale within that time; one with an unreadable
    /// `reported_at` is never fresh. A time ahead of the broker's is fresh
    /// (a host clock ahead is no replay).
    pub fn fresh(&self, stored_ms: i64) -> bool {
        let limit = (super::store::HOST_REPORT_TTL + CLOCK_TOLERANCE).as_millis();
        crate::broker::clock::parse_ts(&self.reported_at).is_some_and(|made| {
            stored_ms.saturating_sub(made) <= i64::try_from(limit).unwrap_or(i64::MAX)
        })
    }
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
    /// The latest deployments-bucket revision for this handler the host
    /// has acted on (put in place, found in place or refused): the digest
    /// and refusal above answer that record. `idem deploy --wait` compares
    /// it to the revision it wrote, so no clock is compared across
    /// machines. Absent before the first record, and from hosts that do
    /// not follow deployments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_revision: Option<u64>,
    /// The handler has `watch = true`: it runs its module file and does
    /// not follow deployments.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub watched: bool,
    /// The handler's shadow deployment on this host, if any
    /// ([`crate::shadow`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowReport>,
}

/// What the heartbeat reads for one handler.
pub struct Reported {
    /// The handler's name.
    pub name: String,
    /// Its component slot.
    pub slot: Arc<ComponentSlot>,
    /// Its counters.
    pub stats: Arc<HandlerStats>,
    /// Whether it has `watch = true` (runs its module file, follows no
    /// deployments).
    pub watched: bool,
    /// Its shadow candidate, if any.
    pub shadow: Arc<ShadowSlot>,
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

/// The most bytes of JSON a host's report takes before the divergences of
/// its shadows are left out of it, the most kept first: well under what
/// `idem status` reads of one report (256 KiB) and a NATS message's
/// default maximum (1 MiB).
pub const MAX_SHADOW_BYTES: usize = 128 * 1024;

/// The report of `handlers` now.
pub fn report(host: &str, started_at: &str, handlers: &[Reported]) -> HostReport {
    let mut report = unbounded_report(host, started_at, handlers);
    fit(&mut report);
    report
}

/// Leaves divergences out of `report`, from the shadow keeping the most,
/// until its JSON is at most [`MAX_SHADOW_BYTES`] or none is left.
fn fit(report: &mut HostReport) {
    // Serialized once; then each divergence left out takes its own size
    // (and a comma) off.
    let mut size = serde_json::to_vec(&report).map_or(0, |v| v.len());
    while size > MAX_SHADOW_BYTES {
        let most = report
            .handlers
            .iter_mut()
            .filter_map(|h| h.shadow.as_mut())
            .max_by_key(|s| s.divergences.len());
        match most.and_then(|s| s.divergences.pop()) {
            Some(d) => size -= serde_json::to_vec(&d).map_or(0, |v| v.len()) + 1,
            None => break,
        }
    }
}

fn unbounded_report(host: &str, started_at: &str, handlers: &[Reported]) -> HostReport {
    HostReport {
        host: host.to_owned(),
        started_at: started_at.to_owned(),
        reported_at: now(),
        handlers: handlers
            .iter()
            .map(|h| {
                let s = h.stats.snapshot();
                // Before the digest: what is read then answers this
                // revision at least.
                let seen_revision = h.slot.seen_revision();
                let digest = h.slot.current().digest().to_owned();
                HandlerReport {
                    name: h.name.clone(),
                    shadow: h.shadow.report(&digest),
                    digest,
                    refused: h.slot.refused().map(|r| (r.digest, r.reason)),
                    in_flight: h.stats.in_flight_now(),
                    processed: s.processed,
                    duplicates: s.duplicates,
                    dead_lettered: s.dead_lettered,
                    seen_revision,
                    watched: h.watched,
                }
            })
            .collect(),
        signer: String::new(),
        signature: String::new(),
    }
}

/// Reports `handlers` every [`INTERVAL`] until `stop`, signed with
/// `[deploy] host_key` when set, then deletes the entry.
pub fn spawn(
    store: DeployStore,
    handlers: Vec<Reported>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    // Checked at config load; a file changed since is reported here.
    let key = store.config().host_key.as_ref().and_then(|path| {
        match super::keys::read_seed(path, super::keys::Role::Host) {
            Ok(key) => Some(key),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read [deploy] host_key; this host's reports are unsigned (idem status shows them as unverified)");
                None
            }
        }
    });
    tokio::spawn(async move {
        let id = host_id();
        let started_at = now();
        let mut tick = tokio::time::interval(INTERVAL);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let mut report = report(&id, &started_at, &handlers);
            if let Some(key) = &key
                && let Err(e) = report.sign(key)
            {
                tracing::debug!(error = %e, "cannot sign the report");
            }
            let value = serde_json::to_vec(&report).unwrap_or_default();
            if let Err(e) = store.hosts().put(&id, value.into()).await {
                tracing::debug!(error = %e, "cannot report to the hosts bucket; trying again");
            }
        }
        let _ = store.hosts().delete(&id).await;
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn report(host: &str) -> HostReport {
        HostReport {
            host: host.into(),
            started_at: "2026-12-01T00:00:00Z".into(),
            reported_at: "2026-12-01T00:00:03Z".into(),
            handlers: vec![HandlerReport {
                name: "h".into(),
                digest: "a".repeat(64),
                refused: None,
                in_flight: 0,
                processed: 7,
                duplicates: 0,
                dead_lettered: 0,
                seen_revision: Some(3),
                watched: false,
                shadow: None,
            }],
            signer: String::new(),
            signature: String::new(),
        }
    }

    #[test]
    fn only_a_report_a_trusted_host_signed_under_its_own_name_is_verified() {
        let (key, other) = (nkeys::KeyPair::new_server(), nkeys::KeyPair::new_server());
        let trusted = [nkeys::KeyPair::from_public_key(&key.public_key()).unwrap()];
        let mut r = report("a-1");
        assert!(!r.verified("a-1", &trusted));
        r.sign(&key).unwrap();
        // Through the bucket and back.
        let r: HostReport = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert!(r.verified("a-1", &trusted));
        assert!(!r.verified("b-1", &trusted), "under another key");
        assert!(!r.verified("a-1", &[]), "nobody trusted");
        let mut edited = r.clone();
        edited.handlers[0].digest = "b".repeat(64);
        assert!(!edited.verified("a-1", &trusted));
        let mut edited = r.clone();
        edited.handlers[0].seen_revision = Some(4);
        assert!(
            !edited.verified("a-1", &trusted),
            "the seen revision is signed"
        );
        let mut theirs = report("a-1");
        theirs.sign(&other).unwrap();
        assert!(!theirs.verified("a-1", &trusted));
    }

    #[test]
    fn shadow_divergences_are_left_out_past_the_report_bound() {
        use crate::shadow::compare::{Divergence, Side};
        let side = Side {
            verdict: "ok".into(),
            first: 1,
            statements: vec!["x".repeat(400); 6],
            total: 6,
        };
        let divergence = Divergence {
            message_id: "m".into(),
            subject: "s".into(),
            stream_sequence: 1,
            what: "statement 1: the SQL differs".into(),
            live: side.clone(),
            candidate: side,
        };
        let mut r = report("a-1");
        let one = r.handlers[0].clone();
        r.handlers = (0..40)
            .map(|i| HandlerReport {
                name: format!("h{i}"),
                shadow: Some(ShadowReport {
                    candidate: "c".repeat(64),
                    against: "a".repeat(64),
                    sample_ppm: 1_000_000,
                    revision: 1,
                    active: true,
                    compared: 5,
                    agreed: 0,
                    diverged: 5,
                    skipped: 0,
                    refused: None,
                    divergences: vec![divergence.clone(); 5],
                }),
                ..one.clone()
            })
            .collect();
        assert!(serde_json::to_vec(&r).unwrap().len() > 4 * MAX_SHADOW_BYTES);
        fit(&mut r);
        let len = serde_json::to_vec(&r).unwrap().len();
        assert!(len <= MAX_SHADOW_BYTES, "{len}");
        let kept: usize = r
            .handlers
            .iter()
            .map(|h| h.shadow.as_ref().unwrap().divergences.len())
            .sum();
        assert!((1..200).contains(&kept), "{kept}");
        // Counts stay whole.
        assert!(
            r.handlers
                .iter()
                .all(|h| h.shadow.as_ref().unwrap().diverged == 5)
        );
    }

    #[test]
    fn a_report_is_fresh_only_within_the_entry_lifetime_and_tolerance_of_its_storing() {
        // Made at 2026-12-01T00:00:03Z.
        let made = 1_796_083_203_000_i64;
        let r = report("a-1");
        assert!(r.fresh(made));
        assert!(r.fresh(made - 60_000), "a host clock ahead is no replay");
        assert!(r.fresh(made + 25_000));
        assert!(!r.fresh(made + 25_001), "15 s lifetime + 10 s tolerance");
        assert!(!r.fresh(made + 3_600_000));
        let mut garbled = r.clone();
        garbled.reported_at = "yesterday".into();
        assert!(!garbled.fresh(made));
    }
}
