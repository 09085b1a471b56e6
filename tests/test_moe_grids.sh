# The Mixture-of-Experts layer on the grids it runs on (config_moe.c refuses the rest): a
# DeepSeek-style MoE of llama-tiny with Qwen3's q/k norms (a dense first block, sigmoid
# router in groups, a shared expert, the z-loss, the balance loss, the moving bias) gives
# the one-rank losses and gradient norms within 1e-4 on dp 2 with ZeRO-1 (counts and loss
# sums over the replicas, the bias moved alike on each), tp 2 (the MoE replicated on both
# ranks and counted once; q_norm/k_norm gradients summed over them) and pp 2 with zb-v's
# V placement, its split backward (the MoE's weight gradients in the input pass) and full
# recompute (a replayed forward counts nothing: the counts are the backward's); cp 2
# without the balance loss; a checkpoint (the bias in its state.json) resumes on another
# grid into the same losses; expert parallelism (ep 2 over dp 2, ep 4 over dp 4, ep 2 over
# dp 4 with ZeRO-3, ep 2 over tp 2 and a bit-identical rerun, ep 2 over cp 2, pp 2 x dp 2
# x ep 2 with 1f1b, zb-v with full recompute and dualpipe-v). Another
# micro-batch split is test_moe_fixture's. Measured at
# 2e-7 when written, also: ZeRO-2/3, pp 2 x dp 2, tp 4, tp 2 x dp 2, tp 2 x pp 2, 1f1b,
# interleaved-1f1b, zb-h1, interleaved-zb, dualpipe-v, gpipe, recompute selective,
# except_last and auto, micro_batch 2, cp 2 x dp 2; ep 2 over dp 4 (edp 2) with ZeRO-0,
# 1 and 2, ep 2 over dp 2 with ZeRO-1, 2 and 3; pp 2 x dp 2 x ep 2 with interleaved-1f1b,
# interleaved-zb, looped-bfs, zb-h1 + full recompute, 1f1b + selective and auto
# recompute; pp 2 x tp 2 x ep 2 with zb-v; ep 4 over tp 2 x dp 2, ep 2 over dp with tp 2
# (order dp-tp-cp-pp: edp across the tp ranks), ep 4 over cp 2 x dp 2 and over tp 2 x
# cp 2 (all within 5e-8).
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
common=(train "$SRC/configs/llama-tiny.cfg" --set train.steps=8
        --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set train.threads=1
        --set log.progress=false --set model.moe_experts=8 --set model.moe_top_k=2
        --set model.moe_ffn_hidden=64 --set model.moe_shared_experts=1
        --set model.moe_router=sigmoid --set model.moe_groups=4 --set model.moe_topk_groups=2
        --set model.moe_route_scale=2.5 --set model.moe_first_dense=1
        --set train.moe_z_loss=1e-3 --set train.moe_aux_loss=1e-2
        --set train.moe_bias_rate=1e-3 --set model.qk_norm=true)

check ref 1
check dp2_zero1 2 --set parallel.dp=2 --set parallel.zero=1
check tp2 2 --set parallel.tp=2
check pp2_zbv_full 2 --set parallel.pp=2 --set parallel.schedule=zb-v \
  --set parallel.virtual_stages=2 --set parallel.recompute=full
# Expert parallelism over dp: each rank holds E/ep experts, the rows travel over the ep
# group and back (expert_dispatch.h), expert gradients reduce over edp and count once in
# the norm. ep 4 over dp 4: two experts a rank, no edp partner; ep 2 over dp 4 with
# ZeRO-3: edp pairs, each bucket sharded over its own group.
# Under the sanitizers (8 fixed steps here, 4 ranks on 2 cores) the 4-rank cases are the
# release build's: ep 2 over dp 2 runs the same exchange there.
# Its validation (9 windows: 4 for one replica, 5 for the other) runs as many batches on
# each, the extra one padding, so the ep group meets in every dispatch (engine.c).
check dp2_ep2 2 --set parallel.dp=2 --set parallel.ep=2 --set "data.val=\"$TMP/train.bin\"" \
  --set data.eval_every=4 --set data.val_windows=9
ep_max_ranks="${TS_TEST_MAX_RANKS:-1000}"
[ -n "${TS_TEST_SANITIZERS:-}" ] && ep_max_ranks=2
TS_TEST_MAX_RANKS=$ep_max_ranks check dp4_ep4 4 --set parallel.dp=4 --set parallel.ep=4
TS_TEST_MAX_RANKS=$ep_max_ranks check dp4_ep2_zero3 4 --set parallel.dp=4 --set parallel.ep=2 \
  --set parallel.zero=3
# Expert parallelism over tp ranks (etp 1): every tp rank routes all rows, sends its half
# to the experts, the halves are all-gathered (moe.c); run twice, bit-identical.
check tp2_ep2 2 --set parallel.tp=2 --set parallel.ep=2
if run_np 2 "${common[@]}" --set parallel.tp=2 --set parallel.ep=2 \
     --set "log.metrics=\"$TMP/tp2_ep2_again.jsonl\""; then
  if cmp -s <(losses "$TMP/tp2_ep2.jsonl"; norms "$TMP/tp2_ep2.jsonl") \
            <(losses "$TMP/tp2_ep2_again.jsonl"; norms "$TMP/tp2_ep2_again.jsonl"); then pass
  else fail "tp 2 x ep 2 run twice is not bit-identical"; fi
else fail "rerun tp2_ep2"; sed 's/^/    /' "$TMP/err" >&2; fi
# Pipeline stages with their own expert grids (ep 2 over each stage's dp 2): the ep peers
# of a stage run the same schedule, so they meet in the same dispatches, with zb-v's V
# placement and full recompute's replays and dualpipe-v's two chunks a rank.
TS_TEST_MAX_RANKS=$ep_max_ranks check pp2_dp2_ep2_1f1b 4 --set parallel.pp=2 --set parallel.dp=2 \
  --set parallel.ep=2 --set parallel.schedule=1f1b
TS_TEST_MAX_RANKS=$ep_max_ranks check pp2_dp2_ep2_zbv_full 4 --set parallel.pp=2 \
  --set parallel.dp=2 --set parallel.ep=2 --set parallel.schedule=zb-v \
  --set parallel.virtual_stages=2 --set parallel.recompute=full
TS_TEST_MAX_RANKS=$ep_max_ranks check pp2_dp2_ep2_dualpipev 4 --set parallel.pp=2 \
  --set parallel.dp=2 --set parallel.ep=2 --set parallel.schedule=dualpipe-v \
  --set parallel.virtual_stages=2 --set parallel.micro_batch=2

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
# ep 2 over the cp ranks: each sends its own positions' rows, as a dp rank would.
CHECK_REF="$TMP/noaux.jsonl" check cp2_ep2_noaux 2 --set parallel.cp=2 --set parallel.ep=2 \
  --set train.moe_aux_loss=0

finish
