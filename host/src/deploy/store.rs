//! The buckets hot deploy uses on the broker: components in a JetStream
//! Object Store (named by their SHA-256), deployments in a KV bucket (key =
//! handler name, with history), and what each running host runs in a KV
//! bucket whose entries expire ([`super::heartbeat`]), and shadow
//! deployments in a KV bucket ([`crate::shadow`]). Each is created on
//! first use by whichever host or command gets there first. Which records
//! of the deployments bucket are believed is [`super::trust`]'s decision,
//! on the history read here.

use super::buckets::{open_kv, open_object_store};
use super::record::{Deployment, is_digest};
use super::trust::{Chain, Mark, Refused, Trust};
use crate::broker::Broker;
use crate::broker::unanswered::unanswered;
use crate::config::DeployConfig;
use crate::store::Database;
use anyhow::Context as _;
use async_nats::jetstream::{kv, object_store};
use futures::TryStreamExt as _;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt as _;

/// Deployments kept per handler in the KV history (`--history`, rollback).
pub const HISTORY: i64 = 64;
/// The largest component a host fetches (MiB): a bound on memory and on
/// the time a fetch takes, well above any handler (a Python one is about
/// 18 MiB, StarlingMonkey's 12 MiB).
pub const MAX_MODULE_MIB: u64 = 64;
/// How long a host's report stays in the hosts bucket without a refresh.
pub const HOST_REPORT_TTL: Duration = Duration::from_secs(15);

/// The four buckets, opened.
#[derive(Clone)]
pub struct DeployStore {
    deployments: kv::Store,
    modules: object_store::ObjectStore,
    hosts: kv::Store,
    /// The shadows bucket, opened (or created) on first use: a host that
    /// may not create buckets starts without it, and an installation
    /// that never shadow-deploys never makes it.
    shadows: Arc<tokio::sync::OnceCell<kv::Store>>,
    broker: Broker,
    names: DeployConfig,
    trust: Arc<Trust>,
    /// Whether the deployments bucket keeps what a chain check needs: its
    /// history per key, and no entry expires (else a key's first kept
    /// entry can never be shown to be its first).
    history_kept: Option<i64>,
    /// The database holding the handlers' high-water marks
    /// ([`DeployStore::with_marks`]); `None`: none is read or raised.
    marks: Option<Arc<Database>>,
}

/// A handler's history in the deployments bucket: the revisions of every
/// entry (deletes too) and the records among them.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Every revision kept, oldest first.
    pub chain: Chain,
    /// The put entries, oldest first.
    pub records: Vec<Current>,
}

/// The most records of one handler [`DeployStore::history`] keeps, the
/// latest ones (a bucket idem makes keeps 64 entries per key; one made by
/// someone else may keep any number).
pub const MAX_HISTORY_RECORDS: usize = 256;

/// A handler's key in the deployments bucket, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// The KV revision of the entry (what a compare-and-set expects).
    pub revision: u64,
    /// The deployment, or why the value is not one.
    pub deployment: Result<Deployment, String>,
}

impl Current {
    /// What stands in for the record of a handler whose key holds none
    /// (deleted, purged, or the bucket made again): above every revision,
    /// and no deployment.
    pub fn none() -> Self {
        Self {
            revision: u64::MAX,
            deployment: Err("the deployments bucket holds no record of this handler".into()),
        }
    }
}

/// Why recording a deployment failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Another deployment of the handler was recorded since it was read
    /// (compare-and-set on the KV revision failed).
    #[error(
        "another deployment of `{handler}` was recorded meanwhile (the deployments bucket moved past revision {expected}); look at `idem deploy --history {handler}` and deploy again"
    )]
    Stale {
        /// The handler.
        handler: String,
        /// The revision the deploy was based on (0: none).
        expected: u64,
    },
    /// The broker refused or did not answer.
    #[error("cannot record the deployment of `{handler}` in bucket {bucket}: {detail}")]
    Broker {
        /// The handler.
        handler: String,
        /// The deployments bucket.
        bucket: String,
        /// The broker's error.
        detail: String,
    },
}

impl DeployStore {
    /// Opens the buckets `names` lists, creating the missing ones; a request
    /// JetStream does not answer (a cluster electing a leader) is asked
    /// again ([`Broker::through_elections`]).
    ///
    /// # Errors
    /// One line naming the bucket the broker would not open or create (no
    /// JetStream, no permission, an invalid name), or that went unanswered
    /// for [`crate::broker::unanswered::ELECTION_GRACE`].
    pub async fn open(broker: &Broker, names: &DeployConfig) -> anyhow::Result<Self> {
        let deployments = open_kv(
            broker,
            kv::Config {
                bucket: names.deployments_bucket.clone(),
                description: "idem: deployed handler versions (key = handler)".into(),
                history: HISTORY,
                ..Default::default()
            },
        )
        .await?;
        let hosts = open_kv(
            broker,
            kv::Config {
                bucket: names.hosts_bucket.clone(),
                description: "idem: what each running host runs (expires)".into(),
                history: 1,
                max_age: HOST_REPORT_TTL,
                ..Default::default()
            },
        )
        .await?;
        let modules = open_object_store(broker, &names.modules_bucket).await?;
        let trust = Trust::new(&names.trusted_keys)
            .map_err(|e| anyhow::anyhow!("[deploy] trusted_keys: {e}"))?;
        // A bucket made by someone else may keep less, or let entries expire.
        let history_kept = match deployments.status().await {
            Ok(status) if status.max_age().is_zero() => Some(status.history()),
            _ => None,
        };
        Ok(DeployStore {
            deployments,
            modules,
            hosts,
            shadows: Arc::default(),
            broker: broker.clone(),
            names: names.clone(),
            trust: Arc::new(trust),
            history_kept,
            marks: None,
        })
    }

    /// This store, reading and raising the handlers' high-water marks in
    /// `db` (the hosts' database): what a host, `idem replay` and `idem
    /// dlq redrive` use, so none of them runs a record below the mark.
    pub fn with_marks(mut self, db: Arc<Database>) -> Self {
        self.marks = Some(db);
        self
    }

    /// `handler`'s high-water mark; `None` when it has none, or this store
    /// reads no database.
    ///
    /// # Errors
    /// One line: the database did not answer.
    pub async fn mark(&self, handler: &str) -> anyhow::Result<Option<Mark>> {
        let Some(db) = &self.marks else {
            return Ok(None);
        };
        let row = db.deploy_mark(handler).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot read the deployment high-water mark of `{handler}` in the database: {}",
                super::record::escaped(&e.to_string(), 300)
            )
        })?;
        Ok(row.map(|r| Mark {
            sequence: r.sequence,
            revision: r.revision,
            record: Deployment::parse(r.record.as_bytes()),
        }))
    }

    /// Raises `handler`'s high-water mark to `deployment` (believed, and
    /// put in place from `revision`) unless this host did already. A
    /// database that does not answer is logged; the next check raises it.
    pub async fn raise_mark(&self, handler: &str, revision: u64, deployment: &Deployment) {
        let Some(db) = &self.marks else { return };
        if deployment.sequence == 0 || self.trust.marked(handler, deployment.sequence) {
            return;
        }
        let record = String::from_utf8_lossy(&deployment.to_value()).into_owned();
        match db
            .raise_deploy_mark(handler, deployment.sequence, revision, &record)
            .await
        {
            Ok(_) => self.trust.mark_at(handler, deployment.sequence),
            Err(e) => {
                tracing::warn!(handler = %handler, error = %super::record::escaped(&e.to_string(), 300), "cannot raise the deployment high-water mark in the database; trying again at the next check");
            }
        }
    }

    /// The trusted deploy keys and what this host believed last.
    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    /// The `[deploy]` config the buckets were opened with.
    pub fn config(&self) -> &DeployConfig {
        &self.names
    }

    /// The deployments KV bucket (for a watch).
    pub fn deployments(&self) -> &kv::Store {
        &self.deployments
    }

    /// The hosts KV bucket.
    pub fn hosts(&self) -> &kv::Store {
        &self.hosts
    }

    /// The shadows KV bucket ([`crate::shadow::record`]), opened on first
    /// use; never created here (a host's NATS user may not create
    /// buckets: [`DeployStore::create_shadows`] does, for the deployer's
    /// commands).
    ///
    /// # Errors
    /// One line: the bucket does not exist (yet), or the broker would not
    /// open it.
    pub async fn shadows(&self) -> anyhow::Result<&kv::Store> {
        self.shadows
            .get_or_try_init(|| async {
                let bucket = &self.names.shadows_bucket;
                self.broker.js.get_key_value(bucket).await.map_err(|e| {
                    anyhow::anyhow!(
                        "cannot open KV bucket {bucket}: {e}; `idem status` or `idem deploy` (as the deployer) creates it"
                    )
                })
            })
            .await
    }

    /// The shadows KV bucket, created when missing (`idem status`, `idem
    /// deploy`).
    ///
    /// # Errors
    /// One line naming the bucket the broker would not open or create.
    pub async fn create_shadows(&self) -> anyhow::Result<&kv::Store> {
        self.shadows
            .get_or_try_init(|| {
                open_kv(
                    &self.broker,
                    kv::Config {
                        bucket: self.names.shadows_bucket.clone(),
                        description: "idem: shadow deployments (key = handler)".into(),
                        history: 1,
                        ..Default::default()
                    },
                )
            })
            .await
    }

    /// `handler`'s entry in the deployments bucket; `None` when it has
    /// none, or its last operation deleted it.
    ///
    /// # Errors
    /// The broker did not answer.
    pub async fn current(&self, handler: &str) -> anyhow::Result<Option<Current>> {
        let entry = self.deployments.entry(handler).await.with_context(|| {
            format!(
                "cannot read `{handler}` in bucket {}",
                self.names.deployments_bucket
            )
        })?;
        Ok(entry.and_then(current))
    }

    /// [`DeployStore::current`], asked again while JetStream does not
    /// answer ([`Broker::through_elections`]): what a starting host reads
    /// before it decides which version to run.
    ///
    /// # Errors
    /// The broker refused, or did not answer within the grace.
    pub async fn current_through_elections(
        &self,
        handler: &str,
    ) -> anyhow::Result<Option<Current>> {
        self.broker
            .through_elections(
                &format!("the deployments bucket's record of handler `{handler}`"),
                unanswered,
                || self.current(handler),
            )
            .await
    }

    /// The revision of `handler`'s last entry of any operation (what a new
    /// record replaces); 0 when it has none.
    ///
    /// # Errors
    /// The broker did not answer.
    pub async fn last_revision(&self, handler: &str) -> anyhow::Result<u64> {
        let entry = self.deployments.entry(handler).await.with_context(|| {
            format!(
                "cannot read `{handler}` in bucket {}",
                self.names.deployments_bucket
            )
        })?;
        Ok(entry.map_or(0, |e| e.revision))
    }

    /// Every entry of `handler` kept in the bucket, oldest first.
    ///
    /// # Errors
    /// The broker did not answer.
    pub async fn history(&self, handler: &str) -> anyhow::Result<History> {
        let bucket = &self.names.deployments_bucket;
        let history = match self.deployments.history(handler).await {
            Ok(h) => h,
            Err(e) if e.to_string().contains("no messages") => return Ok(History::default()),
            Err(e) => {
                anyhow::bail!("cannot read the history of `{handler}` in bucket {bucket}: {e}")
            }
        };
        // One entry at a time: a bucket someone made again may keep any
        // number of values of any size, and only the last
        // MAX_HISTORY_RECORDS records (each parsed within its size bound)
        // stay in memory.
        let mut history = std::pin::pin!(history);
        let mut revisions = Vec::new();
        let mut records = std::collections::VecDeque::new();
        while let Some(entry) = history
            .try_next()
            .await
            .with_context(|| format!("cannot read the history of `{handler}` in bucket {bucket}"))?
        {
            revisions.push(entry.revision);
            if let Some(record) = current(entry) {
                if records.len() == MAX_HISTORY_RECORDS {
                    records.pop_front();
                }
                records.push_back(record);
            }
        }
        let complete = self
            .history_kept
            .is_some_and(|kept| (revisions.len() as i64) < kept);
        Ok(History {
            chain: Chain {
                revisions,
                complete,
            },
            records: records.into(),
        })
    }

    /// Whether to believe `current`, `handler`'s latest record
    /// ([`Trust::check`] on its history, not behind what this host runs,
    /// [`Trust::not_behind`], and not below the handler's high-water mark,
    /// [`Trust::not_below`]). The judgement of a revision is remembered, so
    /// a record's history is read once; the mark is read each time.
    ///
    /// # Errors
    /// The history or the mark cannot be read (the broker or the database
    /// did not answer): nothing is judged, try again later.
    pub async fn believe(
        &self,
        handler: &str,
        current: &Current,
    ) -> anyhow::Result<Result<Deployment, Refused>> {
        let judged = match self.trust.remembered(handler, current.revision) {
            Some(judged) => judged,
            None => {
                let history = self.history(handler).await?;
                let judged = self.believe_in(handler, current, &history);
                self.trust.remember(handler, current.revision, &judged);
                judged
            }
        };
        let d = match judged.and_then(|d| {
            self.trust
                .not_behind(handler, current.revision, d.replaces, d.sequence)
                .map(|()| d)
        }) {
            Ok(d) => d,
            Err(refused) => return Ok(Err(refused)),
        };
        let mark = self.mark(handler).await?;
        Ok(Trust::not_below(&d, mark.as_ref()).map(|()| d))
    }

    /// What `handler`'s hosts run when they start now: the latest record
    /// of `history` to believe that is not below the handler's high-water
    /// mark, else the mark's own record. What `idem deploy` takes as the
    /// previous version (and `--rollback` goes back from) and `idem
    /// status` shows as deployed.
    ///
    /// # Errors
    /// The mark cannot be read (the database did not answer).
    pub async fn deployed(
        &self,
        handler: &str,
        history: &History,
    ) -> anyhow::Result<Option<Deployment>> {
        let mark = self.mark(handler).await?;
        let latest = history.records.iter().rev().find_map(|c| {
            let d = self.believe_in(handler, c, history).ok()?;
            Trust::not_below(&d, mark.as_ref()).ok().map(|()| d)
        });
        Ok(latest.or_else(|| {
            let m = mark?;
            let d = self.trust.check_signed(handler, &m.record).ok()?;
            (d.sequence == m.sequence).then_some(d)
        }))
    }

    /// [`Trust::check`] of `current` within `history` (read already).
    ///
    /// # Errors
    /// The refusal.
    pub fn believe_in(
        &self,
        handler: &str,
        current: &Current,
        history: &History,
    ) -> Result<Deployment, Refused> {
        self.trust.check(
            handler,
            &current.deployment,
            history.chain.before(current.revision),
        )
    }

    /// Stores `bytes` as object `digest` unless an object of that name and
    /// size is there already (content addressed: same name, same bytes).
    ///
    /// # Errors
    /// The broker refused the object.
    pub async fn put_module(&self, digest: &str, bytes: &[u8]) -> anyhow::Result<()> {
        // Content addressed, but only trusted once read back: a damaged
        // object under this name is replaced.
        if let Ok(info) = self.modules.info(digest).await
            && !info.deleted
            && info.size == bytes.len()
            && self
                .fetch_module(digest, Some(bytes.len() as u64))
                .await
                .is_ok()
        {
            return Ok(());
        }
        let mut reader = bytes;
        self.modules
            .put(digest, &mut reader)
            .await
            .with_context(|| {
                format!(
                    "cannot store the component in object store bucket {}",
                    self.names.modules_bucket
                )
            })?;
        Ok(())
    }

    /// The component `digest`, checked against its digest (and against
    /// `size`, the size its deployment record gives, before anything is
    /// read).
    ///
    /// # Errors
    /// One line: the object is missing, of another size than the record
    /// says, larger than [`MAX_MODULE_MIB`], cannot be read, or its bytes do
    /// not hash to `digest`.
    pub async fn fetch_module(&self, digest: &str, size: Option<u64>) -> anyhow::Result<Vec<u8>> {
        let bucket = &self.names.modules_bucket;
        if !is_digest(digest) {
            anyhow::bail!("`{digest}` is not a sha256 digest");
        }
        let max = MAX_MODULE_MIB * 1024 * 1024;
        let mut object = self.modules.get(digest).await.with_context(|| {
            format!("component {digest} is not in object store bucket {bucket}")
        })?;
        let stored = object.info().size as u64;
        if let Some(expected) = size
            && expected != stored
        {
            anyhow::bail!(
                "component {digest} in bucket {bucket} is {stored} bytes, not the {expected} its deployment record gives: refused"
            );
        }
        let size = stored;
        if size > max {
            anyhow::bail!(
                "component {digest} in bucket {bucket} is {size} bytes, over the {MAX_MODULE_MIB} MiB a host fetches"
            );
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        (&mut object)
            .take(max + 1)
            .read_to_end(&mut bytes)
            .await
            .with_context(|| format!("cannot read component {digest} from bucket {bucket}"))?;
        let got = hex::encode(Sha256::digest(&bytes));
        if got != digest {
            anyhow::bail!(
                "component {digest} in bucket {bucket} hashes to {got}: refused (damaged or replaced)"
            );
        }
        Ok(bytes)
    }

    /// Records `deployment` as `handler`'s, if the key's last revision is
    /// still the one it replaces (`deployment.replaces`; 0: the key has no
    /// entry). Returns the new revision.
    ///
    /// # Errors
    /// [`RecordError::Stale`] when another entry came first;
    /// [`RecordError::Broker`] otherwise.
    pub async fn record(&self, handler: &str, deployment: &Deployment) -> Result<u64, RecordError> {
        let expected = deployment.replaces;
        self.deployments
            .update(handler, deployment.to_value().into(), expected)
            .await
            .map_err(|e| {
                if e.kind() == kv::UpdateErrorKind::WrongLastRevision {
                    RecordError::Stale {
                        handler: handler.to_owned(),
                        expected,
                    }
                } else {
                    RecordError::Broker {
                        handler: handler.to_owned(),
                        bucket: self.names.deployments_bucket.clone(),
                        detail: e.to_string(),
                    }
                }
            })
    }
}

/// A KV entry as a [`Current`]; `None` for a delete or purge marker.
fn current(entry: kv::Entry) -> Option<Current> {
    (entry.operation == kv::Operation::Put).then(|| Current {
        revision: entry.revision,
        deployment: Deployment::parse(&entry.value),
    })
}
