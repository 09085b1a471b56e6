#!/usr/bin/env bash
# bf16 mixed precision on the CPU: GPT-2 124M at its context (T = 1024, B = 2, 2 threads),
# Tessera fp32 and bf16 against PyTorch 2 (eager fp32, eager bf16 autocast, torch.compile
# bf16 autocast; scripts/peer_venv.sh's PyPI build), next to the ceilings measured in the
# same run: OpenBLAS sgemm (bench_sgemm) for the fp32 runs and oneDNN's bf16 GEMM
# (bench_gemm_bf16) for the bf16 runs. One process at a time. Prints a markdown table.
#
# Usage: bench/bf16.sh [ROUNDS]      (run from anywhere; ROUNDS default 1)
#   BUILD=DIR      Tessera build folder (default build/; scripts/build.sh runs in it, so a
#                  folder configured with -DTS_CUDA=OFF stays so)
#   PEER_PY=PATH   the PyTorch 2 python (default: what scripts/peer_venv.sh prints; it
#                  makes the venv on first use, ~2 minutes and ~5 GB from PyPI)
#   PEER_ATTN=manual|sdpa  PyTorch's attention (default sdpa, nanoGPT's on torch 2)
#   KEEP=DIR       keep the runs' metrics and JSON there
#
# A run's s/step is its median over steady steps: Tessera runs 4 steps and takes steps
# 1..3 (step 0 page-faults ~2 GB); PyTorch runs 2 warm-up steps (torch.compile compiles
# the forward and backward graphs in the first) and times 3. The table gives the median
# of the runs' medians and the best single steady step; ratios compare medians. Each run
# waits for a quiet machine and is repeated once if other processes took more than 10% of
# the CPUs (bench/lib_parallel.sh); the share they took is in the table. The ceilings are
# measured before each round and after the last; the table uses the best of each.
# A round takes about 5-6 minutes on a quiet 2-core machine.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rounds="${1:-1}"
threads=2
command="bench/bf16.sh $*"
build="${BUILD:-$root/build}"
attn="${PEER_ATTN:-sdpa}"
source "$root/bench/lib_parallel.sh"
bench_setup
peer_py="${PEER_PY:-$(scripts/peer_venv.sh)}"

L=12 H=12 C=768 V=50257 T=1024 B=2
tokens=$((B * T))
flops=$(flops_per_token "$L" "$C" "$V" "$T")

# ceiling NAME: best GFLOP/s of a GEMM benchmark's --json line, appended to $tmp/NAME.c
# (sgemm: bench_sgemm; bf16: bench_gemm_bf16, "n/a" while it is not built)
ceiling() {
  local bin=bench_sgemm key=sgemm_gflops
  if [ "$1" = bf16 ]; then bin=bench_gemm_bf16 key=bf16_gflops; fi
  if [ -x "$build/bench/$bin" ]; then
    "$build/bench/$bin" "$threads" --json | grep -o "\"$key\": *[0-9.]*" | grep -o '[0-9.]*$'
  else
    echo "n/a"
  fi >> "$tmp/$1.c"
}

# tessera_run NAME PRECISION: 4 steps; median and best step_ms over steps 1..3 into
# $tmp/NAME.last ("MEDIAN BEST"); the run's stderr in $tmp/NAME.err
tessera_run() {
  local name="$1" precision="$2" m="$tmp/$1.metrics.jsonl"
  rm -f "$m"
  mpirun -np 1 --bind-to none "$build/tessera" train configs/gpt2-124m.cfg \
    --set model.seq_len="$T" --set parallel.micro_batch="$B" --set train.global_batch="$B" \
    --set 'data.train="data/fortunes_train.bin"' --set 'data.val=""' \
    --set "train.precision=\"$precision\"" --set train.steps=4 \
    --set train.threads="$threads" --set data.eval_every=0 --set log.progress=false \
    --set "log.metrics=\"$m\"" > /dev/null 2> "$tmp/$name.err" || return 1
  echo "$(med step_ms "$m" 1) $(metric step_ms "$m" 1 | sort -g | head -1)" > "$tmp/$name.last"
}

# torch_run NAME PRECISION [--compile]: 2 warm-up steps, 3 timed; "MEDIAN BEST" ms into
# $tmp/NAME.last, the JSON line in $tmp/NAME.json, the first step's seconds appended to
# $tmp/NAME.first
torch_run() {
  local name="$1" precision="$2"; shift 2
  "$peer_py" bench/torch_gpt2.py --n_layer "$L" --n_head "$H" --n_embd "$C" \
    --vocab_size "$V" --seq_len "$T" --batch "$B" --threads "$threads" --steps 3 \
    --warmup_steps 2 --attn "$attn" --precision "$precision" "$@" \
    > "$tmp/$name.json" 2> "$tmp/$name.err" || return 1
  "$peer_py" -c 'import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(d["median_step_ms"], d["min_step_ms"])
print(d["first_step_s"], file=sys.stderr)' "$tmp/$name.json" > "$tmp/$name.last" 2>> "$tmp/$name.first"
}

# one NAME FUNCTION ARGS...: a measured run after waiting for a quiet machine; appends
# "MEDIAN BEST" ms to $tmp/NAME.r and the CPU share others took to $tmp/NAME.o. A run
# that fails (Tessera before bf16 reaches the CPU backend: a config error) is noted in
# $tmp/NAME.fail with its first error line, and the benchmark goes on.
one() {
  local name="$1"; shift
  echo "  $name ..." >&2
  wait_quiet 60 > /dev/null
  if measured "$@"; then
    cat "$tmp/$name.last" >> "$tmp/$name.r"
    echo "$OTHERS" >> "$tmp/$name.o"
  else
    grep -m1 -i 'error' "$tmp/$name.err" > "$tmp/$name.fail" || tail -1 "$tmp/$name.err" > "$tmp/$name.fail"
  fi
}

runs=(tessera_fp32 tessera_bf16 torch_fp32 torch_bf16 torch_compile)
run() {
  case "$1" in
    tessera_fp32) one "$1" tessera_run "$1" fp32 ;;
    tessera_bf16) one "$1" tessera_run "$1" bf16 ;;
    torch_fp32) one "$1" torch_run "$1" fp32 ;;
    torch_bf16) one "$1" torch_run "$1" bf16 ;;
    torch_compile) one "$1" torch_run "$1" bf16 --compile ;;
  esac
}

# The VM's speed drifts for tens of seconds at a time, so a round alternates its order
for r in $(seq "$rounds"); do
  echo "round $r/$rounds ..." >&2
  wait_quiet 60 > /dev/null
  ceiling sgemm; ceiling bf16
  if [ $((r % 2)) -eq 1 ]; then order=("${runs[@]}"); else
    order=(); for ((i = ${#runs[@]} - 1; i >= 0; i--)); do order+=("${runs[i]}"); done; fi
  for n in "${order[@]}"; do run "$n"; done
done
wait_quiet 60 > /dev/null
ceiling sgemm; ceiling bf16

best_of() { { grep -v 'n/a' "$tmp/$1.c" || true; } | sort -g | tail -1; }
sgemm=$(best_of sgemm); bf16=$(best_of bf16)
sgemm=${sgemm:-n/a}; bf16=${bf16:-n/a}
# s/step of a run name: the median of its runs' medians ("" if it never ran)
ms() { [ -s "$tmp/$1.r" ] && cut -d' ' -f1 "$tmp/$1.r" | median || true; }
bf16_ms=$(ms tessera_bf16)

row() { # label name ceiling-name ceiling
  local a
  a=$(ms "$2")
  if [ -z "$a" ]; then
    printf '| %s | n/a (%s) | | | | | | | |\n' "$1" "$(cut -c1-160 "$tmp/$2.fail" 2> /dev/null | tr '|' '/')"
    return
  fi
  awk -v n="$1" -v a="$a" -v b="$(cut -d' ' -f2 "$tmp/$2.r" | sort -g | head -1)" \
      -v tok="$tokens" -v f="$flops" -v cn="$3" -v c="$4" -v t="$bf16_ms" \
      -v o="$(sort -g "$tmp/$2.o" | tail -1)" -v k="$(wc -l < "$tmp/$2.r")" 'BEGIN {
    gf = f * tok / (a * 1e-3) / 1e9
    share = (c == "n/a") ? "n/a" : sprintf("%.0f%%", 100 * gf / c)
    vs = (t == "") ? "n/a" : sprintf("%.2fx", a / t)
    printf "| %s | %.2f | %.2f | %.0f | %.1f | %s %s | %s | %s | %d | %s%% |\n",
      n, a / 1e3, b / 1e3, tok / (a * 1e-3), gf, cn, c, share, vs, k, o }'
}

ratio() { # A B: "A / Bx" to 2 decimals, or n/a
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "n/a" || b == "n/a") print "n/a"; else printf "%.2fx", a / b }'
}

torch_version=$("$peer_py" -c 'import torch; print(torch.__version__)')
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2> /dev/null || echo '+dirty')"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $commit"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $threads threads per run, one process at a time"
echo "PyTorch: $torch_version ($peer_py), attention $attn; Tessera: $build"
echo "ceilings (GFLOP/s, best 2-thread GEMM at GPT-2 124M shapes), before each round and after:" \
     "sgemm (bench_sgemm) $(paste -sd' ' "$tmp/sgemm.c"); oneDNN bf16 GEMM (bench_gemm_bf16)" \
     "$(paste -sd' ' "$tmp/bf16.c"); the table uses the best of each"
echo
echo "| GPT-2 124M, T1024 B2 | s/step median | best step | tok/s | model GFLOP/s | ceiling GFLOP/s | share of ceiling | time / Tessera bf16 | runs | CPU used by others (max) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
row "Tessera fp32" tessera_fp32 sgemm "$sgemm"
row "**Tessera bf16**" tessera_bf16 bf16 "$bf16"
row "PyTorch eager fp32" torch_fp32 sgemm "$sgemm"
row "PyTorch eager bf16 autocast" torch_bf16 bf16 "$bf16"
row "PyTorch torch.compile bf16 autocast" torch_compile bf16 "$bf16"
echo
a=$(ms torch_bf16); b=$(ms torch_compile)
torch_best=$( (echo "$a"; echo "$b") | grep . | sort -g | head -1 || true)
if [ "$torch_best" = "$a" ]; then which="eager"; else which="torch.compile"; fi
share=n/a
if [ -n "$bf16_ms" ] && [ "$bf16" != n/a ]; then
  share=$(awk -v f="$flops" -v tok="$tokens" -v a="$bf16_ms" -v c="$bf16" 'BEGIN { printf "%.0f%%", 100 * f * tok / (a * 1e-3) / 1e9 / c }')
fi
echo "Tessera bf16: $(ratio "$(ms tessera_fp32)" "$bf16_ms") Tessera fp32's speed (goal >= 1.6)," \
     "$(ratio "$torch_best" "$bf16_ms") PyTorch's best bf16 (${torch_best:+$which}; goal >= 1.15)," \
     "$share of the oneDNN bf16 GEMM ceiling (goal >= 80%)"
echo
echo "model GFLOP/s = (6 x parameters + 12 x layers x T x C) x tokens / step time ($flops FLOP" \
     "per token, $tokens tokens per step); fp32 runs are set against the sgemm ceiling, bf16" \
     "runs against oneDNN's bf16 GEMM. s/step: the median of the runs' medians over steady steps;" \
     "best step: the fastest steady step of any run. torch.compile's first step (compilation):" \
     "$(paste -sd' ' "$tmp/torch_compile.first" 2> /dev/null || echo n/a) s."
echo
echo "command: $command  ($rounds round(s)${BUILD:+, BUILD=$BUILD}${PEER_ATTN:+, PEER_ATTN=$PEER_ATTN})"
