//! `idem dlq redrive`: run a dead letter's stored message through its
//! handler again, in one transaction that also removes the dead-letter row.
//!
//! ```text
//! BEGIN (bounded like a message's transaction)
//!   DELETE the dead-letter row RETURNING it   (locks it: a second redrive waits)
//!   the handler's transaction step, as `idem run` runs it (PreparedHandler::apply):
//!   INSERT receipt (handler, message id) ON CONFLICT DO NOTHING
//!     0 rows → COMMIT (the effect is already there; only the row goes)
//!   SET LOCAL ROLE idem_handler_<name>_<grants> (PostgreSQL, when set up)
//!   run the guest on the stored message
//!     ok                   → COMMIT: effect, receipt and removal together
//!     retry / reject / trap → ROLLBACK: nothing changed, the row stays
//! ```
//!
//! The handler is prepared as `idem run` prepares it
//! ([`PreparedHandler::prepare`]), on the version the hosts run: with
//! `[deploy] follow` (the default) the handler's deployed version, read from
//! the broker, so a fix deployed with `idem deploy` is what redrives the
//! dead letters it was deployed for. A redrive is the operator's decision: it
//! never judges the horizon. The guest sees the stored subject, headers,
//! payload and stream sequence, `delivery_count` 1, and the message's
//! publish time (for a row from before idem stored it, the time it was
//! dead-lettered, which is no earlier).

use super::{count, printable};
use crate::config::{Config, HandlerConfig};
use crate::pipeline::step::{Applied, PreparedHandler, StepFailed};
use crate::runtime::{GuestMessage, LoadOptions, Runtime};
use crate::store::{Database, DeadLetterRow, StoreError};
use std::path::Path;
use std::sync::Arc;

/// What one redrive did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redriven {
    /// The guest succeeded: its effect, the receipt and the removal committed.
    Processed,
    /// A receipt existed: the effect was already there; only the row was removed.
    AlreadyProcessed,
    /// The guest failed (`rejected: …`, `retry: …`, `trap: …`): rolled back, the row stays.
    Failed(String),
    /// No dead letter with that id any more (dropped or redriven meanwhile).
    Gone,
    /// COMMIT failed: whether it happened is unknown (the error says why).
    CommitUnknown(String),
}

/// One handler, prepared as `idem run` prepares it, ready to redrive its
/// dead letters.
pub struct Redriver {
    handler: PreparedHandler,
    db: Arc<Database>,
}

impl Redriver {
    /// Loads `handler`'s component and prepares it
    /// ([`PreparedHandler::prepare`]); with `config`'s `[deploy] follow`,
    /// puts the deployed version in place as a starting host does
    /// ([`crate::deploy::at_start::use_deployed_via_broker`]).
    ///
    /// `consumer` is the dead letters' consumer: the handler's name, or
    /// the `idem replay --as` name they were written under (receipt and
    /// PostgreSQL role take it, as in that replay).
    ///
    /// # Errors
    /// The database's commits are not durable (unless `[database]
    /// accept_non_durable_commit`), the wasm runtime cannot start, the
    /// component cannot be loaded, or the broker holding the deployments
    /// cannot be reached (one line naming the handler and what to do).
    pub async fn new(
        config: &Config,
        handler: &HandlerConfig,
        consumer: &str,
        db: Arc<Database>,
    ) -> anyhow::Result<Self> {
        db.check_durable_commit(config.database.accept_non_durable_commit)
            .await?;
        let runtime = Arc::new(
            Runtime::new().map_err(|e| anyhow::anyhow!("cannot start the wasm runtime: {e:#}"))?,
        );
        let component = runtime
            .load(&handler.module, LoadOptions { wasi: handler.wasi })
            .map_err(|e| anyhow::anyhow!("handler `{}`: {e}", handler.name))?;
        let mut cfg = handler.clone();
        consumer.clone_into(&mut cfg.name);
        let prepared = PreparedHandler::prepare(&cfg, component, runtime, &db).await;
        crate::deploy::at_start::use_deployed_via_broker(config, handler, &prepared, &db).await?;
        tracing::info!(handler = %cfg.name, digest = %prepared.slot().current().digest(), "redriving with this version");
        Ok(Self {
            handler: prepared,
            db,
        })
    }

    /// Redrives dead letter `id` in one transaction (see the module docs).
    /// `message_id` is its message id, read before: a row without one is
    /// never passed here.
    ///
    /// # Errors
    /// A database step before COMMIT failed (rolled back; a failed COMMIT
    /// is [`Redriven::CommitUnknown`]).
    pub async fn redrive(&self, id: i64, message_id: &str) -> Result<Redriven, StoreError> {
        let mut tx = self.handler.begin(&self.db).await?;
        let Some(row) = tx.take_dead_letter(id).await? else {
            tx.rollback().await?;
            return Ok(Redriven::Gone);
        };
        if row.consumer != **self.handler.name() || row.message_id.as_deref() != Some(message_id) {
            // Not the row that was read (ids are never reused; this is a guard).
            tx.rollback().await?;
            return Ok(Redriven::Gone);
        }
        // An operator's redrive is not refused as out of order: it is asked for.
        match self.handler.apply(tx, message(row), || None, None).await {
            Ok(Applied::Committed(_)) => Ok(Redriven::Processed),
            Ok(Applied::Duplicate(tx)) => Ok(match tx.commit().await {
                Ok(()) => Redriven::AlreadyProcessed,
                Err(e) => Redriven::CommitUnknown(e.to_string()),
            }),
            Ok(Applied::GuestFailed(failure, _rollback)) => Ok(Redriven::Failed(failure.reason())),
            // Never refused: the admission check above admits every message.
            Ok(Applied::Refused(reason)) => Ok(Redriven::Failed(reason)),
            Err(StepFailed {
                step: "COMMIT",
                error,
            }) => Ok(Redriven::CommitUnknown(error.to_string())),
            Err(StepFailed { error, .. }) => Err(error),
        }
    }
}

/// The publish time a redrive gives the guest and its receipt keeps (Unix
/// ms, the broker's clock), which pruning measures it by: the message's
/// own, or, for a row from before idem recorded it, when it was
/// dead-lettered (later, so the receipt is kept at least as long).
fn published_ms(row: &DeadLetterRow) -> i64 {
    if row.published_ns > 0 {
        row.published_ns.div_euclid(1_000_000)
    } else {
        row.failed_at_ms
    }
}

/// The stored message as the guest sees it on a redrive.
fn message(row: DeadLetterRow) -> GuestMessage {
    let published_ms = published_ms(&row);
    GuestMessage {
        message_id: row.message_id.unwrap_or_default(),
        subject: row.subject,
        headers: row.headers,
        payload: row.payload,
        stream_sequence: row.stream_sequence,
        delivery_count: 1,
        published_ms,
    }
}

/// `dead letter 5 (handler credit, message evt_1)`.
fn describe(row: &DeadLetterRow) -> String {
    format!(
        "dead letter {} (handler {}, message {})",
        row.id,
        printable(&row.consumer),
        row.message_id.as_deref().map_or("-".to_string(), printable)
    )
}

/// Why a dead letter without a message id is not redriven.
fn no_message_id(row: &DeadLetterRow) -> String {
    format!(
        "{} has no message id ({}), so a redrive cannot be proven new; drop it with `idem dlq drop {}`, or republish the message with an id",
        describe(row),
        printable(&row.reason),
        row.id
    )
}

/// Warns (stderr) before redriving a message that was quarantined because
/// its receipt may have been pruned.
fn warn_if_beyond_horizon(row: &DeadLetterRow) {
    if row.reason.starts_with("beyond-horizon:") {
        eprintln!(
            "warning: {} was quarantined beyond the retention window; if its receipt was pruned, this redrive applies its effect a second time",
            describe(row)
        );
    }
}

/// The line printed for one outcome, and whether the row is gone.
fn outcome_line(row: &DeadLetterRow, outcome: &Result<Redriven, StoreError>) -> (String, bool) {
    let what = describe(row);
    match outcome {
        Ok(Redriven::Processed) => (format!("{what}: processed; dead letter removed"), true),
        Ok(Redriven::AlreadyProcessed) => (
            format!("{what}: already processed; dead letter removed"),
            true,
        ),
        Ok(Redriven::Failed(reason)) => (
            format!(
                "{what} failed again: {}; rolled back, the dead letter stays",
                printable(reason)
            ),
            false,
        ),
        Ok(Redriven::Gone) => (
            format!("{what} is gone (dropped or redriven meanwhile)"),
            false,
        ),
        Ok(Redriven::CommitUnknown(e)) => (
            format!(
                "{what}: COMMIT failed, its outcome is unknown ({}); `idem dlq show {}` tells whether the dead letter is still there",
                printable(e),
                row.id
            ),
            false,
        ),
        Err(e) => (
            format!(
                "{what}: {}; rolled back, the dead letter stays",
                printable(&e.to_string())
            ),
            false,
        ),
    }
}

/// The handler that redrives `row`: the config's handler named after its
/// consumer, or, for a name only `idem replay --as` makes (no handler's,
/// ARCHITECTURE.md "Code map", `admin/`), the one handler of the config
/// that reads the row's stream and subject, as that replay did.
///
/// # Errors
/// One line: the consumer is no handler and no `--as` name, or no handler
/// or several read the row's stream and subject.
fn handler_for<'c>(
    config: &'c Config,
    config_path: &Path,
    row: &DeadLetterRow,
) -> anyhow::Result<&'c HandlerConfig> {
    let not_in_config = || {
        anyhow::anyhow!(
            "{} belongs to handler `{}`, which is not in {}; add that handler to the config (or pass its config with --config), or drop the dead letter with `idem dlq drop {}`",
            describe(row),
            printable(&row.consumer),
            config_path.display(),
            row.id
        )
    };
    if let Some(h) = config.handlers.iter().find(|h| h.name == row.consumer) {
        return Ok(h);
    }
    if !super::replay::is_as_name(&row.consumer) {
        return Err(not_in_config());
    }
    let readers: Vec<&HandlerConfig> = config
        .handlers
        .iter()
        .filter(|h| {
            h.stream == row.stream
                && h.subjects
                    .iter()
                    .any(|p| crate::broker::drift::captures(p, &row.subject))
        })
        .collect();
    match readers.as_slice() {
        [one] => Ok(one),
        [] => Err(not_in_config()),
        many => {
            let names: Vec<&str> = many.iter().map(|h| h.name.as_str()).collect();
            anyhow::bail!(
                "{} was written under `{}` (an `idem replay --as` name) and handlers {} all read stream `{}` subject `{}`, so which one replayed it is unknown; run it again with `idem replay HANDLER --from-seq {seq} --to-seq {seq} --as {}`, then `idem dlq drop {}`",
                describe(row),
                printable(&row.consumer),
                names.join(", "),
                printable(&row.stream),
                printable(&row.subject),
                printable(&row.consumer),
                row.id,
                seq = row.stream_sequence
            )
        }
    }
}

/// `idem dlq redrive ID`.
pub async fn one(config_path: &Path, id: i64) -> anyhow::Result<()> {
    let (config, db) = super::open(config_path).await?;
    let db = Arc::new(db);
    let result = one_on(&config, config_path, &db, id).await;
    db.close().await;
    result
}

async fn one_on(
    config: &Config,
    config_path: &Path,
    db: &Arc<Database>,
    id: i64,
) -> anyhow::Result<()> {
    let row = db
        .dead_letter_by_id(id)
        .await?
        .ok_or_else(|| super::dlq::no_such(id))?;
    let Some(message_id) = row.message_id.clone() else {
        anyhow::bail!(no_message_id(&row));
    };
    let handler = handler_for(config, config_path, &row)?;
    let redriver = Redriver::new(config, handler, &row.consumer, db.clone()).await?;
    warn_if_beyond_horizon(&row);
    let outcome = redriver.redrive(id, &message_id).await;
    let (line, ok) = outcome_line(&row, &outcome);
    if ok {
        println!("{line}");
        Ok(())
    } else {
        Err(anyhow::anyhow!(line))
    }
}

/// `idem dlq redrive --handler NAME --all`: every dead letter of the
/// handler in id order, each in its own transaction, past failures; one
/// line each, then a summary. An error (exit 1) when any stays.
pub async fn all(config_path: &Path, handler: &str) -> anyhow::Result<()> {
    let (config, db) = super::open(config_path).await?;
    let db = Arc::new(db);
    let result = all_on(&config, config_path, &db, handler).await;
    db.close().await;
    result
}

async fn all_on(
    config: &Config,
    config_path: &Path,
    db: &Arc<Database>,
    name: &str,
) -> anyhow::Result<()> {
    let own = super::replay::as_name_of(config, config_path, name)?;
    let rows = db.list_dead_letters(Some(name)).await?;
    let Some(first) = rows.first() else {
        if own.is_none() {
            anyhow::bail!(super::receipts::unknown_name(config, config_path, name));
        }
        println!("no dead letters of handler {}", printable(name));
        return Ok(());
    };
    // Under an `--as` name every row was written by one replay of one
    // handler: the one that reads its stream and subject.
    let handler = match own {
        Some(h) => h,
        None => handler_for(config, config_path, first)?,
    };
    if own.is_none()
        && let Some(other) = rows.iter().find(|r| {
            r.stream != first.stream
                || !handler
                    .subjects
                    .iter()
                    .any(|p| crate::broker::drift::captures(p, &r.subject))
        })
    {
        anyhow::bail!(
            "{} is of stream `{}` subject `{}`, which handler `{}` (that redrives {}) does not read; redrive the dead letters of `{}` one by one (idem dlq redrive ID)",
            describe(other),
            printable(&other.stream),
            printable(&other.subject),
            handler.name,
            describe(first),
            printable(name)
        );
    }
    let redriver = Redriver::new(config, handler, name, db.clone()).await?;
    let (mut processed, mut already, mut failed, mut skipped) = (0u64, 0u64, 0u64, 0u64);
    for row in &rows {
        let Some(message_id) = &row.message_id else {
            println!("{}", no_message_id(row));
            skipped += 1;
            continue;
        };
        warn_if_beyond_horizon(row);
        let outcome = redriver.redrive(row.id, message_id).await;
        match outcome {
            Ok(Redriven::Processed) => processed += 1,
            Ok(Redriven::AlreadyProcessed) => already += 1,
            Ok(Redriven::Gone) => {}
            Ok(Redriven::Failed(_) | Redriven::CommitUnknown(_)) | Err(_) => failed += 1,
        }
        println!("{}", outcome_line(row, &outcome).0);
    }
    println!(
        "handler {}: {} processed, {} already processed, {} failed, {} without a message id",
        printable(name),
        processed,
        already,
        failed,
        skipped
    );
    let stay = failed + skipped;
    if stay > 0 {
        anyhow::bail!(
            "{} of handler {} not redriven (see above); they stay",
            count(stay, "dead letter", "dead letters"),
            printable(name)
        );
    }
    Ok(())
}
