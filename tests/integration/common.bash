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
# The newest global step a worker's log reports ("... (global step: 241)"), or nothing.
last_step() { sed -n 's/.*(global step: \([0-9]*\)).*/\1/p' "$1" | tail -1; }
# Waits up to $3 twentieths of a second until log $1 reports global step $2 or more; prints
# the newest step seen (empty when none).
wait_step() {
    local s=""
    for _ in $(seq "$3"); do s=$(last_step "$1"); [ -n "$s" ] && [ "$s" -ge "$2" ] && break; sleep 0.05; done
    last_step "$1"
}
# Once log $1 reports global step $2 or more (waiting up to $3 twentieths of a second, and
# before $STEPS), SIGKILLs the ps ($PS) and, a second later, starts it again with the test's
# start_ps. Sets killed_at to the step seen.
kill_and_restart_ps() {
    killed_at=$(wait_step "$1" "$2" "$3")
    [ -n "$killed_at" ] && [ "$killed_at" -ge "$2" ] || { cat "$1"; fail "the chief never reached global step $2"; }
    [ "$killed_at" -lt "$STEPS" ] || fail "training ended before the ps could be killed"
    kill -9 "$PS"
    wait "$PS" 2>/dev/null || true
    echo "killed the ps at global step $killed_at"
    sleep 1
    start_ps
}
