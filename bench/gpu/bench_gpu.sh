#!/usr/bin/env bash
# The GPU benchmark: GPT-2 124M, sequence 1024, on one GPU, in one invocation.
#   1. gemm_curve: cuBLASLt bf16 GEMM efficiency (square sizes and the model's training
#      shapes) and device memory bandwidth -> OUT/gemm_curve.txt, with the
#      `gemm_efficiency = (...)` line for configs/clusters/h200-node.cfg
#   2. Tessera training, train.device = "cuda", micro_batch = global_batch = BATCH,
#      STEPS steps on random tokens: bf16 with train.attention = "gemm", bf16 with "flash",
#      then fp32
#   3. PyTorch the nanoGPT way (bench/gpu/torch_gpt2_gpu.py): eager, then torch.compile
#   4. the table (bench/gpu/summarize.py): tokens/s, ms/step, MFU, ratio to PyTorch
#      compile -> stdout and OUT/bench_table.txt; every run's rows and metrics ->
#      OUT/results.jsonl
#
#   bench/gpu/bench_gpu.sh --build BUILD_DIR --out OUT [--dry-run]
# Environment: TS_GPU_BATCH (16), TS_GPU_STEPS (30), TS_GPU_TORCH_STEPS (25),
# TS_GPU_DEADLINE (epoch seconds the whole must end by; bench/gpu_check.sh sets it),
# TS_PYTHON (a python3 with torch). --dry-run (or TS_GPU_CHECK_DRY=1): the CPU, the tiny
# config, 2 steps, fp32 everywhere, gemm_curve skipped: it checks the plumbing only.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="" out="" dry=${TS_GPU_CHECK_DRY:-0}
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=${2:-}; shift 2 ;;
    --out) out=${2:-}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    *) echo "bench_gpu: unknown argument '$1' (usage: --build DIR --out DIR [--dry-run])" >&2
       exit 2 ;;
  esac
done
if [ -z "$build" ] || [ ! -x "$build/tessera" ]; then
  echo "bench_gpu: --build must name a build directory holding tessera ('$build')" >&2
  exit 2
fi
[ -n "$out" ] || { echo "bench_gpu: --out DIR is required" >&2; exit 2; }
mkdir -p "$out"
work=$(mktemp -d) # a private scratch folder under $TMPDIR or /tmp
deadline=${TS_GPU_DEADLINE:-$(($(date +%s) + 3600))}

# Seconds a step may take: what it wants, capped by the time left before the deadline
# (less a margin for the table); 0 when too little is left to be worth starting.
budget() {
  local left=$((deadline - $(date +%s) - 15))
  [ "$left" -lt 20 ] && { echo 0; return; }
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}
# run_step NAME WANT_S CMD...: timed, bounded, logged; never stops the benchmark.
run_step() {
  local name=$1 want=$2 t rc start
  shift 2
  t=$(budget "$want")
  if [ "$t" -eq 0 ]; then
    echo "== $name: skipped, out of time"
    return 124
  fi
  echo "== $name (timeout ${t}s): $*"
  start=$(date +%s)
  timeout -k 10 "$t" "$@"
  rc=$?
  echo "== $name: exit $rc after $(($(date +%s) - start))s"
  return $rc
}

if [ "$dry" = 1 ]; then
  cfg=$root/configs/tiny.cfg model=4,4,128,256,64 vocab=256 seq=64
  batch=4 steps=2 tsteps=2 twarm=1 device=cpu
  precisions=(fp32 fp32 fp32)
  attn=(gemm gemm gemm) # train.attention = "flash" is for train.device = "cuda" only
  torch_args=(--device cpu --n_layer 4 --n_head 4 --n_embd 128 --vocab_size 256
    --seq_len 64 --threads 1)
  export OMP_NUM_THREADS=1
else
  cfg=$root/configs/gpt2-124m.cfg model=12,12,768,50257,1024 vocab=50257 seq=1024
  batch=${TS_GPU_BATCH:-16} steps=${TS_GPU_STEPS:-30} tsteps=${TS_GPU_TORCH_STEPS:-25}
  twarm=3 device=cuda
  precisions=(bf16 bf16 fp32)
  torch_args=(--device cuda)
fi
py=${TS_PYTHON:-}
if [ -z "$py" ]; then
  for c in python3 /usr/bin/python3; do
    "$c" -c 'import torch' 2>/dev/null && { py=$c; break; }
  done
fi

# 1. the ceilings
gemm_out=$out/gemm_curve.txt
if [ "$dry" = 1 ]; then
  echo "gemm_curve: skipped (dry run)" >"$gemm_out"
elif [ ! -x "$build/bench/gemm_curve" ]; then
  echo "gemm_curve: not built (a build without CUDA?)" | tee "$gemm_out"
else
  run_step gemm_curve 120 "$build/bench/gemm_curve" --tokens $((batch * 1024)) >"$gemm_out" 2>&1
  cat "$gemm_out"
fi

# 2. Tessera on random tokens (llm.c shard: 256 int32 header, uint16 tokens)
"${py:-python3}" - "$work/train.bin" "$vocab" $((64 * seq + 1)) <<'EOF'
import os, struct, sys
path, vocab, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
raw = os.urandom(4 * n)
toks = [int.from_bytes(raw[4 * i:4 * i + 4], "little") % vocab for i in range(n)]
with open(path, "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *toks))
EOF
labels=("Tessera bf16-gemm" "Tessera bf16-flash" "Tessera fp32")
[ "$dry" = 1 ] || attn=(gemm flash gemm)
specs=()
for i in 0 1 2; do
  m=$work/metrics_$i.jsonl
  specs+=(--tessera "${labels[$i]}=$m")
  run_step "${labels[$i]}" 90 \
    "$build/tessera" train "$cfg" --set train.device=\""$device"\" \
    --set train.attention=\""${attn[$i]}"\" \
    --set train.precision=\""${precisions[$i]}"\" --set parallel.micro_batch="$batch" \
    --set train.global_batch="$batch" --set train.steps="$steps" \
    --set data.train=\""$work/train.bin"\" --set data.val=\"\" \
    --set log.metrics=\""$m"\" --set log.progress=false
  [ -f "$m" ] && sed "s/^{/{\"run\":\"${labels[$i]}\",/" "$m" >>"$out/results.jsonl"
done

# 3. PyTorch
tj=$work/torch.jsonl
if [ -z "$py" ]; then
  echo '{"impl":"pytorch","mode":"eager","error":"no python3 with torch found"}' >"$tj"
else
  # PyTorch brings its own libraries: keep the prefix's (ibverbs, ucx...) out of its way.
  LD_LIBRARY_PATH=${TS_PREFIX_ORIG_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}} \
    run_step "PyTorch eager+compile" 240 "$py" "$root/bench/gpu/torch_gpt2_gpu.py" \
      "${torch_args[@]}" --batch "$batch" --steps "$tsteps" --warmup_steps "$twarm" \
      --modes eager,compile | tee "$tj"
fi
cat "$tj" >>"$out/results.jsonl" 2>/dev/null

# 4. the table
"${py:-python3}" "$root/bench/gpu/summarize.py" --gemm "$gemm_out" "${specs[@]}" \
  --torch "$tj" --model "$model" --json "$out/results.jsonl" | tee "$out/bench_table.txt"
rc=${PIPESTATUS[0]}
[ "$dry" = 1 ] && echo "(dry run: CPU, tiny config, fp32 for every Tessera row; numbers mean nothing)" |
  tee -a "$out/bench_table.txt"
rm -rf "$work"
exit "$rc"
