# The data pipeline end to end: globs, the seeded shuffle, a two-dataset blend and
# validation spread over a list of files. With shuffle on and a 0.7/0.3 blend, one rank
# and dp2, pp2, tp2 and pp2 x dp2 give the same losses (relative 1e-4) and validation
# losses; a rerun is bit-identical; 3 steps, a save and 3 resumed steps are the 6-step
# run's losses bit for bit; the metrics carry the realised shares; a resume that changes
# the data order (data.shuffle, data.seed, the blend) is refused by key; shuffling changes
# the order (the losses differ from file order); a glob matching nothing is an error.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/all.bin"
# Three "web" shards and one "code" shard from the corpus text, and two validation files.
split -n 6 -d "$TMP/corpus.txt" "$TMP/part_"
for i in 0 1 2; do "$TESSERA" data "$TMP/part_0$i" "$TMP/web_$i.bin" >/dev/null; done
"$TESSERA" data "$TMP/part_03" "$TMP/code.bin" >/dev/null
"$TESSERA" data "$TMP/part_04" "$TMP/val_a.bin" >/dev/null
"$TESSERA" data "$TMP/part_05" "$TMP/val_b.bin" >/dev/null

STEPS=6
blend="data.train=({ path = \"$TMP/web_*.bin\"; weight = 0.7; }, { path = [\"$TMP/code.bin\"]; weight = 0.3; })"
common=(train "$SRC/configs/tiny.cfg" --set "train.steps=$STEPS" --set "$blend"
        --set "data.val=[\"$TMP/val_a.bin\", \"$TMP/val_*b.bin\"]" --set data.eval_every=3
        --set data.val_windows=10 --set model.n_layer=2 --set train.threads=1
        --set log.progress=false)

# val_losses FILE: the validation losses of a metrics file, one per line.
val_losses() { grep -o '"val_loss":[^,}]*' "$1" | cut -d: -f2; }
# same_val A B: the same number of validation losses, each within relative 1e-4.
same_val() {
  paste <(val_losses "$1") <(val_losses "$2") | awk '
    NF != 2 { bad = 1 } { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * $2) bad = 1; n++ }
    END { exit !(n == 2 && !bad) }'
}

check ref 1
# The start-up log (shown with log.progress) names the order and each dataset.
run_np 1 "${common[@]}" --set train.steps=1 --set log.progress=true \
  --set "log.metrics=\"$TMP/log.jsonl\"" && pass || fail "run with log.progress"
cat "$TMP/out" "$TMP/err" > "$TMP/ref.log"
grep -q "data: data.train read in a seeded order" "$TMP/ref.log" && pass || fail "start-up log does not name the shuffle"
grep -q "dataset 1 (weight 0.3): 1 file ($TMP/code.bin)" "$TMP/ref.log" && pass || fail "start-up log does not describe the blend"
grep -q "dataset 0 (weight 0.7): 3 files ($TMP/web_0.bin .. $TMP/web_2.bin)" "$TMP/ref.log" && pass || fail "the glob did not find the 3 web shards"
check dp2 2 --set parallel.dp=2
check pp2 2 --set parallel.pp=2 --set parallel.dp=1
check tp2 2 --set parallel.tp=2 --set parallel.dp=1
check pp2dp2 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.micro_batch=2
for g in dp2 pp2 tp2 pp2dp2; do
  same_val "$TMP/$g.jsonl" "$TMP/ref.jsonl" && pass || fail "$g: validation losses differ from one rank"
done
check dp2_again 2 --set parallel.dp=2
cmp -s <(losses "$TMP/dp2.jsonl") <(losses "$TMP/dp2_again.jsonl") && pass || fail "dp=2 rerun is not bit-identical"

# The realised shares: after 6 steps of 16 sequences, 67 and 29 of 96 (Megatron's rule).
last=$(grep '"step":5,' "$TMP/ref.jsonl")
echo "$last" | grep_q '"data_shares":\[0.697917,0.302083\]' && pass || fail "data_shares: $last"
echo "$last" | grep_q '"data_epochs":\[' && pass || fail "data_epochs missing: $last"

# Resume: 3 steps and a checkpoint, then 3 more = the 6-step run, bit for bit.
run_np 1 "${common[@]}" --set train.steps=3 --set "checkpoint.dir=\"$TMP/ck\"" \
  --set "log.metrics=\"$TMP/first.jsonl\"" && pass || { fail "first half"; sed 's/^/    /' "$TMP/err" >&2; }
grep -q '"shuffle": true' "$TMP/ck/step_00000003/state.json" && pass || fail "state.json lacks data.shuffle"
run_np 1 "${common[@]}" --set "checkpoint.dir=\"$TMP/ck\"" --set 'checkpoint.load="latest"' \
  --set "log.metrics=\"$TMP/second.jsonl\"" && pass || { fail "resume"; sed 's/^/    /' "$TMP/err" >&2; }
if cmp -s <(losses "$TMP/ref.jsonl") <(cat <(losses "$TMP/first.jsonl") <(losses "$TMP/second.jsonl"))
then pass; else fail "3 + 3 resumed steps differ from 6 steps"; fi

# A resume that would change the order is refused by key.
expect_error 1 "trained with data.shuffle = true, but the config says false" "${common[@]}" \
  --set data.shuffle=false --set "checkpoint.dir=\"$TMP/ck\"" --set 'checkpoint.load="latest"' \
  --set "log.metrics=\"$TMP/x.jsonl\""
expect_error 1 "shuffled the data with data.seed = 1234, but this run's is 7" "${common[@]}" \
  --set data.seed=7 --set "checkpoint.dir=\"$TMP/ck\"" --set 'checkpoint.load="latest"' \
  --set "log.metrics=\"$TMP/x.jsonl\""
expect_error 1 "was trained on a blend of 2 datasets with weights \[0.7, 0.3\]" "${common[@]}" \
  --set "data.train=\"$TMP/all.bin\"" --set "checkpoint.dir=\"$TMP/ck\"" \
  --set 'checkpoint.load="latest"' --set "log.metrics=\"$TMP/x.jsonl\""

# Shuffling changes the order: file order gives other losses from step 0 on.
run_np 1 "${common[@]}" --set data.shuffle=false --set "log.metrics=\"$TMP/plain.jsonl\"" \
  && pass || fail "data.shuffle = false run"
[ "$(loss_at "$TMP/plain.jsonl" 0)" != "$(loss_at "$TMP/ref.jsonl" 0)" ] && pass \
  || fail "data.shuffle made no difference to step 0"
# Another seed, another order.
run_np 1 "${common[@]}" --set data.seed=99 --set "log.metrics=\"$TMP/seed99.jsonl\"" \
  && pass || fail "data.seed = 99 run"
[ "$(loss_at "$TMP/seed99.jsonl" 0)" != "$(loss_at "$TMP/ref.jsonl" 0)" ] && pass \
  || fail "data.seed made no difference to step 0"

# Errors: a glob that matches nothing, a blend entry without a weight.
expect_error 1 "the pattern \"$TMP/nothing_\*.bin\" matches no file" "${common[@]}" \
  --set "data.train=\"$TMP/nothing_*.bin\""
expect_error 1 "blend entry 1 lacks 'weight'" "${common[@]}" \
  --set "data.train=({ path = \"$TMP/code.bin\"; weight = 1; }, { path = \"$TMP/code.bin\"; })"
expect_error 1 "weight = -1 must be a positive number" "${common[@]}" \
  --set "data.train=({ path = \"$TMP/code.bin\"; weight = -1; })"
finish
