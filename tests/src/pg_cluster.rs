//! A throwaway PostgreSQL cluster for tests that take the database away
//! (stop, crash, restart) while a host runs. The machine's PostgreSQL (the
//! one `IDEM_TEST_PG` names, usually on port 5432) is never touched.
//!
//! - `initdb` into a temporary directory (`data/`), trust authentication,
//!   superuser `postgres`, no fsync during initdb.
//! - The server listens on 127.0.0.1 only, on a free port chosen once (a
//!   restart comes back on the same port, so URLs stay valid), with its unix
//!   socket in the temporary directory (`sock/`), never in `/var/run`.
//! - The postmaster is a direct child of the test process (not daemonized
//!   by `pg_ctl start`), so the test always knows whether it is running.
//!   Its log goes to `postgres.log` in the temporary directory
//!   ([`PgCluster::log`]), handy as evidence in a failing assertion.
//! - [`PgCluster::stop`] is `pg_ctl stop -m fast` (clients see SQLSTATE
//!   57P01, then connection refused); [`PgCluster::crash`] is
//!   `pg_ctl stop -m immediate` (no checkpoint: crash recovery at the next
//!   start). Dropping the cluster, also while a test panics, stops it
//!   (immediate, then SIGKILL if it does not go within 10 s) and deletes
//!   the directory.
//!
//! Binaries: `IDEM_TEST_PG_BIN` if set, else the newest
//! `/usr/lib/postgresql/<version>/bin` holding `initdb` (Debian's layout),
//! else `pg_config --bindir`.
//!
//! Root: `initdb`, `postgres` and `pg_ctl` refuse to run as root. When the
//! tests run as root (containers, CI images), the directory is chowned to the
//! `postgres` system user (`IDEM_TEST_PG_OS_USER` to pick another) and the
//! three programs are spawned with that user's uid and gid
//! ([`std::os::unix::process::CommandExt::uid`]; the standard library also
//! drops root's supplementary groups). No `su`/`runuser`, so no PAM session
//! and no intermediate process: the child is the postmaster itself. As any
//! other user, everything runs as that user.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::free_port;
use crate::{Backend, TestDb};
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private PostgreSQL server on a free loopback port; see the module docs.
pub struct PgCluster {
    /// The TCP port (127.0.0.1 only), the same across restarts.
    pub port: u16,
    bin: PathBuf,
    /// `(uid, gid)` to run the server programs as, when the tests run as root.
    run_as: Option<(u32, u32)>,
    postmaster: Option<Child>,
    // Last field: deleted after the server is stopped.
    dir: tempfile::TempDir,
}

/// The directory of PostgreSQL's server programs; see the module docs.
fn pg_bin() -> PathBuf {
    if let Ok(dir) = std::env::var("IDEM_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return bin;
    }
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .unwrap_or_else(|e| {
            panic!("no PostgreSQL server binaries: /usr/lib/postgresql/*/bin/initdb is missing and pg_config failed ({e}); set IDEM_TEST_PG_BIN")
        });
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// `(uid, gid)` of the OS user that runs the server when we are root.
fn run_as() -> Option<(u32, u32)> {
    // The owner of /proc/self is this process's effective uid.
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        return None;
    }
    let user = std::env::var("IDEM_TEST_PG_OS_USER").unwrap_or_else(|_| "postgres".into());
    let id = |flag: &str| -> u32 {
        let out = Command::new("id").args([flag, &user]).output().unwrap();
        assert!(
            out.status.success(),
            "tests run as root and PostgreSQL refuses root: need OS user `{user}` (set IDEM_TEST_PG_OS_USER) — `id {flag} {user}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    Some((id("-u"), id("-g")))
}

impl PgCluster {
    /// `initdb` into a fresh temporary directory and start the server;
    /// returns once it accepts connections.
    pub fn start() -> Self {
        let mut c = Self::init();
        c.start_server();
        c
    }

    /// Like [`PgCluster::start`], but TCP connections are accepted only
    /// over TLS (`hostssl` lines alone in `pg_hba.conf`), with `cert_pem`
    /// and `key_pem` as the server's certificate and key (`pg_isready`
    /// connects with its default `sslmode=prefer`, so TLS too).
    pub fn start_tls_only(cert_pem: &str, key_pem: &str) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let mut c = Self::init();
        let data = c.data_dir();
        for (name, pem) in [("server.crt", cert_pem), ("server.key", key_pem)] {
            let path = data.join(name);
            std::fs::write(&path, pem).unwrap();
            // PostgreSQL refuses a key others can read, or one it does not own.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            if let Some((uid, gid)) = c.run_as {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
            }
        }
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        std::io::Write::write_all(
            &mut conf,
            b"\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
        )
        .unwrap();
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        c.start_server();
        c
    }

    /// `initdb` into a fresh temporary directory; the server is not started.
    fn init() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let run_as = run_as();
        let c = PgCluster {
            port: free_port(),
            bin: pg_bin(),
            run_as,
            postmaster: None,
            dir,
        };
        std::fs::create_dir(c.sock_dir()).unwrap();
        if let Some((uid, gid)) = run_as {
            for p in [c.dir.path(), &c.sock_dir()] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
            }
        }
        let out = c
            .command("initdb")
            .arg("-D")
            .arg(c.data_dir())
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn sock_dir(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// A command for one of the server programs, as the right OS user, in
    /// the temporary directory (the postgres user may not enter our cwd).
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        cmd.current_dir(self.dir.path()).stdin(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// Starts the server again after [`PgCluster::stop`] / [`PgCluster::crash`]
    /// (same port, same data); returns once it accepts connections.
    /// Panics if it is running.
    pub fn start_again(&mut self) {
        assert!(self.postmaster.is_none(), "the cluster is already running");
        self.start_server();
    }

    fn start_server(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-k")
            .arg(self.sock_dir())
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "max_connections=40"])
            .args(["-c", "shared_buffers=16MB"])
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.postmaster = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres"])
                .args(["-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            if let Some(status) = self.postmaster.as_mut().unwrap().try_wait().unwrap() {
                self.postmaster = None;
                panic!("postgres exited with {status} at start:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections within 30 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Fast shutdown (`pg_ctl stop -m fast`): sessions are terminated
    /// (SQLSTATE 57P01), a checkpoint is written, the server exits. Returns
    /// once it has; from then on connections are refused.
    pub fn stop(&mut self) {
        self.shutdown("fast");
    }

    /// Immediate shutdown (`pg_ctl stop -m immediate`): every process quits
    /// at once without a checkpoint, as in a crash; the next start recovers
    /// from the WAL.
    pub fn crash(&mut self) {
        self.shutdown("immediate");
    }

    /// [`PgCluster::stop`] then [`PgCluster::start_again`].
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Whether the postmaster is running.
    pub fn is_running(&mut self) -> bool {
        match self.postmaster.as_mut() {
            None => false,
            Some(c) => c.try_wait().unwrap().is_none(),
        }
    }

    fn shutdown(&mut self, mode: &str) {
        let Some(mut child) = self.postmaster.take() else {
            panic!("the cluster is not running");
        };
        let out = self
            .command("pg_ctl")
            .args(["stop", "-w", "-t", "30", "-m", mode, "-D"])
            .arg(self.data_dir())
            .output();
        let status = wait_for_exit(&mut child, Duration::from_secs(30));
        assert!(
            status.is_some(),
            "postgres did not stop ({mode}); pg_ctl said {out:?}:\n{}",
            self.log()
        );
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_of("postgres")
    }

    /// The URL of database `name` on this cluster.
    pub fn url_of(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates database `name` and returns it as a [`TestDb`] (its helpers
    /// read balances, receipts and dead letters). It goes with the cluster:
    /// dropping the `TestDb` does not drop it.
    pub async fn create_db(&self, name: &str) -> TestDb {
        use sqlx::Connection as _;
        let mut c = sqlx::PgConnection::connect(&self.url()).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut c)
            .await
            .unwrap();
        c.close().await.unwrap();
        TestDb {
            url: self.url_of(name),
            backend: Backend::Postgres,
            pg_name: None,
            _dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Where the data directory and log live (kept until drop).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Waits up to `patience` for `child` to exit; `None` if it is still running.
fn wait_for_exit(child: &mut Child, patience: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + patience;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.postmaster.take() {
            let _ = self
                .command("pg_ctl")
                .args(["stop", "-w", "-t", "10", "-m", "immediate", "-D"])
                .arg(self.data_dir())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if wait_for_exit(&mut child, Duration::from_secs(10)).is_none() {
                // Backends notice their postmaster's death and exit.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
