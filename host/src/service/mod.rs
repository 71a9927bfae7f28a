//! The running host: connects to broker and database, prepares tables and
//! migrations, loads every handler's component once ([`Host::start`],
//! `start.rs`), and runs ([`Host::run`], `run.rs`) one consuming loop per
//! handler (`consume.rs`) until shutdown (or, with `drain`, until nothing is
//! left), beside its background tasks (`tasks.rs`; the pruning task is
//! [`crate::retention::prune_forever`], see [`crate::store::PruneLock`] for
//! the one-pruner rule). [`http`] is its listener, [`systemd`] what it tells
//! the service manager, [`shutdown`] how a consuming loop stops
//! (ARCHITECTURE.md, "Shutdown").

mod consume;
mod consume_ordered;
pub mod http;
mod key_lanes;
mod run;
pub mod shutdown;
mod start;
pub mod systemd;
mod tasks;

use crate::broker::{self, clock::BrokerClock};
use crate::metrics::{HandlerStats, StatsSnapshot};
use crate::pipeline::Pipeline;
use crate::pipeline::db_gate::DbGate;
use crate::store::Database;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
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
    /// The outbox relay, taken when the host runs.
    relay: Option<crate::outbox::relay::Relay>,
}

/// The consumers' `max_ack_pending` on the broker.
const MAX_ACK_PENDING: i64 = 1000;

struct RunningHandler {
    pipeline: Arc<Pipeline>,
    /// Its durable consumers: one, or one per partition (`partitions`),
    /// each with a consuming loop of its own.
    consumers: Vec<HandlerConsumer>,
}

/// One durable consumer of a handler and its consuming loop's state.
struct HandlerConsumer {
    /// The handler's config with [`crate::config::HandlerConfig::partition`]
    /// set for a partition's consumer.
    config: crate::config::HandlerConfig,
    consumer:
        async_nats::jetstream::consumer::Consumer<async_nats::jetstream::consumer::pull::Config>,
    /// When the consumer's stream was created (a stream made again differs).
    stream_created: time::OffsetDateTime,
    /// Set once its consuming loop runs (`/readyz`).
    consuming: Arc<AtomicBool>,
    /// What the server said to its pull requests (`/readyz`,
    /// `idem_consumer_silence_seconds`).
    liveness: Arc<broker::liveness::Liveness>,
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
    pub fn slots(&self) -> Vec<(Arc<str>, Arc<crate::runtime::component_slot::ComponentSlot>)> {
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

    /// Each handler's shadow slot, by handler name ([`crate::shadow`]).
    pub fn shadows(&self) -> Vec<(Arc<str>, Arc<crate::shadow::ShadowSlot>)> {
        self.handlers
            .iter()
            .map(|h| {
                (
                    h.pipeline.name().clone(),
                    h.pipeline.handler().shadow().clone(),
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

    /// What `/readyz` asks of this host ([`crate::service::http::Readiness`]):
    /// `shutdown` is the token that will be given to [`Host::run`], which
    /// turns it not ready at once when cancelled.
    pub fn readiness(&self, shutdown: CancellationToken) -> crate::service::http::Readiness {
        crate::service::http::Readiness {
            broker: self.nats.js.client(),
            gate: self.gate.clone(),
            handlers: self
                .handlers
                .iter()
                .flat_map(|h| {
                    h.consumers
                        .iter()
                        .map(|c| crate::service::http::HandlerReadiness {
                            name: match c.config.partition {
                                None => h.pipeline.name().clone(),
                                Some(_) => c.config.durable_name().into(),
                            },
                            consuming: c.consuming.clone(),
                            liveness: c.liveness.clone(),
                        })
                })
                .collect(),
            stopping: vec![shutdown, self.stop.clone()],
        }
    }
}

/// Every 2 s, each handler's counters as one `stats …` line at debug
/// (docs/operating.md's `RUST_LOG=idem::service=debug`; defined here so that the
/// line's target stays `idem::service`).
async fn report_stats_forever(stats: Vec<(Arc<str>, Arc<HandlerStats>)>) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.tick().await;
    loop {
        tick.tick().await;
        for (name, s) in &stats {
            tracing::debug!(handler = %name, "stats {}", s.snapshot());
        }
    }
}
