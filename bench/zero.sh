#!/usr/bin/env bash
# ZeRO-1/2/3 across the pipeline (issue 27). Two tables:
# 1. Memory: the state each rank keeps through the run (fp32 weights and compute copy,
#    gradients, AdamW moments: the metrics' state_mb) at dp = 4 against dp = 1 for zero
#    0..3, next to the formula (16 bytes per parameter without ZeRO; 4 + 4 + 8/dp,
#    4 + 12/dp, 16/dp for ZeRO-1, 2, 3), ZeRO-2/3's chunk buffers at their peak
#    (zero_buffers_mb) next to the memory model's (`tessera plan --json`), and the steps'
#    peak resident memory (step_peak_rss_mb). An 8-layer 256-wide GPT-2, seq 64.
# 2. Overlap on pp2 x dp2 (4 ranks): the share of the step's dp traffic (ZeRO-3's weight
#    gathers and gradient reduce-scatters, the trace's dp track) that ran while the same
#    rank computed (F/B/I/W spans), looped-bfs (Breadth-First, v = 2) against 1f1b and
#    interleaved-1f1b, all ZeRO-3, with the gathers and reductions per step the schedule
#    implies and the simulator's prediction (`tessera plan --cluster`: its exposed dp
#    time, reductions and gathers, against their total; on this machine's measured file
#    and on the same with overlap_comm = true).
# Usage: bench/zero.sh [STEPS]   (default 20; from anywhere)
#   BUILD=DIR  build directory (default build/);  KEEP=DIR keeps every run's files
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. bench/lib_parallel.sh
steps="${1:-20}"
skip=4
build="${BUILD:-$root/build}"
bench_setup
model=(--set model.n_layer=8 --set model.n_embd=256 --set model.n_head=8
       --set train.global_batch=16 --set parallel.micro_batch=2)

run() { measured run_once "$@" || { echo "zero.sh: run $1 failed" >&2; tail -20 "$tmp/$1.log" >&2; exit 1; }; }
run_once() {
  local name="$1" np="$2"; shift 2
  mpirun -np "$np" --oversubscribe --bind-to none "$build/tessera" train configs/tiny.cfg \
    "${model[@]}" "$@" --set train.threads=1 --set data.eval_every=0 \
    --set 'data.val=""' --set 'data.train="data/fortunes_train.bin"' --set log.progress=false \
    --set "log.metrics=\"$tmp/$name.jsonl\"" >"$tmp/$name.log" 2>&1
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; 1 thread per rank"
echo "commit: $(git rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo
echo "### Memory per rank, dp = 4 against dp = 1 (MiB; rank 0)"
echo
echo "| zero | state dp=1 | state dp=4 | dp4/dp1 | formula | off by | chunk buffers (run) | chunk buffers (model) | step peak RSS dp=4 |"
echo "|---|---|---|---|---|---|---|---|---|"
for z in 0 1 2 3; do
  run "m${z}_1" 1 --set parallel.zero=$z --set train.steps=3
  run "m${z}_4" 4 --set parallel.dp=4 --set parallel.zero=$z --set train.steps=3
  one=$(mem_field "$tmp/m${z}_1.jsonl" state_mb) four=$(mem_field "$tmp/m${z}_4.jsonl" state_mb)
  want=$(awk -v z=$z 'BEGIN { d = 4; f = z == 0 ? 16 : z == 1 ? 8 + 8 / d : z == 2 ? 4 + 12 / d : 16 / d; print f / 16 }')
  model_buf=$("$build/tessera" plan configs/tiny.cfg "${model[@]}" --set parallel.dp=4 \
    --set parallel.zero=$z --json 2>/dev/null | python3 -c '
import json, sys
print("%.1f" % (json.load(sys.stdin)["ranks"][0]["memory"].get("chunk_buffers", 0) / 1048576))' ||
    echo n/a)
  awk -v z=$z -v one="$one" -v four="$four" -v want="$want" -v buf="$(mem_field "$tmp/m${z}_4.jsonl" zero_buffers_mb)" \
      -v mbuf="$model_buf" -v rss="$(mem_field "$tmp/m${z}_4.jsonl" step_peak_rss_mb)" 'BEGIN {
    r = four / one; printf "| %d | %.1f | %.1f | %.4f | %.4f | %+.1f%% | %.1f | %s | %.1f |\n",
      z, one, four, r, want, (r / want - 1) * 100, buf, mbuf, rss }'
done

echo
echo "### dp traffic hidden behind compute, pp2 x dp2, ZeRO-3 ($steps steps, medians from step $skip)"
echo
echo "| schedule | v | step ms | gathers + reductions, pp rank 0 (plan) | dp collectives per rank per step (trace: one per bucket) | dp time hidden (trace) | predicted hidden (this-machine.cfg) | predicted hidden (overlap_comm = true) |"
echo "|---|---|---|---|---|---|---|---|"
hidden() { # TRACE SKIP: the share of dp-track time that overlaps the same rank's compute
  python3 - "$1" "$2" <<'PY'
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
skip = int(sys.argv[2])
def union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]: out[-1][1] = max(out[-1][1], b)
        else: out.append([a, b])
    return out
tot = hid = 0.0
counts = []
for r in sorted({e["tid"] for e in ev}):
    mine = [e for e in ev if e["tid"] == r]
    optim = sorted(e["ts"] + e["dur"] for e in mine if e.get("cat") == "optim")
    if len(optim) <= skip: continue
    lo, hi = optim[skip - 1], optim[-1]
    comp = union([(e["ts"], e["ts"] + e["dur"]) for e in mine
                  if e.get("cat") in ("F", "B", "I", "W") and lo <= e["ts"] < hi])
    dp = [(e["ts"], e["ts"] + e["dur"]) for e in mine
          if e.get("cat") == "dpreduce" and lo <= e["ts"] < hi]
    counts.append(len(dp) / (len(optim) - skip))
    for a, b in union(dp):
        tot += b - a
        for c, d in comp:
            hid += max(0.0, min(b, d) - max(a, c))
print("%.3f %.1f" % (hid / tot if tot else 0.0, sum(counts) / len(counts) if counts else 0))
PY
}
pp=(--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=3)
# The simulator on this machine's measured cluster file, once as measured (MPI runs on
# the compute cores: overlap_comm = false, nothing hidden by construction) and once with
# overlap_comm = true (what a network that progresses on its own would hide).
sed 's/^\( *overlap_comm = \)false;/\1true;/' configs/clusters/this-machine.cfg >"$tmp/overlap.cfg"
predicted() { # CLUSTER SETS...: the predicted hidden share of dp time, and gathers+reductions
  "$build/tessera" plan configs/tiny.cfg "${model[@]}" "${@:2}" --cluster "$1" --json 2>/dev/null |
    python3 -c '
import json, sys
d = json.load(sys.stdin); t = d["terms_ms"]
total = t["dp_reduction"] + t["dp_gather"]
hid = 1 - (t["dp_exposed"] + t["gather_exposed"]) / total if total > 0 else 0.0
z = (d.get("zero_traffic") or [{}])[0]
print("%.3f %s+%s" % (hid, z.get("gathers", "?"), z.get("reductions", "?")))'
}
for s in "looped-bfs 2" "1f1b 1" "interleaved-1f1b 2"; do
  set -- $s
  name="o_$1"
  sargs=("${pp[@]}" --set "parallel.schedule=\"$1\"" --set parallel.virtual_stages="$2")
  run "$name" 4 "${sargs[@]}" --set train.steps="$steps" --set "log.trace=\"$tmp/$name.trace.json\""
  read -r share per_step <<<"$(hidden "$tmp/$name.trace.json" "$skip")"
  read -r p_meas counts <<<"$(predicted configs/clusters/this-machine.cfg "${sargs[@]}")"
  read -r p_over _ <<<"$(predicted "$tmp/overlap.cfg" "${sargs[@]}")"
  printf '| %s | %s | %.1f | %s | %s | %s | %s | %s |\n' "$1" "$2" "$(med step_ms "$tmp/$name.jsonl" $skip)" \
    "$counts" "$per_step" "$share" "$p_meas" "$p_over"
done
echo
echo "command: bench/zero.sh $steps"
