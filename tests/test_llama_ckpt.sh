# A Llama checkpoint of configs/llama-tiny.cfg (2 layers: GQA with 2 key/value heads, an
# untied head) saved on pp2 x dp2 x tp2 with ZeRO-1 (test_ckpt_llama.sh covers the files,
# config.json, the other grids and the refusals): loaded on 1x1x4 (each key/value head
# replicated on two ranks, the moments of ZeRO-1's pieces gathered) and saved again it
# gives the same bytes; 3 + 3 resumed steps on the saving grid equal 6 uninterrupted ones
# bit for bit; `tessera sample` writes text from it (the same seed, the same text). Multi-token
# prediction's modules reshard from pp 2 to tp 2 byte for byte, and a checkpoint with
# another module count is refused.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
base=(train "$SRC/configs/llama-tiny.cfg" --set model.n_layer=2 --set model.seq_len=32
      --set train.global_batch=8 --set parallel.micro_batch=2 --set train.warmup=2
      --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set train.threads=1
      --set log.progress=false --set train.lr_decay_steps=6)


A="$TMP/a/step_00000003"
run_base a 8 $(grid 2 2 2) --set parallel.zero=1 --set train.steps=3 --set "checkpoint.dir=\"$TMP/a\""
for g in "1 1 4"; do
  set -- $g
  d="$TMP/b_$1x$2x$3"
  run_base "b_$1x$2x$3" $(($1 * $2 * $3)) $(grid "$1" "$2" "$3") --set train.steps=3 \
    --set "checkpoint.load=\"$A\"" --set "checkpoint.dir=\"$d\"" &&
    same_ckpt "$A" "$d/step_00000003" "llama A -> $1x$2x$3"
done

run_base full 8 $(grid 2 2 2) --set parallel.zero=1 --set train.steps=6
cp "$TMP/a.jsonl" "$TMP/resumed.jsonl"
run_base resumed 8 $(grid 2 2 2) --set parallel.zero=1 --set train.steps=6 \
  --set "checkpoint.dir=\"$TMP/a\"" --set checkpoint.load=latest
if cmp -s <(losses "$TMP/full.jsonl") <(losses "$TMP/resumed.jsonl"); then pass
else fail "llama: 3 + 3 resumed steps differ from 6 uninterrupted steps"; fi

# Text from the checkpoint, on one process.
for s in a b; do
  if OMP_NUM_THREADS=1 timeout 60 "$TESSERA" sample "$A" --prompt "The " --tokens 40 --seed 3 \
       >"$TMP/sample_$s" 2>"$TMP/sample.err"; then pass
  else fail "tessera sample on a llama checkpoint"; sed 's/^/    /' "$TMP/sample.err" >&2; fi
done
cmp -s "$TMP/sample_a" "$TMP/sample_b" && [ "$(head -c 4 "$TMP/sample_a")" = "The " ] &&
  [ "$(wc -c < "$TMP/sample_a")" -ge 44 ] && pass || fail "llama samples: $(cat "$TMP/sample_a")"

# Multi-token prediction's modules (model.mtp_layers = 2): saved on pp 2 (the modules on the
# last stage, its copy of the embedding not written), loaded on tp 2 and saved again, the
# same bytes; a config with another module count is refused naming the key.
M="$TMP/m/step_00000003"
mtp=(--set model.mtp_layers=2 --set train.mtp_loss=0.3)
release_only "MTP's checkpoint resharded pp 2 -> tp 2 (the same files and code as the llama's above)" ||
  { run_base m 2 "${mtp[@]}" $(grid 2 1 1) --set train.steps=3 --set "checkpoint.dir=\"$TMP/m\"" &&
    run_base m_tp2 2 "${mtp[@]}" $(grid 1 1 2) --set train.steps=3 --set "checkpoint.load=\"$M\"" \
      --set "checkpoint.dir=\"$TMP/m_tp2\"" &&
    same_ckpt "$M" "$TMP/m_tp2/step_00000003" "MTP pp 2 -> tp 2"; }
expect_error 1 "saved with model.mtp_layers = 0, but the config says 2" "${base[@]}" "${mtp[@]}" \
  --set train.steps=3 --set "checkpoint.load=\"$A\""

finish
