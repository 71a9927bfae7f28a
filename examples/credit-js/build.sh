#!/usr/bin/env bash
# Builds the JavaScript credit handler into components that import no WASI
# (they run with the default `wasi = false`):
#   target/guests/credit-js-quickjs.wasm         QuickJS (componentize-qjs --stub-wasi --sync)
#   target/guests/credit-js-starlingmonkey.wasm  StarlingMonkey (componentize-js, every WASI feature disabled)
#   target/guests/credit-js.wasm                 a copy of the default backend's build (QuickJS)
# Usage: bash examples/credit-js/build.sh [quickjs|starlingmonkey|all]   (default: all)
# The build itself is scripts/build-js.sh, shared by every JavaScript example.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$here/../../scripts/build-js.sh" "$here/credit.js" credit-js "${1:-all}"
