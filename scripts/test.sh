#!/usr/bin/env bash
# The whole test suite: installs the tools (scripts/setup.sh) and the pinned
# C, JavaScript and Python toolchains (scripts/toolchains.sh, project-local),
# builds the guest components in every language, then runs every test
# against a private nats-server per test, the PostgreSQL at $IDEM_TEST_PG
# (default postgres://postgres@127.0.0.1:5432/test) and SQLite files; then
# the correctness suites once more with batching on (IDEM_TEST_BATCH=16).
# Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
. scripts/setup.sh
bash scripts/build-guests.sh
bash scripts/build-lang-guests.sh
cargo test --workspace --exclude credit "$@"
# The correctness suites again with batching on (`batch = 16` in every
# handler the tests configure; ARCHITECTURE.md, "Batching").
IDEM_TEST_BATCH=16 cargo test -p idem-tests \
    --test protocol --test crash --test hostile_runtime --test db_outage \
    --test broker_restart --test chaos --test strategies --test languages \
    --test outbox --test outbox_batch --test outbox_slow --test orders_chaos --test cluster \
    --test shadow "$@"
