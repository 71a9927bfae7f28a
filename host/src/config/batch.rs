//! A handler's `batch` setting (ARCHITECTURE.md, "Batching"): a fixed
//! number of messages per transaction, or `"auto"`, which batches what the
//! pulls have already brought and nothing more.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::time::Duration;

/// The most messages an `"auto"` batch carries.
pub const AUTO_BATCH_MAX: usize = 64;

/// Messages per transaction: `batch = N` (1 to 1000, checked by
/// `Config::validate`) or `batch = "auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batch {
    /// Up to N messages, waiting up to `batch_linger` for the batch to fill.
    Fixed(usize),
    /// What is already fetched when a transaction starts, up to
    /// [`AUTO_BATCH_MAX`], without waiting: one message when the stream is
    /// idle (no latency added), more as a backlog builds up.
    Auto,
}

impl Default for Batch {
    fn default() -> Self {
        Batch::Fixed(1)
    }
}

impl Batch {
    /// The most messages one transaction carries (at least 1).
    pub fn most(self) -> usize {
        match self {
            Batch::Fixed(n) => n.max(1),
            Batch::Auto => AUTO_BATCH_MAX,
        }
    }

    /// How long a transaction waits for its batch to fill, given the
    /// handler's `batch_linger`: none for `"auto"`.
    pub fn linger(self, batch_linger: Duration) -> Duration {
        match self {
            Batch::Fixed(_) => batch_linger,
            Batch::Auto => Duration::ZERO,
        }
    }

    /// Whether a transaction may carry more than one message.
    pub fn batches(self) -> bool {
        self.most() > 1
    }
}

impl Serialize for Batch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Batch::Fixed(n) => s.serialize_u64(*n as u64),
            Batch::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for Batch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Batch;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number of messages per transaction or \"auto\"")
            }

            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Batch, E> {
                usize::try_from(n)
                    .map(Batch::Fixed)
                    .map_err(|_| E::custom(format!("batch {n} is too large")))
            }

            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Batch, E> {
                u64::try_from(n)
                    .map_err(|_| E::custom(format!("batch must be at least 1, not {n}")))
                    .and_then(|n| self.visit_u64(n))
            }

            // A number written as text is read as the number.
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Batch, E> {
                match s.trim() {
                    "auto" => Ok(Batch::Auto),
                    t => t.parse::<u64>().map_err(|_| {
                        E::custom(format!(
                            "batch must be a number of messages per transaction or \"auto\", not {s:?}"
                        ))
                    })
                    .and_then(|n| self.visit_u64(n)),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(Deserialize, Serialize)]
    struct T {
        batch: Batch,
    }

    fn parse(s: &str) -> Result<Batch, String> {
        toml::from_str::<T>(s)
            .map(|t| t.batch)
            .map_err(|e| e.message().to_string())
    }

    #[test]
    fn reads_a_number_or_auto() {
        assert_eq!(parse("batch = 16"), Ok(Batch::Fixed(16)));
        assert_eq!(parse("batch = \"auto\""), Ok(Batch::Auto));
        assert_eq!(parse("batch = \"8\""), Ok(Batch::Fixed(8)));
        assert_eq!(
            parse("batch = \"fast\""),
            Err(
                "batch must be a number of messages per transaction or \"auto\", not \"fast\""
                    .into()
            )
        );
        assert_eq!(
            parse("batch = -1"),
            Err("batch must be at least 1, not -1".into())
        );
        assert_eq!(
            toml::to_string(&T { batch: Batch::Auto }).unwrap(),
            "batch = \"auto\"\n"
        );
    }

    #[test]
    fn auto_takes_up_to_64_without_waiting() {
        let linger = Duration::from_millis(5);
        assert_eq!(
            (Batch::Auto.most(), Batch::Auto.linger(linger)),
            (64, Duration::ZERO)
        );
        assert_eq!(
            (Batch::Fixed(16).most(), Batch::Fixed(16).linger(linger)),
            (16, linger)
        );
        assert!(!Batch::Fixed(1).batches());
        assert!(Batch::Auto.batches());
    }
}
