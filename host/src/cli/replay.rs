//! `idem replay`'s arguments ([`crate::admin::replay`] runs it).

use super::ConfigArg;
use crate::admin::replay::{self, Request, Since};
use clap::{ArgGroup, Args};

/// `idem replay`'s arguments.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("start").required(true).args(["from_seq", "since"])))]
pub struct ReplayArgs {
    /// The config that runs the handler.
    #[command(flatten)]
    pub config: ConfigArg,
    /// The handler to run (its module, stream, subjects, message id rule and limits).
    pub handler: String,
    /// First stream sequence of the range (1 or more).
    #[arg(long, value_name = "N")]
    pub from_seq: Option<u64>,
    /// Start at the first message published at or after TIME: RFC 3339
    /// (2026-01-31T12:00:00Z) or an age on the broker's clock (2h, 30m).
    #[arg(long, value_name = "TIME")]
    pub since: Option<Since>,
    /// Last stream sequence of the range (default and at most: the stream's
    /// last sequence when the replay starts).
    #[arg(long, value_name = "M")]
    pub to_seq: Option<u64>,
    /// Write receipts and dead letters under NAME instead of the handler's
    /// name: a fresh projection (the retention horizon is lifted when no
    /// handler of the config is called NAME).
    #[arg(long = "as", value_name = "NAME")]
    pub as_name: Option<String>,
}

/// Runs `idem replay` ([`replay::run`]).
///
/// # Errors
/// As [`replay::run`].
pub async fn run(args: ReplayArgs) -> anyhow::Result<()> {
    replay::run(Request {
        config: args.config.config,
        handler: args.handler,
        from_seq: args.from_seq,
        since: args.since,
        to_seq: args.to_seq,
        as_name: args.as_name,
    })
    .await
}
