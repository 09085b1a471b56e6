#!/usr/bin/env bash
# Pipeline benchmark. pp = 2 on this machine (one rank per core, 1 thread each, bound by
# mpirun) for every built-in schedule (SCHEDULES=...; the multi-chunk ones with 2 virtual
# stages) at m = 4, 8
# micro-batches of an 8-layer 256-wide GPT-2. For each run, side by side: the measured
# bubble (median of the metrics' `bubble` over the steady steps), the simulator's bubble
# for that run's own measured chunk costs (`tessera plan --costs-from-trace` on the run's
# trace), the textbook formula (plan/search.h), and a replay of the
# trace with every action's own duration (which tells jitter from modelling error); the
# same measured and simulated over the step's makespan; and the share of the CPUs other
# processes took during the run. Then peak resident and activation memory of gpipe vs
# 1f1b vs 1f1b with full recompute at the largest m. Prints markdown tables.
# Usage: bench/pipeline.sh          (from anywhere)
#   BUILD=DIR      build directory (default build/)
#   QUIET_WAIT=S   wait up to S seconds (default 120) for the machine to go idle first
#   KEEP=DIR       keep every run's metrics, trace, log (and plan) in DIR
#   STEPS=N        steps per run (default 12; the first 3 are dropped as warm-up)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. bench/lib_parallel.sh
build="${BUILD:-$root/build}"
steps="${STEPS:-12}"
skip=3
bench_setup

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

train_once() {
  local name="$1"; shift
  mpirun -np $pp --bind-to core "$build/tessera" train "${model[@]}" "$@" \
    --set train.steps="$steps" --set train.threads=1 --set log.progress=false \
    --set "log.metrics=\"$tmp/$name.jsonl\"" --set "log.trace=\"$tmp/$name.trace.json\"" \
    >"$tmp/$name.log" 2>&1
}
# run NAME ARGS...: train pp = 2 with a trace; metrics in $tmp/NAME.jsonl; run once
# more when other processes took over 10% of the CPUs meanwhile; OTHERS = their share
run() {
  measured train_once "$@" \
    || { echo "pipeline.sh: run $1 failed:" >&2; tail -20 "$tmp/$1.log" >&2; exit 1; }
}

# jget KEY JSON: a number from a flat or nested JSON object (first occurrence)
jget() { echo "$2" | grep -o "\"$1\": *[-0-9.eE+]*" | head -1 | sed 's/.*: *//'; }

# replay TRACE N_CHUNKS: the diagnostic between simulator and measurement. Replays every
# steady step of the trace through the simulator's dependencies and P2P model (a rank
# runs its actions in order; F(c,i) needs F(c-1,i), B/I(c,i) needs B/I(c+1,i), W(c,i)
# needs I(c,i); a cross-rank input arrives latency + bytes / bandwidth after it is sent)
# but with every action's own measured duration instead of one cost per chunk. Prints
# the median bubble over the steps as the train metric counts it (idle until each
# rank's last action). Replay = measured: the compute durations explain the timeline
# (no hidden waits in the engine or MPI); replay > simulated: the gap comes from the
# durations varying from action to action.
replay() {
  python3 - "$1" "$skip" "$lat_us" "$bw_gbs" "$((mb * 64 * 256 * 4))" "$2" <<'EOF'
import json, sys
path, skip, nc = sys.argv[1], int(sys.argv[2]), int(sys.argv[6])
comm = float(sys.argv[3]) * 1e-3 + float(sys.argv[5]) / (float(sys.argv[4]) * 1e6)  # ms
tracks = {}
for e in sorted((e for e in json.load(open(path))["traceEvents"]
                 if e.get("ph") == "X" and e.get("cat") in ("F", "B", "I", "W")),
                key=lambda e: e["ts"]):
    tracks.setdefault(e["tid"], []).append(
        (e["cat"], e["args"]["chunk"], e["args"]["mb"], e["dur"] / 1e3))
period = {}  # actions per step: the shortest period of the (kind, chunk, mb) sequence
for r, es in tracks.items():
    key = [x[:3] for x in es]
    period[r] = next(p for p in range(1, len(es) + 1)
                     if len(es) % p == 0 and all(key[i] == key[i % p] for i in range(len(es))))
steps = min(len(es) // period[r] for r, es in tracks.items())
res = []
for k in range(skip, steps):
    acts = {r: es[k * period[r]:(k + 1) * period[r]] for r, es in tracks.items()}
    done = {}  # ("F" | "G", chunk, mb) -> (rank, end): output / input gradient ready
    pos, free, busy = {r: 0 for r in acts}, {r: 0.0 for r in acts}, {r: 0.0 for r in acts}
    moved = True
    while moved:
        moved = False
        for r in acts:
            while pos[r] < len(acts[r]):
                kind, c, mb, dur = acts[r][pos[r]]
                if kind == "F":
                    dep = ("F", c - 1, mb) if c > 0 else None
                elif kind == "W":
                    dep = ("G", c, mb)
                else:
                    dep = ("G", c + 1, mb) if c < nc - 1 else ("F", c, mb)
                ready = 0.0
                if dep:
                    if dep not in done:
                        break
                    ready = done[dep][1] + (comm if done[dep][0] != r else 0.0)
                free[r] = max(free[r], ready) + dur
                busy[r] += dur
                if kind != "W":
                    done[("F" if kind == "F" else "G", c, mb)] = (r, free[r])
                pos[r] += 1
                moved = True
    if any(pos[r] < len(acts[r]) for r in acts):
        sys.exit("replay: the trace's actions deadlock")
    res.append(sum(1 - busy[r] / free[r] for r in acts) / len(acts))
res.sort()
n = len(res)
print(res[n // 2] if n % 2 else 0.5 * (res[n // 2 - 1] + res[n // 2]))
EOF
}

busy=$(wait_quiet "${QUIET_WAIT:-120}")
echo "machine: $(nproc) cores, $busy% busy when the runs started, load $(cut -d' ' -f1-3 /proc/loadavg)"

# textbook SCHED P V M: the literature's bubble with F = I = W (plan/search.h)
textbook() {
  awk -v s="$1" -v p="$2" -v v="$3" -v m="$4" 'BEGIN {
    if (s == "interleaved-1f1b" || s == "looped-bfs") b = (p - 1) / (v * m + p - 1)
    else if (s == "zb-h1" || s == "zb-h2") b = (p - 1) / (3 * m + p - 1)
    else if (s == "interleaved-zb" || s == "zb-v" || s == "dualpipe-v") b = (p - 1) / (3 * v * m + p - 1)
    else b = (p - 1) / (m + p - 1)
    printf "%.3f", b }'
}
# formula SCHED: the same in words, for the table
formula() {
  case "$1" in
    interleaved-1f1b|looped-bfs) echo "(p-1)/(vm+p-1)" ;;
    zb-h1|zb-h2) echo "(p-1)/(3m+p-1)" ;;
    interleaved-zb|zb-v|dualpipe-v) echo "(p-1)/(3vm+p-1)" ;;
    *) echo "(p-1)/(m+p-1)" ;;
  esac
}

SCHEDULES="${SCHEDULES:-gpipe 1f1b interleaved-1f1b zb-h1 zb-h2 looped-bfs interleaved-zb zb-v dualpipe-v}"
rows=()
frows=()
for sched in $SCHEDULES; do
  for m in 4 8; do
    args=(--set parallel.schedule="$sched" --set train.global_batch=$((mb * m)))
    v=1
    case "$sched" in
      interleaved-1f1b|looped-bfs|interleaved-zb|zb-v|dualpipe-v)
        v=2
        args+=(--set parallel.virtual_stages=2 --set "$part_v2") ;;
      *) args+=(--set "$part_v1") ;;
    esac
    name="$sched-m$m"
    run "$name" "${args[@]}"
    plan=$("$build/tessera" plan "${model[@]}" "${args[@]}" --json \
             --costs-from-trace "$tmp/$name.trace.json" --trace-skip-steps $skip \
             --trace-stat median --latency-us $lat_us --bandwidth-gbs $bw_gbs)
    echo "$plan" >"$tmp/$name.plan.json"
    meas=$(med bubble "$tmp/$name.jsonl" $skip)
    rep=$(replay "$tmp/$name.trace.json" $((pp * v)))
    step=$(med step_ms "$tmp/$name.jsonl" $skip)
    uni=$("$build/tessera" plan "${model[@]}" "${args[@]}" --json --cost uniform)
    frows+=("| $sched | $v | $m | $(formula "$sched") = $(textbook "$sched" $pp $v $m) | $(printf '%.3f' "$(jget bubble "$uni")") | $(printf '%.3f' "$(jget bubble_rank_span "$plan")") | $(printf '%.3f' "$meas") |")
    rows+=("$(awk -v s="$sched" -v v="$v" -v m="$m" -v p="$pp" -v meas="$meas" -v rep="$rep" \
      -v sim_rs="$(jget bubble_rank_span "$plan")" -v sim="$(jget bubble "$plan")" \
      -v tr="$(jget measured_bubble "$plan")" -v step="$step" \
      -v tstep="$(jget measured_step_ms "$plan")" -v sstep="$(jget step_ms "$plan")" \
      -v o="$OTHERS" -v tb="$(textbook "$sched" $pp $v $m)" 'BEGIN {
      printf "| %s | %d | **%.3f** | **%.3f** | %+.0f%% | %.3f | %.3f | %.3f | %.3f | %+.0f%% | %.0f / %.0f / %.0f | %d%% |",
        s, m, meas, sim_rs, 100 * (meas - sim_rs) / sim_rs, tb, rep, tr, sim,
        100 * (tr - sim) / sim, step, tstep, sstep, o }')")
  done
done
mmax=8
full=(--set parallel.schedule=1f1b --set train.global_batch=$((mb * mmax)) --set "$part_v1"
      --set parallel.recompute=full)
run 1f1b-full-m$mmax "${full[@]}"
"$build/tessera" plan "${model[@]}" "${full[@]}" --json --cost uniform >"$tmp/1f1b-full-m$mmax.plan.json"

# memory row: NAME LABEL (sim peak activations from the plan, when there is one)
mem_row() {
  local f="$tmp/$1.jsonl" plan="$tmp/$1.plan.json" sim="n/a (not modelled)"
  if [ -f "$plan" ]; then # the memory model's activation sets (what tessera train checks)
    sim=$(grep -o '"activation_sets": *[0-9]*' "$plan" | sed 's/.*: *//' \
            | awk '{printf "%s%.1f", (NR > 1 ? ", " : ""), $1 / 1048576}')
  fi
  local line; line=$(mem_line "$f")
  local act; act=$(echo "$line" | sed 's/.*"activation_mb":\[\([^]]*\)\].*/\1/; s/,/, /g')
  local diff="n/a"
  if [ -f "$plan" ]; then # the largest |allocated - modelled| / modelled over the ranks
    diff=$(paste -d' ' <(echo "$act" | tr -d ' ' | tr ',' '\n') <(echo "$sim" | tr -d ' ' | tr ',' '\n') |
      awk '{ d = ($2 > 0) ? ($1 - $2) / $2 : 0; if (d < 0) d = -d; if (d > w) w = d } END { printf "%.1f%%", 100 * w }')
  fi
  echo "| $2 | $(echo "$line" | sed 's/.*"peak_rss_mb":\[\([^]]*\)\].*/\1/; s/,/, /g') | $act | $sim | $diff | $(printf '%.0f' "$(med step_ms "$f" $skip)") |"
}

echo
echo "Bubble, pp = 2, micro-batch $mb x 64 tokens, 8-layer 256-wide GPT-2 (partition $part_v1, v=2: $part_v2), 1 thread per rank, mpirun --bind-to core;"
echo "medians over steps $skip..$((steps - 1)); simulator fed the same run's median chunk costs, P2P $lat_us us + $bw_gbs GB/s:"
echo
echo "| schedule | m | measured bubble (metric) | simulated (run's chunk costs) | diff | textbook | replay (each action's own time) | measured, over makespan (trace) | simulated, over makespan | diff | step ms: metric / trace / sim | CPU used by others |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "Memory at m = $mmax (MiB per pipeline rank: rank 0, rank 1; allocated against the memory model's peak, largest difference over the ranks):"
echo
echo "| run | peak RSS | activations allocated | memory model (activation sets) | diff | step ms |"
echo "|---|---|---|---|---|---|"
for sched in $SCHEDULES; do mem_row "$sched-m$mmax" "$sched"; done
mem_row 1f1b-full-m$mmax "1f1b, recompute = full"
echo
echo "Bubble formulas with F = I = W (p = $pp), the simulator with uniform costs (tessera plan --cost uniform), with the run's own chunk costs, and measured:"
echo
echo "| schedule | v | m | formula | simulated, uniform | simulated, run's costs | measured |"
echo "|---|---|---|---|---|---|---|"
printf '%s\n' "${frows[@]}"
echo
echo "load after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: bench/pipeline.sh"
