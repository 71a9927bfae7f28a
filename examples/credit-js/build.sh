#!/usr/bin/env bash
# Builds the JavaScript credit handler into components that import no WASI
# (they run with the default `wasi = false`):
#   target/guests/credit-js-quickjs.wasm         QuickJS (componentize-qjs --stub-wasi --sync)
#   target/guests/credit-js-starlingmonkey.wasm  StarlingMonkey (componentize-js, every WASI feature disabled)
#   target/guests/credit-js.wasm                 a copy of the default backend's build (QuickJS)
# Usage: bash examples/credit-js/build.sh [quickjs|starlingmonkey|all]   (default: all)
# The tools come from scripts/toolchains.sh (sourced here; it installs them on first use).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
default=quickjs
choice="${1:-all}"
case "$choice" in
    all|quickjs|starlingmonkey) ;;
    *) echo "usage: $0 [quickjs|starlingmonkey|all]" >&2; exit 2 ;;
esac
. "$root/scripts/toolchains.sh" js
src="$root/examples/credit-js/credit.js"
wit="$root/wit/handler.wit"
out="${CARGO_TARGET_DIR:-$root/target}/guests"
mkdir -p "$out"

build() { # backend -> $out/credit-js-<backend>.wasm
    local backend=$1 dst="$out/credit-js-$1.wasm"
    local start=$SECONDS
    case "$backend" in
        quickjs)
            # --stub-wasi: every WASI import becomes a trap (QuickJS itself needs none
            # here); --sync: the plain component ABI (the default runtime uses the
            # component-model async ABI, which idem does not enable: refused at load).
            "$IDEM_COMPONENTIZE_QJS" --wit "$wit" --world handler --js "$src" \
                --stub-wasi --sync -o "$dst.tmp" > /dev/null ;;
        starlingmonkey)
            # Disabling every WASI feature leaves no WASI import at all.
            "$IDEM_COMPONENTIZE_JS" "$src" --wit "$wit" --world-name handler \
                --disable stdio random clocks http fetch-event -o "$dst.tmp" > /dev/null ;;
        *) echo "credit-js: unknown backend '$backend' (quickjs or starlingmonkey)" >&2; return 1 ;;
    esac
    "$WASM_TOOLS" validate "$dst.tmp"
    if "$WASM_TOOLS" component wit "$dst.tmp" | grep -q '^ *import wasi:'; then
        echo "credit-js: $dst.tmp imports WASI; idem would refuse it without wasi = true" >&2
        return 1
    fi
    mv -f "$dst.tmp" "$dst"
    echo "credit-js: $dst ($(wc -c < "$dst") bytes, $((SECONDS - start))s)"
}

case "$choice" in
    all) build quickjs; build starlingmonkey ;;
    *) build "$choice" ;;
esac
if [[ -f "$out/credit-js-$default.wasm" ]]; then
    cp -f "$out/credit-js-$default.wasm" "$out/credit-js.wasm.tmp"
    mv -f "$out/credit-js.wasm.tmp" "$out/credit-js.wasm"
    echo "credit-js: $out/credit-js.wasm (= $default)"
fi
