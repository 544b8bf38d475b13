#!/usr/bin/env bash
# Install tpu-tools with its test dependencies into .venv, lint and type-check it, and run the test suite.
# Extra arguments go to pytest (e.g. tools/test.sh -k ls).
set -euo pipefail
cd "$(dirname "$0")/.."

# Programs the tests drive: tmux (a real terminal for tpu-top), zsh and fish (completion syntax), prometheus
# (a real server scraping the exporters; the package brings promtool, which unit-tests the alert rules), gcc
# (builds the stand-in libnvidia-ml.so.1 that the NVML tests load).
missing=""
for program in tmux zsh fish prometheus gcc; do
    command -v "$program" >/dev/null 2>&1 || missing="$missing $program"
done
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing:$missing"
    apt-get install -y -qq $missing >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $missing >/dev/null 2>&1; } \
        || echo "could not install$missing; the tests that need them are skipped"
fi

# uv installs the same packages as pip in a fraction of the time (parallel downloads, no per-package
# subprocess): on a fresh clone here 14 s instead of 39 s, libtpu included, and about a second when .venv is
# up to date.
# --compile-bytecode: the tests start hundreds of Python processes, each would otherwise compile what it imports.
python3 -m venv .venv
[ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q uv
.venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode -e '.[test]'
# libtpu's own SDK, the second client the tests hold every fixture metrics service to (tests/libtpu_sdk.py).
# It goes into .libtpu/, not .venv: installed there, JAX would see a TPU plugin, the tests would pin JAX to the
# CPU platform and skip those about JAX's own choice of platform. Only the SDK's child processes load it.
LIBTPU_VERSION=0.0.51
if [ ! -f ".libtpu/libtpu-$LIBTPU_VERSION.dist-info/METADATA" ]; then
    rm -rf .libtpu
    .venv/bin/uv pip install -q --python .venv/bin/python --no-deps --target .libtpu "libtpu==$LIBTPU_VERSION"
fi
export TPU_TOOLS_TEST_REQUIRE_LIBTPU=1  # the SDK's tests fail here rather than skip when it cannot run
# Lint and types first: they take seconds and fail CI like a test (configuration in pyproject.toml).
.venv/bin/ruff check --quiet .
.venv/bin/mypy
# The tests run in parallel: most of a test's time is spent waiting on the programs it starts (a runtime
# coming up, a deadline, a scrape), so two workers per core keep the machine busy. TPU_TOOLS_TEST_WORKERS
# overrides (0: one process). Each test file runs on one worker: many share a real JAX job, a server or a
# bundle in a module fixture, which is then started once. The order is random (pytest-randomly prints the
# seed; --randomly-seed=N replays it).
workers="${TPU_TOOLS_TEST_WORKERS:-$(( $(nproc) * 2 ))}"
# Bytecode is kept (PYTHONDONTWRITEBYTECODE, if the shell sets it, is dropped here): every worker would
# otherwise rewrite and compile all the test modules again (2 s each), and every program the tests start
# would compile the tpu_tools modules it imports.
unset PYTHONDONTWRITEBYTECODE
if [ "$#" -eq 0 ]; then
    # The whole suite, as CI runs it: with coverage of every process the tests start, and its floor.
    exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --cov --cov-report=term
fi
exec .venv/bin/python -m pytest "$@"
