//! `idem config check`: the effective config, or every problem in it.

use super::ConfigArg;
use crate::config::{Config, ConfigError};
use clap::Subcommand;

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

/// `idem config check`: the effective config on stdout (exit 0), or one
/// `idem: …` line per problem on stderr (exit 1).
pub fn check(path: &std::path::Path) -> i32 {
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
