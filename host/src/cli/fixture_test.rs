//! `idem test --config idem.toml HANDLER FIXTURES`: a handler's fixtures,
//! each also redelivered and retried after a failed attempt
//! ([`crate::authoring::run_fixtures`]).

use crate::authoring::fixtures::FixtureFile;
use crate::authoring::{Workbench, run_fixtures};
use clap::Args;
use std::path::PathBuf;

/// `idem test`'s arguments.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// The config: its `[database]` is used (nothing is kept), its
    /// handler's `module` run.
    #[arg(long, short, default_value = "idem.toml")]
    pub config: PathBuf,
    /// The handler of the config.
    pub handler: String,
    /// The fixtures file (TOML).
    pub fixtures: PathBuf,
}

/// Runs `idem test` and prints its report on stdout. Exit code: 0 when
/// every fixture passed, 2 when one failed, 1 on an error.
///
/// # Errors
/// The fixtures do not load, the handler cannot be prepared, or a
/// database step failed.
pub async fn run(args: TestArgs) -> anyhow::Result<i32> {
    let file = FixtureFile::load(&args.fixtures)?;
    let bench = Workbench::open(&args.config, &args.handler).await?;
    let reports = run_fixtures::run(&bench, &file).await;
    bench.db.close().await;
    let reports = reports?;
    print!("{}", run_fixtures::text(&reports));
    Ok(if reports.iter().all(run_fixtures::FixtureReport::passed) {
        0
    } else {
        2
    })
}
