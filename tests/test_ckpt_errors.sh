# Damaged checkpoints: `tessera ckpt verify` names each damage (file and tensor) with its
# exit code (3 state, 4 incomplete, 5 corrupt), `tessera train` refuses to load it on 2
# ranks with the same message once and a non-zero exit, and the damaged files are left
# byte for byte as they were. Also `ckpt info` and its errors, and config mismatches.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
CFG="$SRC/configs/tiny.cfg"
small=(--set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
       --set train.global_batch=8 --set parallel.micro_batch=4 --set data.eval_every=0
       --set log.progress=false --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""'
       --set "log.metrics=\"$TMP/metrics.jsonl\"")

# One checkpoint after 2 steps on dp=2.
if ! run_np 2 train "$CFG" "${small[@]}" --set train.steps=2 --set parallel.dp=2 \
    --set "checkpoint.dir=\"$TMP/good\""; then
  fail "could not write the checkpoint"; sed 's/^/    /' "$TMP/err" >&2; finish; exit 1
fi
STEP=step_00000002

# ckpt ARGS...: tessera ckpt in one process; stdout/stderr in $TMP/out, $TMP/err, exit
# code in $rc.
ckpt() {
  timeout 60 "$TESSERA" ckpt "$@" >"$TMP/out" 2>"$TMP/err"
  rc=$?
}

# --- a good checkpoint ------------------------------------------------------------------
for d in "$TMP/good" "$TMP/good/$STEP"; do
  ckpt verify "$d"
  if [ "$rc" -eq 0 ] && grep -qE "$STEP: OK: step 2, 84 tensors in 2 files" "$TMP/out" &&
     [ ! -s "$TMP/err" ]; then pass; else fail "verify $d: rc $rc"; cat "$TMP/out" "$TMP/err" >&2; fi
done
ckpt info "$TMP/good"
if [ "$rc" -eq 0 ] && grep -qE "^step +2 " "$TMP/out" &&
   grep -qE "pp 1 x dp 2 x tp 1" "$TMP/out" &&
   grep -qE "n_layer 2, n_head 4, n_embd 64" "$TMP/out" &&
   grep -qE "^  model.safetensors +[0-9]+ bytes +28 tensors" "$TMP/out" &&
   grep -qE "^  optimizer.safetensors +[0-9]+ bytes +56 tensors" "$TMP/out" &&
   grep -qE "^  transformer.h.1.mlp.c_fc.weight +F32 \[256,64\] +65536 bytes" "$TMP/out" &&
   grep -qE "^  exp_avg_sq.transformer.ln_f.bias +F32 \[64\]" "$TMP/out"; then
  pass
else
  fail "ckpt info: rc $rc"; cat "$TMP/out" "$TMP/err" >&2
fi

# --- usage ------------------------------------------------------------------------------
ckpt --help
if [ "$rc" -eq 0 ] && grep -q "tessera ckpt verify DIR" "$TMP/out" &&
   grep -qE "^  5  corrupt" "$TMP/out"; then pass; else fail "ckpt --help"; fi
# expect_ckpt CODE PATTERN ARGS...: tessera ckpt ARGS (one process) exits CODE and prints
# PATTERN once on stderr, as its one "tessera: error:" line (lib.sh's expect_error).
expect_ckpt() {
  local code="$1" pattern="$2"; shift 2
  expect_error --rc "$code" --one-error 0 "$pattern" ckpt "$@"
}
expect_ckpt 2 "ckpt: needs a command" 
expect_ckpt 2 "unknown command \(info or verify\) 'check'" check "$TMP/good"
expect_ckpt 2 "verify needs DIR" verify
expect_ckpt 2 "unknown option '--fast'" verify --fast "$TMP/good"
expect_ckpt 2 "unexpected argument 'more'" info "$TMP/good" more
expect_ckpt 3 "$TMP/nowhere: No such file or directory" verify "$TMP/nowhere"
expect_ckpt 3 "holds neither a checkpoint \(state.json\) nor a 'latest' file" info "$TMP"

# --- damaged copies ---------------------------------------------------------------------
# The safetensors surgery: flip a byte of a tensor, drop a tensor (a valid file without
# it), or change the header's metadata value (valid JSON, same length).
cat >"$TMP/damage.py" <<'EOF'
import json, struct, sys

def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:], b[:8 + n]

op, path, name = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
hdr, data, raw = read(path)
if op == "flip":  # one bit of the tensor's 11th byte
    at = len(raw) + hdr[name]["data_offsets"][0] + 10
    b = bytearray(raw + data)
    b[at] ^= 0x01
    open(path, "wb").write(bytes(b))
elif op == "drop":  # the file without tensor `name`, data_offsets recomputed
    order = sorted((k for k in hdr if k != "__metadata__"), key=lambda k: hdr[k]["data_offsets"][0])
    assert name in order
    out, blob, pos = {}, [], 0
    if "__metadata__" in hdr:
        out["__metadata__"] = hdr["__metadata__"]
    for k in order:
        if k == name:
            continue
        b0, b1 = hdr[k]["data_offsets"]
        blob.append(data[b0:b1])
        out[k] = dict(hdr[k], data_offsets=[pos, pos + b1 - b0])
        pos += b1 - b0
    h = json.dumps(out, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blob))
elif op == "meta":  # "format":"pt" -> "pu": still valid JSON, same length
    assert hdr["__metadata__"]["format"] == "pt"
    old = b'"format":"pt"'
    assert raw.count(old) == 1
    open(path, "wb").write(raw.replace(old, b'"format":"pu"') + data)
else:
    sys.exit("unknown op " + op)
EOF

# damaged NAME: a fresh copy of the good checkpoint root at $TMP/NAME.
damaged() {
  rm -rf "${TMP:?}/${1:?}"
  cp -r "$TMP/good" "$TMP/$1"
}
damage() { python3 "$TMP/damage.py" "$@" || fail "damage.py $*"; }

# refused NAME PATTERN SETS...: `tessera train` on 2 ranks (tp=2, another grid than the
# saver's) refuses to resume from $TMP/NAME (checkpoint.dir, load = latest unless the
# SETS say otherwise) with PATTERN once, and leaves every file of it as it was.
refused() {
  local name="$1" pattern="$2"; shift 2
  local root="$TMP/$name"
  rm -rf "$root.before"
  cp -r "$root" "$root.before"
  expect_error 2 "$pattern" train "$CFG" "${small[@]}" --set train.steps=4 --set parallel.tp=2 \
    --set "checkpoint.dir=\"$root\"" --set checkpoint.load=latest "$@"
  local a b f ok=1
  a=$(cd "$root.before" && find . | sort)
  b=$(cd "$root" && find . | sort)
  [ "$a" = "$b" ] || { ok=0; fail "$name: the files changed after the failed load:"; diff <(echo "$a") <(echo "$b") >&2; }
  while IFS= read -r f; do
    [ -f "$root.before/$f" ] || continue
    # The lock file names the run that holds the directory (checkpoint/claim.h): every
    # run writes it, and it is no part of a checkpoint.
    [ "$f" = ./.lock ] && continue
    cmp -s "$root.before/$f" "$root/$f" || { ok=0; fail "$name: $f was modified by the failed load"; }
  done <<<"$a"
  [ "$ok" -eq 1 ] && pass
}

M="model.safetensors"
O="optimizer.safetensors"

# (a) one flipped bit in a tensor's bytes, in the model and in the optimizer file.
damaged flip_model; damage flip "$TMP/flip_model/$STEP/$M" transformer.h.1.attn.c_proj.weight
p="$STEP/$M: tensor 'transformer.h.1.attn.c_proj.weight' fails its checksum in bytes \[0, 16384\)"
expect_ckpt 5 "$p" verify "$TMP/flip_model"
refused flip_model "checkpoint.load: .*$p"

damaged flip_optim; damage flip "$TMP/flip_optim/$STEP/$O" exp_avg_sq.transformer.h.0.mlp.c_fc.weight
p="$STEP/$O: tensor 'exp_avg_sq.transformer.h.0.mlp.c_fc.weight' fails its checksum"
expect_ckpt 5 "$p" verify "$TMP/flip_optim/$STEP"
refused flip_optim "checkpoint.load: .*$p" --set "checkpoint.load=\"$TMP/flip_optim/$STEP\""

# (b) the model file truncated by 100 bytes (the end of its last tensor).
damaged truncated; truncate -s -100 "$TMP/truncated/$STEP/$M"
p="$STEP/$M is truncated: header says [0-9]+ bytes of data, file has [0-9]+"
expect_ckpt 4 "$p" verify "$TMP/truncated"
expect_ckpt 4 "$p" info "$TMP/truncated"
refused truncated "checkpoint.load: .*$p"

# A whole file missing (4), or grown by trailing bytes (5).
damaged nofile; rm "$TMP/nofile/$STEP/$O"
p="$STEP/$O is missing \(state.json lists it\)"
expect_ckpt 4 "$p" verify "$TMP/nofile"
refused nofile "checkpoint.load: .*$p"
damaged grown; printf 'extra bytes' >>"$TMP/grown/$STEP/$M"
expect_ckpt 5 "$STEP/$M has 11 bytes of trailing data after the last tensor" verify "$TMP/grown"

# (c) a tensor removed from the model file (still a valid safetensors file).
damaged dropped; damage drop "$TMP/dropped/$STEP/$M" transformer.h.1.mlp.c_fc.bias
ckpt info "$TMP/dropped"
if [ "$rc" -eq 0 ] && grep -qE "^  model.safetensors +[0-9]+ bytes +27 tensors" "$TMP/out"; then
  pass; else fail "info of the checkpoint without a tensor: rc $rc"; cat "$TMP/err" >&2; fi
p="has no tensor 'transformer.h.1.mlp.c_fc.bias' \(expected F32 \[256\]"
expect_ckpt 4 "$p" verify "$TMP/dropped"
refused dropped "checkpoint.load: .*$p"

# (d) state.json missing, or not JSON.
damaged nostate; rm "$TMP/nostate/$STEP/state.json"
p="$STEP has no state.json"
expect_ckpt 3 "$p" verify "$TMP/nostate/$STEP"
expect_ckpt 3 "$p" info "$TMP/nostate"
refused nostate "checkpoint.load: .*$p"

damaged badstate; echo '{"format": "tessera-checkpoint", "step": 2,' >"$TMP/badstate/$STEP/state.json"
p="$STEP/state.json is damaged: .*\(line [0-9]+\)"
expect_ckpt 3 "$p" verify "$TMP/badstate"
expect_ckpt 3 "$p" info "$TMP/badstate"
refused badstate "checkpoint.load: .*$p"

# state.json edited (its step moved on): its own checksum no longer matches.
damaged editstate; sed -i 's/"step": 2,/"step": 3,/' "$TMP/editstate/$STEP/state.json"
p="$STEP/state.json does not match its own checksum"
expect_ckpt 3 "$p" verify "$TMP/editstate"
refused editstate "checkpoint.load: .*$p"

# (e) a header byte changed that keeps the header valid JSON of the same length.
damaged header; damage meta "$TMP/header/$STEP/$M"
p="$STEP/$M: the header's checksum does not match state.json"
expect_ckpt 5 "$p" verify "$TMP/header"
refused header "checkpoint.load: .*$p"

# (f) `latest` names a directory that is not there.
damaged nolatest; echo step_00000099 >"$TMP/nolatest/latest"
expect_ckpt 3 "nolatest/latest names .*/step_00000099, which does not exist" verify "$TMP/nolatest"
expect_ckpt 3 "nolatest/latest names .*/step_00000099, which does not exist" info "$TMP/nolatest"
refused nolatest "checkpoint.load: .*latest names .*step_00000099, which does not exist"

# (g, h) an intact checkpoint (verify says OK) into another model or global batch.
damaged other; ckpt verify "$TMP/other"
if [ "$rc" -eq 0 ]; then pass; else fail "verify of the intact copy: rc $rc"; fi
refused other "saved with model.n_embd = 64, but the config says 128" --set model.n_embd=128
refused other "saved with model.n_layer = 2, but the config says 3" --set model.n_layer=3
refused other "saved with train.global_batch = 8, but the config says 16" \
  --set train.global_batch=16

# The intact copy still loads (on tp=2) and trains on: the refusals above were the
# damage's, not the test's.
if run_np 2 train "$CFG" "${small[@]}" --set train.steps=3 --set parallel.tp=2 \
    --set "checkpoint.load=\"$TMP/good/$STEP\""; then
  pass
else
  fail "resuming from the intact checkpoint"; sed 's/^/    /' "$TMP/err" >&2
fi

finish
