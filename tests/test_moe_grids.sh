# The Mixture-of-Experts layer on the grids it runs on (config_moe.c refuses the rest): a
# DeepSeek-style MoE of llama-tiny with Qwen3's q/k norms (a dense first block, sigmoid
# router in groups, a shared expert, the z-loss, the balance loss, the moving bias) gives
# the one-rank losses and gradient norms within 1e-4 on dp 2 with ZeRO-1 (counts and loss
# sums over the replicas, the bias moved alike on each), tp 2 (the MoE replicated on both
# ranks and counted once; q_norm/k_norm gradients summed over them) and pp 2 with zb-v's
# V placement, its split backward (the MoE's weight gradients in the input pass) and full
# recompute (a replayed forward counts nothing: the counts are the backward's); cp 2
# without the balance loss; expert parallelism (ep 2 over dp 2 with ZeRO-1, ep 4 over
# dp 4, ep 2 over dp 4 with ZeRO-3); expert tensor parallelism (etp 2 over dp 2, etp 2 x
# ep 2 over dp 4); a checkpoint saved under ep or etp (each expert, or etp slice, by its
# own ranks; the bias in its state.json) resumes on other grids into the same losses, on
# its own bit for bit, and reshards byte for byte (onto etp too). Another
# micro-batch split is test_moe_fixture's. Measured at
# 2e-7 when written, also: ZeRO-2/3, pp 2 x dp 2, tp 4, tp 2 x dp 2, tp 2 x pp 2, 1f1b,
# interleaved-1f1b, zb-h1, interleaved-zb, dualpipe-v, gpipe, recompute selective,
# except_last and auto, micro_batch 2, cp 2 x dp 2; ep 2 over dp 4 (edp 2) with ZeRO-0,
# 1 and 2, ep 2 over dp 2 with ZeRO-1, 2 and 3; etp 2 over dp 2 with ZeRO-1, recompute
# full and micro_batch 1, etp 2 over dp 4 with ZeRO-3, etp 4 over dp 4, etp 2 x ep 2 over
# dp 4 with ZeRO-2 (and reruns of etp 2 x ep 2 bit-identical).
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
ep_max_ranks="${TS_TEST_MAX_RANKS:-1000}"
[ -n "${TS_TEST_SANITIZERS:-}" ] && ep_max_ranks=2
TS_TEST_MAX_RANKS=$ep_max_ranks check dp4_ep4 4 --set parallel.dp=4 --set parallel.ep=4
TS_TEST_MAX_RANKS=$ep_max_ranks check dp4_ep2_zero3 4 --set parallel.dp=4 --set parallel.ep=2 \
  --set parallel.zero=3
# Expert tensor parallelism: each rank an F/2 slice of its experts, the etp pair's rows
# gathered and the partial outputs (and input gradients) summed back (expert_tp.h).
# etp 2 over dp 2 (every expert on both ranks, halved); etp 2 x ep 2 over dp 4 (the ep
# exchange first, then the etp gather of the received rows). etp 2 over dp 2 is a
# checkpoint case below (ep_ckpt_case: the same check, saving).
TS_TEST_MAX_RANKS=$ep_max_ranks check dp4_ep2_etp2 4 --set parallel.dp=4 --set parallel.ep=2 \
  --set parallel.etp=2

# Checkpoints under expert parallelism: each expert is stored whole under its global id,
# written once by its own ep rank's edp group, weights and AdamW moments (ZeRO shards
# them over edp), and read back by whichever ranks hold it on the loading grid.
# ep_ckpt_case NAME NP SETS...: NAME's grid (SETS, NP ranks) trains the 8 steps against
# one rank (check), saving after 4 and 8; its step 4 (the bias moved by then, kept in
# state.json) resumes on one rank and on dp 4 x ep 4 into the one-rank run's steps 4..7
# (1e-4), and on its own grid bit for bit: the same metrics and, at step 8, the same
# files. Another saving grid is one more line (ep 2 x pp 2, once built: NP 4, SETS
# --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2). EP_CKPT_WIDE=0 leaves
# out the dp 4 x ep 4 resume (CI time) where another case reads that grid's way.
grep '"step":[4-7],' "$TMP/ref.jsonl" > "$TMP/ref_tail.jsonl"
# resume NAME NP FROM TOL SETS...: "${common[@]}" SETS on NP ranks from FROM's step 4,
# saving at the end to $TMP/ck_NAME; steps 4..7 against one rank's within TOL, or with
# TOL = 0 against FROM's own run bit for bit (metrics and step 8's files).
resume() {
  local name="$1" np="$2" from="$3" tol="$4"; shift 4
  if [ "$np" -gt "$ep_max_ranks" ]; then
    skip_case "resume $name on $np ranks (the release build runs it)"; return 0
  fi
  if run_np "$np" "${common[@]}" --set "checkpoint.load=\"$TMP/ck_$from/step_00000004\"" \
       --set "checkpoint.dir=\"$TMP/ck_$name\"" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
    pass
  else
    fail "resume $name: $*"; sed 's/^/    /' "$TMP/err" >&2; return 0
  fi
  if [ "$tol" = 0 ]; then
    grep '"step":[4-7],' "$TMP/$from.jsonl" > "$TMP/${from}_tail.jsonl"
    compare_runs "resumed $name vs uninterrupted (bit for bit)" "$TMP/$name.jsonl" \
      "$TMP/${from}_tail.jsonl" 0 0
    same_ckpt "$TMP/ck_$from/step_00000008" "$TMP/ck_$name/step_00000008" "resumed $name at step 8"
  else
    compare_runs "resumed $name vs one rank" "$TMP/$name.jsonl" "$TMP/ref_tail.jsonl" "$tol" "$tol"
  fi
}
ep_ckpt_case() {
  local name="$1" np="$2"; shift 2
  if [ "$np" -gt "$ep_max_ranks" ]; then
    skip_case "checkpoints of $name on $np ranks (the release build runs them)"; return 0
  fi
  check "$name" "$np" "$@" --set "checkpoint.dir=\"$TMP/ck_$name\"" --set checkpoint.every=4
  resume "${name}_on1" 1 "$name" 1e-4
  resume "${name}_same" "$np" "$name" 0 "$@"
  [ "${EP_CKPT_WIDE:-1}" = 0 ] && return 0
  resume "${name}_dp4_ep4" 4 "$name" 1e-4 --set parallel.dp=4 --set parallel.ep=4
}
ep_ckpt_case dp2_ep2_zero1 2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=1
# Under etp each expert's F/2 slices are written by their own ranks, tiled whole (the
# reshards below read and write slices on 4 ranks: no dp 4 x ep 4 resume here).
EP_CKPT_WIDE=0 ep_ckpt_case dp2_etp2 2 --set parallel.dp=2 --set parallel.etp=2

# Resharded bytes: dp2_ep2_zero1's step 4 loaded on dp 4 x ep 2 (edp pairs: ZeRO-0 splits
# each expert's writing over the pair, ZeRO-3 shards its weights and moments there), on
# dp 4 x etp 2 x ep 2 (each rank reads, then writes, its F/2 slice of its experts) and
# on dp 4 x etp 2 with ZeRO-3 (each slice's weights and moments sharded over its edp
# pair) and saved at once (nothing trained) is the same files byte for byte.
ck="$TMP/ck_dp2_ep2_zero1/step_00000004"
for grid in "ep=2 zero=0" "ep=2 zero=3" "ep=2 etp=2 zero=2" "etp=2 zero=3"; do
  [ 4 -gt "$ep_max_ranks" ] && { skip_case "reshard to dp4 $grid (release)"; continue; }
  sets=(); for kv in $grid; do sets+=(--set "parallel.$kv"); done
  if run_np 4 "${common[@]}" --set train.steps=4 --set parallel.dp=4 "${sets[@]}" \
       --set "checkpoint.load=\"$ck\"" \
       --set "checkpoint.dir=\"$TMP/ck_r\"" --set 'log.metrics=""'; then
    pass; same_ckpt "$ck" "$TMP/ck_r/step_00000004" "dp2 ep2 zero1 -> dp4 $grid"
  else
    fail "reshard to dp4 $grid"; sed 's/^/    /' "$TMP/err" >&2
  fi
  rm -rf "$TMP/ck_r"
done

# model.init under ep: the saved step directory (a save_pretrained directory of every
# expert) read by dp 2 x ep 2, each rank its own experts, and saved at once: the same
# weights byte for byte.
# The same on etp 2, each rank its F/2 slice of every expert.
for grid in ep etp; do
  rm -rf "$TMP/ck_init"
  if run_np 2 "${common[@]}" --set train.steps=0 --set parallel.dp=2 --set parallel.$grid=2 \
       --set "model.init=\"$ck\"" --set "checkpoint.dir=\"$TMP/ck_init\"" --set 'log.metrics=""'; then
    pass; same_files "$ck" "$TMP/ck_init/step_00000000" "model.init on $grid 2" model.safetensors
  else
    fail "model.init on dp 2 x $grid 2"; sed 's/^/    /' "$TMP/err" >&2
  fi
done

# Context parallelism, without the balance loss (refused with it: per whole sequence).
if run_np 1 "${common[@]}" --set train.moe_aux_loss=0 \
     --set "log.metrics=\"$TMP/noaux.jsonl\""; then pass
else fail "MoE without the balance loss on one rank"; sed 's/^/    /' "$TMP/err" >&2; fi
CHECK_REF="$TMP/noaux.jsonl" check cp2_noaux 2 --set parallel.cp=2 --set train.moe_aux_loss=0

finish
