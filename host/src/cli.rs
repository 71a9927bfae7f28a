//! Command line: `idem run --config idem.toml` and `idem publish`.

use crate::config::{Config, IdentityRule};
use crate::service::{Host, RunMode};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// idem: exactly-once effects in SQL from NATS JetStream, with WebAssembly handlers.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the handlers in the config until SIGINT/SIGTERM.
    Run {
        /// Path to the TOML config.
        #[arg(long, short, default_value = "idem.toml")]
        config: PathBuf,
        /// Exit once every consumer has nothing pending or unacknowledged.
        #[arg(long)]
        drain: bool,
    },
    /// Publish one message per line of a JSON Lines file.
    Publish {
        /// NATS URL.
        #[arg(long, default_value = "nats://127.0.0.1:4222")]
        broker: String,
        /// Subject to publish to (a stream must capture it).
        #[arg(long)]
        subject: String,
        /// Set `Nats-Msg-Id` from each line, e.g. `json:/event_id`.
        #[arg(long)]
        msg_id: Option<IdentityRule>,
        /// The JSON Lines file.
        file: PathBuf,
    },
}

/// Runs the CLI; returns the process exit code. Every error is printed as one line.
pub async fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { config, drain } => run(&config, drain).await,
        Command::Publish {
            broker,
            subject,
            msg_id,
            file,
        } => crate::publish::publish_file(&broker, &subject, &file, msg_id.as_ref())
            .await
            .map(|n| println!("published {n} messages to {subject}")),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("idem: {}", one_line(&e));
            1
        }
    }
}

async fn run(config: &std::path::Path, drain: bool) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    let host = Host::start(&config).await?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutdown requested; finishing messages in flight");
        let _ = tx.send(true);
    });
    let mode = if drain {
        RunMode::Drain
    } else {
        RunMode::Forever
    };
    for (name, s) in host.run(mode, rx).await {
        println!("handler {name}: {s}");
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = ctrl_c.await;
}

fn one_line(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
