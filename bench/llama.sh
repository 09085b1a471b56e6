#!/usr/bin/env bash
# Llama training throughput on one rank: Tessera against PyTorch 2 (bench/torch_llama.py:
# tests/torch_llama.py's Hugging Face llama with F.scaled_dot_product_attention, fp32
# eager; scripts/peer_venv.sh's PyPI build), a Llama of about GPT-2 124M's size (12 layers,
# C 768, 12 query heads sharing 4 key/value heads, SwiGLU 2048, vocabulary 50304, lm_head
# untied: 152M parameters, 114M of them outside the embedding) at T = 1024, B = 2, 2
# threads, one process at a time; and, in the same run, GPT-2 124M at the same T and B
# on both sides (Tessera, and bench/torch_gpt2.py with SDPA), so that the llama's
# Tessera / PyTorch ratio can be set against GPT-2's measured on the same machine the same
# minute. Next to the sgemm ceiling (bench_sgemm) measured before each round and after.
# Prints a markdown table.
#
# Usage: bench/llama.sh [ROUNDS]      (run from anywhere; ROUNDS default 1)
#   BUILD=DIR       Tessera build folder (default build/; scripts/build.sh runs in it)
#   PEER_PY=PATH    the PyTorch 2 python (default: what scripts/peer_venv.sh prints)
#   PEER_COMPILE=1  also time PyTorch with torch.compile (llama only; ~1 min of compiling)
#   GPT2=0          skip the GPT-2 pair
#   T=, B=          sequence length and batch (default 1024, 2)
#   KEEP=DIR        keep the runs' metrics and JSON there
#
# A run's ms/step is its median over steady steps: Tessera runs 4 steps and takes steps
# 1..3 (step 0 page-faults the activations); PyTorch runs 2 warm-up steps and times 3.
# The table gives the median of the runs' medians and the best steady step. Each run waits
# for a quiet machine and is repeated once if other processes took more than 10% of the
# CPUs (bench/lib_parallel.sh); the share they took is in the table. A round takes about
# 4-6 minutes on a quiet 2-core machine.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rounds="${1:-1}"
threads=2
command="bench/llama.sh $*"
build="${BUILD:-$root/build}"
source "$root/bench/lib_parallel.sh"
bench_setup
peer_py="${PEER_PY:-$(scripts/peer_venv.sh)}"

L=12 H=12 KV=4 C=768 F=2048 V=50304 THETA=500000
T="${T:-1024}" B="${B:-2}"
GV=50257
tokens=$((B * T))

# llama_flops_per_token L C H KV F V T: 6 per parameter in a matmul (the embedding is a
# lookup; the untied head's GEMM counts) plus attention's 12 * L * T * C, as
# flops_per_token counts GPT-2's (grouped-query attention does the query heads' work)
llama_flops_per_token() {
  awk -v L="$1" -v C="$2" -v H="$3" -v KV="$4" -v F="$5" -v V="$6" -v T="$7" 'BEGIN {
    hs = C / H
    p = L * (2 * C * C + 2 * C * KV * hs + 3 * C * F + 2 * C) + C + V * C
    printf "%.0f", 6 * p + 12 * L * T * C }'
}
llama_f=$(llama_flops_per_token "$L" "$C" "$H" "$KV" "$F" "$V" "$T")
gpt2_f=$(flops_per_token 12 768 "$GV" "$T")

sgemm_rate() {
  "$build/bench/bench_sgemm" "$threads" --json | grep -o '"sgemm_gflops": *[0-9.]*' | grep -o '[0-9.]*$'
}

llama_sets=(--set 'model.arch="llama"' --set model.n_layer="$L" --set model.n_head="$H"
            --set model.n_kv_head="$KV" --set model.n_embd="$C" --set model.ffn_hidden="$F"
            --set model.vocab_size="$V" --set model.rope_theta="$THETA")

# tessera_run NAME SETS...: 4 steps of configs/gpt2-124m.cfg with SETS; "MEDIAN BEST"
# step_ms over steps 1..3 into $tmp/NAME.last, stderr into $tmp/NAME.err
tessera_run() {
  local name="$1" m="$tmp/$1.metrics.jsonl"; shift
  rm -f "$m"
  mpirun -np 1 --bind-to none "$build/tessera" train configs/gpt2-124m.cfg "$@" \
    --set model.seq_len="$T" --set parallel.micro_batch="$B" --set train.global_batch="$B" \
    --set 'data.train="data/fortunes_train.bin"' --set 'data.val=""' --set train.steps=4 \
    --set train.threads="$threads" --set data.eval_every=0 --set log.progress=false \
    --set "log.metrics=\"$m\"" > /dev/null 2> "$tmp/$name.err" || return 1
  echo "$(med step_ms "$m" 1) $(metric step_ms "$m" 1 | sort -g | head -1)" > "$tmp/$name.last"
}

# torch_run NAME SCRIPT ARGS...: 2 warm-up steps, 3 timed; "MEDIAN BEST" ms into
# $tmp/NAME.last, the JSON line in $tmp/NAME.json, the first step's seconds in $tmp/NAME.first
torch_run() {
  local name="$1" script="$2"; shift 2
  "$peer_py" "$script" "$@" --seq_len "$T" --batch "$B" --threads "$threads" --steps 3 \
    --warmup_steps 2 > "$tmp/$name.json" 2> "$tmp/$name.err" || return 1
  "$peer_py" -c 'import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(d["median_step_ms"], d["min_step_ms"])
print(d["first_step_s"], file=sys.stderr)' "$tmp/$name.json" > "$tmp/$name.last" 2>> "$tmp/$name.first"
}

llama_torch=(--n_layer "$L" --n_head "$H" --n_kv_head "$KV" --n_embd "$C" --ffn_hidden "$F"
             --vocab_size "$V" --rope_theta "$THETA" --attn sdpa)

# one NAME FUNCTION ARGS...: a measured run after waiting for a quiet machine; appends
# "MEDIAN BEST" to $tmp/NAME.r and the CPU share others took to $tmp/NAME.o; a failed run
# leaves its first error line in $tmp/NAME.fail and the benchmark goes on
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

runs=(tessera_llama torch_llama)
if [ "${GPT2:-1}" != 0 ]; then runs+=(tessera_gpt2 torch_gpt2); fi
if [ "${PEER_COMPILE:-0}" = 1 ]; then runs+=(torch_llama_compile); fi
run() {
  case "$1" in
    tessera_llama) one "$1" tessera_run "$1" "${llama_sets[@]}" ;;
    torch_llama) one "$1" torch_run "$1" bench/torch_llama.py "${llama_torch[@]}" ;;
    torch_llama_compile) one "$1" torch_run "$1" bench/torch_llama.py "${llama_torch[@]}" --compile ;;
    tessera_gpt2) one "$1" tessera_run "$1" ;;
    torch_gpt2) one "$1" torch_run "$1" bench/torch_gpt2.py --n_layer 12 --n_head 12 \
                  --n_embd 768 --vocab_size "$GV" --attn sdpa ;;
  esac
}

# The VM's speed drifts for tens of seconds at a time: a round alternates its order
for r in $(seq "$rounds"); do
  echo "round $r/$rounds ..." >&2
  wait_quiet 60 > /dev/null
  sgemm_rate >> "$tmp/sgemm.c"
  if [ $((r % 2)) -eq 1 ]; then order=("${runs[@]}"); else
    order=(); for ((i = ${#runs[@]} - 1; i >= 0; i--)); do order+=("${runs[i]}"); done; fi
  for n in "${order[@]}"; do run "$n"; done
done
wait_quiet 60 > /dev/null
sgemm_rate >> "$tmp/sgemm.c"
sgemm=$(sort -g "$tmp/sgemm.c" | tail -1)

# ms/step of a run name: the median of its runs' medians ("" if it never ran)
ms() { [ -s "$tmp/$1.r" ] && cut -d' ' -f1 "$tmp/$1.r" | median || true; }

row() { # label name flops_per_token tessera_name_for_ratio
  local a
  a=$(ms "$2")
  if [ -z "$a" ]; then
    printf '| %s | n/a (%s) | | | | | | | |\n' "$1" "$(cut -c1-160 "$tmp/$2.fail" 2> /dev/null | tr '|' '/')"
    return
  fi
  awk -v n="$1" -v a="$a" -v b="$(cut -d' ' -f2 "$tmp/$2.r" | sort -g | head -1)" \
      -v tok="$tokens" -v f="$3" -v c="$sgemm" -v t="$(ms "$4")" \
      -v o="$(sort -g "$tmp/$2.o" | tail -1)" -v k="$(wc -l < "$tmp/$2.r")" 'BEGIN {
    gf = f * tok / (a * 1e-3) / 1e9
    vs = (t == "") ? "n/a" : sprintf("%.2fx", a / t)
    printf "| %s | %.0f | %.0f | %.0f | %.1f | %.0f%% | %s | %d | %s%% |\n",
      n, a, b, tok / (a * 1e-3), gf, 100 * gf / c, vs, k, o }'
}

ratio() { # A B: "A / B" to 2 decimals, or n/a
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") print "n/a"; else printf "%.2fx", a / b }'
}

torch_version=$("$peer_py" -c 'import torch; print(torch.__version__)')
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2> /dev/null || echo '+dirty')"
tessera_core=$(grep -ho '"blas_core_note":"[^"]*"' "$tmp"/*.metrics.jsonl 2> /dev/null | head -1 | cut -d'"' -f4)
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $commit"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p')), $(nproc) CPUs; $threads threads per run, one process at a time"
echo "PyTorch: $torch_version ($peer_py), SDPA attention, fp32 eager; Tessera: $build (OpenBLAS core ${tessera_core:-unknown})"
echo "sgemm ceiling (bench_sgemm, best 2-thread OpenBLAS sgemm at GPT-2 124M shapes), before each round and after: $(paste -sd' ' "$tmp/sgemm.c") GFLOP/s; the table uses the best, $sgemm"
echo
echo "| T$T B$B, fp32 | ms/step median | best step | tok/s | model GFLOP/s | of sgemm | time / Tessera's | runs | CPU used by others (max) |"
echo "|---|---|---|---|---|---|---|---|---|"
row "**Tessera llama** (12L 768d, 12/4 heads, F 2048, V 50304)" tessera_llama "$llama_f" tessera_llama
row "PyTorch llama (SDPA)" torch_llama "$llama_f" tessera_llama
if [ "${PEER_COMPILE:-0}" = 1 ]; then row "PyTorch llama, torch.compile" torch_llama_compile "$llama_f" tessera_llama; fi
if [ "${GPT2:-1}" != 0 ]; then
  row "Tessera GPT-2 124M" tessera_gpt2 "$gpt2_f" tessera_gpt2
  row "PyTorch GPT-2 124M (SDPA)" torch_gpt2 "$gpt2_f" tessera_gpt2
fi
echo
echo "Tessera / PyTorch speed: llama $(ratio "$(ms torch_llama)" "$(ms tessera_llama)")$(
  [ "${GPT2:-1}" != 0 ] && echo ", GPT-2 124M $(ratio "$(ms torch_gpt2)" "$(ms tessera_gpt2)") (same run)")"
echo
echo "model GFLOP/s = FLOP per token x tokens / step time: 6 x the parameters in matmuls (the" \
     "llama's untied head counts, its embedding does not; GPT-2's tied wte once) + 12 x layers" \
     "x T x C for attention: llama $llama_f, GPT-2 $gpt2_f FLOP per token, $tokens tokens per step."
echo
echo "command: $command  ($rounds round(s)${BUILD:+, BUILD=$BUILD}${PEER_COMPILE:+, PEER_COMPILE=$PEER_COMPILE}${GPT2:+, GPT2=$GPT2})"
