#!/usr/bin/env bash
# Single-rank training throughput: Tessera vs PyTorch (Debian's python3-torch, same
# model, same thread budget) on the tiny config and GPT-2 124M (seq 256, batch 4),
# next to the sgemm rate measured in the same run. Prints a markdown table.
# Usage: bench/throughput.sh [THREADS]     (run from the repository root)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
threads="${1:-2}"
scripts/setup.sh python3-torch
scripts/build.sh "$root/build" >/dev/null
scripts/prepare_data.sh "$root/build/tessera" data >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# median of the numbers on stdin
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# model FLOPs per token: 6 per parameter in a matmul (wte counts once: the tied head's
# GEMM) plus attention's QK^T and PV, forward and backward: 12 * L * T * C.
flops_per_token() { # L H C V T
  awk -v L="$1" -v C="$3" -v V="$4" -v T="$5" 'BEGIN {
    p = V * C + L * (12 * C * C + 13 * C) + 2 * C;   # every parameter but wpe
    printf "%.0f", 6 * p + 12 * L * T * C }'
}

# tessera_run NAME STEPS SKIP ARGS...: median step_ms over steps >= SKIP
tessera_run() {
  local name="$1" steps="$2" skip="$3"; shift 3
  mpirun -np 1 --bind-to none "$root/build/tessera" train "$@" --set train.steps="$steps" \
    --set train.threads="$threads" --set data.eval_every=0 --set log.progress=false \
    --set "log.metrics=\"$tmp/$name.jsonl\"" >/dev/null
  grep -o '"step":[0-9]*,"loss".*"step_ms":[0-9.]*' "$tmp/$name.jsonl" \
    | awk -F'"step_ms":' -v s="$skip" '{split($1, a, /[:,]/); if (a[2] + 0 >= s) print $2}' | median
}

torch_run() { # STEPS WARMUP L H C V T B -> ms/step
  /usr/bin/python3 bench/torch_gpt2.py --n_layer "$3" --n_head "$4" --n_embd "$5" \
    --vocab_size "$6" --seq_len "$7" --batch "$8" --threads "$threads" --steps "$1" \
    --warmup_steps "$2" | grep -o '"ms_per_step": *[0-9.]*' | grep -o '[0-9.]*$'
}

sgemm=$("$root/build/bench/bench_sgemm" "$threads" --json | grep -o '"sgemm_gflops":[0-9.]*' | cut -d: -f2)

tiny_ms=$(tessera_run tiny 40 5 configs/tiny.cfg)
tiny_torch=$(torch_run 30 5 4 4 128 256 64 16)
big_args=(configs/gpt2-124m.cfg --set model.seq_len=256 --set parallel.micro_batch=4
          --set train.global_batch=4 --set 'data.train="data/fortunes_train.bin"' --set 'data.val=""')
big_ms=$(tessera_run g124m 5 1 "${big_args[@]}")
big_torch=$(torch_run 4 1 12 12 768 50257 256 4)

row() { # name tokens_per_step flops_per_token tessera_ms torch_ms
  awk -v n="$1" -v tok="$2" -v f="$3" -v a="$4" -v b="$5" -v s="$sgemm" 'BEGIN {
    gf = f * tok / (a * 1e-3) / 1e9; tgf = f * tok / (b * 1e-3) / 1e9;
    printf "| %s | %.1f | %.0f | %.1f | %.0f%% | %.1f | %.0f | %.0f%% | **%.2fx** |\n",
      n, a, tok / (a * 1e-3), gf, 100 * gf / s, b, tok / (b * 1e-3), 100 * tgf / s, b / a }'
}

echo "threads per run: $threads; sgemm ceiling (best OpenBLAS sgemm, same threads): $sgemm GFLOP/s"
echo
echo "| model | Tessera ms/step | Tessera tok/s | Tessera GFLOP/s | of sgemm | PyTorch ms/step | PyTorch tok/s | of sgemm | Tessera / PyTorch |"
echo "|---|---|---|---|---|---|---|---|---|"
row "tiny (4L 128d, T64, B16)" 1024 "$(flops_per_token 4 4 128 256 64)" "$tiny_ms" "$tiny_torch"
row "GPT-2 124M (T256, B4)" 1024 "$(flops_per_token 12 12 768 50257 256)" "$big_ms" "$big_torch"
echo
echo "command: bench/throughput.sh $threads"
