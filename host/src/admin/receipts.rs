//! `idem receipts show|prune|forget`: inspect one handler's receipts, run a
//! pruning pass now, or forget receipts for a deliberate reprocess.

use super::{count, printable, time};
use crate::broker::clock::{self, BrokerClock};
use crate::config::{Config, HandlerConfig};
use crate::progress::{Progress, Unit};
use crate::retention::{PRUNE_CHUNK, prune_cutoff};
use crate::store::{Database, PrunePass, ReceiptRow, ReceiptSummary};
use anyhow::Context as _;
use std::path::Path;
use std::time::Duration;

/// `idem receipts show --handler NAME`: how many receipts, the oldest and
/// newest publish time of their messages (the broker's clock, which the
/// retention window is measured on), and the retention window from the config.
/// With `MESSAGE_ID`: that receipt's fields; none is an error (exit 1, so a
/// script can test for it), since the message then counts as never processed.
pub async fn show(
    config_path: &Path,
    name: &str,
    message_id: Option<&str>,
    digest: Option<&str>,
) -> anyhow::Result<()> {
    let (config, db) = super::open(config_path).await?;
    let result = show_on(&config, config_path, &db, name, message_id, digest).await;
    db.close().await;
    result
}

async fn show_on(
    config: &Config,
    config_path: &Path,
    db: &Database,
    name: &str,
    message_id: Option<&str>,
    digest: Option<&str>,
) -> anyhow::Result<()> {
    // A name `idem replay --as` wrote under is no handler's: its receipts
    // are never pruned (ARCHITECTURE.md, invariant 7).
    let handler = super::replay::as_name_of(config, config_path, name)?;
    let retention = handler.map(|h| h.retention);
    if let Some(d) = digest
        && !crate::deploy::record::is_digest(d)
    {
        anyhow::bail!(
            "--digest takes a component's whole sha256, 64 lowercase hex digits (as `idem status` and `idem deploy --history` print it), not `{}`",
            printable(d)
        );
    }
    match message_id {
        None => {
            let summary = db.receipt_summary(name, digest).await?;
            if retention.is_none() && summary.count == 0 && digest.is_none() {
                anyhow::bail!(unknown_name(config, config_path, name));
            }
            if let Some(d) = digest {
                println!("digest: {d}");
            }
            print!("{}", summary_text(name, &summary, retention));
            Ok(())
        }
        Some(id) => match db.receipt(name, id).await? {
            Some(r) => {
                print!("{}", receipt_text(&r));
                Ok(())
            }
            None => match retention {
                Some(retention) => anyhow::bail!(
                    "no receipt for message `{}` of handler `{}`: it was never processed, or its receipt was pruned after the retention window ({}) or forgotten",
                    printable(id),
                    printable(name),
                    humantime::format_duration(retention)
                ),
                None => anyhow::bail!(
                    "no receipt for message `{}` under `{}` (no handler of {}; an `idem replay --as` name): it was never processed under that name, or its receipt was forgotten",
                    printable(id),
                    printable(name),
                    config_path.display()
                ),
            },
        },
    }
}

/// The error for a name that is no handler of the config and has no
/// receipts (or dead letters): most likely a mistyped handler name.
pub fn unknown_name(config: &Config, config_path: &Path, name: &str) -> String {
    let names: Vec<&str> = config.handlers.iter().map(|h| h.name.as_str()).collect();
    format!(
        "`{}` is no handler of {} (it has {}) and has nothing stored under it as an `idem replay --as` name; check the name or pass the config that runs it with --config",
        printable(name),
        config_path.display(),
        names.join(", ")
    )
}

/// What `idem receipts show --handler NAME` prints. `retention`: the
/// handler's window; `None` for an `idem replay --as` name, whose receipts
/// are never pruned.
pub fn summary_text(name: &str, s: &ReceiptSummary, retention: Option<Duration>) -> String {
    let when = |ms: Option<i64>| ms.map_or("-".to_string(), time);
    let retention = match retention {
        Some(r) => format!(
            "{} (receipts of messages published earlier are pruned)",
            humantime::format_duration(r)
        ),
        None => "none (no handler of the config has this name, written by idem replay --as: its receipts are never pruned)".to_string(),
    };
    format!(
        "handler: {}\nreceipts: {}\noldest: {} (published)\nnewest: {} (published)\nretention: {retention}\n",
        printable(name),
        s.count,
        when(s.oldest_ms),
        when(s.newest_ms),
    )
}

/// What `idem receipts show --handler NAME MESSAGE_ID` prints.
pub fn receipt_text(r: &ReceiptRow) -> String {
    format!(
        "handler: {}\nmessage id: {}\nstream sequence: {}\nmodule digest: {}\npublished at: {}\nprocessed at: {}\n",
        printable(&r.consumer),
        printable(&r.message_id),
        r.stream_sequence,
        r.module_digest,
        time(r.published_ms),
        time(r.processed_at_ms)
    )
}

/// `idem receipts prune [--handler NAME]`: one pruning pass now, as the
/// host's pruning task runs it (batches of [`PRUNE_CHUNK`], under the prune
/// lock, against the broker's clock read from each handler's stream), over
/// every configured handler or one. Another host holding the lock is an
/// error (nothing pruned; it is pruning now, run again later); so is a
/// broker whose clock cannot be read (nothing pruned). Shows the receipts
/// deleted so far on stderr ([`crate::progress`]).
pub async fn prune(config_path: &Path, name: Option<&str>) -> anyhow::Result<()> {
    let (config, db) = super::open(config_path).await?;
    let result = prune_on(&config, config_path, &db, name).await;
    db.close().await;
    result
}

async fn prune_on(
    config: &Config,
    config_path: &Path,
    db: &Database,
    name: Option<&str>,
) -> anyhow::Result<()> {
    let handlers: Vec<&HandlerConfig> = match name {
        Some(n) => vec![super::handler(config, config_path, n)?],
        None => config.handlers.iter().collect(),
    };
    let broker = crate::broker::connect(&config.broker).await?;
    let mut targets: Vec<(&str, i64)> = Vec::with_capacity(handlers.len());
    for h in &handlers {
        let (broker_ms, at) = clock::read(&broker.js, &h.stream)
            .await
            .with_context(|| {
                format!(
                    "handler `{}`: the retention window is measured on the broker's clock; nothing pruned",
                    printable(&h.name)
                )
            })?;
        let now_ms = BrokerClock::new(broker_ms, at).now_ms();
        targets.push((&h.name, prune_cutoff(now_ms, h.retention)));
    }
    let mut progress = Progress::new("prune", None, Unit::Items("receipts"));
    let mut finished = 0u64;
    let mut current = (0usize, 0u64);
    let pass = db
        .prune_pass_counted(&targets, PRUNE_CHUNK, &mut |i, n| {
            if i != current.0 {
                finished += current.1;
            }
            current = (i, n);
            let name = handlers.get(i).map_or("", |h| h.name.as_str());
            progress.update(finished + n, &format!("handler {}", printable(name)));
        })
        .await;
    progress.finish();
    match pass? {
        PrunePass::Pruned(counts) => {
            for (h, n) in handlers.iter().zip(counts) {
                let (handler, retention) = (&h.name, &h.retention);
                println!(
                    "handler {}: pruned {} older than {}",
                    printable(handler),
                    count(n, "receipt", "receipts"),
                    humantime::format_duration(*retention)
                );
            }
            Ok(())
        }
        PrunePass::Skipped => anyhow::bail!(
            "another host holds the prune lock and is pruning now; nothing pruned here, run again later"
        ),
    }
}

/// `idem receipts forget --handler NAME MESSAGE_ID...`: deletes those
/// receipts in one transaction, prints how many existed, and warns on
/// stderr that a redelivery or replay of those ids will run again.
pub async fn forget(config_path: &Path, name: &str, message_ids: &[String]) -> anyhow::Result<()> {
    let (config, db) = super::open(config_path).await?;
    let result = match super::handler(&config, config_path, name) {
        Ok(_) => db
            .forget_receipts(name, message_ids)
            .await
            .map_err(Into::into),
        Err(e) => Err(e),
    };
    db.close().await;
    let forgotten = result?;
    let given = u64::try_from(message_ids.len()).unwrap_or(u64::MAX);
    println!(
        "handler {}: forgot {} ({} given)",
        printable(name),
        count(forgotten, "receipt", "receipts"),
        count(given, "message id", "message ids")
    );
    if forgotten > 0 {
        eprintln!(
            "warning: a redelivery or replay of the forgotten message ids now runs handler {} again",
            printable(name)
        );
    }
    Ok(())
}
