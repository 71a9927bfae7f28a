//! The **copies after a restart** row: what a copy whose receipt is
//! committed costs on a host that has just started (it remembers no
//! commit), next to a processed message, both timed in this one process.

use super::rows::{RowDb, publish_all, start_host, stream_of, total_balance};
use super::*;

/// One host processes the row's N messages (timed), stops; the same N
/// messages are published again (same event ids); a second host, started
/// afresh, drains those N copies (timed). `rate` is the copies' rate,
/// `processed_secs` the first host's time.
pub(super) async fn copies_after_a_restart(spec: &Spec, module: PathBuf) -> Result<Measured> {
    let (row, n) = (spec.row, spec.n);
    let js = jetstream::new(async_nats::connect(&spec.nats).await?);
    let messages: Vec<(String, String)> = (0..n)
        .map(|i| (Order::None.subject(row, i), credit(i)))
        .collect();
    let row_db = RowDb::new(spec).await?;
    stream_of(&js, row, Order::None, 1, messages.clone()).await?;
    let processed_secs = drain(spec, &module, &row_db.url, |s| s.processed).await?;
    publish_all(&js, messages).await?;
    let secs = drain(spec, &module, &row_db.url, |s| s.duplicates).await?;
    let db = Database::connect(&row_db.url, 1).await?;
    let total = total_balance(&db).await?;
    db.close().await;
    js.delete_stream(format!("T{row}")).await?;
    row_db.drop_it().await?;
    if total != n as i64 {
        bail!("the accounts hold {total}, not {n}");
    }
    Ok(Measured {
        rate: n as f64 / secs,
        secs,
        processed_secs: Some(processed_secs),
        rss_mib: peak_rss_mib(),
        ..Default::default()
    })
}

/// Starts a host on the row's stream and database, times `Host::run` until
/// `counted` (of its counters) reaches the row's N with nothing else
/// settled, then stops it; returns the seconds.
async fn drain(
    spec: &Spec,
    module: &std::path::Path,
    url: &str,
    counted: fn(&idem::metrics::StatsSnapshot) -> u64,
) -> Result<f64> {
    let n = spec.n as u64;
    let host = start_host(spec, module, url).await?;
    let (_, stats) = host.stats().into_iter().next().context("no handler")?;
    let token = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(host.run(RunMode::Forever, token.clone()));
    while counted(&stats.snapshot()) < n {
        if running.is_finished() {
            bail!("the host stopped before the messages were settled");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    token.cancel();
    let _ = running.await;
    let s = stats.snapshot();
    let settled = s.processed + s.duplicates + s.dead_lettered + s.retried;
    if settled != n {
        bail!("not a clean run: {s}");
    }
    Ok(secs)
}
