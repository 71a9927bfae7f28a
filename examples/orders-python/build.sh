#!/usr/bin/env bash
# Builds the Python orders handler into target/guests/orders-python.wasm with
# componentize-py --stub-wasi: every WASI import is replaced by a trapping stub,
# so the component imports only idem:handler and runs with the default
# `wasi = false`. The tools come from scripts/toolchains.sh (installed on first use).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
. "$root/scripts/toolchains.sh" python
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out="$target_dir/guests"
dst="$out/orders-python.wasm"
# The app is staged in a fresh folder: componentize-py bundles its whole Python
# path, and its build-time interpreter writes __pycache__ there.
app="$target_dir/orders-python/app"
rm -rf "$app"
mkdir -p "$app" "$out"
cp "$root/examples/orders-python/orders.py" "$app/"
start=$SECONDS
"$IDEM_COMPONENTIZE_PY" --quiet --wit-path "$root/wit" --world handler \
    componentize --python-path "$app" --stub-wasi orders -o "$dst.tmp"
"$WASM_TOOLS" validate "$dst.tmp"
if "$WASM_TOOLS" component wit "$dst.tmp" | grep -q '^ *import wasi:'; then
    echo "orders-python: $dst.tmp imports WASI; idem would refuse it without wasi = true" >&2
    exit 1
fi
mv -f "$dst.tmp" "$dst"
echo "orders-python: $dst ($(wc -c < "$dst") bytes, $((SECONDS - start))s)"
