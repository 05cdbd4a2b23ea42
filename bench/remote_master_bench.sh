#!/usr/bin/env bash
# remote_master_bench: what the client/master split costs, beside TensorFlow, back to back.
#   trivial: one standing dg-server; remote_step_bench times a trivial step (a scalar fed,
#            x + 1 fetched) through its master service from another process, and in a local
#            session; peer: bench/peers/tf_remote_master.py --mode trivial (tf.compat.v1.Session
#            on grpc:// against a tf.distribute.Server).
#   mnist:   MNIST-replica, 1 ps + 2 workers, STEPS global steps: with the in-process master
#            (dg-launch, each worker program runs its own server) and with --existing_servers
#            (standing dg-server tasks, the worker programs start none), with the local channel
#            (the default on one host) and without it (DG_LOCAL_CHANNEL=0); REPS rounds of the
#            three alternating, medians (default 5); peer: TensorFlow's existing-servers
#            equivalent (tf_remote_master.py --mode mnist), once.
# JSON lines; the ratios last. TF_PYTHON: a python with tensorflow-cpu (peers skipped if
# absent). MODES=trivial,mnist picks (default both). Needs build/bin (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-6000}
REPS=${REPS:-5}
MODES=${MODES:-trivial,mnist}
TFPY=${TF_PYTHON:-}
BIN=build/bin
source bench/lib.bash
have_tf() { [ -n "$TFPY" ] && "$TFPY" -c "import tensorflow" 2>/dev/null; }
json_value() { sed -n "s/.*\"metric\": \"$1\".*\"value\": \([0-9.]*\).*/\1/p" "$2" | head -1; }
ratio() {   # ratio NAME A B: A / B
    [ -n "$2" ] && [ -n "$3" ] && awk -v n="$1" -v a="$2" -v b="$3" \
        'BEGIN { printf "{\"bench\": \"remote_master_bench\", \"metric\": \"%s\", \"value\": %.2f, \"unit\": \"x\"}\n", n, a / b }'
    return 0
}
mnist_line() {   # NAME RATE ACC
    echo "{\"bench\": \"remote_master_bench\", \"impl\": \"distgraph\", \"mode\": \"$1\", \"metric\": \"global_steps_per_s\", \"value\": $2, \"unit\": \"steps/s\", \"ps\": 1, \"workers\": 2, \"steps\": $STEPS, \"reps\": $REPS, \"test_accuracy\": ${3:-null}}"
}

if [[ ",$MODES," == *,trivial,* ]]; then
    read -r P <<< "$(ports 1)"
    $BIN/dg-server --cluster_spec "worker|127.0.0.1:$P" --job_name worker --task_index 0 --quiet & PIDS+=($!)
    $BIN/remote_step_bench --target "dg://127.0.0.1:$P" | tee "$TMP/ours_trivial"
    if have_tf; then
        "$TFPY" bench/peers/tf_remote_master.py --mode trivial 2>"$TMP/tf_trivial.err" | tee "$TMP/tf_trivial" ||
            { echo "remote_master_bench: the TensorFlow peer failed:" >&2; tail -5 "$TMP/tf_trivial.err" >&2; }
        ratio tf_over_ours_trivial_step "$(json_value trivial_step_us "$TMP/tf_trivial")" \
            "$(json_value trivial_step_us "$TMP/ours_trivial")"
    else
        echo "remote_master_bench: no TF_PYTHON with tensorflow; skipped the TensorFlow peer" >&2
    fi
fi

if [[ ",$MODES," == *,mnist,* ]]; then
    existing_run() {   # existing_run NAME [ENV=VALUE]: standing servers, the worker programs as clients
        local out=$1 env=${2:-DG_LOCAL_CHANNEL=1}
        read -r P0 P1 P2 <<< "$(ports 3)"
        local SPEC="ps|127.0.0.1:$P0;worker|127.0.0.1:$P1,127.0.0.1:$P2" S=() W=()
        for t in ps:0 worker:0 worker:1; do
            $BIN/dg-server --cluster_spec "$SPEC" --job_name "${t%%:*}" --task_index "${t##*:}" --quiet & S+=($!)
        done
        PIDS+=("${S[@]}")
        for i in 0 1; do
            env "$env" $BIN/mnist_replica --job_name worker --task_index $i --ps_hosts "127.0.0.1:$P0" \
                --worker_hosts "127.0.0.1:$P1,127.0.0.1:$P2" --existing_servers --train_steps "$STEPS" \
                --log_every 1000000 > "$TMP/ex$i" 2>&1 & W+=($!)
        done
        for w in "${W[@]}"; do wait "$w" || { cat "$TMP"/ex*; exit 1; }; done
        kill -9 "${S[@]}" 2>/dev/null || true
        wait "${S[@]}" 2>/dev/null || true
        echo "$(rate "$TMP/ex0" "$TMP/ex1")" > "$TMP/rate_$out"
        sed -n 's/.*validation accuracy = \([0-9.]*\).*/\1/p' "$TMP/ex0" | head -1 > "$TMP/acc_$out"
    }
    # REPS rounds of the three, alternating (the machine's noise moves each run by several %):
    # medians, and the ratio of the medians.
    for r in $(seq 1 "$REPS"); do
        $BIN/dg-launch --ps 1 --workers 2 --timeout 600 --no_auth -- $BIN/mnist_replica --train_steps "$STEPS" --quiet \
            --log_every 1000000 > "$TMP/inproc" 2>&1 || { cat "$TMP/inproc"; exit 1; }
        echo "$(rate "$TMP/inproc")" > "$TMP/rate_inproc_$r"
        sed -n 's/.*validation accuracy = \([0-9.]*\).*/\1/p' "$TMP/inproc" | head -1 > "$TMP/acc_inproc_$r"
        existing_run "existing_$r"
        existing_run "socket_$r" DG_LOCAL_CHANNEL=0
        echo "remote_master_bench: round $r: in-process $(cat "$TMP/rate_inproc_$r"), existing servers" \
             "$(cat "$TMP/rate_existing_$r"), without the local channel $(cat "$TMP/rate_socket_$r") global steps/s" >&2
    done
    inproc=$(cat "$TMP"/rate_inproc_* | median)
    existing=$(cat "$TMP"/rate_existing_* | median)
    socket=$(cat "$TMP"/rate_socket_* | median)
    mnist_line in_process_master "$inproc" "$(cat "$TMP/acc_inproc_1")"
    mnist_line existing_servers "$existing" "$(cat "$TMP/acc_existing_1")"
    mnist_line existing_servers_no_local_channel "$socket" "$(cat "$TMP/acc_socket_1")"
    ratio existing_servers_over_in_process "$existing" "$inproc"
    ratio existing_servers_no_local_channel_over_in_process "$socket" "$inproc"
    if have_tf; then
        "$TFPY" bench/peers/tf_remote_master.py --mode mnist --train_steps "$STEPS" 2>"$TMP/tf_mnist.err" |
            tee "$TMP/tf_mnist" || { echo "remote_master_bench: the TensorFlow peer failed:" >&2; tail -5 "$TMP/tf_mnist.err" >&2; }
        ratio existing_servers_over_tensorflow "$existing" "$(json_value existing_servers_global_steps_per_s "$TMP/tf_mnist")"
    fi
fi
