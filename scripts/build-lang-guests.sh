#!/usr/bin/env bash
# Builds the credit handler in Python, JavaScript and C, the
# JavaScript versions of the strategy examples, and the orders example's
# `orders` handler in JavaScript, Python and C (it publishes through the
# outbox), after installing their pinned
# toolchains (scripts/toolchains.sh):
#   target/guests/credit-python.wasm                  examples/credit-python (componentize-py)
#   target/guests/credit-js.wasm                      examples/credit-js, default engine (QuickJS)
#   target/guests/credit-js-quickjs.wasm              ... with QuickJS (componentize-qjs)
#   target/guests/credit-js-starlingmonkey.wasm       ... with StarlingMonkey (componentize-js)
#   target/guests/{likes,projection,parcel,counter,orders}-js.wasm
#                                                     examples/<strategy>-js, QuickJS (scripts/build-js.sh)
#   target/guests/orders-python.wasm                  examples/orders-python (componentize-py)
#   target/guests/credit-c.wasm                       examples/credit-c (wit-bindgen C + zig cc)
#   target/guests/orders-c.wasm                       examples/orders-c (wit-bindgen C + zig cc)
# None imports WASI: each runs with the default `wasi = false`.
# Prints each language's build time of the credit handler (docs/handlers.md's
# build-time column), then the JavaScript strategy examples' own.
# Usage: bash scripts/build-lang-guests.sh [python] [js] [c]   (none: all three)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
langs=("$@")
[[ ${#langs[@]} -gt 0 ]] || langs=(python js c)
for lang in "${langs[@]}"; do
    case "$lang" in python|js|c) ;; *) echo "build-lang-guests: unknown language '$lang' (python, js or c)" >&2; exit 2 ;; esac
done
. "$root/scripts/toolchains.sh" "${langs[@]}"
for lang in "${langs[@]}"; do
    start=$SECONDS
    bash "$root/examples/credit-$lang/build.sh"
    if [[ $lang == python ]]; then
        bash "$root/examples/orders-python/build.sh"
    elif [[ $lang == c ]]; then
        bash "$root/examples/orders-c/build.sh"
    fi
    echo "build-lang-guests: $lang built in $((SECONDS - start)) s (toolchain already installed)"
    if [[ $lang == js ]]; then
        start=$SECONDS
        for strategy in likes projection parcel counter orders; do
            bash "$root/scripts/build-js.sh" "$root/examples/$strategy-js/$strategy.js" "$strategy-js" quickjs
        done
        echo "build-lang-guests: js strategy examples built in $((SECONDS - start)) s"
    fi
done
