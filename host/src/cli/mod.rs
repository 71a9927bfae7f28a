//! Command line: `idem run --config idem.toml` (`run.rs`), `idem publish`,
//! `idem config check` ([`config`]), `idem check` ([`check`]), `idem new` ([`new`]), the operator commands `idem dlq …`
//! ([`dlq`]), `idem outbox …` ([`outbox`]), `idem receipts …` ([`receipts`]) and `idem replay`
//! ([`replay`]) on [`crate::admin`], and `idem deploy`, `status`, `keygen`
//! ([`deploy`]), and the authors' commands `idem invoke` ([`invoke`]) and
//! `idem test` ([`fixture_test`]) on [`crate::authoring`]. Each command's arguments are in its file; the flags they
//! share ([`ConfigArg`]) are defined here, once. Nothing outside this folder
//! imports it but the binary.

pub mod check;
pub mod config;
pub mod deploy;
pub mod dlq;
pub mod fixture_test;
pub mod invoke;
pub mod new;
pub mod outbox;
pub mod receipts;
pub mod replay;
mod run;

use clap::{Args, Parser, Subcommand};
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
        command: dlq::DlqCommand,
    },
    /// The outbox: list what waits to be sent, retry a parked call, drop
    /// rows unsent (uses the database only).
    Outbox {
        /// Which outbox command.
        #[command(subcommand)]
        command: outbox::OutboxCommand,
    },
    /// Receipts: show, prune, forget (uses the database only).
    Receipts {
        /// Which receipts command.
        #[command(subcommand)]
        command: receipts::ReceiptsCommand,
    },
    /// The configuration: check it (contacts nothing).
    Config {
        /// Which config command.
        #[command(subcommand)]
        command: config::ConfigCommand,
    },
    /// Run a handler again over a range of its stream; what its receipts
    /// show as applied is counted as a duplicate and changes nothing.
    Replay(replay::ReplayArgs),
    /// Deploy a new version of a handler to every running host (through the
    /// broker), roll back to the previous one, or list the deployments.
    Deploy(deploy::DeployArgs),
    /// What every live host runs: one line per host and handler.
    Status(deploy::StatusArgs),
    /// Describe a handler component (world, WIT version, imports, size,
    /// digest, compile time) and, with --config and --handler, check that
    /// the handler's settings allow it (contacts nothing).
    Check(check::CheckArgs),
    /// Run one message through a handler on the configured database,
    /// without a broker, and show every statement it sent and what came
    /// back; rolled back unless --commit.
    Invoke(invoke::InvokeArgs),
    /// Check a handler against a fixtures file: each fixture's messages,
    /// then each again as a redelivery and as a retry after a failed
    /// attempt, must leave the expected rows (nothing is kept).
    Test(fixture_test::TestArgs),
    /// Make a deploy key (or, with --host, a host key): writes its seed to
    /// a new file (mode 0600) and prints its public key, for `[deploy]
    /// trusted_keys` (or `trusted_hosts`).
    Keygen(deploy::KeygenArgs),
    /// Create a handler folder (source, build script, idem.toml,
    /// migrations, sample messages, fixtures, README) from the templates
    /// inside the binary (contacts nothing).
    New(new::NewArgs),
}

/// `--config`, as `idem run` takes it: the flag every command on the
/// database or the deploy buckets shares.
#[derive(Debug, Args)]
pub struct ConfigArg {
    /// Path to the TOML config (its `[database]` is the one used).
    #[arg(long, short, default_value = "idem.toml")]
    pub config: PathBuf,
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
    let filter = match cli.command {
        Command::Invoke(_) | Command::Test(_) => crate::QUIET_LOG_FILTER,
        _ => crate::DEFAULT_LOG_FILTER,
    };
    crate::init_tracing(cli.log_format, filter);
    let result = match cli.command {
        Command::Run { config, drain } => run::run(&config, drain).await,
        Command::Publish(args) => crate::publish::run(args).await,
        Command::Dlq { command } => dlq::run(command).await,
        Command::Outbox { command } => outbox::run(command).await,
        Command::Receipts { command } => receipts::run(command).await,
        Command::Config {
            command: config::ConfigCommand::Check { config },
        } => return config::check(&config.config),
        Command::Replay(args) => replay::run(args).await,
        Command::Deploy(args) => deploy::run(args).await,
        Command::Status(args) => deploy::status(args).await,
        Command::Keygen(args) => deploy::keygen(&args),
        Command::Check(args) => return check::run(&args),
        Command::Invoke(args) => return exit_code(invoke::run(args).await),
        Command::Test(args) => return exit_code(fixture_test::run(args).await),
        Command::New(args) => new::run(&args),
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

/// A command's own exit code, or 1 with its error on one line.
fn exit_code(result: anyhow::Result<i32>) -> i32 {
    result.unwrap_or_else(|e| {
        eprintln!("idem: {}", one_line(&e));
        1
    })
}

fn one_line(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
