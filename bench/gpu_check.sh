#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (one H200, 16 cores; the CUDA image has
# nvcc, cuBLAS, CMake and PyTorch but no MPI, hwloc, libconfig, jansson, OpenBLAS and no
# network). It builds Tessera there from the Debian packages carried in .gpu-debs
# (scripts/fetch_gpu_debs.sh), runs the `gpu` CTests and the GPU benchmark
# (bench/gpu/bench_gpu.sh), and writes into OUTDIR (7 files, each well under 16 MiB):
#   env.txt        GPU, driver, nvcc, compilers, CPU, OS
#   build.log      unpack, configure and build
#   ctest_gpu.log  ctest -L gpu --output-on-failure (less test_nccl where no NCCL is found);
#                  test_cuda_attention in it checks every CUDA attention variant, packed
#                  documents (ts_att_heads.doc_start: gemm and flash, fp32 and bf16, the
#                  cp prefix slots) included, against a plain-C per-document reference
#   bench_gpu.log  the benchmark's whole output
#   gemm_curve.txt GEMM efficiency curve and memory bandwidth (the cluster-file line)
#   results.jsonl  every run's metrics and the table's rows
#   summary.txt    phase times and exit codes, test result, the table
#
#   bench/gpu_check.sh [OUTDIR] [--dry-run]        # OUTDIR defaults to /tmp/ts-gpu-check
#
# With the device tool: carry [".gpu-debs"], command `bash bench/gpu_check.sh $OUT`.
# Every phase has its own timeout and the whole a deadline (TS_GPU_CHECK_BUDGET_S, 400 s
# by default), so one hang cannot eat the slot; a phase that fails is recorded and the
# later ones still run where they can. --dry-run (or TS_GPU_CHECK_DRY=1) checks the
# plumbing on a machine without a GPU: CPU build (TS_CUDA=OFF), tiny config, 2 steps.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="" dry=${TS_GPU_CHECK_DRY:-0}
for a in "$@"; do
  case $a in
    --dry-run) dry=1 ;;
    -*) echo "gpu_check: unknown option '$a' (usage: bench/gpu_check.sh [OUTDIR] [--dry-run])" >&2
        exit 2 ;;
    *) out=$a ;;
  esac
done
out=${out:-/tmp/ts-gpu-check}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
start=$(date +%s)
deadline=$((start + ${TS_GPU_CHECK_BUDGET_S:-400}))
export TS_GPU_DEADLINE=$deadline TS_GPU_CHECK_DRY=$dry
jobs=$(nproc)
prefix=${TS_GPU_CHECK_PREFIX:-/tmp/ts-gpu-prefix}
build=${TS_GPU_CHECK_BUILD:-/tmp/ts-gpu-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
phases=()

left() { echo $((deadline - $(date +%s))); }
# phase NAME WANT_S LOG CMD...: run CMD with stdout+stderr appended to LOG, under a
# timeout of WANT_S capped by the time left; record name, exit code and seconds.
phase() {
  local name=$1 want=$2 log=$3 t rc s
  shift 3
  t=$(left)
  [ "$want" -lt "$t" ] && t=$want
  if [ "$t" -lt 10 ]; then
    phases+=("$(printf '%-10s %6s %6s  %s' "$name" skip - "out of time")")
    echo "gpu_check: $name skipped: out of time"
    return 124
  fi
  s=$(date +%s)
  echo "gpu_check: $name (timeout ${t}s, $(($(date +%s) - start))s in)"
  echo "== $name: $*" >>"$log"
  timeout -k 10 "$t" "$@" >>"$log" 2>&1
  rc=$?
  phases+=("$(printf '%-10s %6s %6s  %s' "$name" "$rc" "$(($(date +%s) - s))s" \
    "$([ $rc -eq 124 ] && echo "timed out after ${t}s")")")
  echo "gpu_check: $name: exit $rc, $(($(date +%s) - s))s"
  return $rc
}

# ---- env.txt
{
  echo "date: $(date -u +%FT%TZ)   dry run: $dry   commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  uname -a
  grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release 2>/dev/null
  ldd --version 2>&1 | head -1
  echo "GPU: $(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)"
  echo "--- nvidia-smi"
  if command -v nvidia-smi >/dev/null; then
    timeout 30 nvidia-smi
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv
  else echo "nvidia-smi: absent"; fi
  echo "--- nvcc"
  "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" --version 2>&1 || echo "nvcc: absent"
  echo "--- toolchain"
  gcc --version 2>&1 | head -1
  cmake --version 2>&1 | head -1
  ninja --version 2>&1 | sed 's/^/ninja /' || true
  for py in python3 /usr/bin/python3; do
    "$py" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>/dev/null && break
  done
  echo "--- cpu, memory, disk"
  lscpu
  free -g
  df -h /tmp | tail -1
} >"$out/env.txt" 2>&1
echo "gpu_check: env.txt written ($(grep -m1 '^GPU:' "$out/env.txt"))"

# ---- unpack the carried packages into a prefix (exports PATH, LD_LIBRARY_PATH, ...)
log=$out/build.log
: >"$log"
s=$(date +%s)
# shellcheck source=bench/gpu/prefix_env.sh
source "$root/bench/gpu/prefix_env.sh"
if ts_prefix_setup "$root/.gpu-debs" "$prefix" >>"$log" 2>&1; then
  phases+=("$(printf '%-10s %6s %6s  %s' unpack 0 "$(($(date +%s) - s))s" "$(find "$root/.gpu-debs" -name '*.deb' | wc -l) packages into $prefix")")
else
  phases+=("$(printf '%-10s %6s %6s  %s' unpack 1 "$(($(date +%s) - s))s" "see build.log")")
  echo "gpu_check: unpacking .gpu-debs failed (build.log); was .gpu-debs carried?" >&2
fi

# The carried Open MPI works here: two local ranks through the prefix's mpirun.
phase mpi 30 "$log" mpirun --oversubscribe -np 2 true

# ---- configure and build
cuda_args=(-DTS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
[ "$dry" = 1 ] && cuda_args=(-DTS_CUDA=OFF)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
nccl_args=() no_nccl=0
if [ "$dry" != 1 ] && ! compgen -G '/usr/local/cuda/lib*/libnccl.so*' >/dev/null &&
  ! compgen -G '/usr/lib/x86_64-linux-gnu/libnccl.so*' >/dev/null; then
  # No system NCCL: PyTorch's wheels carry one (nvidia-nccl-cu13) with its header,
  # somewhere under the `nvidia` namespace package.
  nroot=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
  if [ -n "$nroot" ]; then
    hdr=$(find "$nroot" -name nccl.h -path '*include*' 2>/dev/null | head -1)
    lib=$(find "$nroot" -name 'libnccl.so*' 2>/dev/null | sort | head -1)
    if [ -n "$hdr" ] && [ -n "$lib" ]; then
      nccl_args=(-DNCCL_INCLUDE_DIR="$(dirname "$hdr")" -DNCCL_LIBRARY="$lib")
      libdir=$(dirname "$lib")
      export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
  fi
  [ ${#nccl_args[@]} -eq 0 ] && no_nccl=1
  echo "NCCL: ${nccl_args[*]:-none found (the build goes on without the NCCL backend)}" >>"$out/env.txt"
elif [ "$dry" != 1 ]; then
  echo "NCCL: the system's (beside CUDA or in /usr/lib)" >>"$out/env.txt"
fi
rm -rf "$build"
phase configure 120 "$log" cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  "${cuda_args[@]}" "${nccl_args[@]}" "${TS_PREFIX_CMAKE_ARGS[@]}"
keep=(-k)
[ ${#gen[@]} -gt 0 ] && keep=(-k 0)
# Keep going past a broken file so the benchmark still gets tessera where it can.
phase build 240 "$log" cmake --build "$build" -j "$jobs" -- "${keep[@]}"
if [ ! -x "$build/tessera" ]; then
  echo "gpu_check: no tessera binary after the build (build.log)" >&2
fi

# ---- the gpu tests
# Without NCCL (none beside CUDA, in /usr/lib or in PyTorch's wheels) the build has no
# NCCL backend and test_nccl could only skip: it is left out and the note says so, so
# such a machine can still pass; every other gpu test must run.
if [ -d "$build" ]; then
  exclude=()
  [ "$no_nccl" = 1 ] && exclude=(-E '^test_nccl$')
  phase ctest 180 "$out/ctest_gpu.log" ctest --test-dir "$build" -L gpu "${exclude[@]}" \
    --output-on-failure --timeout 150
  note=$(grep -h -E 'tests passed|No tests were found' "$out/ctest_gpu.log" 2>/dev/null | tail -1)
  [ "$no_nccl" = 1 ] && note+=" (test_nccl left out: no NCCL found)"
  # On the GPU machine a skipped gpu test means the build could not use the GPU (driver
  # or runtime mismatch): CTest counts it as passed, this check must not.
  if [ "$dry" != 1 ] && grep -q -E 'Skipped|Not Run|No tests were found' "$out/ctest_gpu.log"; then
    note+=" SKIPPED OR NOT RUN: the check failed"
    phases[${#phases[@]} - 1]=$(printf '%-10s %6s %6s  %s' ctest skipped - "$note")
  else
    phases[${#phases[@]} - 1]+=" ${note}"
  fi
fi

# ---- the benchmark
if [ -x "$build/tessera" ]; then
  bargs=(--build "$build" --out "$out")
  [ "$dry" = 1 ] && bargs+=(--dry-run)
  phase bench 400 "$out/bench_gpu.log" bash "$root/bench/gpu/bench_gpu.sh" "${bargs[@]}"
else
  phases+=("$(printf '%-10s %6s %6s  %s' bench skip - "no tessera binary")")
fi

# ---- summary.txt (and the same on stdout: the device tool returns the output's tail)
{
  echo "Tessera GPU check, $(date -u +%FT%TZ), $(($(date +%s) - start))s in all (budget ${TS_GPU_CHECK_BUDGET_S:-400}s)$([ "$dry" = 1 ] && echo ', DRY RUN')"
  grep -m1 '^GPU:' "$out/env.txt"
  grep -m1 '^PRETTY_NAME=' "$out/env.txt" | sed 's/^PRETTY_NAME=/OS: /'
  grep -m1 -i 'glibc\|GNU libc' "$out/env.txt" | sed 's/^/libc: /'
  grep -m1 -E 'release [0-9.]+' "$out/env.txt" | sed 's/^/nvcc: /'
  echo
  printf '%-10s %6s %6s  %s\n' phase exit time note
  printf '%s\n' "${phases[@]}"
  echo
  grep -h -E '^(device|bandwidth|gemm_step) ' "$out/gemm_curve.txt" 2>/dev/null
  echo
  cat "$out/bench_table.txt" 2>/dev/null || echo "(no benchmark table: see bench_gpu.log)"
} >"$out/summary.txt"
rm -f "$out/bench_table.txt"
# The device tool takes back at most 8 files of 16 MiB: trim anything large.
for f in "$out"/*; do
  if [ "$(stat -c %s "$f")" -gt $((15 << 20)) ]; then
    tail -c $((15 << 20)) "$f" >"$f.tmp" && mv "$f.tmp" "$f"
  fi
done
cat "$out/summary.txt"
# A phase that did not succeed fails the check, skipped ones included (out of time, no
# binary, skipped tests): a run that tested nothing must not look like a pass. In a dry
# run skips are expected.
if [ "$dry" = 1 ]; then
  bad=$(printf '%s\n' "${phases[@]}" | awk '$2 != "0" && $2 != "skip" && $2 != "-" {n++} END {print n + 0}')
else
  bad=$(printf '%s\n' "${phases[@]}" | awk '$2 != "0" {n++} END {print n + 0}')
fi
exit $((bad > 0))
