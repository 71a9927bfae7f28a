//! The running host: connects to broker and database, prepares tables and
//! migrations, loads every handler's component once, and runs one consuming
//! task per handler until shutdown (or, with `drain`, until nothing is left),
//! plus one pruning task that forgets receipts older than each handler's
//! retention window (see [`crate::store::PruneLock`] for the one-pruner rule).

use crate::broker::{self, Deliveries};
use crate::broker_clock::{self, BrokerClock};
use crate::config::Config;
use crate::db_gate::DbGate;
use crate::deploy::follow::Followed;
use crate::handler::PreparedHandler;
use crate::metrics::{HandlerStats, StatsSnapshot};
use crate::pipeline::Pipeline;
use crate::runtime::{LoadOptions, Runtime};
use crate::shutdown::{self, InFlight};
use crate::store::{Database, PrunePass};
use anyhow::Context as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A host ready to run: every handler's consumer exists and its component is loaded.
pub struct Host {
    handlers: Vec<RunningHandler>,
    db: Arc<Database>,
    gate: Arc<DbGate>,
    nats: broker::Broker,
    /// Cancelled when [`Host::run`] stops: ends the consumers and any wait
    /// for the database.
    stop: CancellationToken,
    /// Why the host stopped by itself (a handler's consumer lost for good),
    /// set at most once; see [`Host::failure`].
    failure: Arc<std::sync::OnceLock<String>>,
    /// The broker's clock per stream (the stream leader's, which stamps its
    /// messages), refreshed while running.
    clocks: Vec<(String, Arc<BrokerClock>)>,
    /// `[service] shutdown_grace`: how long deliveries in flight may take
    /// to finish once the host stops (ARCHITECTURE.md, "Shutdown").
    grace: Duration,
    /// The deploy buckets, when the host follows deployments (`[deploy]
    /// follow`).
    deploy: Option<crate::deploy::store::DeployStore>,
}

/// The consumers' `max_ack_pending` on the broker.
const MAX_ACK_PENDING: i64 = 1000;

/// Receipts deleted per statement by the pruning task.
pub const PRUNE_BATCH: u32 = 1000;

/// Time between two pruning passes: a tenth of the shortest retention, at
/// most a minute (and at least 50 ms).
pub fn prune_interval(retentions: impl IntoIterator<Item = Duration>) -> Duration {
    retentions
        .into_iter()
        .map(|r| r / 10)
        .min()
        .unwrap_or(Duration::from_secs(60))
        .clamp(Duration::from_millis(50), Duration::from_secs(60))
}

struct RunningHandler {
    pipeline: Arc<Pipeline>,
    consumer:
        async_nats::jetstream::consumer::Consumer<async_nats::jetstream::consumer::pull::Config>,
    /// When the consumer's stream was created (a stream made again differs).
    stream_created: time::OffsetDateTime,
    /// Set once its consuming loop runs (`/readyz`).
    consuming: Arc<AtomicBool>,
}

/// How often the consumer and receipt gauges are read again while the
/// host runs.
pub const GAUGE_REFRESH: Duration = Duration::from_secs(10);

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
    /// With `[deploy] follow`: the task that follows the deployments
    /// bucket (for every handler but those with `watch = true`, whose
    /// module file is their one source) and the one that reports this
    /// host's versions.
    fn follow_deployments(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let Some(store) = &self.deploy else {
            return Vec::new();
        };
        let followed = self
            .handlers
            .iter()
            .filter(|h| !h.pipeline.config().watch)
            .map(|h| Followed::of(h.pipeline.config(), h.pipeline.handler()))
            .collect();
        let reported = self
            .handlers
            .iter()
            .map(|h| crate::deploy::heartbeat::Reported {
                name: h.pipeline.name().to_string(),
                slot: h.pipeline.handler().slot().clone(),
                stats: h.pipeline.stats().clone(),
                watched: h.pipeline.config().watch,
            })
            .collect();
        vec![
            crate::deploy::follow::spawn(store.clone(), followed, self.stop.clone()),
            crate::deploy::heartbeat::spawn(store.clone(), reported, self.stop.clone()),
        ]
    }

    /// Starts watching the module file of every handler with `watch = true`
    /// ([`crate::deploy::watch`]). A watch that cannot start is logged
    /// once; that handler keeps the version it runs.
    fn watch_modules(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let mut watches = Vec::new();
        for h in self.handlers.iter().filter(|h| h.pipeline.config().watch) {
            let cfg = h.pipeline.config();
            let handler = h.pipeline.handler();
            match crate::deploy::watch::spawn(
                handler.runtime().clone(),
                handler.slot().clone(),
                cfg.module.clone(),
                LoadOptions { wasi: cfg.wasi },
                self.stop.clone(),
            ) {
                Ok(task) => {
                    tracing::info!(handler = %cfg.name, module = %cfg.module.display(), "watching the module file for new versions");
                    watches.push(task);
                }
                Err(e) => {
                    tracing::error!(handler = %cfg.name, error = %e, "`watch = true` cannot work; the handler keeps the version it runs")
                }
            }
        }
        watches
    }
}

/// Says once, loudly, when idem connects to PostgreSQL as a superuser: a
/// superuser session can leave any role it switches to, so the handler roles
/// add nothing and the SQL guard is the only boundary.
async fn warn_if_superuser(db: &Database) {
    if let Ok(Some((user, true))) = db.session_user().await {
        tracing::warn!(
            user = %user,
            "idem connects to PostgreSQL as superuser `{user}`: handler roles are not a boundary for a superuser session, only the SQL guard is; connect as a non-superuser that owns idem's tables and may create roles (docs/handlers.md: The PostgreSQL role)"
        );
    }
}

impl Host {
    /// Connects, prepares host tables, applies handler migrations, loads the
    /// components and creates streams and consumers. Every error is one line
    /// that names what failed.
    pub async fn start(config: &Config) -> anyhow::Result<Self> {
        let options = crate::runtime::RuntimeOptions::of(config, crate::runtime::DEFAULT_CAPACITY);
        let runtime =
            Arc::new(Runtime::with_options(&options).context("cannot start the wasm runtime")?);
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
        warn_if_superuser(&db).await;
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
        // After the migrations, which run on the pool's connections.
        db.check_durable_commit(config.database.accept_non_durable_commit)
            .await?;
        let stop = CancellationToken::new();
        let gate = Arc::new(DbGate::new(db.clone(), stop.clone()));
        let nats = broker::connect(&config.broker).await?;
        let js = &nats.js;
        // Deploy traffic (a component can be megabytes) goes over a
        // connection of its own, so a fetch never delays the consumers'
        // pulls and heartbeats on the main one.
        let deploy = if config.deploy.follow {
            let own = broker::connect(&config.broker).await?;
            Some(crate::deploy::store::DeployStore::open(&own.js, &config.deploy).await?)
        } else {
            None
        };
        let mut handlers = Vec::new();
        let mut clocks: Vec<(String, Arc<BrokerClock>)> = Vec::new();
        for (h, module) in config.handlers.iter().zip(modules) {
            let ensured = broker::ensure_consumer(js, h, MAX_ACK_PENDING).await?;
            if ensured.created && ensured.stored > 0 {
                warn_if_replaying(&db, h, ensured.stored).await;
            }
            let (consumer, stream_created) = (ensured.consumer, ensured.stream_created);
            check_horizon(js, h).await?;
            let clock = match clocks.iter().find(|(s, _)| *s == h.stream) {
                Some((_, c)) => c.clone(),
                None => {
                    let (broker_ms, at) = broker_clock::read(js, &h.stream)
                        .await
                        .with_context(|| format!("handler `{}`", h.name))?;
                    let c = Arc::new(BrokerClock::new(broker_ms, at));
                    clocks.push((h.stream.clone(), c.clone()));
                    c
                }
            };
            tracing::info!(handler = %h.name, stream = %h.stream, module = %h.module.display(), digest = %module.digest(), "handler ready");
            if h.effective_pull_batch() != h.pull_batch {
                tracing::info!(handler = %h.name, pull_batch = h.effective_pull_batch(), "pull_batch adjusted: at most what ack_wait allows so no buffered message waits past it, at least 2 (raise ack_wait or concurrency, or lower deadline, for bigger batches)");
            }
            let handler = PreparedHandler::prepare(h, module, runtime.clone(), &db).await;
            if let Some(store) = &deploy {
                crate::deploy::at_start::use_deployed(store, h, &handler).await;
            }
            let pipeline = Pipeline::new(h, handler, db.clone(), gate.clone(), clock);
            let pipeline = Arc::new(pipeline);
            handlers.push(RunningHandler {
                pipeline,
                consumer,
                stream_created,
                consuming: Arc::default(),
            });
        }
        Ok(Self {
            handlers,
            db,
            gate,
            nats,
            stop,
            failure: Arc::default(),
            clocks,
            grace: config.service.shutdown_grace,
            deploy,
        })
    }

    /// Where [`Host::run`] leaves the reason when it stopped by itself rather
    /// than on the shutdown signal: a handler's durable consumer was gone
    /// from the broker and could not be created again
    /// ([`broker::ConsumerLost`]). Take it before `run`; empty after a
    /// normal stop. The command line exits non-zero with it.
    pub fn failure(&self) -> Arc<std::sync::OnceLock<String>> {
        self.failure.clone()
    }

    /// Each handler's component slot, by handler name: the version it runs
    /// now and the last one it refused.
    pub fn slots(&self) -> Vec<(Arc<str>, Arc<crate::component_slot::ComponentSlot>)> {
        self.handlers
            .iter()
            .map(|h| {
                (
                    h.pipeline.name().clone(),
                    h.pipeline.handler().slot().clone(),
                )
            })
            .collect()
    }

    /// Each handler's counters, by handler name.
    pub fn stats(&self) -> Vec<(Arc<str>, Arc<HandlerStats>)> {
        self.handlers
            .iter()
            .map(|h| (h.pipeline.name().clone(), h.pipeline.stats().clone()))
            .collect()
    }

    /// What `/readyz` asks of this host ([`crate::http::Readiness`]):
    /// `shutdown` is the token that will be given to [`Host::run`], which
    /// turns it not ready at once when cancelled.
    pub fn readiness(&self, shutdown: CancellationToken) -> crate::http::Readiness {
        crate::http::Readiness {
            broker: self.nats.js.client(),
            gate: self.gate.clone(),
            handlers: self
                .handlers
                .iter()
                .map(|h| (h.pipeline.name().clone(), h.consuming.clone()))
                .collect(),
            stopping: vec![shutdown, self.stop.clone()],
        }
    }

    /// Runs until `shutdown` is cancelled (or drained, in
    /// [`RunMode::Drain`]). Tells the service manager `READY=1` once every
    /// handler is consuming ([`crate::systemd`]). At shutdown, fetching
    /// stops, messages fetched but not started are given back, and the
    /// deliveries in flight get `[service] shutdown_grace` to finish before
    /// they are abandoned (rolled back, given back): [`shutdown::wind_down`].
    pub async fn run(self, mode: RunMode, shutdown: CancellationToken) -> Summary {
        let stop = self.stop.clone();
        let mut tasks = Vec::new();
        let mut consuming = Vec::new();
        for h in &self.handlers {
            let (ready, consumes) = tokio::sync::oneshot::channel();
            consuming.push(consumes);
            tasks.push(tokio::spawn(consume(
                h.pipeline.clone(),
                Deliveries::new(
                    &self.nats,
                    h.consumer.clone(),
                    h.stream_created,
                    h.pipeline.config().effective_pull_batch(),
                    h.pipeline.config(),
                    MAX_ACK_PENDING,
                ),
                self.gate.clone(),
                stop.clone(),
                h.consuming.clone(),
                Lost {
                    stop: stop.clone(),
                    failure: self.failure.clone(),
                },
                Stopping {
                    grace: self.grace,
                    ready,
                },
            )));
        }
        let watches = self.watch_modules();
        let deploy_tasks = self.follow_deployments();
        let readiness = tokio::spawn(async move {
            for consumes in consuming {
                if consumes.await.is_err() {
                    return;
                }
            }
            tracing::info!("every handler is consuming");
            crate::systemd::ready();
        });
        let stats = self.stats();
        let pruner = tokio::spawn(prune_forever(
            self.db.clone(),
            self.handlers
                .iter()
                .map(|h| PruneTarget {
                    name: h.pipeline.name().clone(),
                    retention: h.pipeline.config().retention,
                    clock: h.pipeline.clock().clone(),
                    stats: h.pipeline.stats().clone(),
                })
                .collect(),
        ));
        let clock_reader = tokio::spawn(read_clocks_forever(
            self.nats.js.clone(),
            self.clocks.clone(),
        ));
        let gauges = tokio::spawn(refresh_gauges_forever(
            self.db.clone(),
            self.handlers
                .iter()
                .map(|h| GaugeTarget {
                    pipeline: h.pipeline.clone(),
                    consumer: h.consumer.clone(),
                })
                .collect(),
        ));
        let reporter = {
            let stats = stats.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(2));
                tick.tick().await;
                loop {
                    tick.tick().await;
                    for (name, s) in &stats {
                        tracing::debug!(handler = %name, "stats {}", s.snapshot());
                    }
                }
            })
        };
        match mode {
            RunMode::Forever => {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = stop.cancelled() => {}
                }
            }
            RunMode::Drain => {
                let mut consumers: Vec<_> =
                    self.handlers.iter().map(|h| h.consumer.clone()).collect();
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = stop.cancelled() => {}
                    () = wait_drained(&mut consumers) => {}
                }
            }
        }
        stop.cancel();
        for t in tasks {
            let _ = t.await;
        }
        // The naks of the messages given back must leave before the process does.
        let client = self.nats.js.client();
        if tokio::time::timeout(Duration::from_secs(5), client.flush())
            .await
            .is_err()
        {
            tracing::warn!(
                "the broker did not take the last naks within 5s; those messages are redelivered after ack_wait"
            );
        }
        readiness.abort();
        for w in watches {
            w.abort();
        }
        // Stopped by `stop`: the heartbeat deletes this host's report.
        for t in deploy_tasks {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
        reporter.abort();
        gauges.abort();
        clock_reader.abort();
        pruner.abort();
        let _ = pruner.await;
        stats.into_iter().map(|(n, s)| (n, s.snapshot())).collect()
    }
}

/// One handler's consuming loop: up to `concurrency` messages in flight,
/// each running the whole protocol in its own task. Fetches nothing while the
/// database is down (the open pull request is dropped, see
/// [`Deliveries::pause`]). Says it consumes through `stopping.ready` once
/// its pull request is out. At stop, [`shutdown::wind_down`].
async fn consume(
    pipeline: Arc<Pipeline>,
    mut deliveries: Deliveries,
    gate: Arc<DbGate>,
    stop: CancellationToken,
    consuming: Arc<AtomicBool>,
    lost: Lost,
    stopping: Stopping,
) {
    consuming.store(true, Relaxed);
    let slots = Arc::new(tokio::sync::Semaphore::new(
        pipeline.config().concurrency.max(1),
    ));
    let mut in_flight = InFlight::default();
    let (batch, linger) = (
        pipeline.config().batch.max(1),
        pipeline.config().batch_linger,
    );
    let mut ready = Some(stopping.ready);
    if deliveries.open().await.is_ok()
        && let Some(ready) = ready.take()
    {
        let _ = ready.send(());
    }
    loop {
        let slot = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            slot = slots.clone().acquire_owned() => slot,
        };
        let Ok(slot) = slot else { break };
        if !gate.is_up() {
            deliveries.pause();
            if !gate.ready().await {
                break;
            }
        }
        let msg = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            m = deliveries.next() => m,
        };
        let mut msgs = match msg {
            Ok(msg) => vec![msg],
            Err(e) => {
                lost.consumer_gone(pipeline.name(), e);
                break;
            }
        };
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        if batch > 1 {
            // A stop while the batch fills ends the filling: what was taken
            // runs (or is given back by the wind-down).
            tokio::select! {
                biased;
                () = stop.cancelled() => {}
                () = deliveries.fill(&mut msgs, batch, linger) => {}
            }
        }
        let p = pipeline.clone();
        let unsettled = shutdown::Unsettled::new(msgs.clone());
        let settling = unsettled.clone();
        in_flight.spawn(unsettled, async move {
            match msgs.as_slice() {
                [msg] => drop(p.process(msg).await),
                msgs => p.process_batch(msgs, &settling).await,
            }
            drop(slot);
        });
        in_flight.reap(pipeline.name());
    }
    shutdown::wind_down(pipeline.name(), &mut deliveries, in_flight, stopping.grace).await;
}

/// What a handler's consuming loop needs for its start and stop: the
/// shutdown grace, and where to say it consumes.
struct Stopping {
    grace: Duration,
    ready: tokio::sync::oneshot::Sender<()>,
}

/// Says clearly when a durable consumer idem just created is about to run
/// `stored` messages already in the stream into tables that already have
/// rows: the usual cause is a renamed handler (a new consumer name), which
/// applies every stored message again.
async fn warn_if_replaying(db: &Database, h: &crate::config::HandlerConfig, stored: u64) {
    let filled = db.tables_with_rows(&h.tables).await;
    if filled.is_empty() {
        return;
    }
    tracing::warn!(
        handler = %h.name,
        stream = %h.stream,
        start = %h.start,
        "new durable consumer `{}` is about to process {stored} messages already in stream `{}` into tables that already have rows ({}); if this handler was renamed, they are applied again: stop now and set start = \"new\" (or \"seq:N\"), and delete the consumer (nats consumer rm {} {})",
        h.name,
        h.stream,
        filled.join(", "),
        h.stream,
        h.name
    );
}

/// How a handler's consuming loop stops the whole host when its consumer is
/// lost for good ([`broker::ConsumerLost`]).
struct Lost {
    stop: CancellationToken,
    failure: Arc<std::sync::OnceLock<String>>,
}

impl Lost {
    /// `handler`'s consumer is gone for good: says so, and stops the host.
    fn consumer_gone(&self, handler: &str, e: broker::ConsumerLost) {
        tracing::error!(%handler, error = %e, "stopping the host: the durable consumer is gone and cannot be created again");
        let _ = self.failure.set(e.0);
        self.stop.cancel();
    }
}

/// Refuses a stream that can present a message older than the handler's
/// retention window (its `max_age` unlimited or longer), unless the handler
/// sets `accept_horizon_risk` (then a warning): such a message could find its
/// receipt pruned and run twice. It would be quarantined by the pipeline, but
/// a deployment should not rely on that by accident. `idem replay` checks
/// it too, unless it replays under a fresh name.
///
/// # Errors
/// The stream keeps messages longer than the retention window (one line
/// saying what to change), or it cannot be read.
pub async fn check_horizon(
    js: &async_nats::jetstream::Context,
    h: &crate::config::HandlerConfig,
) -> anyhow::Result<()> {
    let max_age = broker::stream_max_age(js, &h.stream)
        .await
        .with_context(|| format!("handler `{}`", h.name))?;
    if max_age.is_some_and(|a| a <= h.retention) {
        return Ok(());
    }
    let keeps = max_age.map_or_else(
        || "ever".to_string(),
        |a| humantime::format_duration(a).to_string(),
    );
    let retention = humantime::format_duration(h.retention);
    if h.accept_horizon_risk {
        tracing::warn!(handler = %h.name, stream = %h.stream, "stream keeps messages for {keeps} but receipts are kept for {retention}; accept_horizon_risk = true, so a message older than that is dead-lettered (beyond-horizon) instead of run");
        return Ok(());
    }
    anyhow::bail!(
        "handler `{}`: stream `{}` keeps messages for {keeps} but receipts are kept for {retention}; a redelivered or replayed message older than that could run twice. Set the stream's max_age <= retention, raise retention, or set accept_horizon_risk = true",
        h.name,
        h.stream
    )
}

/// One handler as the pruning task sees it.
struct PruneTarget {
    name: Arc<str>,
    retention: Duration,
    clock: Arc<BrokerClock>,
    stats: Arc<HandlerStats>,
}

/// The pruning task: every [`prune_interval`], one pass over every handler
/// (skipped while another host holds the prune lock), deleting receipts
/// published before [`broker_clock::prune_cutoff`] of the broker's clock now,
/// counted in each handler's `receipts_pruned`. Errors are logged; the next
/// pass tries again.
async fn prune_forever(db: Arc<Database>, handlers: Vec<PruneTarget>) {
    let mut tick = tokio::time::interval(prune_interval(handlers.iter().map(|h| h.retention)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let targets: Vec<(&str, i64)> = handlers
            .iter()
            .map(|h| {
                (
                    &*h.name,
                    broker_clock::prune_cutoff(h.clock.now_ms(), h.retention),
                )
            })
            .collect();
        match db.prune_pass(&targets, PRUNE_BATCH).await {
            Ok(PrunePass::Pruned(counts)) => {
                for (h, n) in handlers.iter().zip(counts) {
                    if n > 0 {
                        h.stats.receipts_pruned.add(n);
                        tracing::info!(handler = %h.name, pruned = n, "pruned receipts older than the retention window");
                    }
                }
            }
            Ok(PrunePass::Skipped) => {
                tracing::debug!("another host holds the prune lock; pass skipped");
            }
            Err(e) => tracing::warn!(error = %e, "pruning receipts failed; retrying next pass"),
        }
    }
}

/// Reads the broker's clock again every [`broker_clock::REFRESH`], per
/// stream. A failed reading keeps the last one, carried forward on the
/// monotonic clock (logged at debug: the broker being away is reported by
/// the consumers).
async fn read_clocks_forever(
    js: async_nats::jetstream::Context,
    clocks: Vec<(String, Arc<BrokerClock>)>,
) {
    let mut tick = tokio::time::interval(broker_clock::REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        for (stream, clock) in &clocks {
            match broker_clock::read(&js, stream).await {
                Ok((broker_ms, at)) => clock.set(broker_ms, at),
                Err(e) => {
                    tracing::debug!(%stream, error = %e, "broker clock not read; the last reading goes on")
                }
            }
        }
    }
}

/// One handler as the gauge refresh sees it.
struct GaugeTarget {
    pipeline: Arc<Pipeline>,
    consumer:
        async_nats::jetstream::consumer::Consumer<async_nats::jetstream::consumer::pull::Config>,
}

/// Every [`GAUGE_REFRESH`], per handler: the consumer's pending and
/// ack-pending counts from the broker's consumer info, and the receipts'
/// row count and oldest publish time ([`Database::receipt_gauges`], cheap
/// on a large table), its age measured on the broker's clock. A reading
/// that fails keeps the last value (logged at debug: the broker or
/// database being away is reported elsewhere).
async fn refresh_gauges_forever(db: Arc<Database>, mut handlers: Vec<GaugeTarget>) {
    let mut tick = tokio::time::interval(GAUGE_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for h in &mut handlers {
            let stats = h.pipeline.stats();
            match h.consumer.info().await {
                Ok(info) => stats.set_consumer(
                    info.num_pending,
                    u64::try_from(info.num_ack_pending).unwrap_or(0),
                ),
                Err(e) => {
                    tracing::debug!(handler = %h.pipeline.name(), error = %e, "consumer info not read for the metrics")
                }
            }
            match db.receipt_gauges(h.pipeline.name()).await {
                Ok(g) => {
                    let now_ms = h.pipeline.clock().now_ms();
                    let age = g.oldest_ms.map(|oldest| {
                        Duration::from_millis(u64::try_from(now_ms - oldest).unwrap_or(0))
                    });
                    stats.set_receipts(g.rows, age);
                }
                Err(e) => {
                    tracing::debug!(handler = %h.pipeline.name(), error = %e, "receipts not read for the metrics")
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_interval_is_a_tenth_of_the_shortest_retention_within_bounds() {
        let s = Duration::from_secs;
        assert_eq!(prune_interval([s(7 * 86_400)]), s(60));
        assert_eq!(prune_interval([s(3600), s(100)]), s(10));
        assert_eq!(prune_interval([s(1)]), Duration::from_millis(100));
        assert_eq!(
            prune_interval([Duration::from_millis(10)]),
            Duration::from_millis(50)
        );
        assert_eq!(prune_interval([]), s(60));
    }
}
