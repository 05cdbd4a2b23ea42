#!/usr/bin/env bash
# Builds and runs the libFuzzer targets of tests/fuzz with clang (address and undefined-behaviour
# sanitizers).
#   tests/fuzz/run_fuzz.sh NAME SECONDS [extra libFuzzer flags]   one target, its output shown
#   tests/fuzz/run_fuzz.sh all SECONDS                              every target, side by side, then one
#                                                                   summary line (what CI runs)
#   tests/fuzz/run_fuzz.sh build [NAME...]                          build only
# NAME is the part after fuzz_ (wire, graph_load, shm_desc, chunks, server, channel, records). Objects, binaries,
# the working corpus (corpus_NAME, kept between runs), logs and crash files (crashes_NAME/) go to
# $DG_FUZZ_DIR (default build-fuzz/ under the repository root); tests/fuzz/corpus/NAME holds the
# committed seeds, read but never written. CC_FUZZ picks the compiler (default clang).
# Exits non-zero when a fuzzer finds a crash, a leak, a timeout or an out-of-memory input.
set -euo pipefail
usage="usage: run_fuzz.sh NAME|all SECONDS [libFuzzer flags] | run_fuzz.sh build [NAME...]"
mode=${1:?$usage}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${DG_FUZZ_DIR:-$root/build-fuzz}
cc=${CC_FUZZ:-clang}
targets=(wire graph_load shm_desc chunks server channel records)
command -v "$cc" >/dev/null || { echo "run_fuzz.sh: $cc not found (apt-get install clang libclang-rt-dev)" >&2; exit 2; }
mkdir -p "$out/obj"

# Sources per target: the code under test and what it links against, nothing from the rest.
# CUDA stays out: without DG_WITH_CUDA the kernel registry registers CPU kernels only, and
# executor/cuda/ is not compiled; without DG_WITH_BLAS the CPU kernels use their own GEMM.
srcs_of() {
  local graph transport all
  graph=$(ls "$root"/graph/*.c)
  # The transport room without trace_blob.c (the blob of trace notes, which reads the
  # executor's traces; nothing the transport runs calls it), with the executor's count of
  # threads computing (threads_computing.c, which uses nothing), which its busy polling reads.
  transport="$(ls "$root"/runtime/transport/*.c | grep -v '/trace_blob\.c$') $root/executor/threads_computing.c"
  all="$graph $(ls "$root"/cluster/*.c "$root"/placer/*.c "$root"/executor/*.c "$root"/executor/cpu/*.c "$root"/runtime/*/*.c)"
  case $1 in
    wire) echo "$root/runtime/transport/wire.c $graph" ;;
    graph_load) echo "$graph" ;;
    shm_desc) echo "$root/runtime/transport/shm.c $graph" ;;
    channel) echo "$root/runtime/master/fast_channel.c $root/runtime/transport/shm.c $root/runtime/transport/wire.c $graph" ;;
    chunks) echo "$transport $graph" ;;
    server) echo "$all $proto_out/tensorboard.pb-c.c" ;;
    # The data room calls the saver and the checkpoint store (an iterator's state in a checkpoint).
    records) echo "$all $proto_out/tensorboard.pb-c.c" ;;
    *) echo "run_fuzz.sh: unknown target $1 (add its sources here)" >&2; return 2 ;;
  esac
}
libs_of() {
  case $1 in
    wire|graph_load|shm_desc|channel) echo "-lmsgpackc -lm -lpthread" ;;
    chunks) echo "-lzmq -lmsgpackc -lm -lpthread" ;;
    server|records) echo "-lzmq -lmsgpackc -lsqlite3 -lprotobuf-c -lz -lmetis -lm -lpthread" ;;
  esac
}
# libFuzzer limits per target. Headers are small: any single allocation over 512 MB while
# decoding one is a "declared size" bug. The server gets a timeout per input (a hang is a
# finding) and room for its threads and registered graphs.
flags_of() {
  case $1 in
    wire) echo "-rss_limit_mb=2048 -malloc_limit_mb=512" ;;
    graph_load) echo "-rss_limit_mb=2048 -max_len=65536" ;;
    shm_desc) echo "-rss_limit_mb=2048" ;;
    channel) echo "-rss_limit_mb=2048 -max_len=65536" ;;
    chunks) echo "-rss_limit_mb=2048 -max_len=8192 -timeout=30" ;;
    server) echo "-rss_limit_mb=4096 -max_len=16384 -timeout=60" ;;
    records) echo "-rss_limit_mb=2048 -malloc_limit_mb=512 -max_len=65536" ;;
  esac
}

# The code protoc-c generates for TensorBoard's event files (runtime/training/event_file.c).
proto_out="$out/proto"
mkdir -p "$proto_out"
if [ ! -f "$proto_out/tensorboard.pb-c.c" ] || [ "$root/proto/tensorboard.proto" -nt "$proto_out/tensorboard.pb-c.c" ]; then
  protoc-c --c_out="$proto_out" --proto_path="$root/proto" "$root/proto/tensorboard.proto"
fi
includes="-I$root/include -I$root/graph -I$root/cluster -I$root/placer -I$root/executor -I$root/executor/cpu -I$proto_out"
for room in transport server master session training data; do includes="$includes -I$root/runtime/$room"; done
cflags="-g -O1 -std=c11 -D_GNU_SOURCE -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter"
sanitize="address,undefined -fno-sanitize-recover=undefined"
# Any header changed since an object was made rebuilds it (simple, and the headers rarely move).
newest_header=$(find "$root/include" "$root/graph" "$root/cluster" "$root/placer" "$root/executor" "$root/runtime" \
  -name '*.h' -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
stamp="$out/obj/flags"
echo "$cc $cflags $sanitize $includes" | cmp -s - "$stamp" 2>/dev/null || {
  rm -f "$out"/obj/*.o
  echo "$cc $cflags $sanitize $includes" > "$stamp"
}

# Flags for one source file after the common ones. conv_direct.c's unrolled kernels take clang
# minutes to instrument at -O1 and seconds at -O0, instrumented all the same; only the server
# target reaches them, rarely, and their speed is not what it measures.
cflags_of() {
  case $1 in
    */executor/cpu/conv_direct.c) echo "-O0" ;;
  esac
}

# The object of a source file.
obj_of() { echo "$out/obj/$(echo "${1#"$root"/}" | tr / _ | sed 's/\.c$/.o/')"; }

# Compiles, $DG_FUZZ_JOBS at a time (default: the number of cores), every object the named
# targets need that changed, then links the targets, as many at once. The library's warnings
# are the CMake build's business (gcc, -Werror); the targets' are shown.
build() {
  local jobs=${DG_FUZZ_JOBS:-$(nproc)} failed="$out/obj/failed" name src obj objs
  local -A seen=()
  rm -f "$failed"
  for name in "$@"; do
    for src in $(srcs_of "$name"); do
      [ -z "${seen[$src]:-}" ] || continue
      seen[$src]=1
      obj=$(obj_of "$src")
      if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ "$newest_header" -nt "$obj" ]; then
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
        # shellcheck disable=SC2086
        { "$cc" $cflags $(cflags_of "$src") -w -fsanitize=fuzzer-no-link,$sanitize $includes -c "$src" -o "$obj" ||
            { rm -f "$obj"; echo "$src" >>"$failed"; }; } &
      fi
    done
  done
  wait
  if [ -f "$failed" ]; then echo "run_fuzz.sh: compiling failed: $(cat "$failed")" >&2; return 1; fi
  for name in "$@"; do
    objs=""
    for src in $(srcs_of "$name"); do objs="$objs $(obj_of "$src")"; done
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    # shellcheck disable=SC2086
    { "$cc" $cflags -fsanitize=fuzzer,$sanitize $includes "$root/tests/fuzz/fuzz_$name.c" $objs \
        $(libs_of "$name") -o "$out/fuzz_$name" || echo "fuzz_$name" >>"$failed"; } &
  done
  wait
  if [ -f "$failed" ]; then echo "run_fuzz.sh: linking failed: $(cat "$failed")" >&2; return 1; fi
}

# Runs a built target for $2 seconds; the working corpus first (new inputs go there), the
# committed seeds second.
run() {
  local name=$1 seconds=$2
  shift 2
  mkdir -p "$out/corpus_$name" "$out/crashes_$name"
  local seeds="$root/tests/fuzz/corpus/$name"
  [ -d "$seeds" ] || seeds=""
  # shellcheck disable=SC2046,SC2086
  (cd "$out" && exec "$out/fuzz_$name" -max_total_time="$seconds" $(flags_of "$name") \
    -artifact_prefix="$out/crashes_$name/" -print_final_stats=1 "$@" "$out/corpus_$name" $seeds)
}

case $mode in
  build)
    shift
    [ $# -gt 0 ] || set -- "${targets[@]}"
    build "$@"
    ;;
  all)
    seconds=${2:?$usage}
    start=$(date +%s)
    build "${targets[@]}"
    echo "fuzz: built ${#targets[@]} targets in $(( $(date +%s) - start )) s"
    # The targets run side by side, as many at once as there are cores (DG_FUZZ_JOBS): each
    # fuzzer is one thread, and its time limit is wall-clock time.
    jobs=${DG_FUZZ_JOBS:-$(nproc)}
    declare -A pid_of t0_of
    for name in "${targets[@]}"; do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
      t0_of[$name]=$(date +%s)
      run "$name" "$seconds" >"$out/log_$name.txt" 2>&1 &
      pid_of[$name]=$!
    done
    failed=()
    for name in "${targets[@]}"; do
      log="$out/log_$name.txt"
      set +e
      wait "${pid_of[$name]}"
      rc=$?
      set -e
      runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
      cov=$( (grep -o 'cov: [0-9]*' "$log" || true) | tail -1 | cut -d' ' -f2)
      line="$name: ${runs:-?} runs, cov ${cov:-?}, ran $(( $(stat -c %Y "$log") - ${t0_of[$name]} )) s"
      if [ $rc -ne 0 ]; then
        failed+=("$name")
        line="$line, FAILED (exit $rc)"
        echo "== fuzz_$name failed (exit $rc); the end of $log:"
        tail -60 "$log"
        ls "$out/crashes_$name" 2>/dev/null | sed "s|^|   $out/crashes_$name/|"
      fi
      echo "fuzz: $line"
    done
    echo "fuzz summary: ${#targets[@]} targets, ${seconds} s each, $(( ${#targets[@]} - ${#failed[@]} )) clean, ${#failed[@]} failed${failed[*]:+ (${failed[*]})}, $(( $(date +%s) - start )) s in all"
    [ ${#failed[@]} -eq 0 ]
    ;;
  *)
    seconds=${2:?$usage}
    shift 2
    [ -f "$root/tests/fuzz/fuzz_$mode.c" ] || { echo "run_fuzz.sh: no tests/fuzz/fuzz_$mode.c" >&2; exit 2; }
    build "$mode"
    run "$mode" "$seconds" "$@"
    ;;
esac
