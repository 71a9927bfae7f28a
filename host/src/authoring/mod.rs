//! What a handler's author runs without a broker (ARCHITECTURE.md,
//! "Rehearsals"): `idem invoke` ([`invoke`]) puts one message through a
//! handler and shows every statement; `idem test` ([`fixtures`]) checks a
//! file of messages and expected rows, each also redelivered and retried
//! after a failed attempt. Both run the protocol's steps in a transaction
//! of their own ([`crate::pipeline::rehearse`]) on the configured database.

pub mod fixtures;
pub mod invoke;
pub(crate) mod print;
pub mod run_fixtures;

use crate::config::{Config, ConfigError, HandlerConfig};
use crate::pipeline::step::PreparedHandler;
use crate::runtime::options::RuntimeOptions;
use crate::runtime::{GuestMessage, LoadOptions, Runtime};
use crate::store::Database;
use anyhow::Context as _;
use std::path::Path;
use std::str::FromStr as _;
use std::sync::Arc;

/// The most bytes of a message file or fixture payload read: the NATS
/// default `max_payload` (1 MiB) is what a real delivery could carry.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// A handler of a config, prepared as `idem run` prepares it, on its
/// database with the host's tables and the handler's migrations in place.
pub struct Workbench {
    /// The handler's settings.
    pub handler: HandlerConfig,
    /// The handler, ready to rehearse messages.
    pub prepared: PreparedHandler,
    /// Its database.
    pub db: Arc<Database>,
}

impl Workbench {
    /// Loads `config_path`, finds handler `name`, loads its component (the
    /// file its `module` names, not a deployed version), connects to the
    /// config's database, prepares the host's tables and applies the
    /// handler's migrations (as `idem run` does at start).
    ///
    /// # Errors
    /// One line: the config does not load, has no such handler, the module
    /// does not load, the database cannot be reached, or a migration fails.
    pub async fn open(config_path: &Path, name: &str) -> anyhow::Result<Self> {
        let config = match Config::load(config_path) {
            Ok(c) => c,
            Err(ConfigError::Invalid { problems }) => {
                let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
                anyhow::bail!("{}", lines.join("; "));
            }
            Err(e) => return Err(e.into()),
        };
        let Some(handler) = config.handlers.iter().find(|h| h.name == name).cloned() else {
            let names: Vec<&str> = config.handlers.iter().map(|h| h.name.as_str()).collect();
            anyhow::bail!(
                "{}: no handler `{}` (it has: {})",
                config_path.display(),
                crate::log_format::escape(name),
                names.join(", ")
            );
        };
        // The config's runtime (its cache too), with room for what a
        // JavaScript or Python component instantiates, and traps always
        // naming their source line.
        let options = RuntimeOptions {
            trap_source_lines: true,
            ..RuntimeOptions::of(&config, crate::runtime::DEFAULT_CAPACITY)
        };
        let runtime = Arc::new(
            Runtime::with_options(&options).context("cannot start the WebAssembly runtime")?,
        );
        let component = runtime
            .load(&handler.module, LoadOptions { wasi: handler.wasi })
            .map_err(|e| anyhow::anyhow!("handler `{}`: {e}", handler.name))?;
        let db =
            Arc::new(Database::connect_with(&config.database.url, 2, config.lock_wait()).await?);
        db.prepare_host_tables().await?;
        if let Some(dir) = &handler.migrations {
            db.migrate_handler(&handler.name, dir)
                .await
                .with_context(|| {
                    format!(
                        "handler `{}`: migrations in {} failed",
                        handler.name,
                        dir.display()
                    )
                })?;
        }
        let prepared = PreparedHandler::prepare(&handler, component, runtime, &db).await;
        Ok(Self {
            handler,
            prepared,
            db,
        })
    }
}

/// A message as an author gives it: subject, headers, payload.
#[derive(Debug, Clone, Default)]
pub struct MessageInput {
    /// The subject; `None`: the handler's only subject, when it has one
    /// without wildcards.
    pub subject: Option<String>,
    /// Headers in order (`Nats-Msg-Id` and the like).
    pub headers: Vec<(String, String)>,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

impl MessageInput {
    /// The message `handler` would get as delivery `delivery_count` of
    /// stream sequence `stream_sequence`, published now; its identity read
    /// by the handler's `identity` rule as a delivery's is.
    ///
    /// # Errors
    /// One line: no subject given and the handler has no single literal
    /// one, a subject the handler does not consume, a payload over
    /// [`MAX_PAYLOAD_BYTES`], a header that NATS cannot carry, or no identity ([`NoIdentity`]: a delivery
    /// of it would be dead-lettered).
    pub fn to_guest(
        &self,
        handler: &HandlerConfig,
        stream_sequence: u64,
        delivery_count: u64,
    ) -> anyhow::Result<GuestMessage> {
        let subject = match &self.subject {
            Some(s) => {
                if s.contains(['*', '>']) {
                    anyhow::bail!(
                        "subject `{}` has a wildcard; a message's subject is literal",
                        crate::log_format::escape(s)
                    );
                }
                if !handler
                    .subjects
                    .iter()
                    .any(|f| crate::outbox::subject::matches(f, s))
                {
                    anyhow::bail!(
                        "subject `{}` is not one handler `{}` consumes ({}); give one of those",
                        crate::log_format::escape(s),
                        handler.name,
                        handler.subjects.join(", ")
                    );
                }
                s.clone()
            }
            None => match handler.subjects.as_slice() {
                [one] if !one.contains(['*', '>']) => one.clone(),
                _ => anyhow::bail!(
                    "handler `{}` consumes {}: name the message's subject (--subject, or `subject` in a fixture)",
                    handler.name,
                    handler.subjects.join(", ")
                ),
            },
        };
        if self.payload.len() > MAX_PAYLOAD_BYTES {
            anyhow::bail!(
                "the payload is {} bytes; a message may carry at most {MAX_PAYLOAD_BYTES}",
                self.payload.len()
            );
        }
        let mut headers = async_nats::HeaderMap::new();
        for (k, v) in &self.headers {
            let name = async_nats::HeaderName::from_str(k).map_err(|e| {
                anyhow::anyhow!("header name `{}`: {e}", crate::log_format::escape(k))
            })?;
            let value = async_nats::HeaderValue::from_str(v).map_err(|e| {
                anyhow::anyhow!("header `{}`'s value: {e}", crate::log_format::escape(k))
            })?;
            headers.append(name, value);
        }
        let message_id =
            crate::pipeline::message_id::extract(&handler.identity, Some(&headers), &self.payload)
                .map_err(|why| NoIdentity {
                    why,
                    rule: handler.identity.to_string(),
                })?;
        Ok(GuestMessage {
            message_id,
            subject,
            headers: self.headers.clone(),
            payload: self.payload.clone(),
            stream_sequence,
            delivery_count,
            published_ms: now_ms(),
        })
    }
}

/// A message without an identity by its handler's rule: a delivery of it
/// is dead-lettered by the host, the handler never runs.
#[derive(Debug, thiserror::Error)]
#[error("{why}: a delivery of this message would be dead-lettered (identity = \"{rule}\")")]
pub struct NoIdentity {
    /// What is missing (one line, escaped).
    pub why: String,
    /// The handler's `identity` rule.
    pub rule: String,
}

/// Now, ms since the Unix epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Reads at most [`MAX_PAYLOAD_BYTES`] of `path` (`-`: stdin).
///
/// # Errors
/// The file cannot be read, or is larger.
pub fn read_payload(path: &Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Read as _;
    let limit = u64::try_from(MAX_PAYLOAD_BYTES + 1).unwrap_or(u64::MAX);
    let mut bytes = Vec::new();
    let read = if path == Path::new("-") {
        std::io::stdin().take(limit).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(limit).read_to_end(&mut bytes))
    };
    read.with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() > MAX_PAYLOAD_BYTES {
        anyhow::bail!(
            "{} is over {MAX_PAYLOAD_BYTES} bytes, more than a message may carry",
            path.display()
        );
    }
    Ok(bytes)
}
