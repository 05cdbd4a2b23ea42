#!/usr/bin/env bash
# A picture of a step timeline in a trace viewer, as docs/timeline.png: MNIST-replica (1 ps +
# 2 workers) with --trace_step, the file checked against the trace-event format
# (tests/tools/validate_trace.py), turned into a standalone page by catapult's trace2html (the
# viewer of chrome://tracing) and captured by Debian's chromium-headless-shell through the
# DevTools protocol (scripts/trace_viewer_shot.py: the viewer imports in animation frames, which
# --screenshot does not wait for).
#   scripts/timeline_picture.sh [OUT.png]      (default docs/timeline.png)
# CATAPULT: a checkout of github.com/catapult-project/catapult (default: a sparse clone made once
# in ~/.cache/distgraph/catapult).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$(realpath "${1:-docs/timeline.png}")
command -v chromium-headless-shell >/dev/null || { echo "needs chromium-headless-shell (apt-get install chromium-headless-shell)" >&2; exit 2; }
CATAPULT=${CATAPULT:-${XDG_CACHE_HOME:-$HOME/.cache}/distgraph/catapult}
if [ ! -f "$CATAPULT/tracing/bin/trace2html" ]; then
    echo "cloning catapult's trace viewer into $CATAPULT"
    git clone -q --depth 1 --filter=blob:none --sparse https://github.com/catapult-project/catapult "$CATAPULT"
    git -C "$CATAPULT" sparse-checkout set tracing common/py_vulcanize common/py_utils third_party/six \
        third_party/polymer third_party/beautifulsoup4-4.9.3 third_party/html5lib-1.1 third_party/webencodings-0.5.1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"   # relative paths: the picture shows nothing of this machine
echo "training 1000 steps, tracing worker 0's step 300"
"$root/build/bin/dg-launch" --ps 1 --workers 2 -- "$root/build/bin/mnist_replica" --train_steps 1000 \
    --trace_step 300 --quiet --log_every 100000 | grep "timeline"
python3 "$root/tests/tools/validate_trace.py" timeline_worker0_step300.json --strict
python3 "$CATAPULT/tracing/bin/trace2html" --quiet --title "MNIST-replica, 1 ps + 2 workers: worker 0, step 300" \
    --output timeline.html timeline_worker0_step300.json
SELECT=MatMul python3 "$root/scripts/trace_viewer_shot.py" timeline.html "$out" 1600 1050
echo "wrote $out"
