"""The account-credit handler in Python: the same handler as examples/credit.

One JSON event per message, `{"event_id": "evt_8142", "account_id": 73,
"amount": 500}`, adds `amount` to the account's balance, creating the account
on its first credit. idem runs it inside the transaction that holds the
message's receipt, so a redelivered or re-published event (same `event_id`,
read by the host with `identity = "json:/event_id"`) never credits twice.
A payload that is not such an event is rejected (dead-lettered): the payload
is read by `read_event` of ../python-common/idem_json.py, shared by the
Python examples, as the Rust handler's serde_json reads it.

Built by build.sh (scripts/build-python.sh, which copies idem_json.py beside
this module) with componentize-py --stub-wasi: the component imports
only idem:handler, so it runs with the default `wasi = false`.
"""

import wit_world
from componentize_py_types import Err
from idem_json import I64, BadPayload, read_event
from wit_world.imports import transaction
from wit_world.imports.types import (
    DbErrorKind,
    HandlerError_Reject,
    HandlerError_Retry,
    Message,
    Value_Integer,
)

# The credit event. `event_id` is the message identity; the handler does not need it.
CREDIT_EVENT = [("account_id", I64), ("amount", I64)]

# Upsert that works on PostgreSQL and SQLite alike.
CREDIT = (
    "INSERT INTO accounts (account_id, balance) VALUES ($1, $2) "
    "ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance"
)


class WitWorld(wit_world.WitWorld):
    def handle(self, msg: Message) -> None:
        try:
            # As the Rust handler's serde_json::from_slice: `-0`, `1.5` or "73"
            # for an i64, a repeated field or a missing one is a reject.
            event = read_event(msg.payload, "not a credit event", CREDIT_EVENT)
        except BadPayload as e:
            raise e.reject()
        try:
            transaction.execute(CREDIT, [Value_Integer(event["account_id"]), Value_Integer(event["amount"])])
        except Err as e:
            # As the Rust SDK's `?`: `other` (timeout, connection lost, ...) is
            # worth a retry; every other kind would fail the same way again.
            err = e.value
            kind = err.kind.name.lower().replace("_", "-")
            reason = f"database {kind}: {err.message}"
            if err.kind == DbErrorKind.OTHER:
                raise Err(HandlerError_Retry(reason))
            raise Err(HandlerError_Reject(reason))
