#!/usr/bin/env bash
# Selective recomputation and sequence parallelism (issue 28). Three tables:
# 1. Activation memory per transformer layer and rank at seq 1024 (tiny.cfg: 128 wide, 4
#    heads; micro-batch 1), tp 1, tp 2 and tp 2 with sequence parallelism, recompute none
#    and selective, against Korthikanti
#    et al. 2022's formula in this run's terms: the paper's 34sbh + 5as^2b counts 16-bit
#    activations and dropout masks; without dropout, in elements, a layer keeps
#    sbh (4 + 12/t) + a s^2 b / t (the norms' inputs, the attention and MLP inputs
#    replicated over tp; q, k, v, the projection's input and the MLP's two F-wide tensors
#    split; the softmax split by heads), times 4 bytes in fp32; selective drops the
#    a s^2 b / t term; sequence parallelism splits the replicated 4 sbh as well, giving
#    16 sbh / t (the paper's sbh/t (34 + 5as/h) without dropout). Measured: the engine's allocated activation sets (the metrics'
#    activation_mb) at 8 layers less those at 4, over 4: one layer's bytes, the embedding
#    and head cancelled.
# 2. Step time of none, selective and full at the same shape (tp 1, 4 micro-batches per
#    step, medians over the steps after the first), next to the planner's prediction on
#    configs/clusters/this-machine.cfg.
# 3. Step time and tp communication of tp 2 with and without sequence parallelism (the
#    same shape, 2 ranks).
# Full recompute is not in table 1: it keeps no layer's activations per micro-batch in
# flight (only each chunk's input, sbh/t with sequence parallelism), plus the one set a
# replay runs in; table 2 has its step time.
# Usage: bench/recompute.sh [STEPS]   (default 6; from anywhere)
#   BUILD=DIR  build directory (default build/);  KEEP=DIR keeps every run's files
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. bench/lib_parallel.sh
steps="${1:-6}"
skip=1
build="${BUILD:-$root/build}"
bench_setup
T=1024
model=(--set model.seq_len=$T --set parallel.micro_batch=1 --set train.global_batch=4)

run() { measured run_once "$@" || { echo "recompute.sh: run $1 failed" >&2; tail -20 "$tmp/$1.log" >&2; exit 1; }; }
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
echo "### Activation memory per layer and rank, seq $T, micro-batch 1, fp32 (MiB)"
echo
echo "| tp | sequence parallel | recompute | measured (8 layers - 4, / 4) | formula | off by |"
echo "|---|---|---|---|---|---|"
for grid in "1 false" "2 false" "2 true"; do
  set -- $grid
  tp=$1 sp=$2
  for rc in none selective; do
    for L in 4 8; do
      run "m_${tp}_${sp}_${rc}_$L" "$tp" --set parallel.tp=$tp --set "parallel.recompute=\"$rc\"" \
        --set parallel.sequence_parallel=$sp --set model.n_layer=$L --set train.steps=1
    done
    a4=$(mem_field "$tmp/m_${tp}_${sp}_${rc}_4.jsonl" activation_mb)
    a8=$(mem_field "$tmp/m_${tp}_${sp}_${rc}_8.jsonl" activation_mb)
    awk -v tp=$tp -v sp=$sp -v rc=$rc -v a4="$a4" -v a8="$a8" -v T=$T 'BEGIN {
      s = T; b = 1; h = 128; a = 4; t = tp
      el = s * b * h * (sp == "true" ? 16 / t : 4 + 12 / t) + (rc == "selective" ? 0 : a * s * s * b / t)
      f = el * 4 / 1048576; m = (a8 - a4) / 4
      printf "| %d | %s | %s | %.2f | %.2f | %+.1f%% |\n", tp, sp == "true" ? "yes" : "no", rc, m, f, (m / f - 1) * 100 }'
  done
done
echo
echo "(the metrics round activation_mb to 0.1 MiB: the measured column is good to 0.05 MiB)"
echo
echo "### Step time, tp 1, 4 layers, 4 micro-batches of 1 x $T tokens ($steps steps, medians after step $skip)"
echo
echo "| recompute | step ms | vs none | activation MiB | planner step ms | planner vs none |"
echo "|---|---|---|---|---|---|"
base="" pbase=""
for rc in none selective full; do
  run "t_$rc" 1 --set "parallel.recompute=\"$rc\"" --set train.steps="$steps"
  ms=$(med step_ms "$tmp/t_$rc.jsonl" $((skip + 1)))
  pms=$("$build/tessera" plan configs/tiny.cfg "${model[@]}" --set "parallel.recompute=\"$rc\"" \
    --cluster configs/clusters/this-machine.cfg 2>/dev/null | sed -n 's/^step: \([0-9.]*\) ms.*/\1/p')
  [ -n "$base" ] || { base=$ms; pbase=$pms; }
  awk -v rc=$rc -v ms="$ms" -v b="$base" -v act="$(mem_field "$tmp/t_$rc.jsonl" activation_mb)" \
      -v p="$pms" -v pb="$pbase" 'BEGIN {
    printf "| %s | %.1f | %.3f | %.1f | %.1f | %.3f |\n", rc, ms, ms / b, act, p, p / pb }'
done
echo
echo "### Step time, tp 2 (2 ranks), 4 layers, 4 micro-batches of 1 x $T tokens ($steps steps, medians after step $skip)"
echo
echo "| sequence parallel | step ms | vs off | tp_comm_ms | activation MiB |"
echo "|---|---|---|---|---|"
base=""
for sp in false true; do
  run "s_$sp" 2 --set parallel.tp=2 --set parallel.sequence_parallel=$sp --set train.steps="$steps"
  ms=$(med step_ms "$tmp/s_$sp.jsonl" $((skip + 1)))
  tpc=$(med tp_comm_ms "$tmp/s_$sp.jsonl" $((skip + 1)))
  [ -n "$base" ] || base=$ms
  awk -v sp=$sp -v ms="$ms" -v b="$base" -v tpc="$tpc" \
      -v act="$(mem_field "$tmp/s_$sp.jsonl" activation_mb)" 'BEGIN {
    printf "| %s | %.1f | %.3f | %.1f | %.1f |\n", sp == "true" ? "yes" : "no", ms, ms / b, tpc, act }'
done
echo
echo "command: bench/recompute.sh $steps"
