#!/usr/bin/env bash
# README command 1: install what is missing, build, prepare the fortunes corpus and
# train the default model (configs/tiny.cfg), showing progress.
# Extra arguments go to `tessera train` (e.g. --set train.steps=50).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh
scripts/build.sh "$root/build"
scripts/prepare_data.sh "$root/build/tessera" data
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun -np 1 "$root/build/tessera" train configs/tiny.cfg "$@"
