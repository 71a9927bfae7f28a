//! `idem outbox list|retry|drop`: what waits in the outbox, a parked call
//! sent again, rows removed unsent (ARCHITECTURE.md, "The outbox"). On
//! the database only; the running hosts' relays do the sending.

use super::{count, printable, shortened, time};
use crate::outbox::Target;
use crate::store::{OutboxListed, OutboxSummary, RowChange};
use std::fmt::Write as _;
use std::path::Path;

/// Rows `idem outbox list` shows at most unless `--limit` says otherwise.
pub const DEFAULT_LIST_LIMIT: u32 = 100;

/// Longest handler name or target `idem outbox` prints (characters): a
/// row an operator or another program inserted may hold anything.
const NAME_CHARS: usize = 80;

/// Longest error `idem outbox list` prints (characters).
const LIST_ERROR_CHARS: usize = 80;

/// `idem outbox list [--handler NAME] [--limit N]`: per handler and
/// target what waits, then the oldest rows.
///
/// # Errors
/// The config or the database cannot be opened, or a query fails.
pub async fn list(config: &Path, handler: Option<&str>, limit: u32) -> anyhow::Result<()> {
    let (_, db) = super::open(config).await?;
    let summary = db.outbox_summary().await;
    let rows = db.list_outbox(handler, limit).await;
    db.close().await;
    let mut summary = summary?;
    if let Some(h) = handler {
        summary.retain(|s| s.consumer == h);
    }
    print!(
        "{}",
        list_text(&summary, &rows?, handler, crate::store::now_ms())
    );
    Ok(())
}

/// One line per handler and target of `summary` at `now_ms`: `HANDLER
/// publish SUBJECT: N pending, M parked, oldest Ss old` (the age only with
/// pending rows), names escaped.
pub fn summary_text(summary: &[OutboxSummary], now_ms: i64) -> String {
    let mut out = String::new();
    for s in summary.iter().take(SUMMARY_LINES) {
        let age = s.oldest_ms.map_or(String::new(), |t| {
            let secs = now_ms.saturating_sub(t).max(0) / 1000;
            format!(", oldest {secs}s old")
        });
        let _ = writeln!(
            out,
            "{} {}: {} pending, {} parked{age}",
            shortened(&s.consumer, NAME_CHARS),
            target_text(&s.target),
            s.pending,
            s.parked
        );
    }
    if summary.len() > SUMMARY_LINES {
        let _ = writeln!(
            out,
            "… and {} more targets (--handler shows one handler's)",
            summary.len() - SUMMARY_LINES
        );
    }
    out
}

/// Per-target lines [`summary_text`] prints at most.
const SUMMARY_LINES: usize = 50;

/// What `idem status` says of the outbox of the database `config` names:
/// `outbox: empty`, or `outbox:` and the [`summary_text`] lines indented,
/// per handler and grant (`outbox::grants::summary_by_grant`);
/// one line saying why when the database does not answer within `bound`
/// (the status of the hosts is still worth printing).
pub async fn status_text(config: &crate::config::Config, bound: std::time::Duration) -> String {
    let read = async {
        let db =
            crate::store::Database::connect_existing(&config.database.url, 1, config.lock_wait())
                .await?;
        let summary = db.outbox_summary().await;
        db.close().await;
        anyhow::Ok(summary?)
    };
    match tokio::time::timeout(bound, read).await {
        Ok(Ok(summary)) if summary.is_empty() => "outbox: empty\n".to_string(),
        Ok(Ok(summary)) => {
            // Per grant, as the gauges: a wildcard grant is one line
            // whatever subjects its rows carry.
            let grants: std::collections::HashMap<_, _> = config
                .handlers
                .iter()
                .map(|h| {
                    let g = crate::outbox::OutboxGrants::of_handler(h);
                    (h.name.clone(), std::sync::Arc::new(g))
                })
                .collect();
            let summary = crate::outbox::grants::summary_by_grant(&summary, &grants);
            let lines = summary_text(&summary, crate::store::now_ms());
            let mut out = "outbox:\n".to_string();
            for line in lines.lines() {
                let _ = writeln!(out, "  {line}");
            }
            out
        }
        Ok(Err(e)) => format!(
            "outbox: cannot read it: {}\n",
            crate::deploy::record::escaped(&format!("{e:#}"), 300)
        ),
        Err(_) => format!("outbox: the database did not answer within {bound:?}\n"),
    }
}

fn target_text(t: &Target) -> String {
    match t {
        Target::Publish(s) => format!("publish {}", shortened(s, NAME_CHARS)),
        Target::Call(s) => format!("call {}", shortened(s, NAME_CHARS)),
    }
}

/// What `idem outbox list` prints at `now_ms`: one line per handler and
/// target (pending, parked, oldest pending age), a blank line, then one
/// aligned line per row (id, handler, message id, call index, target,
/// key or `-`, tries, state, stored time, size, last error); `the outbox is
/// empty` when nothing waits.
pub fn list_text(
    summary: &[OutboxSummary],
    rows: &[OutboxListed],
    handler: Option<&str>,
    now_ms: i64,
) -> String {
    if summary.is_empty() && rows.is_empty() {
        return match handler {
            Some(h) => format!("nothing of handler {} waits in the outbox\n", printable(h)),
            None => "the outbox is empty\n".to_string(),
        };
    }
    let mut out = summary_text(summary, now_ms);
    out.push('\n');
    let header = [
        "ID",
        "HANDLER",
        "MESSAGE",
        "CALL",
        "TARGET",
        "KEY",
        "TRIES",
        "STATE",
        "STORED",
        "BYTES",
        "LAST ERROR",
    ]
    .map(str::to_string);
    let mut lines = vec![header];
    for r in rows {
        let state = if r.parked() {
            "parked".to_string()
        } else if r.due_ms <= now_ms {
            "due".to_string()
        } else {
            format!(
                "in {}s",
                r.due_ms.saturating_sub(now_ms).saturating_add(999) / 1000
            )
        };
        lines.push([
            r.id.to_string(),
            shortened(&r.consumer, NAME_CHARS),
            shortened(&r.message_id, 40),
            r.call_index.to_string(),
            target_text(&r.target),
            r.key
                .as_deref()
                .map_or("-".to_string(), |k| shortened(k, 40)),
            r.attempts.to_string(),
            state,
            time(r.created_ms),
            r.payload_bytes.to_string(),
            r.last_error
                .as_deref()
                .map_or("-".to_string(), |e| shortened(e, LIST_ERROR_CHARS)),
        ]);
    }
    let mut widths = [0usize; 10];
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for line in &lines {
        for (cell, w) in line.iter().zip(widths) {
            let _ = write!(out, "{cell:<w$}  ");
        }
        out.push_str(&line[10]);
        out.push('\n');
    }
    out
}

/// `idem outbox retry ID`: a parked row due again at once, its tries
/// counted from 0.
///
/// # Errors
/// No such row, the row is not parked (the relay tries it by itself), or
/// a statement fails.
pub async fn retry_one(config: &Path, id: i64) -> anyhow::Result<()> {
    let (_, db) = super::open(config).await?;
    let changed = db.retry_outbox_row(id).await;
    db.close().await;
    match changed? {
        RowChange::Changed => {
            println!("outbox row {id} is due again; a running host's relay sends it");
            Ok(())
        }
        RowChange::NotParked => anyhow::bail!(
            "outbox row {id} is not parked: the relay tries it again by itself (`idem outbox list` shows when)"
        ),
        RowChange::Missing => Err(no_such(id)),
    }
}

/// `idem outbox retry --handler NAME --all`: every parked row of one
/// handler due again (none is not an error).
///
/// # Errors
/// The statement fails.
pub async fn retry_all(config: &Path, handler: &str) -> anyhow::Result<()> {
    let (cfg, db) = super::open(config).await?;
    let n = db.retry_outbox_parked(handler).await;
    db.close().await;
    let n = n?;
    unknown_without_rows(&cfg, config, handler, n)?;
    println!(
        "{} of handler {} due again",
        count(n, "parked outbox row", "parked outbox rows"),
        printable(handler)
    );
    Ok(())
}

/// `idem outbox drop ID`: deletes one row unsent.
///
/// # Errors
/// No such row, or the statement fails.
pub async fn drop_one(config: &Path, id: i64) -> anyhow::Result<()> {
    let (_, db) = super::open(config).await?;
    let changed = db.drop_outbox_row(id).await;
    db.close().await;
    match changed? {
        RowChange::Changed | RowChange::NotParked => {
            println!("dropped outbox row {id}; it is not sent");
            Ok(())
        }
        RowChange::Missing => Err(no_such(id)),
    }
}

/// `idem outbox drop --handler NAME --all`: deletes every row of one
/// handler unsent, pending and parked (none is not an error).
///
/// # Errors
/// The statement fails.
pub async fn drop_all(config: &Path, handler: &str) -> anyhow::Result<()> {
    let (cfg, db) = super::open(config).await?;
    let n = db.drop_outbox_rows(handler).await;
    db.close().await;
    let n = n?;
    unknown_without_rows(&cfg, config, handler, n)?;
    println!(
        "dropped {} of handler {}; they are not sent",
        count(n, "outbox row", "outbox rows"),
        printable(handler)
    );
    Ok(())
}

/// Rows of a handler the config does not run may still wait (it was
/// renamed or removed): a command on them works; only when there were
/// none is a name the config does not know an error (a typo, most
/// likely).
fn unknown_without_rows(
    cfg: &crate::config::Config,
    path: &Path,
    handler: &str,
    rows: u64,
) -> anyhow::Result<()> {
    if rows == 0 {
        super::handler(cfg, path, &printable(handler))?;
    }
    Ok(())
}

/// The error for an outbox row id that does not exist (sent, dropped, or
/// never stored).
pub fn no_such(id: i64) -> anyhow::Error {
    anyhow::anyhow!(
        "no outbox row with id {id} (sent already, or dropped); `idem outbox list` shows the ids"
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::store::PARKED;

    #[test]
    fn list_shows_totals_then_aligned_rows() {
        let summary = [OutboxSummary {
            consumer: "orders".into(),
            target: Target::Call("notify".into()),
            pending: 1,
            parked: 1,
            oldest_ms: Some(1_000),
        }];
        let row = |id, due_ms, error: Option<&str>| OutboxListed {
            id,
            consumer: "orders".into(),
            message_id: "o-1".into(),
            call_index: 0,
            target: Target::Call("notify".into()),
            key: None,
            attempts: 10,
            due_ms,
            created_ms: 1_000,
            last_error: error.map(str::to_string),
            payload_bytes: 12,
        };
        let text = list_text(
            &summary,
            &[
                row(1, PARKED, Some("POST notify:\nanswered 500")),
                row(12, 4_500, None),
            ],
            None,
            3_000,
        );
        assert_eq!(
            text,
            "orders call notify: 1 pending, 1 parked, oldest 2s old\n\
             \n\
             ID  HANDLER  MESSAGE  CALL  TARGET       KEY  TRIES  STATE   STORED                BYTES  LAST ERROR\n\
             1   orders   o-1      0     call notify  -    10     parked  1970-01-01T00:00:01Z  12     POST notify: answered 500\n\
             12  orders   o-1      0     call notify  -    10     in 2s   1970-01-01T00:00:01Z  12     -\n"
        );
        assert_eq!(list_text(&[], &[], None, 0), "the outbox is empty\n");
    }
}
