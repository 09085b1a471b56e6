#!/usr/bin/env bash
# Packed documents' attention (data.document_mask, issue 43): CPU attention forward +
# backward at T = SEQ (default 4096), 2 heads of 64 (attention alone, in seconds), one
# sequence cut into documents of 512 against one document of SEQ: the time's ratio
# against the ratio of the query-key pairs (sum of L_i (L_i + 1) / 2), the work the masks
# leave (goal: within 20%). Tessera's fp32 table (and bf16 where the CPU has BF16
# instructions) on THREADS threads (default 1), then the PyTorch peer in the same
# invocation on the same threads (bench/attention_docmask_torch.py: flex_attention with a
# document BlockMask when it compiles here, SDPA on each document alone, SDPA with the
# dense mask). The machine is shared: rerun, and read the ratios rather than the times.
# Usage: bench/attention_docmask.sh [SEQ] [THREADS] [REPS]   (from anywhere)
#   BUILD=DIR  build directory (default build/);  PY=python with torch (default the peer venv)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seq="${1:-4096}"
threads="${2:-1}"
reps="${3:-5}"
build="${BUILD:-$root/build}"
py="${PY:-/root/.cache/tessera/peer-venv/bin/python}"
lens=(512 1024 "$seq")
echo "# $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$root" rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores (shared VM)"
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
"$build/bench/bench_attention_docmask" "$seq" 2 64 "$reps" fp32 "${lens[@]}"
# The ceiling: this core's best sgemm (wall clock: on a loaded machine a lower bound).
"$build/bench/bench_sgemm" "$threads" | tail -n 1
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  "$build/bench/bench_attention_docmask" "$seq" 2 64 "$reps" bf16 "${lens[@]}"
fi
if [ -x "$py" ] && "$py" -c 'import torch' 2>/dev/null; then
  "$py" "$root/bench/attention_docmask_torch.py" "$seq" 2 64 "$reps" "$threads" "${lens[@]}"
else
  echo "no PyTorch at $py: the peer is not run (scripts/peer_venv.sh makes it)"
fi
