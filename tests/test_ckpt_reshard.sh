# Checkpoints reshard between grids (the trusted test): save on grid A, load on grid B,
# save again, and both checkpoints hold the same logical tensors, model and optimizer,
# bit for bit (the files are compared byte for byte: the layout depends on the config
# only). A = pp2 x dp2 x tp2 interleaved (v = 2) with ZeRO-1; B = 1x1x1, 4x1x2, 1x4x2
# (ZeRO off), 2x1x4, 1x2x2 with ZeRO-1 (under the sanitizers and in the strict copy: A on
# pp2 x dp2, B on at most 4 ranks; below), and a prime vocabulary (257) over tp = 3 ->
# tp = 2. Also split model
# files (checkpoint.file_gb) read back into one file, and resuming: 3 + 3 steps equal 6
# uninterrupted steps bit for bit on the same grid, and within 1e-4 on other grids;
# asynchronous saves write the same bytes. Muon's momentum likewise (its cases below).
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
base=(train "$SRC/configs/tiny.cfg" --set model.n_layer=3 --set model.n_embd=96
      --set model.n_head=12 --set model.seq_len=32 --set train.global_batch=8
      --set parallel.micro_batch=2 --set train.warmup=2 --set "data.train=\"$TMP/train.bin\""
      --set 'data.val=""' --set train.threads=1 --set log.progress=false
      --set train.lr_decay_steps=6)
# Every run here follows one 6-step schedule (train.lr_decay_steps), whatever its
# train.steps: a resumed run must continue its checkpoint's schedule, and "3 saved + 3
# resumed" is compared with 6 uninterrupted steps.
interleaved=(--set parallel.virtual_stages=2 --set parallel.schedule=interleaved-1f1b)
# Grid A and the grids B that load it. Under the sanitizers and in the strict copy
# (TS_TEST_MAX_RANKS=4, lib.sh's check) the 8-rank grids are the release build's: A is
# pp2 x dp2 interleaved with ZeRO-1 (its moments in dp pieces over the interleaved
# chunks), and the B grids that load and save it again bring tp back on at most 4 ranks
# (pp2 x tp2, tp 4, dp2 x tp2 with ZeRO-1): every axis's slicing on load and gathering on
# save, the same code on smaller groups (docs/CI.md).
A_GRID="2 2 2"
B_GRIDS=("1 1 1 0" "4 1 2 0" "1 4 2 0" "2 1 4 0" "1 2 2 1")
if [ "${TS_TEST_MAX_RANKS:-1000}" -lt 8 ]; then
  A_GRID="2 2 1"
  B_GRIDS=("1 1 1 0" "2 1 2 0" "1 1 4 0" "1 2 2 1")
  skip_case "A on 2x2x2 and B on 4x1x2, 1x4x2, 2x1x4 (the release build runs them; here grids of at most ${TS_TEST_MAX_RANKS} ranks)"
fi
# shellcheck disable=SC2086 # A_GRID's words are grid's arguments
A_NP=$(( $(echo $A_GRID | tr ' ' '*') ))



# A: 3 steps on pp2 x dp2 x tp2 interleaved with ZeRO-1.
A="$TMP/a/step_00000003"
run_base a "$A_NP" $(grid $A_GRID) "${interleaved[@]}" --set parallel.zero=1 --set train.steps=3 \
  --set "checkpoint.dir=\"$TMP/a\""
[ "$(cat "$TMP/a/latest")" = step_00000003 ] && pass || fail "latest does not name step_00000003"

# B: load A on another grid with train.steps = 3 (nothing to train), save again, compare.
for g in "${B_GRIDS[@]}"; do
  set -- $g
  d="$TMP/b_$1x$2x$3_z$4"
  run_base "b_$1x$2x$3" $(($1 * $2 * $3)) $(grid "$1" "$2" "$3") --set parallel.zero="$4" \
    --set train.steps=3 --set "checkpoint.load=\"$A\"" --set "checkpoint.dir=\"$d\"" &&
    same_ckpt "$A" "$d/step_00000003" "A -> $1x$2x$3 (zero $4)"
done

# Split model files (about 100 KB each, with the Hugging Face index) read back whole.
run_base split 4 $(grid 2 1 2) --set train.steps=3 --set "checkpoint.load=\"$A\"" \
  --set "checkpoint.dir=\"$TMP/split\"" --set checkpoint.file_gb=0.0001
n=$(ls "$TMP/split/step_00000003"/model-*-of-*.safetensors 2>/dev/null | wc -l)
[ "$n" -gt 2 ] && [ -f "$TMP/split/step_00000003/model.safetensors.index.json" ] && pass ||
  fail "file_gb = 0.0001 gave $n model files (and an index?)"
grep -q '"transformer.h.2.mlp.c_proj.weight": "model-' "$TMP/split/step_00000003/model.safetensors.index.json" &&
  pass || fail "the index does not map the weights to their files"
run_base unsplit 1 --set train.steps=3 --set "checkpoint.load=\"$TMP/split\"" --set "checkpoint.dir=\"$TMP/unsplit\"" &&
  same_ckpt "$A" "$TMP/unsplit/step_00000003" "split -> one file"

# A prime vocabulary over tp = 3, resharded to tp = 2 (uneven rows both ways).
run_base p3 3 $(grid 1 1 3) --set model.vocab_size=257 --set train.steps=2 --set "checkpoint.dir=\"$TMP/p3\""
run_base p2 2 $(grid 1 1 2) --set model.vocab_size=257 --set train.steps=2 \
  --set "checkpoint.load=\"$TMP/p3/step_00000002\"" --set "checkpoint.dir=\"$TMP/p2\"" &&
  same_ckpt "$TMP/p3/step_00000002" "$TMP/p2/step_00000002" "vocab 257: tp3 -> tp2"

# Resume: 3 + 3 steps equal 6 uninterrupted ones (bit for bit on A's grid, which also
# continues A's metrics file), and within 1e-4 when continued on other grids.
run_base full "$A_NP" $(grid $A_GRID) "${interleaved[@]}" --set parallel.zero=1 --set train.steps=6
cp "$TMP/a.jsonl" "$TMP/resumed.jsonl"
run_base resumed "$A_NP" $(grid $A_GRID) "${interleaved[@]}" --set parallel.zero=1 --set train.steps=6 \
  --set "checkpoint.dir=\"$TMP/a\"" --set checkpoint.load=latest
if cmp -s <(losses "$TMP/full.jsonl") <(losses "$TMP/resumed.jsonl") &&
   cmp -s <(norms "$TMP/full.jsonl") <(norms "$TMP/resumed.jsonl"); then pass
else fail "3 + 3 resumed steps differ from 6 uninterrupted steps"; paste <(losses "$TMP/full.jsonl") <(losses "$TMP/resumed.jsonl") >&2; fi
[ "$(cat "$TMP/a/latest")" = step_00000006 ] && pass || fail "latest does not name step_00000006"
for g in "1 1 1" "1 2 2" "2 1 1"; do
  set -- $g
  grep -v '"step":[345],' "$TMP/full.jsonl" | grep '"loss"' > "$TMP/other_$1$2$3.jsonl"
  run_base "other_$1$2$3" $(($1 * $2 * $3)) $(grid "$1" "$2" "$3") --set train.steps=6 \
    --set "checkpoint.load=\"$A\"" --set log.progress=false &&
    { out=$(same_losses "$TMP/other_$1$2$3.jsonl" "$TMP/full.jsonl" 1e-4) && pass ||
        fail "resumed on $1x$2x$3: $out"; }
done
# checkpoint.async (a thread writes while training goes on) saves the same bytes and
# leaves the losses alone: every step saved, against the synchronous saves.
for mode in false true; do
  run_base "every_$mode" 4 $(grid 2 2 1) --set parallel.zero=1 --set train.steps=4 --set checkpoint.every=1 \
    --set checkpoint.keep=4 --set checkpoint.async=$mode --set "checkpoint.dir=\"$TMP/every_$mode\""
done
for s in 1 2 3 4; do
  same_ckpt "$TMP/every_false/step_0000000$s" "$TMP/every_true/step_0000000$s" "async save of step $s"
done
cmp -s <(losses "$TMP/every_false.jsonl") <(losses "$TMP/every_true.jsonl") && pass ||
  fail "checkpoint.async changed the losses"

# Saving a step that exists replaces it whole (an atomic exchange of the directories):
# the run again from scratch into a copy of A's directory (checkpoint.overwrite: a fresh
# run is refused where checkpoints are without it, and starting over removes the old
# run's later steps, which the cases below still need in A's) leaves a checkpoint that
# verifies, no temporary or old directory, the same bytes (the same run), and only it.
cp -r "$TMP/a" "$TMP/again" && rm -f "$TMP/again/.lock"
run_base again "$A_NP" $(grid $A_GRID) "${interleaved[@]}" --set parallel.zero=1 --set train.steps=3 \
  --set "checkpoint.dir=\"$TMP/again\"" --set checkpoint.keep=5 --set checkpoint.overwrite=true
cmp -s "$A/model.safetensors" "$TMP/again/step_00000003/model.safetensors" &&
  "$TESSERA" ckpt verify "$TMP/again/step_00000003" >/dev/null && pass ||
  fail "re-saving step 3 over itself"
# Nothing hidden but the directory's lock file (checkpoint/claim.h), and no later step.
[ -z "$(ls -A "$TMP/again" | grep '^\.' | grep -vx '\.lock')" ] &&
  [ "$(cd "$TMP/again" && ls -d step_* | tr '\n' ' ')" = "step_00000003 " ] && pass ||
  fail "left behind: $(ls -A "$TMP/again")"

# No `latest` (a save stopped between its rename and `latest`): load = "latest" takes
# the newest complete step directory.
cp -r "$TMP/a" "$TMP/nolatest" && rm "$TMP/nolatest/latest"
run_base nolatest 1 --set train.steps=7 --set "checkpoint.dir=\"$TMP/nolatest\"" --set checkpoint.load=latest &&
  { [ "$(losses "$TMP/nolatest.jsonl" | wc -l)" = 1 ] && grep -q '"step":6,' "$TMP/nolatest.jsonl" && pass ||
      fail "without latest, load = latest did not continue from step 6"; }
# Rolled back to step 3 with step 6 present: pruning (keep = 2) removes the run's own
# older checkpoints, never the later step 6 of the run it rolled back from.
run_base rollback 1 --set train.steps=5 --set checkpoint.every=1 --set checkpoint.keep=2 \
  --set "checkpoint.dir=\"$TMP/a\"" --set "checkpoint.load=\"$A\""
[ "$(cd "$TMP/a" && ls -d step_* | tr '\n' ' ')" = "step_00000004 step_00000005 step_00000006 " ] && pass ||
  fail "after the rollback: $(ls "$TMP/a" | tr '\n' ' ')"

# Muon (train.optimizer = "muon"): the momentum of the block matrices is saved
# (momentum_buffer.<name>, no exp_avg_sq for them) and loaded: 3 + 3 steps equal 6
# uninterrupted ones bit for bit, losses, norms and the step-6 checkpoint's bytes.
# MUON_GRIDS: "pp dp tp zero" of the runs (one rank here; the distributed Muon adds its
# grids): the first runs 6 steps saving at 3 and 6, each resumes from its step 3.
muon=(--set 'train.optimizer="muon"')
MUON_GRIDS=("1 1 1 0")
set -- ${MUON_GRIDS[0]}
MA="$TMP/muon_full/step_00000003"
run_base muon_full $(($1 * $2 * $3)) $(grid "$1" "$2" "$3") --set parallel.zero="$4" "${muon[@]}" \
  --set train.steps=6 --set checkpoint.every=3 --set "checkpoint.dir=\"$TMP/muon_full\""
"$TESSERA" ckpt info "$MA" > "$TMP/muon_info" 2>&1
grep -q '^optimizer   muon' "$TMP/muon_info" &&
  grep -q 'momentum_buffer.transformer.h.2.mlp.c_proj.weight' "$TMP/muon_info" &&
  ! grep -q 'exp_avg_sq.transformer.h.2.mlp.c_proj.weight' "$TMP/muon_info" &&
  grep -q 'exp_avg_sq.transformer.h.2.mlp.c_proj.bias' "$TMP/muon_info" &&
  "$TESSERA" ckpt verify "$MA" >/dev/null && pass || fail "the Muon checkpoint's tensors: $(cat "$TMP/muon_info")"
later() { grep -E '"step":[345],' "$1" | grep '"loss"' > "$1.later"; echo "$1.later"; }
for g in "${MUON_GRIDS[@]}"; do
  set -- $g
  r="muon_r_$1x$2x$3_z$4"
  run_base "$r" $(($1 * $2 * $3)) $(grid "$1" "$2" "$3") --set parallel.zero="$4" "${muon[@]}" \
    --set train.steps=6 --set "checkpoint.load=\"$MA\"" --set "checkpoint.dir=\"$TMP/$r\"" &&
    same_ckpt "$TMP/muon_full/step_00000006" "$TMP/$r/step_00000006" "Muon: step 3 -> 6 on $1x$2x$3 (zero $4)"
  full=$(later "$TMP/muon_full.jsonl") resumed=$(later "$TMP/$r.jsonl")
  if [ -s "$full" ] && cmp -s <(losses "$full") <(losses "$resumed") &&
     cmp -s <(norms "$full") <(norms "$resumed"); then pass
  else fail "Muon: 3 + 3 steps resumed on $1x$2x$3 (zero $4) differ from 6 uninterrupted steps"
    paste <(losses "$full") <(losses "$resumed") >&2; fi
done
# Across grids: the one-rank Muon checkpoint at step 3 loaded on dp 2 with ZeRO-2 (each
# matrix's momentum read whole by its owner into its piece) and on tp 2 (the momentum
# split by the shard runs), saved again without a step: the same bytes; and trained on to
# step 6 on dp 2, the one-rank losses and norms within 1e-4 (the grid's sums).
# (In the strict copy: the default copy's; its same-grid resume above hands Muon's device
# buffers to the same writer and readers.)
[ -n "${TS_TEST_DEVICE:-}" ] || for g in "1 2 1 2" "1 1 2 1"; do
  set -- $g
  d="$TMP/muon_x_$1x$2x$3_z$4"
  run_base "muon_x_$1x$2x$3" $(($1 * $2 * $3)) $(grid "$1" "$2" "$3") --set parallel.zero="$4" \
    "${muon[@]}" --set train.steps=3 --set "checkpoint.load=\"$MA\"" --set "checkpoint.dir=\"$d\"" &&
    same_ckpt "$MA" "$d/step_00000003" "Muon: step 3 -> $1x$2x$3 (zero $4)"
done
[ -n "${TS_TEST_DEVICE:-}" ] || {
grep -v '"step":[345],' "$TMP/muon_full.jsonl" | grep '"loss"' > "$TMP/muon_other.jsonl"
run_base muon_other 2 $(grid 1 2 1) --set parallel.zero=2 "${muon[@]}" --set train.steps=6 \
  --set "checkpoint.load=\"$MA\"" --set log.progress=false &&
  { out=$(same_losses "$TMP/muon_other.jsonl" "$TMP/muon_full.jsonl" 1e-4) && pass ||
      fail "Muon resumed on 1x2x1 (zero 2): $out"; }
}
# Another optimizer than the checkpoint's is refused naming the key, before anything is
# written, both ways; with train.allow_optimizer_change it trains on (the missing state
# at zero) and its checkpoint holds its own optimizer's tensors.
# In the strict copy these are the default copy's: the refusals are decided from
# state.json before any device memory exists, and a switched resume reads less than
# muon_r's and a's resumes above, through the same readers (docs/CI.md).
if [ -n "${TS_TEST_DEVICE:-}" ]; then
  skip_case "optimizer switches refused and allowed (the default copy runs them; on $TS_TEST_DEVICE no device memory beyond the resumes above)"
else
  expect_error 1 "train.allow_optimizer_change = true" "${base[@]}" "${muon[@]}" --set train.steps=4 \
    --set "checkpoint.load=\"$TMP/unsplit/step_00000003\"" --set "checkpoint.dir=\"$TMP/switch\""
  grep -q 'saved by a train.optimizer = "adamw" run, but this run has "muon"' "$TMP/err" &&
    [ -z "$(ls "$TMP/switch" 2>/dev/null | grep step_)" ] && pass || fail "the refused switch: $(cat "$TMP/err"; ls -A "$TMP/switch")"
  expect_error 1 "train.allow_optimizer_change = true" "${base[@]}" --set train.steps=4 \
    --set "checkpoint.load=\"$MA\""
  for to in muon adamw; do
    from="$TMP/unsplit/step_00000003"
    [ "$to" = adamw ] && from="$MA"
    run_base "switch_$to" 1 --set "train.optimizer=\"$to\"" --set train.steps=4 \
      --set train.allow_optimizer_change=true --set "checkpoint.load=\"$from\"" \
      --set "checkpoint.dir=\"$TMP/switch_$to\"" &&
      grep -q 'train.optimizer changes on resuming' "$TMP/err" &&
      "$TESSERA" ckpt info "$TMP/switch_$to/step_00000004" > "$TMP/switch_info" &&
      grep -q "^optimizer   $to" "$TMP/switch_info" &&
      "$TESSERA" ckpt verify "$TMP/switch_$to/step_00000004" >/dev/null && pass ||
      fail "the allowed switch to $to: $(cat "$TMP/err")"
  done
fi

# A finished run's checkpoint loaded with train.steps below its step is refused.
expect_error 1 "has already run 3 steps, more than train.steps = 2" "${base[@]}" --set train.steps=2 \
  --set "checkpoint.load=\"$TMP/unsplit/step_00000003\""

finish
