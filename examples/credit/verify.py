#!/usr/bin/env python3
"""Checks the credit demo's database against totals computed independently
from the events file: every distinct event_id counted once.

Usage: verify.py EVENTS.jsonl SQLITE_DB_PATH --consumer NAME
Prints events published, distinct events, receipts (processed), and each
account's balance vs. the expected total; MATCH or every mismatch. Exit 0 on MATCH.
"""
import argparse
import json
import sqlite3
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("events")
    ap.add_argument("db")
    ap.add_argument("--consumer", default="credit-projector")
    args = ap.parse_args()

    published = 0
    seen = {}
    expected = {}
    with open(args.events) as f:
        for line in f:
            if not line.strip():
                continue
            published += 1
            ev = json.loads(line)
            if ev["event_id"] in seen:
                continue
            seen[ev["event_id"]] = ev
            expected[ev["account_id"]] = expected.get(ev["account_id"], 0) + ev["amount"]

    con = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True)
    receipts = con.execute(
        "SELECT count(*) FROM idem_receipts WHERE consumer = ?", (args.consumer,)
    ).fetchone()[0]
    dead = con.execute(
        "SELECT count(*) FROM idem_dead_letters WHERE consumer = ?", (args.consumer,)
    ).fetchone()[0]
    actual = dict(con.execute("SELECT account_id, balance FROM accounts").fetchall())

    print(f"messages published:    {published}")
    print(f"distinct events:       {len(seen)}")
    print(f"processed (receipts):  {receipts}")
    print(f"re-published copies:   {published - len(seen)}")
    print(f"dead letters:          {dead}")
    mismatches = []
    for acct in sorted(set(expected) | set(actual)):
        want, got = expected.get(acct), actual.get(acct)
        if want != got:
            mismatches.append((acct, want, got))
    if receipts != len(seen):
        mismatches.append(("receipts", len(seen), receipts))
    print(f"accounts checked:      {len(set(expected) | set(actual))}")
    if mismatches:
        print("MISMATCH")
        for acct, want, got in mismatches:
            print(f"  account {acct}: expected {want}, database has {got}")
        return 1
    print("MATCH: every account balance equals the total of its distinct events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
