#!/usr/bin/env bash
# Builds one Python handler, examples/<example>/<module>.py, into
# target/guests/<example>.wasm ($CARGO_TARGET_DIR/guests when set) with
# componentize-py --stub-wasi: every WASI import is replaced by a trapping
# stub, so the component imports only idem:handler and runs with the
# default `wasi = false`. The module is built with what the Python examples
# share, examples/python-common/idem_json.py, beside it (`import idem_json`).
# The tools come from scripts/toolchains.sh (installed on first use).
# Usage: bash scripts/build-python.sh <example> <module>
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 <example> <module>" >&2; exit 2; }
example=$1
module=$2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/toolchains.sh" python
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out="$target_dir/guests"
dst="$out/$example.wasm"
# The app is staged in a fresh folder: componentize-py bundles its whole Python
# path, and its build-time interpreter writes __pycache__ there.
app="$target_dir/$example/app"
rm -rf "$app"
mkdir -p "$app" "$out"
cp "$root/examples/$example/$module.py" "$root/examples/python-common/idem_json.py" "$app/"
start=$SECONDS
"$IDEM_COMPONENTIZE_PY" --quiet --wit-path "$root/wit" --world handler \
    componentize --python-path "$app" --stub-wasi "$module" -o "$dst.tmp"
"$WASM_TOOLS" validate "$dst.tmp"
if "$WASM_TOOLS" component wit "$dst.tmp" | grep -q '^ *import wasi:'; then
    echo "$example: $dst.tmp imports WASI; idem would refuse it without wasi = true" >&2
    exit 1
fi
mv -f "$dst.tmp" "$dst"
echo "$example: $dst ($(wc -c < "$dst") bytes, $((SECONDS - start))s)"
