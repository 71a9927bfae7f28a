//! Opening the deploy buckets ([`super::store::DeployStore::open`]): a
//! bucket is read, and created only when the broker answers that it does
//! not exist; a read or create JetStream does not answer (a cluster
//! electing a leader) is asked again ([`Broker::through_elections`]).

use crate::broker::Broker;
use crate::broker::unanswered::{stream_not_found, unanswered};
use async_nats::jetstream::{kv, object_store};

/// Opens KV bucket `config.bucket`, creating it when the broker says it
/// does not exist; asked again while JetStream does not answer
/// ([`Broker::through_elections`]). A get that goes unanswered is never
/// followed by a create: a host may not create buckets, and the bucket may
/// exist with settings of its own.
///
/// # Errors
/// One line naming the bucket and what to check: the broker refused, or
/// did not answer within the grace.
pub(super) async fn open_kv(broker: &Broker, config: kv::Config) -> anyhow::Result<kv::Store> {
    let (js, bucket, config) = (&broker.js, config.bucket.as_str(), &config);
    broker
        .through_elections(&format!("KV bucket {bucket}"), unanswered, || async move {
            let missing = match js.get_key_value(bucket).await {
                Ok(store) => return Ok(store),
                Err(e) => anyhow::Error::new(e),
            };
            if !stream_not_found(&missing) {
                return Err(missing);
            }
            match js.create_key_value(config.clone()).await {
                Ok(store) => Ok(store),
                // Another host may have created it meanwhile.
                Err(e) => js
                    .get_key_value(bucket)
                    .await
                    .map_err(|_| anyhow::Error::new(e)),
            }
        })
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot open or create KV bucket {bucket}: {e}; check that the broker runs JetStream and allows idem to create buckets, or set [deploy] follow = false"
            )
        })
}

/// Opens object store bucket `bucket` (the components) as [`open_kv`]
/// opens a KV bucket.
///
/// # Errors
/// As [`open_kv`].
pub(super) async fn open_object_store(
    broker: &Broker,
    bucket: &str,
) -> anyhow::Result<object_store::ObjectStore> {
    let js = &broker.js;
    broker
        .through_elections(
            &format!("object store bucket {bucket}"),
            unanswered,
            || async move {
                let missing = match js.get_object_store(bucket).await {
                    Ok(store) => return Ok(store),
                    Err(e) => anyhow::Error::new(e),
                };
                if !stream_not_found(&missing) {
                    return Err(missing);
                }
                let config = object_store::Config {
                    bucket: bucket.to_owned(),
                    description: Some("idem: handler components by sha256".into()),
                    ..Default::default()
                };
                match js.create_object_store(config).await {
                    Ok(store) => Ok(store),
                    // Another host may have created it meanwhile.
                    Err(e) => js
                        .get_object_store(bucket)
                        .await
                        .map_err(|_| anyhow::Error::new(e)),
                }
            },
        )
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot open or create object store bucket {bucket}: {e}; check that the broker runs JetStream and allows idem to create buckets, or set [deploy] follow = false"
            )
        })
}
