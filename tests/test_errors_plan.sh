# Hostile input to `tessera plan` and the commands around it (reliability review
# 2026-11-30): trace files whose numbers overflow or never end, outputs that cannot be
# written (a device, a full disk, a full stdout), out-of-range options, a directory or a
# binary file as a schedule CSV, --help among other arguments, and a model too big to
# measure. Each gets one clear message and a non-zero exit (or, for the last, a warning
# and modelled costs); nothing crashes, hangs or leaves a half-written file.
source "$(dirname "$0")/lib.sh"

cfg="$SRC/configs/tiny.cfg"
p2=(--set parallel.pp=2)

# run_cmd ARGS...: tessera with stdout/stderr in $TMP/out, $TMP/err (killed after 60 s).
run_cmd() { timeout 60 "$TESSERA" "$@" >"$TMP/out" 2>"$TMP/err"; }

# no_crash WHAT: stderr shows no crash or sanitizer report (lib.sh's CRASH_RE).
no_crash() {
  if grep -qE -- "$CRASH_RE" "$TMP/err"; then
    fail "crashed: $1"; sed 's/^/    /' "$TMP/err" >&2; return 1
  fi
}

# Each refusal: lib.sh's expect_error as one process (NP 0) with its exit code (--rc):
# PATTERN (grep -E) exactly once on stderr, no crash, no hang.

# --- plan --from-trace: every number is checked before it is converted ------------------
trace() { # NAME EVENT_JSON: a trace with one good event and then EVENT
  printf '{"traceEvents": [{"name":"F0","cat":"F","ph":"X","pid":0,"tid":0,"ts":0,"dur":5},\n%s]}\n' \
    "$2" > "$TMP/$1.json"
}
trace meta_huge '{"name":"thread_name","ph":"M","pid":0,"tid":2147483647,"args":{"name":"x"}}'
trace tid_huge  '{"name":"F1","cat":"F","ph":"X","pid":0,"tid":2147483647,"ts":0,"dur":1}'
trace tid_float '{"name":"F1","cat":"F","ph":"X","pid":0,"tid":1e30,"ts":0,"dur":1}'
trace tid_big   '{"name":"F1","cat":"F","ph":"X","pid":0,"tid":100000000,"ts":0,"dur":1}'
trace tid_frac  '{"name":"F1","cat":"F","ph":"X","pid":0,"tid":1.5,"ts":0,"dur":1}'
trace ts_huge   '{"name":"F1","cat":"F","ph":"X","pid":0,"tid":0,"ts":1e308,"dur":1e308}'
trace dur_neg   '{"name":"F1","cat":"F","ph":"X","pid":0,"tid":1,"ts":1,"dur":-5}'
trace chunk_huge '{"name":"F1","cat":"F","ph":"X","pid":0,"tid":0,"ts":1,"dur":1,"args":{"chunk":2147483647,"mb":0}}'
trace mb_str    '{"name":"F1","cat":"F","ph":"X","pid":0,"tid":0,"ts":1,"dur":1,"args":{"chunk":0,"mb":"1"}}'

from_trace() { # NAME PATTERN: rejected, naming event 1; no SVG (or temporary) left behind
  expect_error --rc 1 0 "trace .*$1\\.json: event 1: $2" plan --from-trace "$TMP/$1.json" --svg "$TMP/$1.svg"
  if ls "$TMP/$1".svg* >/dev/null 2>&1; then fail "$1: an SVG was left behind"; else pass; fi
}
from_trace meta_huge  '"tid" 2147483647 is out of range: a track is a rank, 0\.\.65535'
from_trace tid_huge   '"tid" 2147483647 is out of range'
from_trace tid_float  '"tid" 1e\+30 is out of range'
from_trace tid_big    '"tid" 100000000 is out of range'
from_trace tid_frac   '"tid" 1\.5 is not a whole number'
from_trace ts_huge    '"ts" 1e\+308 is out of range: times are microseconds'
from_trace dur_neg    '"dur" -5 is out of range'
from_trace chunk_huge '"args\.chunk" 2147483647 is out of range'
from_trace mb_str     '"args\.mb" must be a whole number, but is a string'

# --costs-from-trace reads traces with the same checks.
expect_error --rc 1 0 '^tessera: error: --costs-from-trace: trace .*tid_float\.json: event 1: "tid" 1e\+30' \
  plan "$cfg" "${p2[@]}" --costs-from-trace "$TMP/tid_float.json"

# The largest trace that is allowed still draws, promptly and with a bounded file.
printf '{"traceEvents": [{"name":"F0","cat":"F","ph":"X","tid":65535,"ts":0,"dur":9007199254740991}]}\n' \
  > "$TMP/edge.json"
if run_cmd plan --from-trace "$TMP/edge.json" --svg "$TMP/edge.svg"; then
  size=$(stat -c %s "$TMP/edge.svg")
  [ "$size" -lt 20000000 ] && pass || fail "edge trace: SVG of $size bytes"
else
  fail "edge trace: $(cat "$TMP/err")"
fi

# recompute = "auto" fits a budget plan cannot read for a GPU run: it asks for one.
expect_error --rc 1 0 '^tessera: error: parallel.recompute = "auto" fits each rank into its device.s free memory, which tessera plan cannot see .*parallel.memory_budget_mb' \
  plan "$cfg" "${p2[@]}" --cost uniform --set 'train.device="cuda"' --set parallel.recompute=auto

# --- outputs: refused devices, full disks, full stdout -----------------------------------
expect_error --rc 1 0 '^tessera: error: svg: /dev/full exists and is a character device, not a regular file' \
  plan "$cfg" "${p2[@]}" --cost uniform --svg /dev/full
expect_error --rc 1 0 '^tessera: error: trace: /dev/full exists and is a character device, not a regular file' \
  plan "$cfg" "${p2[@]}" --cost uniform --trace /dev/full
[ -c /dev/full ] && pass || fail "/dev/full is no longer a character device"
mkdir -p "$TMP/adir"
expect_error --rc 1 0 '^tessera: error: svg: .*adir exists and is a directory' \
  plan "$cfg" "${p2[@]}" --cost uniform --svg "$TMP/adir"

# A full disk (an 8 KiB tmpfs; skipped where mounting is not allowed): an error with
# errno, no partial file and no temporary file left.
mnt="$TMP/mnt"
mkdir -p "$mnt"
if mount -t tmpfs -o size=8k tmpfs "$mnt" 2>/dev/null; then
  at_exit 'umount "$mnt" 2>/dev/null'
  p8=(--set parallel.pp=4 --set train.global_batch=64 --set parallel.micro_batch=2)
  expect_error --rc 1 0 '^tessera: error: svg: writing .*/mnt/plan\.svg failed: No space left on device' \
    plan "$cfg" "${p8[@]}" --cost uniform --svg "$mnt/plan.svg"
  expect_error --rc 1 0 '^tessera: error: trace: writing .*/mnt/trace\.json failed: No space left on device' \
    plan "$cfg" "${p8[@]}" --cost uniform --trace "$mnt/trace.json"
  left=$(ls -A "$mnt")
  [ -z "$left" ] && pass || fail "full disk: files left behind: $left"
  umount "$mnt"
else
  skip_case "the full-disk cases (mounting a tmpfs is not permitted here)"
fi

# stdout is the result of plan, topo and data: a failed write is an error, said once.
stdout_full() { # ARGS...: tessera ARGS > /dev/full fails with one message
  timeout 60 "$TESSERA" "$@" >/dev/full 2>"$TMP/err"
  judge_error "tessera $* > /dev/full" $? '^tessera: error: writing standard output failed: No space left on device$'
}
stdout_full plan "$cfg" "${p2[@]}" --cost uniform --json
stdout_full plan "$cfg" "${p2[@]}" --cost uniform
stdout_full plan --help
stdout_full topo "$cfg"
printf 'some text for a shard\n' > "$TMP/text.txt"
stdout_full data "$TMP/text.txt" "$TMP/text.bin"

# --- options: each message states the option's real range ---------------------------------
expect_error --rc 2 0 "^tessera: error: --bandwidth-gbs 'abc' is not a number from 0\.001 to 1000000000 \(GB/s\)" \
  plan "$cfg" --bandwidth-gbs abc --cost model
expect_error --rc 2 0 "^tessera: error: --bandwidth-gbs '0' is not a number from 0\.001 to" \
  plan "$cfg" --bandwidth-gbs 0 --cost model
expect_error --rc 2 0 "^tessera: error: --latency-us '1e308' is not a number from 0 to 1000000 \(microseconds\)" \
  plan "$cfg" "${p2[@]}" --latency-us 1e308 --cost model
expect_error --rc 2 0 "^tessera: error: --latency-us '-5' is not a number from 0 to 1000000" \
  plan "$cfg" --latency-us -5 --cost model
expect_error --rc 2 0 "^tessera: error: --optim-ms 'nan' is not a number from 0 to 1000000 \(milliseconds\)" \
  plan "$cfg" --optim-ms nan --cost model
expect_error --rc 2 0 "^tessera: error: --trace-skip-steps '1e300' is not a whole number from 0 to 1000000000" \
  plan "$cfg" "${p2[@]}" --trace-skip-steps 1e300 --costs-from-trace "$TMP/tid_float.json"
# The bounds themselves are accepted.
if run_cmd plan "$cfg" "${p2[@]}" --cost model --json --latency-us 1e6 --bandwidth-gbs 0.001 \
     --optim-ms 1e6; then pass; else fail "options at their bounds: $(cat "$TMP/err")"; fi

# --- schedule CSVs: a directory, binary bytes -------------------------------------------------
mkdir -p "$TMP/dir.csv"
expect_error --rc 1 0 "^tessera: error: schedule CSV '.*dir\.csv' \(parallel\.schedule\) is a directory" \
  plan "$cfg" "${p2[@]}" --cost model --set "parallel.schedule=\"$TMP/dir.csv\""
printf '0F0\x01\x1b[31m\xff\xfe' > "$TMP/binary.csv"
head -c 300 /dev/zero | tr '\0' 'A' >> "$TMP/binary.csv"
printf '\n' >> "$TMP/binary.csv"
expect_error --rc 1 0 "binary\.csv:1: cell '0F0\\\\x01\\\\x1b\[31m\\\\xff\\\\xfeA+\.\.\.': expected" \
  plan "$cfg" "${p2[@]}" --cost model --set "parallel.schedule=\"$TMP/binary.csv\""
if LC_ALL=C grep -q $'[\x01\x1b\xff]' "$TMP/err"; then fail "binary CSV bytes echoed raw"; else pass; fi

# --- --help among other arguments --------------------------------------------------------------
expect_error --rc 2 0 "^tessera: error: --help takes no other arguments: run 'tessera train --help' alone" \
  train --help extra
expect_error --rc 2 0 "^tessera: error: --help takes no other arguments: run 'tessera topo --help' alone" \
  topo "$cfg" --help
if run_cmd plan "$cfg" --json --help && grep -q '^usage: tessera plan' "$TMP/out"; then pass; else
  fail "plan CONFIG --help: $(cat "$TMP/err")"; fi

# --- a model too big to time its layers: modelled costs and a warning, not an abort -----------
big=(--set model.vocab_size=16777216 --set model.n_embd=1024 --set parallel.pp=2)
if run_cmd plan "$cfg" "${big[@]}"; then
  grep -q 'warning: partition: cannot measure layer costs: .* would allocate [0-9.]* GiB' "$TMP/err" &&
    grep -q 'costs: modelled layer times' "$TMP/out" && pass ||
    fail "big model: $(cat "$TMP/err" "$TMP/out")"
else
  fail "big model: rc $?: $(cat "$TMP/err")"
fi
no_crash "plan of a big model" && pass

finish
