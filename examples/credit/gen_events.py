#!/usr/bin/env python3
"""Generates the credit demo's input: 10,000 credit events over 100 accounts,
1,000 of which are published a second time as separate messages with the same
event_id (no broker-level dedup header). Fixed seed: the same file every run.

Usage: gen_events.py OUT.jsonl [--events 10000] [--accounts 100] [--duplicates 1000] [--seed 8142]
"""
import argparse
import json
import random


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--accounts", type=int, default=100)
    ap.add_argument("--duplicates", type=int, default=1_000)
    ap.add_argument("--seed", type=int, default=8142)
    args = ap.parse_args()
    if args.duplicates > args.events:
        ap.error("--duplicates cannot exceed --events")

    rng = random.Random(args.seed)
    events = [
        {
            "event_id": f"evt_{i:06d}",
            "account_id": rng.randrange(1, args.accounts + 1),
            "amount": rng.randrange(1, 1_000),
        }
        for i in range(args.events)
    ]
    lines = list(events)
    # Re-publish a sample at a later random position: same event, new message.
    for ev in rng.sample(events, args.duplicates):
        pos = rng.randrange(lines.index(ev) + 1, len(lines) + 1)
        lines.insert(pos, ev)
    with open(args.out, "w") as f:
        for ev in lines:
            f.write(json.dumps(ev, separators=(",", ":")) + "\n")
    print(f"wrote {len(lines)} messages ({args.events} distinct events, "
          f"{args.duplicates} re-published) to {args.out}")


if __name__ == "__main__":
    main()
