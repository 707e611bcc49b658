#!/usr/bin/env bash
# The README's first command, verbatim, on a fresh copy of this checkout with no test extra, then
# the served page checked in headless Chromium (.ci/first_page.py, with the test environment's
# Playwright). Fails when the page renders no plots, reports an error, its browser console reports a script
# error, or the server logs a traceback.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
work=$(mktemp -d /tmp/trajscope-first-page.XXXXXX)
fresh="$work/trajscope"
mkdir -p "$fresh"
# tracked files and untracked ones git does not ignore: what a clone of this working tree holds
git ls-files -z --cached --others --exclude-standard | xargs -0 cp -d --parents -t "$fresh"  # -d: links as links
cd "$fresh"
log="$work/serve.log"
port=${FIRST_PAGE_PORT:-5006}
# BROWSER=true: --show's webbrowser call opens nothing on a machine without a screen
# setsid: the install and the server run in a process group of their own, stopped as one at exit
setsid bash -c 'BROWSER=true bash scripts/install.sh && BROWSER=true .venv/bin/panel serve apps/trajscope.py --show' \
    >"$log" 2>&1 &
server=$!
# at exit: stop the server, then remove the fresh copy (its .venv is over 2 GB); the log and the screenshot stay
trap 'kill -- -"$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$fresh"' EXIT
status=0
"$repo/.venv/bin/python" "$repo/.ci/first_page.py" --url "http://localhost:$port/trajscope" \
    --timeout "${FIRST_PAGE_TIMEOUT:-900}" --png "$work/first_page.png" --server-log "$log" || status=1
if grep -q -E "Traceback|ModuleNotFoundError|^ERROR" "$log"; then
    echo "first page: the server logged an error:"; grep -n -B2 -A12 -E "Traceback|ModuleNotFoundError|^ERROR" "$log" | head -60
    status=1
fi
if [ "$status" != 0 ]; then echo "--- server log (last 40 lines) ---"; tail -40 "$log"; fi
echo "first page: screenshot at $work/first_page.png"
exit $status
