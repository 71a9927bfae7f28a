//! `watch = true`: the handler's `module` file is watched, and a changed
//! file goes through [`super::install`] (validate, compile, swap).
//!
//! The file's directory is watched (notify, inotify on Linux), not the file:
//! a file replaced by a rename, as editors and `cp`-then-`mv` deploys do,
//! keeps being seen. Events are debounced ([`QUIET`]), so a file written in
//! several steps is read once it has been still; a file read half-written
//! is refused (it is not a valid component) and the completed write, one
//! event later, loads. A slow poll of the file's size and modification
//! time ([`POLL`]) backs the watch on file systems that send no events
//! (NFS, some container mounts).
//!
//! An event is a hint, not a change: inotify also reports the file being
//! opened, by this host's own read among others, so the file is read only
//! when its stamp (size, modification and change times, inode) differs
//! from the one it had when it was last read. A read never causes the
//! next.
//!
//! A handler with `watch = true` is not followed through the deployments
//! bucket ([`super::at_start`]): its file is its one source of versions.

use crate::runtime::component_slot::ComponentSlot;
use crate::runtime::{LoadOptions, Runtime};
use notify_debouncer_mini::notify::RecursiveMode;
use notify_debouncer_mini::{DebounceEventResult, new_debouncer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long the file must be still before it is read.
pub const QUIET: Duration = Duration::from_millis(250);
/// How often the file's size and modification time are compared when no
/// event came.
pub const POLL: Duration = Duration::from_secs(10);

/// Watches `module` for handler `slot` until `stop` is cancelled.
///
/// # Errors
/// The directory of `module` cannot be watched (it does not exist, or the
/// system's inotify limits are reached): one line naming it.
pub fn spawn(
    runtime: Arc<Runtime>,
    slot: Arc<ComponentSlot>,
    module: PathBuf,
    options: LoadOptions,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let dir = module
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let (changed, mut events) = tokio::sync::mpsc::unbounded_channel::<()>();
    let name = module.file_name().map(|n| n.to_owned());
    let mut debouncer = new_debouncer(QUIET, move |result: DebounceEventResult| match result {
        Ok(events) => {
            if events.iter().any(|e| e.path.file_name() == name.as_deref()) {
                let _ = changed.send(());
            }
        }
        Err(e) => tracing::warn!(error = %e, "module file watch reported an error"),
    })
    .map_err(|e| anyhow::anyhow!("cannot watch {}: {e}", dir.display()))?;
    debouncer
        .watcher()
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| anyhow::anyhow!("cannot watch {} for `watch = true`: {e}", dir.display()))?;
    Ok(tokio::spawn(async move {
        // Dropping the debouncer ends the watch: keep it for the task's life.
        let _debouncer = debouncer;
        // The first poll tick is at once: a file changed between the
        // host's load and this task's start is read then (an unchanged one
        // hashes to the digest in place and changes nothing).
        let mut seen = None;
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                event = events.recv() => if event.is_none() { return },
                _ = poll.tick() => {}
            }
            let now = stamp(&module);
            if now.is_none() || now == seen {
                continue;
            }
            seen = now;
            let bytes = match tokio::fs::read(&module).await {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::debug!(module = %module.display(), error = %e, "watched module file not readable now; waiting for the next change");
                    continue;
                }
            };
            // Refusals are logged by `install`, once per digest.
            let _ = super::install(&runtime, &slot, bytes, module.clone(), options, None).await;
        }
    }))
}

/// What tells one content of the file from the next without reading it:
/// size, modification and status-change times (nanoseconds) and inode (a
/// file renamed over it is another inode, even with the old times kept by
/// `cp -p`). `None` when the file cannot be read now.
type Stamp = (u64, i64, i64, i64, i64, u64);

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
        m.ino(),
    ))
}
