# Llama checkpoints (model.arch = "llama", grouped-query attention, untied head): the
# step directory holds Hugging Face's names and a config.json that LlamaConfig reads
# (checked key by key with python3's json); they reshard between grids bit for bit (the
# key/value heads split over tp = 2 and replicated over tp = 4); a resume continues the
# uninterrupted run within 1e-4; a resume into another llama model (n_kv_head,
# tie_embeddings, rope_theta, arch) is refused by key; verify finds an edited or missing
# config.json; model.init reads a step directory, whole or split with its index, as a
# save_pretrained directory; a tied llama on two stages stores no lm_head.weight; and a
# vocabulary above 65536 trains on Llama 3 (uint32) shards, whose ids are checked.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
base=(train "$SRC/configs/tiny.cfg" --set model.arch=llama --set model.n_layer=2
      --set model.n_embd=64 --set model.n_head=4 --set model.n_kv_head=2
      --set model.seq_len=32 --set train.global_batch=8 --set parallel.micro_batch=2
      --set train.warmup=1 --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""'
      --set train.threads=1 --set log.progress=false --set train.lr_decay_steps=3)


# A: 2 steps on pp2 x tp2.
A="$TMP/a/step_00000002"
run_base a 4 $(grid 2 1 2) --set train.steps=2 --set "checkpoint.dir=\"$TMP/a\""
if "$TESSERA" ckpt verify "$A" >/dev/null 2>"$TMP/err"; then pass; else fail "verify A"; cat "$TMP/err" >&2; fi
"$TESSERA" ckpt info "$A" > "$TMP/info"
for t in model.embed_tokens.weight model.layers.1.self_attn.k_proj.weight model.norm.weight lm_head.weight; do
  grep -q "^  $t " "$TMP/info" && pass || fail "info lacks $t"
done
grep -q "model.layers.0.self_attn.k_proj.weight  *F32 \[32,64\]" "$TMP/info" && pass ||
  fail "k_proj is not [NKV*HS, C] = [32,64]: $(grep k_proj "$TMP/info" | head -1)"
grep -q "n_kv_head 2, ffn_hidden 256, norm_eps 1e-05, rope_theta 500000, untied head" "$TMP/info" &&
  pass || fail "info's llama line: $(grep n_kv_head "$TMP/info")"
# config.json as LlamaConfig.from_pretrained reads it.
if python3 - "$A/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
        "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": None, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32"}
bad = {k: (c.get(k, "<missing>"), v) for k, v in want.items() if c.get(k, "<missing>") != v
       or type(c.get(k)) is not type(v)}
sys.exit(print("config.json (have, want):", bad) or 1 if bad else 0)
EOF
then pass; else fail "config.json"; fi

# B: A loaded on other grids (train.steps = 2: nothing to train) and saved again.
for g in "1 1 1" "1 1 4" "2 2 1"; do
  set -- $g
  d="$TMP/b_$1x$2x$3"
  run_base "b_$1x$2x$3" $(($1 * $2 * $3)) $(grid "$1" "$2" "$3") --set train.steps=2 \
    --set "checkpoint.load=\"$A\"" --set "checkpoint.dir=\"$d\"" &&
    same_files "$A" "$d/step_00000002" "A -> $1x$2x$3" model.safetensors optimizer.safetensors config.json
done

# Resume: A + 1 step on one rank against 3 uninterrupted steps there.
run_base full 1 --set train.steps=3
run_base resumed 1 --set train.steps=3 --set "checkpoint.load=\"$A\""
want=$(losses "$TMP/full.jsonl" | sed -n 3p) got=$(losses "$TMP/resumed.jsonl" | tail -1)
if awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d <= 1e-4 * (b < 0 ? -b : b)) }'; then
  pass; else fail "resumed step 2 loss $got vs uninterrupted $want"; fi

# Another llama model is refused by the key that differs.
for kv in "model.n_kv_head=4|model.n_kv_head = 2, but the config says 4" \
          "model.tie_embeddings=true|model.tie_embeddings = false, but the config says true" \
          "model.rope_theta=10000|model.rope_theta = 500000, but the config says 10000" \
          "model.ffn_hidden=128|model.ffn_hidden = 256, but the config says 128"; do
  expect_error 1 "${kv#*|}" "${base[@]}" --set 'log.metrics=""' --set train.steps=3 \
    --set "${kv%%|*}" --set "checkpoint.load=\"$A\""
done
expect_error 1 'is of a model.arch = "llama" model, but the config says "gpt2"' \
  "${base[@]}" --set 'log.metrics=""' --set train.steps=3 --set model.arch=gpt2 \
  --set model.n_kv_head=0 --set model.rope_theta=0 --set "checkpoint.load=\"$A\""

# verify: config.json edited, then missing.
cp -r "$A" "$TMP/edited"
sed -i 's/"num_key_value_heads": 2/"num_key_value_heads": 4/' "$TMP/edited/config.json"
expect_error --rc 5 0 'config.json: "num_key_value_heads" is another value' ckpt verify "$TMP/edited"
rm "$TMP/edited/config.json"
expect_error --rc 4 0 'config.json: No such file or directory; a llama checkpoint holds its Hugging Face config' \
  ckpt verify "$TMP/edited"

# model.init from a step directory (a save_pretrained directory), whole and split.
run_base init 1 --set train.steps=0 --set "model.init=\"$A\"" --set "checkpoint.dir=\"$TMP/init\""
same_files "$A" "$TMP/init/step_00000000" "model.init = A" model.safetensors config.json
run_base split 2 $(grid 2 1 1) --set train.steps=2 --set "checkpoint.load=\"$A\"" \
  --set "checkpoint.dir=\"$TMP/split\"" --set checkpoint.file_gb=0.0001
S="$TMP/split/step_00000002"
n=$(ls "$S"/model-*-of-*.safetensors 2>/dev/null | wc -l)
[ "$n" -gt 2 ] && [ -f "$S/model.safetensors.index.json" ] && [ -f "$S/config.json" ] && pass ||
  fail "file_gb = 0.0001: $n model files, index and config.json?"
run_base init_split 2 $(grid 1 1 2) --set train.steps=0 --set "model.init=\"$S\"" \
  --set "checkpoint.dir=\"$TMP/init_split\""
same_files "$A" "$TMP/init_split/step_00000000" "model.init = split A" model.safetensors

# A tied llama on two stages: one embedding, no lm_head.weight, tie_word_embeddings true.
T="$TMP/tied/step_00000001"
run_base tied 2 $(grid 2 1 1) --set model.tie_embeddings=true --set train.steps=1 \
  --set "checkpoint.dir=\"$TMP/tied\""
"$TESSERA" ckpt info "$T" > "$TMP/info_tied" 2>&1
if ! grep -q "lm_head.weight" "$TMP/info_tied" && grep -q "^  model.embed_tokens.weight " "$TMP/info_tied" &&
   grep -q '"tie_word_embeddings": true' "$T/config.json" && "$TESSERA" ckpt verify "$T" >/dev/null; then
  pass; else fail "tied llama checkpoint"; fi

# A vocabulary above 65536 on a Llama 3 shard (ids beyond 65535), and an id too large.
python3 - "$TMP/wide.bin" 70000 <<'EOF'
import struct, sys
n, v = 4000, int(sys.argv[2])
toks = [(i * 7919 + 65000) % v for i in range(n)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240801, 7, n, *([0] * 253)))
    f.write(struct.pack("<%dI" % n, *toks))
EOF
run_base wide 1 --set model.vocab_size=70000 --set train.steps=1 --set "data.train=\"$TMP/wide.bin\""
expect_error 1 "wide.bin: token [0-9]+ at position [0-9]+ is >= vocab_size 66000" "${base[@]}" \
  --set 'log.metrics=""' --set model.vocab_size=66000 --set train.steps=1 \
  --set "data.train=\"$TMP/wide.bin\""
finish
