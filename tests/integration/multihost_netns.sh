#!/usr/bin/env bash
# A cluster across hosts: 1 ps + 2 workers of MNIST-replica, each in a network namespace of its
# own (a "host"), the three joined by virtual Ethernet links to a bridge in a fourth namespace;
# their addresses (10.x.y.1-3/24) exist inside those namespaces only. The tasks listen on every
# interface (their addresses are not loopback ones), so protected mode demands keys: the
# cluster authenticates with a key directory (CurveZMQ). The cluster names hosts, not
# addresses: each namespace has its own /etc/hosts (ip netns exec mounts /etc/netns/NS/hosts),
# and on the ps's host its own name resolves to an address on none of its interfaces, as a
# Kubernetes service name does. Checks:
#   - training reaches test accuracy >= 0.82 (4000 global steps at learning rate 0.005:
#     asynchronous training at the default 0.01 ended between 0.79 and 0.86 from run to run
#     on a loaded machine after 2000 steps, and once at 0.8198 after 4000, in the tenth of ten
#     ctest runs; at 0.005 ps_async_training and standing_mnist_replica keep 0.85-0.87);
#   - the ps received its values over TCP: no frame through shared memory (the same-host path
#     turns itself off between hosts, though the namespaces share /dev/shm);
#   - a ps killed mid-training is reported by the worker by task name and address.
# Skipped (exit 77), not passed, where network namespaces cannot be made (not root, no ip).
source "$(dirname "$0")/common.bash"
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
command -v ip > /dev/null || skip "no ip command (iproute2)"
tag="dg$$"
probe="${tag}probe"
ip netns add "$probe" 2> /dev/null || skip "this machine does not allow network namespaces"
ip netns del "$probe"
NSS=()
cleanup_netns() {
    cleanup
    for ns in "${NSS[@]:-}"; do
        [ -n "$ns" ] || continue
        ip netns pids "$ns" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
        ip netns del "$ns" 2> /dev/null || true
        rm -rf "/etc/netns/$ns"
    done
}
trap cleanup_netns EXIT
sw="${tag}sw"
ip netns add "$sw"
NSS+=("$sw")
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
net="10.$((200 + RANDOM % 50)).$((RANDOM % 250))"
for i in 0 1 2; do
    ns="${tag}h$i"
    ip netns add "$ns"
    NSS+=("$ns")
    ip link add "${tag}a$i" type veth peer name "${tag}b$i"
    ip link set "${tag}a$i" netns "$ns"
    ip link set "${tag}b$i" netns "$sw"
    ip -n "$ns" link set "${tag}a$i" name eth0
    ip -n "$ns" addr add "$net.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$sw" link set "${tag}b$i" master br0 up
    # Names: ps0 is host 0 (but, on host 0 itself, a "service" address that no interface has).
    mkdir -p "/etc/netns/$ns"
    ps_addr="$net.1"
    [ "$i" -eq 0 ] && ps_addr="$net.100"
    printf '127.0.0.1 localhost\n%s ps0.%s.test\n%s w0.%s.test\n%s w1.%s.test\n' "$ps_addr" "$tag" "$net.2" "$tag" \
        "$net.3" "$tag" > "/etc/netns/$ns/hosts"
done
# The links carry TCP (a listener on host 0, a connection from host 1; no ping needed).
ip netns exec "${tag}h0" python3 -c 'import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 9)); s.listen(1); s.settimeout(10); s.accept()' "$net.1" &
lsn=$!
sleep 0.3
ip netns exec "${tag}h1" python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], 9), timeout=5)' "$net.1" ||
    fail "host 1 cannot reach host 0 over the links"
wait "$lsn" || fail "host 0 saw no connection from host 1"
PORT=2222
PS_HOST="ps0.$tag.test"
H="--ps_hosts $PS_HOST:$PORT --worker_hosts w0.$tag.test:$PORT,w1.$tag.test:$PORT"
# shellcheck disable=SC2086
"$BIN/dg-server" --gen_keys "$TMP/keys" $H > /dev/null || fail "dg-server --gen_keys"
export DG_KEY_DIR="$TMP/keys"
on() { local i=$1; shift; ip netns exec "${tag}h$i" "$@"; }
# Background tasks start with `ip netns exec` itself (which execs the program: $! is its pid).

# shellcheck disable=SC2086
ip netns exec "${tag}h0" "$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps" 2>&1 & PS=$!; PIDS+=($PS)
# shellcheck disable=SC2086
ip netns exec "${tag}h1" "$BIN/mnist_replica" --job_name worker --task_index 0 $H --train_steps 4000 --learning_rate 0.005 --quiet \
    --log_every 1000 \
    > "$TMP/w0" 2>&1 & W0=$!; PIDS+=($W0)
# shellcheck disable=SC2086
ip netns exec "${tag}h2" "$BIN/mnist_replica" --job_name worker --task_index 1 $H --train_steps 4000 --learning_rate 0.005 --quiet \
    --log_every 1000 \
    > "$TMP/w1" 2>&1 & W1=$!; PIDS+=($W1)
for w in W0 W1; do
    wait "${!w}" || { cat "$TMP/w0" "$TMP/w1" "$TMP/ps"; fail "worker $w failed"; }
done
grep -h "validation accuracy" "$TMP/w0" "$TMP/w1"
for w in w0 w1; do
    acc=$(sed -n 's/.*validation accuracy = \([^ ]*\) .*/\1/p' "$TMP/$w" | tail -1)
    [ -n "$acc" ] || { cat "$TMP/$w"; fail "$w printed no accuracy"; }
    check_ge "$w: accuracy" "$acc" 0.82
done
# The ps's counters, asked from another host with the client key.
stats=$(on 1 "$BIN/dg-inspect" server "dg://$PS_HOST:$PORT" --json) || fail "dg-inspect server from host 1"
echo "ps counters: $stats"
python3 - "$stats" <<'PY' || fail "the ps's counters"
import json, sys
s = json.loads(sys.argv[1])
assert s["shm_frames_received"] == 0 and s["shm_frames_sent"] == 0, "shared memory used between hosts"
assert s["bad_messages"] == 0, "bad messages"
PY
kill "$PS"
wait "$PS" 2> /dev/null || true

# A host's task dies mid-training: the worker names it.
# shellcheck disable=SC2086
ip netns exec "${tag}h0" "$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps2" 2>&1 & PS=$!; PIDS+=($PS)
# shellcheck disable=SC2086
ip netns exec "${tag}h1" "$BIN/mnist_replica" --job_name worker --task_index 0 $H --train_steps 1000000 --quiet --log_every 100 \
    --rpc_timeout_ms 3000 > "$TMP/w2" 2>&1 & W0=$!; PIDS+=($W0)
for _ in $(seq 300); do grep -q "training step" "$TMP/w2" && break; sleep 0.1; done
grep -q "training step" "$TMP/w2" || { cat "$TMP/w2" "$TMP/ps2"; fail "the worker never trained"; }
kill -9 "$PS" 2> /dev/null || { cat "$TMP/ps2"; fail "the second ps is not running"; }
rc=0
timeout 30 tail --pid="$W0" -f /dev/null || fail "the worker still runs 30 s after the ps host's task died"
wait "$W0" || rc=$?
tail -2 "$TMP/w2"
[ "$rc" -ne 0 ] || fail "the worker exited 0 although its ps is gone"
grep -q "/job:ps/replica:0/task:0" "$TMP/w2" || fail "the error does not name the ps task"
grep -q "$PS_HOST:$PORT" "$TMP/w2" || fail "the error does not name the ps host's address"
echo "PASS multihost_netns"
