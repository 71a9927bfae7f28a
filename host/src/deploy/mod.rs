//! Hot deploy: a new version of a handler's component reaches a running
//! host and replaces the old one between deliveries, without a restart.
//!
//! Every source of a new version (`idem deploy` through the broker's
//! buckets, [`store`] and [`follow`]; the module file under `watch = true`,
//! [`watch`]) goes through the one path of [`install`]: the bytes are
//! hashed; a digest the handler already runs changes nothing; otherwise the
//! component is validated and compiled on a blocking thread (never on the
//! tokio workers that run messages), and only a component that loads is
//! swapped in ([`crate::runtime::component_slot`]). One that does not is refused,
//! remembered and reported once; the old version keeps running.
//!
//! What the broker's buckets hold is believed only when signed: a
//! deployment by a trusted deploy key ([`trust`], [`keys`]), a host's
//! report by a trusted host key ([`heartbeat`]).

pub mod at_start;
mod buckets;
pub mod follow;
pub mod heartbeat;
pub mod keys;
pub mod record;
pub mod store;
pub mod trust;
pub mod watch;

pub use record::Deployment;

use crate::runtime::component_slot::ComponentSlot;
use crate::runtime::{HandlerComponent, LoadError, LoadOptions, Runtime};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;

/// What [`install`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// The handler already runs a component with these bytes.
    Unchanged,
    /// The new component is in place.
    Swapped {
        /// The digest it replaced.
        from: String,
        /// The digest now running.
        to: String,
    },
}

/// Validates and compiles `bytes` (read from `origin`, named in errors;
/// `revision`: the deployments bucket's record it came from, if any) on
/// a blocking thread, instantiates it once ([`Runtime::check_instantiates`])
/// and swaps the result into `slot`; logs the swap, or
/// the refusal once per refused digest.
///
/// # Errors
/// The component does not load ([`LoadError`]: not a component, another
/// world, an import the host does not provide, does not compile, traps
/// when instantiated); `slot`
/// is unchanged and remembers the refusal.
pub async fn install(
    runtime: &Arc<Runtime>,
    slot: &ComponentSlot,
    bytes: Vec<u8>,
    origin: PathBuf,
    options: LoadOptions,
    revision: Option<u64>,
) -> Result<Installed, LoadError> {
    let digest = hex::encode(Sha256::digest(&bytes));
    let current = slot.current();
    if current.digest() == digest {
        return Ok(Installed::Unchanged);
    }
    let loaded = load_checked(runtime, bytes, origin.clone(), options).await;
    match loaded {
        Ok(component) => {
            let to = component.digest().to_owned();
            let old = slot.swap(component);
            tracing::info!(from = %old.digest(), to = %to, origin = %origin.display(), "new component in place; deliveries already started finish on the old one");
            Ok(Installed::Swapped {
                from: old.digest().to_owned(),
                to,
            })
        }
        Err(e) => {
            if slot.refuse(&digest, &e.to_string(), revision) {
                tracing::warn!(digest = %digest, error = %e, "new component refused; the old one keeps running");
            }
            Err(e)
        }
    }
}

/// Validates and compiles `bytes` (read from `origin`, named in errors) on
/// a blocking thread, never on the tokio workers that run messages, and
/// instantiates the result once ([`Runtime::check_instantiates`]): a
/// component that traps when instantiated would fail every message.
///
/// # Errors
/// As [`install`].
pub async fn load_checked(
    runtime: &Arc<Runtime>,
    bytes: Vec<u8>,
    origin: PathBuf,
    options: LoadOptions,
) -> Result<Arc<HandlerComponent>, LoadError> {
    let rt = runtime.clone();
    let path = origin.clone();
    let component = tokio::task::spawn_blocking(move || rt.load_bytes(&bytes, &path, options))
        .await
        .unwrap_or_else(|e| {
            Err(LoadError::Invalid {
                path: origin.clone(),
                detail: format!("the compile task failed: {e}"),
            })
        })?;
    match runtime.check_instantiates(&component).await {
        Ok(()) => Ok(component),
        Err(detail) => Err(LoadError::Invalid {
            path: origin,
            detail,
        }),
    }
}
