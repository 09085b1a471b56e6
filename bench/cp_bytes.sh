#!/usr/bin/env bash
# Bytes context parallelism exchanges per block and position (bench/RESULTS.md 2.10):
# multi-head latent attention's latent against grouped-query attention's K/V, counted
# in the MPI calls themselves. A PMPI shim (compiled here with mpicc, LD_PRELOAD'ed into
# each rank) adds up the send bytes of every fp32 MPI_Allgather (the forward's gather)
# and the receive bytes of every fp32 MPI_Reduce_scatter_block (the backward's
# reduce-scatter) and prints them at MPI_Finalize; the runs are cp 2 alone (no tp, no
# dp: the gradient reduction over the replicas is an all-reduce, not counted; host
# records are MPI_BYTE, not counted). Per block and local position = bytes / (steps *
# blocks * B * T/cp), one micro-batch a step (global_batch = micro_batch). The models:
# the MLA model of test_moe_grids.sh (llama-tiny reshaped: 4 heads, kv_lora 16, rope 8,
# nope 16, v 16) and llama-tiny (4 heads, 2 key/value heads of 32).
# Usage: bench/cp_bytes.sh [STEPS]   (default 3; from anywhere)
#   BUILD=DIR  build directory (default build/)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
steps="${1:-3}"
build="${BUILD:-$root/build}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader

cat >"$tmp/shim.c" <<'C'
#include <mpi.h>
#include <stdio.h>
static unsigned long long gathered, scattered;
int MPI_Allgather(const void *s, int sc, MPI_Datatype st, void *r, int rc, MPI_Datatype rt,
                  MPI_Comm c)
{
    if (st == MPI_FLOAT) gathered += (unsigned long long)sc * 4;
    return PMPI_Allgather(s, sc, st, r, rc, rt, c);
}
int MPI_Reduce_scatter_block(const void *s, void *r, int rc, MPI_Datatype t, MPI_Op op,
                             MPI_Comm c)
{
    if (t == MPI_FLOAT) scattered += (unsigned long long)rc * 4;
    return PMPI_Reduce_scatter_block(s, r, rc, t, op, c);
}
int MPI_Finalize(void)
{
    int rank;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "cp_bytes rank %d gathered %llu scattered %llu\n", rank, gathered, scattered);
    return PMPI_Finalize();
}
C
mpicc -shared -fPIC -O2 -o "$tmp/shim.so" "$tmp/shim.c"
cat /usr/share/games/fortunes/fortunes /usr/share/games/fortunes/literature >"$tmp/corpus.txt"
"$build/tessera" data "$tmp/corpus.txt" "$tmp/train.bin" >/dev/null

mla=(--set model.n_layer=2 --set model.n_embd=64 --set model.n_head=4 --set model.n_kv_head=0
     --set model.ffn_hidden=128 --set model.seq_len=32 --set model.q_lora_rank=32
     --set model.kv_lora_rank=16 --set model.qk_nope_head_dim=16 --set model.qk_rope_head_dim=8
     --set model.v_head_dim=16 --set 'model.rope_type="yarn"' --set model.rope_scaling=4.0
     --set model.rope_original_context=16 --set model.rope_mscale_all_dim=1.0)

# run NAME LAYERS SEQ B SETS...: the rank-0 counts per block and local position.
run() {
  local name="$1" layers="$2" seq="$3" B="$4"; shift 4
  mpirun --oversubscribe -np 2 -x LD_PRELOAD="$tmp/shim.so" "$build/tessera" train \
    configs/llama-tiny.cfg --set "train.steps=$steps" --set "data.train=\"$tmp/train.bin\"" \
    --set 'data.val=""' --set train.threads=1 --set log.progress=false --set parallel.cp=2 \
    --set "parallel.micro_batch=$B" --set "train.global_batch=$B" "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.err"
  grep 'cp_bytes rank 0' "$tmp/$name.err" | awk -v n="$name" -v s="$steps" -v L="$layers" \
    -v T="$seq" -v B="$B" '{ per = s * L * B * T / 2;
      printf "%-10s gathered %8d B (%6.1f per block and position)  reduce-scattered %8d B (%6.1f)\n",
             n, $5, $5 / per, $7, $7 / per }'
}
run mla 2 32 4 "${mla[@]}"
run llama_gqa 4 64 4
