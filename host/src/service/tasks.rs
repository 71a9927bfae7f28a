//! The running host's background tasks besides the consuming loops and the
//! pruning task ([`crate::retention::prune_forever`]): following
//! deployments and watching module files ([`crate::deploy`]), reading the
//! broker's clock again, refreshing the gauges, and waiting for a drain.

use super::{GAUGE_REFRESH, Host};
use crate::broker::{
    self,
    clock::{self, BrokerClock},
};
use crate::deploy::follow::Followed;
use crate::pipeline::Pipeline;
use crate::runtime::LoadOptions;
use crate::store::Database;
use std::sync::Arc;
use std::time::Duration;

impl Host {
    /// With `[deploy] follow`: the task that follows the deployments
    /// bucket (for every handler but those with `watch = true`, whose
    /// module file is their one source), the one that reports this host's
    /// versions, and the one that follows shadow deployments
    /// ([`crate::shadow::follow`]).
    pub(super) fn follow_deployments(&self) -> Vec<tokio::task::JoinHandle<()>> {
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
                shadow: h.pipeline.handler().shadow().clone(),
            })
            .collect();
        let shadowed = self
            .handlers
            .iter()
            .filter(|h| !h.pipeline.config().watch)
            .map(|h| {
                let handler = h.pipeline.handler();
                crate::shadow::follow::Shadowed {
                    name: h.pipeline.name().to_string(),
                    shadow: handler.shadow().clone(),
                    live: handler.slot().clone(),
                    runtime: handler.runtime().clone(),
                    options: LoadOptions {
                        wasi: h.pipeline.config().wasi,
                    },
                }
            })
            .collect();
        vec![
            crate::deploy::follow::spawn(store.clone(), followed, self.stop.clone()),
            crate::deploy::heartbeat::spawn(store.clone(), reported, self.stop.clone()),
            crate::shadow::follow::spawn(store.clone(), shadowed, self.stop.clone()),
        ]
    }

    /// Starts watching the module file of every handler with `watch = true`
    /// ([`crate::deploy::watch`]). A watch that cannot start is logged
    /// once; that handler keeps the version it runs.
    pub(super) fn watch_modules(&self) -> Vec<tokio::task::JoinHandle<()>> {
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

/// Reads the broker's clock again every [`clock::REFRESH`], per
/// stream. A failed reading keeps the last one, carried forward on the
/// monotonic clock (logged at debug: the broker being away is reported by
/// the consumers).
pub(super) async fn read_clocks_forever(
    js: async_nats::jetstream::Context,
    clocks: Vec<(String, Arc<BrokerClock>)>,
) {
    let mut tick = tokio::time::interval(clock::REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        for (stream, clock) in &clocks {
            match clock::read(&js, stream).await {
                Ok((broker_ms, at)) => clock.set(broker_ms, at),
                Err(e) => {
                    tracing::debug!(%stream, error = %e, "broker clock not read; the last reading goes on")
                }
            }
        }
    }
}

/// One handler as the gauge refresh sees it.
pub(super) struct GaugeTarget {
    pub(super) pipeline: Arc<Pipeline>,
    /// Its durable consumers (one per partition), whose counts are summed.
    pub(super) consumers: Vec<
        async_nats::jetstream::consumer::Consumer<async_nats::jetstream::consumer::pull::Config>,
    >,
}

/// Every [`GAUGE_REFRESH`], per handler: the consumer's pending and
/// ack-pending counts from the broker's consumer info, and the receipts'
/// row count and oldest publish time ([`Database::receipt_gauges`], cheap
/// on a large table), its age measured on the broker's clock. A reading
/// that fails keeps the last value (logged at debug: the broker or
/// database being away is reported elsewhere).
pub(super) async fn refresh_gauges_forever(db: Arc<Database>, mut handlers: Vec<GaugeTarget>) {
    let mut tick = tokio::time::interval(GAUGE_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for h in &mut handlers {
            let stats = h.pipeline.stats();
            let mut counts = Some((0, 0));
            for c in &mut h.consumers {
                match c.info().await {
                    Ok(info) => {
                        if let Some((pending, ack_pending)) = counts.as_mut() {
                            *pending += info.num_pending;
                            *ack_pending += u64::try_from(info.num_ack_pending).unwrap_or(0);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(handler = %h.pipeline.name(), error = %e, "consumer info not read for the metrics");
                        counts = None;
                    }
                }
            }
            if let Some((pending, ack_pending)) = counts {
                stats.set_consumer(pending, ack_pending);
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

/// Returns once every consumer has nothing pending or unacked.
pub(super) async fn wait_drained(
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
