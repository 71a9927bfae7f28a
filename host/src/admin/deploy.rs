//! `idem deploy` (a new version, `--rollback`, `--history`) and `idem
//! status`: the operator's side of hot deploy ([`crate::deploy`]).
//!
//! A deploy validates the component first (it must load as the handler's:
//! world `idem:handler/handler`, only the imports the handler's config
//! allows, it compiles), stores it in the modules bucket under its digest,
//! then records the deployment with a compare-and-set on the handler's KV
//! revision, so of two deploys racing from the same revision one is
//! refused. Nothing changes when any step before the record fails.
//!
//! The record is signed with the operator's deploy key (`--key`, an NKey
//! seed file, [`crate::deploy::keys`]) over the handler, the digest, the
//! size and the revision it replaces ([`crate::deploy::trust`]). What runs
//! now, and what `--rollback` returns to, is read from the records the
//! config's `[deploy] trusted_keys` vouch for, never from one they do not.

use super::deploy_wait::wait_for_hosts;
use super::handler;
use crate::config::Config;
use crate::deploy::Deployment;
use crate::deploy::heartbeat::HostReport;
use crate::deploy::keys::{Role, generate, public_key, read_seed};
use crate::deploy::record::{MAX_BY_BYTES, MAX_NOTE_BYTES, bounded, escaped};
use crate::deploy::store::{DeployStore, History};
use crate::runtime::{LoadOptions, Runtime};
use futures::TryStreamExt as _;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// One `idem deploy`, as the command line asks for it
/// (`cli/deploy.rs`).
#[derive(Debug)]
pub struct Request {
    /// The config that runs the handler.
    pub config: PathBuf,
    /// The handler to deploy to.
    pub handler: String,
    /// The new component (.wasm).
    pub module: Option<PathBuf>,
    /// Point the handler back at the version deployed before the current one.
    pub rollback: bool,
    /// List the handler's deployments.
    pub history: bool,
    /// Deploy `module` as a shadow for this share of messages (parts per
    /// million) instead ([`super::shadow::deploy`]).
    pub shadow: Option<u32>,
    /// Show the shadow's report ([`super::shadow::report`]).
    pub shadow_report: bool,
    /// Deploy the shadow candidate, and drop the shadow.
    pub promote: bool,
    /// Drop the shadow ([`super::shadow::abort`]).
    pub abort: bool,
    /// Free text kept with the deployment.
    pub note: String,
    /// Return once every live host runs the new version.
    pub wait: bool,
    /// How long `wait` waits.
    pub timeout: Duration,
    /// The deploy key's seed file.
    pub key: Option<PathBuf>,
}

/// Runs `idem deploy`.
///
/// # Errors
/// One line: the handler is not in the config, the component does not
/// load (nothing deployed), there is nothing to roll back to, the broker
/// refused, another deploy came first, or `--wait` timed out.
pub async fn run(args: Request) -> anyhow::Result<()> {
    let path = &args.config;
    let config = Config::load(path)?;
    let h = handler(&config, path, &args.handler)?.clone();
    // The key first: a deploy that cannot be signed contacts nothing.
    let key = if args.history || args.shadow_report || args.abort {
        None
    } else {
        Some(signing_key(&config, args.key.as_deref(), path)?)
    };
    let broker = crate::broker::connect(&config.broker).await?;
    let store = DeployStore::open(&broker, &config.deploy).await?;
    create_shadows(&store).await;
    let Some(key) = key else {
        if args.shadow_report {
            return super::shadow::report(&store, &h.name).await;
        }
        if args.abort {
            return super::shadow::abort(&store, &h.name).await;
        }
        return history(&store, &h.name).await;
    };
    if let (Some(sample), Some(module)) = (args.shadow, &args.module) {
        let store = with_marks(&config, store).await;
        return super::shadow::deploy(&config, &store, &h, module, sample, &key).await;
    }
    let store = with_marks(&config, store).await;
    // What the hosts run: the latest record the trusted keys vouch for, not
    // below the high-water mark. A record they do not believe is never the
    // source of `previous` or a rollback.
    let history = store.history(&h.name).await?;
    let running = store.deployed(&h.name, &history).await?;
    let replaces = store.last_revision(&h.name).await?;
    let mark = store.mark(&h.name).await?.map_or(0, |m| m.sequence);
    let sequence = next_sequence(&store, &h.name, &history, mark)?;
    // The shadow record's revision, when promoting.
    let mut promoted = None;
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
    } else if args.promote {
        let shadow = match super::shadow::current(&store, &h.name).await? {
            None => anyhow::bail!("`{}` has no shadow deployment to promote", h.name),
            Some((_, Err(why))) => anyhow::bail!(
                "the shadow record of `{}` is not one hosts run, so it is not promoted: {}",
                h.name,
                escaped(&why, 300)
            ),
            Some((revision, Ok(r))) => {
                promoted = Some(revision);
                r
            }
        };
        let live = super::shadow::live_of(running.as_ref(), &h)?;
        if shadow.against != live {
            anyhow::bail!(
                "the shadow of `{}` was compared with {}, but `{}` runs {live} now: nothing was deployed; shadow the candidate against this version first (`idem deploy {} MODULE --shadow`)",
                h.name,
                shadow.against,
                h.name,
                h.name
            );
        }
        let bytes = store
            .fetch_module(&shadow.digest, Some(shadow.size))
            .await?;
        (bytes, PathBuf::from(format!("shadow {}", shadow.digest)))
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
    let revision = if let Some(d) = running.as_ref().filter(|d| d.digest == digest) {
        // Recorded again (a new revision, the same previous): a host that
        // refused it, say while its object was missing, tries again.
        store.put_module(&digest, &bytes).await?;
        let mut again = Deployment {
            deployed_at: started.format(&Rfc3339).unwrap_or_default(),
            note: if args.note.is_empty() {
                "deployed again".to_owned()
            } else {
                args.note.clone()
            },
            by: who(),
            replaces,
            sequence,
            ..d.clone()
        };
        sign(&key, &h.name, &mut again)?;
        let revision = store.record(&h.name, &again).await?;
        println!(
            "`{}` already had {digest} deployed; recorded again (revision {revision}) so hosts that refused it try again",
            h.name
        );
        revision
    } else {
        store.put_module(&digest, &bytes).await?;
        let note = match (&args.note, args.rollback, args.promote) {
            (n, true, _) if n.is_empty() => "rollback".to_owned(),
            (n, _, true) if n.is_empty() => "promoted from shadow".to_owned(),
            (n, _, _) => n.clone(),
        };
        let mut deployment = Deployment {
            digest: digest.clone(),
            previous: previous.filter(|p| *p != digest),
            deployed_at: OffsetDateTime::now_utc()
                .format(&Rfc3339)
                .unwrap_or_default(),
            note,
            size: bytes.len() as u64,
            by: who(),
            handler: String::new(),
            replaces,
            sequence,
            signer: String::new(),
            signature: String::new(),
        };
        sign(&key, &h.name, &mut deployment)?;
        let revision = store.record(&h.name, &deployment).await?;
        println!(
            "deployed {digest} to `{}` (revision {revision}{})",
            h.name,
            deployment
                .previous
                .as_ref()
                .map(|p| format!(", previous {p}"))
                .unwrap_or_default()
        );
        revision
    };
    if let Some(revision) = promoted {
        // Live now: the shadow has nothing left to compare.
        super::shadow::delete(&store, &h.name, revision)
            .await
            .map_err(|e| anyhow::anyhow!("{digest} is deployed, but {e:#}"))?;
        println!("shadow of `{}` promoted and dropped", h.name);
    }
    if args.wait {
        wait_for_hosts(&store, &h.name, &digest, revision, args.timeout, started).await?;
    }
    Ok(())
}

/// Creates the shadows bucket when missing, as the other buckets are (the
/// deployer's commands do; hosts may not), or warns: a deployer under an
/// older permissions file still deploys and reads status.
async fn create_shadows(store: &DeployStore) {
    if let Err(e) = store.create_shadows().await {
        tracing::warn!(error = %escaped(&format!("{e:#}"), 300), "shadow deploys are unavailable until the shadows bucket can be created");
    }
}

/// The sequence of `handler`'s next deployment: above every believed
/// record's in `history` and the high-water mark `mark`, and at least the clock in Unix milliseconds, so
/// a history someone cut (or a bucket made again) does not lower it below
/// what hosts ran, however little of it the broker keeps.
///
/// # Errors
/// One line: the sequence would pass `i64::MAX`, the highest a record may
/// carry (a mark or record that high was written by hand).
fn next_sequence(
    store: &DeployStore,
    handler: &str,
    history: &History,
    mark: u64,
) -> anyhow::Result<u64> {
    let signed = history
        .records
        .iter()
        .filter_map(|c| store.believe_in(handler, c, history).ok())
        .map(|d| d.sequence)
        .chain([mark])
        .max()
        .unwrap_or(0);
    let now_ms =
        u64::try_from(OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    let next = signed.saturating_add(1).max(now_ms);
    if i64::try_from(next).is_err() {
        anyhow::bail!(
            "`{handler}` cannot be deployed: the next sequence would be {next}, past the highest a record may carry ({}); a record or high-water mark that high was not written by idem deploy: check idem_deploy_marks in the database",
            i64::MAX
        );
    }
    Ok(next)
}

/// `store` reading the hosts' high-water marks in `config`'s database
/// when it can be reached (`idem deploy` may run where it cannot: then
/// the bucket alone decides, and a warning in the log says so).
async fn with_marks(config: &Config, store: DeployStore) -> DeployStore {
    match crate::store::Database::connect_existing(&config.database.url, 1, config.lock_wait())
        .await
    {
        Ok(db) => store.with_marks(Arc::new(db)),
        Err(e) => {
            tracing::warn!(error = %escaped(&format!("{e:#}"), 300), "the hosts' deployment high-water marks are not read; what is deployed is judged from the deployments bucket alone");
            store
        }
    }
}

/// The deploy key `--key` (or `IDEM_SIGNING_KEY`) names, checked to be one
/// `config`'s hosts trust.
fn signing_key(
    config: &Config,
    key: Option<&std::path::Path>,
    path: &std::path::Path,
) -> anyhow::Result<nkeys::KeyPair> {
    let Some(file) = key else {
        anyhow::bail!(
            "no deploy key: give --key FILE or set IDEM_SIGNING_KEY (`idem keygen FILE` makes one; its public key goes in [deploy] trusted_keys of every host's config)"
        );
    };
    let pair = read_seed(file, Role::Deploy).map_err(|e| anyhow::anyhow!("{e}"))?;
    let public = pair.public_key();
    if !config.deploy.trusted_keys.contains(&public) {
        anyhow::bail!(
            "the deploy key {} ({public}) is not in [deploy] trusted_keys of {}: hosts with this config would refuse what it signs; add it there (and to every host's config) first",
            file.display(),
            path.display()
        );
    }
    Ok(pair)
}

/// `d` signed with `key` for `handler`.
fn sign(key: &nkeys::KeyPair, handler: &str, d: &mut Deployment) -> anyhow::Result<()> {
    if d.note.len() > MAX_NOTE_BYTES {
        anyhow::bail!("--note is over {MAX_NOTE_BYTES} bytes; shorten it");
    }
    let mut cut = d.by.len().min(MAX_BY_BYTES);
    while !d.by.is_char_boundary(cut) {
        cut -= 1;
    }
    d.by.truncate(cut);
    crate::deploy::trust::sign(key, handler, d).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Runs `idem keygen`: a new deploy (or host) key, its seed written to a new
/// file readable by its owner only; prints its public key.
///
/// # Errors
/// One line: the file exists or cannot be written.
pub fn keygen(file: &Path, host: bool) -> anyhow::Result<()> {
    let role = if host { Role::Host } else { Role::Deploy };
    let public = generate(file, role).map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("{public}");
    Ok(())
}

/// Loads `bytes` as the handler's component would be loaded by a host
/// (same checks, same engine settings, the same compiled-code cache), on a
/// blocking thread.
pub(super) async fn validate(
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
pub(super) fn who() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    format!("{user}@{}", crate::deploy::heartbeat::hostname())
}

/// Prints `handler`'s deployments, oldest first, one a line: each with
/// the key that signed it, or why hosts refuse it (text from the record
/// escaped).
async fn history(store: &DeployStore, handler: &str) -> anyhow::Result<()> {
    let history = store.history(handler).await?;
    if history.records.is_empty() {
        println!("no deployments of `{handler}`");
    }
    for c in &history.records {
        let d = match &c.deployment {
            Ok(d) => d,
            Err(reason) => {
                println!(
                    "revision {}  not a deployment: {}",
                    c.revision,
                    escaped(reason, 200)
                );
                continue;
            }
        };
        let trust = match store.believe_in(handler, c, &history) {
            Ok(_) => format!("signed {}", d.signer),
            Err(r) => format!("REFUSED ({}: {r})", r.reason.label()),
        };
        println!(
            "revision {}  {}  {}  previous {}  by {}  {trust}{}",
            c.revision,
            bounded(&d.deployed_at),
            d.digest,
            d.previous.as_deref().unwrap_or("-"),
            if d.by.is_empty() {
                "-".to_owned()
            } else {
                bounded(&d.by)
            },
            if d.note.is_empty() {
                String::new()
            } else {
                format!("  note {}", escaped(&d.note, MAX_NOTE_BYTES))
            }
        );
    }
    Ok(())
}

/// The largest host report read (bytes of JSON).
const MAX_REPORT_BYTES: usize = 256 * 1024;

/// A live host's report and whether a key of `[deploy] trusted_hosts`
/// signed it.
pub(super) struct Report {
    /// Its key in the hosts bucket: what names the host on screen (a KV
    /// key holds only `A-Z a-z 0-9 - _ = . /`; the report's own `host`
    /// field is text its writer chose).
    pub key: String,
    /// The report as read from the hosts bucket.
    pub report: HostReport,
    /// Whether a trusted host key signed it, under its own name, and the
    /// broker stored it soon enough after it was made
    /// ([`HostReport::fresh`]).
    pub verified: bool,
    /// Signed by a trusted key but made too long before the broker stored
    /// it: put back after its host stopped, or from a host whose clock is
    /// far behind.
    pub stale: bool,
}

/// Every live host's report, by host id.
pub(super) async fn reports(store: &DeployStore) -> anyhow::Result<Vec<Report>> {
    let trusted: Vec<nkeys::KeyPair> = store
        .config()
        .trusted_hosts
        .iter()
        .filter_map(|k| public_key(k, Role::Host).ok())
        .collect();
    let keys: Vec<String> = match store.hosts().keys().await {
        Ok(keys) => keys.try_collect().await.unwrap_or_default(),
        Err(e) => anyhow::bail!("cannot list the hosts bucket: {e}"),
    };
    let mut reports = Vec::new();
    for key in keys {
        if let Ok(Some(entry)) = store.hosts().entry(&key).await
            && entry.operation == async_nats::jetstream::kv::Operation::Put
            && entry.value.len() <= MAX_REPORT_BYTES
            && let Ok(report) = serde_json::from_slice::<HostReport>(&entry.value)
        {
            let stored_ms =
                i64::try_from(entry.created.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
            let signed = report.verified(&key, &trusted);
            let fresh = report.fresh(stored_ms);
            reports.push(Report {
                key: key.clone(),
                report,
                verified: signed && fresh,
                stale: signed && !fresh,
            });
        }
    }
    reports.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(reports)
}

/// Runs `idem status`: one line per live host and handler (a host whose
/// report no key of `[deploy] trusted_hosts` signed is marked
/// `[unverified]`), then, when a handler of the config may publish or
/// call, what waits in the outbox per handler and target
/// (`super::outbox::status_text`).
///
/// # Errors
/// The broker cannot be reached or the buckets cannot be opened.
pub async fn status(config: &Path) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    let broker = crate::broker::connect(&config.broker).await?;
    let store = DeployStore::open(&broker, &config.deploy).await?;
    create_shadows(&store).await;
    let store = with_marks(&config, store).await;
    let reports = reports(&store).await?;
    if reports.is_empty() {
        println!("no live hosts");
    }
    // Per handler, the latest record the config's trusted keys vouch for.
    let mut deployed_of = std::collections::HashMap::new();
    for Report {
        key,
        report: r,
        verified,
        stale,
    } in reports
    {
        // Shown as verified only when a trusted host key signed it lately.
        let host = if verified {
            bounded(&key)
        } else if stale {
            format!("{} [unverified: stale report]", bounded(&key))
        } else {
            format!("{} [unverified]", bounded(&key))
        };
        for h in &r.handlers {
            if !deployed_of.contains_key(&h.name) {
                let believed = match store.history(&h.name).await {
                    Ok(history) => store
                        .deployed(&h.name, &history)
                        .await
                        .ok()
                        .flatten()
                        .map(|d| d.digest),
                    Err(_) => None,
                };
                deployed_of.insert(h.name.clone(), believed);
            }
            let deployed = match deployed_of.get(&h.name).cloned().flatten() {
                Some(d) if d == h.digest => " (deployed)".to_owned(),
                Some(d) => format!(" (deployed: {d})"),
                None => String::new(),
            };
            // A report is text from the broker: escaped and bounded.
            let refused = h
                .refused
                .as_ref()
                .map(|(d, reason)| format!(" refused {}: {}", bounded(d), escaped(reason, 400)))
                .unwrap_or_default();
            println!(
                "{} {} {}{deployed} in_flight={} processed={} duplicates={} dead_lettered={} since {}{refused}",
                host,
                bounded(&h.name),
                bounded(&h.digest),
                h.in_flight,
                h.processed,
                h.duplicates,
                h.dead_lettered,
                bounded(&r.started_at)
            );
        }
    }
    // Only where a handler may publish or call.
    if config
        .handlers
        .iter()
        .any(|h| !h.publish.is_empty() || !h.endpoints.is_empty())
    {
        print!(
            "{}",
            super::outbox::status_text(&config, STATUS_DATABASE_BOUND).await
        );
    }
    Ok(())
}

/// How long `idem status` waits for the database's outbox summary.
const STATUS_DATABASE_BOUND: std::time::Duration = std::time::Duration::from_secs(5);
