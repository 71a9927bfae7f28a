//! Command line: `idem run --config idem.toml`, `idem publish`, `idem
//! config check`, and the operator commands `idem dlq …` and `idem receipts
//! …` ([`crate::admin`]).

use crate::admin;
use crate::config::{Config, ConfigError};
use crate::service::{Host, RunMode};
use clap::{ArgGroup, Args, Parser, Subcommand};
use std::path::PathBuf;

/// idem: exactly-once effects in SQL from NATS JetStream, with WebAssembly handlers.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about)]
pub struct Cli {
    /// Log lines as `pretty` text or `json` objects, one a line.
    #[arg(
        long,
        global = true,
        env = "IDEM_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    pub log_format: crate::LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The top-level commands.
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
    /// Publish one message per line of a JSON Lines file; stops at the
    /// first line that cannot be stored (or skips it with `--skip-bad`).
    Publish(crate::publish::PublishArgs),
    /// Dead letters: list, show, redrive, drop (the database; redrive also
    /// reads the deployed version from the broker).
    Dlq {
        /// Which dead-letter command.
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Receipts: show, prune, forget (uses the database only).
    Receipts {
        /// Which receipts command.
        #[command(subcommand)]
        command: ReceiptsCommand,
    },
    /// The configuration: check it (contacts nothing).
    Config {
        /// Which config command.
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Run a handler again over a range of its stream; what its receipts
    /// show as applied is counted as a duplicate and changes nothing.
    Replay(admin::replay::ReplayArgs),
    /// Deploy a new version of a handler to every running host (through the
    /// broker), roll back to the previous one, or list the deployments.
    Deploy(admin::deploy::DeployArgs),
    /// What every live host runs: one line per host and handler.
    Status(admin::deploy::StatusArgs),
    /// Make a deploy key (or, with --host, a host key): writes its seed to
    /// a new file (mode 0600) and prints its public key, for `[deploy]
    /// trusted_keys` (or `trusted_hosts`).
    Keygen(admin::deploy::KeygenArgs),
}

/// `idem config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective config (file, then `IDEM_<SECTION>__<KEY>`
    /// variables, then defaults) as TOML with secrets masked and exit 0;
    /// or print one line per problem and exit 1.
    Check {
        /// The config file.
        #[command(flatten)]
        config: ConfigArg,
    },
}

/// `--config`, as `idem run` takes it.
#[derive(Debug, Args)]
pub struct ConfigArg {
    /// Path to the TOML config (its `[database]` is the one used).
    #[arg(long, short, default_value = "idem.toml")]
    pub config: PathBuf,
}

/// One dead letter by id, or all of one handler's.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["id", "all"])))]
pub struct Which {
    /// The dead letter's id (`idem dlq list` shows them).
    pub id: Option<i64>,
    /// Every dead letter of --handler, in id order.
    #[arg(long, requires = "handler")]
    pub all: bool,
    /// The handler whose dead letters --all takes.
    #[arg(long, requires = "all")]
    pub handler: Option<String>,
}

/// `idem dlq …`: the dead-letter commands.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// One line per dead letter, oldest first.
    List {
        /// The config whose database is used.
        #[command(flatten)]
        config: ConfigArg,
        /// Only this handler's dead letters.
        #[arg(long)]
        handler: Option<String>,
    },
    /// Every field of one dead letter, with its headers and payload.
    Show {
        /// The config whose database is used.
        #[command(flatten)]
        config: ConfigArg,
        /// The dead letter's id.
        id: i64,
    },
    /// Run the stored message through its handler again; on success the
    /// effect commits and the dead letter is removed in one transaction.
    Redrive {
        /// The config whose database is used.
        #[command(flatten)]
        config: ConfigArg,
        /// Which dead letters.
        #[command(flatten)]
        which: Which,
    },
    /// Delete dead letters without running them.
    Drop {
        /// The config whose database is used.
        #[command(flatten)]
        config: ConfigArg,
        /// Which dead letters.
        #[command(flatten)]
        which: Which,
    },
}

/// `idem receipts …`: the receipt commands.
#[derive(Debug, Subcommand)]
pub enum ReceiptsCommand {
    /// A handler's receipt count and time span, or one message's receipt.
    Show {
        /// The config whose database is used.
        #[command(flatten)]
        config: ConfigArg,
        /// The handler (= durable consumer) whose receipts to read.
        #[arg(long)]
        handler: String,
        /// Show this message's receipt (exit 1 when it has none).
        #[arg(conflicts_with = "digest")]
        message_id: Option<String>,
        /// Count only the receipts whose effect this component (its sha256
        /// digest) produced: what one deployed version did.
        #[arg(long)]
        digest: Option<String>,
    },
    /// Delete receipts older than the retention window now (one pruning pass).
    Prune {
        /// The config whose database is used.
        #[command(flatten)]
        config: ConfigArg,
        /// Only this handler (default: every handler in the config).
        #[arg(long)]
        handler: Option<String>,
    },
    /// Delete receipts so that those messages run again if redelivered or replayed.
    Forget {
        /// The config whose database is used.
        #[command(flatten)]
        config: ConfigArg,
        /// The handler whose receipts to forget.
        #[arg(long)]
        handler: String,
        /// The message ids.
        #[arg(required = true)]
        message_ids: Vec<String>,
    },
}

/// Runs the CLI; returns the process exit code (0 ok, 1 failure). Every
/// error is printed as one line, usage errors included.
pub async fn main() -> i32 {
    stdout_closed_ends_quietly();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    if matches!(cli.command, Command::Run { .. }) {
        ignore_sigpipe();
    }
    crate::init_tracing(cli.log_format);
    let result = match cli.command {
        Command::Run { config, drain } => run(&config, drain).await,
        Command::Publish(args) => crate::publish::run(args).await,
        Command::Dlq { command } => dlq(command).await,
        Command::Receipts { command } => receipts(command).await,
        Command::Config {
            command: ConfigCommand::Check { config },
        } => return config_check(&config.config),
        Command::Replay(args) => admin::replay::run(args).await,
        Command::Deploy(args) => admin::deploy::run(args).await,
        Command::Status(args) => admin::deploy::status(args).await,
        Command::Keygen(args) => admin::deploy::keygen(&args),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("idem: {}", one_line(&e));
            1
        }
    }
}

/// A command whose output goes to a reader that stops early (`idem deploy
/// --history h | head`) ends as `cat` would, killed by SIGPIPE, instead of
/// panicking in `println!`: Rust's runtime ignores SIGPIPE, so a write to a
/// closed pipe returns EPIPE, which `print!` turns into a panic. `idem run`
/// puts the runtime's choice back ([`ignore_sigpipe`]): a host must never
/// die of a closed socket or pipe.
#[allow(unsafe_code)]
fn stdout_closed_ends_quietly() {
    // SAFETY: signal(2) with SIG_DFL installs no handler code; it is called
    // before any thread of ours starts writing.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// SIGPIPE ignored again, as Rust's runtime sets it before `main`.
#[allow(unsafe_code)]
fn ignore_sigpipe() {
    // SAFETY: as above; SIG_IGN installs no handler code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Help and version go to stdout (exit 0); a missing subcommand prints the
/// help on stderr (exit 1); any other usage error is one line on stderr,
/// `idem: <what clap said>` with its usage and hint, exit 1.
fn usage_error(e: &clap::Error) -> i32 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            print!("{}", e.render());
            return 0;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprint!("{}", e.render());
            return 1;
        }
        _ => {}
    }
    let text = e.render().to_string();
    let text = text.trim_start().strip_prefix("error:").unwrap_or(&text);
    eprintln!(
        "idem: {}",
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    1
}

/// `idem config check`: the effective config on stdout (exit 0), or one
/// `idem: …` line per problem on stderr (exit 1).
fn config_check(path: &std::path::Path) -> i32 {
    match Config::load(path) {
        Ok(config) => {
            print!("{}", config.to_masked_toml());
            0
        }
        Err(ConfigError::Invalid { problems }) => {
            for p in problems {
                eprintln!("idem: {p}");
            }
            1
        }
        Err(e) => {
            eprintln!("idem: {e}");
            1
        }
    }
}

async fn dlq(command: DlqCommand) -> anyhow::Result<()> {
    match command {
        DlqCommand::List { config, handler } => {
            admin::dlq::list(&config.config, handler.as_deref()).await
        }
        DlqCommand::Show { config, id } => admin::dlq::show(&config.config, id).await,
        DlqCommand::Redrive { config, which } => match which.target()? {
            Target::One(id) => admin::redrive::one(&config.config, id).await,
            Target::All(handler) => admin::redrive::all(&config.config, &handler).await,
        },
        DlqCommand::Drop { config, which } => match which.target()? {
            Target::One(id) => admin::dlq::drop_one(&config.config, id).await,
            Target::All(handler) => admin::dlq::drop_all(&config.config, &handler).await,
        },
    }
}

async fn receipts(command: ReceiptsCommand) -> anyhow::Result<()> {
    match command {
        ReceiptsCommand::Show {
            config,
            handler,
            message_id,
            digest,
        } => {
            admin::receipts::show(
                &config.config,
                &handler,
                message_id.as_deref(),
                digest.as_deref(),
            )
            .await
        }
        ReceiptsCommand::Prune { config, handler } => {
            admin::receipts::prune(&config.config, handler.as_deref()).await
        }
        ReceiptsCommand::Forget {
            config,
            handler,
            message_ids,
        } => admin::receipts::forget(&config.config, &handler, &message_ids).await,
    }
}

enum Target {
    One(i64),
    All(String),
}

impl Which {
    /// `ID`, or `--handler NAME --all` (clap's group lets only one through).
    fn target(self) -> anyhow::Result<Target> {
        match (self.id, self.handler) {
            (Some(id), _) => Ok(Target::One(id)),
            (None, Some(handler)) => Ok(Target::All(handler)),
            (None, None) => anyhow::bail!("give a dead letter id, or --handler NAME --all"),
        }
    }
}

async fn run(config: &std::path::Path, drain: bool) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    // The listener first: a bad address stops the start before anything connects.
    let server = match config.service.listen {
        Some(addr) => {
            let metrics = crate::metrics::install_recorder()?;
            Some(crate::http::Server::bind(addr, metrics).await?)
        }
        None => None,
    };
    // Pings from the start: a slow start (big components) must not look hung.
    let watchdog = crate::systemd::spawn_watchdog();
    let host = Host::start(&config).await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    if let Some(server) = &server {
        server.attach(host.readiness(shutdown.clone()));
    }
    let signal = shutdown.clone();
    let grace = config.service.shutdown_grace;
    tokio::spawn(async move {
        let first = shutdown_signal().await;
        tracing::info!(
            "{first} received: shutting down; deliveries in flight get {} to finish (a second signal exits at once)",
            humantime::format_duration(grace)
        );
        crate::systemd::stopping();
        signal.cancel();
        let second = shutdown_signal().await;
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

/// Waits for SIGINT or SIGTERM and says which came.
async fn shutdown_signal() -> &'static str {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = ctrl_c => return "SIGINT",
                _ = term.recv() => return "SIGTERM",
            }
        }
    }
    let _ = ctrl_c.await;
    "SIGINT"
}

fn one_line(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
