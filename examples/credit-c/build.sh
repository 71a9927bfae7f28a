#!/usr/bin/env bash
# Builds the C credit handler into target/guests/credit-c.wasm
# (scripts/build-c.sh: zig cc and wasm-tools, no WASI imports).
set -euo pipefail
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/build-c.sh" credit-c credit
