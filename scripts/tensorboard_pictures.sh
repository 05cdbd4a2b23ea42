#!/usr/bin/env bash
# Pictures of TensorBoard's scalar and graph views of a demo run, as in docs/: MNIST-replica
# (1 ps + 2 workers, 3000 steps) with --logdir, TensorBoard (the tensorboard package in
# DG_TB_VENV, default ~/.cache/distgraph/tb-venv, made as tests/integration/tensorboard_events.sh
# makes it) serving that directory, and Debian's chromium-headless-shell taking the screenshots.
#   scripts/tensorboard_pictures.sh [OUT_DIR]      (default docs/)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$(realpath "${1:-docs}")
VENV=${DG_TB_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/distgraph/tb-venv}
[ -x "$VENV/bin/tensorboard" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q tensorboard; }
command -v chromium-headless-shell >/dev/null || { echo "needs chromium-headless-shell (apt-get install chromium-headless-shell)" >&2; exit 2; }
tmp=$(mktemp -d)
tb=
trap '[ -n "$tb" ] && kill "$tb" 2>/dev/null; rm -rf "$tmp"' EXIT
cd "$tmp"   # relative paths: the pictures show "logs", nothing of this machine
echo "training 3000 steps into logs/mnist_replica"
"$root/build/bin/dg-launch" --ps 1 --workers 2 -- "$root/build/bin/mnist_replica" --train_steps 3000 \
    --logdir logs/mnist_replica --quiet --log_every 100000 | grep "accuracy"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$VENV/bin/tensorboard" --logdir logs --host 127.0.0.1 --port "$port" > "$tmp/tb.log" 2>&1 &
tb=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.2; done
for view in scalars graphs; do
    chromium-headless-shell --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,800 \
        --virtual-time-budget=20000 --screenshot="$out/tensorboard_$view.png" \
        "http://127.0.0.1:$port/?darkMode=false#$view" >/dev/null 2>&1
    echo "wrote $out/tensorboard_$view.png"
done
