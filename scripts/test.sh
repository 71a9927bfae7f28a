#!/usr/bin/env bash
# The whole test suite: installs the tools (scripts/setup.sh) and the pinned
# C, JavaScript and Python toolchains (scripts/toolchains.sh, project-local),
# builds the guest components in every language, then runs every test
# against a private nats-server per test, the PostgreSQL at $IDEM_TEST_PG
# (default postgres://postgres@127.0.0.1:5432/test) and SQLite files.
# Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
. scripts/setup.sh
bash scripts/build-guests.sh
bash scripts/build-lang-guests.sh
cargo test --workspace --exclude credit "$@"
