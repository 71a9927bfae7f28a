//! The files of the compiled-component cache (ARCHITECTURE.md,
//! "Compiled-component cache"): one file per component and engine, named by
//! the SHA-256 of the component's bytes (the digest idem reports anyway)
//! under a directory named by the engine's compatibility hash, loaded by
//! mapping a private copy made in the kernel (wasmtime's
//! `Component::deserialize_file`: no copy through user space, no
//! decompression, no second hash of the bytes), written whole under a
//! temporary name and renamed into place, the least recently used removed
//! past [`MAX_FILES`] or [`MAX_BYTES`].
//!
//! Whether the tree may be used at all is [`super::cache`]'s to say, right
//! before each load.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The most compiled files the cache keeps; past it the least recently
/// used are removed after a write.
pub const MAX_FILES: usize = 1_000;

/// The most bytes of compiled files the cache keeps (4 GiB); past it the
/// least recently used are removed after a write. A compiled Python
/// component is about 40 MiB.
pub const MAX_BYTES: u64 = 4 << 30;

/// A temporary file older than this is a write that died (a process
/// killed mid-write) and may be removed.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// The directory under `modules/` holding code `engine` can load: named by
/// [`Engine::precompile_compatibility_hash`] (the wasmtime version, target
/// and settings), so an engine never finds another's code under its names.
/// wasmtime checks the same again when it loads a file.
pub(crate) fn engine_dir(engine: &Engine) -> String {
    // `DefaultHasher::new()` is the same in every process of one build; a
    // build whose hasher differs only misses the cache once.
    let mut h = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("idem-{:016x}", h.finish())
}

/// What [`fetch`] found.
pub(crate) enum Fetched {
    /// The compiled component, from a private copy of its file.
    Hit(Component),
    /// No file under that name.
    Absent,
    /// A file that could not be read or that wasmtime refused (why, one
    /// line); the compile that follows writes a new one over it.
    Unusable(String),
}

/// Loads the compiled component in `file`, if there is one, from a private
/// copy in memory ([`private_copy`]): what runs does not change, and the
/// host does not die of a bus error, if the file is later truncated or
/// rewritten in place (a backup restored, a shared file system).
///
/// # Safety
/// wasmtime runs the file's contents as machine code: the caller has
/// checked, right before, that `file` is a regular file of idem's user
/// (`me`) in a tree nobody else may write
/// ([`super::cache::CompiledCache::inspect`]), so it is one [`keep`]
/// wrote. The copy is checked again on its descriptor.
#[allow(unsafe_code)]
pub(crate) unsafe fn fetch(engine: &Engine, file: &Path, me: u32) -> Fetched {
    let copy = match private_copy(file, me) {
        Ok(copy) => copy,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Fetched::Absent,
        Err(e) => return Fetched::Unusable(e.to_string()),
    };
    // wasmtime maps what it opens; /proc/self/fd/N opens the copy, which
    // only this process holds.
    let path = format!("/proc/self/fd/{}", copy.as_raw_fd());
    // SAFETY: see this function's contract.
    match unsafe { Component::deserialize_file(engine, &path) } {
        Ok(component) => Fetched::Hit(component),
        Err(e) => Fetched::Unusable(super::load::one_line(&e)),
    }
}

/// `file`'s bytes in an anonymous memory file (`memfd_create(2)`) that no
/// other process holds. `file` is opened without following a symlink or
/// blocking on a FIFO, and must be, on the descriptor read, a regular file
/// of `me`'s with one link that group and others may not write. Its time
/// is set to now: its last use, the eviction's order.
///
/// # Errors
/// `NotFound` when there is no such file; the check's or the copy's error.
fn private_copy(file: &Path, me: u32) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::MetadataExt;
    let mut source = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(file)?;
    let meta = source.metadata()?;
    // The walk's rule for a file, again on what is read; and one link.
    if let Err(problem) = super::cache::judge_file(super::cache::Seen::of(&meta), me) {
        return Err(std::io::Error::other(problem.to_string()));
    }
    if meta.nlink() != 1 {
        return Err(std::io::Error::other("has more than one link"));
    }
    #[allow(unsafe_code)]
    // SAFETY: a NUL-terminated name and valid flags; the result is a new
    // descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"idem-compiled".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(unsafe_code)]
    // SAFETY: `fd` was just created and nothing else owns it.
    let mut copy = unsafe { std::fs::File::from_raw_fd(fd) };
    // On Linux std copies file to file in the kernel (copy_file_range or
    // sendfile).
    std::io::copy(&mut source, &mut copy)?;
    // The file's time is its last use: the eviction's order.
    let _ = source.set_modified(SystemTime::now());
    Ok(copy)
}

/// Writes `component`'s compiled code to `dir/name` (mode 0600; `dir`
/// made with mode 0700 when missing): whole under a temporary name, synced,
/// then renamed over whatever was there.
///
/// # Errors
/// The serialization, or the file system's error.
pub(crate) fn keep(dir: &Path, name: &str, component: &Component) -> std::io::Result<()> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let code = component.serialize().map_err(std::io::Error::other)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let temporary = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        WRITES.fetch_add(1, Relaxed)
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)
        .and_then(|mut f| {
            f.write_all(&code)?;
            f.sync_data()
        })
        .and_then(|()| std::fs::rename(&temporary, dir.join(name)));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// One compiled file as [`evict`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kept {
    pub(crate) path: PathBuf,
    pub(crate) bytes: u64,
    pub(crate) used: SystemTime,
}

/// Which of `files` to remove so that at most `max_files` of them and
/// `max_bytes` remain (besides `spare`, the file just written, which is
/// never removed): the most recently used are kept until the first that
/// does not fit, and it and every older one go.
pub(crate) fn to_evict(
    mut files: Vec<Kept>,
    spare: &Path,
    max_files: usize,
    max_bytes: u64,
) -> Vec<PathBuf> {
    files.sort_by_key(|f| std::cmp::Reverse(f.used));
    let (mut count, mut total, mut full) = (0usize, 0u64, false);
    let mut out = Vec::new();
    for f in files {
        if f.path == spare {
            continue;
        }
        full = full || count >= max_files || total.saturating_add(f.bytes) > max_bytes;
        if full {
            out.push(f.path);
        } else {
            count += 1;
            total = total.saturating_add(f.bytes);
        }
    }
    out
}

/// Removes the least recently used compiled files under `modules` (every
/// engine's directory) past [`MAX_FILES`] or [`MAX_BYTES`], and temporary
/// files of writes that died; never `spare`. Returns how many it removed.
pub(crate) fn evict(modules: &Path, spare: &Path) -> usize {
    let now = SystemTime::now();
    let mut files = Vec::new();
    let mut removed = 0;
    let Ok(dirs) = std::fs::read_dir(modules) else {
        return 0;
    };
    for dir in dirs.flatten() {
        if !dir.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if entry.file_name().as_encoded_bytes().starts_with(b".") {
                let stale = now.duration_since(used).unwrap_or_default() > STALE_TEMPORARY;
                if stale && std::fs::remove_file(entry.path()).is_ok() {
                    removed += 1;
                }
                continue;
            }
            files.push(Kept {
                path: entry.path(),
                bytes: meta.len(),
                used,
            });
        }
    }
    for path in to_evict(files, spare, MAX_FILES, MAX_BYTES) {
        if std::fs::remove_file(path).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, unsafe_code)]
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use wasmtime::Store;
    use wasmtime::component::Linker;

    fn kept(name: &str, bytes: u64, used_s: u64) -> Kept {
        Kept {
            path: PathBuf::from(name),
            bytes,
            used: SystemTime::UNIX_EPOCH + Duration::from_secs(used_s),
        }
    }

    #[test]
    fn the_least_recently_used_go_first_and_the_new_file_stays() {
        let files = vec![
            kept("a", 10, 1),
            kept("b", 10, 3),
            kept("c", 10, 2),
            kept("d", 10, 4),
        ];
        // Count bound: the two most recent stay.
        assert_eq!(
            to_evict(files.clone(), Path::new("new"), 2, u64::MAX),
            vec![PathBuf::from("c"), PathBuf::from("a")]
        );
        // Byte bound: 25 bytes hold two files.
        assert_eq!(
            to_evict(files.clone(), Path::new("new"), 100, 25),
            vec![PathBuf::from("c"), PathBuf::from("a")]
        );
        // A large file that does not fit takes every older one with it,
        // however small.
        let mixed = vec![kept("old", 1, 1), kept("big", 30, 2), kept("new", 10, 3)];
        assert_eq!(
            to_evict(mixed, Path::new("x"), 100, 25),
            vec![PathBuf::from("big"), PathBuf::from("old")]
        );
        // The file just written stays even when it is the oldest.
        assert_eq!(
            to_evict(files.clone(), Path::new("a"), 2, u64::MAX),
            vec![PathBuf::from("c")]
        );
        assert_eq!(
            to_evict(files, Path::new("new"), 4, 40),
            Vec::<PathBuf>::new()
        );
    }

    #[test]
    fn a_kept_component_loads_and_a_damaged_one_is_removed() {
        let engine = Engine::default();
        let component = Component::new(&engine, "(component)").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join(engine_dir(&engine));
        keep(&sub, "abc", &component).unwrap();
        let file = sub.join("abc");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&sub).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // Nothing but the file: the temporary was renamed.
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1);
        let me = std::fs::metadata("/proc/self").unwrap().uid();
        let Fetched::Hit(loaded) = (unsafe { fetch(&engine, &file, me) }) else {
            panic!("no hit");
        };
        // What was loaded is a copy: truncating the file changes nothing.
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(0)
            .unwrap();
        Linker::<()>::new(&engine)
            .instantiate(&mut Store::new(&engine, ()), &loaded)
            .unwrap();
        assert!(matches!(
            unsafe { fetch(&engine, &sub.join("other"), me) },
            Fetched::Absent
        ));
        std::fs::write(&file, b"not compiled code").unwrap();
        assert!(matches!(
            unsafe { fetch(&engine, &file, me) },
            Fetched::Unusable(_)
        ));
        // A second link, or a symlink, is refused before anything is read.
        keep(&sub, "abc", &component).unwrap();
        std::fs::hard_link(&file, dir.path().join("link")).unwrap();
        assert!(matches!(
            unsafe { fetch(&engine, &file, me) },
            Fetched::Unusable(_)
        ));
        std::fs::remove_file(dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(&file, sub.join("sym")).unwrap();
        assert!(matches!(
            unsafe { fetch(&engine, &sub.join("sym"), me) },
            Fetched::Unusable(_)
        ));
        assert_eq!(evict(dir.path(), &file), 0);
    }
}
