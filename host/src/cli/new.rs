//! `idem new NAME --lang LANG [--strategy S] [--dir PATH]`: a handler folder
//! from the templates inside the binary ([`crate::scaffold`]; ARCHITECTURE.md,
//! "Handler scaffolding"). Contacts nothing.

use crate::scaffold::{self, Lang, Strategy};
use clap::Args;
use std::path::PathBuf;

/// `idem new`'s arguments.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// The handler's name (letters, digits, `-`, `_`): its `[[handler]]`
    /// name and, without --dir, the folder made for it.
    pub name: String,
    /// The language of the handler's source.
    #[arg(long, value_enum)]
    pub lang: Lang,
    /// How the handler changes the database exactly once (docs/strategies.md).
    #[arg(long, value_enum, default_value_t)]
    pub strategy: Strategy,
    /// The folder to create (default: ./NAME); it must not exist or be empty.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// `idem new`: renders every file in memory, then writes them; prints the
/// folder and what to run next.
///
/// # Errors
/// A name that is no valid handler name, a target folder that exists and is
/// not empty (nothing is written then), or a file that cannot be written.
pub fn run(args: &NewArgs) -> anyhow::Result<()> {
    let files = scaffold::render(&args.name, args.lang, args.strategy)?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    scaffold::write(&dir, &files)?;
    println!(
        "created {} ({} handler `{}`, strategy {}, {} files)",
        dir.display(),
        args.lang.as_str(),
        args.name,
        args.strategy.as_str(),
        files.len()
    );
    println!("next, in {}:", dir.display());
    println!("  bash build.sh");
    println!("  idem test --config idem.toml {} fixtures.toml", args.name);
    println!("  idem run --config idem.toml");
    Ok(())
}
