#!/usr/bin/env bash
# Scaling benchmark (issue 14, item 4). Two parts:
#  1. Here: weak and strong scaling of each kind of parallelism (dp, pp, tp) at 1, 2 and
#     4 ranks, measured with `tessera train` (median step_ms over the steady steps, the
#     first 3 dropped; peak memory from the metrics' last line) next to the planner's
#     prediction for the same grid on this machine's measured cluster file
#     (`tessera plan CFG --cluster configs/clusters/this-machine.cfg --set ... --json`).
#     Strong: global batch 16 whatever the ranks; weak: global batch 16 x ranks (the same
#     work per rank). Every rank runs one BLAS/OpenMP thread (train.threads = 1), so one
#     rank is one of the planner's devices (one core); 4 ranks on a 2-core machine are
#     oversubscribed (mpirun --oversubscribe, unbound), which this-machine.cfg does not
#     describe, so those runs are also predicted on a time-shared variant of it
#     (bench/scaling/scaling.py timeshare: 4 devices per node, each with half a core's
#     FLOP/s, memory bandwidth and memory, and twice its elementwise times per element).
#  2. On paper: `tessera plan --gpus N --search` for the GPT-3 configs from 8 to 8,192
#     GPUs and the Llama 3 configs (configs/llama3-*.cfg) from 8 to 16,384 (powers of 2;
#     405B fits nowhere below 16,384 at seq 8192) at the configs' global batch (strong
#     scaling in devices): the best grid's step time, MFU, bubble, memory per device and
#     the grid itself. A count with no valid grid is skipped and the planner's reason
#     recorded.
# Writes $OUT (default runs/scaling/): measured.csv/.md, curves.csv/.md, gnuplot data;
# and plots, SVG and PNG, into docs/: scaling_here.*, scaling_gpt3_{step,mfu,memory,bubble}.*
# (GPT-3 solid, Llama 3 dashed, on the DGX H100)
# Usage: bench/scaling.sh [--quick]   (from anywhere)
#   --quick      only configs/tiny.cfg here; GPT-3 1.3B, 13B, 175B and Llama 3 8B, 405B
#                on the DGX H100 only
#                (default: also an 8-layer 256-wide config here, and every GPT-3 and Llama 3 config
#                on the DGX H100, the DGX A100 and the H200 node)
#   BUILD=DIR    build directory (default build/)
#   OUT=DIR      tables and data (default runs/scaling)
#   STEPS=N      steps per run (default 10; the first 3 are dropped)
#   QUIET_WAIT=S wait until the machine is idle (under 15% of the CPUs busy, twice in a
#                row: bench/lib_parallel.sh's wait_quiet) for at most S seconds (default
#                600), then measure anyway (the load and each run's share of CPU taken
#                by others go into the table)
#   MAX_OTHERS=P run again (up to RETRIES=N times, default 3) when other processes took
#                more than P% of the CPUs during a run (default 10)
#   REUSE=1      keep the runs already in $OUT whose others' share was at most MAX_OTHERS
#   MEASURE=0    skip the measurements (planner curves and plots only)
#   CLUSTERS="dgx-h100 ..."  plan on these cluster files only (the plots use dgx-h100's;
#                docs/scaling_gpt3.tsv is its table, which tests/test_docs_drift.sh checks)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. bench/lib_parallel.sh
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: bench/scaling.sh [--quick]" >&2; exit 2 ;;
esac
build="${BUILD:-$root/build}"
out="${OUT:-$root/runs/scaling}"
steps="${STEPS:-10}"
skip=3
here_cluster=configs/clusters/this-machine.cfg
cores=$(nproc)

# --- setup: packages, the binary, the corpus, this machine's cluster file
scripts/setup.sh python3 gnuplot-nox >/dev/null
[ -f "$build/CMakeCache.txt" ] || cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$cores" --target tessera >/dev/null
[ "${MEASURE:-1}" != 0 ] && scripts/prepare_data.sh "$build/tessera" data >/dev/null
if [ "${MEASURE:-1}" != 0 ] && [ ! -f "$here_cluster" ]; then
  cmake --build "$build" -j"$cores" --target bench_stream bench_gemm_curve bench_pingpong \
    bench_allreduce bench_elementwise >/dev/null
  scripts/measure_cluster.sh "$build" "$here_cluster"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out" docs
py=(python3 bench/scaling/scaling.py)

# --- 1. measured here against the planner
# train_once NAME NP ARGS...: NP ranks of one thread each; bound one per core when they
# fit, oversubscribed and unbound when not
train_once() {
  local name="$1" np="$2"; shift 2
  local launch=(mpirun -np "$np" --bind-to core)
  [ "$np" -gt "$cores" ] && launch=(mpirun -np "$np" --oversubscribe --bind-to none)
  "${launch[@]}" "$build/tessera" train "$@" --set train.steps="$steps" --set train.threads=1 \
    --set data.eval_every=0 --set 'data.val=""' --set log.progress=false \
    --set "log.metrics=\"$out/$name.jsonl\"" >"$out/$name.log" 2>&1
}
# train NAME NP ARGS...: run once more (up to RETRIES times) while other processes took
# over MAX_OTHERS% of the CPUs; OTHERS = their share, also kept in $out/NAME.others. With
# REUSE=1, a run already in $out whose share was at most MAX_OTHERS is kept, not rerun.
train() {
  local o
  if [ "${REUSE:-0}" = 1 ] && [ -s "$out/$1.jsonl" ] && [ -f "$out/$1.others" ]; then
    o=$(cat "$out/$1.others")
    if [ "$o" -le "${MAX_OTHERS:-10}" ]; then OTHERS=$o; return 0; fi
  fi
  RETRIES="${RETRIES:-3}" measured train_once "$@" \
    || { echo "scaling.sh: run $1 failed:" >&2; tail -20 "$out/$1.log" >&2; exit 1; }
  echo "$OTHERS" >"$out/$1.others"
}
# predict FILE CLUSTER ARGS...: the planner's JSON for the grid in ARGS
predict() {
  local f="$1" c="$2"; shift 2
  "$build/tessera" plan "$@" --set train.threads=1 --cluster "$c" --json >"$f" \
    || { echo "scaling.sh: tessera plan $* --cluster $c failed" >&2; exit 1; }
}

# measure LABEL ARGS...: the 1-rank run and dp, pp, tp at 2 and 4 ranks, strong and weak
measure() {
  local label="$1"; shift
  local r kind mode batch name grid p2 busy
  busy=$(wait_quiet "${QUIET_WAIT:-600}")
  echo "$label: load $(cut -d' ' -f1-3 /proc/loadavg), CPUs $busy% busy before the runs" | tee -a "$out/load.txt"
  train "$label-1" 1 "$@" --set train.global_batch=16
  predict "$out/$label-1.plan.json" "$here_cluster" "$@" --set train.global_batch=16
  for mode in strong weak; do
    printf '%s\t%s\t1 rank\t%s\t1\t1x1x1\t16\t%s\t%s\t-\t%s\t%s\n' "$label-1" "$label" "$mode" \
      "$out/$label-1.jsonl" "$out/$label-1.plan.json" "$OTHERS" "$skip" >>"$out/measured.tsv"
  done
  for r in 2 4; do
    if [ "$r" -gt "$cores" ]; then
      "${py[@]}" timeshare "$here_cluster" "$cores" "$r" "$out/this-machine-x$r.cfg"
    fi
    for kind in dp pp tp; do
      for mode in strong weak; do
        batch=16
        [ "$mode" = weak ] && batch=$((16 * r))
        name="$label-$kind$r-$mode"
        case "$kind" in
          dp) grid="1x${r}x1" ;; pp) grid="${r}x1x1" ;; tp) grid="1x1x${r}" ;;
        esac
        local sets=("$@" --set "parallel.$kind=$r" --set train.global_batch=$batch)
        train "$name" "$r" "${sets[@]}"
        predict "$out/$name.plan.json" "$here_cluster" "${sets[@]}"
        p2=-
        if [ "$r" -gt "$cores" ]; then
          p2="$out/$name.plan-x$r.json"
          predict "$p2" "$out/this-machine-x$r.cfg" "${sets[@]}"
        fi
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$label" "$kind" \
          "$mode" "$r" "$grid" "$batch" "$out/$name.jsonl" "$out/$name.plan.json" "$p2" \
          "$OTHERS" "$skip" >>"$out/measured.tsv"
        echo "  $name: done (others took $OTHERS% of the CPUs)" >&2
      done
    done
  done
}

labels=(tiny)
if [ "${MEASURE:-1}" != 0 ]; then
  : >"$out/load.txt"
  rm -f "$out/measured.tsv"
  t0=$SECONDS
  measure tiny configs/tiny.cfg
  if [ "$quick" = 0 ]; then
    labels+=(8L256)
    measure 8L256 configs/tiny.cfg --set model.n_layer=8 --set model.n_embd=256 \
      --set model.n_head=8
  fi
  echo "measurements: $((SECONDS - t0)) s; load $(cut -d' ' -f1-3 /proc/loadavg) after" \
    | tee -a "$out/load.txt"
  "${py[@]}" measured "$out/measured.tsv" "$out"
fi

# --- 2. GPT-3 and Llama 3 on paper
if [ "$quick" = 1 ]; then
  models=(1.3b 13b 175b); lmodels=(8b 405b); clusters=(dgx-h100)
else
  models=(125m 350m 760m 1.3b 2.7b 6.7b 13b 175b); lmodels=(8b 70b 405b)
  clusters=(dgx-h100 dgx-a100 h200-node)
fi
# CLUSTERS="dgx-h100 ..." plans on those files only (the plots need the DGX H100's)
[ -n "${CLUSTERS:-}" ] && read -r -a clusters <<<"$CLUSTERS"
t0=$SECONDS
rm -f "$out/curves.tsv"
# search FAMILY SIZE CLUSTER MOST: the best grid for 8, 16, ... MOST GPUs. Below the
# fewest devices a replica needs (the planner's "at least K", which takes it seconds to
# find for 405B) the same answer is recorded without asking again.
search() {
  local fam="$1" m="$2" c="$3" most="$4" n f least=0 prev=""
  for ((n = 8; n <= most; n *= 2)); do
    f="$out/$fam-$m-$c-$n"
    rm -f "$f.json"
    if [ "$n" -lt "$least" ]; then
      sed "s/^tessera: error: [0-9]* devices/tessera: error: $n devices/" "$prev" >"$f.err"
    else
      # a count with no valid grid exits 1 with the reason on stderr: recorded, not fatal
      "$build/tessera" plan "configs/$fam-$m.cfg" --cluster "configs/clusters/$c.cfg" \
        --gpus "$n" --search --top 1 --json >"$f.json" 2>"$f.err" || rm -f "$f.json"
      least=$(grep -oE 'needs: at least [0-9]+' "$f.err" | grep -oE '[0-9]+$' || echo 0)
      prev="$f.err"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$name" "$(echo "$m" | tr a-z A-Z)" "$n" \
      "$f.json" "$f.err" "$fam" >>"$out/curves.tsv"
  done
}
for c in "${clusters[@]}"; do
  name="$(grep -m1 -o 'name = "[^"]*"' "configs/clusters/$c.cfg" | cut -d'"' -f2)"
  for m in "${models[@]}"; do search gpt3 "$m" "$c" 8192; done
  for m in "${lmodels[@]}"; do search llama3 "$m" "$c" 16384; done
done
echo "planner searches: $((SECONDS - t0)) s" | tee "$out/curves_time.txt"
"${py[@]}" curves "$out/curves.tsv" "$out"
# the numbers the plots draw, committed beside them (tests/test_docs_drift.sh replans some)
[ -f "$out/curves_dgx-h100.tsv" ] && cp "$out/curves_dgx-h100.tsv" docs/scaling_gpt3.tsv

# --- plots
png=png
gnuplot -e 'set terminal' 2>&1 | grep -w pngcairo >/dev/null && png=pngcairo
plot() { # SCRIPT OUTNAME VARS
  local s="$1" o="$2" v="$3" t
  for t in svg "$png"; do
    local ext=$t; [ "$t" != svg ] && ext=png
    gnuplot -e "$v; term='$t'; out='docs/$o.$ext'" "bench/scaling/$s"
  done
}
if [ -f "$out/measured.csv" ]; then
  plot here.gp scaling_here "dir='$out'; configs='$(awk -F, 'NR > 1 {print $1}' "$out/measured.csv" | uniq | tr '\n' ' ')'"
fi
mlist="$(for m in "${models[@]}"; do echo "$m" | tr a-z A-Z; done | tr '\n' ' ')"
llist="$(for m in "${lmodels[@]}"; do echo "$m" | tr a-z A-Z; done | tr '\n' ' ')"
for what in step mfu memory bubble; do
  plot gpt3.gp "scaling_gpt3_$what" "dat='$out/gpt3_dgx-h100.dat'; dat2='$out/llama3_dgx-h100.dat'; what='$what'; models='$mlist'; models2='$llist'; cluster='$(grep -m1 -o 'name = "[^"]*"' configs/clusters/dgx-h100.cfg | cut -d'"' -f2)'"
done

echo
echo "## Here: measured vs predicted (configs/clusters/this-machine.cfg; $steps steps, median of steps $skip..$((steps - 1)))"
echo
[ -f "$out/measured.md" ] && cat "$out/measured.md"
echo
echo "## GPT-3 and Llama 3 on paper (the configs' global batch, best grid per GPU count)"
cat "$out/curves.md"
echo
echo "tables and data in $out; plots in docs/scaling_*.svg and .png"
