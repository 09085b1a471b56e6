# Helpers shared by the bench/*.sh scripts (sourced, not run).

# bench_setup: install, build into $build, prepare the corpus, allow mpirun as root,
# and set $tmp to a scratch folder (removed at exit; KEEP=DIR keeps the runs' files there)
bench_setup() {
  scripts/setup.sh python3 >/dev/null
  scripts/build.sh "$build" >/dev/null
  scripts/prepare_data.sh "$build/tessera" data >/dev/null
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  if [ -n "${KEEP:-}" ]; then
    tmp="$KEEP"; mkdir -p "$tmp"
  else
    tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  fi
}

# model FLOPs per token: 6 per parameter in a matmul (wte counts once: the tied head's
# GEMM; wpe is a lookup) plus attention's QK^T and PV, forward and backward, counted
# over the full T x T as PaLM/nanoGPT do: 12 * L * T * C.
flops_per_token() { # L C V T: the model FLOPs of one token of a GPT-2 step
  awk -v L="$1" -v C="$2" -v V="$3" -v T="$4" 'BEGIN {
    p = V * C + L * (12 * C * C + 13 * C) + 2 * C;   # every parameter but wpe
    printf "%.0f", 6 * p + 12 * L * T * C }'
}

# median of the numbers on stdin (empty input: nothing)
median() { sort -g | awk '{a[NR] = $1} END {if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# metric KEY FILE SKIP: KEY of every step line of a metrics file with step >= SKIP
metric() {
  awk -v k="\"$1\":" -v s="$3" '/^\{"step":[0-9]+,"loss"/ {
    split($0, a, /[:,]/); if (a[2] + 0 < s) next
    i = index($0, k); if (!i) next
    v = substr($0, i + length(k)); sub(/[,}].*/, "", v); print v }' "$2"
}

# med KEY FILE SKIP: the median of metric KEY over steps >= SKIP
med() { metric "$@" | median; }

# mem_field FILE KEY: rank 0's entry of a list in the metrics' last line
mem_field() { tail -n 1 "$1" | grep -o "\"$2\":\[[^],]*" | cut -d'[' -f2; }

# the memory line of a metrics file: {"peak_rss_mb":[...],"activation_mb":[...]}
mem_line() { grep -o '"peak_rss_mb".*' "$1" | tr -d '{}'; }

# CPU busy percentage of the whole machine over one second (everything that runs, and
# steal: time the hypervisor gave this VM's CPUs to someone else)
cpu_busy() {
  local a b
  a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
  awk -v u1="${a[1]}" -v n1="${a[2]}" -v s1="${a[3]}" -v i1="${a[4]}" -v w1="${a[5]}" \
      -v q1="${a[6]}" -v r1="${a[7]}" -v t1="${a[8]}" -v u2="${b[1]}" -v n2="${b[2]}" \
      -v s2="${b[3]}" -v i2="${b[4]}" -v w2="${b[5]}" -v q2="${b[6]}" -v r2="${b[7]}" \
      -v t2="${b[8]}" 'BEGIN {
    busy = (u2 - u1) + (n2 - n1) + (s2 - s1) + (q2 - q1) + (r2 - r1) + (t2 - t1);
    idle = (i2 - i1) + (w2 - w1);
    printf "%.0f", (busy + idle > 0) ? 100 * busy / (busy + idle) : 0 }'
}

# wait_quiet MAX_SECONDS: wait (up to MAX_SECONDS) until the machine is idle: less than
# 15% of the CPUs busy over a second, twice in a row. Timings on a shared 2-core machine
# mean nothing while someone else compiles. Prints the busy share it settled for.
wait_quiet() {
  local max="$1" t=0 b quiet=0
  while :; do
    b=$(cpu_busy)
    if [ "$b" -lt 15 ]; then quiet=$((quiet + 1)); else quiet=0; fi
    if [ "$quiet" -ge 2 ] || [ "$t" -ge "$max" ]; then break; fi
    sleep 2; t=$((t + 3))
  done
  echo "$b"
}

# cpu_mark PID: "BUSY CHILDREN SECONDS": the machine's busy CPU ticks (steal included: time
# the hypervisor gave this VM's CPUs to someone else), the CPU ticks of
# the reaped children of shell PID (mpirun and its ranks, once waited for), and the time
cpu_mark() {
  local a s
  a=($(head -1 /proc/stat))
  s=($(cat /proc/"$1"/stat))
  echo "$((a[1] + a[2] + a[3] + a[6] + a[7] + a[8])) $((s[15] + s[16])) $(date +%s.%N)"
}

# others_pct MARK_BEFORE MARK_AFTER: percent of the machine's CPU time used by anything
# but this script's children between the marks (other people's builds and tests, steal)
others_pct() {
  local b=($1) a=($2)
  awk -v busy=$((a[0] - b[0])) -v ours=$((a[1] - b[1])) -v t0="${b[2]}" -v t1="${a[2]}" \
      -v n="$(nproc)" -v hz="$(getconf CLK_TCK)" 'BEGIN {
    o = (busy - ours) / ((t1 - t0) * n * hz); printf "%.0f", o < 0 ? 0 : 100 * o }'
}

# measured CMD...: run CMD (output to the caller's redirections); if other processes
# took more than MAX_OTHERS percent (default 10) of the CPUs meanwhile, wait for quiet
# and run it again, up to RETRIES (default 1) more times. Sets OTHERS to the share of
# the run that was kept.
measured() {
  local try=0 m0 m1 me=$BASHPID
  while :; do
    m0=$(cpu_mark "$me")
    "$@" || return 1
    m1=$(cpu_mark "$me")
    OTHERS=$(others_pct "$m0" "$m1")
    if [ "$OTHERS" -le "${MAX_OTHERS:-10}" ] || [ "$try" -ge "${RETRIES:-1}" ]; then return 0; fi
    try=$((try + 1))
    echo "  (others used $OTHERS% of the CPUs during the run: waiting for quiet, then again)" >&2
    wait_quiet 30 >/dev/null
  done
}

# dpsync_min TRACE SKIP: median over steps >= SKIP of the shortest per-rank wait for
# the reduction ("dpsync" spans): the rank that arrived last waits for the reduction
# alone; dp_wait_ms (the longest) also holds the others' wait for that rank.
dpsync_min() {
  python3 - "$1" "$2" <<'PY'
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"]
      if e.get("ph") == "X" and e.get("cat") == "dpsync" and e.get("pid", 0) == 0]
ranks = {}
for e in sorted(ev, key=lambda e: e["ts"]):
    ranks.setdefault(e["tid"], []).append(e["dur"] / 1e3)
steps = min(len(v) for v in ranks.values())
mins = sorted(min(v[s] for v in ranks.values()) for s in range(int(sys.argv[2]), steps))
n = len(mins)
print("%.2f" % (mins[n // 2] if n % 2 else 0.5 * (mins[n // 2 - 1] + mins[n // 2])))
PY
}
