# Helpers for the benchmark scripts (sourced, after `cd` to the repository root): a temporary
# directory $TMP and a list $PIDS of processes, both cleaned up at exit; free ports; the
# training rate of MNIST-replica logs; a median.
TMP=$(mktemp -d)
PIDS=()
bench_cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap bench_cleanup EXIT
# ports N: N free TCP ports of 127.0.0.1, on one line.
ports() { python3 -c 'import socket,sys
s=[socket.socket() for _ in range(int(sys.argv[1]))]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"; }
# rate LOGS...: $STEPS global steps over the first "Training begins @" to the last
# "Training ends @" of the logs, in steps/s.
rate() {
    cat "$@" | awk -v steps="$STEPS" '
        /Training begins @/ { b = $NF; if (!first || b < first) first = b }
        /Training ends @/ { e = $NF; if (e > last) last = e }
        END { printf "%.1f", steps / (last - first) }'
}
# median < numbers, one a line.
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
