# The comm backend's conformance tests (tests/mpi_comm_conformance.c) on 2, 3 and 4
# ranks, oversubscribed: every data-plane call in every type, on the world and split
# and duplicated sub-groups, with exact expected values; the control plane's gathers
# and agreement. TS_COMM_BACKEND names the backend under test (default mpi).
source "$(dirname "$0")/lib.sh"
prog="$(dirname "$TESSERA")/tests/mpi_comm_conformance"
backend="${TS_COMM_BACKEND:-mpi}"
for np in 2 3 4; do
  start=$(date +%s%N)
  if timeout 60 mpirun --oversubscribe -np "$np" "$prog" "$backend" >"$TMP/out" 2>"$TMP/err"; then
    pass
    echo "$np ranks ($backend): $(( ($(date +%s%N) - start) / 1000000 )) ms"
    cat "$TMP/out"
  else
    fail "comm conformance ($backend) on $np ranks"; cat "$TMP/out" "$TMP/err" >&2
  fi
done
finish
