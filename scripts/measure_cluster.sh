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
#   elementwise_ns        one thread's ns per element of GELU forward / backward
#                         (bench_elementwise at ELEM_SHAPE, default "256 256": N C):
#                         exp makes it compute-bound on a CPU, which a memory pass would
#                         miss (LayerNorm is timed too, and recorded: it is not)
#   intra_node            fitted to 2-rank all-reduce times (bench_allreduce, median of
#                         AR_REPS, default 50) at AR_SIZES floats (default 4096 32768
#                         65536 1048576): 16, 128 and 256 KiB, tp's activation
#                         all-reduces in small configs, as one blocking MPI_Allreduce;
#                         4 MiB, one dp gradient bucket (parallel.bucket_mb's default),
#                         as the trainer's sync issues it: MPI_Iallreduce in buckets.
#                         (Open MPI's blocking call changes algorithm near 1 MiB, where
#                         it took longer here than at 4 MiB.) t(S) = alpha + S / beta,
#                         least squares on relative error. The planner's ring prices an
#                         all-reduce over 2 ranks as S / bandwidth + 2 latency, so
#                         bandwidth_gbs = beta and latency_us = alpha / 2: what tp and dp
#                         pay per all-reduce here, Open MPI's collective overhead
#                         included (~50x a ping-pong's one-way latency, recorded in
#                         `source` for reference)
#   inter_node            the same figures: a single machine has no network
#   overlap_comm = false  MPI progresses the reductions on the cores that compute, so
#                         nothing hides behind compute (measured: bench/RESULTS.md,
#                         "Data parallelism")
# Each measurement runs TRIES times (default 2) and the best run counts; the spread and
# the machine's CPU load are written into `source` with the date and the commands.
# Takes about 20 s on 2 cores (TRIES=3). Usage:
#   scripts/measure_cluster.sh [BUILD_DIR] [OUT.cfg]
#   (default build/ and configs/clusters/this-machine.cfg; the benchmarks must be built:
#    cmake --build BUILD_DIR --target bench_stream bench_gemm_curve bench_pingpong
#    bench_allreduce bench_elementwise)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
out="${2:-$root/configs/clusters/this-machine.cfg}"
ranks="${RANKS_PER_NODE:-$(nproc)}"
tries="${TRIES:-2}"
ar_sizes="${AR_SIZES:-4096 32768 65536 1048576}"
ar_reps="${AR_REPS:-50}"
elem_shape="${ELEM_SHAPE:-256 256}"

benches="bench_stream bench_gemm_curve bench_pingpong bench_allreduce bench_elementwise"
for b in $benches; do
  if [ ! -x "$build/bench/$b" ]; then
    echo "measure_cluster: $build/bench/$b is missing; build it with" >&2
    echo "  cmake --build $build --target $benches" >&2
    exit 1
  fi
done
case "$ranks" in ''|*[!0-9]*|0) echo "measure_cluster: RANKS_PER_NODE=$ranks is not a positive integer" >&2; exit 1 ;; esac
case "$tries" in ''|*[!0-9]*|0) echo "measure_cluster: TRIES=$tries is not a positive integer" >&2; exit 1 ;; esac
case "$ar_reps" in ''|*[!0-9]*|0) echo "measure_cluster: AR_REPS=$ar_reps is not a positive integer" >&2; exit 1 ;; esac
n_sizes=0
for n in $ar_sizes; do
  case "$n" in ''|*[!0-9]*|0) echo "measure_cluster: AR_SIZES holds '$n', not a positive number of floats" >&2; exit 1 ;; esac
  n_sizes=$((n_sizes + 1))
done
[ "$n_sizes" -ge 2 ] || { echo "measure_cluster: AR_SIZES needs at least two sizes to fit latency and bandwidth" >&2; exit 1; }
for n in $elem_shape; do
  case "$n" in ''|*[!0-9]*|0) echo "measure_cluster: ELEM_SHAPE='$elem_shape' must be two positive numbers: N C" >&2; exit 1 ;; esac
done
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
cmd_ar="mpirun --oversubscribe -np 2 bench/bench_allreduce FLOATS $ar_reps --json"
cmd_elem="bench/bench_elementwise $elem_shape --json"

busy_before="$(cpu_busy)"
start=$SECONDS
for ((t = 1; t <= tries; t++)); do
  echo "measure_cluster: run $t of $tries" >&2
  (cd "$build" && $cmd_stream1) >>"$tmp/stream1"
  (cd "$build" && $cmd_streamn) >>"$tmp/streamn"
  (cd "$build" && $cmd_gemm) >>"$tmp/gemm"
  (cd "$build" && $cmd_pp) >>"$tmp/pp"
  for n in $ar_sizes; do (cd "$build" && ${cmd_ar/FLOATS/$n}) >>"$tmp/ar"; done
  (cd "$build" && $cmd_elem) >>"$tmp/elem"
done
busy_after="$(cpu_busy)"
elapsed=$((SECONDS - start))

mem_kb="$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)"
cpu="$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
mkdir -p "$(dirname "$out")"
python3 - "$tmp" "$out" "$ranks" "$tries" "$mem_kb" "${cpu:-unknown CPU}" "$(date -u +%Y-%m-%dT%H:%MZ)" \
  "$busy_before" "$busy_after" "$elapsed" "$cmd_stream1" "$cmd_streamn" "$cmd_gemm" "$cmd_pp" \
  "$cmd_ar" "$cmd_elem" <<'EOF'
import json, sys, textwrap
(tmp, out, ranks, tries, mem_kb, cpu, date, busy0, busy1, elapsed,
 c_s1, c_sn, c_gemm, c_pp, c_ar, c_elem) = sys.argv[1:]
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
link_at = max(pp, key=lambda r: r["bandwidth_gbs"])["at_bytes"]
mem_gb = mem_kb * 1024 / 1e9 / ranks

# All-reduce: the best median per size over the tries, then t = alpha + S / beta by
# least squares on relative error (weights 1 / t^2), so small and large sizes count alike.
# A size of a whole gradient bucket (4 MiB, parallel.bucket_mb's default) or more counts
# as the trainer's dp sync issues it: MPI_Iallreduce in 4 MiB buckets (bench_allreduce's
# bucketed time, ~2x the blocking call's here); smaller ones as tp's blocking MPI_Allreduce.
ar = {}
for r in runs("ar"):
    key = "bucketed_median_ms" if r["bytes"] >= r["bucket_mb"] * 1048576 else "median_ms"
    ar.setdefault(r["bytes"], []).append(r[key] * 1e-3)
ar_t = {s: min(ts) for s, ts in ar.items()}
sw = sx = sy = sxx = sxy = 0.0
for s, t in ar_t.items():
    w = 1.0 / (t * t)
    sw += w; sx += w * s; sy += w * t; sxx += w * s * s; sxy += w * s * t
slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
alpha = (sy - slope * sx) / sw
if not (slope > 0 and alpha > 0):
    sys.exit("measure_cluster: the all-reduce times %s do not fit t = alpha + S / beta with "
             "both positive (a busy machine? rerun when it is quiet)" % ar_t)
beta = 1.0 / slope                               # bytes/s
fit_err = max(abs(alpha + s / beta - t) / t for s, t in ar_t.items())
ar_lat_us, ar_bw_gbs = alpha / 2 * 1e6, beta / 1e9

# Elementwise kernels: the best (smallest) of the tries.
elem = runs("elem")
gelu_f = min(r["gelu_forward_ns"] for r in elem)
gelu_b = min(r["gelu_backward_ns"] for r in elem)

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
    + f". elementwise_ns.gelu: `{c_elem}` (one thread; N x 4C activations), ns per element "
    f"forward {spread([r['gelu_forward_ns'] for r in elem], '%.3f')}, backward "
    f"{spread([r['gelu_backward_ns'] for r in elem], '%.3f')}, the best kept (a memory pass "
    f"would be {8 / bw_rank:.3f} and {16 / bw_rank:.3f}); LayerNorm (N x C) forward "
    f"{min(r['layernorm_forward_ns'] for r in elem):.3f}, backward "
    f"{min(r['layernorm_backward_ns'] for r in elem):.3f} ns, no more than a memory pass "
    f"({8 / bw_rank:.3f}, {16 / bw_rank:.3f}), so it has no key. "
    f"intra_node: fitted to 2-rank all-reduces through Open MPI's shared memory, `{c_ar}` "
    f"for FLOATS = " + ", ".join(str(int(s) // 4) for s in sorted(ar_t)) + ": median times "
    + ", ".join(f"{int(s)} B: {spread([t * 1e6 for t in ar[s]], '%.1f')} us" for s in sorted(ar_t))
    + f" (min..max over runs; the best kept; 4 MiB and up: the bucketed MPI_Iallreduce "
    f"time, as the trainer's dp sync issues them, the rest one blocking MPI_Allreduce as tp "
    f"issues them); t(S) = alpha + S / beta, least squares on relative "
    f"error: alpha = {alpha * 1e6:.2f} us, beta = {beta / 1e9:.2f} GB/s (worst point off by "
    f"{100 * fit_err:.0f}%). The planner's ring all-reduce over 2 ranks costs S / bandwidth + "
    f"2 x latency, so bandwidth_gbs = beta and latency_us = alpha / 2. For reference, `{c_pp}` "
    f"gives a one-way latency of 8 bytes of {spread([r['latency_us'] for r in pp], '%.3f')} us "
    f"and {spread([r['bandwidth_gbs'] for r in pp])} GB/s point to point (best size {link_at} "
    f"bytes): the collective's own overhead dominates small all-reduces. inter_node: this is "
    f"one machine with no network, so the intra-node figures are repeated. overlap_comm = "
    f"false: MPI progresses reductions on the cores that compute (bench/RESULTS.md, 'Data "
    f"parallelism'), so the planner hides nothing behind compute.")

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
    # compute-bound elementwise kernels: ns per element, [forward, backward]
    elementwise_ns = {{ gelu = [{gelu_f:.4f}, {gelu_b:.4f}]; }};
  }};
  # fitted to 2-rank all-reduces: bandwidth = beta, latency = alpha / 2 (see source)
  intra_node = {{ bandwidth_gbs = {ar_bw_gbs:.3f}; latency_us = {ar_lat_us:.3f}; }};
  inter_node = {{ bandwidth_gbs = {ar_bw_gbs:.3f}; latency_us = {ar_lat_us:.3f}; }};   # no network: = intra
  overlap_comm = false;   # MPI runs on the compute cores
  host_collectives = true; # MPI on host memory: its gradient reductions keep copies
}};
"""
with open(out, "w") as f:
    f.write(text)
print(f"measure_cluster: wrote {out}: {ranks} devices of {mem_gb:.2f} GB, {bw_rank:.2f} GB/s, "
      f"fp32 peak {peak:.1f} GFLOP/s, GELU {gelu_f:.2f} / {gelu_b:.2f} ns per element, "
      f"link {ar_bw_gbs:.2f} GB/s / {ar_lat_us:.2f} us ({elapsed} s)",
      file=sys.stderr)
EOF
