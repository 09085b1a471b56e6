# Preemption and crash safety of checkpoints, on a 4-rank grid (pp=2 x dp=2, ZeRO-1) of
# a 2-layer, 64-wide model:
#  a. SIGKILL of one rank in the middle of a save (TS_TEST_SAVE_STALL_S holds every rank
#     between writing its slices and the commit): `latest` still names the previous
#     checkpoint, `tessera ckpt verify` passes, and resuming from `latest` cleans the
#     half-written .tmp-step_* away and gives the uninterrupted run's losses bit for bit.
#  b. SIGTERM to one rank (not mpirun), and SIGUSR1 to mpirun (which forwards it): every
#     rank finishes its step, the job saves step_K (K = the steps in the metrics), `latest`
#     names it, mpirun exits 75; resuming appends to the same metrics file, which then
#     holds the uninterrupted run's losses bit for bit.
#  c. The SIGTERM checkpoint resumed on 1 rank and on tp=2: the uninterrupted losses
#     within relative 1e-4.
#  d. Without checkpoint.dir a stop signal saves nothing and exits 128 + signal (138).
#  e. SIGINT (Ctrl-C) to a one-process run: the first stops it like SIGTERM (a verified
#     checkpoint, exit 75); a second, sent while the save stalls (TS_TEST_SAVE_STALL_S),
#     ends the process at once by SIGINT's default action, nothing committed.
# train.min_lr = train.lr makes the learning rate after the warmup constant, so it does
# not depend on train.steps: a run stopped at an unknown step K of a long run and an
# uninterrupted run of K+2 steps see the same schedule. Every wait polls with a deadline.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
common=(train "$SRC/configs/tiny.cfg" --set model.n_layer=2 --set model.n_embd=64
        --set model.seq_len=32 --set train.global_batch=8 --set parallel.micro_batch=2
        --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set data.eval_every=0
        --set log.progress=false --set train.threads=1 --set train.warmup=2
        --set train.lr=1e-3 --set train.min_lr=1e-3)
grid=(--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=1)

# Every process of ours carries $TMP in its command line (metrics and checkpoint paths):
# whatever happens, none outlives the test. Ranks run in process groups of their own
# (Open MPI), so they are found by that marker, then ended by pid.
reap() {
  local p
  for p in $(pgrep -f -- "$TMP/"); do
    [ "$p" != "$$" ] && kill -KILL "$p" 2>/dev/null
  done
}
at_exit reap
trap 'exit 143' TERM
trap 'exit 130' INT

# launch NAME SETS...: tessera on the 4-rank grid in the background, metrics appended to
# $TMP/NAME.jsonl, output to $TMP/NAME.out/.err; JOB is the pid of its `timeout`.
launch() {
  local name="$1" pass_env=(); shift
  [ -n "${TS_TEST_SAVE_STALL_S:-}" ] && pass_env=(-x TS_TEST_SAVE_STALL_S)
  timeout 60 mpirun --oversubscribe -np 4 "${pass_env[@]}" "$TESSERA" "${common[@]}" \
    "${grid[@]}" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@" \
    >"$TMP/$name.out" 2>"$TMP/$name.err" &
  JOB=$!
}

# poll SECONDS CMD...: run CMD every 50 ms until it succeeds (0) or SECONDS pass or the
# job ends without it succeeding (1).
poll() {
  local deadline=$(($(date +%s%N) + $1 * 1000000000)); shift
  while [ "$(date +%s%N)" -lt "$deadline" ]; do
    "$@" && return 0
    kill -0 "$JOB" 2>/dev/null || { "$@"; return; }
    sleep 0.05
  done
  return 1
}

# mpirun_pid / rank_pid R: the job's mpirun, and its world rank R (by environment).
mpirun_pid() { pgrep -P "$JOB" -x mpirun; }
rank_pid() {
  local p
  for p in $(pgrep -P "$(mpirun_pid)"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep_q -x "OMPI_COMM_WORLD_RANK=$1"; then
      echo "$p"; return
    fi
  done
}
rank_pids() { pgrep -P "$(mpirun_pid)"; }

# dead PID...: none of them runs any more (gone, or a zombie waiting for its reaper).
dead() {
  local p s
  for p in "$@"; do
    s=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) || continue
    [ -z "$s" ] || [ "$s" = Z ] || return 1
  done
  return 0
}

# finish_job NAME PIDS...: wait for the job (JOB_RC, JOB_MS from the call); then the
# ranks PIDS must be gone within 15 s (else they are killed and the test fails).
finish_job() {
  local name="$1" t0; shift
  t0=$(date +%s%N)
  wait "$JOB"; JOB_RC=$?
  JOB_MS=$((($(date +%s%N) - t0) / 1000000))
  for _ in $(seq 150); do dead "$@" && return 0; sleep 0.1; done
  fail "$name: ranks still running 15 s after mpirun ended: $*"
  kill -KILL "$@" 2>/dev/null
}

# step_losses FILE [FIRST [LAST]]: "STEP LOSS" for each step line, FIRST <= STEP <= LAST,
# the loss exactly as written.
step_losses() {
  grep -o '"step":[0-9]*,"loss":[^,]*' "$1" | sed 's/^"step":\([0-9]*\),"loss":/\1 /' \
    | awk -v a="${2:-0}" -v b="${3:-999999999}" '$1 >= a && $1 <= b'
}

# same_steps WHAT A B: the same steps with the same losses, bit for bit (files of
# step_losses lines).
same_steps() {
  if [ -s "$2" ] && cmp -s "$2" "$3"; then pass; else
    fail "$1: losses differ (step, loss; left, right)"; paste "$2" "$3" | sed 's/^/    /' >&2
  fi
}

# close_steps WHAT A B TOL: the same steps, losses within relative TOL.
close_steps() {
  local out
  if out=$(paste -d' ' "$2" "$3" | awk -v tol="$4" '
      NF != 4 || $1 != $3 { bad = 1; next }
      { d = $2 - $4; if (d < 0) d = -d; r = d / ($4 < 0 ? -$4 : $4); if (r > w) w = r; n++ }
      END { if (bad || n == 0 || w > tol) { printf "worst relative difference %g over %d steps%s\n", w, n, bad ? ", steps differ" : ""; exit 1 } }'); then
    pass
  else
    fail "$1: $out"; paste "$2" "$3" | sed 's/^/    /' >&2
  fi
}

# ckpt_latest DIR: the step directory DIR/latest names.
ckpt_latest() { cat "$1/latest" 2>/dev/null; }

# verify_ckpt WHAT DIR: `tessera ckpt verify DIR` (the checkpoint `latest` names) passes.
verify_ckpt() {
  if timeout 30 "$TESSERA" ckpt verify "$2" >"$TMP/verify.out" 2>&1; then pass; else
    fail "$1: tessera ckpt verify $2 exited $?"; sed 's/^/    /' "$TMP/verify.out" >&2
  fi
}

# run4 NAME SETS...: a foreground run on the 4-rank grid, metrics appended to
# $TMP/NAME.jsonl; passes when it exits 0.
run4() {
  local name="$1"; shift
  if run_np 4 "${common[@]}" "${grid[@]}" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
    pass; return 0
  fi
  fail "run $name (exit $?): $*"; tail -20 "$TMP/err" | sed 's/^/    /' >&2
  return 1
}

t_start=$SECONDS

# --- a. SIGKILL in the middle of a save -----------------------------------------------
D="$TMP/a/ckpt"
run4 a_ref --set train.steps=4
run4 a_first --set train.steps=2 --set "checkpoint.dir=\"$D\"" --set checkpoint.every=2
[ "$(ckpt_latest "$D")" = step_00000002 ] && pass || fail "a: latest after 2 steps: '$(ckpt_latest "$D")'"
step_losses "$TMP/a_ref.jsonl" 0 1 >"$TMP/a_ref.01"
step_losses "$TMP/a_first.jsonl" >"$TMP/a_first.01"
same_steps "a: steps 0-1 of the 2-step run vs the 4-step run" "$TMP/a_first.01" "$TMP/a_ref.01"

# The second run stalls 30 s in its final save (step 4), after the slices are written.
# progress on: rank 0 announces the stall.
export TS_TEST_SAVE_STALL_S=30
launch a_killed --set train.steps=4 --set "checkpoint.dir=\"$D\"" --set checkpoint.every=2 \
  --set checkpoint.load=latest --set log.progress=true
unset TS_TEST_SAVE_STALL_S
stalled() { [ -d "$D/.tmp-step_00000004" ] && grep -q 'stalling mid-save' "$TMP/a_killed.err"; }
if poll 30 stalled; then
  pass
  pids=$(rank_pids)
  # The ranks are mpirun's tessera children (it may have others); each rank's environment
  # is read until it answers (a busy machine can leave /proc/PID/environ briefly empty).
  n_env=0 n_ranks=0
  for p in $pids; do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = tessera ] || continue
    n_ranks=$((n_ranks + 1))
    for _ in 1 2 3 4 5; do
      if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep_q -x 'TS_TEST_SAVE_STALL_S=30'; then
        n_env=$((n_env + 1)); break
      fi
      sleep 0.2
    done
  done
  [ "$n_env" -eq 4 ] && [ "$n_ranks" -eq 4 ] && pass ||
    fail "a: TS_TEST_SAVE_STALL_S reached $n_env of $n_ranks ranks (4 expected); mpirun's children: $(for p in $pids; do printf '%s:%s ' "$p" "$(cat /proc/$p/comm 2>/dev/null)"; done)"
  victim=$(rank_pid 1)
  if [ -n "$victim" ]; then kill -KILL "$victim"; else fail "a: rank 1 not found"; fi
  # mpirun ends the other ranks (they ignore its SIGTERM mid-save: SIGKILL follows).
  finish_job a_killed $pids
  echo "a: mpirun exited $JOB_RC, $JOB_MS ms after the SIGKILL of rank 1"
  if [ "$JOB_RC" -eq 0 ] || [ "$JOB_RC" -eq 75 ] || [ "$JOB_RC" -eq 124 ] || [ "$JOB_MS" -gt 20000 ]; then
    fail "a: expected the job to fail soon after the SIGKILL, got exit $JOB_RC after $JOB_MS ms"
    tail -20 "$TMP/a_killed.err" | sed 's/^/    /' >&2
  else pass; fi
else
  fail "a: no stalled save of step 4 within 30 s"; tail -20 "$TMP/a_killed.err" | sed 's/^/    /' >&2
  pids=$(rank_pids); kill "$JOB" 2>/dev/null; finish_job a_killed $pids
fi
[ "$(ckpt_latest "$D")" = step_00000002 ] && pass \
  || fail "a: after the crash latest names '$(ckpt_latest "$D")', not step_00000002"
[ ! -e "$D/step_00000004" ] && [ -d "$D/.tmp-step_00000004" ] && pass \
  || fail "a: expected only the half-written .tmp-step_00000004: $(ls -A "$D" | tr '\n' ' ')"
verify_ckpt "a: after the crash" "$D"

# Resume: loading checks every checksum; the stale temporary directory goes.
if run4 a_resumed --set train.steps=4 --set "checkpoint.dir=\"$D\"" --set checkpoint.every=2 \
     --set checkpoint.load=latest; then
  [ "$(ckpt_latest "$D")" = step_00000004 ] && pass || fail "a: latest after the resume: '$(ckpt_latest "$D")'"
  left=$(for f in "$D"/.tmp-* "$D"/.old-*; do [ -e "$f" ] && printf '%s ' "${f##*/}"; done)
  [ -z "$left" ] && pass || fail "a: the resume left $left in $D"
  step_losses "$TMP/a_ref.jsonl" 2 3 >"$TMP/a_ref.23"
  step_losses "$TMP/a_resumed.jsonl" >"$TMP/a_resumed.23"
  same_steps "a: steps 2-3 resumed after the crash vs uninterrupted" "$TMP/a_resumed.23" "$TMP/a_ref.23"
fi
echo "a: $((SECONDS - t_start)) s"

# --- b. SIGTERM to one rank, SIGUSR1 to mpirun ------------------------------------------
# preempt NAME SIGNAL TARGET: TARGET is "rank" (world rank 3) or "mpirun". Sets K_NAME.
preempt() {
  local name="$1" sig="$2" target="$3" D="$TMP/$1/ckpt" t0=$SECONDS pids victim K last cks
  launch "$name" --set train.steps=100000 --set "checkpoint.dir=\"$D\"" --set checkpoint.load=latest
  if ! poll 30 grep -qs '"step":3,' "$TMP/$name.jsonl"; then
    fail "$name: no step 3 in the metrics within 30 s"; tail -20 "$TMP/$name.err" | sed 's/^/    /' >&2
    pids=$(rank_pids); kill "$JOB" 2>/dev/null; finish_job "$name" $pids; return
  fi
  pids=$(rank_pids)
  # Looked for a few times. (The miss once seen, in a sanitizer run of 33257cf, was the
  # lookup's own `tr | grep -q` dying of SIGPIPE under pipefail: rank_pid reads with
  # grep_q now. The retries cover a /proc that is slow to answer under load.)
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    if [ "$target" = rank ]; then victim=$(rank_pid 3); else victim=$(mpirun_pid); fi
    [ -n "$victim" ] && break
    sleep 0.2
  done
  if [ -z "$victim" ]; then fail "$name: no $target to signal"; kill "$JOB"; finish_job "$name" $pids; return; fi
  kill "-$sig" "$victim"
  finish_job "$name" $pids
  echo "$name: mpirun exited $JOB_RC, $JOB_MS ms after SIG$sig to $target"
  if [ "$JOB_RC" -eq 75 ]; then pass; else
    fail "$name: expected exit code 75 after SIG$sig, got $JOB_RC"; tail -20 "$TMP/$name.err" | sed 's/^/    /' >&2
    return
  fi
  # K: the checkpoint `latest` names; the metrics hold steps 0..K-1 and then its save.
  K=$(ckpt_latest "$D" | sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p')
  if [ -z "$K" ] || [ ! -d "$D/step_$(printf %08d "$K")" ]; then
    fail "$name: latest names '$(ckpt_latest "$D")': $(ls -A "$D" 2>&1 | tr '\n' ' ')"; return
  fi
  eval "K_$name=$K"
  last=$(step_losses "$TMP/$name.jsonl" | tail -1 | cut -d' ' -f1)
  cks=$(grep -o '"checkpoint_step":[0-9]*' "$TMP/$name.jsonl" | cut -d: -f2 | tr '\n' ' ')
  if [ "$((last + 1))" = "$K" ] && [ "$cks" = "$K " ] && [ "$(step_losses "$TMP/$name.jsonl" | wc -l)" = "$K" ]; then
    pass
  else fail "$name: checkpoint step $K, but the metrics' last step is $last and their saves '$cks'"; fi
  verify_ckpt "$name" "$D"

  # The uninterrupted run of K+2 steps; the resumed one appends to the same metrics.
  run4 "${name}_ref" --set train.steps=$((K + 2)) || return
  if run4 "$name" --set train.steps=$((K + 2)) --set "checkpoint.dir=\"$D\"" --set checkpoint.load=latest; then
    step_losses "$TMP/${name}_ref.jsonl" >"$TMP/$name.ref"
    step_losses "$TMP/$name.jsonl" >"$TMP/$name.all"
    same_steps "$name: steps 0-$((K + 1)), stopped after $((K - 1)) and resumed, vs uninterrupted" \
      "$TMP/$name.all" "$TMP/$name.ref"
    [ "$(ckpt_latest "$D")" = "step_$(printf %08d $((K + 2)))" ] && pass \
      || fail "$name: latest after the resume: '$(ckpt_latest "$D")'"
  fi
  echo "$name: stopped at K = $K; $((SECONDS - t0)) s"
}
K_b_term=""
preempt b_term TERM rank
preempt b_usr1 USR1 mpirun

# --- c. The SIGTERM checkpoint on other grids -------------------------------------------
if [ -n "$K_b_term" ]; then
  K=$K_b_term
  step_losses "$TMP/b_term_ref.jsonl" "$K" $((K + 1)) >"$TMP/c.ref"
  from=(--set train.steps=$((K + 2)) --set "checkpoint.load=\"$TMP/b_term/ckpt/step_$(printf %08d "$K")\"")
  if run_np 1 "${common[@]}" "${from[@]}" --set "log.metrics=\"$TMP/c_one.jsonl\""; then
    pass
    step_losses "$TMP/c_one.jsonl" >"$TMP/c_one"
    close_steps "c: resumed on 1 rank vs pp=2 x dp=2 uninterrupted" "$TMP/c_one" "$TMP/c.ref" 1e-4
  else fail "c: resume on 1 rank (exit $?)"; tail -20 "$TMP/err" | sed 's/^/    /' >&2; fi
  if run_np 2 "${common[@]}" --set parallel.tp=2 "${from[@]}" --set "log.metrics=\"$TMP/c_tp2.jsonl\""; then
    pass
    step_losses "$TMP/c_tp2.jsonl" >"$TMP/c_tp2"
    close_steps "c: resumed on tp=2 vs pp=2 x dp=2 uninterrupted" "$TMP/c_tp2" "$TMP/c.ref" 1e-4
  else fail "c: resume on tp=2 (exit $?)"; tail -20 "$TMP/err" | sed 's/^/    /' >&2; fi
else
  fail "c: no checkpoint from b_term to resume from"
fi

# --- d. No checkpoint.dir: a stop signal ends the run without a save, and the exit code
# is 128 + the signal (not 75, so no job script requeues a run that would start over).
launch d_nodir --set train.steps=100000
if poll 30 grep -qs '"step":3,' "$TMP/d_nodir.jsonl"; then
  pids=$(rank_pids)
  kill -USR1 "$(mpirun_pid)"
  finish_job d_nodir $pids
  [ "$JOB_RC" -eq 138 ] && pass || fail "d: without checkpoint.dir, SIGUSR1 gave exit $JOB_RC, not 138"
  grep -q "nothing saved: no checkpoint.dir" "$TMP/d_nodir.err" && pass || fail "d: no 'nothing saved' line"
else
  fail "d: no step 3 in the metrics within 30 s"; kill "$JOB" 2>/dev/null
fi

# --- e. SIGINT to one process (no mpirun: a terminal's Ctrl-C reaches the process) ------
# sigint NAME: tessera alone in the background, metrics in $TMP/NAME.jsonl, checkpoints
# in $TMP/NAME/ckpt; JOB is its pid. (Background jobs of a script start with SIGINT
# ignored; tessera installs its handler whatever it inherits.)
sigint() {
  "$TESSERA" "${common[@]}" --set train.steps=100000 --set "checkpoint.dir=\"$TMP/$1/ckpt\"" \
    --set "log.metrics=\"$TMP/$1.jsonl\"" --set log.progress=true "${@:2}" \
    >"$TMP/$1.out" 2>"$TMP/$1.err" &
  JOB=$!
}
sigint e_once
if poll 30 grep -qs '"step":3,' "$TMP/e_once.jsonl"; then
  kill -INT "$JOB"
  finish_job e_once "$JOB"
  [ "$JOB_RC" -eq 75 ] && pass || { fail "e: SIGINT gave exit $JOB_RC, not 75"; tail -20 "$TMP/e_once.err" | sed 's/^/    /' >&2; }
  grep -q "SIGINT: stopping after this step" "$TMP/e_once.err" && pass || fail "e: no SIGINT notice on stderr"
  grep -q "received SIGINT after step" "$TMP/e_once.err" && pass || fail "e: no 'received SIGINT' line"
  K=$(ckpt_latest "$TMP/e_once/ckpt" | sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p')
  last=$(step_losses "$TMP/e_once.jsonl" | tail -1 | cut -d' ' -f1)
  [ -n "$K" ] && [ "$((last + 1))" = "$K" ] && pass \
    || fail "e: latest '$(ckpt_latest "$TMP/e_once/ckpt")' is not the step after the metrics' last ($last)"
  verify_ckpt "e: the SIGINT checkpoint" "$TMP/e_once/ckpt"
else
  fail "e: no step 3 in the metrics within 30 s"; kill -KILL "$JOB" 2>/dev/null
fi

export TS_TEST_SAVE_STALL_S=30
sigint e_twice
unset TS_TEST_SAVE_STALL_S
if poll 30 grep -qs '"step":3,' "$TMP/e_twice.jsonl"; then
  kill -INT "$JOB"
  if poll 30 grep -qs 'stalling mid-save' "$TMP/e_twice.err"; then
    kill -INT "$JOB"
    finish_job e_twice "$JOB"
    # bash reports a process that SIGINT's default action ended as 128 + 2.
    [ "$JOB_RC" -eq 130 ] && [ "$JOB_MS" -lt 20000 ] && pass \
      || fail "e: a second SIGINT mid-save gave exit $JOB_RC after $JOB_MS ms, not 130 at once"
    [ ! -e "$TMP/e_twice/ckpt/latest" ] && pass \
      || fail "e: the interrupted save was committed: latest names '$(ckpt_latest "$TMP/e_twice/ckpt")'"
  else
    fail "e: no stalled save after the first SIGINT"; tail -20 "$TMP/e_twice.err" | sed 's/^/    /' >&2
    kill -KILL "$JOB" 2>/dev/null
  fi
else
  fail "e: no step 3 in the metrics within 30 s"; kill -KILL "$JOB" 2>/dev/null
fi

echo "total $((SECONDS - t_start)) s"
finish
