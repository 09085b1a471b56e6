#!/usr/bin/env bash
# Pipeline benchmark. pp = 2 on this machine (one rank per core, 1 thread each, bound by
# mpirun) for gpipe, 1f1b and interleaved-1f1b (2 virtual stages) at m = 2, 4, 8
# micro-batches. For each run, side by side: the measured bubble (median of the metrics'
# `bubble` over the steady steps), the simulator's bubble for that run's own measured
# chunk costs (`tessera plan --costs-from-trace` on the run's trace), and the textbook
# (p-1)/(m+p-1), interleaved (p-1)/(v*m+p-1), for an 8-layer 256-wide GPT-2. Then peak resident and activation memory
# of gpipe vs 1f1b vs 1f1b with full recompute at the largest m. Prints markdown tables.
# Usage: bench/pipeline.sh          (from anywhere)
#   BUILD=DIR      build directory (default build/)
#   QUIET_WAIT=S   wait up to S seconds (default 120) for the machine to go idle first
#   STEPS=N        steps per run (default 12; the first 3 are dropped as warm-up)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. bench/lib.sh
build="${BUILD:-$root/build}"
steps="${STEPS:-12}"
skip=3
scripts/setup.sh >/dev/null
scripts/build.sh "$build" >/dev/null
scripts/prepare_data.sh "$build/tessera" data >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# P2P model for the simulator: both ranks share one machine's memory (bench_allreduce
# moves ~4 GB/s here); a message is one micro-batch's activations, 4 x 64 x 256 x 4 B.
lat_us=10
bw_gbs=4
pp=2
mb=4
model=(configs/tiny.cfg --set model.n_layer=8 --set model.n_embd=256 --set model.n_head=8
       --set parallel.pp=$pp --set parallel.micro_batch=$mb --set 'data.val=""'
       --set data.eval_every=0)
# layers: embedding, 8 blocks, head; 4 (v = 1) or 2 (v = 2) blocks per chunk, the same
# cut for every run (the embedding and the small byte-vocabulary head ride along)
part_v1='parallel.partition=[5,5]'
part_v2='parallel.partition=[3,2,2,3]'

# run NAME ARGS...: train pp = 2 with a trace; metrics in $tmp/NAME.jsonl
run() {
  local name="$1"; shift
  mpirun -np $pp --bind-to core "$build/tessera" train "${model[@]}" "$@" \
    --set train.steps="$steps" --set train.threads=1 --set log.progress=false \
    --set "log.metrics=\"$tmp/$name.jsonl\"" --set "log.trace=\"$tmp/$name.trace.json\"" \
    >"$tmp/$name.log" 2>&1 \
    || { echo "pipeline.sh: run $name failed:" >&2; tail -20 "$tmp/$name.log" >&2; exit 1; }
}

# jget KEY JSON: a number from a flat or nested JSON object (first occurrence)
jget() { echo "$2" | grep -o "\"$1\": *[-0-9.eE+]*" | head -1 | sed 's/.*: *//'; }

busy=$(wait_quiet "${QUIET_WAIT:-120}")
echo "machine: $(nproc) cores, $busy% busy when the runs started, load $(cut -d' ' -f1-3 /proc/loadavg)"

rows=()
for sched in gpipe 1f1b interleaved-1f1b; do
  for m in 2 4 8; do
    args=(--set parallel.schedule="$sched" --set train.global_batch=$((mb * m)))
    v=1
    if [ "$sched" = interleaved-1f1b ]; then
      v=2
      args+=(--set parallel.virtual_stages=2 --set "$part_v2")
    else
      args+=(--set "$part_v1")
    fi
    name="$sched-m$m"
    run "$name" "${args[@]}"
    plan=$("$build/tessera" plan "${model[@]}" "${args[@]}" --json \
             --costs-from-trace "$tmp/$name.trace.json" --trace-skip-steps $skip \
             --trace-stat median --latency-us $lat_us --bandwidth-gbs $bw_gbs)
    echo "$plan" >"$tmp/$name.plan.json"
    meas=$(med bubble "$tmp/$name.jsonl" $skip)
    step=$(med step_ms "$tmp/$name.jsonl" $skip)
    rows+=("$(awk -v s="$sched" -v v="$v" -v m="$m" -v p="$pp" -v meas="$meas" \
      -v sim_rs="$(jget bubble_rank_span "$plan")" -v sim="$(jget bubble "$plan")" \
      -v tr="$(jget measured_bubble "$plan")" -v step="$step" \
      -v tstep="$(jget measured_step_ms "$plan")" -v sstep="$(jget step_ms "$plan")" 'BEGIN {
      tb = (p - 1) / (v * m + p - 1);
      printf "| %s | %d | **%.3f** | **%.3f** | %+.0f%% | %.3f | %.3f | %+.0f%% | %.3f | %.1f | %.1f | %.1f |",
        s, m, meas, sim_rs, 100 * (meas - sim_rs) / sim_rs, tr, sim, 100 * (tr - sim) / sim, tb,
        step, tstep, sstep }')")
  done
done
mmax=8
run 1f1b-full-m$mmax --set parallel.schedule=1f1b --set train.global_batch=$((mb * mmax)) \
  --set "$part_v1" --set parallel.recompute=full

# memory row: NAME LABEL (sim peak activations from the plan, when there is one)
mem_row() {
  local f="$tmp/$1.jsonl" plan="$tmp/$1.plan.json" sim="n/a (not modelled)"
  if [ -f "$plan" ]; then
    sim=$(grep -o '"peak_activation_bytes": *[0-9]*' "$plan" | sed 's/.*: *//' \
            | awk '{printf "%s%.1f", (NR > 1 ? ", " : ""), $1 / 1048576}')
  fi
  local line; line=$(mem_line "$f")
  echo "| $2 | $(echo "$line" | sed 's/.*"peak_rss_mb":\[\([^]]*\)\].*/\1/; s/,/, /g') | $(echo "$line" | sed 's/.*"activation_mb":\[\([^]]*\)\].*/\1/; s/,/, /g') | $sim | $(med step_ms "$f" $skip) |"
}

echo
echo "Bubble, pp = 2, micro-batch $mb x 64 tokens, 8-layer 256-wide GPT-2 (partition $part_v1, v=2: $part_v2), 1 thread per rank, mpirun --bind-to core;"
echo "medians over steps $skip..$((steps - 1)); simulator fed the same run's median chunk costs, P2P $lat_us us + $bw_gbs GB/s:"
echo
echo "| schedule | m | measured (metric) | simulated, same definition | diff | measured, makespan (trace) | simulated, makespan | diff | textbook | step ms | trace step ms | sim step ms |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "Memory at m = $mmax (MiB per pipeline rank: rank 0, rank 1):"
echo
echo "| run | peak RSS | activations allocated | simulated peak activations | step ms |"
echo "|---|---|---|---|---|"
mem_row gpipe-m$mmax "gpipe"
mem_row 1f1b-m$mmax "1f1b"
mem_row interleaved-1f1b-m$mmax "interleaved-1f1b (v=2)"
mem_row 1f1b-full-m$mmax "1f1b, recompute = full"
echo
echo "load after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: bench/pipeline.sh"
