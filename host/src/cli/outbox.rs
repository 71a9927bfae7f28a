//! `idem outbox list|retry|drop`: the outbox commands
//! ([`crate::admin::outbox`]).

use super::ConfigArg;
use crate::admin::outbox as admin;
use clap::{ArgGroup, Args, Subcommand};

/// One outbox row by id, or all of one handler's.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["id", "all"])))]
pub struct Which {
    /// The row's id (`idem outbox list` shows them).
    pub id: Option<i64>,
    /// Every row of --handler (retry: every parked one).
    #[arg(long, requires = "handler")]
    pub all: bool,
    /// The handler whose rows --all takes.
    #[arg(long, requires = "all")]
    pub handler: Option<String>,
}

/// `idem outbox …`: the outbox commands.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Per handler and target what waits, then the oldest rows.
    List {
        /// The config whose database is used.
        #[command(flatten)]
        config: ConfigArg,
        /// Only this handler's rows.
        #[arg(long)]
        handler: Option<String>,
        /// Rows shown at most.
        #[arg(long, default_value_t = admin::DEFAULT_LIST_LIMIT)]
        limit: u32,
    },
    /// Make a parked row (a call past its last try) due again, its tries
    /// counted from 0; a running host's relay sends it.
    Retry {
        /// The config whose database is used.
        #[command(flatten)]
        config: ConfigArg,
        /// Which rows.
        #[command(flatten)]
        which: Which,
    },
    /// Delete rows unsent (pending and parked).
    Drop {
        /// The config whose database is used.
        #[command(flatten)]
        config: ConfigArg,
        /// Which rows.
        #[command(flatten)]
        which: Which,
    },
}

/// Runs one `idem outbox …` command.
///
/// # Errors
/// As the command it runs.
pub async fn run(command: OutboxCommand) -> anyhow::Result<()> {
    match command {
        OutboxCommand::List {
            config,
            handler,
            limit,
        } => admin::list(&config.config, handler.as_deref(), limit).await,
        OutboxCommand::Retry { config, which } => match which.target()? {
            (Some(id), _) => admin::retry_one(&config.config, id).await,
            (None, handler) => admin::retry_all(&config.config, &handler).await,
        },
        OutboxCommand::Drop { config, which } => match which.target()? {
            (Some(id), _) => admin::drop_one(&config.config, id).await,
            (None, handler) => admin::drop_all(&config.config, &handler).await,
        },
    }
}

impl Which {
    /// `ID`, or `--handler NAME --all` (clap's group lets only one through).
    fn target(self) -> anyhow::Result<(Option<i64>, String)> {
        match (self.id, self.handler) {
            (Some(id), _) => Ok((Some(id), String::new())),
            (None, Some(handler)) => Ok((None, handler)),
            (None, None) => anyhow::bail!("give an outbox row id, or --handler NAME --all"),
        }
    }
}
