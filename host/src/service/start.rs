//! [`Host::start`]: everything a host does before it consumes, each
//! failure one line that names what failed.

use super::{HandlerConsumer, Host, MAX_ACK_PENDING, RunningHandler};
use crate::broker::{
    self,
    clock::{self, BrokerClock},
};
use crate::config::Config;
use crate::pipeline::Pipeline;
use crate::pipeline::db_gate::DbGate;
use crate::pipeline::step::PreparedHandler;
use crate::retention::check_horizon;
use crate::runtime::{LoadOptions, Runtime};
use crate::store::Database;
use anyhow::Context as _;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

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
            Some(
                crate::deploy::store::DeployStore::open(&own, &config.deploy)
                    .await?
                    .with_marks(db.clone()),
            )
        } else {
            None
        };
        // Every host relays what committed messages stored in the outbox.
        let relay = crate::outbox::relay::Relay::new(
            db.clone(),
            js.clone(),
            config
                .handlers
                .iter()
                .map(|h| {
                    let grants = crate::outbox::OutboxGrants::of_handler(h);
                    (h.name.clone(), Arc::new(grants))
                })
                .collect(),
        )?;
        let mut handlers = Vec::new();
        let mut clocks: Vec<(String, Arc<BrokerClock>)> = Vec::new();
        for (h, module) in config.handlers.iter().zip(modules) {
            let mut consumers = Vec::new();
            for part in h.per_partition() {
                let ensured = nats
                    .through_elections(
                        &format!("the stream and consumer of handler `{}`", part.name),
                        broker::unanswered::unanswered,
                        || broker::ensure_consumer(js, &part, MAX_ACK_PENDING),
                    )
                    .await?;
                if ensured.created && ensured.stored > 0 {
                    warn_if_replaying(&db, &part, ensured.stored).await;
                }
                consumers.push(HandlerConsumer {
                    config: part,
                    consumer: ensured.consumer,
                    stream_created: ensured.stream_created,
                    consuming: Arc::default(),
                    liveness: Arc::default(),
                });
            }
            nats.through_elections(
                &format!("the stream of handler `{}`", h.name),
                broker::unanswered::unanswered,
                || check_horizon(js, h),
            )
            .await?;
            let clock = match clocks.iter().find(|(s, _)| *s == h.stream) {
                Some((_, c)) => c.clone(),
                None => {
                    let (broker_ms, at) = nats
                        .through_elections(
                            &format!("the clock of stream `{}`", h.stream),
                            clock::ClockError::unanswered,
                            || clock::read(js, &h.stream),
                        )
                        .await
                        .with_context(|| format!("handler `{}`", h.name))?;
                    let c = Arc::new(BrokerClock::new(broker_ms, at));
                    clocks.push((h.stream.clone(), c.clone()));
                    c
                }
            };
            tracing::info!(handler = %h.name, stream = %h.stream, module = %h.module.display(), digest = %module.digest(), "handler ready");
            if h.pull_size() != h.pull_batch {
                tracing::info!(handler = %h.name, pull_batch = h.pull_size(), "pull_batch adjusted: at most what ack_wait allows so no buffered message waits past it, at least 2 (raise ack_wait or concurrency, or lower deadline, for bigger batches)");
            }
            let mut handler = PreparedHandler::prepare(h, module, runtime.clone(), &db).await;
            handler.wake_relay(relay.waker());
            if let Some(store) = &deploy {
                crate::deploy::at_start::use_deployed(store, h, &handler).await?;
            }
            let pipeline = Pipeline::new(h, handler, db.clone(), gate.clone(), clock);
            let pipeline = Arc::new(pipeline);
            handlers.push(RunningHandler {
                pipeline,
                consumers,
            });
        }
        // After every handler's stream exists: a handler may publish to
        // another's.
        nats.through_elections(
            "the streams the outbox publishes to",
            broker::unanswered::unanswered,
            || crate::outbox::window::check_streams(js, &config.handlers),
        )
        .await?;
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
            relay: Some(relay),
        })
    }
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
        h.durable_name(),
        h.stream,
        filled.join(", "),
        h.stream,
        h.durable_name()
    );
}
