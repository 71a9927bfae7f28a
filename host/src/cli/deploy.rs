//! `idem deploy`, `idem status` and `idem keygen`'s arguments
//! ([`crate::admin::deploy`] runs them).

use super::ConfigArg;
use crate::admin::deploy::{self, Request};
use clap::{ArgGroup, Args};
use std::path::PathBuf;
use std::time::Duration;

/// `idem deploy`'s arguments.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("what").required(true).args(["module", "rollback", "history", "shadow_report", "promote", "abort"])))]
pub struct DeployArgs {
    /// The config that runs the handler (its `[broker]` and `[deploy]`).
    #[command(flatten)]
    pub config: ConfigArg,
    /// The handler to deploy to (a `[[handler]]` of the config).
    pub handler: String,
    /// The new component (.wasm).
    pub module: Option<PathBuf>,
    /// Point the handler back at the version deployed before the current one.
    #[arg(long, conflicts_with = "module")]
    pub rollback: bool,
    /// List the handler's deployments, oldest first.
    #[arg(long, conflicts_with_all = ["module", "rollback", "wait"])]
    pub history: bool,
    /// Deploy MODULE as a shadow: hosts keep running the live version and
    /// also run MODULE on a sample of messages, in a savepoint always
    /// rolled back, and compare what the two did.
    #[arg(long, requires = "module", conflicts_with_all = ["rollback", "wait", "note"])]
    pub shadow: bool,
    /// With --shadow: the share of messages the candidate runs for, `0.25`
    /// or `25%`.
    #[arg(long, requires = "shadow", default_value = "100%", value_parser = crate::admin::shadow::parse_sample)]
    pub sample: u32,
    /// Show what the handler's shadow candidate did differently on each
    /// live host: counts, then the first divergent messages statement by
    /// statement.
    #[arg(long, conflicts_with_all = ["module", "rollback", "history", "wait", "promote", "abort"])]
    pub shadow_report: bool,
    /// Make the handler's shadow candidate its live version (a deploy of
    /// it; `--wait` waits for the hosts) and drop the shadow.
    #[arg(long, conflicts_with_all = ["module", "rollback", "history", "abort"])]
    pub promote: bool,
    /// Drop the handler's shadow candidate; the live version is untouched.
    #[arg(long, conflicts_with_all = ["module", "rollback", "history", "wait"])]
    pub abort: bool,
    /// Free text kept with the deployment.
    #[arg(long, default_value = "")]
    pub note: String,
    /// Return once every live host runs the new version (or fail after
    /// `--timeout`, naming the hosts that do not).
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` waits, e.g. `60s`, `2m`.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// The deploy key: a file holding its NKey seed (`SM…`, made by `idem
    /// keygen FILE`), readable by its owner only. Its public key must be in
    /// the config's `[deploy] trusted_keys`.
    #[arg(long, env = "IDEM_SIGNING_KEY", value_name = "FILE")]
    pub key: Option<PathBuf>,
}

/// `idem keygen`'s arguments.
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Where to write the seed (a new file, mode 0600; never overwritten).
    pub file: PathBuf,
    /// A host key (`SN…`, for `[deploy] host_key`) instead of a deploy key
    /// (`SM…`, for `idem deploy --key`).
    #[arg(long)]
    pub host: bool,
}

/// `idem status`'s arguments.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The config whose `[broker]` and `[deploy]` are read.
    #[command(flatten)]
    pub config: ConfigArg,
}

/// Runs `idem deploy` ([`deploy::run`]).
///
/// # Errors
/// As [`deploy::run`].
pub async fn run(args: DeployArgs) -> anyhow::Result<()> {
    deploy::run(Request {
        config: args.config.config,
        handler: args.handler,
        module: args.module,
        rollback: args.rollback,
        history: args.history,
        shadow: args.shadow.then_some(args.sample),
        shadow_report: args.shadow_report,
        promote: args.promote,
        abort: args.abort,
        note: args.note,
        wait: args.wait,
        timeout: args.timeout,
        key: args.key,
    })
    .await
}

/// Runs `idem status` ([`deploy::status`]).
///
/// # Errors
/// As [`deploy::status`].
pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    deploy::status(&args.config.config).await
}

/// Runs `idem keygen` ([`deploy::keygen`]).
///
/// # Errors
/// As [`deploy::keygen`].
pub fn keygen(args: &KeygenArgs) -> anyhow::Result<()> {
    deploy::keygen(&args.file, args.host)
}
