#!/usr/bin/env bash
# Checkpoints, the run's claim and the blend against the hostile probe of 2026-12-06
# (../shared/reviews/2026-12-06-probe.md; docs/CONTRACT.md "Checkpoints", "The batch
# rule"), each refused with a clear message once, or handled, and nothing good lost:
#   D3: log.metrics / log.trace inside a step directory (or .tmp-step_N) that does not
#     exist yet, reached through "..", or under a checkpoint.dir not yet made: refused;
#     a new folder beside the checkpoints is fine;
#   D4: `rm DIR/.lock` under a running run: a second run is still refused (the
#     directory itself is locked) and the holder writes .lock again; a .lock replaced by
#     another file fails the holder's save rather than collide;
#   D9: a blend's files regrouped (same flat list, same weights) and a forged
#     data.dataset_files are refused; the same blend resumes bit for bit, from its
#     recorded cursor (data.blend_counts; forged counts refused) or, for a checkpoint
#     without one, by replay;
#   D10: weights whose sum overflows (1.7e308 + 1.0e308) blend 0.63/0.37 and state.json
#     records those weights.
# Usage: test_run_probe.sh TESSERA SOURCE_DIR
source "$(dirname "$0")/lib.sh"
CFG="$SRC/configs/tiny.cfg"
make_corpus "$TMP/train.bin"
split -n 3 -d "$TMP/corpus.txt" "$TMP/part_"
for i in 0 1 2; do "$TESSERA" data "$TMP/part_0$i" "$TMP/s$i.bin" >/dev/null; done
small=(--set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32 --set train.threads=1
       --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set log.progress=false
       --set 'log.metrics=""' --set train.global_batch=8)

# ---- D3: outputs inside checkpoints that do not exist yet
D="$TMP/d3"
run_one train "$CFG" "${small[@]}" --set train.steps=2 --set "checkpoint.dir=\"$D\"" \
  --set checkpoint.every=1 && pass || { fail "D3: first run"; sed 's/^/    /' "$TMP/err" >&2; }
resume=(train "$CFG" "${small[@]}" --set train.steps=4 --set "checkpoint.dir=\"$D\""
        --set checkpoint.every=1 --set 'checkpoint.load="latest"')
for out in "$D/step_00000003/m.jsonl" "$D/.tmp-step_00000003/m.jsonl" \
           "$D/new/../step_00000004/m.jsonl" "$D//step_00000003/sub/m.jsonl"; do
  expect_error 0 "log.metrics = .* is inside checkpoint.dir's checkpoints \(" \
    "${resume[@]}" --set "log.metrics=\"$out\""
done
[ ! -e "$D/step_00000003" ] && [ ! -e "$D/new" ] && pass || fail "D3: a refused run created a directory"
# A step pruned or not reached yet: log.trace there would make a bogus step_N.
expect_error 0 "log.trace = .* is inside checkpoint.dir's checkpoints \(step_00000006\)" \
  "${resume[@]}" --set "log.trace=\"$D/step_00000006/trace.json\""
# checkpoint.dir itself not made yet.
expect_error 0 "log.metrics = .* is inside checkpoint.dir's checkpoints" \
  train "$CFG" "${small[@]}" --set train.steps=1 --set "checkpoint.dir=\"$TMP/d3new/x\"" \
  --set "log.metrics=\"$TMP/d3new/x/step_00000001/m.jsonl\""
# Beside the checkpoints, in a folder made for it: fine, and the metrics stay.
run_one "${resume[@]}" --set "log.metrics=\"$D/logs/m.jsonl\"" && [ -s "$D/logs/m.jsonl" ] &&
  pass || { fail "D3: metrics beside the checkpoints"; sed 's/^/    /' "$TMP/err" >&2; }

# ---- D4: the lock file removed or replaced under a running run
# wait_for FILE PATTERN: until PATTERN is in FILE (a run got that far), 100 s at most.
wait_for() {
  local i
  for ((i = 0; i < 1000; i++)); do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
D="$TMP/d4"
# The holder stalls 4 s in each save (TS_TEST_SAVE_STALL_S), long enough for the
# newcomer's start-up; it holds the directory until it ends after step 2's save.
TS_TEST_SAVE_STALL_S=4 timeout 120 "$TESSERA" train "$CFG" "${small[@]}" --set train.steps=2 \
  --set "checkpoint.dir=\"$D\"" --set checkpoint.every=1 --set log.progress=true "${DEVICE_SETS[@]}" \
  >"$TMP/a.out" 2>"$TMP/a.err" &
holder=$!
if wait_for "$TMP/a.err" "stalling mid-save"; then
  rm "$D/.lock"
  expect_error 0 "checkpoint.dir .* is in use by another run \(host and pid: unknown" \
    train "$CFG" "${small[@]}" --set train.steps=4 --set "checkpoint.dir=\"$D\"" \
    --set checkpoint.every=1 --set 'checkpoint.load="latest"'
  wait "$holder"
  rc=$?
  [ "$rc" -eq 0 ] && grep -q "was removed while this run held .*; it is written again" "$TMP/a.err" &&
    [ -f "$D/.lock" ] && [ "$(cat "$D/latest")" = step_00000002 ] &&
    "$TESSERA" ckpt verify "$D" >/dev/null && pass ||
    { fail "D4: the holder (exit $rc) did not finish its saves and write .lock again"; sed 's/^/    /' "$TMP/a.err" >&2; }
else
  fail "D4: the holder never reached its save"; sed 's/^/    /' "$TMP/a.err" >&2
  wait "$holder"
fi
# Replaced by another file (another run's, as far as the holder can tell): its save fails.
D="$TMP/d4b"
TS_TEST_SAVE_STALL_S=3 timeout 120 "$TESSERA" train "$CFG" "${small[@]}" --set train.steps=1 \
  --set "checkpoint.dir=\"$D\"" --set log.progress=true "${DEVICE_SETS[@]}" >"$TMP/b.out" 2>"$TMP/b.err" &
holder=$!
if wait_for "$TMP/b.err" "stalling mid-save"; then
  rm "$D/.lock" && echo "elsewhere 1" > "$D/.lock"
  wait "$holder"
  judge_error --stderr "$TMP/b.err" "D4: the holder's save after .lock was replaced" $? \
    "its lock file .*\.lock was replaced while this run held it" &&
    { [ ! -e "$D/step_00000001" ] && [ ! -e "$D/latest" ] && pass || fail "D4: a save committed after .lock was replaced"; }
else
  fail "D4: the second holder never reached its save"; sed 's/^/    /' "$TMP/b.err" >&2
  wait "$holder"
fi

# ---- D9: a blend regrouped, forged groupings and cursors
blend() { echo "data.train=($1)"; }
ab_c=$(blend "{ path = \"$TMP/s0.bin\"; weight = 0.5; }, { path = [\"$TMP/s1.bin\", \"$TMP/s2.bin\"]; weight = 0.5; }")
a_bc=$(blend "{ path = [\"$TMP/s0.bin\", \"$TMP/s1.bin\"]; weight = 0.5; }, { path = \"$TMP/s2.bin\"; weight = 0.5; }")
D="$TMP/d9"
run_one train "$CFG" "${small[@]}" --set "$ab_c" --set train.steps=4 \
  --set "log.metrics=\"$TMP/whole.jsonl\"" && pass || { fail "D9: uninterrupted run"; sed 's/^/    /' "$TMP/err" >&2; }
run_one train "$CFG" "${small[@]}" --set "$ab_c" --set train.steps=2 --set "checkpoint.dir=\"$D\"" &&
  pass || { fail "D9: first half"; sed 's/^/    /' "$TMP/err" >&2; }
STATE="$D/step_00000002/state.json"
python3 - "$STATE" <<'EOF' && pass || fail "D9: state.json's dataset_files and blend_counts"
import json, sys
d = json.load(open(sys.argv[1]))["data"]
assert d["dataset_files"] == [1, 2], d
assert d["blend_counts"] == [8, 8], d   # 16 sequences of a 0.5/0.5 blend
EOF
resume=(train "$CFG" "${small[@]}" --set train.steps=4 --set "checkpoint.dir=\"$D\""
        --set 'checkpoint.load="latest"')
expect_error 0 "blend whose datasets held \[1, 2\] files, but data.train's now hold \[2, 1\]" \
  "${resume[@]}" --set "$a_bc"
# forge KEY VALUE: state.json's data.KEY set to VALUE (json; null deletes it), its own
# checksum made right again (the crc tessera computes, read from its refusal), so only
# the forged value can be what a resume refuses.
forge() {
  rm -rf "$D/step_00000004"
  echo step_00000002 > "$D/latest"
  cp "$STATE.orig" "$STATE"
  python3 - "$STATE" "$1" "$2" <<'EOF'
import json, sys
p, key, value = sys.argv[1:]
s = json.load(open(p))
v = json.loads(value)
if v is None: del s["data"][key]
else: s["data"][key] = v
json.dump(s, open(p, "w"), indent=1)
EOF
  run_one "${resume[@]}" --set "$ab_c"
  local crc
  crc=$(sed -n 's/.*(crc32 \([0-9a-f]*\), it says.*/\1/p' "$TMP/err")
  [ -n "$crc" ] && sed -i "s/\"state_crc32\": [0-9]*/\"state_crc32\": $((16#$crc))/" "$STATE"
  rm -rf "$D/step_00000004" # where the forged state passed, that run went on and saved
  echo step_00000002 > "$D/latest"
}
cp "$STATE" "$STATE.orig"
forge dataset_files '[2, 1]'
expect_error 0 "blend whose datasets held \[2, 1\] files, but data.train's now hold \[1, 2\]" \
  "${resume[@]}" --set "$ab_c"
forge dataset_files '[5, 5]'
expect_error 0 "records data.dataset_files = \[5, 5\], which is no grouping" "${resume[@]}" --set "$ab_c"
forge blend_counts '[9, 8]'
expect_error 0 "records data.blend_counts that are not its blend's sequences" "${resume[@]}" --set "$ab_c"
forge blend_counts '[0, 16]'
expect_error 0 "records data.blend_counts that are not its blend's sequences" "${resume[@]}" --set "$ab_c"
# The same blend resumes bit for bit: from the recorded cursor, and (an older
# checkpoint, without one) by replaying the blend.
for how in cursor replay; do
  if [ $how = cursor ]; then forge blend_counts '[8, 8]'; else forge blend_counts null; fi
  run_one "${resume[@]}" --set "$ab_c" --set "log.metrics=\"$TMP/$how.jsonl\"" &&
    cmp -s <(losses "$TMP/whole.jsonl" | tail -n 2) <(losses "$TMP/$how.jsonl") && pass ||
    { fail "D9: resuming the same blend ($how) is not the uninterrupted run"; sed 's/^/    /' "$TMP/err" >&2; }
done

# ---- D10: weights whose sum overflows a double
huge=$(blend "{ path = \"$TMP/train.bin\"; weight = 1.7e308; }, { path = \"$TMP/train.bin\"; weight = 1.0e308; }")
D="$TMP/d10"
run_one train "$CFG" "${small[@]}" --set "$huge" --set train.steps=2 --set "checkpoint.dir=\"$D\"" \
  --set "log.metrics=\"$TMP/huge.jsonl\"" && pass || { fail "D10: run"; sed 's/^/    /' "$TMP/err" >&2; }
python3 - "$D/step_00000002/state.json" "$TMP/huge.jsonl" <<'EOF' && pass || fail "D10: weights or shares"
import json, sys
w = json.load(open(sys.argv[1]))["data"]["weights"]
assert abs(w[0] - 1.7 / 2.7) < 1e-12 and abs(w[1] - 1.0 / 2.7) < 1e-12, w
last = [json.loads(l) for l in open(sys.argv[2]) if '"step":1,' in l][0]
assert last["data_shares"] == [0.625, 0.375], last   # 10 and 6 of 16 sequences
EOF

finish
