//! `idem dlq list|show|redrive|drop`: the dead-letter commands
//! ([`crate::admin::dlq`], [`crate::admin::redrive`]).

use super::ConfigArg;
use crate::admin;
use clap::{ArgGroup, Args, Subcommand};

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

/// Runs one `idem dlq …` command.
///
/// # Errors
/// As the command it runs.
pub async fn run(command: DlqCommand) -> anyhow::Result<()> {
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
