//! A test run's directory (configs, process logs): deleted at the end,
//! unless the test fails or the keep variable is set, then kept and named.

use std::path::{Path, PathBuf};

/// A temporary directory kept (and its path printed) when the thread is
/// panicking as it drops, or when the environment variable it was made
/// with is set.
pub struct RunDir {
    dir: Option<tempfile::TempDir>,
    keep_var: &'static str,
}

impl RunDir {
    /// A new directory named `<prefix>…` under the system's temporary
    /// directory; `keep_var` (e.g. `IDEM_CHAOS_KEEP`) set keeps it too.
    ///
    /// # Panics
    /// When the directory cannot be made.
    pub fn new(prefix: &str, keep_var: &'static str) -> Self {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        RunDir {
            dir: Some(dir),
            keep_var,
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new(""), |d| d.path())
    }

    /// Its path, owned.
    pub fn path_buf(&self) -> PathBuf {
        self.path().to_path_buf()
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if (std::thread::panicking() || std::env::var_os(self.keep_var).is_some())
            && let Some(d) = self.dir.take()
        {
            eprintln!("config and logs kept in {}", d.keep().display());
        }
    }
}
