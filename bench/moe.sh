#!/usr/bin/env bash
# Mixture of Experts on one rank (issue 39, "Speed and memory"): a Mixtral-shaped model
# (configs/mixtral-4l.cfg: 4 layers, 512 wide, 8 query and 8 key/value heads of 64, 8
# SwiGLU experts of width 1024 top-2, vocabulary 32000, untied head; T 512, B 2, 2 threads)
# trained by Tessera (fp32; bf16 where the CPU has AVX512_BF16 or AMX-BF16), Tessera's dense
# model with the same active FLOPs (configs/mixtral-4l-dense.cfg: one SwiGLU of 2048), and
# Hugging Face's MixtralForCausalLM (bench/torch_mixtral.py, transformers and PyTorch 2 from
# scripts/peer_venv.sh) in fp32 and bf16 autocast, eager and torch.compile, and eager with
# transformers' grouped_mm experts. One process at a time, next to the GEMM ceilings
# measured in the same run (OpenBLAS sgemm for fp32 rows, oneDNN's bf16 GEMM for bf16
# rows). Each Tessera run also runs under /usr/bin/time -v: its true peak resident set
# against the trainer's pre-flight estimate (metrics' estimate_mb) and `tessera plan`'s.
# Prints a markdown table. Then (issue 40) the same model under expert parallelism, the
# ep all-to-all blocking (parallel.ep_overlap = false) against overlapped: ep 2 over dp 2
# (2 ranks x 1 thread, bound one per core) and, where the machine has 4 cores or PP_EP=1,
# pp 2 x dp 2 x ep 2 with 1f1b, zb-v and dualpipe-v (4 ranks x 1 thread): step time,
# a2a_ms (the exchanges, start to completion), a2a_wait_ms (blocked) and a2a_hidden.
#
# Usage: bench/moe.sh [ROUNDS]      (run from anywhere; ROUNDS default 1)
#   BUILD=DIR       Tessera build folder (default build/; scripts/build.sh runs in it)
#   PEER_PY=PATH    the PyTorch 2 python with transformers (default: scripts/peer_venv.sh's)
#   PEER_GROUPED=0  skip the grouped_mm peer rows
#   BF16=0|1        Tessera's bf16 rows (default: where the CPU has AVX512_BF16 or AMX-BF16;
#                   elsewhere tessera refuses bf16, and the rows say so)
#   PEER_BF16=0|1   PyTorch's bf16 rows (default: BF16's value)
#   FP32=0          skip the fp32 rows (Tessera's and PyTorch's): issue 39's table is bf16's
#   KEEP=DIR        keep the runs' metrics, JSON and /usr/bin/time reports there
#   L= C= H= KV= E= K= FE= V= T= B=   the shape (default issue 39's: 4 512 8 8 8 2 1024
#                   32000 512 2); FD= the dense twin's width (default K * FE)
#   STEPS=, WARMUP= timed steps (default 3) and PyTorch's untimed warm-up steps (default 2)
#   QUIET_S=        seconds to wait for a quiet machine before each run (default 60)
#   EP=0            skip the expert-parallel rows; ONLY_EP=1: only them (no peers, no
#                   one-rank table; their shape is the same variables')
#   G_EP=           the ep rows' global batch (default 8: micro-batches of 1 sequence, 4
#                   a replica, as dualpipe-v needs 2 pp); PP_EP=1|0 the 4-rank rows
#                   (default: 1 where nproc >= 4; on fewer cores their ranks would share
#                   cores and the times measure the OS's scheduling, not the overlap)
#
# A run's ms/step is its median over the timed steps: Tessera runs STEPS + 1 steps and
# times steps 1.. (step 0 page-faults its buffers); PyTorch runs WARMUP untimed steps
# (torch.compile compiles in the first) and times STEPS. Each run waits for a quiet machine
# and is repeated once if other processes took more than 10% of the CPUs
# (bench/lib_parallel.sh); the share they took is in the table.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rounds="${1:-1}"
threads=2
command="bench/moe.sh $*"
build="${BUILD:-$root/build}"
source "$root/bench/lib_parallel.sh"
bench_setup
only_ep="${ONLY_EP:-0}"
peer_py=""
[ "$only_ep" = 1 ] || peer_py="${PEER_PY:-$(scripts/peer_venv.sh)}"
command -v /usr/bin/time > /dev/null || { echo "bench/moe.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }

L="${L:-4}" C="${C:-512}" H="${H:-8}" KV="${KV:-8}" E="${E:-8}" K="${K:-2}" FE="${FE:-1024}"
V="${V:-32000}" T="${T:-512}" B="${B:-2}"
FD="${FD:-$((K * FE))}"
STEPS="${STEPS:-3}" WARMUP="${WARMUP:-2}" QUIET_S="${QUIET_S:-60}"
tokens=$((B * T))
# bf16 runs where oneDNN has bf16 instructions; elsewhere Tessera refuses it (bench/bf16.sh)
has_bf16=0
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then has_bf16=1; fi
run_bf16="${BF16:-$has_bf16}"
run_fp32="${FP32:-1}"

# active_flops_per_token MLP_PARAMS: bench/llama.sh's count (6 per parameter in a matmul,
# the untied head's GEMM counts, the embedding lookup does not, plus attention's
# 12 * L * T * C) with a block's MLP parameters a token uses: the MoE's router (E x C) and
# its K experts' 3 x FE x C, or the dense SwiGLU's 3 x FD x C (Megatron's active FLOPs)
active_flops_per_token() {
  awk -v L="$L" -v C="$C" -v H="$H" -v KV="$KV" -v V="$V" -v T="$T" -v mlp="$1" 'BEGIN {
    hs = C / H
    p = L * (2 * C * C + 2 * C * KV * hs + mlp + 2 * C) + C + V * C
    printf "%.0f", 6 * p + 12 * L * T * C }'
}
moe_f=$(active_flops_per_token $((E * C + K * 3 * FE * C)))
dense_f=$(active_flops_per_token $((3 * FD * C)))

# ceiling NAME: best GFLOP/s of a GEMM benchmark's --json line, appended to $tmp/NAME.c
# (sgemm: bench_sgemm; bf16: bench_gemm_bf16, n/a without bf16 instructions or the binary)
ceiling() {
  local bin=bench_sgemm key=sgemm_gflops
  if [ "$1" = bf16 ]; then bin=bench_gemm_bf16 key=bf16_gflops; fi
  if [ -x "$build/bench/$bin" ] && { [ "$1" = sgemm ] || [ "$has_bf16" = 1 ]; }; then
    "$build/bench/$bin" "$threads" --json | grep -o "\"$key\": *[0-9.]*" | grep -o '[0-9.]*$'
  else
    echo "n/a"
  fi >> "$tmp/$1.c"
}

shape_sets=(--set model.n_layer="$L" --set model.n_embd="$C" --set model.n_head="$H"
            --set model.n_kv_head="$KV" --set model.vocab_size="$V" --set model.seq_len="$T")
moe_sets=(configs/mixtral-4l.cfg "${shape_sets[@]}" --set model.moe_experts="$E"
          --set model.moe_top_k="$K" --set model.moe_ffn_hidden="$FE")
dense_sets=(configs/mixtral-4l-dense.cfg "${shape_sets[@]}" --set model.ffn_hidden="$FD")

# tessera_run NAME PRECISION CONFIG SETS...: STEPS + 1 steps under /usr/bin/time -v;
# "MEDIAN BEST" step_ms over steps 1.. into $tmp/NAME.last; the metrics in
# $tmp/NAME.metrics.jsonl, the time report in $tmp/NAME.time, stderr in $tmp/NAME.err
tessera_run() {
  local name="$1" precision="$2" m="$tmp/$1.metrics.jsonl"; shift 2
  rm -f "$m"
  mpirun -np 1 --bind-to none /usr/bin/time -o "$tmp/$name.time" -v "$build/tessera" train "$@" \
    --set parallel.micro_batch="$B" --set train.global_batch="$B" \
    --set 'data.train="data/fortunes_train.bin"' --set 'data.val=""' \
    --set "train.precision=\"$precision\"" --set train.steps=$((STEPS + 1)) \
    --set train.threads="$threads" --set data.eval_every=0 --set log.progress=false \
    --set "log.metrics=\"$m\"" > /dev/null 2> "$tmp/$name.err" || return 1
  echo "$(med step_ms "$m" 1) $(metric step_ms "$m" 1 | sort -g | head -1)" > "$tmp/$name.last"
}

# torch_run NAME PRECISION ARGS...: WARMUP untimed steps, STEPS timed; "MEDIAN BEST" ms
# into $tmp/NAME.last, the JSON line in $tmp/NAME.json (its peak_rss_mb), the first
# step's seconds appended to $tmp/NAME.first
torch_run() {
  local name="$1" precision="$2"; shift 2
  "$peer_py" bench/torch_mixtral.py --n_layer "$L" --n_embd "$C" --n_head "$H" \
    --n_kv_head "$KV" --experts "$E" --top_k "$K" --moe_ffn_hidden "$FE" --vocab_size "$V" \
    --seq_len "$T" --batch "$B" --threads "$threads" --steps "$STEPS" \
    --warmup_steps "$WARMUP" --precision "$precision" "$@" \
    > "$tmp/$name.json" 2> "$tmp/$name.err" || return 1
  "$peer_py" -c 'import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(d["median_step_ms"], d["min_step_ms"])
print(d["first_step_s"], file=sys.stderr)' "$tmp/$name.json" > "$tmp/$name.last" 2>> "$tmp/$name.first"
}

# one NAME FUNCTION ARGS...: a measured run after waiting for a quiet machine; appends
# "MEDIAN BEST" to $tmp/NAME.r and the CPU share others took to $tmp/NAME.o; a failed run
# (a refusal: bf16 without the instructions) leaves its first error line in $tmp/NAME.fail
one() {
  local name="$1"; shift
  echo "  $name ..." >&2
  wait_quiet "$QUIET_S" > /dev/null
  if measured "$@"; then
    cat "$tmp/$name.last" >> "$tmp/$name.r"
    echo "$OTHERS" >> "$tmp/$name.o"
  else
    grep -m1 -i 'error' "$tmp/$name.err" > "$tmp/$name.fail" || tail -1 "$tmp/$name.err" > "$tmp/$name.fail"
  fi
}

# ---- Expert parallelism (issue 40): the all-to-all blocking against overlapped --------
cores=$(nproc)
G_EP="${G_EP:-8}"
pp_ep="${PP_EP:-$([ "$cores" -ge 4 ] && echo 1 || echo 0)}"

# ep_run NAME NP SETS...: the MoE on NP ranks of 1 thread (bound one per core; NP = 1:
# every core as threads) at global batch G_EP, micro-batches of 1; "MEDIAN BEST" step_ms
# over steps 1.. into $tmp/NAME.last, metrics in $tmp/NAME.metrics.jsonl
ep_run() {
  local name="$1" np="$2" m="$tmp/$1.metrics.jsonl"; shift 2
  local launch=(mpirun -np "$np" --bind-to core) threads_ep=1
  [ "$np" -gt "$cores" ] && launch=(mpirun -np "$np" --oversubscribe --bind-to none)
  [ "$np" = 1 ] && { launch=(mpirun -np 1 --bind-to none); threads_ep="$threads"; }
  rm -f "$m"
  "${launch[@]}" "$build/tessera" train "${moe_sets[@]}" "$@" \
    --set parallel.micro_batch=1 --set train.global_batch="$G_EP" \
    --set 'data.train="data/fortunes_train.bin"' --set 'data.val=""' \
    --set train.precision='"fp32"' --set train.steps=$((STEPS + 1)) \
    --set train.threads="$threads_ep" --set data.eval_every=0 --set log.progress=false \
    --set "log.metrics=\"$m\"" > /dev/null 2> "$tmp/$name.err" || return 1
  echo "$(med step_ms "$m" 1) $(metric step_ms "$m" 1 | sort -g | head -1)" > "$tmp/$name.last"
}

# ep_predict SETS...: the simulator's share of the all-to-all hidden for the same run
# (tessera plan on this machine's cluster file: an overlapped pair hides each action's
# exchanges under its partner's compute, the shared experts theirs; src/plan/moe_cost.h)
ep_predict() {
  "$build/tessera" plan "${moe_sets[@]}" "$@" --set parallel.micro_batch=1 \
    --set train.global_batch="$G_EP" --set train.precision='"fp32"' \
    --cluster configs/clusters/this-machine.cfg --json 2> /dev/null |
    python3 -c 'import json, sys; print("%.0f%%" % (100 * json.load(sys.stdin)["moe"]["a2a_hidden_fraction"]))' \
      2> /dev/null || echo "n/a"
}

# ep_row LABEL NAME BLOCKING_NAME [PREDICTED]: step ms, its a2a columns (medians over the
# timed steps), the step against the blocking twin's, the simulator's hidden share
ep_row() {
  local a m="$tmp/$2.metrics.jsonl"
  a=$(ms "$2")
  if [ -z "$a" ]; then
    printf '| %s | n/a (%s) | | | | | | |\n' "$1" "$(cut -c1-160 "$tmp/$2.fail" 2> /dev/null | tr '|' '/')"
    return
  fi
  local a2a wait hid vs=""
  a2a=$(med a2a_ms "$m" 1 2> /dev/null || true); wait=$(med a2a_wait_ms "$m" 1 2> /dev/null || true)
  hid=$(med a2a_hidden "$m" 1 2> /dev/null || true)
  [ -n "$3" ] && [ -n "$(ms "$3")" ] && vs=$(ratio "$a" "$(ms "$3")")
  printf '| %s | %.0f | %s | %s | %s | %s | %s | %s%% |\n' "$1" "$a" "${a2a:-}" "${wait:-}" \
    "$(awk -v h="${hid:-}" 'BEGIN { if (h == "") print ""; else printf "%.0f%%", 100 * h }')" \
    "${4:-}" "${vs:-}" "$(sort -g "$tmp/$2.o" | tail -1)"
}

ep_section() {
  local grids=("ep2 2 --set parallel.dp=2 --set parallel.ep=2")
  if [ "$pp_ep" = 1 ]; then
    grids+=("pp2_1f1b 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.schedule=1f1b"
            "pp2_zbv 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.schedule=zb-v --set parallel.virtual_stages=2"
            "pp2_dualpipev 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.schedule=dualpipe-v --set parallel.virtual_stages=2")
  fi
  local r g name np sets
  for r in $(seq "$rounds"); do
    echo "ep round $r/$rounds ..." >&2
    one ep_one1 ep_run ep_one1 1
    for g in "${grids[@]}"; do
      read -r name np sets <<< "$g"
      # shellcheck disable=SC2086 # sets: words on purpose
      one "ep_${name}_blocking" ep_run "ep_${name}_blocking" "$np" $sets --set parallel.ep_overlap=false
      # shellcheck disable=SC2086
      one "ep_$name" ep_run "ep_$name" "$np" $sets --set parallel.ep_overlap=true
    done
  done
  echo
  echo "Expert parallelism: the same model at global batch $G_EP (micro-batches of 1 sequence), fp32, ep all-to-all blocking (parallel.ep_overlap = false) against overlapped (true; the same bits), $STEPS timed steps, medians:"
  echo
  echo "| grid (ranks x threads) | ms/step | a2a_ms (start to completion, longest rank) | a2a_wait_ms (blocked) | a2a_hidden | the simulator's a2a hidden | overlapped / blocking | CPU used by others (max) |"
  echo "|---|---|---|---|---|---|---|---|"
  ep_row "1 rank x $threads threads (no exchange)" ep_one1 ""
  for g in "${grids[@]}"; do
    read -r name np sets <<< "$g"
    ep_row "$name ($np x 1), blocking" "ep_${name}_blocking" "" "0%"
    # shellcheck disable=SC2086 # sets: words on purpose
    ep_row "$name ($np x 1), overlapped" "ep_$name" "ep_${name}_blocking" "$(ep_predict $sets)"
  done
  echo
  [ "$pp_ep" = 1 ] || echo "pp 2 x dp 2 x ep 2 rows: not run ($cores cores: 4 ranks of 1 thread would share them, and the step time would measure the scheduler, not the overlap; PP_EP=1 runs them anyway)."
  echo "a2a_hidden = 1 - blocked / total over every rank; on MPI over shared memory the exchange's copies run inside MPI calls on the compute cores, so what is hidden is mostly the wait for the peers. The simulator's column: tessera plan --cluster configs/clusters/this-machine.cfg of the same run (blocking: 0 by definition)."
  echo "command: $command  (ep rows: $rounds round(s), steps $STEPS, G_EP=$G_EP, PP_EP=$pp_ep)"
}

if [ "$only_ep" = 1 ]; then
  commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2> /dev/null || echo '+dirty')"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $commit"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $cores CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
  ms() { [ -s "$tmp/$1.r" ] && cut -d' ' -f1 "$tmp/$1.r" | median || true; }
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") print "n/a"; else printf "%.2fx", a / b }'; }
  ep_section
  exit 0
fi

no_bf16="this CPU has neither AVX512_BF16 nor AMX-BF16: Tessera refuses bf16 here"
no_fp32="skipped (FP32=0)"
runs=()
if [ "$run_fp32" != 0 ]; then
  runs+=(tessera_moe tessera_dense)
else
  for n in tessera_moe tessera_dense hf_fp32 hf_fp32_compile hf_fp32_grouped; do echo "$no_fp32" > "$tmp/$n.fail"; done
fi
if [ "$run_bf16" = 1 ]; then
  runs+=(tessera_moe_bf16 tessera_dense_bf16)
else
  echo "$no_bf16" > "$tmp/tessera_moe_bf16.fail"; cp "$tmp/tessera_moe_bf16.fail" "$tmp/tessera_dense_bf16.fail"
fi
# PyTorch's bf16 without the instructions is oneDNN's emulation, several times its fp32
# time, and nothing of Tessera's to set it against: skipped there unless PEER_BF16=1
peer_bf16="${PEER_BF16:-$run_bf16}"
hf_runs=()
if [ "$run_fp32" != 0 ]; then hf_runs+=(hf_fp32 hf_fp32_compile); fi
if [ "$peer_bf16" = 1 ]; then hf_runs+=(hf_bf16 hf_bf16_compile); fi
if [ "${PEER_GROUPED:-1}" != 0 ]; then
  if [ "$run_fp32" != 0 ]; then hf_runs+=(hf_fp32_grouped); fi
  if [ "$peer_bf16" = 1 ]; then hf_runs+=(hf_bf16_grouped); fi
fi
if [ "$peer_bf16" != 1 ]; then
  for n in hf_bf16 hf_bf16_compile hf_bf16_grouped; do
    echo "skipped: no bf16 instructions on this CPU, PyTorch would emulate them (PEER_BF16=1 runs it)" > "$tmp/$n.fail"
  done
fi
runs+=("${hf_runs[@]}")
run() {
  case "$1" in
    tessera_moe) one "$1" tessera_run "$1" fp32 "${moe_sets[@]}" ;;
    tessera_dense) one "$1" tessera_run "$1" fp32 "${dense_sets[@]}" ;;
    tessera_moe_bf16) one "$1" tessera_run "$1" bf16 "${moe_sets[@]}" ;;
    tessera_dense_bf16) one "$1" tessera_run "$1" bf16 "${dense_sets[@]}" ;;
    hf_fp32) one "$1" torch_run "$1" fp32 ;;
    hf_fp32_compile) one "$1" torch_run "$1" fp32 --compile ;;
    hf_bf16) one "$1" torch_run "$1" bf16 ;;
    hf_bf16_compile) one "$1" torch_run "$1" bf16 --compile ;;
    hf_fp32_grouped) one "$1" torch_run "$1" fp32 --experts_impl grouped_mm ;;
    hf_bf16_grouped) one "$1" torch_run "$1" bf16 --experts_impl grouped_mm ;;
  esac
}

# The VM's speed drifts for tens of seconds at a time: a round alternates its order
for r in $(seq "$rounds"); do
  echo "round $r/$rounds ..." >&2
  wait_quiet "$QUIET_S" > /dev/null
  ceiling sgemm; ceiling bf16
  if [ $((r % 2)) -eq 1 ]; then order=("${runs[@]}"); else
    order=(); for ((i = ${#runs[@]} - 1; i >= 0; i--)); do order+=("${runs[i]}"); done; fi
  for n in "${order[@]}"; do run "$n"; done
done
wait_quiet "$QUIET_S" > /dev/null
ceiling sgemm; ceiling bf16

best_of() { { grep -v 'n/a' "$tmp/$1.c" || true; } | sort -g | tail -1; }
sgemm=$(best_of sgemm); bf16=$(best_of bf16)
sgemm=${sgemm:-n/a}; bf16=${bf16:-n/a}
# ms/step of a run name: the median of its runs' medians ("" if it never ran)
ms() { [ -s "$tmp/$1.r" ] && cut -d' ' -f1 "$tmp/$1.r" | median || true; }
# the fastest of the named runs: "MS NAME" ("" if none ran)
fastest() { local n; for n in "$@"; do [ -n "$(ms "$n")" ] && echo "$(ms "$n") $n"; done | sort -g | head -1 || true; }

# rss NAME: the run's peak resident set in MiB: /usr/bin/time's for Tessera (the last
# run's), the JSON's ru_maxrss for PyTorch
rss() {
  if [ -s "$tmp/$1.time" ]; then
    sed -n 's/.*Maximum resident set size (kbytes): *//p' "$tmp/$1.time" | awk '{ printf "%.0f", $1 / 1024 }'
  elif [ -s "$tmp/$1.json" ]; then
    grep -o '"peak_rss_mb": *[0-9.]*' "$tmp/$1.json" | grep -o '[0-9.]*$' | awk '{ printf "%.0f", $1 }'
  fi
}

row() { # label name flops_per_token ceiling-name ceiling
  local a
  a=$(ms "$2")
  if [ -z "$a" ]; then
    printf '| %s | n/a (%s) | | | | | | | | |\n' "$1" "$(cut -c1-160 "$tmp/$2.fail" 2> /dev/null | tr '|' '/')"
    return
  fi
  awk -v n="$1" -v a="$a" -v b="$(cut -d' ' -f2 "$tmp/$2.r" | sort -g | head -1)" \
      -v tok="$tokens" -v f="$3" -v cn="$4" -v c="$5" -v m="$(rss "$2")" \
      -v o="$(sort -g "$tmp/$2.o" | tail -1)" -v k="$(wc -l < "$tmp/$2.r")" 'BEGIN {
    gf = f * tok / (a * 1e-3) / 1e9
    share = (c == "n/a") ? "n/a" : sprintf("%.0f%%", 100 * gf / c)
    printf "| %s | %.0f | %.0f | %.0f | %.1f | %s %s | %s | %s | %d | %s%% |\n",
      n, a, b, tok / (a * 1e-3), gf, cn, c, share, m, k, o }'
}

ratio() { # A B: "A / B" to 2 decimals, or n/a
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") print "n/a"; else printf "%.2fx", a / b }'
}

# memory NAME CONFIG SETS...: the trainer's estimate (metrics' estimate_mb), its own peak
# report (peak_rss_mb), `tessera plan`'s memory_bytes (the cost model, no measuring), the
# true peak (/usr/bin/time), and estimate / true
memory() {
  local name="$1" m="$tmp/$1.metrics.jsonl" est peak plan truth; shift
  [ -s "$tmp/$name.time" ] && [ -s "$m" ] || { echo "| $name | n/a (did not run) | | | | |"; return; }
  est=$(mem_field "$m" estimate_mb); peak=$(mem_field "$m" peak_rss_mb); truth=$(rss "$name")
  plan=$("$build/tessera" plan "$@" --set parallel.micro_batch="$B" --set train.global_batch="$B" \
         --cost model --json 2> /dev/null | grep -o '"memory_bytes": *[0-9]*' | head -1 | grep -o '[0-9]*$' || true)
  awk -v n="$name" -v e="$est" -v p="$peak" -v q="$plan" -v t="$truth" 'BEGIN {
    printf "| %s | %.0f | %.0f | %s | %.0f | %.3f (%+.1f%%) |\n", n, e, p,
      (q == "") ? "n/a" : sprintf("%.0f", q / 1048576), t, e / t, 100 * (e / t - 1) }'
}

torch_version=$("$peer_py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2> /dev/null || echo '+dirty')"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $commit"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p')), $(nproc) CPUs, bf16 instructions: $([ "$has_bf16" = 1 ] && echo yes || echo 'none (no AVX512_BF16, no AMX-BF16)'); $threads threads per run, one process at a time"
echo "lscpu flags: $(lscpu | sed -n 's/^Flags: *//p' | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|amx_bf16|amx_tile)$' | paste -sd' ')"
echo "peer: $torch_version ($peer_py), SDPA attention; Tessera: $build"
echo "ceilings (GFLOP/s, best 2-thread GEMM), before each round and after: sgemm (bench_sgemm)" \
     "$(paste -sd' ' "$tmp/sgemm.c"); oneDNN bf16 GEMM (bench_gemm_bf16) $(paste -sd' ' "$tmp/bf16.c");" \
     "the table uses the best of each"
echo
echo "| L$L C$C H$H/$KV E$E top-$K FE$FE V$V, T$T B$B | ms/step median | best step | tok/s | active GFLOP/s | ceiling GFLOP/s | MFU (active, of ceiling) | peak RSS MiB | runs | CPU used by others (max) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
row "**Tessera MoE fp32**" tessera_moe "$moe_f" sgemm "$sgemm"
row "**Tessera MoE bf16**" tessera_moe_bf16 "$moe_f" bf16 "$bf16"
row "Tessera dense F$FD fp32 (same active FLOPs)" tessera_dense "$dense_f" sgemm "$sgemm"
row "Tessera dense F$FD bf16" tessera_dense_bf16 "$dense_f" bf16 "$bf16"
row "HF Mixtral eager fp32" hf_fp32 "$moe_f" sgemm "$sgemm"
row "HF Mixtral torch.compile fp32" hf_fp32_compile "$moe_f" sgemm "$sgemm"
row "HF Mixtral eager bf16 autocast" hf_bf16 "$moe_f" bf16 "$bf16"
row "HF Mixtral torch.compile bf16 autocast" hf_bf16_compile "$moe_f" bf16 "$bf16"
if [ "${PEER_GROUPED:-1}" != 0 ]; then
  row "HF Mixtral eager fp32, grouped_mm experts" hf_fp32_grouped "$moe_f" sgemm "$sgemm"
  row "HF Mixtral eager bf16 autocast, grouped_mm experts" hf_bf16_grouped "$moe_f" bf16 "$bf16"
fi
echo
hf32=$(fastest hf_fp32 hf_fp32_compile hf_fp32_grouped)
hf16=$(fastest hf_bf16 hf_bf16_compile hf_bf16_grouped)
echo "MoE step / dense step with the same active FLOPs (goal <= 1.25): fp32" \
     "$(ratio "$(ms tessera_moe)" "$(ms tessera_dense)"), bf16 $(ratio "$(ms tessera_moe_bf16)" "$(ms tessera_dense_bf16)")"
against() { [ -n "$1" ] && [ -n "$2" ] && echo " (against ${1#* })" || true; }
echo "Tessera MoE speed / Hugging Face's best (goal >= 2x in bf16): bf16" \
     "$(ratio "${hf16%% *}" "$(ms tessera_moe_bf16)")$(against "$hf16" "$(ms tessera_moe_bf16)"), fp32" \
     "$(ratio "${hf32%% *}" "$(ms tessera_moe)")$(against "$hf32" "$(ms tessera_moe)")"
[ "$has_bf16" = 1 ] || echo "bf16: $no_bf16, so the bf16 goal is not measurable on this machine (PyTorch's bf16 rows, if run with PEER_BF16=1, are oneDNN's emulation)."
echo "Routing (Tessera's moe_max_load: the worst block's busiest expert over the mean, E/K = $((E / K)).0 when every token picks one expert; random init, no balancing on either side), median over the timed steps:" \
     "fp32 $(med moe_max_load "$tmp/tessera_moe.metrics.jsonl" 1 2> /dev/null || true)$([ "$run_bf16" = 1 ] && echo ", bf16 $(med moe_max_load "$tmp/tessera_moe_bf16.metrics.jsonl" 1 2> /dev/null || true)")"
echo
echo "Memory of the Tessera runs (MiB; goal: estimate within 5% of the true peak):"
echo
echo "| run | trainer's estimate (estimate_mb) | trainer's peak_rss_mb | tessera plan (memory_bytes) | true peak (/usr/bin/time) | estimate / true |"
echo "|---|---|---|---|---|---|"
memory tessera_moe "${moe_sets[@]}"
memory tessera_dense "${dense_sets[@]}"
if [ "$run_bf16" = 1 ]; then
  memory tessera_moe_bf16 "${moe_sets[@]}" --set 'train.precision="bf16"'
  memory tessera_dense_bf16 "${dense_sets[@]}" --set 'train.precision="bf16"'
fi
echo
echo "active GFLOP/s = active FLOP per token x tokens / step time: 6 x the parameters a token" \
     "uses in matmuls (attention, the router's E x C and K experts' 3 x FE x C per MoE block," \
     "or the dense SwiGLU's 3 x FD x C; the untied head; not the embedding lookup) + 12 x" \
     "layers x T x C for attention: MoE $moe_f, dense $dense_f FLOP per token, $tokens tokens per" \
     "step. MFU sets it against the same run's best GEMM (sgemm for fp32, oneDNN bf16 for bf16)." \
     "torch.compile's first step (compilation): fp32 $(paste -sd' ' "$tmp/hf_fp32_compile.first" 2> /dev/null || echo n/a) s," \
     "bf16 $(paste -sd' ' "$tmp/hf_bf16_compile.first" 2> /dev/null || echo n/a) s. Peak RSS:" \
     "Tessera's from /usr/bin/time -v, PyTorch's from ru_maxrss (its libraries included)."
echo
echo "command: $command  ($rounds round(s), steps $STEPS${BUILD:+, BUILD=$BUILD}${BF16:+, BF16=$BF16}${FP32:+, FP32=$FP32}${PEER_GROUPED:+, PEER_GROUPED=$PEER_GROUPED}${PEER_BF16:+, PEER_BF16=$PEER_BF16})"
[ "${EP:-1}" = 0 ] || ep_section
