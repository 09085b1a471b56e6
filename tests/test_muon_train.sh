# Muon through the trainer (train.optimizer = "muon"; tests/test_muon_fixture.c holds the
# optimizer itself to torch.optim.Muon): 4 steps of the tiny Llama on one rank report the
# update RMS of both groups and train differently from AdamW; pp 2 gives the one-rank
# losses (each stage updates its own matrices); train.device = "cpu-strict" (device
# memory the host cannot touch) gives them too; the keys are refused where they cannot
# run, by key.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
common=(train "$SRC/configs/llama-tiny.cfg" --set train.steps=4 --set train.global_batch=8
        --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set train.threads=1
        --set log.progress=false --set 'train.optimizer="muon"')

check ref 1
# Both groups' update RMS on every step line, positive; Muon's about 0.2 lr under
# match_rms_adamw (its orthogonalised update has RMS ~ 1/sqrt(max(rows, cols))).
rms=$(grep '"step":3,' "$TMP/ref.jsonl" | grep -o '"update_rms_[a-z]*":[^,}]*' | tr '\n' ' ')
lr=$(grep '"step":3,' "$TMP/ref.jsonl" | grep -o '"lr":[^,]*' | cut -d: -f2)
muon=$(echo "$rms" | grep -o 'update_rms_muon":[^ ]*' | cut -d: -f2)
adamw=$(echo "$rms" | grep -o 'update_rms_adamw":[^ ]*' | cut -d: -f2)
awk -v m="$muon" -v a="$adamw" -v lr="$lr" \
  'BEGIN { exit !(m > 0.1 * lr && m < 0.4 * lr && a > 0 && a < 2 * lr) }' \
  && pass || fail "update RMS at step 3: muon '$muon', adamw '$adamw' (lr $lr)"
check pp2 2 --set parallel.pp=2
if run_np 1 "${common[@]}" --set 'train.optimizer="adamw"' --set "log.metrics=\"$TMP/adamw.jsonl\""; then
  pass
  [ "$(loss_at "$TMP/adamw.jsonl" 3)" != "$(loss_at "$TMP/ref.jsonl" 3)" ] \
    && pass || fail "train.optimizer = \"muon\" trains as AdamW does"
  grep_q update_rms "$TMP/adamw.jsonl" && fail "an AdamW run reports update_rms" || pass
else
  fail "AdamW run"; sed 's/^/    /' "$TMP/err" >&2
fi
if [ -z "${TS_TEST_DEVICE:-}" ]; then
  check strict 1 --set 'train.device="cpu-strict"'
fi
expect_error 2 "'train.optimizer' = \"muon\" on parallel.dp = 2" "${common[@]}"
expect_error 0 "'train.muon_nesterov' is set, but train.optimizer = \"adamw\"" \
  "${common[@]}" --set 'train.optimizer="adamw"' --set train.muon_nesterov=false
finish
