//! A running host follows the deployments bucket: a new value for one of
//! its handlers is fetched, checked against its digest, and put in place
//! through [`super::install`].
//!
//! The KV watch is the fast path. Watches are known to end quietly (a
//! broker restart, a reconnect, a consumer the server dropped): when the
//! watch ends or errs it is made again, and a slow poll ([`POLL`]) reads
//! every handler's key anyway, so a missed update is picked up within that
//! time whatever happened to the watch. Only a record the host believes
//! ([`super::trust`]: signed by a trusted deploy key, for this handler, in
//! its place in the history) is acted on; any other value, a component
//! missing from the modules bucket or one that does not hash to its name
//! is refused like a component that does not load: reported once, counted
//! (`idem_deploy_refused_total`), the running version kept. A host without
//! `[deploy] trusted_keys` follows nothing. A record put in place raises
//! the handler's high-water mark in the database
//! ([`DeployStore::raise_mark`]).

use super::record::Deployment;
use super::store::{Current, DeployStore};
use super::trust::Refusal;
use super::{Installed, install};
use crate::runtime::component_slot::ComponentSlot;
use crate::runtime::{LoadOptions, Runtime};
use futures::StreamExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often every followed handler's key is read, watch or no watch.
pub const POLL: Duration = Duration::from_secs(30);

/// What a host (or `idem replay`, `idem dlq redrive`) without trusted
/// deploy keys says once at start.
pub const NO_TRUSTED_KEYS: &str = "no [deploy] trusted_keys: deployments are not followed and each handler runs its configured module; add the public key of your deploy key (`idem keygen FILE` makes one) to follow `idem deploy`";

/// How long a refused version is left alone before it is tried again.
pub const RETRY_REFUSED: Duration = Duration::from_secs(60);

/// One handler a host follows.
pub struct Followed {
    /// The handler's name (its key in the deployments bucket).
    pub name: String,
    /// Where its component is kept.
    pub slot: Arc<ComponentSlot>,
    /// How its components load (`wasi` from the host's config, never from
    /// the deployment).
    pub options: LoadOptions,
    /// The runtime its components are loaded into.
    pub runtime: Arc<Runtime>,
}

impl Followed {
    /// `handler`, prepared from `cfg`: its slot and runtime, and `wasi`
    /// from the config.
    pub fn of(
        cfg: &crate::config::HandlerConfig,
        handler: &crate::pipeline::step::PreparedHandler,
    ) -> Self {
        Followed {
            name: cfg.name.clone(),
            slot: handler.slot().clone(),
            options: LoadOptions { wasi: cfg.wasi },
            runtime: handler.runtime().clone(),
        }
    }
}

/// Puts `handler`'s deployment `current` in place when it is a record to
/// believe ([`DeployStore::believe`]) and not what the handler runs (or
/// last refused). Returns what happened, for the log.
///
/// # Errors
/// One line: the record is not believed, its component cannot be fetched
/// or does not load, or its history cannot be read. A refusal is
/// remembered in the slot and counted.
pub async fn apply(
    store: &DeployStore,
    handler: &Followed,
    current: &Current,
) -> Result<Installed, String> {
    let judged = match store.believe(&handler.name, current).await {
        Ok(judged) => judged,
        Err(e) => {
            tracing::debug!(handler = %handler.name, error = %format!("{e:#}"), "cannot judge the deployment record; trying again later");
            return Err(format!("{e:#}"));
        }
    };
    match judged {
        Ok(deployment) => apply_believed(store, handler, current.revision, &deployment).await,
        Err(refused) => {
            handler.slot.saw_revision(current.revision);
            let digest = match &current.deployment {
                Ok(d) => d.digest.clone(),
                Err(_) => format!("revision {}", current.revision),
            };
            refuse(
                handler,
                &digest,
                &refused.detail,
                current.revision,
                refused.reason,
            );
            Err(refused.detail)
        }
    }
}

/// Puts `deployment` (the record at `revision`, believed) in place when it
/// is not what the handler runs (or last refused). Whatever the outcome,
/// the slot then notes `revision` as seen
/// ([`ComponentSlot::saw_revision`]): its report answers that record.
///
/// # Errors
/// One line: the component cannot be fetched or does not load; the
/// refusal is remembered in the slot and counted.
pub async fn apply_believed(
    store: &DeployStore,
    handler: &Followed,
    revision: u64,
    deployment: &Deployment,
) -> Result<Installed, String> {
    let outcome = put_in_place(store, handler, revision, deployment).await;
    handler.slot.saw_revision(revision);
    outcome
}

async fn put_in_place(
    store: &DeployStore,
    handler: &Followed,
    revision: u64,
    deployment: &Deployment,
) -> Result<Installed, String> {
    let digest = &deployment.digest;
    if handler.slot.current().digest() == digest {
        // The record names what runs: nothing is refused any more.
        handler.slot.clear_refused();
        store
            .trust()
            .running_now(&handler.name, revision, deployment.sequence);
        store.raise_mark(&handler.name, revision, deployment).await;
        return Ok(Installed::Unchanged);
    }
    // A refused version is tried again once its refusal is older than
    // RETRY_REFUSED (the cause may be gone: an object put back, a broker
    // that answers again), or at once when the record is a new one (a
    // redeploy of the same digest).
    if let Some(r) = handler.slot.refused()
        && &r.digest == digest
        && r.revision == Some(revision)
        && r.at.elapsed().unwrap_or_default() < RETRY_REFUSED
    {
        return Ok(Installed::Unchanged);
    }
    let bytes = match store.fetch_module(digest, Some(deployment.size)).await {
        Ok(bytes) => bytes,
        Err(e) => {
            let reason = format!("{e:#}");
            refuse(handler, digest, &reason, revision, Refusal::Component);
            return Err(reason);
        }
    };
    let origin = PathBuf::from(format!("deployment {digest}"));
    let before = handler.slot.refused().map(|r| (r.digest, r.reason));
    let installed = install(
        &handler.runtime,
        &handler.slot,
        bytes,
        origin,
        handler.options,
        Some(revision),
    )
    .await;
    match installed {
        Ok(installed) => {
            store
                .trust()
                .running_now(&handler.name, revision, deployment.sequence);
            store.raise_mark(&handler.name, revision, deployment).await;
            if let Installed::Swapped { .. } = &installed {
                tracing::info!(handler = %handler.name, digest = %digest, revision, signer = %deployment.signer, deployed_at = ?deployment.deployed_at, note = %deployment.note, by = %deployment.by, "deployed version in place");
            }
            Ok(installed)
        }
        Err(e) => {
            // `install` remembered the refusal and logged it when it was
            // news; count it then too.
            if handler.slot.refused().map(|r| (r.digest, r.reason)) != before {
                crate::metrics::deploy_refused(&handler.name, Refusal::Component.label());
            }
            Err(e.to_string())
        }
    }
}

/// Remembers the refusal in the slot; the first time (another digest or
/// reason than the last refusal) logs and counts it.
fn refuse(handler: &Followed, digest: &str, reason: &str, revision: u64, why: Refusal) {
    if handler.slot.refuse(digest, reason, Some(revision)) {
        crate::metrics::deploy_refused(&handler.name, why.label());
        tracing::warn!(handler = %handler.name, digest = %digest, revision, reason = why.label(), error = %reason, "deployed version refused; the running version keeps running");
    }
}

/// Follows the deployments of `handlers` until `stop` is cancelled.
pub fn spawn(
    store: DeployStore,
    handlers: Vec<Followed>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    if store.trust().is_empty() {
        tracing::warn!("{NO_TRUSTED_KEYS}");
        return tokio::spawn(async {});
    }
    tokio::spawn(async move {
        let names: Vec<String> = handlers.iter().map(|h| h.name.clone()).collect();
        let (first, max) = (Duration::from_millis(200), Duration::from_secs(10));
        let mut waits = crate::backoff::doubling(first, max);
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Whatever the watch missed while it was down, read it now.
            reconcile(&store, &handlers).await;
            let mut watch = match store.deployments().watch_many(names.iter()).await {
                Ok(w) => {
                    waits = crate::backoff::doubling(first, max);
                    w
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot watch the deployments bucket; polling until it can be watched");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(waits.next().unwrap_or(max)) => continue,
                    }
                }
            };
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = poll.tick() => reconcile(&store, &handlers).await,
                    item = watch.next() => match item {
                        Some(Ok(entry)) => {
                            let Some(h) = handlers.iter().find(|h| h.name == entry.key) else { continue };
                            if let Some(current) = current_of(entry) {
                                let _ = apply(&store, h, &current).await;
                            }
                        }
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "the deployments watch failed; watching again");
                            break;
                        }
                        None => {
                            tracing::debug!("the deployments watch ended; watching again");
                            break;
                        }
                    },
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(waits.next().unwrap_or(max)) => {}
            }
        }
    })
}

/// Reads every handler's key and applies what differs.
async fn reconcile(store: &DeployStore, handlers: &[Followed]) {
    for h in handlers {
        match store.current(&h.name).await {
            Ok(Some(current)) => {
                let _ = apply(store, h, &current).await;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(handler = %h.name, error = %e, "cannot read the deployments bucket; trying again later")
            }
        }
    }
}

fn current_of(entry: async_nats::jetstream::kv::Entry) -> Option<Current> {
    (entry.operation == async_nats::jetstream::kv::Operation::Put).then(|| Current {
        revision: entry.revision,
        deployment: super::record::Deployment::parse(&entry.value),
    })
}
