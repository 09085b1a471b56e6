#!/usr/bin/env bash
# Muon against AdamW (issue 42; bench/RESULTS.md 1.11): what the optimizer step costs and
# what it buys.
#
# speed: Muon's Newton-Schulz iteration and optimizer step on a GPT-2-124M-shaped Llama
#   (12 blocks, 768 wide, 12 heads, SwiGLU 2048, vocabulary 50304, untied head: each block's
#   q, k, v, o [768, 768], gate, up [2048, 768] and down [768, 2048] are Muon's, 1.68 TFLOP
#   of iteration a step at 5 steps):
#   - the physical ceiling, bench_sgemm's best rate, at 1 and 2 threads;
#   - bench_muon: the iteration of each matrix shape (ts_muon_orthogonalize, the trainer's
#     own), its FLOPs (2 * ns_steps * ts_muon_ns_cost) and rate; the same GEMMs alone; the
#     model's sum against the ceiling (goal: >= 80%);
#   - the trainer's step (metrics optim_ms: gradient norm, AdamW, Muon, the gathers after
#     the update; muon_ms: Muon's momentum, iteration and update on a rank's own matrices;
#     optim_gather_ms), medians of steps 1..STEPS of 1 sequence of 64 tokens a replica:
#     AdamW and Muon at dp 1 (2 threads, and 1 thread: a dp-2 rank's share of this
#     machine) and at dp 2 (1 thread a rank) with ZeRO 0 and 1. The distribution's goal:
#     dp 2's muon_ms at most half one rank's on the same per-rank hardware (1 thread), and
#     Muon's extra over AdamW in the dp-2 step at most that plus Muon's extra gathers;
#   - the peer, in the same invocation: PyTorch's clip_grad_norm_ + optimizer step on the
#     same shapes (bench/torch_muon.py): torch.optim.AdamW, and torch.optim.Muon + AdamW
#     with Newton-Schulz in float32 (Tessera's arithmetic) and in torch's own bfloat16
#     (one block's step times 12 unless PEER_BF16_LAYERS says otherwise: without bf16
#     instructions torch's bf16 GEMMs run at a tenth of its fp32 rate).
# loss: the tiny Llama (configs/llama-tiny.cfg, 4 x 128, byte tokens, 16 x 64 tokens a
#   step) on the default corpus (data/fortunes_*.bin), AdamW against Muon: each at
#   its LRS_ADAMW / LRS_MUON (warm-up 20, cosine to lr/10) for SWEEP steps, the best by
#   validation loss (the sweep's last lr best: widen it), then
#   LOSS_STEPS at that lr; the curves plotted to bench/muon_loss.svg (bench/loss_svg.py).
#   One thread a run, two runs at a time.
# Usage: bench/muon.sh [speed|loss|all]     (default all; from anywhere)
#   BUILD=DIR       build directory (default build/)
#   PEER_PY=PATH    PyTorch's python (default the peer venv's; "" leaves the peer out)
#   STEPS=N         timed trainer steps after step 0 (default 2)
#   QUIET_S=S       wait up to S seconds for a quiet machine before each timed run (120)
#   LRS_ADAMW="a b ..."  AdamW's sweep (default "1e-3 2e-3 4e-3 8e-3 1.6e-2")
#   LRS_MUON="a b ..."   Muon's (default "2e-3 4e-3 8e-3 1.6e-2 3.2e-2 6.4e-2")
#   SWEEP=N LOSS_STEPS=N   (default 150 and 500)
#   SVG=PATH        the plot (default bench/muon_loss.svg)
#   RUNS="..."      the speed part's trainer runs (default all: adamw1 muon1 muon1t1
#                   adamw2z0 muon2z0 adamw2z1 muon2z1; a rerun of some when others were loud)
#   KEEP=DIR        keep every run's files there; a loss run whose metrics there are
#                   complete (the last step's validation line) is reused, not rerun
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. bench/lib_parallel.sh
what="${1:-all}"
build="${BUILD:-$root/build}"
peer_py="${PEER_PY-/root/.cache/tessera/peer-venv/bin/python}"
[ -n "$peer_py" ] && [ ! -x "$peer_py" ] && peer_py=""
STEPS="${STEPS:-2}"
QUIET_S="${QUIET_S:-120}"
LRS_ADAMW="${LRS_ADAMW:-1e-3 2e-3 4e-3 8e-3 1.6e-2}"
LRS_MUON="${LRS_MUON:-2e-3 4e-3 8e-3 1.6e-2 3.2e-2 6.4e-2}"
SWEEP="${SWEEP:-150}"
LOSS_STEPS="${LOSS_STEPS:-500}"
SVG="${SVG:-$root/bench/muon_loss.svg}"
PEER_BF16_LAYERS="${PEER_BF16_LAYERS:-1}"
RETRIES="${RETRIES:-0}"
export RETRIES
for b in tessera bench/bench_sgemm bench/bench_muon; do
  [ -x "$build/$b" ] || { echo "muon.sh: $build/$b missing (scripts/build.sh $build)" >&2; exit 1; }
done
scripts/prepare_data.sh "$build/tessera" data >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
if [ -n "${KEEP:-}" ]; then
  tmp="$KEEP"; mkdir -p "$tmp"
else
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fi
peer_v=""
[ -n "$peer_py" ] && peer_v=", peer: PyTorch $("$peer_py" -c 'import torch; print(torch.__version__)')"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src bench || echo ' + changes'), $(lscpu | grep -m1 'Model name' | sed 's/  */ /g'), $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)$peer_v"

model=(--set model.n_layer=12 --set model.n_embd=768 --set model.n_head=12 --set model.n_kv_head=12
       --set model.ffn_hidden=2048 --set model.vocab_size=50304 --set model.seq_len=64)

# step_once NAME NP THREADS ZERO OPTIMIZER: STEPS + 1 trainer steps of the 124M-shaped
# Llama, one sequence per replica; the metrics in $tmp/NAME.jsonl
step_once() {
  local name="$1" np="$2" threads="$3" zero="$4" opt="$5"
  mpirun --oversubscribe --bind-to none -np "$np" "$build/tessera" train configs/llama-tiny.cfg \
    "${model[@]}" --set train.steps=$((STEPS + 1)) --set 'data.train="data/fortunes_train.bin"' \
    --set 'data.val=""' --set data.eval_every=0 --set train.threads="$threads" \
    --set log.progress=false --set "log.metrics=\"$tmp/$name.jsonl\"" --set parallel.micro_batch=1 \
    --set train.global_batch="$np" --set parallel.dp="$np" --set parallel.zero="$zero" \
    --set "train.optimizer=\"$opt\"" >"$tmp/$name.out" 2>"$tmp/$name.err"
}

# step_row NAME LABEL: a row of the step table from a run's metrics (medians over steps 1..)
step_row() {
  local f="$tmp/$1.jsonl" o m g s
  [ -f "$f" ] || return 0
  o=$(med optim_ms "$f" 1); g=$(med optim_gather_ms "$f" 1); s=$(med step_ms "$f" 1)
  m=$(med muon_ms "$f" 1); m="${m:--}"
  echo "$o" >"$tmp/$1.optim"; echo "$m" >"$tmp/$1.muon"; echo "$g" >"$tmp/$1.gather"
  printf '| %s | %s | %s | %s | %s | %s |\n' "$2" "$o" "$m" "$g" "$s" "$(cat "$tmp/$1.others")"
}

# peer_once NAME ARGS...: bench/torch_muon.py's JSON line into $tmp/NAME.json
peer_once() {
  local name="$1"; shift
  "$peer_py" bench/torch_muon.py "$@" >"$tmp/$name.json" 2>"$tmp/$name.err"
}
jget() { "${peer_py:-python3}" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.1f" % (d[sys.argv[2]] * float(sys.argv[3])))' "$@"; }

# timed NAME CMD...: wait for quiet, run CMD under measured; the others' share to NAME.others
timed() {
  local name="$1"; shift
  echo "  $name ..." >&2
  wait_quiet "$QUIET_S" >/dev/null
  measured "$@" || { echo "muon.sh: $name failed:" >&2; tail -5 "$tmp/$name.err" >&2; exit 1; }
  echo "$OTHERS%" >"$tmp/$name.others"
}

speed() {
  echo
  echo "## Newton-Schulz against the sgemm ceiling (bench_muon, ns_steps 5, medians of 5)"
  echo
  local me=$BASHPID t
  for t in 2 1; do
    wait_quiet "$QUIET_S" >/dev/null
    "$build/bench/bench_sgemm" "$t" --json | grep -o '"sgemm_gflops": *[0-9.]*' | grep -o '[0-9.]*$' >"$tmp/ceil$t"
    m0=$(cpu_mark "$me")
    "$build/bench/bench_muon" "$t" --json --reps 5 >"$tmp/ns$t.json"
    m1=$(cpu_mark "$me")
    others_pct "$m0" "$m1" >"$tmp/ns$t.others"
  done
  echo "| threads | matrix | GFLOP | iteration ms | GFLOP/s | of sgemm | its GEMMs alone ms | GFLOP/s | of sgemm |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for t in 2 1; do
    grep '"matrix"' "$tmp/ns$t.json" | awk -v t="$t" -v c="$(cat "$tmp/ceil$t")" -F'[:,"]+' '{
      for (i = 1; i < NF; i++) v[$i] = $(i + 1)
      printf "| %d | %s | %.2f | %.1f | %.1f | %.0f%% | %.1f | %.1f | %.0f%% |\n", t, v["matrix"],
             v["gflop"], v["ns_ms"], v["ns_gflops"], 100 * v["ns_gflops"] / c, v["gemms_ms"],
             v["gemms_gflops"], 100 * v["gemms_gflops"] / c }'
  done
  echo
  echo "| threads | sgemm ceiling GFLOP/s | model's iteration (12 x 7 matrices) | GFLOP/s | of sgemm | GEMMs alone ms | trainer's gemm_gflops | others |"
  echo "|---|---|---|---|---|---|---|---|"
  for t in 2 1; do
    grep '"model_gflop"' "$tmp/ns$t.json" | awk -v t="$t" -v c="$(cat "$tmp/ceil$t")" \
      -v o="$(cat "$tmp/ns$t.others")" -F'[:,"{}]+' '{
      for (i = 1; i < NF; i++) v[$i] = $(i + 1)
      printf "| %d | %.1f | %.0f GFLOP in %.0f ms | %.1f | %.0f%% | %.0f | %.1f | %s%% |\n", t, c,
             v["model_gflop"], v["model_ns_ms"], v["model_ns_gflops"], 100 * v["model_ns_gflops"] / c,
             v["model_gemms_ms"], v["gemm_gflops"], o }'
  done

  local runs="${RUNS:-adamw1 muon1 muon1t1 adamw2z0 muon2z0 adamw2z1 muon2z1}" r
  for r in $runs; do
    case "$r" in
      adamw1) timed adamw1 step_once adamw1 1 2 0 adamw ;;
      muon1) timed muon1 step_once muon1 1 2 0 muon ;;
      muon1t1) timed muon1t1 step_once muon1t1 1 1 0 muon ;;
      adamw2z0) timed adamw2z0 step_once adamw2z0 2 1 0 adamw ;;
      muon2z0) timed muon2z0 step_once muon2z0 2 1 0 muon ;;
      adamw2z1) timed adamw2z1 step_once adamw2z1 2 1 1 adamw ;;
      muon2z1) timed muon2z1 step_once muon2z1 2 1 1 muon ;;
      *) echo "muon.sh: no run $r" >&2; exit 2 ;;
    esac
  done
  echo
  echo "## The optimizer step (trainer metrics, ms, medians of steps 1-$STEPS; 124M-shaped Llama, 64 tokens a replica)"
  echo
  echo "| run | optim_ms | muon_ms | optim_gather_ms | step_ms | others |"
  echo "|---|---|---|---|---|---|"
  step_row adamw1 "Tessera AdamW, dp 1 x 2 threads"
  step_row muon1 "Tessera Muon, dp 1 x 2 threads"
  step_row muon1t1 "Tessera Muon, dp 1 x 1 thread"
  step_row adamw2z0 "Tessera AdamW, dp 2 x 1 thread, ZeRO-0"
  step_row muon2z0 "Tessera Muon, dp 2 x 1 thread, ZeRO-0"
  step_row adamw2z1 "Tessera AdamW, dp 2 x 1 thread, ZeRO-1"
  step_row muon2z1 "Tessera Muon, dp 2 x 1 thread, ZeRO-1"
  if [ -n "$peer_py" ]; then
    timed tadamw peer_once tadamw --optimizer adamw --threads 2 --steps 3 --warmup 1
    timed tmuon32 peer_once tmuon32 --optimizer muon --ns_dtype float32 --threads 2 --steps 1 --warmup 1
    timed tmuon16 peer_once tmuon16 --optimizer muon --ns_dtype bfloat16 --threads 2 --steps 1 \
      --warmup 1 --layers "$PEER_BF16_LAYERS"
    local x16 t16
    x16=$(awk -v l="$PEER_BF16_LAYERS" 'BEGIN { printf "%g", 12 / l }')
    [ "$PEER_BF16_LAYERS" = 12 ] && t16="" || t16=" ($PEER_BF16_LAYERS block(s) x $x16; the AdamW part of 1 block's scale)"
    printf '| PyTorch AdamW, 2 threads | %s | - | - | - | %s |\n' \
      "$(jget "$tmp/tadamw.json" median_ms 1)" "$(cat "$tmp/tadamw.others")"
    printf '| PyTorch Muon (NS float32) + AdamW, 2 threads | %s | %s (NS alone) | - | - | %s |\n' \
      "$(jget "$tmp/tmuon32.json" median_ms 1)" "$(jget "$tmp/tmuon32.json" ns_ms 1)" "$(cat "$tmp/tmuon32.others")"
    printf '| PyTorch Muon (NS bfloat16, its default) + AdamW, 2 threads%s | %s | %s (NS alone) | - | - | %s |\n' "$t16" \
      "$(jget "$tmp/tmuon16.json" median_ms "$x16")" "$(jget "$tmp/tmuon16.json" ns_ms "$x16")" "$(cat "$tmp/tmuon16.others")"
  fi
  echo
  for r in muon1t1 muon2z0 muon2z1 adamw2z0 adamw2z1; do [ -f "$tmp/$r.optim" ] || return 0; done
  awk -v m1="$(cat "$tmp/muon1t1.muon")" -v m2="$(cat "$tmp/muon2z0.muon")" -v m2b="$(cat "$tmp/muon2z1.muon")" \
      -v o2="$(cat "$tmp/muon2z0.optim")" -v a2="$(cat "$tmp/adamw2z0.optim")" \
      -v g2="$(cat "$tmp/muon2z0.gather")" -v ga2="$(cat "$tmp/adamw2z0.gather")" \
      -v o2b="$(cat "$tmp/muon2z1.optim")" -v a2b="$(cat "$tmp/adamw2z1.optim")" \
      -v g2b="$(cat "$tmp/muon2z1.gather")" -v ga2b="$(cat "$tmp/adamw2z1.gather")" 'BEGIN {
    printf "Distribution: one rank of 1 thread spends %.0f ms on Muon; at dp 2 the busier rank %.0f ms (ZeRO-0) and %.0f ms (ZeRO-1): %.2f and %.2f of the half (goal <= 1).\n", m1, m2, m2b, m2 / (m1 / 2), m2b / (m1 / 2)
    printf "Muon over AdamW in the dp-2 step: ZeRO-0 %.0f ms, ZeRO-1 %.0f ms, against the bound half + extra gathers %.0f and %.0f ms.\n", o2 - a2, o2b - a2b, m1 / 2 + (g2 - ga2), m1 / 2 + (g2b - ga2b) }'
}

# loss_once NAME OPT LR STEPS EVAL: the tiny Llama, one thread, metrics to $tmp/NAME.jsonl
loss_once() {
  local name="$1" opt="$2" lr="$3" steps="$4" every="$5" minlr
  minlr=$(awk -v l="$lr" 'BEGIN { printf "%g", l / 10 }')
  if [ -n "${KEEP:-}" ] && grep -q "^{\"step\":$((steps - 1)),\"val_loss\"" "$tmp/$name.jsonl" 2>/dev/null; then
    return 0
  fi
  "$build/tessera" train configs/llama-tiny.cfg --set train.steps="$steps" --set train.lr="$lr" \
    --set train.min_lr="$minlr" --set "train.optimizer=\"$opt\"" --set train.threads=1 \
    --set data.eval_every="$every" --set log.progress=false \
    --set "log.metrics=\"$tmp/$name.jsonl\"" >"$tmp/$name.out" 2>"$tmp/$name.err" \
    || { echo "muon.sh: $name failed:" >&2; tail -5 "$tmp/$name.err" >&2; return 1; }
}

# the last validation loss of a metrics file
last_val() { grep -o '"val_loss":[0-9.]*' "$1" | tail -1 | cut -d: -f2; }
# train_at FILE STEP: the mean training loss of the 10 steps up to STEP (1-based count)
train_at() { awk -v s="$2" -F'[:,]' '/^\{"step":[0-9]+,"loss"/ { if ($2 >= s - 10 && $2 < s) { t += $4; n++ } } END { printf "%.4f", t / n }' "$1"; }
val_at() { grep -o "\"step\":$(($2 - 1)),\"val_loss\":[0-9.]*" "$1" | cut -d: -f3; }

loss() {
  echo
  echo "## Loss: tiny Llama (configs/llama-tiny.cfg) on data/fortunes, AdamW against Muon"
  echo
  echo "Sweep: $SWEEP steps each (warm-up 20, cosine to lr/10), validation loss at the end:"
  echo
  echo "| lr | AdamW | Muon |"
  echo "|---|---|---|"
  local jobs=() o lr lrs
  # shellcheck disable=SC2086 # the lists' words
  lrs=$(printf '%s\n' $LRS_ADAMW $LRS_MUON | sort -g -u)
  for lr in $lrs; do
    for o in adamw muon; do
      if [ "$o" = adamw ]; then case " $LRS_ADAMW " in *" $lr "*) ;; *) continue ;; esac; fi
      if [ "$o" = muon ]; then case " $LRS_MUON " in *" $lr "*) ;; *) continue ;; esac; fi
      loss_once "sweep_${o}_$lr" "$o" "$lr" "$SWEEP" "$SWEEP" &
      jobs+=($!)
      if [ "${#jobs[@]}" -ge 2 ]; then wait "${jobs[0]}"; jobs=("${jobs[@]:1}"); fi
    done
  done
  for j in "${jobs[@]}"; do wait "$j"; done
  declare -A best bestv
  for lr in $lrs; do
    printf '| %s |' "$lr"
    for o in adamw muon; do
      local v
      local list="$LRS_MUON"
      [ "$o" = adamw ] && list="$LRS_ADAMW"
      case " $list " in *" $lr "*) ;; *) printf ' - |'; continue ;; esac
      v=$(last_val "$tmp/sweep_${o}_$lr.jsonl")
      printf ' %s |' "${v:-diverged}"
      v="${v:-1e9}"
      if [ -z "${bestv[$o]:-}" ] || awk -v a="$v" -v b="${bestv[$o]}" 'BEGIN { exit !(a < b) }'; then
        best[$o]="$lr"; bestv[$o]="$v"
      fi
    done
    echo
  done
  loss_once "final_adamw" adamw "${best[adamw]}" "$LOSS_STEPS" 50 &
  local ja=$!
  loss_once "final_muon" muon "${best[muon]}" "$LOSS_STEPS" 50
  wait "$ja"
  echo
  echo "$LOSS_STEPS steps at the best lr (training loss: mean of the 10 steps up to the step; validation: 16 windows):"
  echo
  echo "| optimizer | lr | train 100 | train 250 | train 500 | val 100 | val 250 | val 500 | final step's loss |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for o in adamw muon; do
    local f="$tmp/final_$o.jsonl"
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$o" "${best[$o]}" \
      "$(train_at "$f" 100)" "$(train_at "$f" 250)" "$(train_at "$f" "$LOSS_STEPS")" \
      "$(val_at "$f" 100)" "$(val_at "$f" 250)" "$(val_at "$f" "$LOSS_STEPS")" \
      "$(metric loss "$f" $((LOSS_STEPS - 1)))"
  done
  python3 bench/loss_svg.py "$SVG" \
    "tiny Llama (4 x 128, bytes) on fortunes: AdamW lr ${best[adamw]} vs Muon lr ${best[muon]}" \
    "AdamW lr ${best[adamw]}=$tmp/final_adamw.jsonl" "Muon lr ${best[muon]}=$tmp/final_muon.jsonl"
  echo
  echo "Plot: ${SVG#"$root"/}"
}

case "$what" in
  speed) speed ;;
  loss) loss ;;
  all) loss; speed ;;
  *) echo "usage: bench/muon.sh [speed|loss|all]" >&2; exit 2 ;;
esac
