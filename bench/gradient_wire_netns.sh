#!/usr/bin/env bash
# gradient_wire_netns: MNIST-replica by all-reduce over 2 workers on two "hosts" (network
# namespaces joined by one virtual Ethernet link shaped to RATE, default 1gbit, by a token
# bucket), with the gradients on the wire in float32 and as bfloat16 (--gradient_wire bf16),
# ROUNDS rounds (default 2) of STEPS steps (default 1000) each, alternately. JSON lines: the
# median steps/s of each, the bytes per step worker 0 sent, the ratio bfloat16 / float32, and
# the link's bound: RATE over the float32 bytes a step moves each way. Needs root and iproute2
# (ip, tc); the cluster authenticates with a key directory, as between real hosts.
#   RATE=1gbit ROUNDS=2 bench/gradient_wire_netns.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-1gbit}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-1000}
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
[ "$(id -u)" -eq 0 ] || { echo "gradient_wire_netns: needs root (network namespaces)" >&2; exit 2; }
tag="dgw$$"
cleanup_ns() {
    bench_cleanup
    for i in 0 1; do
        ip netns pids "${tag}h$i" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
        ip netns del "${tag}h$i" 2> /dev/null || true
    done
}
trap cleanup_ns EXIT
net="10.$((200 + RANDOM % 50)).$((RANDOM % 250))"
ip link add "${tag}a" type veth peer name "${tag}b"
for i in 0 1; do
    ns="${tag}h$i"
    ip netns add "$ns"
    dev="${tag}a"
    [ "$i" -eq 1 ] && dev="${tag}b"
    ip link set "$dev" netns "$ns"
    ip -n "$ns" link set "$dev" name eth0
    ip -n "$ns" addr add "$net.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 100ms
done
PORT=2222
H="--worker_hosts $net.1:$PORT,$net.2:$PORT"
# shellcheck disable=SC2086
"$BIN/dg-server" --gen_keys "$TMP/keys" $H > /dev/null
export DG_KEY_DIR="$TMP/keys"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
for w in float32 bf16; do : > "$TMP/$w"; done
for round in $(seq "$ROUNDS"); do
    for w in float32 bf16; do
        for i in 0 1; do
            # shellcheck disable=SC2086
            ip netns exec "${tag}h$i" "$BIN/mnist_replica" --job_name worker --task_index $i $H --all_reduce \
                --train_steps "$STEPS" --gradient_wire $w --quiet --log_every 1000000 > "$TMP/w$i" 2>&1 &
            PIDS+=($!)
        done
        wait || { cat "$TMP/w0" "$TMP/w1" >&2; exit 1; }
        PIDS=()
        rate=$(awk -v steps="$STEPS" '/Training begins @/ { b = $NF } /Training ends @/ { e = $NF }
            END { printf "%.1f", steps / (e - b) }' "$TMP/w0")
        echo "$rate" >> "$TMP/$w"
        sed -n 's/.*Worker 0: transport: .*, \([0-9]*\) per local step.*/\1/p' "$TMP/w0" > "$TMP/$w.bytes"
        acc=$(sed -n 's/.*Worker 0: validation accuracy = \([0-9.]*\).*/\1/p' "$TMP/w0")
        echo "round $round, $w: $rate steps/s, $(cat "$TMP/$w.bytes") bytes per step, accuracy $acc" >&2
    done
done
f=$(median < "$TMP/float32")
h=$(median < "$TMP/bf16")
bps=$(python3 -c 'import re,sys; m=re.match(r"([0-9.]+)([kmg]?)bit$", sys.argv[1].lower()); print(float(m.group(1))*{"":1,"k":1e3,"m":1e6,"g":1e9}[m.group(2)]/8)' "$RATE")
bound=$(awk -v r="$bps" -v b="$(cat "$TMP/float32.bytes")" 'BEGIN { printf "%.1f", r / b }')
for w in float32 bf16; do
    v=$f
    [ $w = bf16 ] && v=$h
    echo "{\"bench\": \"gradient_wire_netns\", \"gradient_wire\": \"$w\", \"metric\": \"steps_per_s\", \"value\": $v, \"bytes_per_step\": $(cat "$TMP/$w.bytes"), \"link\": \"$RATE\", \"rounds\": $ROUNDS, \"steps\": $STEPS, \"cpu\": \"$cpu\"}"
done
echo "{\"bench\": \"gradient_wire_netns\", \"metric\": \"bf16_over_float32\", \"value\": $(awk -v a="$h" -v b="$f" 'BEGIN { printf "%.2f", a / b }'), \"unit\": \"ratio\", \"float32_link_bound_steps_per_s\": $bound}"
