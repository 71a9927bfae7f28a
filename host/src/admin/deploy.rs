//! `idem deploy` (a new version, `--rollback`, `--history`) and `idem
//! status`: the operator's side of hot deploy ([`crate::deploy`]).
//!
//! A deploy validates the component first (it must load as the handler's:
//! world `idem:handler/handler`, only the imports the handler's config
//! allows, it compiles), stores it in the modules bucket under its digest,
//! then records the deployment with a compare-and-set on the handler's KV
//! revision, so of two deploys racing from the same revision one is
//! refused. Nothing changes when any step before the record fails.

use super::handler;
use crate::cli::ConfigArg;
use crate::config::Config;
use crate::deploy::Deployment;
use crate::deploy::heartbeat::HostReport;
use crate::deploy::store::{Current, DeployStore};
use crate::runtime::{LoadOptions, Runtime};
use clap::{ArgGroup, Args};
use futures::TryStreamExt as _;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// `idem deploy`'s arguments.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("what").required(true).args(["module", "rollback", "history"])))]
pub struct DeployArgs {
    /// The config that runs the handler (its `[broker]` and `[deploy]`).
    #[command(flatten)]
    pub config: ConfigArg,
    /// The handler to deploy to (a `[[handler]]` of the config).
    pub handler: String,
    /// The new component (.wasm).
    pub module: Option<PathBuf>,
    /// Point the handler back at the version deployed before the current one.
    #[arg(long, conflicts_with = "module")]
    pub rollback: bool,
    /// List the handler's deployments, oldest first.
    #[arg(long, conflicts_with_all = ["module", "rollback", "wait"])]
    pub history: bool,
    /// Free text kept with the deployment.
    #[arg(long, default_value = "")]
    pub note: String,
    /// Return once every live host runs the new version (or fail after
    /// `--timeout`, naming the hosts that do not).
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` waits, e.g. `60s`, `2m`.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// `idem status`'s arguments.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The config whose `[broker]` and `[deploy]` are read.
    #[command(flatten)]
    pub config: ConfigArg,
}

/// Runs `idem deploy`.
///
/// # Errors
/// One line: the handler is not in the config, the component does not
/// load (nothing deployed), there is nothing to roll back to, the broker
/// refused, another deploy came first, or `--wait` timed out.
pub async fn run(args: DeployArgs) -> anyhow::Result<()> {
    let path = &args.config.config;
    let config = Config::load(path)?;
    let h = handler(&config, path, &args.handler)?.clone();
    let broker = crate::broker::connect(&config.broker).await?;
    let store = DeployStore::open(&broker.js, &config.deploy).await?;
    if args.history {
        return history(&store, &h.name).await;
    }
    let current = store.current(&h.name).await?;
    let running = match &current {
        Some(Current {
            deployment: Ok(d), ..
        }) => Some(d.clone()),
        _ => None,
    };
    let (bytes, origin) = if args.rollback {
        let Some(previous) = running.as_ref().and_then(|d| d.previous.clone()) else {
            anyhow::bail!(
                "`{}` has no earlier deployment to roll back to (`idem deploy --history {}` lists them)",
                h.name,
                h.name
            );
        };
        let bytes = store.fetch_module(&previous, None).await?;
        (bytes, PathBuf::from(format!("deployment {previous}")))
    } else {
        let module = args.module.clone().unwrap_or_default();
        let bytes = std::fs::read(&module)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", module.display()))?;
        (bytes, module)
    };
    let digest = hex::encode(Sha256::digest(&bytes));
    validate(&config, &bytes, &origin, LoadOptions { wasi: h.wasi }).await?;
    // The first deployment's previous version is the config's module, kept
    // in the modules bucket too, so `--rollback` can return to it.
    let previous = match &running {
        Some(d) => Some(d.digest.clone()),
        None => match std::fs::read(&h.module) {
            Ok(module) => {
                let d = hex::encode(Sha256::digest(&module));
                if d != digest {
                    store.put_module(&d, &module).await?;
                }
                Some(d)
            }
            Err(_) => None,
        },
    };
    let started = OffsetDateTime::now_utc();
    if let Some(d) = running.as_ref().filter(|d| d.digest == digest) {
        // Recorded again (a new revision, the same previous): a host that
        // refused it, say while its object was missing, tries again.
        store.put_module(&digest, &bytes).await?;
        let again = Deployment {
            deployed_at: started.format(&Rfc3339).unwrap_or_default(),
            note: if args.note.is_empty() {
                "deployed again".to_owned()
            } else {
                args.note.clone()
            },
            by: who(),
            ..d.clone()
        };
        let revision = store
            .record(&h.name, &again, current.as_ref().map(|c| c.revision))
            .await?;
        println!(
            "`{}` already had {digest} deployed; recorded again (revision {revision}) so hosts that refused it try again",
            h.name
        );
    } else {
        store.put_module(&digest, &bytes).await?;
        let note = match (&args.note, args.rollback) {
            (n, true) if n.is_empty() => "rollback".to_owned(),
            (n, _) => n.clone(),
        };
        let deployment = Deployment {
            digest: digest.clone(),
            previous: previous.filter(|p| *p != digest),
            deployed_at: OffsetDateTime::now_utc()
                .format(&Rfc3339)
                .unwrap_or_default(),
            note,
            size: bytes.len() as u64,
            by: who(),
        };
        let revision = store
            .record(&h.name, &deployment, current.as_ref().map(|c| c.revision))
            .await?;
        println!(
            "deployed {digest} to `{}` (revision {revision}{})",
            h.name,
            deployment
                .previous
                .as_ref()
                .map(|p| format!(", previous {p}"))
                .unwrap_or_default()
        );
    }
    if args.wait {
        wait_for_hosts(&store, &h.name, &digest, args.timeout, started).await?;
    }
    Ok(())
}

/// Loads `bytes` as the handler's component would be loaded by a host
/// (same checks, same engine settings, the same compiled-code cache), on a
/// blocking thread.
async fn validate(
    config: &Config,
    bytes: &[u8],
    origin: &std::path::Path,
    options: LoadOptions,
) -> anyhow::Result<()> {
    let runtime = Arc::new(
        Runtime::with_options(&crate::runtime::RuntimeOptions::of(config, 1))
            .map_err(|e| anyhow::anyhow!("cannot start the wasm runtime: {e:#}"))?,
    );
    let (bytes, path) = (bytes.to_vec(), origin.to_path_buf());
    let rt = runtime.clone();
    let component = tokio::task::spawn_blocking(move || rt.load_bytes(&bytes, &path, options))
        .await
        .map_err(|e| anyhow::anyhow!("the validation task failed: {e}"))?
        .map_err(|e| anyhow::anyhow!("refused, nothing deployed: {e}"))?;
    runtime
        .check_instantiates(&component)
        .await
        .map_err(|e| anyhow::anyhow!("refused, nothing deployed: {}: {e}", origin.display()))
}

/// `user@host` of this command.
fn who() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    format!("{user}@{}", crate::deploy::heartbeat::hostname())
}

/// Prints `handler`'s deployments, oldest first, one a line.
async fn history(store: &DeployStore, handler: &str) -> anyhow::Result<()> {
    let entries = store.history(handler).await?;
    if entries.is_empty() {
        println!("no deployments of `{handler}`");
    }
    for Current {
        revision,
        deployment,
    } in entries
    {
        match deployment {
            Ok(d) => println!(
                "revision {revision}  {}  {}  previous {}  by {}{}",
                d.deployed_at,
                d.digest,
                d.previous.as_deref().unwrap_or("-"),
                if d.by.is_empty() { "-" } else { &d.by },
                if d.note.is_empty() {
                    String::new()
                } else {
                    format!("  note {}", d.note)
                }
            ),
            Err(reason) => println!("revision {revision}  not a deployment: {reason}"),
        }
    }
    Ok(())
}

/// Every live host's report.
async fn reports(store: &DeployStore) -> anyhow::Result<Vec<HostReport>> {
    let keys: Vec<String> = match store.hosts().keys().await {
        Ok(keys) => keys.try_collect().await.unwrap_or_default(),
        Err(e) => anyhow::bail!("cannot list the hosts bucket: {e}"),
    };
    let mut reports = Vec::new();
    for key in keys {
        if let Ok(Some(value)) = store.hosts().get(&key).await
            && let Ok(report) = serde_json::from_slice::<HostReport>(&value)
        {
            reports.push(report);
        }
    }
    reports.sort_by(|a, b| a.host.cmp(&b.host));
    Ok(reports)
}

/// Waits until every live host that runs `handler` runs `digest`, as told
/// by a report it wrote after `since` (the deploy): an older report says
/// what the host ran before.
async fn wait_for_hosts(
    store: &DeployStore,
    handler: &str,
    digest: &str,
    timeout: Duration,
    since: OffsetDateTime,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let (mut on, mut behind) = (Vec::new(), Vec::new());
        for r in reports(store).await? {
            let fresh = OffsetDateTime::parse(&r.reported_at, &Rfc3339).is_ok_and(|at| at >= since);
            for h in r.handlers.iter().filter(|h| h.name == handler) {
                match &h.refused {
                    _ if fresh && h.digest == digest => on.push(r.host.clone()),
                    Some((d, reason)) if fresh && d == digest => {
                        behind.push(format!("{} (refused it: {reason})", r.host));
                    }
                    _ if !fresh => behind.push(format!("{} (no report since the deploy)", r.host)),
                    _ => behind.push(format!("{} (runs {})", r.host, h.digest)),
                }
            }
        }
        if behind.is_empty() {
            if on.is_empty() {
                println!("no live host runs `{handler}`");
            } else {
                println!("every live host runs {digest}: {}", on.join(", "));
            }
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "after {}, not every host runs {digest}: {}",
                humantime::format_duration(timeout),
                behind.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs `idem status`: one line per live host and handler.
///
/// # Errors
/// The broker cannot be reached or the buckets cannot be opened.
pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config.config)?;
    let broker = crate::broker::connect(&config.broker).await?;
    let store = DeployStore::open(&broker.js, &config.deploy).await?;
    let reports = reports(&store).await?;
    if reports.is_empty() {
        println!("no live hosts");
    }
    for r in reports {
        for h in &r.handlers {
            let deployed = match store.current(&h.name).await {
                Ok(Some(Current {
                    deployment: Ok(d), ..
                })) if d.digest == h.digest => " (deployed)".to_owned(),
                Ok(Some(Current {
                    deployment: Ok(d), ..
                })) => format!(" (deployed: {})", d.digest),
                _ => String::new(),
            };
            let refused = h
                .refused
                .as_ref()
                .map(|(d, reason)| format!(" refused {d}: {reason}"))
                .unwrap_or_default();
            println!(
                "{} {} {}{deployed} in_flight={} processed={} duplicates={} dead_lettered={} since {}{refused}",
                r.host,
                h.name,
                h.digest,
                h.in_flight,
                h.processed,
                h.duplicates,
                h.dead_lettered,
                r.started_at
            );
        }
    }
    Ok(())
}
