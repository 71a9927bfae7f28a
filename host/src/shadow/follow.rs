//! A running host reads each followed handler's key in the shadows bucket
//! every [`POLL`]. A new record is believed only when signed by a key of
//! `[deploy] trusted_keys`, for this handler ([`ShadowRecord::believed`]);
//! then its candidate is fetched from the modules bucket (checked against
//! its digest and size), compiled and instantiated once off the message
//! path ([`crate::deploy::load_checked`]), and put in the handler's
//! [`ShadowSlot`]. A record that is not believed, or whose component does
//! not load, is refused: logged once, shown in the host's report, tried
//! again after [`RETRY_REFUSED`]. A deleted key takes the candidate out.
//! The live version is never touched.

use super::record::ShadowRecord;
use super::{Candidate, ShadowSlot};
use crate::deploy::store::DeployStore;
use crate::runtime::component_slot::ComponentSlot;
use crate::runtime::{LoadOptions, Runtime};
use async_nats::jetstream::kv::Operation;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often each handler's key in the shadows bucket is read.
pub const POLL: Duration = Duration::from_secs(1);

/// How long a host without the shadows bucket waits before it looks for
/// it again (a deployer's command creates it).
pub const BUCKET_RETRY: Duration = Duration::from_secs(2);

/// How long a refused record is left alone before it is tried again.
pub const RETRY_REFUSED: Duration = Duration::from_secs(60);

/// One handler whose shadow a host follows.
pub struct Shadowed {
    /// The handler's name (its key in the shadows bucket).
    pub name: String,
    /// Where its candidate goes.
    pub shadow: Arc<ShadowSlot>,
    /// Its live component (named in the log when a candidate goes in).
    pub live: Arc<ComponentSlot>,
    /// The runtime its components are loaded into.
    pub runtime: Arc<Runtime>,
    /// How its components load (`wasi` from the host's config).
    pub options: LoadOptions,
}

/// What the follower last did with a handler's key.
#[derive(Clone, Copy)]
struct Acted {
    revision: u64,
    /// When it was refused; `None`: in place.
    refused_at: Option<Instant>,
}

/// Follows the shadows of `handlers` until `stop` is cancelled. A host
/// without trusted deploy keys follows none.
pub fn spawn(
    store: DeployStore,
    handlers: Vec<Shadowed>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if store.trust().is_empty() || handlers.is_empty() {
            return;
        }
        let mut acted: HashMap<String, Acted> = HashMap::new();
        loop {
            let wait = match store.shadows().await {
                Ok(_) => {
                    for h in &handlers {
                        check(&store, h, &mut acted).await;
                    }
                    POLL
                }
                Err(e) => {
                    tracing::debug!(error = %format!("{e:#}"), "no shadows bucket yet; looking again later");
                    BUCKET_RETRY
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    })
}

/// Reads `h`'s key once and acts on what changed.
async fn check(store: &DeployStore, h: &Shadowed, acted: &mut HashMap<String, Acted>) {
    let Ok(bucket) = store.shadows().await else {
        return;
    };
    let entry = match bucket.entry(&h.name).await {
        Ok(entry) => entry.filter(|e| e.operation == Operation::Put),
        Err(e) => {
            tracing::debug!(handler = %h.name, error = %e, "cannot read the shadows bucket; trying again");
            return;
        }
    };
    let Some(entry) = entry else {
        if acted.remove(&h.name).is_some() {
            h.shadow.clear();
            tracing::info!(handler = %h.name, "shadow deployment removed; no candidate runs");
        }
        return;
    };
    if let Some(a) = acted.get(&h.name)
        && a.revision == entry.revision
        && a.refused_at.is_none_or(|at| at.elapsed() < RETRY_REFUSED)
    {
        return;
    }
    let revision = entry.revision;
    match candidate(store, h, &entry.value, revision).await {
        Ok(c) => {
            tracing::info!(handler = %h.name, candidate = %c.record.digest, against = %c.record.against, live = %h.live.current().digest(), sample_ppm = c.record.sample_ppm, revision, by = %crate::deploy::record::bounded(&c.record.by), "shadow candidate in place: it runs next to the live version, always rolled back");
            h.shadow.put(c);
            acted.insert(
                h.name.clone(),
                Acted {
                    revision,
                    refused_at: None,
                },
            );
        }
        Err((what, reason)) => {
            if h.shadow.refuse(&what, &reason) {
                tracing::warn!(handler = %h.name, record = %what, revision, error = %reason, "shadow deployment refused; no candidate runs");
            }
            acted.insert(
                h.name.clone(),
                Acted {
                    revision,
                    refused_at: Some(Instant::now()),
                },
            );
        }
    }
}

/// The candidate of the record `value` (at `revision`) of `h`.
///
/// # Errors
/// What was refused (the digest, or `revision N` when the value is not a
/// record) and why, in one line.
async fn candidate(
    store: &DeployStore,
    h: &Shadowed,
    value: &[u8],
    revision: u64,
) -> Result<Candidate, (String, String)> {
    let record = ShadowRecord::parse(value).map_err(|e| (format!("revision {revision}"), e))?;
    let refused = |reason: String| (record.digest.clone(), reason);
    record.believed(&h.name, store.trust()).map_err(&refused)?;
    let bytes = store
        .fetch_module(&record.digest, Some(record.size))
        .await
        .map_err(|e| refused(format!("{e:#}")))?;
    let origin = PathBuf::from(format!("shadow {}", record.digest));
    let component = crate::deploy::load_checked(&h.runtime, bytes, origin, h.options)
        .await
        .map_err(|e| refused(e.to_string()))?;
    Ok(Candidate {
        component,
        record,
        revision,
    })
}
