#!/usr/bin/env bash
# No two files of runtime/ call each other, no circle runs across layers, and every circle kept
# elsewhere is named with its reason in docs/ARCHITECTURE.md ("Who calls whom: circles"): read
# from the object files by tests/tools/source_circles.py (nm: what each defines and uses).
set -euo pipefail
src="${DG_SOURCE_DIR:?}"
build="${DG_BIN_DIR:?}/.."
command -v nm >/dev/null || { echo "SKIP: no nm (binutils)"; exit 77; }
python3 "$src/tests/tools/source_circles.py" "$build" "$src"
