# The watchdog (train.timeout_s): when a rank is SIGSTOPped mid-run, the rank waiting on
# it aborts the job after the timeout with exit code 14 (TS_EXIT_WATCHDOG) and one
# message naming itself, the step, the wait and the communicator; mpirun takes the
# stopped rank down and nothing is left running (dp, ZeRO-3's gathers, pp). timeout_s = 0
# is off (a stop longer than any timeout passes unnoticed), and a short timeout leaves a
# normal run alone.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
cfg="$SRC/configs/tiny.cfg"
base=(train "$cfg" --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""'
      --set train.threads=1 --set log.progress=false)

# Every rank pid seen, so that whatever the outcome nothing stays stopped or running.
RANK_PIDS=()
reap() {
  local p
  for p in "${RANK_PIDS[@]}"; do
    if kill -0 "$p" 2>/dev/null && grep -q tessera "/proc/$p/cmdline" 2>/dev/null; then
      kill -CONT "$p" 2>/dev/null
      kill -KILL "$p" 2>/dev/null
    fi
  done
}
at_exit reap

# start NAME SETS...: tessera on 2 ranks in the background (metrics to $TMP/NAME.jsonl,
# stderr to $TMP/NAME.err); sets MPIRUN. Returns once the metrics show a step (1),
# or fails (0 when the run never got there).
start() {
  local name="$1"; shift
  rm -f "$TMP/$name.jsonl"
  timeout 90 mpirun --oversubscribe -np 2 "$TESSERA" "${base[@]}" \
    --set "log.metrics=\"$TMP/$name.jsonl\"" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  MPIRUN=$!
  local i
  for i in $(seq 300); do
    grep -q '"step"' "$TMP/$name.jsonl" 2>/dev/null && return 0
    kill -0 "$MPIRUN" 2>/dev/null || break
    sleep 0.1
  done
  fail "$name: no step in the metrics after 30 s"; sed 's/^/    /' "$TMP/$name.err" >&2
  rank_pid 0 >/dev/null
  kill "$MPIRUN" 2>/dev/null; wait "$MPIRUN"
  reap
  return 1
}

# rank_pid R: the pid of world rank R of the running job ("" if not found). The ranks
# are mpirun's children (under `timeout`) on one node; their environment names them.
rank_pid() {
  local p mp
  mp=$(pgrep -P "$MPIRUN" -x mpirun || echo "$MPIRUN")
  for p in $(pgrep -P "$mp"); do
    RANK_PIDS+=("$p")
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep_q -x "OMPI_COMM_WORLD_RANK=$1"; then
      echo "$p"; return
    fi
  done
}

# expect_watchdog NAME PATTERN SETS...: stop rank 1 after the first step; the job must
# end with exit code 14 within 20 s, print the watchdog message once with PATTERN (a
# grep -E regex), and leave no rank behind.
expect_watchdog() {
  local name="$1" pattern="$2"; shift 2
  start "$name" "$@" || return
  local victim t0 rc elapsed
  victim=$(rank_pid 1)
  if [ -z "$victim" ]; then
    fail "$name: rank 1 not found"; kill "$MPIRUN"; wait "$MPIRUN"; reap; return
  fi
  rank_pid 0 >/dev/null
  kill -STOP "$victim"
  t0=$(date +%s%N)
  wait "$MPIRUN"; rc=$?
  elapsed=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "$name: mpirun exited $rc, $elapsed ms after the stop"
  local err="$TMP/$name.err"
  # Exit code 14 and one watchdog message, no crash (lib.sh's judge_error); then its words.
  if judge_error --rc 14 --stderr "$err" "$name: rank 1 stopped" "$rc" 'tessera: watchdog: rank'; then
    if [ "$elapsed" -gt 20000 ]; then fail "$name: the job took $elapsed ms to end"
    elif ! grep -qE -- "$pattern" "$err"; then
      fail "$name: the message does not match '$pattern'"; sed 's/^/    /' "$err" >&2
    elif ! grep -q 'raise train.timeout_s' "$err" || ! grep -q 'exit code 14' "$err"; then
      fail "$name: the message lacks the fix or the exit code"; sed 's/^/    /' "$err" >&2
    else
      pass
    fi
  fi
  sleep 0.5 # mpirun has reaped its ranks; give the kernel a moment to drop them
  local p left=""
  for p in "${RANK_PIDS[@]}"; do
    kill -0 "$p" 2>/dev/null && grep -q tessera "/proc/$p/cmdline" 2>/dev/null && left+=" $p"
  done
  if [ -n "$left" ]; then fail "$name: ranks left running:$left"; else pass; fi
  reap
}

# Data parallel: rank 0 waits in the gradient all-reduce (or a statistics one).
w='tessera: watchdog: rank 0 \(host [^,]+, pid [0-9]+\) made no progress for [0-9.]+ s '
w+='at step [0-9]+: waiting in'
expect_watchdog dp "$w [a-z -]+(\([a-z ]+\))? on communicator \"(dp|world)\"" \
  --set parallel.dp=2 --set parallel.micro_batch=2 --set train.timeout_s=3 --set train.steps=100000
# Pipeline: rank 0 waits for rank 1's gradients (or in a collective with it).
# ZeRO-3: the waiting rank sits in a weight gather or a gradient reduce-scatter.
expect_watchdog zero3 "$w [a-z -]+(\([a-z ]+\))? on communicator \"(dp|world)\"" \
  --set parallel.dp=2 --set parallel.micro_batch=2 --set parallel.zero=3 --set train.timeout_s=3 \
  --set train.steps=100000
expect_watchdog pp "$w [a-z -]+(\([a-z ]+\))? on communicator \"(pp|embed|world)\"" \
  --set parallel.pp=2 --set train.timeout_s=3 --set train.steps=100000

# timeout_s = 0: off. Rank 1 stopped for 2.5 s (more than a 1 s timeout would allow)
# and continued: the run completes. (Release only: 40 plain dp steps, no code the runs
# above and below do not run under the sanitizers; CI time.)
if [ "${TS_TEST_SANITIZERS:-0}" = 1 ]; then
  skip_case "off (the release build runs it; under the sanitizers its code runs above)"
elif start off --set parallel.dp=2 --set parallel.micro_batch=2 --set train.timeout_s=0 \
     --set train.steps=40; then
  victim=$(rank_pid 1)
  [ -n "$victim" ] && kill -STOP "$victim" && sleep 2.5 && kill -CONT "$victim"
  if wait "$MPIRUN" && [ "$(grep -c '"step"' "$TMP/off.jsonl")" -eq 40 ] &&
     ! grep -q watchdog "$TMP/off.err"; then
    pass
  else
    fail "off: a run with train.timeout_s=0 and a 2.5 s stop did not complete"
    sed 's/^/    /' "$TMP/off.err" >&2
  fi
  reap
fi

# A 5 s timeout does not disturb a normal run: pipeline, validation and a trace (their
# collectives and transfers are watched too).
if run_np 2 "${base[@]}" --set parallel.pp=2 --set train.timeout_s=5 --set train.steps=12 \
     --set "data.val=\"$TMP/train.bin\"" --set data.eval_every=4 --set data.val_windows=4 \
     --set "log.trace=\"$TMP/trace.json\"" --set "log.metrics=\"$TMP/short.jsonl\"" &&
   [ "$(grep -c '"loss"' "$TMP/short.jsonl")" -eq 12 ] && ! grep -q watchdog "$TMP/err"; then
  pass
else
  fail "short: a normal run with train.timeout_s=5 failed"; sed 's/^/    /' "$TMP/err" >&2
fi
finish
