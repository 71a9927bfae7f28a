//! A private nats-server for a bench, and where the benches find the repo's
//! files. Each bench uses a part of this module.
#![allow(dead_code)]

use anyhow::{Context as _, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where `scripts/build-guests.sh` and `scripts/build-lang-guests.sh` put
/// the components: `$CARGO_TARGET_DIR/guests`, else `target/guests`.
pub fn guests_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
        .join("guests")
}

/// A private nats-server with JetStream on a free loopback port and a
/// temporary store, killed on drop. The binary: `$IDEM_NATS_SERVER`, else
/// `.tools/venv/bin/nats-server` (`scripts/setup.sh`).
pub struct Nats {
    child: Child,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    _store: tempfile::TempDir,
}

impl Nats {
    /// Starts it and waits (at most 10 s) until it listens.
    ///
    /// # Errors
    /// The binary is missing or the server did not listen.
    pub fn start() -> Result<Self> {
        let bin = std::env::var_os("IDEM_NATS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join(".tools/venv/bin/nats-server"));
        let store = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new(&bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}; run scripts/setup.sh", bin.display()))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            anyhow::ensure!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Nats {
            child,
            port,
            _store: store,
        })
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
