//! Like notifications, made idempotent by a **natural unique key**.
//!
//! One JSON event per message:
//! `{"event_id": "evt_1", "post_id": 42, "author_id": 7, "actor_id": 9}`
//! (user 9 liked post 42, written by user 7). The handler notifies the
//! post's author: one row in `notifications` per
//! `(recipient_id, actor_id, post_id, kind)`, `kind = 'like'`.
//!
//! The table's unique constraint on that tuple is the business invariant
//! "one like notification per liker and post", and the insert is
//! `ON CONFLICT DO NOTHING`: a second like event for the same tuple (a
//! producer retry with a new `event_id`, an unlike-relike, a replay of the
//! stream past the host's receipts) adds nothing. The row keeps the
//! `event_id` and publish time of the event that created it.
//!
//! A payload that is not such an event is rejected (dead-lettered).

use idem_guest::{Handler, HandlerError, Message, params, tx};
use serde::Deserialize;

/// The like event. `event_id` is also the message identity (the host reads
/// it with `identity = "json:/event_id"`).
#[derive(Deserialize)]
struct LikeEvent {
    event_id: String,
    post_id: i64,
    /// The post's author: the recipient of the notification.
    author_id: i64,
    /// The user who liked the post.
    actor_id: i64,
}

/// The notification kind this handler writes.
const KIND: &str = "like";

/// Works on PostgreSQL and SQLite alike; the conflict target is the
/// `notifications_once` unique constraint.
const NOTIFY: &str = "INSERT INTO notifications \
     (recipient_id, actor_id, post_id, kind, event_id, created_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (recipient_id, actor_id, post_id, kind) DO NOTHING";

struct Likes;

impl Handler for Likes {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let like: LikeEvent = serde_json::from_slice(&msg.payload)
            .map_err(|e| HandlerError::reject(format!("not a like event: {e}")))?;
        let inserted = tx::execute(
            NOTIFY,
            params![
                like.author_id,
                like.actor_id,
                like.post_id,
                KIND,
                like.event_id.as_str(),
                msg.published_ms
            ],
        )?;
        if inserted == 0 {
            idem_guest::info!(
                "user {} already notified of user {}'s like on post {}",
                like.author_id,
                like.actor_id,
                like.post_id
            );
        }
        Ok(())
    }
}

idem_guest::export_handler!(Likes);
