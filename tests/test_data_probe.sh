# `tessera data` against the probe of 2026-12-06 (reviews/2026-12-06-probe.md): D1 two
# runs on one --out prefix (the second refused, naming the holder's pid), D2 a failed
# commit leaves no shard and restores the old ones under --overwrite, D5 SIGTERM honoured
# inside one large document (the encoder sees it), D8 an empty first JSONL document,
# D13 numeric options with leading blanks, D14 JSONL lines with numbers jansson cannot
# hold in other fields, and temporaries left by a killed run removed by the next run.
# The races are ordered, not timed: a run is signalled once /proc says it has read its
# whole input, and its document then takes seconds to encode.
source "$(dirname "$0")/lib.sh"

fixture="$SRC/tests/fixtures/bpe/small.tiktoken"
export TS_TEST_TOKENIZER_ANY_SIZE=1

# ids FILE: a uint16 shard's ids, one per line.
ids() { tail -c +1025 "$1" | od -An -v -t u2 -w2 | tr -d ' '; }
# bytes_of FILE: its bytes as decimal numbers, one per line.
bytes_of() { od -An -v -t u1 -w1 "$1" | tr -d ' '; }

# A document slow to encode with the fixture: 127-byte pieces " inin...in" (too long for
# the encoder's cache, each merged pair by pair), doubled up to 127 * 2^K bytes.
make_slow() {
  local out="$1" k="$2" i
  printf ' %s' "$(printf 'in%.0s' $(seq 63))" > "$out"
  for i in $(seq "$k"); do cat "$out" "$out" > "$out.2" && mv "$out.2" "$out"; done
}
make_slow "$TMP/big.txt" 18 # 33 MB: seconds to encode, even on a fast machine
make_slow "$TMP/mid.txt" 17 # 17 MB
printf 'a small document\n' > "$TMP/small.txt"

# wait_read PID FILE: until process PID has read FILE's size in bytes (its rchar), so its
# reader is done and its encoder busy with the document. Falls back to a pause where
# /proc/PID/io cannot be read.
wait_read() {
  local pid="$1" size i r
  size=$(stat -c %s "$2")
  for i in $(seq 1200); do
    r=$(awk '/^rchar:/ {print $2}' "/proc/$pid/io" 2>/dev/null) || r=""
    if [ -z "$r" ]; then sleep 2; return 0; fi
    if [ "$r" -ge "$size" ]; then sleep 0.2; return 0; fi
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.05
  done
}

# D1 and D5: run A on the big document; while it encodes, run B on the same prefix (refused,
# naming A's pid); then SIGTERM A, which must stop inside the document.
mkdir "$TMP/p1"
"$TESSERA" data "$TMP/big.txt" --encoding gpt2 --ranks "$fixture" --threads 1 --out "$TMP/p1/x" \
  > "$TMP/outA" 2> "$TMP/errA" &
a=$!
wait_read "$a" "$TMP/big.txt"
expect_error --rc 1 --one-error 0 "--out .*/p1/x is in use by another run \(pid $a, " \
  data "$TMP/small.txt" --out "$TMP/p1/x"
if [ ! -e "$TMP/p1/x_train_000000.bin" ]; then pass; else fail "D1: the refused run wrote a shard"; fi
kill -TERM "$a"
wait "$a"
rc=$?
if judge_error --rc 1 --one-error --stderr "$TMP/errA" "D5: SIGTERM during one document" "$rc" \
     "stopped by SIGTERM at byte [0-9]+ of a document of [0-9]+ bytes: no shard written"; then
  at=$(grep -oE 'at byte [0-9]+' "$TMP/errA" | grep -oE '[0-9]+')
  of=$(grep -oE 'of a document of [0-9]+' "$TMP/errA" | grep -oE '[0-9]+$')
  if [ "$at" -lt "$of" ]; then pass; else fail "D5: the stop waited for the whole document ($at of $of)"; fi
fi
left=$(ls -A "$TMP/p1")
if [ -z "$left" ]; then pass; else fail "D1/D5: files left in the prefix's directory: $left"; fi

# D2: --overwrite over two old shards; a directory appears at the new run's shard 3 while
# it encodes, so its commit fails there: nothing new is left and the old shards are back.
mkdir "$TMP/p2"
head -c 3000 "$TMP/big.txt" > "$TMP/old.txt"
"$TESSERA" data "$TMP/old.txt" --shard-tokens 2000 --out "$TMP/p2/x" > /dev/null 2>&1
old_sums=$(cd "$TMP/p2" && md5sum x_train_*.bin)
[ "$(echo "$old_sums" | wc -l)" -eq 2 ] || fail "D2: setup made no two old shards"
"$TESSERA" data "$TMP/mid.txt" --encoding gpt2 --ranks "$fixture" --threads 1 --shard-tokens 2000000 \
  --out "$TMP/p2/x" --overwrite > "$TMP/outA" 2> "$TMP/errA" &
a=$!
wait_read "$a" "$TMP/mid.txt"
mkdir "$TMP/p2/x_train_000003.bin"
wait "$a"
judge_error --rc 1 --one-error --stderr "$TMP/errA" "D2: a failed commit" $? \
  "renaming output shard .*x_train_000003.bin: (File exists|Is a directory): no shard of this run is left, and the earlier run.s shards are as they were"
if [ "$(cd "$TMP/p2" && md5sum x_train_*.bin 2>/dev/null)" = "$old_sums" ]; then pass; else
  fail "D2: the old shards were not restored"; ls -l "$TMP/p2" >&2; fi
left=$(cd "$TMP/p2" && ls -A | grep -vxE 'x_train_00000[01]\.bin|x_train_000003\.bin')
if [ -z "$left" ]; then pass; else fail "D2: files left: $left"; fi

# Temporaries of a killed run (NAME.tmp.PID, NAME.old.PID) and its lock file: removed
# by the next run on the prefix; other names stay.
mkdir "$TMP/p3"
for f in x_train_000000.bin.tmp.999999 x_val_000002.bin.tmp.1 x_train_000001.bin.old.77; do
  printf 'junk' > "$TMP/p3/$f"
done
for f in x_train_000000.bin.tmp.abc xy_train_000000.bin.tmp.5 x_train_00000.bin.tmp.5 notes.tmp.5; do
  printf 'keep' > "$TMP/p3/$f"
done
printf '12345\n' > "$TMP/p3/x.lock"
if run_one data "$TMP/small.txt" --out "$TMP/p3/x"; then pass; else fail "stale: the run failed"; cat "$TMP/err" >&2; fi
left=$(cd "$TMP/p3" && ls -A | LC_ALL=C sort | tr '\n' ' ')
want=$(printf '%s\n' notes.tmp.5 x_train_000000.bin x_train_000000.bin.tmp.abc x_train_00000.bin.tmp.5 \
  xy_train_000000.bin.tmp.5 | LC_ALL=C sort | tr '\n' ' ')
if [ "$left" = "$want" ]; then pass; else fail "stale: left '$left', expected '$want'"; fi
if grep -q "removed 3 temporary files of an earlier run" "$TMP/err"; then pass; else
  fail "stale: no note of the removal"; cat "$TMP/err" >&2; fi
# A lock file that is not a regular file is refused and left alone.
mkdir "$TMP/p4" "$TMP/p4/x.lock"
expect_error --rc 1 --one-error 0 "lock file .*p4/x.lock is not a regular file" data "$TMP/small.txt" --out "$TMP/p4/x"
ln -s "$TMP/small.txt" "$TMP/p4/y.lock"
expect_error --rc 1 --one-error 0 "lock file .*p4/y.lock is not a regular file" data "$TMP/small.txt" --out "$TMP/p4/y"
if [ "$(cat "$TMP/small.txt")" = "a small document" ]; then pass; else fail "the symlinked lock's target changed"; fi

# D8: an empty JSONL document first in its batch (UBSan: memcpy from NULL).
printf '{"text": ""}\n{"text": "hello"}\n' > "$TMP/d8.jsonl"
if run_one data "$TMP/d8.jsonl" --out "$TMP/p3/d8" && ! grep -qE "$CRASH_RE" "$TMP/err" \
   && [ "$(ids "$TMP/p3/d8_train_000000.bin" | tr '\n' ' ')" = "104 101 108 108 111 " ]; then pass; else
  fail "D8: an empty first JSONL document"; cat "$TMP/err" >&2; fi

# D13: leading blanks in numeric options are refused, as `tessera sample` refuses them.
expect_error --rc 2 0 "--shard-tokens must be a whole number from 1 to 2147483647, not ' 50000'" \
  data "$TMP/small.txt" --shard-tokens ' 50000' --out "$TMP/p3/d13"
expect_error --rc 2 0 "--threads must be a whole number from 1 to 1024, not ' 2'" \
  data "$TMP/small.txt" --threads ' 2' --out "$TMP/p3/d13"
expect_error --rc 2 0 "--val-tokens must be a whole number of at least 1, not '.5'" \
  data "$TMP/small.txt" --val-tokens "$(printf '\t5')" --out "$TMP/p3/d13"
if ! ls "$TMP/p3" | grep_q d13; then pass; else fail "D13: a refused run wrote"; fi

# D14: numbers jansson cannot hold (a uint64, 1e999, 100,000 digits) in other fields do
# not make a line bad; the text field alone decides.
digits=$(head -c 100000 /dev/zero | tr '\0' '7')
{
  printf '{"id": 18446744073709551615, "text": "one"}\n'
  printf '{"score": 1e999, "text": "two"}\n'
  printf '{"n": -1e999, "m": [1E+400, {"k": -99999999999999999999999}], "text": "three"}\n'
  printf '{"big": %s, "text": "four"}\n' "$digits"
  printf '{"text": "1e999 \\"18446744073709551615\\"", "x": 0.5e-99999}\n'
} > "$TMP/d14.jsonl"
printf 'onetwothreefour1e999 "18446744073709551615"' > "$TMP/d14.expect"
if run_one data "$TMP/d14.jsonl" --out "$TMP/p3/d14" \
   && [ "$(ids "$TMP/p3/d14_train_000000.bin")" = "$(bytes_of "$TMP/d14.expect")" ]; then pass; else
  fail "D14: lines with big numbers in other fields"; cat "$TMP/err" >&2; fi
if run_one data "$TMP/d14.jsonl" --out "$TMP/p3/d14s" --skip-bad-lines && grep -q " 0 bad lines skipped" "$TMP/out"; then pass; else
  fail "D14: --skip-bad-lines skipped a good line"; cat "$TMP/out" "$TMP/err" >&2; fi
# Still refused: a text field that is a number, a line that is not JSON.
printf '{"text": 1e999}\n' > "$TMP/d14b.jsonl"
expect_error --rc 1 0 "d14b.jsonl:1: no string field \"text\" \(the field is not a string\)" data "$TMP/d14b.jsonl" --out "$TMP/p3/e"
printf '{"text": "a", "n": 01}\n' > "$TMP/d14c.jsonl"
expect_error --rc 1 0 "d14c.jsonl:1: no string field \"text\" \(" data "$TMP/d14c.jsonl" --out "$TMP/p3/e"
printf '{"n": 1e999, "text": "a"\n' > "$TMP/d14d.jsonl"
expect_error --rc 1 0 "d14d.jsonl:1: no string field \"text\" \(" data "$TMP/d14d.jsonl" --out "$TMP/p3/e"
printf '{"n": 1e999}\n' > "$TMP/d14e.jsonl"
expect_error --rc 1 0 "d14e.jsonl:1: no string field \"text\" \(it has no such field\)" data "$TMP/d14e.jsonl" --out "$TMP/p3/e"

finish
