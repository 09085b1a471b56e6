#!/usr/bin/env bash
# README command 1: install what is missing, build, prepare the fortunes corpus and
# train the default model (configs/tiny.cfg) on several ranks, showing progress.
# The grid defaults to data parallelism over 2 ranks; set RANKS and pass --set options
# for another (RANKS=4 scripts/train.sh --set parallel.pp=2: dp = 4 / 2 = 2).
# Extra arguments go to `tessera train` (e.g. --set train.steps=50). The run saves a
# checkpoint into runs/tiny (or the checkpoint.dir given) and ends by printing a short
# sample of text from it (`tessera sample`).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh
# The build's output goes to a log, shown only when it fails (a demo need not scroll
# past 150 lines of make).
mkdir -p "$root/build"
echo "train.sh: building into build/ (log: build/build.log)" >&2
if ! scripts/build.sh "$root/build" >"$root/build/build.log" 2>&1; then
  cat "$root/build/build.log" >&2
  echo "train.sh: the build failed (above)" >&2
  exit 1
fi
scripts/prepare_data.sh "$root/build/tessera" data
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ranks="${RANKS:-2}"
# tiny.cfg's parallel.dp = "auto": the ranks left over by pp * tp are data parallel.
# Checkpoints go to runs/tiny (step_NNNNNNNN/ and latest, beside metrics.jsonl) unless
# the arguments name another checkpoint.dir; the model is sampled from there at the end.
# The demo starts over each time it runs: checkpoint.overwrite lets a fresh run save
# where the last one's checkpoints are (without it, Tessera refuses, to protect them).
ckpt=(--set 'checkpoint.dir="runs/tiny"' --set checkpoint.overwrite=true)
dir=runs/tiny
for a in "$@"; do
  case "$a" in
    checkpoint.dir=* | --set=checkpoint.dir=*)
      ckpt=()
      dir="${a#*checkpoint.dir=}"
      dir="${dir#\"}"
      dir="${dir%\"}"
      ;;
  esac
done
mpirun --oversubscribe -np "$ranks" "$root/build/tessera" train configs/tiny.cfg "${ckpt[@]}" "$@"
if [ -z "$dir" ]; then exit 0; fi # checkpoint.dir="": nothing saved to sample from
prompt="The "
echo
echo "--- a sample from the trained model: build/tessera sample $dir --prompt \"$prompt\" --tokens 200 ---"
"$root/build/tessera" sample "$dir" --prompt "$prompt" --tokens 200
echo
