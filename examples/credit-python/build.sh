#!/usr/bin/env bash
# Builds the Python credit handler into target/guests/credit-python.wasm
# (scripts/build-python.sh: componentize-py --stub-wasi, no WASI imports).
set -euo pipefail
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/build-python.sh" credit-python credit
