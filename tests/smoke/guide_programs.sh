#!/usr/bin/env bash
# docs/GUIDE.md's program and commands, as the guide prints them: the C block that starts
# "// guide_train.c" is compiled against the built library with warnings as errors, and every
# command under a "# run: STRATEGY" line is run (dg-launch and ./guide_train pointed at the
# build). Each worker (or ps_coordinator's coordinator) must print its last loss, a finite number below 0.01 (the program's
# linear model is exact, so its loss falls to nothing), read here from the numbers it prints;
# every strategy of distgraph/distribute.h must have its command. An asynchronous (parameter_server)
# worker may instead say it had no step left.
set -euo pipefail
src="${DG_SOURCE_DIR:?}"
bin="${DG_BIN_DIR:?}"
lib="$bin/../lib"
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
awk '/^```c$/ { inblock = 1; first = 1; next }
     /^```$/ { inblock = 0; keep = 0; next }
     inblock && first { first = 0; keep = ($0 ~ /^\/\/ guide_train\.c/) }
     inblock && keep' "$src/docs/GUIDE.md" > "$tmp/guide_train.c"
[ -s "$tmp/guide_train.c" ] || fail "docs/GUIDE.md has no C block starting with // guide_train.c"
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/guide_train" "$tmp/guide_train.c" -I"$src/include" -L"$lib" \
    -ldistgraph -Wl,-rpath,"$lib" || fail "the guide's program does not compile"
echo "compiled the guide's program ($(wc -l < "$tmp/guide_train.c") lines)"
# The commands: the line after each "# run: NAME".
awk '/^# run: / { name = $3; getline; print name "\t" $0 }' "$src/docs/GUIDE.md" > "$tmp/runs"
for s in mirrored central_storage multi_worker_mirrored parameter_server sync_replicas ps_coordinator; do
    grep -q "^$s	" "$tmp/runs" || fail "docs/GUIDE.md has no '# run: $s' command"
done
while IFS=$'\t' read -r name cmd; do
    cmd=${cmd//.\/guide_train/$tmp\/guide_train}
    cmd=${cmd/#dg-launch/$bin\/dg-launch --timeout 120}
    echo "$name: $cmd"
    (cd "$tmp" && timeout 180 bash -c "$cmd") > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "$name: the guide's command failed"; }
    grep "last loss" "$tmp/out"
    n=0
    while read -r loss; do
        [[ "$loss" =~ ^[0-9]\.[0-9]+e[-+][0-9]+$ ]] || fail "$name: the last loss \"$loss\" is not a finite number"
        awk -v l="$loss" 'BEGIN { exit !(l < 0.01) }' || fail "$name: a worker's last loss is $loss, not below 0.01"
        n=$((n + 1))
    done < <(sed -n "s/^\(\[[a-z]*[0-9]*\] \)\{0,1\}$name: \(worker\|coordinator\) [0-9]*: last loss \(.*\)$/\3/p" \
               "$tmp/out")
    # An asynchronous worker that starts after the others ended the job has no step left (seen
    # on a loaded machine); it must say so, and one worker at least must have trained.
    late=0
    [ "$name" = parameter_server ] && late=$(grep -c "$name: worker [0-9]*: no step left$" "$tmp/out" || true)
    want=1   # one process, or the coordinator of standing workers
    [[ "$cmd" == *"--workers 2"* && "$cmd" != *"--mode coordinator"* ]] && want=2
    [ "$n" -ge 1 ] && [ $((n + late)) = "$want" ] ||
        fail "$name: $n workers printed their last loss and $late had no step left, of $want"
done < "$tmp/runs"
echo "PASS guide_programs"
