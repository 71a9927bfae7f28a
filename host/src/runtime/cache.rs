//! The compiled-component cache (`[runtime] cache_dir`) loads only what
//! idem's user wrote (ARCHITECTURE.md, "Compiled-component cache"); its
//! files are [`super::cache_files`]'.
//!
//! wasmtime maps what it finds there and runs it as machine code after
//! checking only that this wasmtime with these settings made it. So before
//! every load, [`CompiledCache::inspect`] walks the cache tree:
//!
//! - the cache directory's ancestors must each be owned by root or idem's
//!   user and writable by neither group nor others, except a root-owned
//!   sticky directory such as `/tmp` (nobody else may rename or delete what
//!   idem's user keeps there);
//! - every directory from the cache directory down must be owned by idem's
//!   user and writable by neither group nor others: one that is not makes
//!   the load skip the cache ([`Inspection::Untrusted`]);
//! - every other entry must be a regular file owned by idem's user and
//!   writable by neither group nor others: one that is not is removed, so
//!   the component is compiled again.
//!
//! The walk stops after [`MAX_ENTRIES`] entries (the tree is then treated
//! as untrusted); the cache is kept well below that size by its own
//! eviction ([`super::cache_files::MAX_FILES`]).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The most entries (files and directories) one inspection walks; a tree
/// with more is not used for that load.
pub const MAX_ENTRIES: usize = 50_000;

/// One entry as the walk saw it (`lstat`): what it is, its owner and mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) kind: Kind,
    pub(crate) uid: u32,
    pub(crate) mode: u32,
}

/// What kind of file system entry was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Directory,
    File,
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

impl Seen {
    /// What `meta` (from `lstat` or `fstat`) says of an entry.
    pub(crate) fn of(meta: &std::fs::Metadata) -> Self {
        let t = meta.file_type();
        let kind = if t.is_dir() {
            Kind::Directory
        } else if t.is_file() {
            Kind::File
        } else if t.is_symlink() {
            Kind::Symlink
        } else {
            debug_assert!(
                t.is_fifo() || t.is_socket() || t.is_block_device() || t.is_char_device()
            );
            Kind::Other
        };
        Self {
            kind,
            uid: meta.uid(),
            mode: meta.mode(),
        }
    }
}

/// Why an entry fails its check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// Owned by another user (its uid).
    Owner(u32),
    /// Writable by group or others (its permission bits).
    Writable(u32),
    /// Not a directory where one is needed.
    NotDirectory,
    /// Not a regular file (a symlink, FIFO, socket or device).
    NotFile,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Owner(uid) => write!(f, "belongs to another user (uid {uid})"),
            Problem::Writable(mode) => {
                write!(f, "is writable by other users (mode {:o})", mode & 0o7777)
            }
            Problem::NotDirectory => f.write_str("is not a directory"),
            Problem::NotFile => f.write_str("is not a regular file"),
        }
    }
}

const GROUP_OR_OTHER_WRITE: u32 = 0o022;
const STICKY: u32 = 0o1000;

/// Judges an ancestor of the cache directory: owned by root or `me`, and
/// writable by neither group nor others, unless it is root's and sticky.
pub(crate) fn judge_ancestor(seen: Seen, me: u32) -> Result<(), Problem> {
    if seen.kind != Kind::Directory {
        return Err(Problem::NotDirectory);
    }
    if seen.uid != 0 && seen.uid != me {
        return Err(Problem::Owner(seen.uid));
    }
    // In root's sticky directory (/tmp) nobody but root and an entry's
    // owner may rename or remove the entry, whoever may write there.
    let root_sticky = seen.uid == 0 && seen.mode & STICKY != 0;
    if !root_sticky && seen.mode & GROUP_OR_OTHER_WRITE != 0 {
        return Err(Problem::Writable(seen.mode));
    }
    Ok(())
}

/// Judges a directory inside the cache (the cache directory included):
/// `me`'s, and writable by neither group nor others.
pub(crate) fn judge_directory(seen: Seen, me: u32) -> Result<(), Problem> {
    if seen.kind != Kind::Directory {
        return Err(Problem::NotDirectory);
    }
    judge_owner_and_mode(seen, me)
}

/// Judges a non-directory inside the cache: a regular file of `me`'s,
/// writable by neither group nor others.
pub(crate) fn judge_file(seen: Seen, me: u32) -> Result<(), Problem> {
    if seen.kind != Kind::File {
        return Err(Problem::NotFile);
    }
    judge_owner_and_mode(seen, me)
}

fn judge_owner_and_mode(seen: Seen, me: u32) -> Result<(), Problem> {
    if seen.uid != me {
        return Err(Problem::Owner(seen.uid));
    }
    if seen.mode & GROUP_OR_OTHER_WRITE != 0 {
        return Err(Problem::Writable(seen.mode));
    }
    Ok(())
}

/// A path as it may appear in a log line: other users choose the names in
/// an untrusted cache, so control characters are escaped.
pub(crate) fn shown(path: &Path) -> String {
    path.display().to_string().escape_debug().to_string()
}

/// The effective user of this process: the owner of `/proc/self`.
fn me() -> std::io::Result<u32> {
    std::fs::metadata("/proc/self").map(|m| m.uid())
}

/// What an inspection found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Inspection {
    /// Everything left in the cache is idem's; `removed` lists the files
    /// that were not (each removed, so the component is compiled again).
    Trusted { removed: Vec<(PathBuf, Problem)> },
    /// The tree cannot be trusted for this load: why, and what to do,
    /// in one line.
    Untrusted { reason: String },
}

/// Compiled components kept in a directory checked to hold only idem's
/// own files.
pub(crate) struct CompiledCache {
    /// The directory as configured (absolute).
    dir: PathBuf,
    /// The directory with every symlink resolved (where the files are).
    real: PathBuf,
    me: u32,
}

impl CompiledCache {
    /// The cache in `dir`, created (mode 0700: only idem's user may put
    /// code there) when missing, after checking `dir` and its ancestors.
    ///
    /// # Errors
    /// One line naming the directory, what is wrong and what to do: it
    /// cannot be created or read; it is not a directory; it, or one of its
    /// ancestors, belongs to another user or is writable by other users.
    pub(crate) fn open(dir: &Path) -> anyhow::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::path::absolute(dir).map_err(|e| {
            anyhow::anyhow!(
                "cannot use the compiled-component cache {}: {e}; set [runtime] cache_dir to a directory only idem's user can write, or cache = false",
                dir.display()
            )
        })?;
        let me = me().map_err(|e| {
            anyhow::anyhow!("cannot tell which user idem runs as (/proc/self: {e}); the compiled-component cache needs it: set [runtime] cache = false")
        })?;
        if !dir.exists() {
            // Nothing is made inside a directory another user controls:
            // the part of the path that exists is checked first.
            if let Some(existing) = dir.ancestors().skip(1).find(|a| a.exists()) {
                check_ancestors(&dir, existing, me)?;
            }
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cannot create the compiled-component cache {}: {e}; set [runtime] cache_dir to a writable directory or cache = false",
                        dir.display()
                    )
                })?;
        }
        check_root(&dir, me)?;
        let real = check_parents(&dir, me)?;
        // Made here, `modules/` is private whatever the umask.
        let modules = real.join("modules");
        if !modules.exists() {
            let _ = std::fs::DirBuilder::new().mode(0o700).create(&modules);
        }
        Ok(Self { dir, real, me })
    }

    /// The directory as configured.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Walks the cache right before a load (see the module docs):
    /// removes the files idem's user did not write, and says whether the
    /// tree can be used.
    pub(crate) fn inspect(&self) -> Inspection {
        if let Err(e) = check_root(&self.dir, self.me).and_then(|()| {
            let real = check_parents(&self.dir, self.me)?;
            if real != self.real {
                anyhow::bail!(
                    "the compiled-component cache {} now resolves to {}, not {}",
                    shown(&self.dir),
                    shown(&real),
                    shown(&self.real)
                );
            }
            Ok(())
        }) {
            return Inspection::Untrusted {
                reason: e.to_string(),
            };
        }
        walk(&self.real, self.me, MAX_ENTRIES)
    }

    /// Inspects the cache before loading `origin` and warns once about what
    /// it found: files removed, or a tree this load must not use. Returns
    /// whether the cache may be used.
    fn before_load(&self, origin: &Path) -> bool {
        match self.inspect() {
            Inspection::Trusted { removed } => {
                if let Some((first, problem)) = removed.first() {
                    tracing::warn!(
                        module = %origin.display(),
                        removed = removed.len(),
                        "removed {} file(s) idem's user did not write from the compiled-component cache before compiling, so they are compiled again, not run: {} {problem}{}; find out who can write into {}",
                        removed.len(),
                        shown(first),
                        if removed.len() > 1 { " (and others)" } else { "" },
                        shown(self.dir()),
                    );
                }
                true
            }
            Inspection::Untrusted { reason } => {
                tracing::warn!(
                    module = %origin.display(),
                    "compiling without the compiled-component cache: {reason}"
                );
                false
            }
        }
    }

    /// The compiled component whose bytes have SHA-256 `digest` (hex):
    /// from the cache when it holds it, else compiled by `compile` and
    /// kept. Says which: `hit`, `miss`, or `skipped` (the tree may not be
    /// used now: compiled, nothing read or written).
    ///
    /// # Errors
    /// `compile`'s. A file that cannot be loaded or written is a warning.
    pub(crate) fn load_or_compile<E>(
        &self,
        engine: &wasmtime::Engine,
        digest: &str,
        origin: &Path,
        compile: impl FnOnce() -> Result<wasmtime::component::Component, E>,
    ) -> Result<(wasmtime::component::Component, &'static str), E> {
        use super::cache_files::{Fetched, evict, fetch, keep};
        if !self.before_load(origin) {
            return Ok((compile()?, "skipped"));
        }
        let modules = self.real.join("modules");
        let dir = modules.join(super::cache_files::engine_dir(engine));
        let file = dir.join(digest);
        // SAFETY: the tree was inspected right above: every file in it is a
        // regular file of idem's user, every directory writable by nobody
        // else (fetch's contract).
        #[allow(unsafe_code)]
        let fetched = unsafe { fetch(engine, &file, self.me) };
        match fetched {
            Fetched::Hit(component) => return Ok((component, "hit")),
            Fetched::Absent => {}
            Fetched::Unusable(why) => tracing::warn!(
                module = %origin.display(),
                "a file of the compiled-component cache could not be loaded, so the component is compiled again: {}: {why}",
                shown(&file)
            ),
        }
        let component = compile()?;
        match keep(&dir, digest, &component) {
            Ok(()) => {
                evict(&modules, &file);
            }
            Err(e) => tracing::warn!(
                module = %origin.display(),
                "cannot keep the compiled component in the cache {}: {e}; the next start compiles it again",
                shown(&dir)
            ),
        }
        Ok((component, "miss"))
    }
}

/// Checks the cache directory itself (followed if it is a symlink: the
/// directories holding the link are checked as ancestors).
fn check_root(dir: &Path, me: u32) -> anyhow::Result<()> {
    let meta = std::fs::metadata(dir).map_err(|e| {
        anyhow::anyhow!(
            "cannot use the compiled-component cache {}: {e}; set [runtime] cache_dir to a directory only idem's user can write, or cache = false",
            shown(dir)
        )
    })?;
    match judge_directory(Seen::of(&meta), me) {
        Ok(()) => Ok(()),
        Err(Problem::Owner(uid)) => anyhow::bail!(
            "the compiled-component cache {} belongs to another user (uid {uid}); wasmtime runs what it finds there: use a directory idem's user owns ([runtime] cache_dir) or cache = false",
            shown(dir)
        ),
        Err(Problem::Writable(mode)) => anyhow::bail!(
            "the compiled-component cache {} is writable by other users (mode {:o}); wasmtime runs what it finds there: chmod 700 it, or set [runtime] cache_dir or cache = false",
            shown(dir),
            mode & 0o777
        ),
        Err(Problem::NotDirectory | Problem::NotFile) => anyhow::bail!(
            "the compiled-component cache {} is not a directory; set [runtime] cache_dir to a directory only idem's user can write, or cache = false",
            shown(dir)
        ),
    }
}

/// Checks every parent of the cache directory `dir` (see
/// [`check_ancestors`]) and returns `dir` with its symlinks resolved.
fn check_parents(dir: &Path, me: u32) -> anyhow::Result<PathBuf> {
    check_ancestors(dir, dir.parent().unwrap_or(dir), me)?;
    let real = std::fs::canonicalize(dir).map_err(|e| {
        anyhow::anyhow!(
            "cannot use the compiled-component cache {}: {e}; set [runtime] cache_dir to a directory only idem's user can write, or cache = false",
            shown(dir)
        )
    })?;
    // The cache directory itself may be a symlink to elsewhere.
    if let Some(parent) = real.parent()
        && Some(parent) != dir.parent()
    {
        check_ancestors(dir, parent, me)?;
    }
    Ok(real)
}

/// Checks `from` and every directory above it, both along the path as
/// written (each step followed: the directories traversed) and along the
/// path with its symlinks resolved (each read with lstat), so no directory
/// another user controls can rename or replace a step on the way to the
/// cache directory `dir` (named in the error).
fn check_ancestors(dir: &Path, from: &Path, me: u32) -> anyhow::Result<()> {
    let real = std::fs::canonicalize(from).map_err(|e| {
        anyhow::anyhow!(
            "cannot check {}, a parent of the compiled-component cache {}: {e}; set [runtime] cache_dir elsewhere or cache = false",
            shown(from),
            shown(dir)
        )
    })?;
    let written = from.ancestors().map(|a| (a, std::fs::metadata(a)));
    let resolved = real.ancestors().map(|a| (a, std::fs::symlink_metadata(a)));
    for (ancestor, meta) in written.chain(resolved) {
        let meta = meta.map_err(|e| {
            anyhow::anyhow!(
                "cannot check {}, a parent of the compiled-component cache {}: {e}; set [runtime] cache_dir elsewhere or cache = false",
                shown(ancestor),
                shown(dir)
            )
        })?;
        if let Err(problem) = judge_ancestor(Seen::of(&meta), me) {
            anyhow::bail!(
                "the compiled-component cache {} is inside {}, which {problem}; whoever controls it can replace the code idem loads: set [runtime] cache_dir to a directory whose parents only root or idem's user can write, or cache = false",
                shown(dir),
                shown(ancestor)
            );
        }
    }
    Ok(())
}

/// Walks the tree under `root` (already checked), at most `cap` entries:
/// see [`CompiledCache::inspect`].
pub(crate) fn walk(root: &Path, me: u32, cap: usize) -> Inspection {
    let untrusted = |path: &Path, why: &str| Inspection::Untrusted {
        reason: format!(
            "{} {why}; whoever could write there may have renamed code under another component's name: delete the cache directory (idem makes it again, private), or set [runtime] cache = false",
            shown(path)
        ),
    };
    let mut removed = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    let mut walked = 0usize;
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // Removed by an eviction meanwhile: nothing to load there.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return untrusted(&dir, &format!("cannot be read: {e}"));
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    return untrusted(&dir, &format!("cannot be read: {e}"));
                }
            };
            walked += 1;
            if walked > cap {
                return untrusted(root, &format!("holds more than {cap} entries"));
            }
            let path = entry.path();
            let seen = match std::fs::symlink_metadata(&path) {
                Ok(meta) => Seen::of(&meta),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return untrusted(&path, &format!("cannot be checked: {e}"));
                }
            };
            if seen.kind == Kind::Directory {
                if let Err(problem) = judge_directory(seen, me) {
                    return untrusted(&path, &problem.to_string());
                }
                pending.push(path);
            } else if let Err(problem) = judge_file(seen, me) {
                match std::fs::remove_file(&path) {
                    Ok(()) => removed.push((path, problem)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return untrusted(&path, &format!("{problem} and cannot be removed: {e}"));
                    }
                }
            }
        }
    }
    Inspection::Trusted { removed }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const ME: u32 = 1000;

    fn seen(kind: Kind, uid: u32, mode: u32) -> Seen {
        Seen { kind, uid, mode }
    }

    #[test]
    fn ancestors_are_roots_or_mine_and_written_by_nobody_else() {
        let dir = Kind::Directory;
        assert_eq!(judge_ancestor(seen(dir, 0, 0o755), ME), Ok(()));
        assert_eq!(judge_ancestor(seen(dir, ME, 0o700), ME), Ok(()));
        assert_eq!(
            judge_ancestor(seen(dir, 65534, 0o755), ME),
            Err(Problem::Owner(65534))
        );
        assert_eq!(
            judge_ancestor(seen(dir, 0, 0o777), ME),
            Err(Problem::Writable(0o777))
        );
        assert_eq!(
            judge_ancestor(seen(dir, 0, 0o775), ME),
            Err(Problem::Writable(0o775))
        );
        // /tmp: root's and sticky.
        assert_eq!(judge_ancestor(seen(dir, 0, 0o1777), ME), Ok(()));
        // Sticky but another user's, or mine: whoever owns it may still
        // rename what is in it.
        assert_eq!(
            judge_ancestor(seen(dir, ME, 0o1777), ME),
            Err(Problem::Writable(0o1777))
        );
        assert_eq!(
            judge_ancestor(seen(Kind::File, 0, 0o755), ME),
            Err(Problem::NotDirectory)
        );
    }

    #[test]
    fn entries_are_mine_and_written_by_nobody_else() {
        let (dir, file) = (Kind::Directory, Kind::File);
        assert_eq!(judge_directory(seen(dir, ME, 0o755), ME), Ok(()));
        assert_eq!(judge_directory(seen(dir, ME, 0o700), ME), Ok(()));
        assert_eq!(
            judge_directory(seen(dir, 0, 0o700), ME),
            Err(Problem::Owner(0))
        );
        assert_eq!(
            judge_directory(seen(dir, ME, 0o777), ME),
            Err(Problem::Writable(0o777))
        );
        // The sticky bit does not help inside the cache.
        assert_eq!(
            judge_directory(seen(dir, ME, 0o1777), ME),
            Err(Problem::Writable(0o1777))
        );
        assert_eq!(judge_file(seen(file, ME, 0o644), ME), Ok(()));
        assert_eq!(
            judge_file(seen(file, ME, 0o664), ME),
            Err(Problem::Writable(0o664))
        );
        assert_eq!(
            judge_file(seen(file, 65534, 0o644), ME),
            Err(Problem::Owner(65534))
        );
        assert_eq!(
            judge_file(seen(Kind::Symlink, ME, 0o777), ME),
            Err(Problem::NotFile)
        );
        assert_eq!(
            judge_file(seen(Kind::Other, ME, 0o600), ME),
            Err(Problem::NotFile)
        );
        assert_eq!(
            judge_directory(seen(file, ME, 0o700), ME),
            Err(Problem::NotDirectory)
        );
    }

    #[test]
    fn a_walk_removes_what_fails_and_stops_at_a_bad_directory_or_the_cap() {
        use std::os::unix::fs::PermissionsExt;
        let me = me().unwrap();
        let root = tempfile::tempdir().unwrap();
        let sub = root.path().join("modules/wasmtime-x");
        std::fs::create_dir_all(&sub).unwrap();
        for d in [root.path().join("modules"), sub.clone()] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let good = sub.join("good");
        std::fs::write(&good, b"code").unwrap();
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o644)).unwrap();
        let writable = sub.join("writable");
        std::fs::write(&writable, b"code").unwrap();
        std::fs::set_permissions(&writable, std::fs::Permissions::from_mode(0o666)).unwrap();
        let link = sub.join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();

        let Inspection::Trusted { mut removed } = walk(root.path(), me, 100) else {
            panic!("trusted");
        };
        removed.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            removed,
            vec![
                (link.clone(), Problem::NotFile),
                (writable.clone(), Problem::Writable(0o100666)),
            ]
        );
        assert!(good.exists() && !writable.exists() && !link.exists());

        let reason = |path: &Path, why: &str| Inspection::Untrusted {
            reason: format!(
                "{} {why}; whoever could write there may have renamed code under another component's name: delete the cache directory (idem makes it again, private), or set [runtime] cache = false",
                path.display()
            ),
        };
        assert_eq!(
            walk(root.path(), me, 2),
            reason(root.path(), "holds more than 2 entries")
        );

        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(
            walk(root.path(), me, 100),
            reason(&sub, "is writable by other users (mode 777)")
        );
        assert!(good.exists());
    }
}
