//! Operator commands: on the database only (never the broker),
//! `idem dlq list|show|redrive|drop` ([`dlq`], [`redrive`]),
//! `idem outbox list|retry|drop` ([`outbox`]) and
//! `idem receipts show|prune|forget` ([`receipts`]; `prune` reads the
//! broker's clock); `idem replay` ([`replay`]), which runs a handler
//! again over a range of its stream; and `idem deploy` and `idem status`
//! ([`deploy`]), on the broker's deploy buckets.
//!
//! Each command loads the same `idem.toml` as `idem run`, opens its
//! `[database] url` without creating anything ([`Database::connect_existing`]),
//! prints its result on stdout and returns an error (one line, printed by the
//! CLI as `idem: …`, exit code 1) when it did not do what was asked.

pub mod deploy;
pub mod deploy_wait;
pub mod dlq;
pub mod outbox;
pub mod receipts;
pub mod redrive;
pub mod replay;
pub mod shadow;

use crate::config::{Config, HandlerConfig};
use crate::store::Database;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Connections an admin command opens at most.
const ADMIN_CONNECTIONS: u32 = 2;

/// Loads the config at `path` and opens its database for an admin command.
/// The SQLite lock wait is the one `idem run` uses, so a command that writes
/// waits for a running host's transactions instead of failing.
pub async fn open(path: &Path) -> anyhow::Result<(Config, Database)> {
    let config = Config::load(path)?;
    let db =
        Database::connect_existing(&config.database.url, ADMIN_CONNECTIONS, config.lock_wait())
            .await?;
    Ok((config, db))
}

/// The `[[handler]]` named `name`, or a one-line error listing the configured ones.
pub fn handler<'c>(
    config: &'c Config,
    path: &Path,
    name: &str,
) -> anyhow::Result<&'c HandlerConfig> {
    config
        .handlers
        .iter()
        .find(|h| h.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = config.handlers.iter().map(|h| h.name.as_str()).collect();
            anyhow::anyhow!(
                "handler `{name}` is not in {} (it has {}); check the name or pass the config that runs it with --config",
                path.display(),
                names.join(", ")
            )
        })
}

/// Unix milliseconds as an RFC 3339 UTC time to the second, e.g.
/// `2025-01-31T08:15:00Z` (20 characters); `-` before 1970 or after 9999.
pub fn time(ms: i64) -> String {
    // RFC 3339 has four-digit years: past 9999-12-31 is printed as `-` too.
    const LAST_MS: u64 = 253_402_300_799_999;
    match u64::try_from(ms) {
        Ok(ms) if ms <= LAST_MS => {
            humantime::format_rfc3339_seconds(SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
                .to_string()
        }
        _ => "-".to_string(),
    }
}

/// `s` safe to print on one terminal line: whitespace runs become one
/// space, other control characters and the format characters that reorder
/// or hide text (bidi overrides, zero-width marks) are escaped
/// (`\u{1b}`, `\u{202e}`), so stored text from a message cannot move the
/// cursor, fake output lines or display reordered.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for word in s.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        for c in word.chars() {
            if c.is_control() || crate::deploy::record::is_invisible_format(c) {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
    }
    out
}

/// [`printable`], cut to `max` characters with `…` when longer.
pub fn shortened(s: &str, max: usize) -> String {
    let line = printable(s);
    if line.chars().count() <= max {
        return line;
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `n` and the noun, singular or plural: `1 dead letter`, `2 receipts`.
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_seconds() {
        assert_eq!(time(0), "1970-01-01T00:00:00Z");
        assert_eq!(time(1_700_000_000_999), "2023-11-14T22:13:20Z");
        assert_eq!(time(-1), "-");
        assert_eq!(time(253_402_300_799_999), "9999-12-31T23:59:59Z");
        assert_eq!(time(253_402_300_800_000), "-");
        assert_eq!(time(i64::MAX), "-");
    }

    #[test]
    fn printable_is_one_safe_line() {
        assert_eq!(printable("a\n  b\tc "), "a b c");
        assert_eq!(printable("x\u{1b}[2Jy"), "x\\u{1b}[2Jy");
        assert_eq!(
            printable("inv-\u{202e}9-\u{200b}x"),
            "inv-\\u{202e}9-\\u{200b}x"
        );
        assert_eq!(shortened("abcdef", 4), "abc…");
        assert_eq!(shortened("abcd", 4), "abcd");
        assert_eq!(count(1, "receipt", "receipts"), "1 receipt");
        assert_eq!(count(0, "receipt", "receipts"), "0 receipts");
    }
}
