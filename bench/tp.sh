#!/usr/bin/env bash
# Tensor-parallel throughput on this machine: GPT-2 124M shape (seq 256, batch 4; the
# vocabulary padded to 50304 as nanoGPT and Megatron do, so it splits over tp ranks),
# tp = 1 with 2 threads against tp = 2 with 1 thread per rank, and the share of the step
# spent in tensor-parallel all-reduces (metrics key tp_comm_ms). Prints a markdown table.
# Usage: bench/tp.sh [STEPS]       (run from the repository root)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
steps="${1:-5}"
scripts/setup.sh
scripts/build.sh "$root/build" >/dev/null
scripts/prepare_data.sh "$root/build/tessera" data >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
# field NAME FILE: the values of a numeric metrics key over steady steps (step >= 1)
field() { grep '"step_ms"' "$2" | grep -v '"step":0,' | grep -o "\"$1\":[0-9.e+-]*" | cut -d: -f2; }

run() { # NAME NP THREADS SETS...
  local name="$1" np="$2" threads="$3"; shift 3
  mpirun --bind-to none -np "$np" "$root/build/tessera" train configs/gpt2-124m.cfg \
    --set model.seq_len=256 --set model.vocab_size=50304 --set parallel.micro_batch=4 --set train.global_batch=4 \
    --set 'data.train="data/fortunes_train.bin"' --set 'data.val=""' --set data.eval_every=0 \
    --set train.steps="$steps" --set train.threads="$threads" --set log.progress=false \
    --set "log.metrics=\"$tmp/$name.jsonl\"" "$@" >/dev/null
}

run tp1 1 2
run tp2 2 1 --set parallel.tp=2

echo "GPT-2 124M shape (vocab padded to 50304), seq 256, global batch 4 (1024 tokens per step), $steps steps, median of steps 1..$((steps - 1))"
echo
echo "| grid | threads per rank | ms/step | tokens/s | tp all-reduce ms/step | share of step in tp all-reduce |"
echo "|---|---|---|---|---|---|"
for name in tp1 tp2; do
  ms=$(field step_ms "$tmp/$name.jsonl" | median)
  comm=$(field tp_comm_ms "$tmp/$name.jsonl" | median)
  awk -v n="$name" -v ms="$ms" -v c="$comm" 'BEGIN {
    g = n == "tp1" ? "tp=1 (1 rank)" : "tp=2 (2 ranks)"; t = n == "tp1" ? 2 : 1;
    printf "| %s | %d | %.0f | %.0f | %.0f | %.1f%% |\n", g, t, ms, 1024 / (ms * 1e-3), c, 100 * c / ms }'
done
echo
echo "command: bench/tp.sh $steps"
