#!/usr/bin/env bash
# Mistakes a new user makes, and what the tools answer now: each message names the fault and
# the fix, without source locations; help goes to stdout with defaults and exit statuses;
# every tool and example says its version. (The note of the change that added this test has
# the table of these messages beside TensorFlow's answers to the same mistakes.)
set -euo pipefail
bin="${DG_BIN_DIR:?}"
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset TF_CONFIG DG_KEY_DIR
# expect RC NEEDLE -- CMD...: runs CMD (stdin closed), wants exit status RC and NEEDLE in its
# output; prints the message so the test log shows it.
expect() {
    local want=$1 needle=$2 rc=0 out
    shift 3
    out=$("$@" < /dev/null 2>&1) || rc=$?
    echo "  $(basename "$1"): $(grep -F -- "$needle" <<< "$out" | head -1 | cut -c1-200)"
    [ "$rc" -eq "$want" ] || { echo "$out"; fail "$* exited $rc, expected $want"; }
    grep -qF -- "$needle" <<< "$out" || { echo "$out"; fail "$*: no \"$needle\" in the output"; }
    if grep -Eq '\.c:[0-9]+' <<< "$out"; then echo "$out"; fail "$*: a source location in the message"; fi
}

echo "a checkpoint path in a directory that does not exist yet: made, as TensorFlow makes it"
"$bin/dg-ckpt-writer" "$tmp/new/sub/ckpt.db" --steps 1 > /dev/null || fail "dg-ckpt-writer into a new directory"
[ -f "$tmp/new/sub/ckpt.db" ] || fail "the checkpoint was not written into the new directory"

echo "a directory this user cannot write to"
# Root writes anywhere a mode bit forbids, so as root the writer runs as nobody (65534), when
# that user can run it (the build tree may be in a directory only root can enter); failing
# that, the directory is made immutable (chattr +i stops root too, where the file system has
# the flag). A case that cannot be set up says SKIP and passes nothing.
mkdir -p "$tmp/ro"
chmod 755 "$tmp"
chmod 555 "$tmp/ro"
ro_as=()
ro_skip=""
if [ "$(id -u)" -ne 0 ]; then
    ro_as=()
elif command -v setpriv > /dev/null && { rc=0; setpriv --reuid=65534 --regid=65534 --clear-groups \
        "$bin/dg-ckpt-writer" < /dev/null > /dev/null 2>&1 || rc=$?; [ "$rc" -eq 2 ]; }; then   # 2: its usage
    ro_as=(setpriv --reuid=65534 --regid=65534 --clear-groups)
elif command -v chattr > /dev/null && chattr +i "$tmp/ro" 2> /dev/null; then
    trap 'chattr -i "$tmp/ro" 2> /dev/null; rm -rf "$tmp"' EXIT
else
    ro_skip="running as root, and neither can user nobody run $bin/dg-ckpt-writer (setpriv) nor can $tmp/ro be made immutable (chattr +i)"
fi
if [ -n "$ro_skip" ]; then
    echo "SKIP: a directory this user cannot write to: $ro_skip"
else
    if [ "${#ro_as[@]}" -gt 0 ]; then echo "  (run as user nobody: root may write anywhere)"; fi
    expect 1 "is not writable" -- "${ro_as[@]}" "$bin/dg-ckpt-writer" "$tmp/ro/ckpt.db" --steps 1
    [ ! -e "$tmp/ro/ckpt.db" ] || fail "a checkpoint was written into the directory that is not writable"
fi

echo "a task without --task_index"
expect 2 "missing --task_index" -- "$bin/mnist_replica" --job_name worker --ps_hosts 127.0.0.1:1 --worker_hosts 127.0.0.1:2
echo "a task index past the job's tasks"
expect 2 "--task_index 3 is out of range: job worker has 1 task (0 to 0)" -- "$bin/mnist_replica" --job_name worker \
    --task_index 3 --ps_hosts 127.0.0.1:1 --worker_hosts 127.0.0.1:2
echo "a chief task in TF_CONFIG"
TF_CONFIG='{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, "task": {"type": "chief", "index": 0}}' \
    expect 2 "TF_CONFIG's task.type is \"chief\"" -- "$bin/mnist_replica"
echo "a typo in a TF_CONFIG key"
TF_CONFIG='{"clsuter": {"worker": ["127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}' \
    expect 2 'unknown key "clsuter" at byte 1 (did you mean "cluster"?)' -- "$bin/dg-server"
echo "dg-mlp-graph help"
(cd "$tmp" && expect 2 "is not a file to write (did you mean --help?)" -- "$bin/dg-mlp-graph" help)
[ ! -e "$tmp/help" ] || fail "dg-mlp-graph wrote a file named help"
echo "a damaged checkpoint file: what is wrong, no SQL, no source line"
echo "not a database" > "$tmp/bad.db"
expect 1 "not an SQLite database" -- "$bin/dg-inspect" checkpoints "$tmp/bad.db"

echo "a strategy misspelt, and a cluster strategy without its ps tasks"
expect 2 'unknown kind "mirrorred" (mirrored, central_storage' -- "$bin/strategies" --strategy mirrorred
expect 1 'no "ps" job to hold the variables' -- "$bin/strategies" --strategy parameter_server --worker_hosts 127.0.0.1:1

echo "help on stdout, with defaults and exit statuses; --version everywhere"
for p in mnist_replica mlp_local exp_regression mirrored model_parallel in_graph_replication ps_coordinator strategies; do
    out=$("$bin/$p" --help 2> "$tmp/err") || fail "$p --help exited non-zero"
    [ -s "$tmp/err" ] && fail "$p --help wrote to stderr"
    grep -q "(default " <<< "$out" || fail "$p --help shows no defaults"
    grep -q "^Exit status:" <<< "$out" || fail "$p --help has no exit statuses"
done
ver=$("$bin/dg-server" --version | awk '{print $NF}')
for p in dg-server dg-launch dg-inspect dg-mlp-graph mnist_replica mlp_local; do
    out=$("$bin/$p" --version) || fail "$p --version exited non-zero"
    [ "$out" = "$p (distgraph) $ver" ] || fail "$p --version says \"$out\""
done
for p in dg-server dg-launch dg-inspect mnist_replica; do
    out=$("$bin/$p" --help) || fail "$p --help exited non-zero"
    grep -qi "exit status" <<< "$out" || fail "$p --help has no exit statuses"
done
echo "PASS user_mistakes (version $ver)"
