#!/usr/bin/env bash
# The lint gate CI runs before the tests: formatting, clippy with warnings
# denied (the workspace lint table included) on every crate and target,
# the API docs built with warnings denied (broken intra-doc links), and the
# links of every Markdown file (scripts/check-links.sh: files and #anchors).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
. scripts/setup.sh
for component in rustfmt clippy; do
    if ! rustup component list --installed | grep -q "^$component"; then
        rustup component add "$component" >&2
    fi
done
cargo fmt --all --check
# --all-features: the benchmark-only `native-handler` code is linted too.
cargo clippy --workspace --all-targets --all-features -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --exclude credit
bash scripts/check-links.sh
