"""The account-credit handler in Python: the same handler as examples/credit.

One JSON event per message, `{"event_id": "evt_8142", "account_id": 73,
"amount": 500}`, adds `amount` to the account's balance, creating the account
on its first credit. idem runs it inside the transaction that holds the
message's receipt, so a redelivered or re-published event (same `event_id`,
read by the host with `identity = "json:/event_id"`) never credits twice.
A payload that is not such an event is rejected (dead-lettered).

Built by build.sh with componentize-py --stub-wasi: the component imports
only idem:handler, so it runs with the default `wasi = false`.
"""

import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import transaction
from wit_world.imports.types import (
    DbErrorKind,
    HandlerError_Reject,
    HandlerError_Retry,
    Message,
    Value_Integer,
)

# Upsert that works on PostgreSQL and SQLite alike.
CREDIT = (
    "INSERT INTO accounts (account_id, balance) VALUES ($1, $2) "
    "ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance"
)

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
FIELDS = ("account_id", "amount")


class Members(dict):
    """A JSON object that remembers which of FIELDS it saw more than once
    (json.loads keeps the last; the Rust handler rejects a duplicate)."""

    def __init__(self, pairs):
        super().__init__(pairs)
        self.duplicates = [k for k in FIELDS if sum(1 for p in pairs if p[0] == k) > 1]


def _int(text: str):
    """A JSON integer literal as json.loads reads it, except `-0`: -0.0."""
    return -0.0 if text == "-0" else int(text)


def reject(reason: str) -> Err:
    return Err(HandlerError_Reject(reason))


def integer_field(event: dict, name: str) -> int:
    """The field as a signed 64-bit integer, as the Rust handler reads it."""
    if name not in event:
        raise reject(f"not a credit event: missing field `{name}`")
    v = event[name]
    # bool is an int subclass in Python; JSON true is not a number.
    if type(v) is not int or not I64_MIN <= v <= I64_MAX:
        raise reject(f"not a credit event: `{name}` is not a 64-bit integer: {v!r}")
    return v


class WitWorld(wit_world.WitWorld):
    def handle(self, msg: Message) -> None:
        try:
            # parse_int: serde_json reads `-0` as the float -0.0, so the Rust
            # handler refuses it for an i64; a float here is refused too.
            event = json.loads(msg.payload, object_pairs_hook=Members, parse_int=_int)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            raise reject(f"not a credit event: {e}")
        if not isinstance(event, dict):
            raise reject("not a credit event: the payload is not a JSON object")
        if event.duplicates:
            raise reject(f"not a credit event: duplicate field `{event.duplicates[0]}`")
        account_id = integer_field(event, "account_id")
        amount = integer_field(event, "amount")
        try:
            transaction.execute(CREDIT, [Value_Integer(account_id), Value_Integer(amount)])
        except Err as e:
            # As the Rust SDK's `?`: `other` (timeout, connection lost, ...) is
            # worth a retry; every other kind would fail the same way again.
            err = e.value
            kind = err.kind.name.lower().replace("_", "-")
            reason = f"database {kind}: {err.message}"
            if err.kind == DbErrorKind.OTHER:
                raise Err(HandlerError_Retry(reason))
            raise Err(HandlerError_Reject(reason))
