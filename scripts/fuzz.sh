#!/usr/bin/env bash
# Fuzz the input readers: build the libFuzzer harnesses of tests/fuzz with clang, ASan
# and UBSan (TS_FUZZ=ON, into build-fuzz/), then run each for FUZZ_SECONDS from a
# scratch copy of its seed corpus (tests/fuzz/corpus/<harness>/; what the run adds stays
# out of the source tree) and its dictionary (tests/fuzz/<harness>.dict), with a fixed
# seed. A crash, sanitizer report, leak, timeout (10 s per input) or 2 GiB of memory
# fails the script, which prints the report and keeps the reproducer; replay one with
# `build-fuzz/tests/fuzz/HARNESS FILE`.
# Usage: scripts/fuzz.sh [HARNESS ...]        (default: every tests/fuzz/fuzz_*.c)
# Environment: FUZZ_SECONDS per harness (default 20), FUZZ_SEED (default 1),
#   FUZZ_JOBS harnesses run at once (default: the cores), FUZZ_CC (default clang-14),
#   FUZZ_BUILD (default build-fuzz), FUZZ_BUILD_ONLY=1 builds the harnesses and stops.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
secs="${FUZZ_SECONDS:-20}"
seed="${FUZZ_SEED:-1}"
jobs="${FUZZ_JOBS:-$(nproc)}"
build="${FUZZ_BUILD:-$root/build-fuzz}"

if [ $# -gt 0 ]; then
  harnesses=("$@")
else
  harnesses=()
  for src in tests/fuzz/fuzz_*.c; do harnesses+=("$(basename "$src" .c)"); done
fi

echo "fuzz: building ${harnesses[*]} (clang, ASan + UBSan) in $build"
CC="${FUZZ_CC:-clang-14}" cmake -S "$root" -B "$build" -DTS_FUZZ=ON -DTS_CUDA=OFF -DTS_WERROR=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${harnesses[@]}" >/dev/null
if [ "${FUZZ_BUILD_ONLY:-0}" = 1 ]; then
  echo "fuzz: built ${harnesses[*]} in $build (${SECONDS} s)"
  exit 0
fi

scratch="$(mktemp -d "${TMPDIR:-/tmp}/tessera-fuzz.XXXXXX")"
# The harnesses rewrite their input file for every run: on tmpfs that is ~5x faster.
files="$scratch/files"
if [ -d /dev/shm ] && [ -w /dev/shm ]; then files="$(mktemp -d /dev/shm/tessera-fuzz.XXXXXX)"; fi
trap 'rm -rf "$files"' EXIT
export LSAN_OPTIONS="suppressions=$root/tests/fuzz/lsan.supp:print_suppressions=0"
export ASAN_OPTIONS="detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1"

# One harness: fuzz a copy of its seeds; its temp files (fuzz_util.h) go under $files/$h.
run_one() {
  local h="$1" dir="$scratch/$1"
  mkdir -p "$dir/corpus" "$dir/artifacts" "$files/$h"
  cp tests/fuzz/corpus/"$h"/* "$dir/corpus/"
  local rc=0 dict=()
  if [ -f "tests/fuzz/$h.dict" ]; then dict=(-dict="tests/fuzz/$h.dict"); fi
  TMPDIR="$files/$h" "$build/tests/fuzz/$h" -seed="$seed" -max_total_time="$secs" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" \
    "${dict[@]}" "$dir/corpus" >"$dir/log" 2>&1 &
  local pid=$!
  wait "$pid" || rc=$?
  echo "$rc" >"$dir/rc"
  # clang's OpenMP runtime registers every process in /dev/shm; a crash leaves the file.
  rm -f /dev/shm/__KMP_REGISTERED_LIB_"$pid"_*
}

echo "fuzz: ${#harnesses[@]} harnesses, ${secs} s each, seed $seed, $jobs at a time"
running=0
for h in "${harnesses[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_one "$h" &
  running=$((running + 1))
done
wait

failed=()
printf '%-18s %10s %8s %8s  %s\n' harness runs exec/s corpus result
for h in "${harnesses[@]}"; do
  dir="$scratch/$h"
  rc="$(cat "$dir/rc" 2>/dev/null || echo 1)"
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)"
  speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)"
  corpus="$(find "$dir/corpus" -type f | wc -l)"
  artifacts=("$dir"/artifacts/*)
  if [ "$rc" -eq 0 ] && [ ! -e "${artifacts[0]}" ]; then
    result=ok
  else
    result="FAILED (exit $rc)"
    failed+=("$h")
  fi
  printf '%-18s %10s %8s %8s  %s\n' "$h" "${runs:--}" "${speed:--}" "$corpus" "$result"
done

if [ ${#failed[@]} -gt 0 ]; then
  for h in "${failed[@]}"; do
    dir="$scratch/$h"
    echo
    echo "==== $h: sanitizer / libFuzzer report (log: $dir/log) ===="
    # The report starts at the first sanitizer or libFuzzer error line.
    awk '/^==[0-9]+==|runtime error:|^tessera: |^ALARM|ERROR: libFuzzer|^SUMMARY/ {on=1} on' \
      "$dir/log" | head -120
    for a in "$dir"/artifacts/*; do
      [ -e "$a" ] || continue
      echo "reproducer: $a ($(wc -c <"$a") bytes); replay: $build/tests/fuzz/$h $a"
    done
  done
  echo
  echo "fuzz: FAILED; scratch directory kept: $scratch" >&2
  exit 1
fi
rm -rf "$scratch"
echo "fuzz: all harnesses ran ${secs} s without a finding (${SECONDS} s in all, with the build)"
