# Sub-pipelined tensor parallelism (parallel.tp_overlap, Merak): each block runs on 2 or
# 4 sub-batches of a micro-batch, a sub-batch's all-reduce (or, with sequence
# parallelism, reduce-scatter and all-gather) in flight while the next one computes. On
# tp 2, with and without sequence parallelism, on pp 2 with zb-h1 (the weight pass
# gathers per sub-batch), with selective recompute, dp 2 with ZeRO-3, and Llama on tp 4
# (replicated key/value heads) it gives the one-rank losses within relative 1e-4 (8 steps); a
# rerun is bit for bit. tp = 1, or a micro-batch that tp_overlap does not divide, is a
# clear error.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
# 8 steps; 4 under the sanitizers (TS_TEST_SWEEP_STEPS, tests/CMakeLists.txt). Sub-batches
# change only the order and the shape of the work inside a step, on layouts whose 20 steps
# test_tp_invariance, test_sp_invariance and test_llama_grid check (tp 2 and 4, with sp,
# pp 2 x tp 2, tp 2 x dp 2 with ZeRO-3): every step runs that whole step again, so 8
# steps check it as 20 do (test_pp_invariance's argument; CI time, docs/CI.md).
steps="${TS_TEST_SWEEP_STEPS:-8}"
steps=$((steps < 8 ? steps : 8))
common=(train "$SRC/configs/tiny.cfg" --set "train.steps=$steps" --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false)
sp=(--set parallel.sequence_parallel=true)

check ref 1
check ov2_tp2 2 --set parallel.tp=2 --set parallel.tp_overlap=2
check ov4_tp2 2 --set parallel.tp=2 --set parallel.tp_overlap=4
check ov2_tp2_sp 2 --set parallel.tp=2 --set parallel.tp_overlap=2 "${sp[@]}"
check ov4_tp2_sp 2 --set parallel.tp=2 --set parallel.tp_overlap=4 "${sp[@]}"
check ov2_pp2_tp2_zbh1_sp 4 --set parallel.pp=2 --set parallel.tp=2 --set parallel.schedule=zb-h1 \
  --set parallel.tp_overlap=2 "${sp[@]}"
check ov2_tp2_selective 2 --set parallel.tp=2 --set parallel.tp_overlap=2 \
  --set parallel.recompute=selective
check ov2_tp2_dp2_zero3_sp 4 --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=3 \
  --set parallel.micro_batch=2 --set parallel.tp_overlap=2 "${sp[@]}"

release_only "tp_overlap = 4 with sequence parallelism run twice, bit for bit" || {
  check ov4_tp2_sp_again 2 --set parallel.tp=2 --set parallel.tp_overlap=4 "${sp[@]}"
  if cmp -s <(losses "$TMP/ov4_tp2_sp.jsonl") <(losses "$TMP/ov4_tp2_sp_again.jsonl"); then pass
  else fail "tp_overlap = 4 with sequence parallelism run twice is not bit-identical"; fi
}

# Llama: RMSNorm, RoPE per sub-batch, key/value heads replicated on tp 4.
mv "$TMP/ref.jsonl" "$TMP/ref_gpt2.jsonl"
common=(train "$SRC/configs/llama-tiny.cfg" "${common[@]:2}")
check ref 1
check llama_ov2_tp4_sp 4 --set parallel.tp=4 --set parallel.tp_overlap=2 "${sp[@]}"

expect_error 0 "parallel.tp_overlap = 2 needs parallel.tp >= 2" "${common[@]}" \
  --set parallel.tp_overlap=2
expect_error 2 "parallel.tp_overlap = 4 needs parallel.micro_batch = 2 to divide by it" \
  "${common[@]}" --set parallel.tp=2 --set parallel.tp_overlap=4 --set parallel.micro_batch=2
finish
