#!/usr/bin/env bash
# The tests compare numbers one way (docs/CONTRIBUTING.md, "Numeric checks"): through
# testutil's dg_test_is_close / assert_close*, which fail on NaN. This fails on the patterns
# that pass a NaN or trust the program under test, wherever they come back:
#   - a failure guarded by `fabs(...) > tol` (false for NaN, so a NaN passes);
#   - fmax over errors or differences (fmax drops a NaN operand);
#   - a running maximum of differences (`if (d > max_diff) max_diff = d` never takes a NaN);
#   - an integration or smoke test taking a program's own verdict line ("curves match: yes")
#     as its result.
# Each pattern was shown to let a broken result through (tests/mutation/mutate.py).
set -euo pipefail
src="${DG_SOURCE_DIR:?}"
cd "$src"
bad=0
report() {   # report DESCRIPTION MATCHES
    if [ -n "$2" ]; then
        echo "FAIL: $1:"
        echo "$2"
        bad=1
    fi
}
# C sources of the tests, less the helper itself and the fuzz targets (no numeric checks).
mapfile -t cfiles < <(find tests -name '*.c' ! -path 'tests/fuzz/*' ! -name testutil.c | sort)
[ "${#cfiles[@]}" -gt 20 ] || { echo "FAIL: found only ${#cfiles[@]} test sources under tests/"; exit 1; }
report "a failure guarded by 'fabs(...) >' (a NaN passes it; use dg_test_is_close)" \
    "$(grep -nE 'if \(\s*fabsf?\(.*\)\s*>[^=]' "${cfiles[@]}" || true)"
report "a failure guarded by '> tol' or '> eps' (a NaN passes it; use dg_test_is_close)" \
    "$(grep -nE 'if \(.*[^<>=!-]>\s*(tol|eps|tolerance)\b' "${cfiles[@]}" || true)"
report "fmax over errors or differences (fmax drops NaN)" \
    "$(grep -nE 'fmaxf?\(\s*(diff|err|error|max_diff|max_err|d)\b' "${cfiles[@]}" || true)"
report "a running maximum of differences (NaN never enters it; use assert_close_f64)" \
    "$(grep -nE '>\s*max_(diff|err)\b' "${cfiles[@]}" || true)"
# Shell tests: a program's verdict line is no result.
mapfile -t sfiles < <(find tests/integration tests/smoke -name '*.sh' -o -name '*.bash' | sort)
report "a test that takes a program's verdict line as its result (check its numbers instead)" \
    "$(grep -nE 'grep[^|]*(match: yes|curves match|identical: yes|fell tenfold)' "${sfiles[@]}" || true)"
# The lint itself must see what it looks for: a sample of each pattern is caught.
sample=$(mktemp)
trap 'rm -f "$sample"' EXIT
printf '%s\n' '        if (fabs(got - want) > 1e-5) fail();' '            if (d > max_diff) max_diff = d;' \
    '    diff = fmax(diff, fabs(a[i] - b[i]));' '    if (v - w > tol) fail();' > "$sample"
for pat in 'if \(\s*fabsf?\(.*\)\s*>[^=]' '>\s*max_(diff|err)\b' 'fmaxf?\(\s*(diff|err|error|max_diff|max_err|d)\b' \
    'if \(.*[^<>=!-]>\s*(tol|eps|tolerance)\b'; do
    grep -qE "$pat" "$sample" || { echo "FAIL: the lint's pattern $pat misses its sample"; bad=1; }
done
[ "$bad" -eq 0 ] || exit 1
echo "numeric checks: ${#cfiles[@]} C test sources and ${#sfiles[@]} scripts free of NaN-blind comparisons and verdict lines"
