#!/usr/bin/env bash
# The memory estimate against the true peak (RESULTS 4.1): GPT-2 124M at T = 1024, 2 steps,
# on the grids the memory model tells apart; every rank runs under /usr/bin/time -v (the
# kernel's maximum resident set: the truth) and the table sets the metrics' estimate_mb
# (the pre-flight estimate) and peak_rss_mb (the report) beside it.
# Usage: bench/memory.sh [BUILD_DIR]   (CORPUS=a tessera data shard; default: made from
#        /usr/share/common-licenses). Needs about 8 GiB of memory and /usr/bin/time.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
T="$build/tessera"
[ -x "$T" ] || { echo "bench/memory.sh: no $T (scripts/build.sh first)" >&2; exit 2; }
command -v /usr/bin/time >/dev/null || { echo "bench/memory.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
corpus="${CORPUS:-}"
if [ -z "$corpus" ]; then
  cat /usr/share/common-licenses/* >"$work/corpus.txt"
  "$T" data "$work/corpus.txt" --out "$work/c" >/dev/null
  corpus="$work/c_train_000000.bin"
fi

# run NAME NP THREADS ARGS...: one run, a row per rank.
run() {
  local name=$1 np=$2 threads=$3; shift 3
  mpirun --oversubscribe -np "$np" -x OPENBLAS_NUM_THREADS="$threads" bash -c \
    "exec /usr/bin/time -o '$work/$name.time.'\$OMPI_COMM_WORLD_RANK -v '$T' train '$root/configs/gpt2-124m.cfg' \
     --set train.steps=2 --set 'data.train=\"$corpus\"' --set 'data.val=\"\"' --set 'checkpoint.dir=\"\"' \
     --set 'log.metrics=\"$work/$name.jsonl\"' --set log.progress=false --set train.threads=$threads $*" \
    >"$work/$name.log" 2>&1 || { echo "$name: failed"; tail -3 "$work/$name.log"; return; }
  python3 - "$work" "$name" "$np" <<'PY'
import json, re, sys
work, name, np = sys.argv[1], sys.argv[2], int(sys.argv[3])
last = json.loads(open("%s/%s.jsonl" % (work, name)).read().strip().splitlines()[-1])
for r in range(np):
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)",
                       open("%s/%s.time.%d" % (work, name, r)).read()).group(1))
    true = kb / 1024.0
    est, peak = last["estimate_mb"][r], last["peak_rss_mb"][r]
    print("| %-36s | %d | %7.0f | %7.0f | %7.0f | %.3f |" % (name, r, est, peak, true, est / true))
PY
}

echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p')"
echo "| grid | rank | estimate MiB | peak_rss_mb | /usr/bin/time MiB | estimate / true |"
echo "|---|---|---|---|---|---|"
run "1 rank, 2 threads, (2, 2)" 1 2 --set train.global_batch=2 --set parallel.micro_batch=2
run "1 rank, 2 threads, (4, 4)" 1 2 --set train.global_batch=4
run "pp 2 1F1B (4, 2)" 2 1 --set parallel.pp=2 --set train.global_batch=4 --set parallel.micro_batch=2
run "pp 2 zb-h1 (4, 2)" 2 1 --set parallel.pp=2 --set "'parallel.schedule=\"zb-h1\"'" --set train.global_batch=4 --set parallel.micro_batch=2
run "tp 2 (4, 4)" 2 1 --set parallel.tp=2 --set train.global_batch=4
run "dp 2 ZeRO-0 (4, 2)" 2 1 --set parallel.dp=2 --set train.global_batch=4 --set parallel.micro_batch=2
run "dp 2 ZeRO-0 no overlap (4, 2)" 2 1 --set parallel.dp=2 --set parallel.overlap_grad_sync=false --set train.global_batch=4 --set parallel.micro_batch=2
run "dp 2 ZeRO-1 (4, 2)" 2 1 --set parallel.dp=2 --set parallel.zero=1 --set train.global_batch=4 --set parallel.micro_batch=2
run "dp 2 ZeRO-3 (4, 2)" 2 1 --set parallel.dp=2 --set parallel.zero=3 --set train.global_batch=4 --set parallel.micro_batch=2
# bf16 where the CPU runs it (tessera refuses bf16 on the CPU without AVX512_BF16 or AMX).
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  run "bf16 1 rank, 2 threads, (4, 4)" 1 2 --set train.global_batch=4 --set "'train.precision=\"bf16\"'"
  run "bf16 pp 2 1F1B (4, 2)" 2 1 --set "'train.precision=\"bf16\"'" --set parallel.pp=2 --set train.global_batch=4 --set parallel.micro_batch=2
  run "bf16 dp 2 ZeRO-3 (4, 2)" 2 1 --set "'train.precision=\"bf16\"'" --set parallel.dp=2 --set parallel.zero=3 --set train.global_batch=4 --set parallel.micro_batch=2
else
  echo "(bf16 rows skipped: this CPU has no AVX512_BF16 or AMX-BF16)"
fi
