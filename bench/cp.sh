#!/usr/bin/env bash
# Context parallelism (parallel.cp, issue 28) at a long sequence on this machine: the
# tiny GPT-2 and Llama models (4 layers, 128 wide: attention dominates at this length)
# at seq_len SEQ (default 4096), 2 sequences a step, on the machine's 2 cores:
#   cp 1, one rank with 2 threads   the peer: the same cores, no splitting
#   tp 2, two ranks of 1 thread     heads split instead (for reference)
#   cp 2, two ranks of 1 thread     each rank holds chunks i and 3-i of every sequence
# Per run, medians over the steps after the first: the step time, model TFLOP/s (6N plus
# attention's 12LTC per token, nanoGPT's count) against the machine's fp32 ceiling (2
# cores' sgemm, measured by the trainer's BLAS report), cp_comm_ms (the K/V all-gathers
# and dK/dV reduce-scatters), tp_comm_ms, and the peak activation MiB and RSS of rank 0
# (the metrics' memory line). Next to each, the planner's step time for the same grid
# (tessera plan --json on configs/clusters/this-machine.cfg).
# Usage: bench/cp.sh [STEPS] [SEQ]   (defaults 4 and 4096; from anywhere)
#   BUILD=DIR  build directory (default build/);  KEEP=DIR keeps every run's files
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. bench/lib_parallel.sh
steps="${1:-4}"
seq="${2:-4096}"
skip=1
build="${BUILD:-$root/build}"
bench_setup
shape=(--set model.seq_len="$seq" --set parallel.micro_batch=1 --set train.global_batch=2)

run() { measured run_once "$@" || { echo "cp.sh: run $2 failed" >&2; tail -20 "$tmp/$2.log" >&2; exit 1; }; }
run_once() { # CONFIG NAME NP THREADS SETS...
  local cfg="$1" name="$2" np="$3" threads="$4"; shift 4
  mpirun -np "$np" --oversubscribe --bind-to none "$build/tessera" train "$cfg" \
    "${shape[@]}" "$@" --set train.threads="$threads" --set data.eval_every=0 \
    --set train.steps="$steps" --set 'data.val=""' --set 'data.train="data/fortunes_train.bin"' \
    --set log.progress=false --set "log.metrics=\"$tmp/$name.jsonl\"" >"$tmp/$name.log" 2>&1
}
plan_ms() { # CONFIG SETS...: the planner's step_ms for the grid
  local cfg="$1"; shift
  "$build/tessera" plan "$cfg" "${shape[@]}" "$@" --cluster configs/clusters/this-machine.cfg \
    --json 2>/dev/null | python3 -c 'import json,sys; print("%.0f" % json.load(sys.stdin)["step_ms"])' \
    2>/dev/null || echo "-"
}
ceiling() { # METRICS: the summed sgemm GFLOP/s of the ranks' BLAS report (first line)
  head -n 1 "$1" | python3 -c 'import json,sys; print("%.1f" % sum(json.load(sys.stdin)["blas_gflops"]))'
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
echo "commit: $(git rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC')"
for cfg in configs/tiny.cfg configs/llama-tiny.cfg; do
  arch=$(basename "$cfg" .cfg)
  echo
  echo "### $arch, seq $seq, 2 sequences a step ($steps steps, medians after step $skip)"
  echo
  echo "| grid | ranks x threads | step ms | vs cp 1 | model GFLOP/s | of sgemm ceiling | cp comm ms | tp comm ms | activation MiB | peak RSS MiB | planner step ms |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  base=""
  for g in cp1 tp2 cp2; do
    case $g in
      cp1) np=1; th=2; sets=() ;;
      tp2) np=2; th=1; sets=(--set parallel.tp=2 --set parallel.dp=1) ;;
      cp2) np=2; th=1; sets=(--set parallel.cp=2 --set parallel.dp=1) ;;
    esac
    name="${arch}_$g"
    run "$cfg" "$name" "$np" "$th" "${sets[@]}"
    f="$tmp/$name.jsonl"
    ms=$(med step_ms "$f" $((skip + 1)))
    cpms=$(med cp_comm_ms "$f" $((skip + 1)))
    tpms=$(med tp_comm_ms "$f" $((skip + 1)))
    tps=$(med tokens_per_s "$f" $((skip + 1)))
    [ -n "$base" ] || base=$ms
    # Model FLOPs per token (lib_parallel.sh's GPT-2 count; the llama MLP is SwiGLU at
    # 384 wide, 3 * 128 * 384 per layer against GPT-2's 2 * 128 * 512: the same within
    # a few percent at this size, attention's 12LTC dominating at seq 4096).
    fpt=$(flops_per_token 4 128 256 "$seq")
    ceil=$(ceiling "$f")
    act=$(mem_field "$f" activation_mb)
    rss=$(mem_field "$f" peak_rss_mb)
    pms=$(plan_ms "$cfg" "${sets[@]}")
    awk -v g="$g" -v np="$np" -v th="$th" -v ms="$ms" -v b="$base" -v tps="$tps" -v fpt="$fpt" \
        -v ceil="$ceil" -v cp="$cpms" -v tp="$tpms" -v act="$act" -v rss="$rss" -v p="$pms" 'BEGIN {
      gf = tps * fpt / 1e9
      printf "| %s | %d x %d | %.0f | %.3f | %.1f | %.0f%% of %.0f | %.1f | %.1f | %.1f | %.1f | %s |\n",
             g, np, th, ms, ms / b, gf, 100 * gf / ceil, ceil, cp, tp, act, rss, p }'
  done
done
echo
echo "command: bench/cp.sh $steps $seq"
