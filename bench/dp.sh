#!/usr/bin/env bash
# Data-parallel benchmark. On this machine's cores, one rank with every core as threads
# (dp = 1) against one rank per core (dp = 2, 1 thread each), same global batch, for a
# 6-layer 256-wide GPT-2 and GPT-2 124M (seq 256); then the gradient all-reduce: what a
# training step achieves (dp_bytes / dp_wait_ms with overlap off, so the wait is the
# whole all-reduce) against a plain MPI_Allreduce of the same bytes measured right here
# (bench_allreduce), the share of the step spent communicating, and with overlap on the
# wait left exposed and the dp_overlap metric. Prints two markdown tables.
# Usage: bench/dp.sh [--quick]     (from anywhere; --quick skips GPT-2 124M)
#   BUILD=DIR    build directory (default build/)
#   QUIET_WAIT=S wait up to S seconds (default 120) for the machine to go idle first
#   KEEP=DIR     keep every run's metrics, trace and log in DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. bench/lib_parallel.sh
quick=0
[ "${1:-}" = "--quick" ] && quick=1
build="${BUILD:-$root/build}"
bench_setup
cores=$(nproc)

# train NAME NP STEPS ARGS...: NP = 1 runs one rank with every core as threads; NP > 1
# runs dp = NP ranks of cores/NP threads, bound one per core by mpirun. Run once
# more when other processes took over 10% of the CPUs meanwhile; OTHERS = their share.
train() {
  measured train_once "$@" \
    || { echo "dp.sh: run $1 failed:" >&2; tail -20 "$tmp/$1.log" >&2; exit 1; }
}
train_once() {
  local name="$1" np="$2" steps="$3"; shift 3
  local launch=(mpirun -np "$np" --bind-to none) grid=()
  if [ "$np" -gt 1 ]; then
    launch=(mpirun -np "$np" --bind-to core)
    [ "$np" -gt "$cores" ] && launch+=(--oversubscribe)
    grid=(--set parallel.dp="$np")
  fi
  "${launch[@]}" "$build/tessera" train "$@" "${grid[@]}" --set train.steps="$steps" \
    --set train.threads=$((np > cores ? 1 : cores / np)) --set data.eval_every=0 \
    --set 'data.val=""' --set log.progress=false --set "log.metrics=\"$tmp/$name.jsonl\"" \
    --set "log.trace=\"$tmp/$name.trace.json\"" >"$tmp/$name.log" 2>&1
}

busy=$(wait_quiet "${QUIET_WAIT:-120}")
echo "machine: $cores cores, $busy% busy when the runs started, load $(cut -d' ' -f1-3 /proc/loadavg)"

tput_rows=() comm_rows=()
# bench NAME LABEL STEPS SKIP ARGS...: dp = 1 and dp = 2 (overlap off, on), all-reduce
bench() {
  local name="$1" label="$2" steps="$3" skip="$4"; shift 4
  local o1 o2 o3
  train "$name-dp1" 1 "$steps" "$@"; o1=$OTHERS
  train "$name-dp2" 2 "$steps" "$@" --set parallel.overlap_grad_sync=false; o2=$OTHERS
  train "$name-dp2o" 2 "$steps" "$@" --set parallel.overlap_grad_sync=true; o3=$OTHERS
  local f1="$tmp/$name-dp1.jsonl" f2="$tmp/$name-dp2.jsonl" f3="$tmp/$name-dp2o.jsonl"
  local bytes floats ar
  bytes=$(med dp_bytes "$f2" "$skip")
  floats=$(awk -v b="$bytes" 'BEGIN {printf "%.0f", b / 4}')
  ar=$(mpirun -np 2 --bind-to core "$build/bench/bench_allreduce" "$floats" "$ar_reps" --bucket-mb 4 \
         --json)
  local v=(
    "$(med tokens_per_s "$f1" "$skip")" "$(med tokens_per_s "$f2" "$skip")"
    "$(med tokens_per_s "$f3" "$skip")" "$(med step_ms "$f1" "$skip")"
    "$(med step_ms "$f2" "$skip")" "$(med step_ms "$f3" "$skip")"
    "$(med dp_wait_ms "$f2" "$skip")" "$(dpsync_min "$tmp/$name-dp2.trace.json" "$skip")"
    "$(med dp_wait_ms "$f3" "$skip")" "$(med dp_overlap "$f3" "$skip")"
    "$(echo "$ar" | grep -o '"best_ms":[0-9.]*' | cut -d: -f2)"
    "$(echo "$ar" | grep -o '"bucketed_best_ms":[0-9.]*' | cut -d: -f2)"
    "$(echo "$ar" | grep -o '"median_ms":[0-9.]*' | cut -d: -f2)"
    "$(echo "$ar" | grep -o '"bucketed_median_ms":[0-9.]*' | cut -d: -f2)"
  )
  tput_rows+=("$(awk -v n="$label" -v a="${v[0]}" -v b="${v[1]}" -v c="${v[2]}" -v sa="${v[3]}" \
    -v sb="${v[4]}" -v sc="${v[5]}" -v o="$o1%, $o2%, $o3%" 'BEGIN {
    printf "| %s | %.1f | %.0f | %.1f | %.0f | %.1f | %.0f | **%.2fx** | %s |", n, sa, a, sb, b,
      sc, c, (b > c ? b : c) / a, o }')")
  comm_rows+=("$(awk -v n="$label" -v by="$bytes" -v st="${v[4]}" -v w="${v[6]}" -v wm="${v[7]}" \
    -v sto="${v[5]}" -v wo="${v[8]}" -v ov="${v[9]}" -v ar="${v[10]}" -v arb="${v[11]}" \
    -v arm="${v[12]}" -v arbm="${v[13]}" 'BEGIN {
    g = by / 1e6;
    printf "| %s | %.1f | %.1f (%.2f) | %.1f (%.2f) | %.1f (%.2f); %.1f | %.1f (%.2f); %.1f | %.1f%% | %.1f (%.1f%%) | %.0f%% | %.2f |",
      n, g, w, g / w, wm, g / wm, ar, g / ar, arm, arb, g / arb, arbm, 100 * w / st, wo,
      100 * wo / sto, 100 * (1 - wo / w), ov }')")
}

tiny=(configs/tiny.cfg --set model.n_layer=6 --set model.n_embd=256 --set model.n_head=8
      --set parallel.micro_batch=8 --set train.global_batch=16)
ar_reps=10
bench tiny "6L 256d, T64, B16" 15 3 "${tiny[@]}"
if [ "$quick" -eq 0 ]; then
  big=(configs/gpt2-124m.cfg --set model.seq_len=256 --set parallel.micro_batch=2
       --set train.global_batch=4 --set 'data.train="data/fortunes_train.bin"')
  ar_reps=5
  bench g124m "GPT-2 124M, T256, B4" 4 1 "${big[@]}"
fi

echo
echo "Throughput (median over steady steps; dp = 1: 1 rank x $cores threads; dp = 2: 2 ranks x $((cores / 2)) thread, mpirun --bind-to core):"
echo
echo "| model | dp=1 ms/step | dp=1 tok/s | dp=2 ms/step (overlap off) | tok/s | dp=2 ms/step (overlap on) | tok/s | dp=2 / dp=1 | CPU used by others (3 runs) |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${tput_rows[@]}"
echo
echo "Gradient all-reduce, dp = 2 (ms; GB/s algorithm bandwidth = bytes / time in brackets; training: medians over steps; bench_allreduce: best and median of 10 (5 for 124M) calls):"
echo
echo "| model | MB per replica | training, overlap off: dp_wait_ms (max over ranks) | last rank's wait (trace) | MPI_Allreduce, one call: best (GB/s); median | MPI_Iallreduce, 4 MiB buckets: best (GB/s); median | comm share of step, overlap off | overlap on: exposed dp_wait_ms (share of step) | hidden: 1 - exposed / overlap-off wait | dp_overlap metric |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${comm_rows[@]}"
echo
echo "load after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: bench/dp.sh${1:+ $1}"
