# The Mixture-of-Experts layer (and qk_norm, below) on the grids it runs on so far (data and pipeline
# parallelism; config_moe.c refuses the others): a DeepSeek-style MoE of llama-tiny (a
# dense first block, sigmoid router in groups, a shared expert, the z-loss, the balance
# loss and the moving bias) gives the one-rank losses and gradient norms within 1e-4 on
# dp 2 with ZeRO-1 (the counts and loss sums over the replicas, the bias moved alike on
# each) and pp 2 with zb-v's V placement, its split backward (the MoE's weight gradients
# in the input pass) and full recompute (a replayed forward counts nothing: the counts are
# the backward's); another micro-batch split is test_moe_fixture's. Measured at 2e-7 when
# written (also ZeRO-2/3, pp 2 x dp 2, 1f1b, interleaved-1f1b, zb-h1, interleaved-zb,
# dualpipe-v, gpipe, recompute selective, except_last and auto, micro_batch 2). A
# checkpoint (the bias in its state.json) resumes on another grid into the same losses.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
common=(train "$SRC/configs/llama-tiny.cfg" --set train.steps=8
        --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set train.threads=1
        --set log.progress=false --set model.moe_experts=8 --set model.moe_top_k=2
        --set model.moe_ffn_hidden=64 --set model.moe_shared_experts=1
        --set model.moe_router=sigmoid --set model.moe_groups=4 --set model.moe_topk_groups=2
        --set model.moe_route_scale=2.5 --set model.moe_first_dense=1
        --set train.moe_z_loss=1e-3 --set train.moe_aux_loss=1e-2
        --set train.moe_bias_rate=1e-3)

check ref 1
check dp2_zero1 2 --set parallel.dp=2 --set parallel.zero=1
check pp2_zbv_full 2 --set parallel.pp=2 --set parallel.schedule=zb-v \
  --set parallel.virtual_stages=2 --set parallel.recompute=full

# A checkpoint after 4 steps (the bias moved by then, kept in state.json) resumed on dp 2:
# steps 4..7 are the uninterrupted run's, bias and all.
if run_np 1 "${common[@]}" --set train.steps=4 --set "checkpoint.dir=\"$TMP/ck\"" \
     --set 'log.metrics=""'; then pass; else fail "the 4-step run with a checkpoint"; fi
if run_np 2 "${common[@]}" --set parallel.dp=2 --set "checkpoint.dir=\"$TMP/ck\"" \
     --set checkpoint.load=latest --set "log.metrics=\"$TMP/resumed.jsonl\""; then
  pass
  grep '"step":[4-7],' "$TMP/ref.jsonl" > "$TMP/ref_tail.jsonl"
  compare_runs "resumed on dp 2 vs uninterrupted" "$TMP/resumed.jsonl" "$TMP/ref_tail.jsonl" \
    1e-4 1e-4
else
  fail "resume on dp 2"; sed 's/^/    /' "$TMP/err" >&2
fi

# Context parallelism, without the balance loss (refused with it: per whole sequence).
if run_np 1 "${common[@]}" --set train.moe_aux_loss=0 \
     --set "log.metrics=\"$TMP/noaux.jsonl\""; then pass
else fail "MoE without the balance loss on one rank"; sed 's/^/    /' "$TMP/err" >&2; fi
CHECK_REF="$TMP/noaux.jsonl" check cp2_noaux 2 --set parallel.cp=2 --set train.moe_aux_loss=0

# qk_norm (Qwen3's q/k norms, dense llama-tiny): tp 2 (its weights' gradients summed over
# the heads' ranks) gives the one-rank losses (measured 2e-8; also tp 4 with replicated
# key/value heads, sequence parallelism, tp 2 x dp 2 ZeRO-1, cp 2, dp 2, pp 2, selective
# recompute and cpu-strict when written).
common=(train "$SRC/configs/llama-tiny.cfg" --set train.steps=8
        --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set train.threads=1
        --set log.progress=false --set model.qk_norm=true)
if run_np 1 "${common[@]}" --set "log.metrics=\"$TMP/qk_ref.jsonl\""; then pass
else fail "qk_norm on one rank"; sed 's/^/    /' "$TMP/err" >&2; fi
CHECK_REF="$TMP/qk_ref.jsonl" check qk_tp2 2 --set parallel.tp=2
finish
