//! `idem deploy HANDLER MODULE --shadow [--sample P]`, `--shadow-report`
//! and `--abort`: the operator's side of shadow deploys ([`crate::shadow`];
//! `--promote` is a deploy, in [`super::deploy`]).
//!
//! A shadow deploy validates the candidate as a deploy does, stores it in
//! the modules bucket, and writes a record signed with the deploy key to
//! the shadows bucket naming the version live now: hosts run the candidate
//! next to that version only. The report adds up what every live host
//! reports of it.

use super::deploy::{Report, reports, validate, who};
use crate::config::{Config, HandlerConfig};
use crate::deploy::Deployment;
use crate::deploy::record::{bounded, escaped};
use crate::deploy::store::DeployStore;
use crate::runtime::LoadOptions;
use crate::shadow::record::{ALL_PPM, ShadowRecord};
use crate::shadow::{ShadowReport, compare::Side};
use async_nats::jetstream::kv::Operation;
use sha2::{Digest, Sha256};
use std::path::Path;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Parses `--sample`: a share of messages as a fraction (`0.25`) or a
/// percentage (`25%`), above 0 and at most all of them; in parts per
/// million.
///
/// # Errors
/// One line: not a number, or not above 0 and at most 1 (100%).
pub fn parse_sample(text: &str) -> Result<u32, String> {
    let (number, scale) = match text.trim().strip_suffix('%') {
        Some(p) => (p, 100.0),
        None => (text.trim(), 1.0),
    };
    let share = number
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map(|f| f / scale)
        .ok_or_else(|| format!("`{text}` is not a share of messages: give 0.25 or 25%"))?;
    if share <= 0.0 || share > 1.0 {
        return Err(format!(
            "`{text}` is not a share of messages above 0 and at most 1 (100%)"
        ));
    }
    if share < 1.0 / f64::from(ALL_PPM) {
        return Err(format!(
            "`{text}` is below the smallest sample, one message in a million (0.0001%)"
        ));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // within 1..=1e6
    let ppm = ((share * f64::from(ALL_PPM)).round() as u32).clamp(1, ALL_PPM);
    Ok(ppm)
}

/// `ppm` as a percentage for people: `25%`, `0.1%`.
fn percent(ppm: u32) -> String {
    format!("{}%", f64::from(ppm) / 10_000.0)
}

/// The digest `handler` runs now: its latest believed deployment, else its
/// configured module's.
async fn live_digest(store: &DeployStore, h: &HandlerConfig) -> anyhow::Result<String> {
    let history = store.history(&h.name).await?;
    live_of(store.deployed(&h.name, &history).await?.as_ref(), h)
}

/// The digest `h` runs when `running` is its latest believed deployment:
/// that one's, else its configured module's.
///
/// # Errors
/// No deployment, and the module cannot be read.
pub(super) fn live_of(running: Option<&Deployment>, h: &HandlerConfig) -> anyhow::Result<String> {
    if let Some(d) = running {
        return Ok(d.digest.clone());
    }
    let module = std::fs::read(&h.module).map_err(|e| {
        anyhow::anyhow!(
            "`{}` has no deployment and its module {} cannot be read ({e})",
            h.name,
            h.module.display()
        )
    })?;
    Ok(hex::encode(Sha256::digest(&module)))
}

/// Deploys `module` as `h`'s shadow candidate for `sample_ppm` of its
/// messages, signed with `key`.
///
/// # Errors
/// One line: the module cannot be read or does not load as the handler's
/// (nothing is written), it is what the handler runs already, or the
/// broker refused.
pub async fn deploy(
    config: &Config,
    store: &DeployStore,
    h: &HandlerConfig,
    module: &Path,
    sample_ppm: u32,
    key: &nkeys::KeyPair,
) -> anyhow::Result<()> {
    if h.watch {
        anyhow::bail!(
            "`{}` has watch = true: its hosts run its module file and follow no deployments, shadows included; turn watch off to deploy through the broker",
            h.name
        );
    }
    let bytes = std::fs::read(module)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", module.display()))?;
    validate(config, &bytes, module, LoadOptions { wasi: h.wasi }).await?;
    store.create_shadows().await?;
    let digest = hex::encode(Sha256::digest(&bytes));
    let against = live_digest(store, h).await?;
    if digest == against {
        anyhow::bail!(
            "{digest} is what `{}` runs already; a shadow compares another version with it",
            h.name
        );
    }
    store.put_module(&digest, &bytes).await?;
    let mut record = ShadowRecord {
        handler: String::new(),
        digest: digest.clone(),
        size: bytes.len() as u64,
        against: against.clone(),
        sample_ppm,
        deployed_at: OffsetDateTime::now_utc()
            .format(&Rfc3339)
            .unwrap_or_default(),
        by: who(),
        signer: String::new(),
        signature: String::new(),
    };
    record
        .sign(key, &h.name)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let revision = store
        .shadows()
        .await?
        .put(&h.name, record.to_value().into())
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot write the shadow record to bucket {}: {e}",
                store.config().shadows_bucket
            )
        })?;
    println!(
        "shadow of `{}`: {digest} runs next to {against} on {} of messages, always rolled back (revision {revision}); `idem deploy {} --shadow-report` shows what differs, `--promote` makes it live, `--abort` drops it",
        h.name,
        percent(sample_ppm),
        h.name
    );
    Ok(())
}

/// A shadow record as read: its KV revision, and the record, or why it is
/// not one hosts run.
pub type Current = (u64, Result<ShadowRecord, String>);

/// `h`'s shadow record, if its key holds one.
///
/// # Errors
/// The broker did not answer.
pub async fn current(store: &DeployStore, handler: &str) -> anyhow::Result<Option<Current>> {
    let entry = store.shadows().await?.entry(handler).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot read `{handler}` in bucket {}: {e}",
            store.config().shadows_bucket
        )
    })?;
    Ok(entry.filter(|e| e.operation == Operation::Put).map(|e| {
        let record = ShadowRecord::parse(&e.value)
            .and_then(|r| r.believed(handler, store.trust()).map(|()| r));
        (e.revision, record)
    }))
}

/// Deletes `handler`'s shadow record if the key's last revision is still
/// `revision` (one written meanwhile is left alone).
///
/// # Errors
/// Another record came first, or the broker refused.
pub async fn delete(store: &DeployStore, handler: &str, revision: u64) -> anyhow::Result<()> {
    store
        .shadows()
        .await?
        .delete_expect_revision(handler, Some(revision))
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot delete `{handler}` at revision {revision} in bucket {} ({e}): another shadow record may have come first; `idem deploy {handler} --shadow-report` shows it",
                store.config().shadows_bucket
            )
        })
}

/// Drops `handler`'s shadow: its key is deleted, and every host takes the
/// candidate out within [`crate::shadow::follow::POLL`].
///
/// # Errors
/// The broker refused.
pub async fn abort(store: &DeployStore, handler: &str) -> anyhow::Result<()> {
    let Some((revision, record)) = current(store, handler).await? else {
        anyhow::bail!("`{handler}` has no shadow deployment to abort");
    };
    delete(store, handler, revision).await?;
    match record {
        Ok(r) => println!(
            "shadow of `{handler}` dropped ({} no longer runs)",
            r.digest
        ),
        Err(_) => println!("shadow record of `{handler}` deleted"),
    }
    Ok(())
}

/// Prints `handler`'s shadow deployment and what each live host reports
/// of it, then the totals and the divergent messages, statement by
/// statement. With `[deploy] trusted_hosts`, only the reports a trusted
/// host key signed are added up (the others are listed as unverified).
///
/// # Errors
/// The broker cannot be read, or the handler has no shadow deployment.
pub async fn report(store: &DeployStore, handler: &str) -> anyhow::Result<()> {
    let (revision, record) = match current(store, handler).await? {
        None => anyhow::bail!(
            "`{handler}` has no shadow deployment (`idem deploy {handler} MODULE --shadow` makes one)"
        ),
        Some((_, Err(why))) => anyhow::bail!(
            "the shadow record of `{handler}` is not one hosts run: {}",
            escaped(&why, 300)
        ),
        Some((revision, Ok(r))) => (revision, r),
    };
    println!(
        "shadow of `{handler}`: candidate {} against live {}, sample {}, deployed {} by {}",
        record.digest,
        record.against,
        percent(record.sample_ppm),
        bounded(&record.deployed_at),
        bounded(&record.by)
    );
    let verified_only = !store.config().trusted_hosts.is_empty();
    let mut total = ShadowReport {
        candidate: record.digest.clone(),
        against: record.against.clone(),
        sample_ppm: record.sample_ppm,
        revision: 0,
        active: false,
        compared: 0,
        agreed: 0,
        diverged: 0,
        skipped: 0,
        refused: None,
        divergences: Vec::new(),
    };
    let mut divergent = Vec::new();
    let mut hosts = 0;
    for Report {
        key,
        report,
        verified,
        ..
    } in reports(store).await?
    {
        let Some(h) = report.handlers.iter().find(|h| h.name == handler) else {
            continue;
        };
        let counted = verified || !verified_only;
        let mark = if verified {
            ""
        } else if verified_only {
            " [unverified: not counted]"
        } else {
            " [unverified]"
        };
        let host = bounded(&key);
        let Some(s) = h.shadow.as_ref() else {
            println!("{host}{mark}: runs {} and no candidate", bounded(&h.digest));
            continue;
        };
        if let Some((what, why)) = &s.refused {
            println!(
                "{host}{mark}: refused {}: {}",
                bounded(what),
                escaped(why, 300)
            );
            continue;
        }
        if s.candidate != record.digest || s.revision != revision {
            println!(
                "{host}{mark}: runs candidate {} (not this record's yet)",
                bounded(&s.candidate)
            );
            continue;
        }
        let state = if s.active {
            "active".to_owned()
        } else {
            format!(
                "inactive: the host runs {}, not the version the shadow was deployed against",
                bounded(&h.digest)
            )
        };
        println!(
            "{host}{mark}: compared {}, agreed {}, diverged {}, skipped {} ({state})",
            s.compared, s.agreed, s.diverged, s.skipped
        );
        if counted {
            hosts += 1;
            // Numbers from the hosts bucket: added without overflow.
            total.compared = total.compared.saturating_add(s.compared);
            total.agreed = total.agreed.saturating_add(s.agreed);
            total.diverged = total.diverged.saturating_add(s.diverged);
            total.skipped = total.skipped.saturating_add(s.skipped);
            divergent.extend(s.divergences.iter().map(|d| (host.clone(), d.clone())));
        }
    }
    println!(
        "total over {hosts} host(s): compared {}, agreed {}, diverged {}, skipped {}",
        total.compared, total.agreed, total.diverged, total.skipped
    );
    if divergent.is_empty() {
        return Ok(());
    }
    println!(
        "divergent messages (the first {} per host):",
        crate::shadow::MAX_KEPT_DIVERGENCES
    );
    for (host, d) in &divergent {
        // Text from the hosts bucket: escaped again, whoever wrote it.
        println!(
            "  message {} (stream sequence {}, subject {}, host {host}): {}",
            escaped(&d.message_id, 200),
            d.stream_sequence,
            escaped(&d.subject, 200),
            escaped(&d.what, 200)
        );
        print_side("live", &d.live);
        print_side("candidate", &d.candidate);
    }
    Ok(())
}

fn print_side(name: &str, side: &Side) {
    println!(
        "    {name}: {} ({} statement(s))",
        escaped(&side.verdict, 300),
        side.total
    );
    for (i, line) in side.statements.iter().enumerate() {
        println!(
            "      #{} {}",
            side.first.saturating_add(i),
            escaped(line, 600)
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_sample_is_a_fraction_or_a_percentage() {
        assert_eq!(parse_sample("1"), Ok(ALL_PPM));
        assert_eq!(parse_sample("100%"), Ok(ALL_PPM));
        assert_eq!(parse_sample("0.25"), Ok(250_000));
        assert_eq!(parse_sample("25%"), Ok(250_000));
        assert_eq!(parse_sample("0.0001%"), Ok(1));
        assert_eq!(percent(250_000), "25%");
        assert_eq!(percent(1_000), "0.1%");
        assert_eq!(percent(1), "0.0001%");
        assert_eq!(percent(333_333), "33.3333%");
        for bad in [
            "0", "0%", "1.5", "101%", "-1", "x", "NaN", "inf", "1e-9", "0.00001%",
        ] {
            assert!(parse_sample(bad).is_err(), "{bad}");
        }
    }
}
