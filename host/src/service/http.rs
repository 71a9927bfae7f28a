//! The HTTP listener of `idem run` (`[service] listen`): `/healthz`,
//! `/readyz` and `/metrics` (Prometheus text, the metrics of
//! [`crate::metrics`] and [`crate::runtime::handler_info`]).
//!
//! The listener is bound before the host starts, so a bad address stops the
//! start at once, and it answers from then on: `/readyz` says "starting"
//! until the host is attached ([`Server::attach`]), then asks the
//! [`Readiness`] on every request.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the recorder's histograms are compacted when nobody scrapes.
const UPKEEP: Duration = Duration::from_secs(5);

/// What `/readyz` asks of a running host, built by
/// [`crate::service::Host::readiness`].
pub struct Readiness {
    /// The broker connection (its state is read, nothing is sent).
    pub broker: async_nats::Client,
    /// The host's database gate: down while the database is unavailable.
    pub gate: Arc<crate::pipeline::db_gate::DbGate>,
    /// Each handler's consuming loop and pull requests.
    pub handlers: Vec<HandlerReadiness>,
    /// Cancelled on shutdown (the token given to
    /// [`crate::service::Host::run`]) or when the host stops by itself.
    pub stopping: Vec<CancellationToken>,
}

/// What `/readyz` reads of one handler.
pub struct HandlerReadiness {
    /// The handler's name.
    pub name: Arc<str>,
    /// Set once its consuming loop runs.
    pub consuming: Arc<AtomicBool>,
    /// What JetStream said to its pull requests.
    pub liveness: Arc<crate::broker::liveness::Liveness>,
}

impl Readiness {
    /// `None` when ready, else the one reason it is not (the first of:
    /// shutting down, broker disconnected, database unavailable, a handler
    /// not consuming yet, a handler whose pull requests heard nothing from
    /// JetStream for [`crate::broker::SILENCE_NOT_READY`] or more).
    pub fn not_ready(&self) -> Option<String> {
        if self.stopping.iter().any(CancellationToken::is_cancelled) {
            return Some("shutting down".into());
        }
        if self.broker.connection_state() != async_nats::connection::State::Connected {
            return Some("broker disconnected".into());
        }
        if !self.gate.is_up() {
            return Some("database unavailable".into());
        }
        if let Some(h) = self.handlers.iter().find(|h| !h.consuming.load(Relaxed)) {
            return Some(format!("handler `{}` is not consuming yet", h.name));
        }
        self.handlers.iter().find_map(|h| {
            let silence = h.liveness.silence();
            (silence >= crate::broker::SILENCE_NOT_READY).then(|| {
                format!(
                    "handler `{}`: JetStream has not answered its pull requests for {}s (no message, no heartbeat)",
                    h.name,
                    silence.as_secs()
                )
            })
        })
    }

    /// Sets `idem_consumer_silence_seconds` of every handler to its silence now.
    fn set_silence_gauges(&self) {
        for h in &self.handlers {
            crate::metrics::set_consumer_silence(&h.name, h.liveness.silence());
        }
    }
}

struct Shared {
    metrics: PrometheusHandle,
    ready: OnceLock<Readiness>,
}

/// The running listener; stops serving when dropped.
pub struct Server {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
    upkeep: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Binds `addr` and serves from now on, `/metrics` from `metrics`.
    ///
    /// # Errors
    /// One line when `addr` cannot be bound (in use, not an address of this
    /// machine, a privileged port).
    pub async fn bind(addr: SocketAddr, metrics: PrometheusHandle) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {addr} ([service] listen): {e}; choose a free address and port, or remove `listen`"
            )
        })?;
        let shared = Arc::new(Shared {
            metrics,
            ready: OnceLock::new(),
        });
        let app = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(render))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the HTTP listener stopped");
            }
        });
        let handle = shared.metrics.clone();
        let upkeep = tokio::spawn(async move {
            let mut tick = tokio::time::interval(UPKEEP);
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        });
        tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
        Ok(Self {
            shared,
            task,
            upkeep,
        })
    }

    /// From now on `/readyz` asks `ready` (before: 503, "starting").
    pub fn attach(&self, ready: Readiness) {
        let _ = self.shared.ready.set(ready);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
        self.upkeep.abort();
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// 200 `{"ready":true}`, or 503 `{"ready":false,"reason":"…"}`.
async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    let reason = match shared.ready.get() {
        Some(r) => r.not_ready(),
        None => Some("starting".into()),
    };
    let (status, body) = match reason {
        None => (StatusCode::OK, serde_json::json!({"ready": true})),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"ready": false, "reason": reason}),
        ),
    };
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The recorder's metrics (the silence gauges set first, so they are of
/// this moment), then `idem_handler_info` ([`crate::runtime::handler_info`]).
async fn render(State(shared): State<Arc<Shared>>) -> Response {
    if let Some(ready) = shared.ready.get() {
        ready.set_silence_gauges();
    }
    let mut body = shared.metrics.render();
    crate::runtime::handler_info::render(&mut body);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}
