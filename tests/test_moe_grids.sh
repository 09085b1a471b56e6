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
# dp 4 with ZeRO-3); bf16 against fp32 and on ep 2 over dp 2 and pp 2. Another
# micro-batch split is test_moe_fixture's. Measured at
# 2e-7 when written, also: ZeRO-2/3, pp 2 x dp 2, tp 4, tp 2 x dp 2, tp 2 x pp 2, 1f1b,
# interleaved-1f1b, zb-h1, interleaved-zb, dualpipe-v, gpipe, recompute selective,
# except_last and auto, micro_batch 2, cp 2 x dp 2; ep 2 over dp 4 (edp 2) with ZeRO-0,
# 1 and 2, ep 2 over dp 2 with ZeRO-1, 2 and 3.
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
check dp2_ep2 2 --set parallel.dp=2 --set parallel.ep=2
ep_max_ranks="${TS_TEST_MAX_RANKS:-1000}"
[ -n "${TS_TEST_SANITIZERS:-}" ] && ep_max_ranks=2
TS_TEST_MAX_RANKS=$ep_max_ranks check dp4_ep4 4 --set parallel.dp=4 --set parallel.ep=4
TS_TEST_MAX_RANKS=$ep_max_ranks check dp4_ep2_zero3 4 --set parallel.dp=4 --set parallel.ep=2 \
  --set parallel.zero=3

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

# bf16 (train.precision = "bf16": the router in fp32 from the widened rows, the experts,
# the dispatch and the combine on bf16 rows; moe.c), with test_bf16_train.sh's tolerances:
# the one-rank run tracks fp32 within 2% (loss and gradient norm) and differs from it
# somewhere; a rerun is bit-identical; ep 2 over dp 2 (bf16 rows exchanged) and pp 2 with
# zb-v and full recompute (the widened rows saved again by the replayed forward) give the
# one-rank bf16 losses and norms within 1e-2 relative. Measured when written (on a CPU
# without BF16 instructions, through a local reference bf16 GEMM in place of oneDNN's):
# bf16 vs fp32 5e-5 (loss) and 1e-3 (norm), ep 2 over dp 2 2e-5 and 2e-4, pp 2 the same
# bits. Skipped without BF16 instructions (tessera refuses bf16 there, as
# test_bf16_train.sh checks).
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  BF16=(--set 'train.precision="bf16"')
  bf16_run() { # NAME NP SETS...: the run, metrics in $TMP/NAME.jsonl
    local name="$1" np="$2"; shift 2
    if run_np "$np" "${common[@]}" "${BF16[@]}" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
      pass; return 0
    fi
    fail "run $name (bf16, $np ranks): $*"; sed 's/^/    /' "$TMP/err" >&2; return 1
  }
  if bf16_run bf16 1; then
    compare_runs "bf16 vs fp32, one rank" "$TMP/bf16.jsonl" "$TMP/ref.jsonl" 0.02 0.02
    if cmp -s <(losses "$TMP/bf16.jsonl") <(losses "$TMP/ref.jsonl"); then
      fail "bf16 gave the fp32 losses bit for bit: train.precision = \"bf16\" changed nothing"
    else pass; fi
    bf16_run bf16_again 1 &&
      if cmp -s <(losses "$TMP/bf16_again.jsonl") <(losses "$TMP/bf16.jsonl") &&
         cmp -s <(norms "$TMP/bf16_again.jsonl") <(norms "$TMP/bf16.jsonl"); then pass
      else fail "two one-rank bf16 MoE runs differ"; fi
    bf16_run bf16_dp2_ep2 2 --set parallel.dp=2 --set parallel.ep=2 &&
      compare_runs "bf16 ep 2 over dp 2 vs one rank" "$TMP/bf16_dp2_ep2.jsonl" "$TMP/bf16.jsonl" \
        1e-2 1e-2
    bf16_run bf16_pp2_zbv_full 2 --set parallel.pp=2 --set parallel.schedule=zb-v \
      --set parallel.virtual_stages=2 --set parallel.recompute=full &&
      compare_runs "bf16 pp 2 zb-v full recompute vs one rank" "$TMP/bf16_pp2_zbv_full.jsonl" \
        "$TMP/bf16.jsonl" 1e-2 1e-2
  fi
else
  skip_case "bf16: this CPU has neither AVX512_BF16 nor AMX-BF16 (tessera refuses bf16 here)"
fi

finish
