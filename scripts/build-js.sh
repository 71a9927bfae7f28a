#!/usr/bin/env bash
# Builds one JavaScript handler into components that import no WASI (they run
# with the default `wasi = false`):
#   target/guests/<name>-quickjs.wasm         QuickJS (componentize-qjs --stub-wasi --sync)
#   target/guests/<name>-starlingmonkey.wasm  StarlingMonkey (componentize-js, every WASI feature disabled)
#   target/guests/<name>.wasm                 a copy of the default engine's build (QuickJS), when this run built it
# Usage: bash scripts/build-js.sh <source.js> <name> [quickjs|starlingmonkey|all]   (default: quickjs)
#   e.g. bash scripts/build-js.sh examples/likes-js/likes.js likes-js
# The source is an ES module under examples/; it may import the shared helpers
# with `import { ... } from '../js-common/idem.js'` (both engines resolve
# relative imports while they snapshot the module, within examples/).
# The tools come from scripts/toolchains.sh (sourced here; it installs them on first use).
set -euo pipefail
# Physical paths (symlinks resolved) for the checkout and the source alike, so
# that a checkout reached through a symlink still finds its sources under examples/.
root="$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
default=quickjs
usage() {
    echo "usage: $0 <source.js> <name> [quickjs|starlingmonkey|all]" >&2
    exit 2
}
[[ $# -ge 2 && $# -le 3 ]] || usage
name=$2
choice="${3:-$default}"
case "$choice" in
    all|quickjs|starlingmonkey) ;;
    *) usage ;;
esac
examples="$(realpath "$root/examples")"
# A source that does not exist gets the message below, not realpath's error.
src="$(realpath -- "$1" 2>/dev/null)" || src=
if [[ -z "$src" || "$src" != "$examples"/* || ! -f "$src" ]]; then
    echo "$name: $1 is not a file under examples/" >&2
    exit 2
fi
. "$root/scripts/toolchains.sh" js
wit="$root/wit/handler.wit"
out="${CARGO_TARGET_DIR:-$root/target}/guests"
mkdir -p "$out"
out="$(realpath "$out")"

build() { # backend -> $out/$name-<backend>.wasm
    local backend=$1 dst="$out/$name-$1.wasm"
    local start=$SECONDS
    case "$backend" in
        quickjs)
            # --stub-wasi: every WASI import becomes a trap (QuickJS itself needs none
            # here); --sync: the plain component ABI (the default runtime uses the
            # component-model async ABI, which idem does not enable: refused at load).
            # --module-root: the folder the snapshot may read imports from.
            "$IDEM_COMPONENTIZE_QJS" --wit "$wit" --world handler --js "$src" \
                --module-root "$examples" --stub-wasi --sync -o "$dst.tmp" > /dev/null ;;
        starlingmonkey)
            # Disabling every WASI feature leaves no WASI import at all. componentize-js
            # exposes the working directory to the snapshot when the source is under
            # it, hence the cd: imports from ../js-common resolve.
            (cd "$examples" && "$IDEM_COMPONENTIZE_JS" "$src" --wit "$wit" --world-name handler \
                --disable stdio random clocks http fetch-event -o "$dst.tmp" > /dev/null) ;;
        *) echo "$name: unknown backend '$backend' (quickjs or starlingmonkey)" >&2; return 1 ;;
    esac
    "$WASM_TOOLS" validate "$dst.tmp"
    if "$WASM_TOOLS" component wit "$dst.tmp" | grep -q '^ *import wasi:'; then
        echo "$name: $dst.tmp imports WASI; idem would refuse it without wasi = true" >&2
        return 1
    fi
    mv -f "$dst.tmp" "$dst"
    echo "$name: $dst ($(wc -c < "$dst") bytes, $((SECONDS - start))s)"
}

case "$choice" in
    all) build quickjs; build starlingmonkey ;;
    *) build "$choice" ;;
esac
# Only a default-engine build made by this run becomes <name>.wasm (an older
# one left by an earlier run is not refreshed by building another engine).
if [[ $choice == all || $choice == "$default" ]]; then
    cp -f "$out/$name-$default.wasm" "$out/$name.wasm.tmp"
    mv -f "$out/$name.wasm.tmp" "$out/$name.wasm"
    echo "$name: $out/$name.wasm (= $default)"
fi
