#!/usr/bin/env bash
# The layers and the runtime's rooms stand in a line (docs/ARCHITECTURE.md, "Layers"): a probe
# compiled with each part's own flags cannot include a header of a part to its right
# (tests/tools/include_line.py, over compile_commands.json).
set -euo pipefail
src="${DG_SOURCE_DIR:?}"
build="${DG_BIN_DIR:?}/.."
[ -f "$build/compile_commands.json" ] || { echo "FAIL: no $build/compile_commands.json (CMAKE_EXPORT_COMPILE_COMMANDS)"; exit 1; }
python3 "$src/tests/tools/include_line.py" "$build" "$src"
