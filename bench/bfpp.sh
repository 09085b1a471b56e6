#!/usr/bin/env bash
# The Breadth-First paper's comparison on paper (Lamy-Poirier, MLSys 2023, arXiv:
# 2211.05953): its 52B model (configs/bfpp-52b.cfg) on 64 A100 80GB GPUs
# (configs/clusters/bfpp-a100.cfg), Breadth-First (looped-bfs) with ZeRO-3 against
# depth-first interleaved 1F1B (Megatron-LM's schedule) with ZeRO-0 or 1, at batch sizes
# per GPU from 0.5 to 4 sequences. For each batch and schedule, the best predicted grid
# that fits: tp 4 or 8, pp 2..16, virtual stages 2, 4, 8, micro-batch 1, recompute none or
# full (the planner's `tessera plan --cluster --json` per grid). Prints a markdown table
# and the command lines. No GPU: the planner only.
# Usage: bench/bfpp.sh     BUILD=DIR (default build/)   GPUS=N (default 64)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${BUILD:-$root/build}"
gpus="${GPUS:-64}"
tessera="$build/tessera"
cfg=configs/bfpp-52b.cfg
cluster=configs/clusters/bfpp-a100.cfg
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "command: GPUS=$gpus bench/bfpp.sh ($tessera plan $cfg --cluster $cluster --json --set ...)"
echo
echo "| batch/GPU | schedule | zero | pp x dp x tp | v | rc | step ms | tokens/s/GPU | MFU | GB/GPU | gathers exposed ms | BF/DF |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for per_gpu in 0.5 1 2 4; do
  gb=$(awk -v p="$per_gpu" -v g="$gpus" 'BEGIN { printf "%d", p * g }')
  best_df=""
  for family in df bf; do
    if [ $family = bf ]; then sched=looped-bfs; zeros="3"; else sched=interleaved-1f1b; zeros="0 1"; fi
    best=""; best_tps=0
    for tp in 4 8; do for pp in 2 4 8 16; do
      dp=$((gpus / tp / pp)); [ $((dp * tp * pp)) = "$gpus" ] && [ "$dp" -ge 1 ] || continue
      [ $((gb % dp)) = 0 ] || continue
      for v in 2 4 8; do [ $((pp * v)) -le 66 ] || continue
        for rc in none full; do for z in $zeros; do
          [ "$dp" = 1 ] && [ "$z" != 0 ] && [ $family = df ] && continue
          f="$out/r.json"
          "$tessera" plan $cfg --cluster $cluster --json --set train.device='"cuda"' \
            --set train.attention='"flash"' --set train.global_batch=$gb --set parallel.pp=$pp \
            --set parallel.dp=$dp --set parallel.tp=$tp --set parallel.virtual_stages=$v \
            --set parallel.schedule=$sched --set parallel.recompute="\"$rc\"" \
            --set parallel.zero=$z --set parallel.micro_batch=1 >"$f" 2>/dev/null || continue
          line=$(python3 - "$f" "$gpus" <<'PY'
import json, sys
o = json.load(open(sys.argv[1])); g = int(sys.argv[2])
if not o["fits"]: sys.exit(0)
t = o["terms_ms"]
print("%.6f %s %d %dx%dx%d %d %s %.2f %.0f %.1f%% %.1f %.1f" % (o["tokens_per_s"] / g, o["schedule"], o["zero"],
      o["pp"], o["dp"], o["tp"], o["v"], o["recompute"], o["step_ms"], o["tokens_per_s"] / g,
      100 * o["mfu"], o["memory_bytes"] / 1e9, t["gather_exposed"]))
PY
)
          [ -n "$line" ] || continue
          tps=${line%% *}
          if awk -v a="$tps" -v b="$best_tps" 'BEGIN { exit !(a > b) }'; then best="$line"; best_tps=$tps; fi
        done; done
      done
    done; done
    if [ -z "$best" ]; then echo "| $per_gpu | $sched | - | none fits | | | | | | | | |"; continue; fi
    set -- $best
    ratio=""
    if [ $family = df ]; then best_df=$best_tps; else
      [ -n "$best_df" ] && ratio=$(awk -v a="$best_tps" -v b="$best_df" 'BEGIN { printf "%.3f", a / b }'); fi
    echo "| $per_gpu | $2 | $3 | $4 | $5 | $6 | $7 | $8 | $9 | ${10} | ${11} | $ratio |"
  done
done
