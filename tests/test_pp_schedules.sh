# Grid invariance of the issue-26 schedules by name: looped-bfs, interleaved-zb, zb-h2,
# zb-v and dualpipe-v on pp = 2 and 4 (v = 2 where they need it; m = 4 and 8; uneven
# partitions; recompute none, full, except_last and auto; data x pipeline with the
# breadth-first order; the exchange run eagerly and group by group, as NCCL needs, which
# is where DualPipe's pairs hoist their receives) give the one-rank losses within
# relative 1e-4, and a rerun is bit-identical. A checkpoint saved on the V placement
# reshards onto one rank and onto a looped grid bit for bit, and a run resumed across
# placements continues the uninterrupted one. torch's own CSVs of its seven schedules
# are test_pp_torch_csv's.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
steps="${TS_TEST_SWEEP_STEPS:-8}"
# global_batch 16: micro_batch 4 gives m = 4 micro-batches, 2 gives m = 8.
common=(train "$SRC/configs/tiny.cfg" --set "train.steps=$steps" --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false)
m4=(--set parallel.micro_batch=4)
m8=(--set parallel.micro_batch=2)
v2=(--set parallel.virtual_stages=2)

# pp = 2 on the tiny model (6 layers: embedding, 4 blocks, head). The reference's m does
# not matter: the batch rule makes every split of the global batch the same batch.
check ref 1
check pp2_looped_bfs_m4 2 --set parallel.pp=2 "${v2[@]}" "${m4[@]}" --set parallel.schedule=looped-bfs
check pp2_interleaved_zb_m8 2 --set parallel.pp=2 "${v2[@]}" "${m8[@]}" --set parallel.schedule=interleaved-zb
check pp2_zb_h2_uneven 2 --set parallel.pp=2 "${m4[@]}" --set parallel.schedule=zb-h2 --set "parallel.partition=[1,5]"
check pp2_zb_v_m8_uneven 2 --set parallel.pp=2 "${v2[@]}" "${m8[@]}" --set parallel.schedule=zb-v \
  --set "parallel.partition=[2,1,1,2]"
check pp2_dualpipe_v_full 2 --set parallel.pp=2 "${v2[@]}" "${m4[@]}" --set parallel.schedule=dualpipe-v \
  --set parallel.recompute=full
check pp2_zb_v_auto 2 --set parallel.pp=2 "${v2[@]}" "${m8[@]}" --set parallel.schedule=zb-v \
  --set parallel.recompute=auto
check pp2_dp2_looped_bfs 4 --set parallel.pp=2 --set parallel.dp=2 "${v2[@]}" --set parallel.micro_batch=2 \
  --set parallel.schedule=looped-bfs

# A rerun gives the same bits.
release_only "zb-v on pp 2 run twice, bit for bit" || {
  check pp2_zb_v_m8_uneven_again 2 --set parallel.pp=2 "${v2[@]}" "${m8[@]}" --set parallel.schedule=zb-v \
    --set "parallel.partition=[2,1,1,2]"
  cmp -s <(losses "$TMP/pp2_zb_v_m8_uneven.jsonl") <(losses "$TMP/pp2_zb_v_m8_uneven_again.jsonl") &&
    cmp -s <(norms "$TMP/pp2_zb_v_m8_uneven.jsonl") <(norms "$TMP/pp2_zb_v_m8_uneven_again.jsonl") && pass ||
    fail "a rerun of zb-v on pp 2 is not bit-identical"
}

# Group by group (TS_PP_EXCHANGE=grouped): DualPipe-V's pairs take their second action's
# receive into the first's group; the losses are the eager run's.
export TS_PP_EXCHANGE=grouped
check pp2_dualpipe_v_m8_grouped 2 --set parallel.pp=2 "${v2[@]}" "${m8[@]}" --set parallel.schedule=dualpipe-v
unset TS_PP_EXCHANGE

# pp = 4 on 6 blocks (8 layers: the V schedules' 8 chunks of one layer each). zb-v,
# interleaved-zb and looped-bfs at pp = 4 are test_pp_torch_csv's (torch's orders are
# these built-ins action for action).
common+=(--set model.n_layer=6)
check ref 1
check pp4_zb_h2_m8_except_last 4 --set parallel.pp=4 "${m8[@]}" --set parallel.schedule=zb-h2 \
  --set parallel.recompute=except_last
export TS_PP_EXCHANGE=grouped
check pp4_dualpipe_v_m8_grouped 4 --set parallel.pp=4 "${v2[@]}" "${m8[@]}" --set parallel.schedule=dualpipe-v
unset TS_PP_EXCHANGE

# Checkpoints across placements (the layout is keyed by global layer, not by rank): 3
# steps on zb-v (V: rank 0 holds the embedding and the head), loaded and saved again on
# one rank and on a looped 1f1b pp 2, hold the same bytes; 3 + 3 steps resumed on the
# looped grid follow the 6 uninterrupted V steps within 1e-4.
base=("${common[@]}" --set train.lr_decay_steps=6 "${m8[@]}")
zbv=(--set parallel.pp=2 "${v2[@]}" --set parallel.schedule=zb-v)
run_base v_full 2 "${zbv[@]}" --set train.steps=6
run_base v_saved 2 "${zbv[@]}" --set train.steps=3 --set "checkpoint.dir=\"$TMP/v\""
V="$TMP/v/step_00000003"
run_base v_to_one 1 --set train.steps=3 --set "checkpoint.load=\"$V\"" --set "checkpoint.dir=\"$TMP/one\"" &&
  same_ckpt "$V" "$TMP/one/step_00000003" "zb-v pp 2 -> one rank"
run_base v_to_loop 2 --set parallel.pp=2 --set parallel.schedule=1f1b --set train.steps=3 \
  --set "checkpoint.load=\"$V\"" --set "checkpoint.dir=\"$TMP/loop\"" &&
  same_ckpt "$V" "$TMP/loop/step_00000003" "zb-v pp 2 -> 1f1b pp 2"
run_base loop_to_v 2 "${zbv[@]}" --set train.steps=3 --set "checkpoint.load=\"$TMP/loop/step_00000003\"" \
  --set "checkpoint.dir=\"$TMP/back\"" &&
  same_ckpt "$V" "$TMP/back/step_00000003" "1f1b pp 2 -> zb-v pp 2"
grep -v '"step":[345],' "$TMP/v_full.jsonl" | grep '"loss"' > "$TMP/v_resumed.jsonl"
run_base v_resumed 2 --set parallel.pp=2 --set parallel.schedule=1f1b --set train.steps=6 \
  --set "checkpoint.load=\"$V\"" &&
  { out=$(same_losses "$TMP/v_resumed.jsonl" "$TMP/v_full.jsonl" 1e-4) && pass ||
      fail "zb-v checkpoint resumed on 1f1b: $out"; }

# Each schedule's rule, named.
expect_error 2 "zb-v.*virtual_stages = 2" "${common[@]}" --set parallel.pp=2 --set parallel.virtual_stages=3 \
  --set parallel.schedule=zb-v
expect_error 2 "dualpipe-v.*needs at least 2 \\* pp = 4 micro-batches" "${common[@]}" --set parallel.pp=2 "${v2[@]}" \
  --set parallel.micro_batch=8 --set parallel.schedule=dualpipe-v
finish
