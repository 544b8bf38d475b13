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
        || true
fi
still=""
for program in $missing promtool; do
    command -v "$program" >/dev/null 2>&1 || still="$still $program"
done
if [ -n "$still" ]; then
    # In CI a missing program fails the run (tests/programs.py fails its tests too): skipping them would
    # leave CI green while tpu-top's terminal, the scrapes, the alert rules and the completions go untested.
    case "${CI:-}" in
        true|TRUE|True|1|yes)
            echo "tools/test.sh: error: could not install$still, which the tests drive (CI=true)" >&2
            exit 1 ;;
        *) echo "could not install$still; the tests that need them are skipped" ;;
    esac
fi

# The interpreter: python3 where it is 3.12 or newer, else a python3.12 or python3.13 that this machine has (on
# PATH, or installed by pyenv beside the default), else python3. From 3.12 on, coverage measures through
# sys.monitoring, which costs nothing in code it does not measure (the standard library, jax, rich, grpc); 3.11's
# tracer runs on every line of every Python process the tests start, which doubled their CPU
# (benchmarks/README.md, "Where the suite's time goes"). TPU_TOOLS_TEST_PYTHON names another interpreter.
runs_3_12() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }
pick_python() {
    if [ -n "${TPU_TOOLS_TEST_PYTHON:-}" ]; then echo "$TPU_TOOLS_TEST_PYTHON"; return; fi
    local candidate
    for candidate in python3 python3.12 python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 \
                     "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13; do
        if runs_3_12 "$candidate"; then echo "$candidate"; return; fi
    done
    echo python3
}
python="$(pick_python)"
version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
wanted="$(version_of "$python")"
# a .venv of another interpreter is made anew
if [ -x .venv/bin/python ] && [ "$(version_of .venv/bin/python)" != "$wanted" ]; then
    rm -rf .venv
fi
# The environment is made without pip (ensurepip alone takes 3 s); uv comes from the interpreter's own pip
# where it has one, else from a pip put into .venv.
"$python" -m venv --without-pip .venv
if [ ! -x .venv/bin/uv ]; then
    "$python" -m pip --python .venv/bin/python install -q uv 2>/dev/null \
        || { .venv/bin/python -m ensurepip -q && .venv/bin/python -m pip install -q uv; }
fi
# uv installs the same packages as pip in a fraction of the time (parallel downloads, no per-package
# subprocess): on a fresh clone here 2.3 s instead of 30 s, and about a second when .venv is up to date.
.venv/bin/uv pip install -q --python .venv/bin/python --constraint tools/test-constraints.txt -e '.[test]'
# Bytecode for every installed module, compiled while ruff and mypy run (15 s of CPU on a fresh .venv, mypy
# 10 s on one core): the tests start hundreds of Python processes, each would otherwise compile what it imports.
# (tpu_tools, installed in place, and the tests too: else the four workers and the first programs they start
# all compile the same modules at once)
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    tpu_tools tests tools >/dev/null 2>&1 &
compiling=$!
# libtpu's own SDK, the second client the tests hold every fixture metrics service to (tests/libtpu_sdk.py).
# It goes into .libtpu/, not .venv: installed there, JAX would see a TPU plugin, the tests would pin JAX to the
# CPU platform and skip those about JAX's own choice of platform. Only the SDK's child processes load it.
LIBTPU_VERSION=0.0.51
# (its wheels are built per Python: one for another interpreter is installed anew)
if ! grep -qs "^Tag: cp${wanted/./}-" ".libtpu/libtpu-$LIBTPU_VERSION.dist-info/WHEEL"; then
    rm -rf .libtpu
    .venv/bin/uv pip install -q --python .venv/bin/python --no-deps --target .libtpu "libtpu==$LIBTPU_VERSION"
fi
export TPU_TOOLS_TEST_REQUIRE_LIBTPU=1  # the SDK's tests fail here rather than skip when it cannot run
# PyTorch/XLA, the second PJRT frontend the agent serves (tests/torch_xla_env.py): torch 2.9.0's PyPI wheel imports
# only with NVIDIA's CUDA wheels beside it (3 GB to download, 7 GB installed), so it gets an environment of its own
# outside the clone, made once per user and interpreter and reused by every clone (CI caches the directory). Its
# `complete` marker is written last: an install cut short is made again. tpu_tools comes from the clone (PYTHONPATH).
TORCH_XLA_VERSION=2.9.0
torch_xla_env="${TPU_TOOLS_TEST_TORCH_XLA_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tpu-tools/torch-xla-$TORCH_XLA_VERSION-cp${wanted/./}}"
if [ ! -f "$torch_xla_env/complete" ]; then
    mkdir -p "$(dirname "$torch_xla_env")"
    (
        flock 9  # two clones installing at once: the second waits and finds it complete
        if [ ! -f "$torch_xla_env/complete" ]; then
            echo "installing torch and torch_xla $TORCH_XLA_VERSION into $torch_xla_env (3 GB, once)"
            rm -rf "$torch_xla_env"
            .venv/bin/uv venv -q --python "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" \
                "$torch_xla_env" \
                && .venv/bin/uv pip install -q --python "$torch_xla_env/bin/python" \
                    --constraint tools/test-constraints.txt -r pyproject.toml \
                    "torch==$TORCH_XLA_VERSION" "torch_xla==$TORCH_XLA_VERSION" \
                && echo "torch==$TORCH_XLA_VERSION torch_xla==$TORCH_XLA_VERSION" > "$torch_xla_env/complete" \
                || echo "could not install torch_xla into $torch_xla_env; its tests fail"
        fi
    ) 9>"$torch_xla_env.lock"
fi
if [ -f "$torch_xla_env/complete" ]; then  # a dependency added since the environment was made (quick when none)
    (flock 9; .venv/bin/uv pip install -q --python "$torch_xla_env/bin/python" \
        --constraint tools/test-constraints.txt -r pyproject.toml) 9>"$torch_xla_env.lock"
fi
export TPU_TOOLS_TEST_TORCH_XLA_PYTHON="$torch_xla_env/bin/python"
export TPU_TOOLS_TEST_REQUIRE_TORCH_XLA=1  # the torch_xla tests fail here rather than skip when it cannot import
# Coverage through sys.monitoring where the interpreter has it (3.12+); 3.11 keeps coverage's C tracer.
if runs_3_12 .venv/bin/python; then
    export COVERAGE_CORE=sysmon
fi
# Lint and types first: they take seconds and fail CI like a test (configuration in pyproject.toml).
.venv/bin/ruff check --quiet .
.venv/bin/mypy
wait "$compiling" || true  # a module that does not compile is compiled (and fails) where it is imported
# The tests run in parallel: most of a test's time is spent waiting on the programs it starts (a runtime
# coming up, a deadline, a scrape), so two workers per core keep the machine busy. TPU_TOOLS_TEST_WORKERS
# overrides (0: one process). --dist worksteal: each worker starts with a contiguous share of the tests, file
# after file, so a module fixture (a real JAX job, a server, a bundle) is mostly started once; a worker that runs
# out takes half of what the busiest one has left, so no core idles at the end while one worker finishes a long
# file (one seed, side by side: 288 s, against 314 s with each file on one worker, --dist loadfile). The order
# is random (pytest-randomly prints the seed; --randomly-seed=N replays it).
workers="${TPU_TOOLS_TEST_WORKERS:-$(( $(nproc) * 2 ))}"
# Bytecode is kept (PYTHONDONTWRITEBYTECODE, if the shell sets it, is dropped here): every worker would
# otherwise rewrite and compile all the test modules again (2 s each), and every program the tests start
# would compile the tpu_tools modules it imports.
unset PYTHONDONTWRITEBYTECODE
if [ "$#" -eq 0 ]; then
    # The whole suite, as CI runs it: with coverage of every process the tests start, and its floor.
    exec .venv/bin/python -m pytest -n "$workers" --dist worksteal --cov --cov-report=term
fi
exec .venv/bin/python -m pytest "$@"
