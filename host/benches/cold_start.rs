//! Host start with the compiled-component cache cold (an empty `[runtime]
//! cache_dir`) and warm (the same directory on the next start), for the
//! credit handler in each language.
//!
//! Run: `cargo bench -p idem --bench cold_start` (needs `nats-server`:
//! `$IDEM_NATS_SERVER` or `.tools/venv/bin/nats-server` from
//! `scripts/setup.sh`; the components from `scripts/build-guests.sh` and
//! `scripts/build-lang-guests.sh` in `$CARGO_TARGET_DIR/guests`, a missing one
//! gets a row that says so). `IDEM_BENCH_LOG=idem=debug` prints the host's
//! log lines with their times.
//!
//! Each start is one `Host::start` + `Host::run(Drain)` in this process on a
//! fresh SQLite file, against a private nats-server, with one credit message
//! published beforehand on a stream of its own. Two times from the start
//! call: `ready`, when `Host::start` returns (connected, host tables,
//! migrations, the component loaded, stream and consumer made), and
//! `committed`, when the handler's `processed` counter reads 1 (watched
//! every 0.2 ms; the drain's own end, which waits to see the consumer
//! empty, is not timed). Only the load differs between cold and warm.
//! Columns: the component's size, both times cold, the median of 3 warm
//! starts of each, and cold ÷ warm of `committed`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use anyhow::Result;
use idem::config::Config;
use idem::service::{Host, RunMode};
use idem_test_support::{Nats, guests_dir, root};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The components, in the order of the table: label and file in `guests`.
const COMPONENTS: [(&str, &str); 5] = [
    ("Rust", "credit.wasm"),
    ("C", "credit-c.wasm"),
    ("JavaScript (QuickJS)", "credit-js-quickjs.wasm"),
    (
        "JavaScript (StarlingMonkey)",
        "credit-js-starlingmonkey.wasm",
    ),
    ("Python", "credit-python.wasm"),
];

/// Warm starts per component (the median is shown).
const WARM_RUNS: usize = 3;

/// The times of one start, from the `Host::start` call.
struct Start {
    /// `Host::start` returned: connected, tables and migrations made,
    /// component loaded, stream and consumer made.
    ready: Duration,
    /// The message committed (the handler's `processed` counter is 1).
    committed: Duration,
}

/// One start: a fresh database, a stream `S<n>` holding one credit, and a
/// host running `module` with `cache`; returns its times.
async fn start_once(nats: &Nats, n: usize, module: &Path, cache: &Path) -> Result<Start> {
    let dir = tempfile::tempdir()?;
    let url = nats.url();
    let js = async_nats::jetstream::new(async_nats::connect(&url).await?);
    let (stream, subject) = (format!("S{n}"), format!("s{n}.credit"));
    js.create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![subject.clone()],
        max_age: Duration::from_secs(7 * 24 * 3600),
        ..Default::default()
    })
    .await?;
    js.publish(
        subject.clone(),
        r#"{"event_id":"e1","account_id":1,"amount":5}"#.into(),
    )
    .await?
    .await?;
    let cfg = dir.path().join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{url}\"\n[database]\nurl = \"sqlite://{}\"\n[runtime]\ncache_dir = \"{}\"\n[[handler]]\nname = \"h{n}\"\nmodule = \"{}\"\nstream = \"{stream}\"\nsubjects = [\"{subject}\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\"]\nmigrations = \"{}\"\n",
            dir.path().join("idem.db").display(),
            cache.display(),
            module.display(),
            root().join("examples/credit/migrations").display()
        ),
    )?;
    let config = Config::load(&cfg)?;
    let started = Instant::now();
    let host = Host::start(&config).await?;
    let ready = started.elapsed();
    let stats = host.stats();
    let run = tokio::spawn(host.run(RunMode::Drain, CancellationToken::new()));
    // The drain's end comes after it has seen an empty consumer for a
    // while: the first commit is watched for instead.
    let committed = loop {
        if stats.iter().any(|(_, s)| s.processed.get() == 1) {
            break started.elapsed();
        }
        if run.is_finished() {
            anyhow::bail!("the host stopped before the message was processed");
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    };
    let summary = run.await?;
    anyhow::ensure!(
        summary.first().is_some_and(|(_, s)| s.processed == 1),
        "the message was not processed"
    );
    Ok(Start { ready, committed })
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

async fn bench() -> Result<()> {
    let nats = Nats::start();
    println!(
        "| component | KiB | cold cache: ready | cold: committed | warm cache: ready (median of {WARM_RUNS}) | warm: committed | cold ÷ warm, committed |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|");
    let mut n = 0;
    for (label, file) in COMPONENTS {
        let module = guests_dir().join(file);
        let Ok(meta) = std::fs::metadata(&module) else {
            println!("| {label} | - | missing: {} | | | | |", module.display());
            continue;
        };
        let cache = tempfile::tempdir()?;
        n += 1;
        let cold = start_once(&nats, n, &module, cache.path()).await?;
        let mut warm = Vec::new();
        for _ in 0..WARM_RUNS {
            n += 1;
            warm.push(start_once(&nats, n, &module, cache.path()).await?);
        }
        let median = |f: fn(&Start) -> Duration| {
            let mut v: Vec<Duration> = warm.iter().map(f).collect();
            v.sort();
            v[v.len() / 2]
        };
        let (ready, committed) = (median(|s| s.ready), median(|s| s.committed));
        println!(
            "| {label} | {} | {} | {} | {} | {} | {:.1}× |",
            meta.len() / 1024,
            ms(cold.ready),
            ms(cold.committed),
            ms(ready),
            ms(committed),
            cold.committed.as_secs_f64() / committed.as_secs_f64()
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    // `IDEM_BENCH_LOG=idem=debug` shows the host's log lines with their
    // times (where a start spends them).
    if let Ok(filter) = std::env::var("IDEM_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}
