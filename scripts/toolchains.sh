#!/usr/bin/env bash
# Installs the toolchains for handlers in Python, JavaScript and C, project-local
# and pinned, on top of what scripts/setup.sh installs (which this runs first:
# .tools/venv with wasm-tools). Idempotent: a toolchain already installed at its
# pinned version is only checked. Run it, or source it to get the tools exported
# (sourcing does not change the calling shell's options; setup.sh's exports,
# WASM_TOOLS and PATH with .tools/venv/bin, come along):
#   bash scripts/toolchains.sh [python] [js] [c] [wit-bindgen]
#   . scripts/toolchains.sh [python] [js] [c] [wit-bindgen]
# No names means python, js and c. A script that sources this file must name
# what it needs: a sourced file sees the caller's arguments when given none.
#
#   python       componentize-py (PyPI), into .tools/venv.
#                Exports IDEM_COMPONENTIZE_PY.
#   js           componentize-js 0.23.0 (StarlingMonkey) and componentize-qjs 0.4.5
#                (QuickJS) from npm, into .tools/node with `npm ci` from the lockfile
#                checked in under scripts/toolchains-node/ (every transitive
#                package pinned, with its integrity hash). Uses the machine's
#                Node.js (20.19 or newer). Exports IDEM_COMPONENTIZE_JS and
#                IDEM_COMPONENTIZE_QJS.
#   c            zig (PyPI ziglang; its `zig cc` targets wasm32-wasi with
#                wasi-libc built in), into .tools/venv. Exports IDEM_ZIG and
#                ZIG_GLOBAL_CACHE_DIR (.tools/zig-cache).
#   wit-bindgen  the wit-bindgen CLI, C generator only, built from crates.io
#                into .tools/cargo (a Rust build: about 7 CPU-minutes). Needed only
#                to regenerate examples/c-common/bindings after wit/ changes
#                (bash scripts/build-c.sh --regen), not to build the C
#                examples. Exports IDEM_WIT_BINDGEN.
idem_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

idem_toolchains() (
    set -euo pipefail
    # The pins (the npm ones are in scripts/toolchains-node/package.json and its
    # lockfile). wit-bindgen-cli matches the workspace's wit-bindgen crate (0.61).
    COMPONENTIZE_PY_VERSION=0.25.1
    ZIGLANG_VERSION=0.17.1
    WIT_BINDGEN_CLI_VERSION=0.61.1
    NODE_MIN=20.19 # rolldown (under componentize-js's jco) needs ^20.19 || >=22.12

    venv="$idem_root/.tools/venv"
    py_version() { # the installed version of a PyPI distribution in .tools/venv, or nothing
        "$venv/bin/python" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass' "$1"
    }
    pip_pin() { # name version
        if [ "$(py_version "$1")" != "$2" ]; then
            echo "toolchains: installing $1==$2 into .tools/venv" >&2
            "$venv/bin/pip" install --quiet --disable-pip-version-check "$1==$2" >&2
        fi
    }

    for name in "$@"; do
        case "$name" in
            python)
                pip_pin componentize-py "$COMPONENTIZE_PY_VERSION" ;;
            c)
                pip_pin ziglang "$ZIGLANG_VERSION" ;;
            js)
                if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
                    echo "toolchains: js needs Node.js $NODE_MIN or newer with npm (Debian: apt-get install nodejs npm)" >&2
                    return 1
                fi
                node_version="$(node --version)"
                if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number), [x,y]=process.argv[1].split(".").map(Number); process.exit(a>x||(a===x&&b>=y)?0:1)' "$NODE_MIN"; then
                    echo "toolchains: js needs Node.js $NODE_MIN or newer, found $node_version" >&2
                    return 1
                fi
                src="$idem_root/scripts/toolchains-node"
                dst="$idem_root/.tools/node"
                want="$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -d' ' -f1) node ${node_version%%.*}"
                if [ "$(cat "$dst/.idem-lock" 2>/dev/null)" != "$want" ] \
                    || [ ! -x "$dst/node_modules/.bin/componentize-js" ] \
                    || [ ! -x "$dst/node_modules/.bin/componentize-qjs" ]; then
                    echo "toolchains: installing the JavaScript toolchain into .tools/node (npm ci)" >&2
                    mkdir -p "$dst"
                    cp -f "$src/package.json" "$src/package-lock.json" "$dst/"
                    (cd "$dst" && npm ci --no-audit --no-fund --loglevel=error >&2)
                    echo "$want" > "$dst/.idem-lock"
                fi ;;
            wit-bindgen)
                bin="$idem_root/.tools/cargo/bin/wit-bindgen"
                if [ "$("$bin" --version 2>/dev/null | awk '{print $2}')" != "$WIT_BINDGEN_CLI_VERSION" ]; then
                    echo "toolchains: building wit-bindgen-cli $WIT_BINDGEN_CLI_VERSION (C generator only) into .tools/cargo: a Rust build of about 7 CPU-minutes" >&2
                    cargo install --locked --root "$idem_root/.tools/cargo" wit-bindgen-cli \
                        --version "$WIT_BINDGEN_CLI_VERSION" --no-default-features --features c >&2
                fi ;;
            *)
                echo "toolchains: unknown toolchain '$name' (python, js, c or wit-bindgen)" >&2
                return 1 ;;
        esac
    done
)

idem_toolchain_names=("$@")
[ "${#idem_toolchain_names[@]}" -gt 0 ] || idem_toolchain_names=(python js c)
# setup.sh first: .tools/venv and wasm-tools. Sourced, so its exports land here.
if ! . "$idem_root/scripts/setup.sh" || ! idem_toolchains "${idem_toolchain_names[@]}"; then
    unset idem_toolchain_names
    echo "toolchains: failed; see the lines above" >&2
    # `return` when sourced, `exit` when run.
    return 1 2>/dev/null || exit 1
fi
unset idem_toolchain_names
export IDEM_COMPONENTIZE_PY="$idem_root/.tools/venv/bin/componentize-py"
export IDEM_COMPONENTIZE_JS="$idem_root/.tools/node/node_modules/.bin/componentize-js"
export IDEM_COMPONENTIZE_QJS="$idem_root/.tools/node/node_modules/.bin/componentize-qjs"
# ziglang's own binary (`python -m ziglang` only execs it).
for IDEM_ZIG in "$idem_root"/.tools/venv/lib/python3*/site-packages/ziglang/zig; do break; done
export IDEM_ZIG
export ZIG_GLOBAL_CACHE_DIR="$idem_root/.tools/zig-cache"
export IDEM_WIT_BINDGEN="$idem_root/.tools/cargo/bin/wit-bindgen"
