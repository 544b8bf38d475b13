#!/usr/bin/env bash
# Run tests (arguments go to pytest) while a libtpu metrics service answers on libtpu's default address,
# 127.0.0.1:8431, as on a TPU VM with a job running. No test may depend on what listens on a default port.
# It all happens in a private network namespace, so no other program on this machine sees that service.
# Needs unshare and ip (util-linux, iproute2); run it from a checkout with .venv installed (tools/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--inside" ]; then
    as_root=()
    [ "$(id -u)" = 0 ] || as_root=(--map-root-user)
    exec unshare "${as_root[@]}" --net -- "$0" --inside "$@"
fi
shift
ip link set lo up
.venv/bin/python tests/libtpu_server.py v5e --port 8431 >/dev/null &
service=$!
trap 'kill "$service" 2>/dev/null || true' EXIT
for _ in $(seq 300); do
    (exec 3<>/dev/tcp/127.0.0.1/8431) 2>/dev/null && break
    sleep 0.1
done
(exec 3<>/dev/tcp/127.0.0.1/8431) 2>/dev/null || { echo "the service on 127.0.0.1:8431 did not start" >&2; exit 1; }
echo "a libtpu metrics service answers on 127.0.0.1:8431 (private network namespace)"
.venv/bin/python -m pytest "$@"
