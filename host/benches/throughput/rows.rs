//! The rows that run in a process of their own: B, D, and one host
//! (native or a component), with what they share.

use super::*;

/// A fresh database for one row: dropped (PostgreSQL) or deleted with its
/// directory (SQLite) at the end.
pub(super) struct RowDb {
    pub(super) url: String,
    _dir: tempfile::TempDir,
    pg: Option<(String, String)>,
}

impl RowDb {
    pub(super) async fn new(spec: &Spec) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        match spec.db {
            Db::Sqlite => Ok(RowDb {
                url: format!("sqlite://{}", dir.path().join("idem.db").display()),
                _dir: dir,
                pg: None,
            }),
            Db::Postgres => {
                let admin = spec.pg_admin.clone().context("no PostgreSQL")?;
                let name = format!("idem_throughput_{}_{}", std::process::id(), spec.row);
                let a = Database::connect(&admin, 1).await?;
                let pool = a.postgres_pool().context("not PostgreSQL")?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(pool)
                    .await
                    .context("CREATE DATABASE")?;
                a.close().await;
                Ok(RowDb {
                    url: idem_test_support::pg_url_with_database(&admin, &name),
                    _dir: dir,
                    pg: Some((admin, name)),
                })
            }
        }
    }

    pub(super) async fn drop_it(self) -> Result<()> {
        if let Some((admin, name)) = self.pg {
            let db = Database::connect(&admin, 1).await?;
            let pool = db.postgres_pool().context("not PostgreSQL")?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .execute(pool)
            .await?;
            db.close().await;
        }
        Ok(())
    }
}

/// A JetStream context on the row's server, or servers (`nats`: URLs
/// separated by commas, as `[broker] url` takes them).
pub(super) async fn jetstream_of(spec: &Spec) -> Result<jetstream::Context> {
    let servers = spec
        .nats
        .split(',')
        .map(|u| u.trim().parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(jetstream::new(async_nats::connect(servers).await?))
}

/// A stream `T<row>` on `t<row>.credit` holding `payloads`, published
/// without `Nats-Msg-Id` (the broker keeps repeats); returns the subject.
pub(super) async fn stream_with(
    js: &jetstream::Context,
    row: usize,
    payloads: &[String],
) -> Result<String> {
    stream_with_replicas(js, row, payloads, 1).await
}

/// [`stream_with`], the stream with `replicas` replicas (a cluster).
pub(super) async fn stream_with_replicas(
    js: &jetstream::Context,
    row: usize,
    payloads: &[String],
    replicas: usize,
) -> Result<String> {
    let subject = Order::None.subject(row, 0);
    let messages = payloads.iter().map(|p| (subject.clone(), p.clone()));
    stream_of(js, row, Order::None, replicas, messages.collect()).await?;
    Ok(subject)
}

/// A stream `T<row>` for a handler keeping `order` (on its subject and,
/// with partitions, with the subject transform idem needs) holding
/// `messages` (subject, payload), published without `Nats-Msg-Id`.
pub(super) async fn stream_of(
    js: &jetstream::Context,
    row: usize,
    order: Order,
    replicas: usize,
    messages: Vec<(String, String)>,
) -> Result<()> {
    js.create_stream(jetstream::stream::Config {
        name: format!("T{row}"),
        subjects: vec![order.subjects(row)],
        subject_transform: order.transform(),
        max_age: Duration::from_secs(7 * 24 * 3600),
        num_replicas: replicas.max(1),
        ..Default::default()
    })
    .await?;
    publish_all(js, messages).await
}

/// Publishes `messages` (subject, payload) without `Nats-Msg-Id`, 256 at
/// a time, and waits for every PubAck.
pub(super) async fn publish_all(
    js: &jetstream::Context,
    messages: Vec<(String, String)>,
) -> Result<()> {
    let acks: Vec<_> = futures::stream::iter(messages)
        .map(|(subject, p)| {
            let js = js.clone();
            async move {
                js.publish(subject, p.into())
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))
            }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    for ack in acks {
        ack?;
    }
    Ok(())
}

/// **B**: a durable pull consumer takes the row's N messages, acking each
/// plainly (`concurrency` None) or with a confirmed ack, that many at a time.
pub(super) async fn broker(spec: &Spec, concurrency: Option<usize>) -> Result<Measured> {
    let js = jetstream_of(spec).await?;
    let payloads: Vec<String> = (0..spec.n).map(credit).collect();
    stream_with_replicas(&js, spec.row, &payloads, spec.replicas).await?;
    let stream = js.get_stream(format!("T{}", spec.row)).await?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(format!("b{}", spec.row)),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let started = Instant::now();
    let messages = consumer.messages().await?.take(spec.n);
    let failed = Arc::new(AtomicUsize::new(0));
    messages
        .for_each_concurrent(concurrency.unwrap_or(1), |m| {
            let failed = failed.clone();
            async move {
                let ok = match (m, concurrency) {
                    (Ok(m), None) => m.ack().await.is_ok(),
                    (Ok(m), Some(_)) => m.double_ack().await.is_ok(),
                    (Err(_), _) => false,
                };
                if !ok {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await;
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("{failed} acks failed");
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(Measured {
        rate: spec.n as f64 / secs,
        secs,
        rss_mib: peak_rss_mib(),
        ..Default::default()
    })
}

/// **D**: N messages' receipt insert + credit upsert, committed `batch`
/// at a time (one message a transaction unless the row is batched),
/// `concurrency` transactions at a time, straight to the database: on
/// PostgreSQL through sqlx, one round trip a statement; on SQLite through
/// SQLite's own library on threads of their own (rusqlite, as a
/// hand-written consumer would, with the settings idem opens it with), so
/// that no driver thread hop is counted as the database's.
pub(super) async fn database(spec: &Spec) -> Result<Measured> {
    let row_db = RowDb::new(spec).await?;
    let c = spec.concurrency;
    let db = Arc::new(Database::connect(&row_db.url, c as u32).await?);
    db.prepare_host_tables().await?;
    common::run_sql(
        &db,
        [
            "CREATE TABLE accounts (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)"
                .to_owned(),
        ],
    )
    .await?;
    let (next, n, batch) = (Arc::new(AtomicUsize::new(0)), spec.n, spec.batch.max(1));
    let file = row_db.url.strip_prefix("sqlite://").map(PathBuf::from);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..c {
        let (next, db, file) = (next.clone(), db.clone(), file.clone());
        tasks.push(tokio::spawn(async move {
            match file {
                Some(file) => {
                    tokio::task::spawn_blocking(move || sqlite_transactions(&file, &next, n, batch))
                        .await?
                }
                None => {
                    let mut took = Vec::new();
                    loop {
                        let first = next.fetch_add(batch, Ordering::Relaxed);
                        if first >= n {
                            return Ok::<_, anyhow::Error>(took);
                        }
                        let t = Instant::now();
                        one_transaction(&db, first..n.min(first + batch)).await?;
                        took.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                }
            }
        }));
    }
    let mut took = Vec::new();
    for t in tasks {
        took.extend(t.await??);
    }
    let secs = started.elapsed().as_secs_f64();
    let balance_total = total_balance(&db).await?;
    db.close().await;
    row_db.drop_it().await?;
    if balance_total != n as i64 {
        bail!("the accounts hold {balance_total}, not {n}");
    }
    let (p50, p99) = percentiles(took);
    Ok(Measured {
        rate: n as f64 / secs,
        secs,
        p50,
        p99,
        rss_mib: peak_rss_mib(),
        ..Default::default()
    })
}

/// D on SQLite, on this thread: transactions of `batch` messages taken from
/// `next` until `n`; each transaction's time in ms.
fn sqlite_transactions(
    file: &std::path::Path,
    next: &AtomicUsize,
    n: usize,
    batch: usize,
) -> Result<Vec<f64>> {
    let conn = rusqlite::Connection::open(file)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")?;
    let mut took = Vec::new();
    loop {
        let first = next.fetch_add(batch, Ordering::Relaxed);
        if first >= n {
            return Ok(took);
        }
        let t = Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE")?;
        for i in first..n.min(first + batch) {
            conn.prepare_cached(RECEIPT)?.execute(rusqlite::params![
                "d",
                format!("e{i}"),
                i as i64,
                "none",
                0_i64
            ])?;
            conn.prepare_cached(CREDIT)?
                .execute(rusqlite::params![account(i) as i64, 1_i64])?;
        }
        conn.execute_batch("COMMIT")?;
        took.push(t.elapsed().as_secs_f64() * 1000.0);
    }
}

/// The sum of every balance (each credit adds 1).
pub(super) async fn total_balance(db: &Database) -> Result<i64> {
    const SUM: &str = "SELECT CAST(COALESCE(SUM(balance), 0) AS BIGINT) FROM accounts";
    Ok(match (db.postgres_pool(), db.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_scalar(SUM).fetch_one(pool).await?,
        (None, Some(pool)) => sqlx::query_scalar(SUM).fetch_one(pool).await?,
        (None, None) => bail!("no database backend"),
    })
}

/// The transaction idem commits for messages `ids` (one, or a batch),
/// without the guest: each message's receipt insert and credit upsert.
pub(super) async fn one_transaction(db: &Database, ids: std::ops::Range<usize>) -> Result<()> {
    macro_rules! transaction {
        ($pool:expr) => {{
            let mut tx = $pool.begin().await?;
            for i in ids {
                sqlx::query(RECEIPT)
                    .bind("d")
                    .bind(format!("e{i}"))
                    .bind(i as i64)
                    .bind("none")
                    .bind(0_i64)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(CREDIT)
                    .bind(account(i) as i64)
                    .bind(1_i64)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        }};
    }
    match (db.postgres_pool(), db.sqlite_pool()) {
        (Some(pool), _) => transaction!(pool),
        (None, Some(pool)) => transaction!(pool),
        (None, None) => bail!("no database backend"),
    }
    Ok(())
}

/// **native** and **idem**: a host with `concurrency` (in each partition)
/// over the row's messages, then over messages published at half its rate
/// for the latency.
pub(super) async fn host(
    spec: &Spec,
    module: PathBuf,
    native: bool,
    duplicates: bool,
    order: Order,
) -> Result<Measured> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .map_err(|_| anyhow::anyhow!("a metrics recorder is installed already"))?;
    let (row, n) = (spec.row, spec.n);
    let js = jetstream::new(async_nats::connect(&spec.nats).await?);
    let distinct = if duplicates { (n / 2).max(1) } else { n };
    let messages = (0..n)
        .map(|i| i % distinct)
        .map(|i| (order.subject(row, i), credit(i)));
    let row_db = RowDb::new(spec).await?;
    stream_of(&js, row, order, 1, messages.collect()).await?;
    let name = format!("h{row}");
    let host = start_host(spec, &module, &row_db.url).await?;
    if native {
        put_native_in_place(&host)?;
    }
    let (_, stats) = host.stats().into_iter().next().context("no handler")?;
    let settled = |s: &idem::metrics::StatsSnapshot| s.processed + s.duplicates + s.dead_lettered;
    let token = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(host.run(RunMode::Forever, token.clone()));
    while settled(&stats.snapshot()) < n as u64 {
        if running.is_finished() {
            bail!("the host stopped before the messages were processed");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let rate = n as f64 / secs;
    let s = stats.snapshot();
    if (s.processed, s.duplicates, s.dead_lettered, s.retried)
        != (distinct as u64, (n - distinct) as u64, 0, 0)
    {
        bail!(
            "not a clean run: {} processed, {} duplicates, {} dead-lettered, {} retried",
            s.processed,
            s.duplicates,
            s.dead_lettered,
            s.retried
        );
    }

    // Latency: messages at half the rate, after the backlog's samples are
    // taken out of the recorder.
    let _ = publish_to_commit(&snapshotter, &name);
    let paced = (rate.min(2000.0) as usize).max(100);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(2.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    for i in (0..paced).map(|i| 1_000_000 + i) {
        tick.tick().await;
        js.publish(order.subject(row, i), credit(i).into()).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while settled(&stats.snapshot()) < (n + paced) as u64 {
        if Instant::now() > deadline {
            bail!("the paced messages were not processed within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (p50, p99) = percentiles(publish_to_commit(&snapshotter, &name));
    let rss_mib = peak_rss_mib();
    token.cancel();
    let _ = running.await;
    // The next partitioned row's stream takes the same subjects.
    js.delete_stream(format!("T{row}")).await?;
    let db = Database::connect(&row_db.url, 1).await?;
    let total = total_balance(&db).await?;
    db.close().await;
    row_db.drop_it().await?;
    if total != (distinct + paced) as i64 {
        bail!("the accounts hold {total}, not {}", distinct + paced);
    }
    Ok(Measured {
        rate,
        secs,
        p50,
        p99,
        rss_mib,
        ..Default::default()
    })
}

/// `Host::start` for handler `h<row>` on stream `T<row>` with `module`,
/// the row's concurrency, the order a host row keeps ([`Order`]), and the
/// database at `url`.
pub(super) async fn start_host(spec: &Spec, module: &std::path::Path, url: &str) -> Result<Host> {
    start_host_with(spec, module, url, "").await
}

/// [`start_host`] with `extra` lines in the handler's config.
pub(super) async fn start_host_with(
    spec: &Spec,
    module: &std::path::Path,
    url: &str,
    extra: &str,
) -> Result<Host> {
    let (row, c) = (spec.row, spec.concurrency);
    let order = match &spec.what {
        What::Host { order, .. } => *order,
        _ => Order::None,
    };
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{}\"\n[database]\nurl = \"{url}\"\nmax_connections = {}\n[runtime]\ncache_dir = \"{}\"\n[[handler]]\nname = \"h{row}\"\nmodule = \"{}\"\nstream = \"T{row}\"\nsubjects = [\"{}\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\"]\nmigrations = \"{}\"\nconcurrency = {c}\nbatch = {}\n{}{}{extra}\n",
            spec.nats,
            c * order.loops() + 2,
            spec.cache.display(),
            module.display(),
            order.subjects(row),
            root().join("examples/credit/migrations").display(),
            if spec.auto_batch {
                "\"auto\"".to_string()
            } else {
                spec.batch.max(1).to_string()
            },
            // A batch fills from the pulls: ask for a whole batch, which
            // the ack_wait bound allows with a long ack_wait.
            if spec.batch > 1 {
                format!(
                    "pull_batch = {}\nack_wait = \"300s\"\ndeadline = \"2s\"\n",
                    spec.batch
                )
            } else {
                String::new()
            },
            order.config(),
        ),
    )?;
    let config = Config::load(&cfg)?;
    Host::start(&config).await
}

#[cfg(feature = "native-handler")]
pub(super) fn put_native_in_place(host: &Host) -> Result<()> {
    use idem::runtime::HandlerComponent;
    use idem::runtime::native::{NativeHandler, NativeHost};
    use idem::runtime::{GuestMessage, HandlerFailure};
    use idem::store::SqlValue;

    /// `examples/credit` compiled into the host.
    struct NativeCredit;

    #[derive(Deserialize)]
    struct CreditEvent {
        account_id: i64,
        amount: i64,
    }

    impl NativeHandler for NativeCredit {
        fn handle<'a>(
            &'a self,
            host: &'a mut NativeHost<'_>,
            msg: &'a GuestMessage,
        ) -> futures::future::BoxFuture<'a, Result<(), HandlerFailure>> {
            Box::pin(async move {
                let event: CreditEvent = serde_json::from_slice(&msg.payload)
                    .map_err(|e| HandlerFailure::Reject(format!("not a credit event: {e}")))?;
                let params = vec![
                    SqlValue::Integer(event.account_id),
                    SqlValue::Integer(event.amount),
                ];
                match host.execute(CREDIT, params).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(HandlerFailure::Retry(e)),
                    Err(trap) => Err(HandlerFailure::Trap(trap)),
                }
            })
        }
    }

    for (_, slot) in host.slots() {
        slot.swap(HandlerComponent::native("credit", Arc::new(NativeCredit)));
    }
    Ok(())
}

#[cfg(not(feature = "native-handler"))]
pub(super) fn put_native_in_place(_: &Host) -> Result<()> {
    bail!("built without --features native-handler")
}

/// The `idem_publish_to_commit_seconds` samples of `handler` since the
/// last call (the recorder hands each sample out once), in milliseconds.
pub(super) fn publish_to_commit(snapshotter: &Snapshotter, handler: &str) -> Vec<f64> {
    histogram_ms(snapshotter, "idem_publish_to_commit_seconds", handler)
}

/// The samples of histogram `name` of `handler` since the last call, in
/// milliseconds.
pub(super) fn histogram_ms(snapshotter: &Snapshotter, name: &str, handler: &str) -> Vec<f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| {
            let key = key.key();
            key.name() == name
                && key
                    .labels()
                    .any(|l| l.key() == "handler" && l.value() == handler)
        })
        .flat_map(|(_, _, _, value)| match value {
            DebugValue::Histogram(v) => v.into_iter().map(|x| x.into_inner() * 1000.0).collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// p50 and p99 of `samples`.
pub(super) fn percentiles(mut samples: Vec<f64>) -> (Option<f64>, Option<f64>) {
    if samples.is_empty() {
        return (None, None);
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (Some(at(0.5)), Some(at(0.99)))
}

/// This process's peak RSS (`VmHWM` in `/proc/self/status`), MiB.
pub(super) fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
