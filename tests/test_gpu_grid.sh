# Several ranks on one GPU (CTest label "gpu"; skipped, 77, without a CUDA device),
# 20 steps of the tiny config each (tests/lib.sh gpu_common), all ranks on the first GPU:
# - through the MPI backend (parallel.comm = "mpi": device memory staged through host
#   buffers), pp = 2 x dp = 2 (4 ranks; also looped-bfs with ZeRO-3) and tp = 2 (2 ranks;
#   also with sequence parallelism, and with tp_overlap 2) and cp = 2 (2 ranks: the
#   context-parallel K/V exchange and the prefix attention kernels)
#   match the one-rank CPU run:
#   loss within relative 1e-4 and gradient norm within 1e-3 every step (the GPU's bound
#   against the CPU, test_gpu_train);
# - the pp = 2 x dp = 2 grid with parallel.comm = "nccl" fails: NCCL cannot put two ranks
#   of a communicator on one GPU, so every rank must stop by itself with a non-zero exit
#   and a message saying so (src/comm/nccl.c: "the nccl comm backend needs one GPU per
#   rank, but world ranks ... all run on GPU 0"), within 90 s (no hang in NCCL's set-up).
# - llama-tiny on tp = 4 (its key/value heads replicated on two ranks each) and on cp = 2
#   matches its one-rank CPU run the same way;
# TS_GPU_TEST_DEVICE=cpu-strict: a dry run on the CPU that skips the NCCL grid, saying
# so, and checks the same failure mechanics on the refusal of "nccl" off the GPU.
source "$(dirname "$0")/lib.sh"
gpu_setup

# One GPU for every rank, even on a machine with more: the first one this job may use.
first="${CUDA_VISIBLE_DEVICES:-0}"
export CUDA_VISIBLE_DEVICES="${first%%,*}"

gpu_common
common+=(--set 'train.precision="fp32"')
MPI=(--set 'parallel.comm="mpi"')
PP2DP2=(--set parallel.pp=2 --set parallel.dp=2)

train_on cpu 1 cpu
train_on pp2dp2 4 "$GPU_DEVICE" "${MPI[@]}" "${PP2DP2[@]}" &&
  compare_runs "pp2 x dp2 on one $GPU_DEVICE device (mpi) vs 1-rank cpu" "$TMP/pp2dp2.jsonl" "$TMP/cpu.jsonl" 1e-4 1e-3
# ZeRO-3 across the pipeline (Breadth-First): chunk buffers allocated, gathered and freed
# in device memory every step, the gathers staged through the host by the MPI backend.
train_on zero3 4 "$GPU_DEVICE" "${MPI[@]}" "${PP2DP2[@]}" --set parallel.virtual_stages=2 \
  --set 'parallel.schedule="looped-bfs"' --set parallel.micro_batch=2 --set parallel.zero=3 &&
  compare_runs "pp2 x dp2 looped-bfs ZeRO-3 on one $GPU_DEVICE device (mpi) vs 1-rank cpu" \
    "$TMP/zero3.jsonl" "$TMP/cpu.jsonl" 1e-4 1e-3
train_on tp2 2 "$GPU_DEVICE" "${MPI[@]}" --set parallel.tp=2 &&
  compare_runs "tp2 on one $GPU_DEVICE device (mpi) vs 1-rank cpu" "$TMP/tp2.jsonl" "$TMP/cpu.jsonl" 1e-4 1e-3
# Sequence parallelism: its reduce-scatters and all-gathers on device buffers.
train_on tp2_sp 2 "$GPU_DEVICE" "${MPI[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true &&
  compare_runs "tp2 sequence-parallel on one $GPU_DEVICE device (mpi) vs 1-rank cpu" \
    "$TMP/tp2_sp.jsonl" "$TMP/cpu.jsonl" 1e-4 1e-3
# tp_overlap: sub-batches' collectives in flight (non-blocking, staged) with sp.
train_on tp2_sp_overlap 2 "$GPU_DEVICE" "${MPI[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set parallel.tp_overlap=2 &&
  compare_runs "tp2 sp + tp_overlap 2 on one $GPU_DEVICE device (mpi) vs 1-rank cpu" \
    "$TMP/tp2_sp_overlap.jsonl" "$TMP/cpu.jsonl" 1e-4 1e-3
# Context parallelism: the K/V columns packed (memcpy_2d), all-gathered and permuted on
# device buffers, the prefix attention kernels (CUDA's batched-GEMM ones on a GPU), dK/dV
# reduce-scattered back.
train_on cp2 2 "$GPU_DEVICE" "${MPI[@]}" --set parallel.cp=2 &&
  compare_runs "cp2 on one $GPU_DEVICE device (mpi) vs 1-rank cpu" "$TMP/cp2.jsonl" "$TMP/cpu.jsonl" \
    1e-4 1e-3
# Llama with tp = 4 > n_kv_head = 2 (each key/value head on two ranks, their gradients
# summed over the kv group) against its one-rank CPU run; cp 2 with its grouped K/V.
llama=(train "$SRC/configs/llama-tiny.cfg" "${common[@]:2}")
saved=("${common[@]}")
common=("${llama[@]}")
train_on llama_cpu 1 cpu
train_on llama_tp4 4 "$GPU_DEVICE" "${MPI[@]}" --set parallel.tp=4 &&
  compare_runs "llama tp4 on one $GPU_DEVICE device (mpi) vs 1-rank cpu" "$TMP/llama_tp4.jsonl" \
    "$TMP/llama_cpu.jsonl" 1e-4 1e-3
train_on llama_cp2 2 "$GPU_DEVICE" "${MPI[@]}" --set parallel.cp=2 &&
  compare_runs "llama cp2 on one $GPU_DEVICE device (mpi) vs 1-rank cpu" "$TMP/llama_cp2.jsonl" \
    "$TMP/llama_cpu.jsonl" 1e-4 1e-3
common=("${saved[@]}")

if [ "$GPU_DRY" = 1 ]; then
  gpu_skip "pp2 x dp2 with parallel.comm = \"nccl\" on one GPU must fail (NCCL needs train.device = \"cuda\");" \
    "checked the same failure mechanics on \"nccl\" refused for train.device = \"$GPU_DEVICE\""
  expect_fail_every_rank 4 'parallel\.comm.*nccl' "${common[@]}" --set "train.device=\"$GPU_DEVICE\"" \
    --set 'parallel.comm="nccl"' "${PP2DP2[@]}"
elif gpu_has_nccl; then
  expect_fail_every_rank 4 'nccl.*one GPU per rank' "${common[@]}" --set 'train.device="cuda"' \
    --set 'parallel.comm="nccl"' "${PP2DP2[@]}"
fi
finish
