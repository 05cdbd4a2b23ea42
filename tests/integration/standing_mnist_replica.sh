#!/usr/bin/env bash
# MNIST-replica with --existing_servers: 1 ps + 2 standing worker tasks (dg-server); the two
# worker programs start no server and train through the master service of their own task.
# Asynchronous training at the default rate 0.01 for 2000 steps gave 0.821-0.855 (a CI run 0.8084)
# against the bar of 0.82; at rate 0.005 for 3000 steps ten runs gave 0.855-0.870. Worker 0
# asks for log_device_placement: the lines come back to its own standard error, the standing
# servers print none.
source "$(dirname "$0")/common.bash"
read -r P0 P1 P2 <<< "$(free_ports 3)"
SPEC="ps|127.0.0.1:$P0;worker|127.0.0.1:$P1,127.0.0.1:$P2"
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1,127.0.0.1:$P2"
start_servers "$SPEC" ps:0 worker:0 worker:1
for i in 0 1; do
    extra=()
    [ "$i" = 0 ] && extra=(--log_device_placement)
    "$BIN/mnist_replica" --job_name worker --task_index $i $H --existing_servers --train_steps 3000 \
        --learning_rate 0.005 --log_every 500 "${extra[@]}" > "$TMP/w$i" 2> "$TMP/e$i" &
    W[$i]=$!
    PIDS+=(${W[$i]})
done
for i in 0 1; do wait "${W[$i]}" || { cat "$TMP/w$i" "$TMP/e$i"; fail "worker program $i failed"; }; done
grep -q "^hid_w: (VariableV2): /job:ps/replica:0/task:0/device:CPU:0$" "$TMP/e0" ||
    { head -20 "$TMP/e0"; fail "worker 0's placement log did not reach its standard error"; }
grep -q "(VariableV2)" "$TMP/e1" && fail "worker 1 printed a placement log it did not ask for"
grep -l "(VariableV2)" "$TMP"/server_* && fail "a standing server printed the placement log"
echo "placement log: $(grep -c ': (' "$TMP/e0") lines at worker 0"
grep "validation accuracy" "$TMP/w0" "$TMP/w1"
acc=$(sed -n 's/.*validation accuracy = \([^ ]*\) .*/\1/p' "$TMP/w0")
check_ge "accuracy" "$acc" 0.82
for p in $P0 $P1 $P2; do
    g=$(task_stat "dg://127.0.0.1:$p" registered_graphs)
    [ "$g" = 0 ] || fail "task at port $p still holds $g partitions after the worker programs ended"
done
echo "PASS standing_mnist_replica"
