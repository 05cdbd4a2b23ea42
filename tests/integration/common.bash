# Helpers for the integration tests (sourced). Real processes on 127.0.0.1.
set -euo pipefail
BIN="${DG_BIN_DIR:?DG_BIN_DIR must point at build/bin}"
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
# Free TCP ports on 127.0.0.1, one per argument slot.
free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
fail() { echo "FAIL: $*"; exit 1; }
