#!/usr/bin/env bash
# Builds and runs one libFuzzer target of tests/fuzz with clang (address sanitizer).
#   tests/fuzz/run_fuzz.sh NAME SECONDS [extra libFuzzer flags]
# NAME is the part after fuzz_ (wire, graph_load). The binary, corpus and any crash files go
# to $DG_FUZZ_DIR (default build-fuzz/ under the repository root); the corpus is kept between
# runs. Exits non-zero when the fuzzer finds a crash, a leak or an out-of-memory input.
set -euo pipefail
name=${1:?usage: run_fuzz.sh NAME SECONDS [libFuzzer flags]}
seconds=${2:?usage: run_fuzz.sh NAME SECONDS [libFuzzer flags]}
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${DG_FUZZ_DIR:-$root/build-fuzz}
cc=${CC_FUZZ:-clang}
src=$root/tests/fuzz/fuzz_$name.c
[ -f "$src" ] || { echo "run_fuzz.sh: no $src" >&2; exit 2; }
command -v "$cc" >/dev/null || { echo "run_fuzz.sh: $cc not found (apt-get install clang)" >&2; exit 2; }
mkdir -p "$out/corpus_$name" "$out/crashes_$name"

# Sources per target: the code under test and what it links against, nothing from the rest.
graph_srcs=$(ls "$root"/graph/*.c)
case $name in
  wire) srcs="$root/runtime/transport/wire.c $graph_srcs" ;;
  graph_load) srcs="$graph_srcs" ;;
  *) echo "run_fuzz.sh: unknown target $name (add its sources here)" >&2; exit 2 ;;
esac

# shellcheck disable=SC2086
"$cc" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -D_GNU_SOURCE \
  -I"$root/include" -I"$root/graph" -I"$root/runtime/transport" $srcs "$src" -lmsgpackc -lm -lpthread \
  -o "$out/fuzz_$name"

# Seeds: a few valid headers written by the encoder itself are a better start than nothing.
if [ "$name" = wire ] && [ -z "$(ls -A "$out/corpus_$name")" ]; then
  printf '\x82\xa1v\x01\xa1t\x02' > "$out/corpus_$name/ping"
  printf '\x84\xa1v\x01\xa1t\x01\xa2id\x07\xa7tensors\x91\x93\x01\x92\x02\x03\x18\x18' \
    > "$out/corpus_$name/response_tensor"
  printf '\x86\xa1v\x01\xa1t\x08\xa4xfer\x01\xa3off\x00\xa5total\xce\x00\x50\x00\x00\xa3key\xa1k' \
    > "$out/corpus_$name/chunk"
fi

# Headers are small: any single allocation over 512 MB is a "declared size" bug there.
limits="-rss_limit_mb=2048"
[ "$name" = wire ] && limits="$limits -malloc_limit_mb=512"

# shellcheck disable=SC2086
exec "$out/fuzz_$name" -max_total_time="$seconds" $limits \
  -artifact_prefix="$out/crashes_$name/" -print_final_stats=1 "$@" "$out/corpus_$name"
