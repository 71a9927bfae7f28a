//! `idem receipts show|prune|forget` ([`crate::admin::receipts`]).

use super::ConfigArg;
use crate::admin;
use clap::Subcommand;

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

/// Runs one `idem receipts …` command.
///
/// # Errors
/// As the command it runs.
pub async fn run(command: ReceiptsCommand) -> anyhow::Result<()> {
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
