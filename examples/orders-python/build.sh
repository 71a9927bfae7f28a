#!/usr/bin/env bash
# Builds the Python orders handler into target/guests/orders-python.wasm
# (scripts/build-python.sh: componentize-py --stub-wasi, no WASI imports).
set -euo pipefail
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/build-python.sh" orders-python orders
