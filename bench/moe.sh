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
source "$root/bench/lib_step.sh"
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

shape_sets=(--set model.n_layer="$L" --set model.n_embd="$C" --set model.n_head="$H"
            --set model.n_kv_head="$KV" --set model.vocab_size="$V" --set model.seq_len="$T")
moe_sets=(configs/mixtral-4l.cfg "${shape_sets[@]}" --set model.moe_experts="$E"
          --set model.moe_top_k="$K" --set model.moe_ffn_hidden="$FE")
dense_sets=(configs/mixtral-4l-dense.cfg "${shape_sets[@]}" --set model.ffn_hidden="$FD")

# The step runs (bench/lib_step.sh): Tessera without its progress lines; the peer is
# transformers' MixtralForCausalLM at the same shape
tessera_run_sets=(--set log.progress=false)
peer_script=bench/torch_mixtral.py
peer_args=(--n_layer "$L" --n_embd "$C" --n_head "$H" --n_kv_head "$KV" --experts "$E"
           --top_k "$K" --moe_ffn_hidden "$FE" --vocab_size "$V")

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
  ep_section
  exit 0
fi

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
hf_runs_plan
runs+=("${hf_runs[@]}")
run() {
  case "$1" in
    tessera_moe) one "$1" tessera_run "$1" fp32 "${moe_sets[@]}" ;;
    tessera_dense) one "$1" tessera_run "$1" fp32 "${dense_sets[@]}" ;;
    tessera_moe_bf16) one "$1" tessera_run "$1" bf16 "${moe_sets[@]}" ;;
    tessera_dense_bf16) one "$1" tessera_run "$1" bf16 "${dense_sets[@]}" ;;
    hf_*) hf_run "$1" ;;
  esac
}

rounds_run "$rounds"

machine_header
peer_header
echo
step_table_header "L$L C$C H$H/$KV E$E top-$K FE$FE V$V, T$T B$B"
row "**Tessera MoE fp32**" tessera_moe "$moe_f" sgemm "$sgemm"
row "**Tessera MoE bf16**" tessera_moe_bf16 "$moe_f" bf16 "$bf16"
row "Tessera dense F$FD fp32 (same active FLOPs)" tessera_dense "$dense_f" sgemm "$sgemm"
row "Tessera dense F$FD bf16" tessera_dense_bf16 "$dense_f" bf16 "$bf16"
hf_rows Mixtral "$moe_f"
echo
echo "MoE step / dense step with the same active FLOPs (goal <= 1.25): fp32" \
     "$(ratio "$(ms tessera_moe)" "$(ms tessera_dense)"), bf16 $(ratio "$(ms tessera_moe_bf16)" "$(ms tessera_dense_bf16)")"
speed_vs_peer MoE tessera_moe_bf16 tessera_moe
no_bf16_note
echo "Routing (Tessera's moe_max_load: the worst block's busiest expert over the mean, E/K = $((E / K)).0 when every token picks one expert; random init, no balancing on either side), median over the timed steps:" \
     "fp32 $(med moe_max_load "$tmp/tessera_moe.metrics.jsonl" 1 2> /dev/null || true)$([ "$run_bf16" = 1 ] && echo ", bf16 $(med moe_max_load "$tmp/tessera_moe_bf16.metrics.jsonl" 1 2> /dev/null || true)")"
echo
memory_table_header
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
     "torch.compile's first step (compilation): $(compile_first_note). Peak RSS:" \
     "Tessera's from /usr/bin/time -v, PyTorch's from ru_maxrss (its libraries included)."
echo
echo "command: $command  ($rounds round(s), steps $STEPS${BUILD:+, BUILD=$BUILD}${BF16:+, BF16=$BF16}${FP32:+, FP32=$FP32}${PEER_GROUPED:+, PEER_GROUPED=$PEER_GROUPED}${PEER_BF16:+, PEER_BF16=$PEER_BF16})"
[ "${EP:-1}" = 0 ] || ep_section
