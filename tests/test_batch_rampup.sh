# train.batch_rampup (Megatron's step batch-size schedule; docs/CONTRACT.md "Batch-size
# ramp-up") on the tiny model (2 blocks, 64 wide, seq_len 32), 6 steps of batches 4, 4,
# 8, 8, 16, 16 ("samples 0:4 8:8 24:16", global_batch 16):
# - each step's metrics line says its global_batch and micro_batches (m changes at the
#   thresholds), and the token-threshold spelling of the same ramp-up gives the same bits;
# - the data order: with frozen weights every ramp-up step's loss is the mean of the
#   batch-4 steps over the same samples (the position is the sequences consumed, not
#   step x batch), steps 0-1 bit for bit;
# - grids: dp 2 (ZeRO-3: its residency rebuilt with the schedule), pp 2 1f1b, pp 2
#   interleaved-1f1b and pp 2 x dp 2 zb-h1 with ZeRO-2 give the one-rank losses within 1e-4;
# - resume across a threshold: 3 steps saved (next batch 8, then 16), resumed for 3
#   more, continue the uninterrupted run bit for bit; a changed ramp-up is refused on
#   resume naming both, and allowed with train.allow_schedule_change;
# - a CSV schedule is refused (its micro-batch count is fixed); tessera plan plans the
#   last batch and says so.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
ramp='train.batch_rampup="samples 0:4 8:8 24:16"'
common=(train "$SRC/configs/tiny.cfg" --set train.steps=6 --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false
        --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
        --set train.warmup=2 --set train.lr_decay_steps=6 --set "$ramp")

# run NAME NP SETS...: "${common[@]}" SETS on NP ranks, metrics in $TMP/NAME.jsonl,
# compared with nothing (check compares with the one-rank run).
run() {
  local name="$1" np="$2"; shift 2
  if run_np "$np" "${common[@]}" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then pass; return 0; fi
  fail "run $name: $*"; sed 's/^/    /' "$TMP/err" >&2; return 1
}

# One rank, micro_batch 4: 1, 1, 2, 2, 4, 4 micro-batches.
check ref 1
field() { grep -o "\"$2\":[0-9]*" "$1" | cut -d: -f2 | tr '\n' ' '; }
got="$(field "$TMP/ref.jsonl" global_batch)/$(field "$TMP/ref.jsonl" micro_batches)"
[ "$got" = "4 4 8 8 16 16 /1 1 2 2 4 4 " ] && pass || fail "one rank: global_batch/micro_batches $got"
got="$(field "$TMP/ref.jsonl" tokens)"
[ "$got" = "128 128 256 256 512 512 " ] && pass || fail "one rank: tokens $got"

# Numbers only (the sanitizers find nothing here the runs above and below do not run):
# the same ramp-up in tokens (seq_len 32: 256 tokens = 8 samples, 768 = 24) gives the
# same bits; the data position past the first threshold: with the weights frozen (a
# constant lr of 1e-30: every update rounds away) a step's loss is the mean over its
# samples at the initial weights, so each ramp-up step's loss is the mean of the batch-4
# steps that read its samples (step 2: samples 8-15 = batch-4 steps 2-3; step 4: 24-39 =
# steps 6-9); steps 0-1 are those steps bit for bit.
release_only "the token spelling and the data position" || {
check tokens 1 --set 'train.batch_rampup="0:4 256:8 768:16"'
cmp -s <(losses "$TMP/tokens.jsonl") <(losses "$TMP/ref.jsonl") && pass ||
  fail "the ramp-up in tokens is not the one in samples bit for bit"
frozen=(--set train.lr_schedule=\"constant\" --set train.warmup=0 --set train.lr=1e-30 --set train.min_lr=0)
run frozen_ramp 1 "${frozen[@]}"
run frozen_b4 1 "${frozen[@]}" --set 'train.batch_rampup=""' --set train.global_batch=4 --set train.steps=14
if [ -f "$TMP/frozen_b4.jsonl" ]; then
  cmp -s <(losses "$TMP/frozen_ramp.jsonl" | head -n 2) <(losses "$TMP/frozen_b4.jsonl" | head -n 2) && pass ||
    fail "steps 0-1 of the ramp-up do not read what a batch-4 run reads" 
  out=$(awk 'NR == FNR { b4[FNR - 1] = $1; next }
    { n = FNR <= 2 ? 1 : FNR <= 4 ? 2 : 4; first = FNR <= 2 ? FNR - 1 : FNR <= 4 ? 2 + 2 * (FNR - 3) : 6 + 4 * (FNR - 5)
      m = 0; for (k = 0; k < n; k++) m += b4[first + k]; m /= n
      d = $1 - m; if (d < 0) d = -d; if (d / m > w) w = d / m }
    END { printf "worst relative difference %.3g\n", w; exit !(FNR == 6 && w < 1e-6) }' \
    <(losses "$TMP/frozen_b4.jsonl") <(losses "$TMP/frozen_ramp.jsonl")) && pass ||
    fail "a ramp-up step's loss is not the mean of the batch-4 steps over its samples: $out"
  echo "data position: $out"
fi
}

# Grids against the one-rank run (each m rebuilt on the way: 1 -> 2 -> 4 or 2 -> 4 -> 8).
# (With the straggler report on: its per-rank slots and report also run under the
# sanitizers here, which leave test_train_cli out.)
check dp2_zero3 2 --set parallel.dp=2 --set parallel.micro_batch=2 --set parallel.zero=3 \
  --set log.straggler_every=2
check pp2_1f1b 2 --set parallel.pp=2 --set parallel.micro_batch=2 --set parallel.schedule=\"1f1b\"
release_only "pp 2 interleaved-1f1b and pp 2 x dp 2 zb-h1 ZeRO-2 ramp-ups" || {
  check pp2_interleaved 2 --set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.micro_batch=2 \
    --set parallel.schedule=\"interleaved-1f1b\"
  check pp2_dp2_zbh1_zero2 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.micro_batch=1 \
    --set parallel.schedule=\"zb-h1\" --set parallel.zero=2
}

# Resume across a threshold: 3 steps (16 sequences) saved; steps 3 (batch 8) and 4-5
# (batch 16) resumed on pp 2 1f1b give the uninterrupted pp 2 run's bits.
pp=(--set parallel.pp=2 --set parallel.micro_batch=2)
run part 2 "${pp[@]}" --set train.steps=3 --set "checkpoint.dir=\"$TMP/ck\""
grep_q -E '"sequences_consumed": ?16[,}]' "$TMP/ck/step_00000003/state.json" &&
  grep_q -E '"batch_rampup": ?"samples 0:4 8:8 24:16"' "$TMP/ck/step_00000003/state.json" && pass ||
  fail "state.json does not record the ramp-up and 16 sequences consumed"
run resumed 2 "${pp[@]}" --set "checkpoint.dir=\"$TMP/ck\"" \
  --set checkpoint.load=\"latest\"
if [ -f "$TMP/resumed.jsonl" ]; then
  cmp -s <(losses "$TMP/resumed.jsonl") <(losses "$TMP/pp2_1f1b.jsonl" | tail -n 3) &&
    cmp -s <(norms "$TMP/resumed.jsonl") <(norms "$TMP/pp2_1f1b.jsonl" | tail -n 3) && pass ||
    fail "the run resumed across the threshold is not the uninterrupted one bit for bit"
fi
# A changed ramp-up would change step 4's batch: refused naming both, unless allowed
# (the allowed run: the release build's, its code is the refused one's and the steps').
expect_error 2 'ran train.batch_rampup = "samples 0:4 8:8 24:16", but this run has "samples 0:4 8:8 40:16"' \
  "${common[@]}" "${pp[@]}" --set "checkpoint.dir=\"$TMP/ck\"" --set checkpoint.load=\"$TMP/ck/step_00000003\" \
  --set 'train.batch_rampup="samples 0:4 8:8 40:16"' --set "checkpoint.overwrite=true"
release_only "an allowed ramp-up change" ||
if run_np 2 "${common[@]}" "${pp[@]}" --set "checkpoint.dir=\"$TMP/ck2\"" \
  --set checkpoint.load=\"$TMP/ck/step_00000003\" --set 'train.batch_rampup="samples 0:4 8:8 40:16"' \
  --set train.allow_schedule_change=true --set "log.metrics=\"$TMP/changed.jsonl\""; then
  got="$(field "$TMP/changed.jsonl" global_batch)"
  [ "$got" = "8 8 8 " ] && grep_q "batch_rampup changes on resuming" "$TMP/err" && pass ||
    fail "an allowed ramp-up change: batches $got"
else
  fail "an allowed ramp-up change failed"; sed 's/^/    /' "$TMP/err" >&2
fi

# A CSV schedule runs a fixed number of micro-batches.
printf 'rank,action\n' >"$TMP/s.csv"
expect_error 0 "train.batch_rampup cannot ramp parallel.schedule" "${common[@]}" \
  --set "parallel.schedule=\"$TMP/s.csv\""

# tessera plan plans the batch the ramp-up ends at, and says so.
if "$TESSERA" plan "$SRC/configs/tiny.cfg" --set "$ramp" >"$TMP/plan" 2>&1 &&
   grep_q "batch ramp-up: planned at train.global_batch = 16" "$TMP/plan" &&
   grep_q "4 micro-batches of 4 x" "$TMP/plan"; then pass
else fail "tessera plan with a ramp-up: $(cat "$TMP/plan")"; fi
finish
