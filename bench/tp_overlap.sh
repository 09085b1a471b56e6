#!/usr/bin/env bash
# Sub-pipelined tensor parallelism (parallel.tp_overlap, issue 28): tp 2 on 2 ranks, the
# tiny model at seq 256 (4 micro-batches of 4 sequences a step), tp_overlap 1, 2 and 4,
# without and with sequence parallelism. Per run, medians over the steps after the first:
# the step time; tp_comm_ms, the time the compute thread spent in or waiting for tp
# collectives (what the overlap left exposed); and from the Chrome trace (log.trace:
# every tp collective's span from its start to its completion on rank 0's communication
# track) the collectives' time in flight per step. With tp_overlap 1 every collective
# blocks: in flight = exposed; with more, a collective's span runs until the poll or
# wait that sees it done, so in flight is an upper bound on the time it took, and the
# exposed time against overlap 1's says what the overlap saved. Next to each, the
# planner's tp communication term (terms_ms.tp of `tessera plan --json` on
# configs/clusters/this-machine.cfg).
# Usage: bench/tp_overlap.sh [STEPS]   (default 8; from anywhere)
#   BUILD=DIR  build directory (default build/);  KEEP=DIR keeps every run's files
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. bench/lib_parallel.sh
steps="${1:-8}"
skip=1
build="${BUILD:-$root/build}"
bench_setup
model=(--set model.seq_len=256 --set parallel.micro_batch=4 --set train.global_batch=16
       --set parallel.tp=2)

run() { measured run_once "$@" || { echo "tp_overlap.sh: run $1 failed" >&2; tail -20 "$tmp/$1.log" >&2; exit 1; }; }
run_once() {
  local name="$1"; shift
  mpirun -np 2 --oversubscribe --bind-to none "$build/tessera" train configs/tiny.cfg \
    "${model[@]}" "$@" --set train.threads=1 --set data.eval_every=0 --set train.steps="$steps" \
    --set 'data.val=""' --set 'data.train="data/fortunes_train.bin"' --set log.progress=false \
    --set "log.trace=\"$tmp/$name.trace.json\"" \
    --set "log.metrics=\"$tmp/$name.jsonl\"" >"$tmp/$name.log" 2>&1
}

# in_flight TRACE: rank 0's tp collectives' summed span per step, steps after the first
# (the trace's optimizer events mark the step ends).
in_flight() {
  python3 - "$1" "$skip" "$steps" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
skip, steps = int(sys.argv[2]), int(sys.argv[3])
ends = sorted(e["ts"] + e["dur"] for e in ev if e.get("cat") == "optim" and e.get("tid") == 0)
start = ends[skip - 1] if skip >= 1 and len(ends) >= skip else 0
tp = [e["dur"] for e in ev if e.get("cat") == "tpcomm" and e.get("tid") == 0 and e["ts"] >= start]
print("%.1f" % (sum(tp) / 1e3 / max(1, len(ends) - skip)))
PY
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; 1 thread per rank"
echo "commit: $(git rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo
echo "### tp 2, seq 256, 4 micro-batches of 4 ($steps steps, medians after step $skip)"
echo
echo "| sequence parallel | tp_overlap | step ms | vs overlap 1 | tp exposed ms | exposed vs overlap 1 | tp in flight ms | planner tp ms |"
echo "|---|---|---|---|---|---|---|---|"
for sp in false true; do
  base="" ebase=""
  for ov in 1 2 4; do
    name="sp${sp}_ov$ov"
    run "$name" --set parallel.sequence_parallel=$sp --set parallel.tp_overlap=$ov
    ms=$(med step_ms "$tmp/$name.jsonl" $((skip + 1)))
    ex=$(med tp_comm_ms "$tmp/$name.jsonl" $((skip + 1)))
    fl=$(in_flight "$tmp/$name.trace.json")
    ptp=$("$build/tessera" plan configs/tiny.cfg "${model[@]}" --set parallel.sequence_parallel=$sp \
      --set parallel.tp_overlap=$ov --cluster configs/clusters/this-machine.cfg --json 2>/dev/null |
      python3 -c 'import json,sys; d=json.load(sys.stdin); t=d.get("terms_ms",{}); print("%.1f" % t["tp_comm"] if "tp_comm" in t else "-")' 2>/dev/null || echo "-")
    [ -n "$base" ] || { base=$ms; ebase=$ex; }
    awk -v sp=$sp -v ov=$ov -v ms="$ms" -v b="$base" -v ex="$ex" -v eb="$ebase" -v fl="$fl" -v p="$ptp" 'BEGIN {
      printf "| %s | %d | %.1f | %.3f | %.1f | %.2f | %.1f | %s |\n", sp == "true" ? "yes" : "no", ov, ms, ms / b, ex, ex / eb, fl, p }'
  done
done
echo
echo "command: bench/tp_overlap.sh $steps"
