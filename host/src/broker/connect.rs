//! Connecting to the broker with what `[broker]` configures: the URL, one
//! authentication method, TLS. A failed first connection is reported as
//! what it was (credentials refused, TLS failed, server unreachable) in one
//! line that names the `[broker]` keys to check and never a secret.

use super::Broker;
use crate::config::{BrokerAuth, BrokerConfig};
use anyhow::Context as _;
use async_nats::jetstream;
use std::time::Duration;
use tokio::sync::watch;

/// How long the first connection may take before `connect` gives up.
const FIRST_CONNECT: Duration = Duration::from_secs(10);

/// Connects to the broker at `broker.url` with its credentials and TLS
/// settings. The client reconnects by itself for ever after a lost
/// connection.
///
/// # Errors
/// One line naming the URL (password masked) and what to check: the
/// server refused the credentials, the TLS handshake failed, a `.creds`
/// file cannot be used, or no server answered within 10 s.
pub async fn connect(broker: &BrokerConfig) -> anyhow::Result<Broker> {
    let shown = crate::secret::redact_url(&broker.url);
    let (count, mut connections) = watch::channel(0u64);
    let (seen_error, last_error) = watch::channel(None::<String>);
    let (denied, denials) = watch::channel(0u64);
    let mut error_seen = last_error.clone();
    let options = with_credentials(async_nats::ConnectOptions::new(), broker)
        .await?
        .name("idem")
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .event_callback(move |event| {
            let count = count.clone();
            let seen_error = seen_error.clone();
            let denied = denied.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        count.send_modify(|n| *n += 1);
                        tracing::info!("connected to NATS");
                    }
                    async_nats::Event::Disconnected => {
                        tracing::warn!("disconnected from NATS; reconnecting");
                    }
                    async_nats::Event::ClientError(e) => {
                        tracing::debug!(error = %e, "NATS client error");
                        seen_error.send_replace(Some(worded(&e)));
                    }
                    async_nats::Event::ServerError(e) => {
                        tracing::warn!(error = %e, "NATS server error");
                        if is_permissions_violation(&e) {
                            denied.send_modify(|n| *n += 1);
                        }
                        seen_error.send_replace(Some(worded(&e)));
                    }
                    other => tracing::debug!(event = %other, "NATS client event"),
                }
            }
        });
    let client = options
        .connect(broker.servers())
        .await
        .with_context(|| format!("cannot connect to NATS at {shown}; check [broker] url and that nats-server runs with -js"))?;
    // `retry_on_initial_connect` returns at once; prove the server answers.
    // The client's error events carry only a kind ("IO error" for a failed
    // TLS handshake too), so at the first one a single plain connection
    // attempt tells what it is: refused credentials or a failed TLS
    // handshake will not mend by retrying, and stop the start at once;
    // anything else waits for the server until the deadline.
    let probe = client.clone();
    let flush = tokio::time::timeout(FIRST_CONNECT, probe.flush());
    tokio::pin!(flush);
    let mut diagnosed = false;
    loop {
        tokio::select! {
            flushed = &mut flush => match flushed {
                Ok(Ok(())) => break,
                Ok(Err(e)) => anyhow::bail!("cannot reach NATS at {shown}: {e}"),
                Err(_) => {
                    // The server may have come up since the first error,
                    // refusing: ask once more what a connection meets now.
                    let last = match diagnose(broker).await {
                        Some(detail) => Some(detail),
                        None => last_error.borrow().clone(),
                    };
                    anyhow::bail!("{}", first_connect_failure(broker, &shown, last.as_deref()));
                }
            },
            Ok(()) = error_seen.changed(), if !diagnosed => {
                diagnosed = true;
                let seen = error_seen.borrow_and_update().clone().unwrap_or_default();
                let detail = if failure_kind(&seen) == Failure::Unreachable {
                    diagnose(broker).await
                } else {
                    Some(seen)
                };
                if let Some(detail) = detail.filter(|d| failure_kind(d) != Failure::Unreachable) {
                    anyhow::bail!("{}", first_connect_failure(broker, &shown, Some(&detail)));
                }
            }
        }
    }
    // The client reports its first connection from another task, possibly
    // after the pull streams have started; seen then, it would read as a
    // reconnect and drop a pull stream with messages in it (they would wait
    // out `ack_wait`). Wait for it here and mark it seen, so only later
    // connections count as reconnects.
    if tokio::time::timeout(Duration::from_secs(5), connections.wait_for(|n| *n >= 1))
        .await
        .is_err()
    {
        tracing::debug!("the client's first connected event did not arrive within 5s");
    }
    Ok(Broker {
        js: jetstream::new(client),
        connections,
        denials,
    })
}

/// Whether the server's error is a permissions violation: nats-server
/// drops a message whose subject the connection may not publish (or
/// subscribe) and sends `-ERR 'Permissions Violation for Publish to
/// "<subject>"'` (nats-server `server/client.go`, `pubPermissionViolation`).
fn is_permissions_violation(e: &async_nats::ServerError) -> bool {
    matches!(e, async_nats::ServerError::Other(text)
        if text.to_ascii_lowercase().contains("permissions violation"))
}

/// An error event's text without async-nats' `nats: ` prefix (which some
/// of its errors carry and others not).
fn worded(error: &impl std::fmt::Display) -> String {
    let text = error.to_string();
    match text.strip_prefix("nats: ") {
        Some(rest) => rest.to_owned(),
        None => text,
    }
}

/// What a client error (as async-nats words it) says about a connection
/// that does not come up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// The server refused the credentials, or the nonce could not be signed.
    Refused,
    /// The TLS handshake or TLS set-up failed.
    Tls,
    /// Anything else: no server answered, the connection dropped.
    Unreachable,
}

fn failure_kind(error: &str) -> Failure {
    let lower = error.to_ascii_lowercase();
    if lower.contains("authorization violation")
        || lower.contains("authentication")
        || lower.contains("signing nonce")
    {
        Failure::Refused
    } else if [
        "tls",
        "certificate",
        "handshake",
        "alert",
        "corrupt message",
        "invalidcontenttype",
    ]
    .iter()
    .any(|w| lower.contains(w))
    {
        Failure::Tls
    } else {
        Failure::Unreachable
    }
}

/// One connection attempt without retries, with the same settings, for
/// its error's full text (kind and cause: `IO error: invalid peer
/// certificate: UnknownIssuer`); `None` when it connects or cannot be built.
async fn diagnose(broker: &BrokerConfig) -> Option<String> {
    let options = with_credentials(async_nats::ConnectOptions::new(), broker)
        .await
        .ok()?
        .connection_timeout(Duration::from_secs(5));
    match options.connect(broker.servers()).await {
        Ok(client) => {
            drop(client);
            None
        }
        Err(e) => Some(worded(&e)),
    }
}

/// `options` with `broker`'s authentication method and TLS settings.
async fn with_credentials(
    mut options: async_nats::ConnectOptions,
    broker: &BrokerConfig,
) -> anyhow::Result<async_nats::ConnectOptions> {
    options = match broker.auth() {
        BrokerAuth::None => options,
        BrokerAuth::Token(token) => options.token(token.expose().to_owned()),
        BrokerAuth::UserPassword { user, password } => {
            options.user_and_password(user.to_owned(), password.expose().to_owned())
        }
        BrokerAuth::NKey(seed) => options.nkey(seed.expose().to_owned()),
        BrokerAuth::Creds(path) => options.credentials_file(path).await.map_err(|e| {
            // The io error names the file or the part that did not parse,
            // never the JWT or the seed.
            anyhow::anyhow!(
                "cannot use [broker] creds_file {}: {e}; it must hold a user JWT and its NKey seed, as `nsc generate creds` writes them",
                path.display()
            )
        })?,
    };
    if let Some(ca) = &broker.tls_ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&broker.tls_cert_file, &broker.tls_key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options.require_tls(broker.requires_tls()))
}

/// The one line for a first connection that did not succeed in time,
/// from the last error the client reported (`last`, as async-nats words it).
fn first_connect_failure(broker: &BrokerConfig, shown: &str, last: Option<&str>) -> String {
    let last = last.unwrap_or("no answer");
    match failure_kind(last) {
        Failure::Refused => {
            let keys = match broker.auth() {
                BrokerAuth::None => {
                    "the server wants credentials: set [broker] token, user and password, nkey_seed or creds_file"
                }
                BrokerAuth::Token(_) => "check [broker] token / token_file",
                BrokerAuth::UserPassword { .. } => {
                    "check [broker] user and password / password_file"
                }
                BrokerAuth::NKey(_) => {
                    "check [broker] nkey_seed / nkey_seed_file and that the server lists its public key"
                }
                BrokerAuth::Creds(_) => {
                    "check [broker] creds_file and that its account is known to the server"
                }
            };
            format!("NATS at {shown} refused idem's credentials ({last}); {keys}")
        }
        Failure::Tls => format!(
            "TLS with NATS at {shown} failed ({last}); check [broker] tls_ca_file (the CA that signed the server's certificate), the url's host name against that certificate, and tls_cert_file / tls_key_file when the server verifies clients"
        ),
        Failure::Unreachable => format!(
            "cannot reach NATS at {shown} within {}s ({last}); check [broker] url and that nats-server runs with -js",
            FIRST_CONNECT.as_secs()
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::secret::Secret;

    #[test]
    fn a_refused_credential_names_the_keys_of_its_method() {
        let mut b = BrokerConfig::at("nats://u:pw@127.0.0.1:4222");
        let shown = crate::secret::redact_url(&b.url);
        assert_eq!(
            first_connect_failure(&b, &shown, Some("authorization violation")),
            "NATS at nats://u:***@127.0.0.1:4222 refused idem's credentials (authorization violation); the server wants credentials: set [broker] token, user and password, nkey_seed or creds_file"
        );
        b.token = Some(Secret::new("t0k"));
        assert_eq!(
            first_connect_failure(&b, "X", Some("authorization violation")),
            "NATS at X refused idem's credentials (authorization violation); check [broker] token / token_file"
        );
    }

    #[test]
    fn tls_and_silence_read_as_what_they_are() {
        let b = BrokerConfig::at("tls://127.0.0.1:4222");
        assert!(
            first_connect_failure(&b, "X", Some("TLS error"))
                .starts_with("TLS with NATS at X failed (TLS error); check")
        );
        assert_eq!(
            first_connect_failure(&b, "X", Some("IO error")),
            "cannot reach NATS at X within 10s (IO error); check [broker] url and that nats-server runs with -js"
        );
        assert_eq!(
            first_connect_failure(&b, "X", None),
            "cannot reach NATS at X within 10s (no answer); check [broker] url and that nats-server runs with -js"
        );
    }

    #[test]
    fn only_a_permissions_violation_ends_an_election_wait() {
        let said = |text: &str| async_nats::ServerError::Other(text.to_owned());
        assert!(is_permissions_violation(&said(
            "Permissions Violation for Publish to \"$JS.API.STREAM.CREATE.KV_idem-deployments\""
        )));
        assert!(is_permissions_violation(&said(
            "permissions violation for subscription to \"_INBOX.x\""
        )));
        assert!(!is_permissions_violation(&said(
            "maximum payload violation"
        )));
        assert!(!is_permissions_violation(
            &async_nats::ServerError::AuthorizationViolation
        ));
    }
}
