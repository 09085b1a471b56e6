# Grid invariance for the Llama architecture (configs/llama-tiny.cfg: RMSNorm, 4 query
# and 2 key/value heads, rotary embeddings, SwiGLU, an untied head): data, pipeline
# (every schedule, interleaved, recompute; selective on tp 2), tensor parallelism (also
# with sequence parallelism) with
# the key/value heads split (tp = 2) and replicated (tp = 4 > n_kv_head: each head on 2 ranks, its gradient
# summed over them), ZeRO-1 and ZeRO-3, a 3D grid and multi-query attention all give the one-rank
# losses within relative 1e-4 for 8 steps; reruns are bit-identical. A tied Llama
# (tie_embeddings, as Llama 3.2) across a pipeline too. Llama-only keys on gpt2 and bad
# head counts are clear errors. model.head_dim other than n_embd / n_head (Qwen3's) on tp with
# sequence parallelism.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
common=(train "$SRC/configs/llama-tiny.cfg" --set train.steps=8 --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false)

check ref 1
check dp2 2 --set parallel.dp=2
for sched in gpipe 1f1b zb-h1; do
  check "pp2_$sched" 2 --set parallel.pp=2 --set parallel.schedule="$sched"
done
check pp2_v2_interleaved 2 --set parallel.pp=2 --set parallel.virtual_stages=2 \
  --set parallel.schedule=interleaved-1f1b
check pp2_recompute_full 2 --set parallel.pp=2 --set parallel.recompute=full
# Selective recompute rebuilds grouped-query attention from the rotated q and k it kept.
check tp2_selective 2 --set parallel.tp=2 --set parallel.recompute=selective
check tp2 2 --set parallel.tp=2
check tp4_kv_replicated 4 --set parallel.tp=4
# Sequence parallelism: RMSNorm's rows split over tp, with the key/value heads split
# (tp 2) and replicated (tp 4), and on a pipeline whose weight pass gathers again.
check tp2_sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
check tp4_kv_replicated_sp 4 --set parallel.tp=4 --set parallel.sequence_parallel=true
check pp2_tp2_zb_sp 4 --set parallel.pp=2 --set parallel.tp=2 --set parallel.schedule=zb-h1 \
  --set parallel.sequence_parallel=true
# ZeRO-3: the replicated key/value weights' group sums run on chunk buffers held to
# the step's end; ZeRO-1 on the 3D grid.
check tp4_kv_replicated_zero3 8 --set parallel.tp=4 --set parallel.dp=2 --set parallel.zero=3 \
  --set parallel.micro_batch=2
check pp2_dp2_tp2_zero1 8 --set parallel.pp=2 --set parallel.dp=2 --set parallel.tp=2 \
  --set parallel.micro_batch=2 --set parallel.zero=1
check pp2_tp4_zb 8 --set parallel.pp=2 --set parallel.tp=4 --set parallel.schedule=zb-h1

check tp4_again 4 --set parallel.tp=4
if cmp -s <(losses "$TMP/tp4_kv_replicated.jsonl") <(losses "$TMP/tp4_again.jsonl"); then pass
else fail "tp=4 (replicated key/value heads) run twice is not bit-identical"; fi

# Multi-query attention (one key/value head) on tp = 2 with sequence parallelism, its
# heads wider than n_embd / n_head (model.head_dim 48, Qwen3-MoE's kind: q|k|v and the
# attention's output 4 x 48 = 192 > 128 columns), and a tied Llama on a pipeline (the last
# stage's copy of model.embed_tokens.weight summed with the first's).
mv "$TMP/ref.jsonl" "$TMP/ref_gqa.jsonl"
check ref 1 --set model.n_kv_head=1 --set model.head_dim=48
check mqa_head_dim_tp2_sp 2 --set model.n_kv_head=1 --set model.head_dim=48 --set parallel.tp=2 \
  --set parallel.sequence_parallel=true
mv "$TMP/ref.jsonl" "$TMP/ref_mqa.jsonl"
check ref 1 --set model.tie_embeddings=true
check tied_pp2_tp2 4 --set model.tie_embeddings=true --set parallel.pp=2 --set parallel.tp=2
if cmp -s <(losses "$TMP/ref.jsonl") <(losses "$TMP/ref_gqa.jsonl"); then
  fail "tie_embeddings = true trained exactly like the untied model"
else pass; fi

expect_error 2 "n_kv_head = 3" "${common[@]}" --set model.n_kv_head=3 --set parallel.tp=2
expect_error 1 "grouped-query attention is a llama feature" train "$SRC/configs/tiny.cfg" \
  --set model.n_kv_head=2 --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""'
expect_error 1 "model.head_dim = 48: gpt2's heads have n_embd / n_head" train "$SRC/configs/tiny.cfg" \
  --set model.head_dim=48 --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""'
expect_error 1 "model.head_dim = 33: rotary embeddings rotate pairs" "${common[@]}" --set model.head_dim=33
expect_error 1 "rope_theta" train "$SRC/configs/tiny.cfg" --set model.rope_theta=10000.0 \
  --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""'
finish
