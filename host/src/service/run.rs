//! [`Host::run`]: the consuming loops and background tasks started, the
//! wait for the stop (or the drain), and the stop in order.

use super::consume::{Lost, Stopping, consume};
use super::consume_ordered::{KeyRule, consume_ordered};
use super::tasks::{GaugeTarget, read_clocks_forever, refresh_gauges_forever, wait_drained};
use super::{Host, MAX_ACK_PENDING, RunMode, Summary, report_stats_forever};
use crate::broker::Deliveries;
use crate::retention::{PruneTarget, prune_forever};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

impl Host {
    /// Runs until `shutdown` is cancelled (or drained, in
    /// [`RunMode::Drain`]). Tells the service manager `READY=1` once every
    /// handler is consuming ([`crate::service::systemd`]). At shutdown, fetching
    /// stops, messages fetched but not started are given back, and the
    /// deliveries in flight get `[service] shutdown_grace` to finish before
    /// they are abandoned (rolled back, given back): [`super::shutdown::wind_down`].
    pub async fn run(mut self, mode: RunMode, shutdown: CancellationToken) -> Summary {
        let stop = self.stop.clone();
        // The relay stops after the consumers: what they commit while
        // winding down still leaves.
        let relay_stop = CancellationToken::new();
        let relay = self
            .relay
            .take()
            .map(|r| tokio::spawn(r.run(relay_stop.clone())));
        let mut tasks = Vec::new();
        let mut consuming = Vec::new();
        // Each partition's consumer and the pin this host holds on it.
        let mut pins = Vec::new();
        for h in &self.handlers {
            for c in &h.consumers {
                let (ready, consumes) = tokio::sync::oneshot::channel();
                consuming.push(consumes);
                let deliveries = Deliveries::new(
                    &self.nats,
                    c.consumer.clone(),
                    c.stream_created,
                    h.pipeline.config().pull_size(),
                    &c.config,
                    MAX_ACK_PENDING,
                    c.liveness.clone(),
                );
                let lost = Lost {
                    stop: stop.clone(),
                    failure: self.failure.clone(),
                };
                let stopping = Stopping {
                    grace: self.grace,
                    ready,
                };
                if c.config.partition.is_some() {
                    pins.push((c.consumer.cached_info().clone(), deliveries.pin()));
                }
                let (pipeline, gate, consuming) =
                    (h.pipeline.clone(), self.gate.clone(), c.consuming.clone());
                tasks.push(match c.config.order_key.clone() {
                    None => tokio::spawn(consume(
                        pipeline,
                        deliveries,
                        gate,
                        stop.clone(),
                        consuming,
                        lost,
                        stopping,
                    )),
                    Some(key) => tokio::spawn(consume_ordered(
                        pipeline,
                        deliveries,
                        gate,
                        stop.clone(),
                        consuming,
                        lost,
                        stopping,
                        KeyRule {
                            order_key: key,
                            partitioned: c.config.partitions.is_some(),
                        },
                    )),
                });
            }
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
            crate::service::systemd::ready();
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
                    consumers: h.consumers.iter().map(|c| c.consumer.clone()).collect(),
                })
                .collect(),
        ));
        let reporter = tokio::spawn(report_stats_forever(stats.clone()));
        match mode {
            RunMode::Forever => {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = stop.cancelled() => {}
                }
            }
            RunMode::Drain => {
                let mut consumers: Vec<_> = self
                    .handlers
                    .iter()
                    .flat_map(|h| h.consumers.iter().map(|c| c.consumer.clone()))
                    .collect();
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
        relay_stop.cancel();
        if let Some(relay) = relay {
            // A pass stops between rows; one send (or a claim waiting for a
            // database that does not answer) may take a while: bounded.
            let bound = crate::outbox::relay::SEND_TIMEOUT + crate::outbox::relay::LAST_PASSES;
            let abort = relay.abort_handle();
            if tokio::time::timeout(bound, relay).await.is_err() {
                abort.abort();
                tracing::info!(
                    "the outbox relay did not stop within {bound:?}; what it had claimed is sent after its lease"
                );
            }
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
        // The partitions this host served go to a standby host now, not
        // after their priority_timeout: the naks above went out first, so
        // it gets what was given back before anything newer.
        let mut unpinned = 0;
        for (info, pin) in pins {
            let held = pin
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_some();
            if !held {
                continue;
            }
            match crate::broker::partition::unpin(&self.nats.js, &info.stream_name, &info.name)
                .await
            {
                Ok(()) => unpinned += 1,
                Err(e) => {
                    tracing::warn!(consumer = %info.name, error = %format!("{e:#}"), "the partition's pin was not given back; another host takes the partition after its priority_timeout")
                }
            }
        }
        if unpinned > 0 {
            tracing::info!(
                partitions = unpinned,
                "gave back this host's pins on its partitions; standby hosts take them now"
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
