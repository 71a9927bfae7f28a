//! The streams and messages tests put in their private `nats-server`
//! ([`Nats`], from `idem-test-support`).

use crate::Nats;
use std::time::Duration;

/// Publishes one message (optionally with headers) and waits for the stream's ack.
pub async fn publish(
    js: &async_nats::jetstream::Context,
    subject: &str,
    payload: &str,
    headers: &[(&str, &str)],
) {
    let mut h = async_nats::HeaderMap::new();
    for (k, v) in headers {
        h.insert(*k, *v);
    }
    js.publish_with_headers(subject.to_string(), h, payload.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Creates stream `name` over `subjects`, so several handlers can share it
/// with different filter subjects (the host creates a missing stream with the
/// first handler's subjects only). Its `max_age` is 7 days, idem's default
/// retention, so a host with the default starts on it.
pub async fn create_stream(nats: &Nats, name: &str, subjects: &[&str]) {
    create_stream_with_max_age(nats, name, subjects, DEFAULT_RETENTION).await;
}

/// idem's default `retention`.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// [`create_stream`] with the given `max_age` (`Duration::ZERO`: kept for ever).
pub async fn create_stream_with_max_age(
    nats: &Nats,
    name: &str,
    subjects: &[&str],
    max_age: Duration,
) {
    nats.jetstream()
        .await
        .create_stream(async_nats::jetstream::stream::Config {
            name: name.into(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            max_age,
            ..Default::default()
        })
        .await
        .unwrap();
}
