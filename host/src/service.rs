//! The running host: connects to broker and database, prepares tables and
//! migrations, loads every handler's component once, and runs one consuming
//! task per handler until shutdown (or, with `drain`, until nothing is left).

use crate::broker::{self, Deliveries};
use crate::config::Config;
use crate::metrics::{HandlerStats, StatsSnapshot};
use crate::pipeline::Pipeline;
use crate::runtime::{LoadOptions, Runtime};
use crate::store::Database;
use anyhow::Context as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A host ready to run: every handler's consumer exists and its component is loaded.
pub struct Host {
    handlers: Vec<RunningHandler>,
}

struct RunningHandler {
    pipeline: Arc<Pipeline>,
    consumer:
        async_nats::jetstream::consumer::Consumer<async_nats::jetstream::consumer::pull::Config>,
}

/// Each handler's name and final counters, as [`Host::run`] returns them.
pub type Summary = Vec<(Arc<str>, StatsSnapshot)>;

/// How [`Host::run`] ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    /// Until the shutdown signal.
    Forever,
    /// Until every handler's consumer has nothing pending or unacked (or shutdown).
    Drain,
}

impl Host {
    /// Connects, prepares host tables, applies handler migrations, loads the
    /// components and creates streams and consumers. Every error is one line
    /// that names what failed.
    pub async fn start(config: &Config) -> anyhow::Result<Self> {
        let runtime = Arc::new(Runtime::new().context("cannot start the wasm runtime")?);
        // Load every module first: a bad module fails fast, before any connection.
        let mut modules = Vec::new();
        for h in &config.handlers {
            let module = runtime
                .load(&h.module, LoadOptions { wasi: h.wasi })
                .map_err(|e| anyhow::anyhow!("handler `{}`: {e}", h.name))?;
            modules.push(module);
        }
        let db = Arc::new(
            Database::connect_with(
                &config.database.url,
                config.database.max_connections,
                config.lock_wait(),
            )
            .await?,
        );
        db.prepare_host_tables().await?;
        for h in &config.handlers {
            if let Some(dir) = &h.migrations {
                db.migrate_handler(&h.name, dir).await.with_context(|| {
                    format!(
                        "handler `{}`: migrations in {} failed",
                        h.name,
                        dir.display()
                    )
                })?;
            }
        }
        let js = broker::connect(&config.broker.url).await?;
        let mut handlers = Vec::new();
        for (h, module) in config.handlers.iter().zip(modules) {
            let consumer = broker::ensure_consumer(&js, h, 1000).await?;
            tracing::info!(handler = %h.name, stream = %h.stream, module = %h.module.display(), digest = %module.digest(), "handler ready");
            let mut pipeline = Pipeline::new(h, module, runtime.clone(), db.clone());
            pipeline.db_role = match db.prepare_handler_role(&h.name, &h.tables).await {
                Ok(role) => role,
                Err(e) => {
                    tracing::warn!(handler = %h.name, error = %e, "cannot set up a PostgreSQL role for this handler; its statements run as the host's user, checked by the SQL guard only (grant CREATEROLE to enable this defence)");
                    None
                }
            };
            let pipeline = Arc::new(pipeline);
            handlers.push(RunningHandler { pipeline, consumer });
        }
        Ok(Self { handlers })
    }

    /// Each handler's counters, by handler name.
    pub fn stats(&self) -> Vec<(Arc<str>, Arc<HandlerStats>)> {
        self.handlers
            .iter()
            .map(|h| (h.pipeline.name.clone(), h.pipeline.stats.clone()))
            .collect()
    }

    /// Runs until `shutdown` turns true (or drained, in [`RunMode::Drain`]).
    /// A message in flight at shutdown finishes its protocol step first.
    pub async fn run(self, mode: RunMode, mut shutdown: watch::Receiver<bool>) -> Summary {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        for h in &self.handlers {
            let pipeline = h.pipeline.clone();
            let mut deliveries =
                Deliveries::new(h.consumer.clone(), pipeline.pull_batch, &pipeline.name);
            let mut stop = stop_rx.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let msg = tokio::select! {
                        biased;
                        _ = stop.wait_for(|s| *s) => break,
                        m = deliveries.next() => m,
                    };
                    pipeline.process(&msg).await;
                }
            }));
        }
        let stats = self.stats();
        let reporter = {
            let stats = stats.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(2));
                tick.tick().await;
                loop {
                    tick.tick().await;
                    for (name, s) in &stats {
                        tracing::info!(handler = %name, "stats {}", s.snapshot());
                    }
                }
            })
        };
        match mode {
            RunMode::Forever => {
                let _ = shutdown.wait_for(|s| *s).await;
            }
            RunMode::Drain => {
                let mut consumers: Vec<_> =
                    self.handlers.iter().map(|h| h.consumer.clone()).collect();
                tokio::select! {
                    _ = shutdown.wait_for(|s| *s) => {}
                    _ = wait_drained(&mut consumers) => {}
                }
            }
        }
        let _ = stop_tx.send(true);
        for t in tasks {
            let _ = t.await;
        }
        reporter.abort();
        stats.into_iter().map(|(n, s)| (n, s.snapshot())).collect()
    }
}

async fn wait_drained(
    consumers: &mut [async_nats::jetstream::consumer::Consumer<
        async_nats::jetstream::consumer::pull::Config,
    >],
) {
    // Two idle readings in a row, so a message between pull and ack is not missed.
    let mut idle_readings = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut idle = true;
        for c in consumers.iter_mut() {
            match broker::outstanding(c).await {
                Ok(0) => {}
                Ok(_) => idle = false,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read consumer info");
                    idle = false;
                }
            }
        }
        idle_readings = if idle { idle_readings + 1 } else { 0 };
        if idle_readings >= 2 {
            return;
        }
    }
}
