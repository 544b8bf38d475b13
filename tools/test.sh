#!/usr/bin/env bash
# Install tpu-tools with its test dependencies into .venv and run the test suite.
# Extra arguments go to pytest (e.g. tools/test.sh -k ls).
set -euo pipefail
cd "$(dirname "$0")/.."

# Programs the tests drive: tmux (a real terminal for tpu-top), zsh and fish (completion syntax), gcc (builds
# the stand-in libnvidia-ml.so.1 that the NVML tests load).
missing=""
for program in tmux zsh fish gcc; do
    command -v "$program" >/dev/null 2>&1 || missing="$missing $program"
done
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing:$missing"
    apt-get install -y -qq $missing >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $missing >/dev/null 2>&1; } \
        || echo "could not install$missing; the tests that need them are skipped"
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
exec .venv/bin/python -m pytest "$@"
