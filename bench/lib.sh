# Helpers shared by bench/dp.sh and bench/pipeline.sh (sourced, not run).

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

# the memory line of a metrics file: {"peak_rss_mb":[...],"activation_mb":[...]}
mem_line() { grep -o '"peak_rss_mb".*' "$1" | tr -d '{}'; }

# CPU busy percentage of the whole machine over one second (everything that runs)
cpu_busy() {
  local a b
  a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
  awk -v u1="${a[1]}" -v n1="${a[2]}" -v s1="${a[3]}" -v i1="${a[4]}" -v w1="${a[5]}" \
      -v q1="${a[6]}" -v r1="${a[7]}" -v u2="${b[1]}" -v n2="${b[2]}" -v s2="${b[3]}" \
      -v i2="${b[4]}" -v w2="${b[5]}" -v q2="${b[6]}" -v r2="${b[7]}" 'BEGIN {
    busy = (u2 - u1) + (n2 - n1) + (s2 - s1) + (q2 - q1) + (r2 - r1);
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
