#!/usr/bin/env bash
# compare_snapshots.sh BEFORE AFTER: compare two whole-suite snapshots (ctest run with
# TS_TEST_SNAPSHOT=FOLDER, tests/lib.sh's snapshot_runs): every run's losses, gradient
# norms, validation losses and saved models, bit for bit. Prints the runs compared and
# every difference; exits 1 when any number or model differs or a run is missing.
set -euo pipefail
if [ $# -ne 2 ] || [ ! -d "$1" ] || [ ! -d "$2" ]; then
  echo "usage: $0 BEFORE_SNAPSHOT AFTER_SNAPSHOT (folders)" >&2; exit 2
fi
runs=$(cd "$1" && find . -type f | wc -l)
numbers=$(cd "$1" && find . -name '*.numbers' -exec cat {} + | wc -l)
models=$(cd "$1" && find . -name '*.sha256' | wc -l)
if diff -r "$1" "$2"; then
  echo "compare_snapshots: $runs files ($numbers numbers, $models saved models) bit-identical"
else
  echo "compare_snapshots: the snapshots differ (above)" >&2; exit 1
fi
