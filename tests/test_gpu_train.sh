# One-rank training on the GPU (CTest label "gpu"; skipped, 77, without a CUDA device),
# 20 steps of the tiny config each (tests/lib.sh gpu_common):
# 1. fp32 on the GPU matches the CPU: every step's loss within relative 1e-4 and its
#    gradient norm within 1e-3 (cuBLAS runs without TF32; only the order of sums differs).
# 2. bf16 (GEMMs in bfloat16, fp32 accumulation and master weights) tracks the fp32 GPU
#    run within 2% per step, every step from step 0: step 0 runs the same weights and
#    data, so it is the closest of all (the logits' bf16 rounding only), and the gap grows
#    from there; skipping it would hide nothing and check less. bf16 must also differ
#    from fp32 somewhere (the key is not ignored). A dry run on "cpu-strict" runs the
#    CPU's bf16 tables there (where the CPU has BF16 instructions; tests/test_bf16_train.sh
#    checks them against "cpu").
# 3. parallel.comm = "nccl" with a one-rank communicator gives the losses of "mpi"
#    within 1e-6 (one rank: no collective moves data, but the NCCL communicator is made
#    and every group call goes through it; test_nccl checks every call of the backend).
#    The "mpi" run also repeats the fp32 run of 1 bit for bit (the backend's sums are
#    deterministic).
# 4. Llama (configs/llama-tiny.cfg: RMSNorm, RoPE, grouped-query attention, SwiGLU, an
#    untied head): fp32 on the device matches the CPU as in 1, and bf16 tracks it within
#    2% as in 2.
# TS_GPU_TEST_DEVICE=cpu-strict: a dry run on the CPU (tests/lib.sh gpu_setup) that
# skips the NCCL runs (and bf16 on a CPU without BF16 instructions), saying so.
source "$(dirname "$0")/lib.sh"
gpu_setup

gpu_common
FP32=(--set 'train.precision="fp32"')

# 1. fp32: the GPU against the CPU.
train_on cpu 1 cpu
train_on fp32 1 "$GPU_DEVICE" "${FP32[@]}" &&
  compare_runs "fp32 on $GPU_DEVICE vs cpu" "$TMP/fp32.jsonl" "$TMP/cpu.jsonl" 1e-4 1e-3

# 2. bf16 against fp32 on the same device.
if [ "$GPU_DRY" = 1 ] && ! grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  gpu_skip "bf16 against fp32 within 2% (this CPU has no BF16 instructions)"
elif train_on bf16 1 "$GPU_DEVICE" --set 'train.precision="bf16"'; then
  compare_runs "bf16 vs fp32" "$TMP/bf16.jsonl" "$TMP/fp32.jsonl" 0.02 -
  if cmp -s <(losses "$TMP/bf16.jsonl") <(losses "$TMP/fp32.jsonl"); then
    fail "bf16 gave the fp32 losses bit for bit: train.precision = \"bf16\" changed nothing"
  else pass; fi
  if [ "$GPU_STEPS" -ge 20 ]; then
    awk -v a="$(losses "$TMP/bf16.jsonl" | head -1)" -v b="$(losses "$TMP/bf16.jsonl" | tail -1)" \
      'BEGIN { exit !(b < a - 0.5) }' && pass || fail "bf16 did not train: the loss did not fall by 0.5 in 20 steps"
  else
    skip_case "bf16's loss falling by 0.5 needs 20 steps (a $GPU_STEPS-step dry run)"
  fi
fi

# 3. NCCL on one rank against MPI on one rank.
# The fp32 run again (on one rank "mpi" moves nothing "auto" would not): the same bits.
train_on mpi 1 "$GPU_DEVICE" "${FP32[@]}" --set 'parallel.comm="mpi"' &&
  if cmp -s <(losses "$TMP/mpi.jsonl") <(losses "$TMP/fp32.jsonl") &&
     cmp -s <(norms "$TMP/mpi.jsonl") <(norms "$TMP/fp32.jsonl"); then pass
  else fail "two one-rank fp32 runs on $GPU_DEVICE differ (non-deterministic kernels?)"; fi
if [ "$GPU_DRY" = 1 ]; then
  gpu_skip "parallel.comm = \"nccl\" on one rank (NCCL needs train.device = \"cuda\")"
elif gpu_has_nccl &&
     train_on nccl 1 cuda "${FP32[@]}" --set 'parallel.comm="nccl"'; then
  compare_runs "comm nccl vs mpi (one rank)" "$TMP/nccl.jsonl" "$TMP/mpi.jsonl" 1e-6 1e-6
fi

# 4. Llama: the same comparisons on the other architecture's kernels.
common=(train "$SRC/configs/llama-tiny.cfg" "${common[@]:2}")
train_on llama_cpu 1 cpu
train_on llama_fp32 1 "$GPU_DEVICE" "${FP32[@]}" &&
  compare_runs "llama fp32 on $GPU_DEVICE vs cpu" "$TMP/llama_fp32.jsonl" "$TMP/llama_cpu.jsonl" 1e-4 1e-3
if [ "$GPU_DRY" = 1 ] && ! grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  gpu_skip "llama bf16 against fp32 within 2% (this CPU has no BF16 instructions)"
elif train_on llama_bf16 1 "$GPU_DEVICE" --set 'train.precision="bf16"'; then
  compare_runs "llama bf16 vs fp32" "$TMP/llama_bf16.jsonl" "$TMP/llama_fp32.jsonl" 0.02 -
fi

finish
