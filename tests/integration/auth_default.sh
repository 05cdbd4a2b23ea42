#!/usr/bin/env bash
# The README's demo configuration (dg-launch, no flags about keys) authenticates by default:
# a process without the job's keys can neither write (a training client through a worker's
# master service) nor read a counter, nor can one whose key is not the job's; the job's own
# client key gets in. A non-zero exit alone would not tell a refusal from a task that is not
# there: each refused client must add a refusal of its own to the log of the task it called, and
# the job's client key must get an answer from the same ps. Each refused client must also be told
# itself, within a few seconds (its handshake monitor): UNAUTHENTICATED, naming what to fix (the
# keys it lacks, the key the server does not admit, a server key that is not the server's, a
# server without keys); it used to wait out its deadline and report the server as not answering.
source "$(dirname "$0")/common.bash"
# told WHAT FILE SECONDS PATTERN: the client's output FILE holds "UNAUTHENTICATED" and PATTERN,
# and it gave up within 5 s (SECONDS: how long it ran).
told() {
    grep -q "UNAUTHENTICATED.*$4" "$2" || { cat "$2"; fail "$1: not told UNAUTHENTICATED ... $4"; }
    [ "$3" -le 5 ] || { cat "$2"; fail "$1: took $3 s to give up"; }
    echo "$1 ($3 s): $(grep -o "UNAUTHENTICATED.*" "$2" | head -1)"
}
# refusals TASK WHY: how many lines "[TASK] ... refused a peer" matching WHY dg-launch's log holds.
refusals() { grep -c "^\[$1\] distgraph .*: refused a peer.*$2" "$TMP/launch" || true; }
# expect_refusal WHAT TASK WHY BEFORE: waits up to 5 s until TASK has logged more refusals
# matching WHY than BEFORE (the log line is written by the task's own thread).
expect_refusal() {
    for _ in $(seq 100); do [ "$(refusals "$2" "$3")" -gt "$4" ] && return 0; sleep 0.05; done
    grep refused "$TMP/launch" | tail -3 || true
    fail "$1: $2 logged no refusal (\"refused a peer.*$3\"): refused, or never reached?"
}
"$BIN/dg-launch" --ps 1 --workers 1 --timeout 120 -- "$BIN/mnist_replica" --train_steps 100000000 --log_every 100 \
    > "$TMP/launch" 2>&1 &
LAUNCH=$!
PIDS+=($LAUNCH)
for _ in $(seq 200); do grep -q "global step" "$TMP/launch" && break; sleep 0.05; done
grep -q "global step" "$TMP/launch" || { cat "$TMP/launch"; fail "the job did not train"; }
KEYS=$(sed -n 's/^dg-launch: keys for this job in \([^ ]*\) .*/\1/p' "$TMP/launch")
PS=$(sed -n 's/.*"ps": \["127.0.0.1:\([0-9]*\)"\].*/\1/p' "$TMP/launch")
WK=$(sed -n 's/.*"worker": \["127.0.0.1:\([0-9]*\)"\].*/\1/p' "$TMP/launch")
[ -n "$KEYS" ] && [ -d "$KEYS" ] && [ -n "$PS" ] && [ -n "$WK" ] || { cat "$TMP/launch"; fail "no key directory or ports in dg-launch's lines"; }
[ "$(stat -c %a "$KEYS")" = 700 ] || fail "the key directory is not private: $(stat -c %a "$KEYS")"
for f in "$KEYS"/*.key; do [ "$(stat -c %a "$f")" = 600 ] || fail "$f is not private"; done

# The job's client key gets an answer from the ps: the ps is up and answering.
DG_KEY_DIR="$KEYS" "$BIN/dg-inspect" server "dg://127.0.0.1:$PS" > "$TMP/stat" 2>&1 || { cat "$TMP/stat"; fail "the job's client key was refused"; }
grep -q "^connections [1-9]" "$TMP/stat" || { cat "$TMP/stat"; fail "no connections counted"; }

# No keys: a client that would train (write the model) through worker 0's master service.
HANDSHAKE="connecting to tcp://127.0.0.1:%s: handshake failed"
before=$(refusals worker0 "$(printf "$HANDSHAKE" "$WK")")
t0=$SECONDS
if env -u DG_KEY_DIR "$BIN/mnist_replica" --existing_servers --job_name worker --task_index 0 \
        --ps_hosts "127.0.0.1:$PS" --worker_hosts "127.0.0.1:$WK" --train_steps 10 --wait_for_tasks_ms 30000 \
        > "$TMP/nokey" 2>&1; then
    cat "$TMP/nokey"
    fail "a client without keys trained on the job"
fi
told "a training client without keys" "$TMP/nokey" $((SECONDS - t0)) \
    "admits only holders of its cluster's CurveZMQ keys and this process has none; set DG_KEY_DIR"
expect_refusal "the client without keys" worker0 "$(printf "$HANDSHAKE" "$WK")" "$before"
before=$(refusals ps0 "$(printf "$HANDSHAKE" "$PS")")
t0=$SECONDS
env -u DG_KEY_DIR "$BIN/dg-inspect" server "dg://127.0.0.1:$PS" > "$TMP/nokey_stat" 2>&1 &&
    fail "a client without keys read the ps's counters"
told "dg-inspect without keys" "$TMP/nokey_stat" $((SECONDS - t0)) "this process has none"
expect_refusal "dg-inspect without keys" ps0 "$(printf "$HANDSHAKE" "$PS")" "$before"
# Someone else's key, with the tasks' public keys (what a stranger could copy).
mkdir -m 700 "$TMP/stranger"
"$BIN/dg-server" --gen_keys "$TMP/stranger" --key_name client > /dev/null || fail "dg-server --gen_key"
cp "$KEYS"/127.0.0.1_*.pub "$TMP/stranger/"
before=$(refusals ps0 "its key is not in the key directory")
t0=$SECONDS
DG_KEY_DIR="$TMP/stranger" "$BIN/dg-inspect" server "dg://127.0.0.1:$PS" > "$TMP/stranger_stat" 2>&1 &&
    fail "a client whose key is not the job's read the ps's counters"
told "dg-inspect with a stranger's key" "$TMP/stranger_stat" $((SECONDS - t0)) "refused this process's CurveZMQ key"
expect_refusal "dg-inspect with a stranger's key" ps0 "its key is not in the key directory" "$before"
# A key directory of another cluster: its server key is not the ps's.
mkdir -m 700 "$TMP/other"
"$BIN/dg-server" --gen_keys "$TMP/other" --key_name client > /dev/null || fail "dg-server --gen_key"
"$BIN/dg-server" --gen_keys "$TMP/other" --key_name "127.0.0.1_$PS" > /dev/null || fail "dg-server --gen_key"
t0=$SECONDS
DG_KEY_DIR="$TMP/other" "$BIN/dg-inspect" server "dg://127.0.0.1:$PS" > "$TMP/other_stat" 2>&1 &&
    fail "a client holding another server key read the ps's counters"
told "dg-inspect with another cluster's keys" "$TMP/other_stat" $((SECONDS - t0)) \
    "127.0.0.1_$PS.pub in its key directory, or DG_CURVE_PUBLIC_KEY) is not that server's key"
# The job's client key still gets in after the refusals.
DG_KEY_DIR="$KEYS" "$BIN/dg-inspect" server "dg://127.0.0.1:$PS" > "$TMP/stat" 2>&1 || { cat "$TMP/stat"; fail "the job's client key was refused after the strangers"; }
echo "refusals logged: worker0 $(refusals worker0 .), ps0 $(refusals ps0 .)"
kill -TERM "$LAUNCH"
wait "$LAUNCH" || true
[ ! -e "$KEYS" ] || fail "dg-launch left its key directory behind"
# The other way round: a client with keys and a server without (no key directory: what
# dg-launch --no_auth starts).
read -r P0 <<< "$(free_ports 1)"
env -u DG_KEY_DIR "$BIN/dg-server" --cluster_spec "ps|127.0.0.1:$P0" --job_name ps --task_index 0 > "$TMP/noauth" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do grep -q "listening\|serving\|started" "$TMP/noauth" && break; sleep 0.05; done
env -u DG_KEY_DIR "$BIN/dg-inspect" server "dg://127.0.0.1:$P0" > /dev/null 2>&1 || { cat "$TMP/noauth"; fail "the server without keys does not answer"; }
"$BIN/dg-server" --gen_keys "$TMP/other" --key_name "127.0.0.1_$P0" > /dev/null || fail "dg-server --gen_key"
t0=$SECONDS
DG_KEY_DIR="$TMP/other" "$BIN/dg-inspect" server "dg://127.0.0.1:$P0" > "$TMP/keyed_stat" 2>&1 &&
    fail "a client with keys read a server without"
told "dg-inspect with keys, a server without" "$TMP/keyed_stat" $((SECONDS - t0)) "runs without authentication"
echo "PASS"
