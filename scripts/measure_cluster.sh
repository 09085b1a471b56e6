#!/usr/bin/env bash
# Measure this machine and write its cluster description for `tessera plan --cluster`
# (the format of configs/clusters/*.cfg). One "device" is one rank, and one rank runs
# on one core, so:
#   devices_per_node      RANKS_PER_NODE (default: the cores, nproc)
#   memory_gb             MemTotal / devices_per_node
#   memory_bandwidth_gbs  one rank's share of a STREAM-like copy (bench_stream): the
#                         smaller of one thread's rate and the node's rate with one
#                         thread per rank divided by the ranks
#   peak_tflops.fp32      the best single-thread sgemm rate of the sweep below
#   gemm_efficiency       single-thread sgemm rate at n = 64 ... 2048 (bench_gemm_curve)
#                         over that peak
#   intra_node            a 2-rank MPI ping-pong (bench_pingpong): one-way latency of
#                         8 bytes, and message bytes / one-way time, the best size
#   inter_node            the same figures: a single machine has no network
# Each measurement runs TRIES times (default 2) and the best run counts; the spread and
# the machine's CPU load are written into `source` with the date and the commands.
# Takes about a minute on 2 cores. Usage:
#   scripts/measure_cluster.sh [BUILD_DIR] [OUT.cfg]
#   (default build/ and configs/clusters/this-machine.cfg; the benchmarks must be built:
#    cmake --build BUILD_DIR --target bench_stream bench_gemm_curve bench_pingpong)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
out="${2:-$root/configs/clusters/this-machine.cfg}"
ranks="${RANKS_PER_NODE:-$(nproc)}"
tries="${TRIES:-2}"

for b in bench_stream bench_gemm_curve bench_pingpong; do
  if [ ! -x "$build/bench/$b" ]; then
    echo "measure_cluster: $build/bench/$b is missing; build it with" >&2
    echo "  cmake --build $build --target bench_stream bench_gemm_curve bench_pingpong" >&2
    exit 1
  fi
done
case "$ranks" in ''|*[!0-9]*|0) echo "measure_cluster: RANKS_PER_NODE=$ranks is not a positive integer" >&2; exit 1 ;; esac
case "$tries" in ''|*[!0-9]*|0) echo "measure_cluster: TRIES=$tries is not a positive integer" >&2; exit 1 ;; esac
command -v python3 >/dev/null || { echo "measure_cluster: needs python3 (scripts/setup.sh python3)" >&2; exit 1; }

source "$root/bench/lib_parallel.sh"   # cpu_busy
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1   # one core per rank
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The commands, as `source` records them (relative to the build directory).
cmd_stream1="bench/bench_stream 1 --json"
cmd_streamn="bench/bench_stream $ranks --json"
cmd_gemm="bench/bench_gemm_curve 1 --json"
cmd_pp="mpirun --oversubscribe -np 2 bench/bench_pingpong --max-mb 16 --json"

busy_before="$(cpu_busy)"
start=$SECONDS
for ((t = 1; t <= tries; t++)); do
  echo "measure_cluster: run $t of $tries" >&2
  (cd "$build" && $cmd_stream1) >>"$tmp/stream1"
  (cd "$build" && $cmd_streamn) >>"$tmp/streamn"
  (cd "$build" && $cmd_gemm) >>"$tmp/gemm"
  (cd "$build" && $cmd_pp) >>"$tmp/pp"
done
busy_after="$(cpu_busy)"
elapsed=$((SECONDS - start))

mem_kb="$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)"
cpu="$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
mkdir -p "$(dirname "$out")"
python3 - "$tmp" "$out" "$ranks" "$tries" "$mem_kb" "${cpu:-unknown CPU}" "$(date -u +%Y-%m-%dT%H:%MZ)" \
  "$busy_before" "$busy_after" "$elapsed" "$cmd_stream1" "$cmd_streamn" "$cmd_gemm" "$cmd_pp" <<'EOF'
import json, sys, textwrap
(tmp, out, ranks, tries, mem_kb, cpu, date, busy0, busy1, elapsed,
 c_s1, c_sn, c_gemm, c_pp) = sys.argv[1:]
ranks, tries, mem_kb = int(ranks), int(tries), int(mem_kb)

def runs(name):
    with open(f"{tmp}/{name}") as f:
        return [json.loads(line) for line in f if line.strip()]

s1 = [r["copy_gbs"] for r in runs("stream1")]
sn = [r["copy_gbs"] for r in runs("streamn")]
gemm = runs("gemm")
pp = runs("pp")
sizes = [n for n, _ in gemm[0]["points"]]
rate = {n: max(dict(r["points"])[n] for r in gemm) for n in sizes}
peak = max(rate.values())                       # GFLOP/s
eff = [(n, max(0.001, round(rate[n] / peak, 3))) for n in sizes]
bw_rank = min(max(s1), max(sn) / ranks)
lat = min(r["latency_us"] for r in pp)
link = max(r["bandwidth_gbs"] for r in pp)
link_at = max(pp, key=lambda r: r["bandwidth_gbs"])["at_bytes"]
mem_gb = mem_kb * 1024 / 1e9 / ranks

def spread(xs, fmt="%.2f"):
    return (fmt % min(xs)) + ".." + (fmt % max(xs))

source = (
    f"Measured by scripts/measure_cluster.sh on {date} (UTC), {elapsed} s, {tries} runs of each "
    f"benchmark, best run kept; CPU {cpu}, OpenBLAS core {gemm[0]['core']}; machine CPU busy "
    f"{busy0}% before and {busy1}% after (other work on the cores lowers every figure). "
    f"One device = one rank on one core; devices_per_node = {ranks}. "
    f"memory_gb: MemTotal {mem_kb} kB / {ranks} ranks. "
    f"memory_bandwidth_gbs: `{c_s1}` (copy of 256 MiB arrays, 2 x array bytes / time) gave "
    f"{spread(s1)} GB/s; `{c_sn}` gave {spread(sn)} GB/s for the node, / {ranks} = "
    f"{max(sn) / ranks:.2f} per rank; the smaller of the two bests is used. "
    f"peak_tflops.fp32: the best single-thread sgemm rate of `{c_gemm}` (C = A B^T, row-major), "
    f"{peak:.1f} GFLOP/s, at n = {max(rate, key=rate.get)}; gemm_efficiency = rate(n) / that peak; "
    f"rates in GFLOP/s (min..max over runs): "
    + ", ".join(f"n={n}: {spread([dict(r['points'])[n] for r in gemm], '%.1f')}" for n in sizes)
    + f". intra_node: `{c_pp}` between 2 ranks through Open MPI's shared memory: one-way "
    f"latency of 8 bytes (median of 1000 round trips / 2) {spread([r['latency_us'] for r in pp], '%.3f')} us, "
    f"bandwidth = message bytes / one-way time, best size {link_at} bytes, "
    f"{spread([r['bandwidth_gbs'] for r in pp])} GB/s (a point-to-point figure, no all-reduce "
    f"conversion). inter_node: this is one machine with no network, so the intra-node figures "
    f"are repeated.")

lines = textwrap.wrap(source, 84, break_long_words=False, break_on_hyphens=False,
                      drop_whitespace=False)
assert "".join(lines) == source
src = "\n".join('    "' + l.replace('"', "'") + '"' for l in lines)
table = ", ".join(f"({n}, {e:.3f})" for n, e in eff)
text = f"""# This machine, measured by scripts/measure_cluster.sh (do not edit by hand: rerun it).
# One device = one MPI rank on one core; the figures and how they were measured are in
# `source`.
cluster = {{
  name = "this machine ({cpu}, {ranks} ranks of one core)";
  source =
{src};
  devices_per_node = {ranks};
  device = {{
    name = "one core of {cpu}";
    memory_gb = {mem_gb:.2f};
    memory_bandwidth_gbs = {bw_rank:.2f};
    peak_tflops = {{ fp32 = {peak / 1000:.5f}; }};
    compute_dtype = "fp32";
    # achieved / peak for an n x n x n sgemm, one thread
    gemm_efficiency = ( {table} );
  }};
  intra_node = {{ bandwidth_gbs = {link:.3f}; latency_us = {lat:.3f}; }};
  inter_node = {{ bandwidth_gbs = {link:.3f}; latency_us = {lat:.3f}; }};   # no network: = intra
}};
"""
with open(out, "w") as f:
    f.write(text)
print(f"measure_cluster: wrote {out}: {ranks} devices of {mem_gb:.2f} GB, {bw_rank:.2f} GB/s, "
      f"fp32 peak {peak:.1f} GFLOP/s, link {link:.2f} GB/s / {lat:.2f} us ({elapsed} s)",
      file=sys.stderr)
EOF
