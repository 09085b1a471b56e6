#!/usr/bin/env bash
# Bytes the data-parallel group moves per optimizer step under Muon against AdamW
# (docs/ARCHITECTURE.md "Muon: distributed"), counted in the MPI calls themselves: a PMPI
# shim (compiled here with mpicc, LD_PRELOAD'ed into each rank) adds up, per rank, the
# fp32 elements of every all-reduce (MPI_Allreduce, MPI_Iallreduce), reduce-scatter
# (MPI_Ireduce_scatter: the bucket's floats) and all-gather (MPI_Iallgatherv: the floats
# this rank receives, every piece but its own) and prints them at MPI_Finalize. Host
# records are MPI_DOUBLE / MPI_INT / MPI_BYTE and not counted. Bytes on the wire of a ring
# (Open MPI's large-message algorithms): all-reduce 2(n-1)/n of its floats, reduce-scatter
# (n-1)/n, an all-gather what it receives. Also the Newton-Schulz balance: the most
# loaded member's summed ts_muon_ns_cost over the mean (the log line "muon owners").
# The model: a GPT-2-124M-shaped Llama (12 layers, 768 wide, 12 heads, SwiGLU 2048,
# vocabulary 50304), one sequence of 64 tokens per replica, STEPS steps, dp 2 and dp 4
# (ZeRO-0 and ZeRO-1; 4 MiB buckets).
# Usage: bench/muon_bytes.sh [STEPS]   (default 2; from anywhere)
#   BUILD=DIR  build directory (default build/)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
steps="${1:-2}"
build="${BUILD:-$root/build}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader

cat >"$tmp/shim.c" <<'C'
#include <mpi.h>
#include <stdio.h>
static unsigned long long reduced, scattered, gathered;
int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{
    if (t == MPI_FLOAT) reduced += (unsigned long long)n;
    return PMPI_Allreduce(s, r, n, t, op, c);
}
int MPI_Iallreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                   MPI_Request *q)
{
    if (t == MPI_FLOAT) reduced += (unsigned long long)n;
    return PMPI_Iallreduce(s, r, n, t, op, c, q);
}
int MPI_Ireduce_scatter(const void *s, void *r, const int *counts, MPI_Datatype t, MPI_Op op,
                        MPI_Comm c, MPI_Request *q)
{
    int size;
    PMPI_Comm_size(c, &size);
    if (t == MPI_FLOAT)
        for (int i = 0; i < size; i++) scattered += (unsigned long long)counts[i];
    return PMPI_Ireduce_scatter(s, r, counts, t, op, c, q);
}
int MPI_Iallgatherv(const void *s, int sc, MPI_Datatype st, void *r, const int *counts,
                    const int *displs, MPI_Datatype rt, MPI_Comm c, MPI_Request *q)
{
    int size, me;
    PMPI_Comm_size(c, &size);
    PMPI_Comm_rank(c, &me);
    if (rt == MPI_FLOAT)
        for (int i = 0; i < size; i++)
            if (i != me) gathered += (unsigned long long)counts[i];
    return PMPI_Iallgatherv(s, sc, st, r, counts, displs, rt, c, q);
}
int MPI_Finalize(void)
{
    int rank;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "muon_bytes rank %d reduced %llu scattered %llu gathered %llu\n", rank,
            reduced, scattered, gathered);
    return PMPI_Finalize();
}
C
mpicc -shared -fPIC -O2 -o "$tmp/shim.so" "$tmp/shim.c"
cat /usr/share/games/fortunes/fortunes /usr/share/games/fortunes/literature >"$tmp/corpus.txt"
"$build/tessera" data "$tmp/corpus.txt" "$tmp/train.bin" >/dev/null

model=(--set model.n_layer=12 --set model.n_embd=768 --set model.n_head=12 --set model.n_kv_head=12
       --set model.ffn_hidden=2048 --set model.vocab_size=50304 --set model.seq_len=64)

# run OPTIMIZER DP ZERO: rank 0's floats per step, in MB on the wire of a ring.
run() {
  local opt="$1" dp="$2" zero="$3"
  mpirun --oversubscribe -np "$dp" -x LD_PRELOAD="$tmp/shim.so" "$build/tessera" train \
    configs/llama-tiny.cfg "${model[@]}" --set "train.steps=$steps" \
    --set "data.train=\"$tmp/train.bin\"" --set 'data.val=""' --set train.threads=1 \
    --set 'log.metrics=""' --set parallel.micro_batch=1 \
    --set "train.global_batch=$dp" --set "parallel.dp=$dp" --set "parallel.zero=$zero" \
    --set "train.optimizer=\"$opt\"" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
  local bal
  bal=$(grep -o 'muon owners.*' "$tmp/err" | head -1 || true)
  grep 'muon_bytes rank 0' "$tmp/err" | awk -v o="$opt" -v n="$dp" -v z="$zero" -v s="$steps" -v b="$bal" '{
      f = (n - 1) / n; ar = $5 / s; rs = $7 / s; ag = $9 / s
      wire = (2 * f * ar + f * rs + ag) * 4 / 1e6
      printf "%-5s dp %d zero %d: all-reduce %6.2f M floats, reduce-scatter %6.2f M, all-gather received %6.2f M; %7.1f MB a step on the wire  %s\n",
             o, n, z, ar / 1e6, rs / 1e6, ag / 1e6, wire, b }'
}
echo "GPT-2-124M-shaped Llama, per rank and optimizer step ($steps steps averaged)"
for dp in 2 4; do
  for zero in 0 1; do
    run adamw "$dp" "$zero"
    run muon "$dp" "$zero"
  done
done
