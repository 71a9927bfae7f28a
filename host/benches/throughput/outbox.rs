//! The outbox rows: a host whose handler publishes one message per message
//! (the `behave` test component's `outbox` op, then its credit), next to
//! the same component without the publish and to the broker's ceiling for
//! what the relay does per row (a publish waiting for its PubAck, one at a
//! time). A row's rate runs until the target stream holds every message;
//! its latency is `idem_outbox_delay_seconds` (a row's storing in the
//! message's transaction to its PubAck) at half that rate.

use super::*;
use rows::{histogram_ms, percentiles, start_host_with};

/// The payload of the `i`-th message: a credit, with (`publish`) one
/// publish to `subject` before it.
fn payload(i: usize, subject: &str, publish: bool) -> String {
    let credit = serde_json::json!({"op": "credit", "account_id": i % ACCOUNTS + 1, "amount": 1});
    if publish {
        serde_json::json!({"event_id": format!("e{i}"), "op": "outbox",
            "calls": [{"publish": subject, "payload": format!("p{i}")}], "then": credit})
        .to_string()
    } else {
        let mut c = credit;
        c["event_id"] = format!("e{i}").into();
        c.to_string()
    }
}

/// Messages stored in `stream`.
async fn stored(js: &jetstream::Context, stream: &str) -> Result<u64> {
    Ok(js
        .get_stream(stream)
        .await?
        .get_info()
        .await?
        .state
        .messages)
}

/// A host of `behave` over the row's N messages, each publishing one
/// message to stream `O<row>` when `publish`.
pub(super) async fn outbox_host(spec: &Spec, module: PathBuf, publish: bool) -> Result<Measured> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .map_err(|_| anyhow::anyhow!("a metrics recorder is installed already"))?;
    let (row, n) = (spec.row, spec.n);
    let js = jetstream::new(async_nats::connect(&spec.nats).await?);
    let out_subject = format!("o{row}.out");
    let out_stream = format!("O{row}");
    js.create_stream(jetstream::stream::Config {
        name: out_stream.clone(),
        subjects: vec![out_subject.clone()],
        ..Default::default()
    })
    .await?;
    let payloads: Vec<String> = (0..n).map(|i| payload(i, &out_subject, publish)).collect();
    let row_db = RowDb::new(spec).await?;
    let subject = stream_with(&js, row, &payloads).await?;
    let name = format!("h{row}");
    let extra = format!("publish = [\"{out_subject}\"]");
    let host = start_host_with(spec, &module, &row_db.url, &extra).await?;
    let (_, stats) = host.stats().into_iter().next().context("no handler")?;
    let token = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(host.run(RunMode::Forever, token.clone()));
    let want = |k: usize| if publish { k as u64 } else { 0 };
    let mut committed = None;
    loop {
        if running.is_finished() {
            bail!("the host stopped before the messages were processed");
        }
        if committed.is_none() && stats.snapshot().processed >= n as u64 {
            committed = Some(started.elapsed().as_secs_f64());
        }
        if committed.is_some() && stored(&js, &out_stream).await? >= want(n) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let rate = n as f64 / secs;

    // Latency at half the rate, after the backlog's samples are taken out.
    let _ = histogram_ms(&snapshotter, "idem_outbox_delay_seconds", &name);
    let paced = (rate.min(2000.0) as usize).max(100);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(2.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    for i in 0..paced {
        tick.tick().await;
        js.publish(
            subject.clone(),
            payload(1_000_000 + i, &out_subject, publish).into(),
        )
        .await?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while stats.snapshot().processed < (n + paced) as u64
        || stored(&js, &out_stream).await? < want(n + paced)
    {
        if Instant::now() > deadline {
            bail!("the paced messages were not processed and sent within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let delays = if publish {
        histogram_ms(&snapshotter, "idem_outbox_delay_seconds", &name)
    } else {
        publish_to_commit_samples(&snapshotter, &name)
    };
    let (p50, p99) = percentiles(delays);
    let rss_mib = peak_rss_mib();
    token.cancel();
    let _ = running.await;
    let s = stats.snapshot();
    let db = Database::connect(&row_db.url, 1).await?;
    let total = total_balance(&db).await?;
    let (left, _) = db.outbox_depth().await?;
    db.close().await;
    row_db.drop_it().await?;
    let sent = stored(&js, &out_stream).await?;
    if (total, left, sent, s.retried, s.dead_lettered)
        != ((n + paced) as i64, 0, want(n + paced), 0, 0)
    {
        bail!(
            "not a clean run: balances {total}, {left} rows left, {sent} stored, {} retried, {} dead-lettered",
            s.retried,
            s.dead_lettered
        );
    }
    Ok(Measured {
        rate,
        secs,
        p50,
        p99,
        rss_mib,
        committed_rate: committed.map(|c| n as f64 / c),
        ..Default::default()
    })
}

fn publish_to_commit_samples(snapshotter: &Snapshotter, handler: &str) -> Vec<f64> {
    rows::publish_to_commit(snapshotter, handler)
}

/// The broker's ceiling for the relay's work per row: N publishes with a
/// `Nats-Msg-Id`, each waiting for its PubAck before the next.
pub(super) async fn publish_ceiling(spec: &Spec) -> Result<Measured> {
    let js = jetstream::new(async_nats::connect(&spec.nats).await?);
    let subject = format!("o{}.out", spec.row);
    js.create_stream(jetstream::stream::Config {
        name: format!("O{}", spec.row),
        subjects: vec![subject.clone()],
        ..Default::default()
    })
    .await?;
    let mut took = Vec::with_capacity(spec.n);
    let started = Instant::now();
    for i in 0..spec.n {
        let t = Instant::now();
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("idem-{i:032x}").as_str());
        js.publish_with_headers(subject.clone(), headers, format!("p{i}").into())
            .await?
            .await?;
        took.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let secs = started.elapsed().as_secs_f64();
    let (p50, p99) = percentiles(took);
    Ok(Measured {
        rate: spec.n as f64 / secs,
        secs,
        p50,
        p99,
        rss_mib: peak_rss_mib(),
        ..Default::default()
    })
}
