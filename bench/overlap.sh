#!/usr/bin/env bash
# Where the data-parallel reduction goes: pp = 1 x dp = 2 and pp = 2 x dp = 2 on the same
# global batch (a 6-layer 256-wide GPT-2, seq 64, 16 sequences per step), with the
# reduction not overlapped, overlapped and advanced by polling between layers, or by a
# communication thread; ZeRO-1 off and on. For each: the median step time, the exposed
# dp wait (dp_wait_ms: the longest time a rank waited for the reduction at the end of the
# step), dp_overlap (the hidden fraction against the same run's non-overlapped reference
# step), and the simulator's predicted exposed communication (tessera plan with the
# run's own measured chunk costs, --costs-from-trace, and the dp link measured here by
# bench_allreduce on the step's gradient bytes). Prints a markdown table.
# Usage: bench/overlap.sh [STEPS]   (default 30; from anywhere)
#   BUILD=DIR  build directory (default build/);  KEEP=DIR keeps every run's files
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. bench/lib_parallel.sh
steps="${1:-30}"
skip=5
build="${BUILD:-$root/build}"
bench_setup
model=(--set model.n_layer=6 --set model.n_embd=256 --set model.n_head=8
       --set train.global_batch=16 --set parallel.micro_batch=2)

# run NAME NP ARGS...: one training run (repeated once if the machine was busy)
run() { measured run_once "$@" || { echo "overlap.sh: run $1 failed" >&2; tail -20 "$tmp/$1.log" >&2; exit 1; }; }
run_once() {
  local name="$1" np="$2"; shift 2
  mpirun -np "$np" --oversubscribe --bind-to none "$build/tessera" train configs/tiny.cfg \
    "${model[@]}" "$@" --set train.steps="$steps" --set train.threads=1 --set data.eval_every=0 \
    --set 'data.val=""' --set 'data.train="data/fortunes_train.bin"' --set log.progress=false \
    --set "log.metrics=\"$tmp/$name.jsonl\"" --set "log.trace=\"$tmp/$name.trace.json\"" \
    >"$tmp/$name.log" 2>&1
}

# The dp link: bench_allreduce on the gradient bytes of a replica (dp_bytes), 2 ranks.
run ref_pp1 2 --set parallel.dp=2
grad_floats=$(($(med dp_bytes "$tmp/ref_pp1.jsonl" 0 | cut -d. -f1) / 4))
link=$(mpirun -np 2 --oversubscribe --bind-to none "$build/bench/bench_allreduce" "$grad_floats" 10 --json)
gbs=$(echo "$link" | grep -o '"bucketed_algbw_gbs":[0-9.e+-]*' | cut -d: -f2)
[ -n "$gbs" ] || gbs=$(echo "$link" | grep -o '"algbw_gbs":[0-9.e+-]*' | cut -d: -f2)

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; 1 thread per rank" \
     "(pp2 x dp2 puts 4 ranks on these cores)"
echo "dp link (bench_allreduce, $grad_floats floats, bucketed as the trainer does): $gbs GB/s"
echo
echo "| grid | reduction | ZeRO-1 | step ms | dp wait ms, longest rank (dp_wait_ms) | dp wait ms, shortest rank (trace) | predicted exposed ms (plan) | dp_overlap |"
echo "|---|---|---|---|---|---|---|---|"
for grid in "pp1 2 --set parallel.dp=2" "pp2 4 --set parallel.pp=2 --set parallel.dp=2"; do
  set -- $grid
  g="$1" np="$2"; shift 2
  gargs=("$@")
  for mode in off poll thread; do
    for zero in 0 1; do
      name="${g}_${mode}_z${zero}"
      margs=(--set parallel.zero="$zero")
      if [ "$mode" = off ]; then margs+=(--set parallel.overlap_grad_sync=false)
      else margs+=(--set parallel.grad_sync_progress="$mode"); fi
      run "$name" "$np" "${gargs[@]}" "${margs[@]}"
      pred="n/a"
      if [ "$mode" != off ]; then
        # A failed plan is shown as n/a with its message kept in $tmp/NAME.plan.err.
        plan=$("$build/tessera" plan configs/tiny.cfg "${model[@]}" "${gargs[@]}" \
          --set parallel.zero="$zero" --json --costs-from-trace "$tmp/$name.trace.json" \
          --trace-skip-steps "$skip" --trace-stat median --dp-bandwidth-gbs "$gbs" \
          2>"$tmp/$name.plan.err") || true
        pred=$(echo "$plan" | grep -o '"dp_exposed_ms": *[0-9.e+-]*' | grep -o '[0-9.e+-]*$' || true)
        if [[ "$pred" =~ ^[0-9.eE+-]+$ ]]; then pred=$(printf '%.2f' "$pred"); else pred="n/a"; fi
      fi
      printf '| %s | %s | %s | %.1f | %.2f | %s | %s | %.2f |\n' "$g x dp2" "$mode" "$zero" \
        "$(med step_ms "$tmp/$name.jsonl" $skip)" "$(med dp_wait_ms "$tmp/$name.jsonl" $skip)" \
        "$(dpsync_min "$tmp/$name.trace.json" $skip)" "${pred:-n/a}" \
        "$(med dp_overlap "$tmp/$name.jsonl" $skip)"
    done
  done
done
echo
echo "medians over steps $skip..$((steps - 1)); command: bench/overlap.sh $steps"
