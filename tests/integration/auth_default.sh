#!/usr/bin/env bash
# The README's demo configuration (dg-launch, no flags about keys) authenticates by default:
# a process without the job's keys can neither write (a training client through a worker's
# master service) nor read a counter, nor can one whose key is not the job's; the job's own
# client key gets in. A non-zero exit alone would not tell a refusal from a task that is not
# there: each refused client must add a refusal of its own to the log of the task it called, and
# the job's client key must get an answer from the same ps. The clients' own errors do not tell
# (mnist_replica's says the master did not answer; dg-inspect's says "refused the connection"
# or, when its deadline comes first, "did not answer": both seen in 8 tries).
source "$(dirname "$0")/common.bash"
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
if env -u DG_KEY_DIR "$BIN/mnist_replica" --existing_servers --job_name worker --task_index 0 \
        --ps_hosts "127.0.0.1:$PS" --worker_hosts "127.0.0.1:$WK" --train_steps 10 --wait_for_tasks_ms 3000 \
        > "$TMP/nokey" 2>&1; then
    cat "$TMP/nokey"
    fail "a client without keys trained on the job"
fi
echo "client without keys: $(tail -1 "$TMP/nokey")"
expect_refusal "the client without keys" worker0 "$(printf "$HANDSHAKE" "$WK")" "$before"
before=$(refusals ps0 "$(printf "$HANDSHAKE" "$PS")")
env -u DG_KEY_DIR "$BIN/dg-inspect" server "dg://127.0.0.1:$PS" > "$TMP/nokey_stat" 2>&1 &&
    fail "a client without keys read the ps's counters"
expect_refusal "dg-inspect without keys" ps0 "$(printf "$HANDSHAKE" "$PS")" "$before"
# Someone else's key, with the tasks' public keys (what a stranger could copy).
mkdir -m 700 "$TMP/stranger"
"$BIN/dg-server" --gen_keys "$TMP/stranger" --key_name client > /dev/null || fail "dg-server --gen_key"
cp "$KEYS"/127.0.0.1_*.pub "$TMP/stranger/"
before=$(refusals ps0 "its key is not in the key directory")
DG_KEY_DIR="$TMP/stranger" "$BIN/dg-inspect" server "dg://127.0.0.1:$PS" > "$TMP/stranger_stat" 2>&1 &&
    fail "a client whose key is not the job's read the ps's counters"
expect_refusal "dg-inspect with a stranger's key" ps0 "its key is not in the key directory" "$before"
# The job's client key still gets in after the refusals.
DG_KEY_DIR="$KEYS" "$BIN/dg-inspect" server "dg://127.0.0.1:$PS" > "$TMP/stat" 2>&1 || { cat "$TMP/stat"; fail "the job's client key was refused after the strangers"; }
echo "refusals logged: worker0 $(refusals worker0 .), ps0 $(refusals ps0 .)"
kill -TERM "$LAUNCH"
wait "$LAUNCH" || true
[ ! -e "$KEYS" ] || fail "dg-launch left its key directory behind"
echo "PASS"
