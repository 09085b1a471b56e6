# Grid invariance for sequence parallelism (parallel.sequence_parallel: the norms',
# residuals' and stage boundaries' rows split over the tp group, reduce-scatter /
# all-gather in place of tp's all-reduce): tp 2 and 4, with dp 2 under ZeRO-1 and -3,
# pp 2 under 1f1b, zb-h1 (the weight pass gathers the norms again) and interleaved on a
# 2x2x2 grid, with selective and full recompute, give the one-rank losses within
# relative 1e-4 (16 steps; 8 for zb-h1 and recompute on grids checked at 16); a rerun is bit for bit; a checkpoint saved with sequence parallelism on
# tp 2 resumes on one rank without it (the files know no sp) and continues the one-rank
# losses. tp = 1, or a seq_len that does not divide by tp, is a clear error.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
# 16 steps; 6 under the sanitizers (TS_TEST_SWEEP_STEPS, tests/CMakeLists.txt). Every run
# follows one schedule of that length (lr_decay_steps), so a resumed run continues it.
steps="${TS_TEST_SWEEP_STEPS:-16}"
common=(train "$SRC/configs/tiny.cfg" --set "train.steps=$steps" --set "train.lr_decay_steps=$steps"
        --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set train.threads=1
        --set log.progress=false)
sp=(--set parallel.sequence_parallel=true)

check ref 1
# check_short NAME NP SETS...: check with $short steps, against the reference's first
# $short steps: for the runs that change only the order or the shape of the work inside a
# step (a schedule, a recompute mode) on a layout whose 16 steps are checked here (sp on tp 2, and pp 2 x tp 2 under 1f1b):
# every step runs that whole step again, so 8 steps check it as 16 do
# (test_pp_invariance's argument). The layouts (which rank holds and updates what), whose
# errors grow with the learning rate over the warm-up, keep 16 steps. Every run follows the
# 16-step schedule (lr_decay_steps), so an 8-step run's steps are its first 8, bit for bit.
short=$((steps < 8 ? steps : 8))
grep '"loss"' "$TMP/ref.jsonl" | head -n "$short" >"$TMP/ref_short.jsonl"
check_short() { CHECK_REF="$TMP/ref_short.jsonl" check "$@" --set "train.steps=$short"; }
check sp_tp2 2 --set parallel.tp=2 "${sp[@]}"
check sp_tp4 4 --set parallel.tp=4 "${sp[@]}"
check sp_tp2_dp2_zero1 4 --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1 "${sp[@]}"
check sp_tp2_dp2_zero3 4 --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=3 "${sp[@]}"
check sp_pp2_tp2_1f1b 4 --set parallel.pp=2 --set parallel.tp=2 --set parallel.schedule=1f1b "${sp[@]}"
check_short sp_pp2_tp2_zbh1 4 --set parallel.pp=2 --set parallel.tp=2 --set parallel.schedule=zb-h1 "${sp[@]}"
check sp_2x2x2_interleaved 8 --set parallel.pp=2 --set parallel.dp=2 --set parallel.tp=2 \
  --set parallel.virtual_stages=2 --set parallel.schedule=interleaved-1f1b \
  --set parallel.micro_batch=2 "${sp[@]}"
check_short sp_tp2_selective 2 --set parallel.tp=2 --set parallel.recompute=selective "${sp[@]}"
check_short sp_pp2_tp2_full 4 --set parallel.pp=2 --set parallel.tp=2 --set parallel.recompute=full "${sp[@]}"

release_only "tp=2 with sequence parallelism run twice, bit for bit" || {
  check sp_tp2_again 2 --set parallel.tp=2 "${sp[@]}"
  if cmp -s <(losses "$TMP/sp_tp2.jsonl") <(losses "$TMP/sp_tp2_again.jsonl"); then pass
  else fail "tp=2 with sequence parallelism run twice is not bit-identical"; fi
}

# Save at step 3 with sequence parallelism on tp 2, resume on one rank without it: the
# remaining steps are the one-rank run's.
half=3
if run_np 2 "${common[@]}" --set parallel.tp=2 "${sp[@]}" --set "train.steps=$half" \
  --set "checkpoint.dir=\"$TMP/ck\""; then pass
else fail "saving with sequence parallelism"; sed 's/^/    /' "$TMP/err" >&2; fi
# (steps count from 0: the resumed run's first line is step $half)
awk -v h="$half" -F'"step":' 'NF > 1 && $2 + 0 >= h' "$TMP/ref.jsonl" > "$TMP/ref_tail.jsonl"
CHECK_REF="$TMP/ref_tail.jsonl" check sp_resumed_one_rank 1 \
  --set "checkpoint.load=\"$TMP/ck/step_0000000$half\""

expect_error 0 "parallel.sequence_parallel = true needs parallel.tp >= 2" "${common[@]}" "${sp[@]}"
expect_error 2 "needs model.seq_len = 63 to divide by parallel.tp = 2" "${common[@]}" "${sp[@]}" \
  --set parallel.tp=2 --set model.seq_len=63
finish
