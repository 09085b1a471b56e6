# Data files and `tessera data` under hostile or careless input (the reliability
# review's D_magic, V1, V5, T12, T13, T15, T16): a damaged shard is an error that shows
# its header, never trained on as bytes; `tessera data` refuses, before writing
# anything, outputs it would destroy and inputs that already are shards.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
cfg="$SRC/configs/tiny.cfg"
base=(train "$cfg" --set 'data.val=""' --set train.steps=1 --set train.threads=1
      --set log.progress=false --set "log.metrics=\"$TMP/m.jsonl\"")

# expect_ok NP ARGS...: the run succeeds.
expect_ok() {
  local np="$1"; shift
  if run_np "$np" "$@"; then pass; else fail "expected success: tessera $*"; sed 's/^/    /' "$TMP/err" >&2; fi
}

# D_magic: one bit of the magic flipped (20240520 -> 20240521, first byte 0x88 -> 0x89).
cp "$TMP/train.bin" "$TMP/magic.bin"
printf '\x89' | dd of="$TMP/magic.bin" bs=1 count=1 conv=notrunc status=none
expect_error 1 "neither an llm.c token shard nor text: its header holds magic 20240521 \(expected 20240520\), version 1, token count [0-9]+" \
  "${base[@]}" --set "data.train=\"$TMP/magic.bin\""
cp "$TMP/magic.bin" "$TMP/magic.dat"
expect_error 1 "magic.dat is neither .* NUL byte at offset 5" "${base[@]}" --set "data.train=\"$TMP/magic.dat\""
# Text is still read as bytes (UTF-8 included); text under a shard's name is not.
printf 'na\xc3\xafve caf\xc3\xa9 \xe2\x9c\x93\n' >> "$TMP/corpus.txt"
expect_ok 1 "${base[@]}" --set "data.train=\"$TMP/corpus.txt\""
cp "$TMP/corpus.txt" "$TMP/corpus_text.bin"
expect_error 1 "it is named \*\.bin, so it is not read as text" "${base[@]}" \
  --set "data.train=\"$TMP/corpus_text.bin\""

# V1: a missing data.val file names data.val in the hint.
expect_error 1 "no_val.bin: No such file or directory \(set data.val or create it" \
  "${base[@]}" --set "data.train=\"$TMP/train.bin\"" --set data.eval_every=1 \
  --set "data.val=\"$TMP/no_val.bin\""
# V5: more validation windows than the shard holds: one warning (rank 0), then it runs.
head -c 65 "$TMP/corpus.txt" > "$TMP/val.txt"
"$TESSERA" data "$TMP/val.txt" "$TMP/val.bin" >/dev/null
expect_ok 2 "${base[@]}" --set "data.train=\"$TMP/train.bin\"" --set data.eval_every=1 \
  --set "data.val=\"$TMP/val.bin\"" --set data.val_windows=8 --set parallel.dp=2 \
  --set parallel.micro_batch=2
n=$(grep -c "warning: data.val_windows = 8 but data.val (.*val.bin) holds only 1 distinct window of" "$TMP/err")
if [ "$n" -eq 1 ]; then pass; else fail "V5: expected one val_windows warning, found $n"; cat "$TMP/err" >&2; fi
expect_ok 1 "${base[@]}" --set "data.train=\"$TMP/train.bin\"" --set data.eval_every=1 \
  --set "data.val=\"$TMP/train.bin\"" --set data.val_windows=8
if grep -q "val_windows" "$TMP/err"; then fail "V5: warning with enough windows"; else pass; fi

# `tessera data` refusals run as one process (expect_error with NP 0).
# T15: an output that exists and is not a regular file is refused and left as it is.
mkfifo "$TMP/fifo"
expect_error 0 "output shard: .*/fifo exists and is a pipe, not a regular file" data "$TMP/val.txt" "$TMP/fifo"
if [ -p "$TMP/fifo" ]; then pass; else fail "T15: the FIFO was replaced"; fi
mkdir "$TMP/outdir"
expect_error 0 "outdir exists and is a directory" data "$TMP/val.txt" "$TMP/outdir"
# T16: a directory with a trailing slash; a path through a file; a missing directory.
expect_error 0 "outdir/ ends in '/', so it names a directory" data "$TMP/val.txt" "$TMP/outdir/"
expect_error 0 "val.txt is a file, not a directory" data "$TMP/val.txt" "$TMP/val.txt/x.bin"
expect_error 0 "directory .*/nodir does not exist" data "$TMP/val.txt" "$TMP/nodir/x.bin"
if [ ! -e "$TMP/nodir" ]; then pass; else fail "T16: a directory was created"; fi
# T13: the output is the input, by name or by another link to the same inode.
cp "$TMP/val.txt" "$TMP/keep.txt"
ln "$TMP/val.txt" "$TMP/val_link.txt"
expect_error 0 "is the same file as the text file" data "$TMP/val.txt" "$TMP/val.txt"
expect_error 0 "is the same file as the text file" data "$TMP/val.txt" "$TMP/val_link.txt"
if cmp -s "$TMP/val.txt" "$TMP/keep.txt"; then pass; else fail "T13: the text file changed"; fi
# T12: a shard given as the text.
expect_error 0 "train.bin is already an llm.c token shard \(magic 20240520, [0-9]+ tokens\)" data \
  "$TMP/train.bin" "$TMP/again.bin"
if [ ! -e "$TMP/again.bin" ]; then pass; else fail "T12: an output was written"; fi
# No refusal left a temporary file; a good run still writes the shard.
if ls "$TMP" | grep_q '\.tmp\.'; then fail "temporary files left: $(ls "$TMP")"; else pass; fi
if "$TESSERA" data "$TMP/val.txt" "$TMP/val2.bin" | grep_q "wrote .*val2.bin: 65 tokens"; then pass; else fail "data"; fi
# Llama 3's shard format (--format llama3): magic 20240801, version 7, uint32 ids, and
# it trains as the GPT-2 shard of the same bytes does; a format that is none is a usage
# error, and nothing is written.
if "$TESSERA" data "$TMP/val.txt" "$TMP/val32.bin" --format llama3 | grep_q "wrote .*val32.bin: 65 tokens"; then pass; else fail "data --format llama3"; fi
size=$(stat -c %s "$TMP/val32.bin")
hdr=$(od -An -t d4 -N 12 "$TMP/val32.bin" | tr -s ' ')
if [ "$size" -eq $((1024 + 4 * 65)) ] && [ "$hdr" = " 20240801 7 65" ]; then pass; else fail "llama3 shard: $size bytes, header '$hdr'"; fi
"$TESSERA" data "$TMP/corpus.txt" "$TMP/train32.bin" --format=llama3 >/dev/null
expect_ok 1 "${base[@]}" --set "data.train=\"$TMP/train32.bin\""
expect_error --rc 2 0 "--format must be gpt2 or llama3, not 'uint32'" data "$TMP/val.txt" "$TMP/bad.bin" --format uint32
if [ ! -e "$TMP/bad.bin" ]; then pass; else fail "--format uint32: an output was written"; fi
finish
