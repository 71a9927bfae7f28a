//! Which version of a handler runs when a host (or `idem replay`, or
//! `idem dlq redrive`) starts: the deployed one when the deployments bucket
//! has a record for it the host believes ([`super::trust`]), else the
//! config's `module`. Without `[deploy] trusted_keys`, always the config's;
//! and for a handler with `watch = true`, whose module file is its one
//! source of versions ([`super::watch`]: a file and the bucket followed
//! together would take turns), always the file.

use super::follow::{Followed, NO_TRUSTED_KEYS, apply, apply_believed};
use super::store::{Current, DeployStore};
use super::trust::{Mark, Trust};
use crate::config::{Config, HandlerConfig};
use crate::pipeline::step::PreparedHandler;
use crate::store::Database;
use std::sync::Arc;

/// What a host with trusted deploy keys says at start of a handler with
/// `watch = true`.
pub const WATCHED_NOT_FOLLOWED: &str = "`watch = true`: this handler runs its module file and does not follow `idem deploy` (a file and the deployments bucket would take turns); remove `watch` to follow deployments";

/// At start, puts `handler`'s deployed version in place when the
/// deployments bucket has one (else it keeps the config's `module`).
/// `cfg.name` is the deployments key. A deployed version that is refused
/// or cannot be fetched or loaded is reported, and the host runs the record
/// of the handler's high-water mark (what its hosts ran last, kept in the
/// database: it may be missing from a bucket whose history was cut), else
/// the most recent earlier deployment that loads and is not below the
/// mark, which is what the hosts that refused the same record keep
/// running. A bucket with no record of a handler that has a mark (the key
/// deleted or purged, the bucket made again) is the same case. The refusal
/// stays in the slot, so `idem status` shows it and the follower tries the
/// record again later ([`super::follow::RETRY_REFUSED`]).
///
/// The config's module runs only when nothing was ever deployed (no mark)
/// or it is the version the mark names: below the mark it is an older
/// version, and nothing the broker is made to forget takes a host back.
///
/// # Errors
/// One line: the handler has a mark and no version at or above it can be
/// run (its record no longer verifies, its component is gone or does not
/// load), with what to do.
pub async fn use_deployed(
    store: &DeployStore,
    cfg: &HandlerConfig,
    handler: &PreparedHandler,
) -> anyhow::Result<()> {
    if store.trust().is_empty() {
        return Ok(());
    }
    if cfg.watch {
        tracing::warn!(handler = %cfg.name, module = %cfg.module.display(), "{WATCHED_NOT_FOLLOWED}");
        return Ok(());
    }
    let current = match store.current_through_elections(&cfg.name).await {
        Ok(current) => current,
        Err(e) => {
            tracing::warn!(handler = %cfg.name, error = %format!("{e:#}"), "cannot read the deployments bucket; running the config's module until it can be read");
            return Ok(());
        }
    };
    let followed = Followed::of(cfg, handler);
    let e = match &current {
        Some(current) => match apply(store, &followed, current).await {
            Ok(_) => return Ok(()),
            Err(e) => e,
        },
        None => "the deployments bucket holds no record of this handler (deleted, purged, or the bucket made again)".to_owned(),
    };
    // Without a mark that can be read, nothing earlier is run: it might be
    // below it.
    let mark = match store.mark(&cfg.name).await {
        Ok(mark) => mark,
        Err(read) => {
            if current.is_some() {
                tracing::warn!(handler = %cfg.name, error = %e, "the deployed version is refused and the database's high-water mark cannot be read ({read:#}); running the config's module");
            } else {
                tracing::warn!(handler = %cfg.name, error = %format!("{read:#}"), "the deployments bucket holds no record of this handler and the database's high-water mark cannot be read; running the config's module");
            }
            return Ok(());
        }
    };
    let Some(current) = current.or_else(|| mark.is_some().then(Current::none)) else {
        // Never deployed: the config's module is the version.
        return Ok(());
    };
    let refused = handler.slot().refused();
    let config_digest = handler.slot().current().digest().to_owned();
    let history = store.history(&cfg.name).await.unwrap_or_default();
    // The version a believed record names, and failed to load, is not
    // tried again; one an unbelieved record names may be a good one.
    let mut tried = std::collections::HashSet::new();
    if let Ok(d) = store.believe_in(&cfg.name, &current, &history)
        && Trust::not_below(&d, mark.as_ref()).is_ok()
    {
        tried.insert(d.digest);
    }
    // The mark's record first: what this handler's hosts ran last.
    let marked = mark.as_ref().and_then(|m| {
        let d = store.trust().check_signed(&cfg.name, &m.record).ok()?;
        (d.sequence == m.sequence).then_some((m.revision, d))
    });
    let earlier = history
        .records
        .iter()
        .rev()
        .filter(|c| c.revision < current.revision)
        // Only a record to believe where it stands, and not below the
        // mark, is a version to fall back to.
        .filter_map(|c| {
            let d = store.believe_in(&cfg.name, c, &history).ok()?;
            Trust::not_below(&d, mark.as_ref()).ok()?;
            Some((c.revision, d))
        });
    let mut fallback = None;
    let mut config_is_at_mark = false;
    for (revision, d) in marked.into_iter().chain(earlier) {
        if !tried.insert(d.digest.clone()) {
            continue;
        }
        if d.digest == config_digest {
            config_is_at_mark = true;
            break;
        }
        if apply_believed(store, &followed, revision, &d).await.is_ok() {
            fallback = Some((revision, d.digest.clone()));
            break;
        }
    }
    if let Some(r) = refused {
        handler.slot().refuse(&r.digest, &r.reason, r.revision);
    }
    match (fallback, &mark) {
        (Some((revision, digest)), _) => {
            tracing::warn!(handler = %cfg.name, error = %e, revision, digest = %digest, "the deployed version is refused; running what this handler's hosts ran last (the database's high-water mark), or else the most recent earlier deployment that loads");
            Ok(())
        }
        (None, Some(m)) if !config_is_at_mark => Err(below_mark(cfg, m, &e)),
        (None, _) => {
            tracing::warn!(handler = %cfg.name, error = %e, "the deployed version is refused; running the config's module");
            Ok(())
        }
    }
}

/// Why a handler with a mark cannot start: nothing at or above the mark
/// runs, and the config's module is below it.
fn below_mark(cfg: &HandlerConfig, mark: &Mark, why: &str) -> anyhow::Error {
    let digest = mark
        .record
        .as_ref()
        .map_or_else(|_| "?".to_owned(), |d| d.digest.clone());
    anyhow::anyhow!(
        "handler `{}`: cannot run {digest}, the version its hosts ran last (sequence {}, the database's high-water mark): {}; the config's module is older and is not run in its place; deploy a version with `idem deploy {} FILE`, or to go back to the config's module delete the mark: DELETE FROM idem_deploy_marks WHERE handler = '{}'",
        cfg.name,
        mark.sequence,
        super::record::escaped(why, 400),
        cfg.name,
        cfg.name.replace('\'', "''")
    )
}

/// [`use_deployed`] for a command that runs a handler outside a host
/// (`idem replay`, `idem dlq redrive`), so it runs what the hosts run: with
/// `config`'s `[deploy] follow`, over a broker connection of its own and
/// with the high-water marks in `db`; a no-op without it.
///
/// # Errors
/// One line: the broker cannot be reached or its buckets cannot be
/// opened, with what to do; or as [`use_deployed`].
pub async fn use_deployed_via_broker(
    config: &Config,
    cfg: &HandlerConfig,
    handler: &PreparedHandler,
    db: &Arc<Database>,
) -> anyhow::Result<()> {
    if !config.deploy.follow {
        return Ok(());
    }
    if config.deploy.trusted_keys.is_empty() {
        tracing::warn!("{NO_TRUSTED_KEYS}");
        return Ok(());
    }
    if cfg.watch {
        tracing::warn!(handler = %cfg.name, module = %cfg.module.display(), "{WATCHED_NOT_FOLLOWED}");
        return Ok(());
    }
    let store = async {
        let nats = crate::broker::connect(&config.broker).await?;
        anyhow::Ok(
            DeployStore::open(&nats, &config.deploy)
                .await?
                .with_marks(db.clone()),
        )
    }
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "cannot read which version of handler `{}` is deployed: {e:#}; start the broker, or set [deploy] follow = false to use the config's module",
            cfg.name
        )
    })?;
    use_deployed(&store, cfg, handler).await
}
