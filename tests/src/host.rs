//! Config files for a test, and an in-process host running them.

use crate::*;
use idem::config::Config;
use idem::metrics::{HandlerStats, StatsSnapshot};
use idem::runtime::component_slot::ComponentSlot;
use idem::service::{Host, RunMode, Summary};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One `[[handler]]` table for [`write_config`].
pub struct HandlerSpec {
    pub name: String,
    pub guest: String,
    pub stream: String,
    pub subjects: Vec<String>,
    pub identity: String,
    pub tables: Vec<String>,
    /// Extra TOML lines, e.g. `max_deliver = 2`.
    pub extra: String,
}

impl HandlerSpec {
    /// A credit-style handler on stream ACCOUNTS, subject `accounts.credit`,
    /// identity `json:/event_id`, table `accounts`, with the credit migrations.
    pub fn new(name: &str, guest: &str) -> Self {
        HandlerSpec {
            name: name.into(),
            guest: guest.into(),
            stream: "ACCOUNTS".into(),
            subjects: vec!["accounts.credit".into()],
            identity: "json:/event_id".into(),
            tables: vec!["accounts".into()],
            extra: "retry_delay = \"200ms\"\n".into(),
        }
    }
}

/// Writes an idem.toml into `dir` and returns its path.
pub fn write_config(dir: &Path, nats: &Nats, db: &TestDb, handlers: &[HandlerSpec]) -> PathBuf {
    write_config_for(dir, &nats.url(), db, handlers)
}

/// [`write_config`] for the broker at `broker_url` (one URL, or several
/// comma-separated: a cluster).
pub fn write_config_for(
    dir: &Path,
    broker_url: &str,
    db: &TestDb,
    handlers: &[HandlerSpec],
) -> PathBuf {
    let mut s = format!(
        "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nmax_connections = 4\n",
        broker_url, db.url
    );
    let migrations = root().join("examples/credit/migrations");
    for h in handlers {
        s.push_str(&format!(
            "[[handler]]\nname = \"{}\"\nmodule = \"{}\"\nstream = \"{}\"\nsubjects = {:?}\nidentity = \"{}\"\ntables = {:?}\nmigrations = \"{}\"\n{}\n",
            h.name,
            guest(&h.guest).display(),
            h.stream,
            h.subjects,
            h.identity,
            h.tables,
            migrations.display(),
            h.extra
        ));
        s.push_str(&test_batch_line(&h.extra));
    }
    let path = dir.join("idem.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// A host running in this process until dropped or stopped.
/// Sends the in-process host's log (`RUST_LOG`, default `info`) to the test's
/// captured output, so a failing test prints what the host did.
fn capture_host_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,async_nats=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

pub struct RunningHost {
    stop: tokio_util::sync::CancellationToken,
    task: Option<tokio::task::JoinHandle<Summary>>,
    stats: Vec<(Arc<str>, Arc<HandlerStats>)>,
    slots: Vec<(Arc<str>, Arc<ComponentSlot>)>,
    shadows: Vec<(Arc<str>, Arc<idem::shadow::ShadowSlot>)>,
}

impl RunningHost {
    pub async fn start(config: &Path) -> Self {
        capture_host_logs();
        let config = Config::load(config).unwrap();
        let host = Host::start(&config).await.unwrap();
        let stats = host.stats();
        let slots = host.slots();
        let shadows = host.shadows();
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(host.run(RunMode::Forever, stop.clone()));
        RunningHost {
            stop,
            task: Some(task),
            stats,
            slots,
            shadows,
        }
    }

    /// `handler`'s shadow slot: the candidate in place and its counts.
    pub fn shadow(&self, handler: &str) -> &Arc<idem::shadow::ShadowSlot> {
        self.shadows
            .iter()
            .find(|(n, _)| &**n == handler)
            .map(|(_, s)| s)
            .unwrap_or_else(|| panic!("no handler {handler}"))
    }

    /// `handler`'s component slot: the version it runs, the last refused.
    pub fn slot(&self, handler: &str) -> &Arc<ComponentSlot> {
        self.slots
            .iter()
            .find(|(n, _)| &**n == handler)
            .map(|(_, s)| s)
            .unwrap_or_else(|| panic!("no handler {handler}"))
    }

    pub fn stats(&self, handler: &str) -> StatsSnapshot {
        self.stats
            .iter()
            .find(|(n, _)| &**n == handler)
            .map(|(_, s)| s.snapshot())
            .unwrap_or_else(|| panic!("no handler {handler}"))
    }

    /// Waits until `cond` holds for `handler`'s stats (10 s at most).
    pub async fn wait_for(
        &self,
        handler: &str,
        what: &str,
        cond: impl Fn(&StatsSnapshot) -> bool,
    ) -> StatsSnapshot {
        self.wait_for_within(handler, what, Duration::from_secs(10), cond)
            .await
    }

    /// [`RunningHost::wait_for`] with its own time limit.
    pub async fn wait_for_within(
        &self,
        handler: &str,
        what: &str,
        limit: Duration,
        cond: impl Fn(&StatsSnapshot) -> bool,
    ) -> StatsSnapshot {
        let deadline = Instant::now() + limit;
        loop {
            let s = self.stats(handler);
            if cond(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; stats {s}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(mut self) -> Summary {
        self.stop.cancel();
        self.task.take().unwrap().await.unwrap()
    }
}

impl Drop for RunningHost {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
