//! `idem invoke --config idem.toml HANDLER MESSAGE.json [--header K=V]…
//! [--subject S] [--commit] [--json]`: one message through a handler
//! without a broker ([`crate::authoring::invoke`]).

use crate::authoring::{MessageInput, Workbench, invoke, read_payload};
use clap::Args;
use std::path::PathBuf;

/// `idem invoke`'s arguments.
#[derive(Debug, Args)]
pub struct InvokeArgs {
    /// The config: its `[database]` is used, its handler's `module` run.
    #[arg(long, short, default_value = "idem.toml")]
    pub config: PathBuf,
    /// The handler of the config.
    pub handler: String,
    /// The message's payload file (`-`: stdin).
    pub message: PathBuf,
    /// A header, `NAME=VALUE` (repeatable).
    #[arg(long = "header", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// The subject (default: the handler's only subject).
    #[arg(long)]
    pub subject: Option<String>,
    /// Commit what the handler did when it returns ok (default: roll back).
    #[arg(long)]
    pub commit: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `NAME=VALUE`.
fn parse_header(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(format!("`{s}` is not NAME=VALUE")),
    }
}

/// Runs `idem invoke` and prints its report on stdout. Exit code: 0 when
/// the handler returned ok (or the message was a duplicate), 2 when it
/// failed (retry, reject, trap), 1 on an error (printed as one line).
///
/// # Errors
/// The handler cannot be prepared, the message not built, or a database
/// step failed.
pub async fn run(args: InvokeArgs) -> anyhow::Result<i32> {
    let payload = read_payload(&args.message)?;
    let bench = Workbench::open(&args.config, &args.handler).await?;
    let input = MessageInput {
        subject: args.subject,
        headers: args.headers,
        payload,
    };
    let report = invoke::invoke(&bench, &input, args.commit).await;
    bench.db.close().await;
    let report = report?;
    if args.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    Ok(report.exit_code())
}
