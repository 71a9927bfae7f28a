//! PostgreSQL `LISTEN`: a session of its own (outside the host's pool,
//! which it would shrink by one for as long as it listens) that wakes a
//! task whenever another session's transaction that notified a channel
//! commits.

use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The wait before a listening session that failed is opened again.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// Until `stop`: listens on `channel` with a connection made like `pool`'s
/// and calls `wake.notify_one()` for every notification, and once more
/// after each reconnect (notifications sent while the session was gone
/// are lost, PostgreSQL keeps none for a session that is not there). A
/// database that does not answer is tried again every [`REOPEN_AFTER`];
/// the caller's own poll covers the gap.
pub(crate) async fn wake_on_notify(
    pool: &PgPool,
    channel: &str,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    let options = (*pool.connect_options()).clone();
    let own = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options);
    let mut said = false;
    while !stop.is_cancelled() {
        let listening = async {
            let mut listener = PgListener::connect_with(&own).await?;
            listener.listen(channel).await?;
            wake.notify_one();
            loop {
                if listener.try_recv().await?.is_none() {
                    tracing::debug!(channel, "LISTEN session lost; opened again");
                }
                wake.notify_one();
            }
            #[allow(unreachable_code)]
            Ok::<(), sqlx::Error>(())
        };
        let failed = tokio::select! {
            () = stop.cancelled() => break,
            r = listening => r,
        };
        if let Err(e) = failed
            && !std::mem::replace(&mut said, true)
        {
            tracing::debug!(channel, error = %e, "cannot LISTEN; the relay polls meanwhile");
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(REOPEN_AFTER) => {}
        }
    }
    own.close().await;
}
