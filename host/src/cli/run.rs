//! `idem run`: the running host ([`crate::service`]) with its listener,
//! the service manager's watchdog, and the stop on SIGINT/SIGTERM (a second
//! signal exits at once; ARCHITECTURE.md, "Shutdown").

use crate::config::Config;
use crate::service::{Host, RunMode, http, systemd};

/// Runs `idem run --config CONFIG [--drain]`.
///
/// # Errors
/// The config, the listener or the host's start failed, or the host
/// stopped by itself ([`Host::failure`]).
pub async fn run(config: &std::path::Path, drain: bool) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    // The listener first: a bad address stops the start before anything connects.
    let server = match config.service.listen {
        Some(addr) => {
            let metrics = crate::metrics::install_recorder()?;
            Some(http::Server::bind(addr, metrics).await?)
        }
        None => None,
    };
    // Pings from the start: a slow start (big components) must not look hung.
    let watchdog = systemd::spawn_watchdog();
    let host = Host::start(&config).await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    if let Some(server) = &server {
        server.attach(host.readiness(shutdown.clone()));
    }
    let signal = shutdown.clone();
    let grace = config.service.shutdown_grace;
    tokio::spawn(async move {
        let first = crate::service::shutdown::signal().await;
        tracing::info!(
            "{first} received: shutting down; deliveries in flight get {} to finish (a second signal exits at once)",
            humantime::format_duration(grace)
        );
        systemd::stopping();
        signal.cancel();
        let second = crate::service::shutdown::signal().await;
        tracing::warn!(
            "{second} received again: exiting at once with status 1; deliveries in flight are rolled back and redelivered after ack_wait"
        );
        std::process::exit(1);
    });
    let mode = if drain {
        RunMode::Drain
    } else {
        RunMode::Forever
    };
    let failure = host.failure();
    for (name, s) in host.run(mode, shutdown).await {
        println!("handler {name}: {s}");
    }
    drop(server);
    if let Some(w) = watchdog {
        w.abort();
    }
    match failure.get() {
        Some(why) => anyhow::bail!("{why}"),
        None => Ok(()),
    }
}
