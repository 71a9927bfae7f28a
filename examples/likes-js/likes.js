// Like notifications, made idempotent by a natural unique key: the handler of
// examples/likes in JavaScript (see its README.md for the strategy).
//
// One JSON event per message:
// {"event_id": "evt_1", "post_id": 42, "author_id": 7, "actor_id": 9}
// (user 9 liked post 42, written by user 7). The handler notifies the post's
// author: one row in `notifications` per (recipient_id, actor_id, post_id,
// kind), kind = 'like'. The table's unique constraint on that tuple is the
// business invariant, and the insert is ON CONFLICT DO NOTHING: a second
// like event for the same tuple adds nothing. The row keeps the `event_id`
// and publish time of the event that created it.
//
// A payload that is not such an event is rejected (dead-lettered).
import { I64, STRING, log, readEvent, statements } from '../js-common/idem.js';

// The like event. `event_id` is also the message identity (the host reads it
// with `identity = "json:/event_id"`).
const LIKE_EVENT = [
  ['event_id', STRING],
  ['post_id', I64],
  ['author_id', I64], // the post's author: the recipient of the notification
  ['actor_id', I64], // the user who liked the post
];

// The notification kind this handler writes.
const KIND = 'like';

// Works on PostgreSQL and SQLite alike; the conflict target is the
// `notifications_once` unique constraint.
const NOTIFY =
  'INSERT INTO notifications ' +
  '(recipient_id, actor_id, post_id, kind, event_id, created_at_ms) ' +
  'VALUES ($1, $2, $3, $4, $5, $6) ' +
  'ON CONFLICT (recipient_id, actor_id, post_id, kind) DO NOTHING';

export function handle(msg) {
  const like = readEvent(msg, 'not a like event', LIKE_EVENT);
  const inserted = statements(msg).execute(NOTIFY, [
    like.author_id,
    like.actor_id,
    like.post_id,
    KIND,
    like.event_id,
    msg.publishedMs,
  ]);
  if (inserted === 0) {
    log('info', `user ${like.author_id} already notified of user ${like.actor_id}'s like on post ${like.post_id}`);
  }
}
