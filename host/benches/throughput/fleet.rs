//! The scaling rows: several host processes on one durable consumer.

use super::*;

/// One host of a fleet row (the child's side of [`fleet`]).
pub(super) async fn fleet_member(spec: &Spec, module: PathBuf, url: &str) -> Result<Measured> {
    use tokio::io::AsyncBufReadExt as _;
    let host = start_host(spec, &module, url).await?;
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    println!("ready");
    anyhow::ensure!(
        stdin.next_line().await?.as_deref() == Some("go"),
        "no go from the bench"
    );
    let cpu_at_go = cpu_seconds();
    let token = CancellationToken::new();
    let running = tokio::spawn(host.run(RunMode::Forever, token.clone()));
    while stdin.next_line().await?.is_some() {}
    let cpu_s = cpu_seconds().zip(cpu_at_go).map(|(end, go)| end - go);
    token.cancel();
    let _ = running.await;
    Ok(Measured {
        rss_mib: peak_rss_mib(),
        cpu_s,
        ..Default::default()
    })
}

/// **Scaling**: `hosts` host processes share one durable consumer and one
/// PostgreSQL database over the row's N messages; the time runs from `go`
/// (every host started) until the receipts count N. RSS: the largest host.
pub(super) async fn fleet(spec: &Spec, hosts: usize) -> Result<Measured> {
    use std::io::{BufRead as _, Write as _};
    let js = jetstream_of(spec).await?;
    let payloads: Vec<String> = (0..spec.n).map(credit).collect();
    let row_db = RowDb::new(spec).await?;
    stream_with_replicas(&js, spec.row, &payloads, spec.replicas).await?;
    let member = Spec {
        what: What::FleetMember {
            module: guests_dir().join("credit.wasm"),
            url: row_db.url.clone(),
        },
        ..spec.clone()
    };
    let mut children = Vec::new();
    for _ in 0..hosts {
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .env(ROW_ENV, serde_json::to_string(&member)?)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()?;
        let mut out = std::io::BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        anyhow::ensure!(line.trim() == "ready", "a host did not start: {line}");
        children.push((child, out));
    }
    let db = Database::connect(&row_db.url, 1).await?;
    let consumer = format!("h{}", spec.row);
    let ticks = machine_ticks();
    let started = Instant::now();
    for (child, _) in &mut children {
        writeln!(child.stdin.as_mut().context("stdin")?, "go")?;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while db.receipt_count(&consumer).await? < spec.n as u64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the fleet did not finish in 600 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let busy = match (ticks, machine_ticks()) {
        (Some((busy0, all0)), Some((busy1, all1))) if all1 > all0 => {
            Some((busy1 - busy0) as f64 / (all1 - all0) as f64)
        }
        _ => None,
    };
    // Tell the hosts to stop first: what they used is measured when they
    // see stdin close, right after the last receipt.
    for (child, _) in &mut children {
        drop(child.stdin.take());
    }
    let total = total_balance(&db).await?;
    db.close().await;
    let mut rss: Option<f64> = None;
    let mut cpu = 0.0;
    for (mut child, mut out) in children {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest)?;
        anyhow::ensure!(child.wait()?.success(), "a host failed: {rest}");
        let m: Measured = serde_json::from_str(
            rest.lines()
                .last()
                .and_then(|l| l.strip_prefix("row: "))
                .context("no measurement from a host")?,
        )?;
        cpu += m.cpu_s.unwrap_or(0.0);
        rss = match (rss, m.rss_mib) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    row_db.drop_it().await?;
    anyhow::ensure!(
        total == spec.n as i64,
        "the accounts hold {total}, not {}",
        spec.n
    );
    Ok(Measured {
        rate: spec.n as f64 / secs,
        secs,
        rss_mib: rss,
        cpu_s: Some(cpu),
        busy,
        ..Default::default()
    })
}

/// The scaling table: `fleet` rows of 1, 2 and 3 hosts made by `spec`
/// (PostgreSQL, the Rust component, [`FLEET_CONCURRENCY`] each), after a
/// row of B with confirmed acks at the hosts' combined concurrency for
/// the broker's ceiling; `title` says where.
pub(super) async fn scaling_table(
    title: &str,
    n: usize,
    mut spec: impl FnMut(What, Db, usize) -> Spec,
) -> Result<()> {
    println!();
    println!(
        "Scaling{title}: host processes sharing one durable consumer, PostgreSQL, the Rust component, concurrency {FLEET_CONCURRENCY} each"
    );
    println!();
    println!(
        "| hosts | msg/s | ÷ 1 host | ÷ B | machine CPU busy | hosts' CPU ms per message | largest host RSS MiB |"
    );
    println!("|--:|--:|--:|--:|--:|--:|--:|");
    let b = in_child(&spec(
        What::Broker(Some(FLEET_CONCURRENCY)),
        Db::Postgres,
        FLEET_CONCURRENCY,
    ))?;
    println!(
        "| B, confirmed ack, {FLEET_CONCURRENCY} at a time | {:.0} | - | - | - | - | {} |",
        b.rate,
        cell(b.rss_mib, 0)
    );
    let mut one = None;
    for hosts in 1..=3 {
        let s = spec(What::Database, Db::Postgres, FLEET_CONCURRENCY);
        let m = fleet(&s, hosts).await?;
        let base = *one.get_or_insert(m.rate);
        println!(
            "| {hosts} | {:.0} | {} | {} | {} | {} | {} |",
            m.rate,
            ratio(m.rate, Some(base)),
            ratio(m.rate, Some(b.rate)),
            m.busy.map_or("-".into(), |b| format!("{:.0} %", b * 100.0)),
            cell(m.cpu_s.map(|c| c * 1000.0 / n as f64), 2),
            cell(m.rss_mib, 0)
        );
    }
    Ok(())
}

/// This process's CPU time, user + system, in seconds (`/proc/self/stat`
/// fields 14 and 15, in clock ticks of 1/100 s, `USER_HZ` on Linux: proc(5)).
pub(super) fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// The machine's busy and total CPU ticks so far (`/proc/stat`, line
/// `cpu`: busy = all but idle and iowait).
pub(super) fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let all: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((all - idle, all))
}
