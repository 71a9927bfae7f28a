//! The component a handler runs, replaceable while it runs (hot deploy).
//!
//! A delivery takes one reference with [`ComponentSlot::current`] when it
//! starts and keeps it to its end: the receipt's digest and the guest call
//! come from that one reference, so a swap in between cannot make a receipt
//! name a component other than the one that produced the effect. A swap
//! ([`ComponentSlot::swap`]) affects only deliveries that start after it;
//! the old component is dropped when the last delivery holding it ends.
//!
//! The slot keeps `idem_handler_info` ([`crate::runtime::handler_info`]) on what it
//! holds: the current digest reads 1, the one it replaced last reads 0, and
//! no older version keeps a series.
//!
//! A version that fails to load on this host is remembered
//! ([`ComponentSlot::refuse`]) so it is reported once and shown in status,
//! while the current component keeps running.

use crate::runtime::HandlerComponent;
use crate::runtime::handler_info;
use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// One handler's current component, swapped atomically.
pub struct ComponentSlot {
    handler: Arc<str>,
    current: ArcSwap<HandlerComponent>,
    refused: Mutex<Option<Refused>>,
    /// The latest deployments-bucket revision acted on (0: none yet; KV
    /// revisions start at 1).
    seen: AtomicU64,
}

/// A version this host was given and could not load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Hex SHA-256 of the refused component's bytes.
    pub digest: String,
    /// Why, one line ([`crate::runtime::LoadError`]'s message).
    pub reason: String,
    /// When it was last refused (the host's clock).
    pub at: SystemTime,
    /// The deployments bucket's revision of the record that named it
    /// (`None`: from the module file).
    pub revision: Option<u64>,
}

impl ComponentSlot {
    /// A slot for handler `handler` holding `component`; its
    /// `idem_handler_info` series is that component's digest alone.
    pub fn new(handler: &str, component: Arc<HandlerComponent>) -> Self {
        handler_info::running(handler, component.digest(), component.wit());
        ComponentSlot {
            handler: Arc::from(handler),
            current: ArcSwap::new(component),
            refused: Mutex::new(None),
            seen: AtomicU64::new(0),
        }
    }

    /// The component a delivery starting now runs: take it once per
    /// delivery and use it for everything that delivery does.
    pub fn current(&self) -> Arc<HandlerComponent> {
        self.current.load_full()
    }

    /// Puts `next` in place for every delivery that starts from now on,
    /// moves `idem_handler_info` to its digest (the replaced one reads 0,
    /// any older one is removed), forgets a refused version, and returns
    /// the component it replaced.
    pub fn swap(&self, next: Arc<HandlerComponent>) -> Arc<HandlerComponent> {
        let (digest, wit) = (next.digest().to_owned(), next.wit());
        // Forgotten first: whoever sees the new version in place never
        // sees the refusal it replaced.
        if let Ok(mut refused) = self.refused.lock() {
            *refused = None;
        }
        let old = self.current.swap(next);
        handler_info::swapped(&self.handler, (old.digest(), old.wit()), (&digest, wit));
        old
    }

    /// Remembers that the version `digest` (from the deployment record at
    /// KV `revision`, when it came from one) could not be loaded, for
    /// `reason`, now. Returns whether this is news (another digest or
    /// another reason than the last refusal): the caller logs only then, so
    /// a version offered again and again is reported once.
    pub fn refuse(&self, digest: &str, reason: &str, revision: Option<u64>) -> bool {
        let Ok(mut refused) = self.refused.lock() else {
            return true;
        };
        let news = refused
            .as_ref()
            .is_none_or(|r| r.digest != digest || r.reason != reason);
        *refused = Some(Refused {
            digest: digest.to_owned(),
            reason: reason.to_owned(),
            at: SystemTime::now(),
            revision,
        });
        news
    }

    /// The last version refused since the current one was put in place.
    pub fn refused(&self) -> Option<Refused> {
        self.refused.lock().ok().and_then(|r| r.clone())
    }

    /// Notes that the deployment record at KV `revision` has been acted on
    /// (put in place, found in place, or refused): what the slot holds now
    /// is this host's answer to it. Keeps the highest revision seen.
    pub fn saw_revision(&self, revision: u64) {
        self.seen.fetch_max(revision, Ordering::Release);
    }

    /// The highest deployment revision acted on ([`Self::saw_revision`]),
    /// `None` before the first. Read it before [`Self::current`]: the
    /// component then read is at least the answer to that revision.
    pub fn seen_revision(&self) -> Option<u64> {
        Some(self.seen.load(Ordering::Acquire)).filter(|r| *r > 0)
    }

    /// Forgets a refused version (the deployment now names the one in
    /// place, so there is nothing refused to report).
    pub fn clear_refused(&self) {
        if let Ok(mut refused) = self.refused.lock() {
            *refused = None;
        }
    }
}

impl std::fmt::Debug for ComponentSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComponentSlot")
            .field("handler", &self.handler)
            .field("digest", &self.current().digest())
            .finish_non_exhaustive()
    }
}
