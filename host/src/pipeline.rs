//! The protocol for one message, written once for every database
//! (DESIGN.md, "The protocol"):
//!
//! ```text
//! published longer ago than `retention` → durable dead letter (beyond-horizon) → term
//! BEGIN → INSERT receipt ON CONFLICT DO NOTHING
//!   0 rows → ROLLBACK → ack → duplicate
//!   run guest handle(msg) in this transaction
//!     ok     → COMMIT → confirmed ack
//!     retry  → ROLLBACK → nak with delay (dead letter on the last delivery)
//!     reject → ROLLBACK → durable dead letter → term
//!     trap   → as retry
//! ```
//!
//! Ack only after commit; never ack a message whose effect is not durable,
//! except one whose dead letter is durable first.

use crate::broker;
use crate::config::{HandlerConfig, IdentityRule};
use crate::fault;
use crate::metrics::HandlerStats;
use crate::runtime::{GuestMessage, HandlerFailure, HandlerModule, Invocation, Limits, Runtime};
use crate::sql_guard::SqlGuard;
use crate::store::{Database, DeadLetter, Receipt};
use async_nats::jetstream::Message;
use std::sync::Arc;
use std::time::Duration;

/// Everything one handler needs to run the protocol on its messages.
pub struct Pipeline {
    pub name: Arc<str>,
    pub stream: String,
    pub identity: IdentityRule,
    pub max_deliver: u32,
    pub pull_batch: usize,
    /// The handler's config, for its nak delays ([`HandlerConfig::nak_delay`]).
    pub config: HandlerConfig,
    pub statement_timeout: Duration,
    /// The retention window: a message published longer ago than this is
    /// quarantined (DESIGN.md invariant 7).
    pub retention: Duration,
    /// PostgreSQL role the guest's statements run as (defence in depth), if set up.
    pub db_role: Option<String>,
    pub module: Arc<HandlerModule>,
    pub guard: Arc<SqlGuard>,
    pub limits: Limits,
    pub runtime: Arc<Runtime>,
    pub db: Arc<Database>,
    pub stats: Arc<HandlerStats>,
}

/// What happened to one delivery (also counted in [`HandlerStats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Processed,
    Duplicate,
    Retried(String),
    DeadLettered(String),
    /// The store failed (database down, commit error): rolled back, naked.
    StoreFailed(String),
}

impl Pipeline {
    /// Builds the pipeline for one configured handler.
    pub fn new(
        cfg: &HandlerConfig,
        module: Arc<HandlerModule>,
        runtime: Arc<Runtime>,
        db: Arc<Database>,
    ) -> Self {
        let limits = Limits {
            deadline: cfg.deadline,
            max_memory_bytes: cfg.max_memory_mib as usize * 1024 * 1024,
            max_statements: cfg.max_statements,
            max_rows: cfg.max_rows,
            max_log_bytes: cfg.max_log_kib.saturating_mul(1024),
        };
        Self {
            name: Arc::from(cfg.name.as_str()),
            stream: cfg.stream.clone(),
            identity: cfg.identity.clone(),
            max_deliver: cfg.max_deliver,
            pull_batch: cfg.pull_batch,
            config: cfg.clone(),
            statement_timeout: cfg.statement_timeout(),
            retention: cfg.retention,
            db_role: None,
            guard: Arc::new(SqlGuard::new(db.kind(), &cfg.tables)),
            module,
            limits,
            runtime,
            db,
            stats: Arc::new(HandlerStats::default()),
        }
    }

    /// Runs the protocol for one delivery, including its ack / nak / term.
    pub async fn process(&self, msg: &Message) -> Outcome {
        HandlerStats::incr(&self.stats.delivered);
        let (stream_sequence, delivered, published_ms) = match msg.info() {
            Ok(info) => (
                info.stream_sequence,
                u64::try_from(info.delivered).unwrap_or(1),
                (info.published.unix_timestamp_nanos() / 1_000_000) as i64,
            ),
            Err(e) => {
                // Not a JetStream delivery (no ack subject): nothing to ack either.
                tracing::error!(handler = %self.name, error = %e, "message without JetStream metadata; ignored");
                return Outcome::StoreFailed(format!("no JetStream metadata: {e}"));
            }
        };
        let headers: Vec<(String, String)> = msg
            .headers
            .iter()
            .flat_map(|h| {
                h.iter().flat_map(|(k, vs)| {
                    vs.iter()
                        .map(move |v| (k.to_string(), v.as_str().to_string()))
                })
            })
            .collect();
        let subject = msg.subject.to_string();

        let identity =
            match crate::identity::extract(&self.identity, msg.headers.as_ref(), &msg.payload) {
                Ok(id) => id,
                Err(reason) => {
                    return self
                        .dead_letter(msg, None, stream_sequence, &subject, &headers, &reason)
                        .await;
                }
            };

        // Beyond the memory horizon: the receipt that would recognise this
        // message may already be pruned, so it cannot be proven new. Quarantined
        // before any receipt or guest code (DESIGN.md invariant 7).
        if let Some(reason) = self.beyond_horizon(published_ms) {
            return self
                .dead_letter(
                    msg,
                    Some(&identity),
                    stream_sequence,
                    &subject,
                    &headers,
                    &reason,
                )
                .await;
        }

        // From here on the work can take a while (a lock wait, a slow guest):
        // keep the message ours until this delivery is settled.
        let _in_progress = broker::InProgress::start(msg.clone(), self.config.ack_wait);
        let mut tx = match self.db.begin_bounded(self.statement_timeout).await {
            Ok(tx) => tx,
            Err(e) => {
                return self
                    .store_failed(msg, &identity, "BEGIN", e.to_string())
                    .await;
            }
        };
        let receipt = Receipt {
            consumer: &self.name,
            message_id: &identity,
            stream_sequence,
            module_digest: self.module.digest(),
        };
        match tx.insert_receipt(&receipt).await {
            Ok(true) => {
                if let Some(role) = &self.db_role
                    && let Err(e) = tx.enter_handler_role(role).await
                {
                    let _ = tx.rollback().await;
                    return self
                        .store_failed(msg, &identity, "SET LOCAL ROLE", e.to_string())
                        .await;
                }
            }
            Ok(false) => {
                if let Err(e) = tx.rollback().await {
                    tracing::warn!(handler = %self.name, %identity, error = %e, "rollback of a duplicate failed");
                }
                HandlerStats::incr(&self.stats.duplicates);
                tracing::debug!(handler = %self.name, %identity, stream_sequence, "duplicate: receipt exists; acking");
                self.confirm_ack(msg, &identity).await;
                return Outcome::Duplicate;
            }
            Err(e) => {
                let _ = tx.rollback().await;
                return self
                    .store_failed(msg, &identity, "receipt insert", e.to_string())
                    .await;
            }
        }

        let guest_msg = GuestMessage {
            identity: identity.clone(),
            subject: subject.clone(),
            headers: headers.clone(),
            payload: msg.payload.to_vec(),
            stream_sequence,
            delivery_count: delivered,
            published_ms,
        };
        let call = Invocation {
            handler: self.name.clone(),
            identity: identity.clone(),
            guard: self.guard.clone(),
            limits: self.limits.clone(),
            stats: self.stats.clone(),
        };
        let (result, tx) = self
            .runtime
            .handle(&self.module, &call, tx, guest_msg)
            .await;
        match result {
            Ok(()) => {
                if let Err(e) = tx.commit().await {
                    // Outcome unknown or failed: never ack. Redelivery and the receipt decide.
                    return self
                        .store_failed(msg, &identity, "COMMIT", e.to_string())
                        .await;
                }
                fault::after_commit();
                HandlerStats::incr(&self.stats.processed);
                self.confirm_ack(msg, &identity).await;
                Outcome::Processed
            }
            Err(failure) => {
                // Bounded: a statement the runtime abandoned at the deadline is
                // cancelled by the statement timeout, then the rollback runs.
                let bound = self.statement_timeout + Duration::from_secs(5);
                match tokio::time::timeout(bound, tx.rollback()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(handler = %self.name, %identity, error = %e, "rollback failed (the connection is discarded; nothing was committed)");
                    }
                    Err(_) => {
                        tracing::error!(handler = %self.name, %identity, "rollback did not finish within {bound:?}; connection abandoned, nothing was committed");
                    }
                }
                let (reason, permanent) = match &failure {
                    HandlerFailure::Reject(r) => (format!("rejected: {r}"), true),
                    HandlerFailure::Retry(r) => (format!("retry: {r}"), false),
                    HandlerFailure::Trap(t) => {
                        HandlerStats::incr(&self.stats.traps);
                        (format!("trap: {t}"), false)
                    }
                };
                let last = delivered >= u64::from(self.max_deliver);
                if permanent || last {
                    let reason = if permanent {
                        reason
                    } else {
                        format!(
                            "{reason} (delivery {delivered} of max_deliver {})",
                            self.max_deliver
                        )
                    };
                    tracing::warn!(handler = %self.name, %identity, %reason, "dead-lettering");
                    self.dead_letter(
                        msg,
                        Some(&identity),
                        stream_sequence,
                        &subject,
                        &headers,
                        &reason,
                    )
                    .await
                } else {
                    tracing::info!(handler = %self.name, %identity, delivery = delivered, %reason, "rolled back; will retry");
                    HandlerStats::incr(&self.stats.retried);
                    let delay = self.config.nak_delay(delivered);
                    if let Err(e) = broker::nak(msg, delay).await {
                        tracing::warn!(handler = %self.name, %identity, error = %e, "nak failed; ack_wait will redeliver");
                    }
                    Outcome::Retried(reason)
                }
            }
        }
    }

    /// `Some(reason)` when a message published at `published_ms` (Unix ms,
    /// the broker's clock) is older than the retention window now.
    fn beyond_horizon(&self, published_ms: i64) -> Option<String> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let age = Duration::from_millis(u64::try_from(now_ms.saturating_sub(published_ms)).ok()?);
        (age > self.retention).then(|| {
            format!(
                "beyond-horizon: published {} ago, older than the retention window of {}; its receipt may be pruned, so it cannot be proven new",
                humantime::format_duration(age),
                humantime::format_duration(self.retention)
            )
        })
    }

    async fn confirm_ack(&self, msg: &Message, identity: &str) {
        if let Err(e) = broker::ack(msg).await {
            HandlerStats::incr(&self.stats.ack_failures);
            tracing::warn!(handler = %self.name, %identity, error = %e, "ack after commit failed; the receipt will absorb the redelivery");
        }
    }

    /// Writes the dead letter durably, then terms. If the write fails the
    /// message is naked instead: nothing is dropped.
    async fn dead_letter(
        &self,
        msg: &Message,
        message_id: Option<&str>,
        stream_sequence: u64,
        subject: &str,
        headers: &[(String, String)],
        reason: &str,
    ) -> Outcome {
        let dl = DeadLetter {
            consumer: &self.name,
            message_id,
            stream: &self.stream,
            stream_sequence,
            subject,
            reason,
            headers,
            payload: &msg.payload,
        };
        match self.db.dead_letter(&dl).await {
            Ok(()) => {
                HandlerStats::incr(&self.stats.dead_lettered);
                tracing::warn!(handler = %self.name, identity = ?dl.message_id, stream_sequence = dl.stream_sequence, %reason, "dead-lettered");
                if let Err(e) = broker::term(msg).await {
                    tracing::warn!(handler = %self.name, error = %e, "term after dead letter failed; a redelivery will find the dead letter row already written");
                }
                Outcome::DeadLettered(reason.to_string())
            }
            Err(e) => {
                let id = dl.message_id.unwrap_or("<none>").to_string();
                self.store_failed(msg, &id, "dead letter", e.to_string())
                    .await
            }
        }
    }

    async fn store_failed(
        &self,
        msg: &Message,
        identity: &str,
        step: &str,
        error: String,
    ) -> Outcome {
        HandlerStats::incr(&self.stats.retried);
        tracing::error!(handler = %self.name, %identity, %step, %error, "database step failed; rolled back, message will be redelivered");
        let delivered = msg
            .info()
            .map(|i| u64::try_from(i.delivered).unwrap_or(1))
            .unwrap_or(1);
        let delay = self.config.nak_delay(delivered);
        if let Err(e) = broker::nak(msg, delay).await {
            tracing::warn!(handler = %self.name, %identity, error = %e, "nak failed; ack_wait will redeliver");
        }
        // Pause this handler briefly so a database outage does not spin through the stream.
        tokio::time::sleep(delay.min(Duration::from_secs(5))).await;
        Outcome::StoreFailed(format!("{step}: {error}"))
    }
}
