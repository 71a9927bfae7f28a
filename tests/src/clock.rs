//! Skewed clocks for a host process: libfaketime (Debian's `faketime`
//! package, which `scripts/setup.sh` installs) preloaded into the process
//! shifts its wall clock (`clock_gettime(CLOCK_REALTIME)`, `gettimeofday`,
//! so Rust's `SystemTime` and SQLite's `'now'` alike) by a fixed offset that
//! keeps ticking. The monotonic clock is left alone, as NTP would leave it.

use std::path::PathBuf;

/// The libfaketime shared object, wherever the distribution put it.
///
/// # Panics
/// When it is not installed, with the line that installs it.
pub fn libfaketime() -> PathBuf {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketime.so.1"))
        .chain([PathBuf::from("/usr/lib/faketime/libfaketime.so.1")])
        .find(|p| p.exists());
    found.unwrap_or_else(|| {
        panic!("libfaketime is missing: run scripts/setup.sh (or apt-get install faketime)")
    })
}

/// Environment for a process whose wall clock runs `offset` from the
/// machine's: libfaketime's relative syntax, e.g. `-30s`, `+60s`, `+5m`.
pub fn skewed(offset: &str) -> Vec<(&'static str, String)> {
    vec![
        ("LD_PRELOAD", libfaketime().display().to_string()),
        ("FAKETIME", offset.to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
}
