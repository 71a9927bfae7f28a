//! Opening the deploy buckets ([`super::store::DeployStore::open`]): a
//! bucket is read, and created only when the broker answers that it does
//! not exist; a read or create JetStream does not answer (a cluster
//! electing a leader) is asked again ([`Broker::through_elections`]).

use crate::broker::Broker;
use crate::broker::unanswered::{stream_not_found, unanswered};
use async_nats::jetstream::{kv, object_store};
use std::future::Future;

/// Opens KV bucket `config.bucket` as [`open_or_create`] says.
///
/// # Errors
/// As [`open_or_create`].
pub(super) async fn open_kv(broker: &Broker, config: kv::Config) -> anyhow::Result<kv::Store> {
    let (js, config) = (&broker.js, &config);
    open_or_create(
        broker,
        &format!("KV bucket {}", config.bucket),
        || js.get_key_value(&config.bucket),
        || js.create_key_value(config.clone()),
    )
    .await
}

/// Opens object store bucket `bucket` (the components) as
/// [`open_or_create`] says.
///
/// # Errors
/// As [`open_or_create`].
pub(super) async fn open_object_store(
    broker: &Broker,
    bucket: &str,
) -> anyhow::Result<object_store::ObjectStore> {
    let js = &broker.js;
    open_or_create(
        broker,
        &format!("object store bucket {bucket}"),
        || js.get_object_store(bucket),
        || {
            js.create_object_store(object_store::Config {
                bucket: bucket.to_owned(),
                description: Some("idem: handler components by sha256".into()),
                ..Default::default()
            })
        },
    )
    .await
}

/// The bucket `what` names: `get`, and `create` only when the broker
/// answered that it does not exist (a create refused because another host
/// made it meanwhile is followed by a second `get`); all of it asked again
/// while JetStream does not answer ([`Broker::through_elections`]). A get
/// that goes unanswered is never followed by a create: a host may not
/// create buckets, and the bucket may exist with settings of its own.
///
/// # Errors
/// One line naming the bucket and what to check: the broker refused, or
/// did not answer within the grace.
async fn open_or_create<S, GE, CE, GF, CF>(
    broker: &Broker,
    what: &str,
    get: impl Fn() -> GF,
    create: impl Fn() -> CF,
) -> anyhow::Result<S>
where
    GE: std::error::Error + Send + Sync + 'static,
    CE: std::error::Error + Send + Sync + 'static,
    GF: Future<Output = Result<S, GE>>,
    CF: Future<Output = Result<S, CE>>,
{
    let (get, create) = (&get, &create);
    broker
        .through_elections(what, unanswered, || async move {
            let missing = match get().await {
                Ok(store) => return Ok(store),
                Err(e) => anyhow::Error::new(e),
            };
            if !stream_not_found(&missing) {
                return Err(missing);
            }
            match create().await {
                Ok(store) => Ok(store),
                // Another host may have created it meanwhile.
                Err(e) => get().await.map_err(|_| anyhow::Error::new(e)),
            }
        })
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot open or create {what}: {e}; check that the broker runs JetStream and allows idem to create buckets, or set [deploy] follow = false"
            )
        })
}
