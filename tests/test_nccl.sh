# The NCCL comm backend on a GPU (CTest label "gpu"; skipped, 77, where the build has no
# NCCL or no CUDA device is visible): the comm conformance program
# (tests/mpi_comm_conformance.c) with backend "nccl" on device buffers of the CUDA
# backend, on one rank (NCCL's own collectives, point-to-point to itself, ncclCommSplit
# for duplicates), and on two ranks with a GPU each where the machine has two. Then two
# ranks on one GPU: moving the world to NCCL must fail on every rank, quickly (before any
# NCCL call, so nothing can hang), with one message naming the ranks and the GPU and
# saying to use parallel.comm = "mpi" or a GPU per rank.
source "$(dirname "$0")/lib.sh"
prog="$(dirname "$TESSERA")/tests/mpi_comm_conformance"

timeout 120 mpirun --oversubscribe -np 1 "$prog" nccl >"$TMP/out" 2>"$TMP/err"
rc=$?
cat "$TMP/out"
# Skipped only on the program's own 77 (no NCCL in the build, or no GPU): output that
# merely says "skipped" with another status is a failure, reported below.
if [ "$rc" -eq 77 ]; then
  skip_test "$(head -1 "$TMP/out")"
fi
if [ "$rc" -eq 0 ]; then pass; else
  fail "comm conformance (nccl) on 1 rank: exit $rc"; cat "$TMP/err" >&2
fi

# Two ranks with a GPU each, where there are two (nvidia-smi counts the visible ones).
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); fi
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  n=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
  [ "$n" -lt "$gpus" ] && gpus=$n
fi
if [ "$gpus" -ge 2 ]; then
  if timeout 300 mpirun --oversubscribe -np 2 "$prog" nccl >"$TMP/out" 2>"$TMP/err"; then
    pass; cat "$TMP/out"
  else
    fail "comm conformance (nccl) on 2 ranks with a GPU each"; cat "$TMP/out" "$TMP/err" >&2
  fi
else
  skip_case "2 ranks with a GPU each (this machine shows $gpus GPU(s))"
fi

# Two ranks on one GPU: the first one this job may use, for both.
first="${CUDA_VISIBLE_DEVICES:-0}"
start=$(date +%s)
CUDA_VISIBLE_DEVICES="${first%%,*}" timeout 90 mpirun --oversubscribe -np 2 "$prog" nccl \
  >"$TMP/out" 2>"$TMP/err"
rc=$?
secs=$(( $(date +%s) - start ))
msg='nccl comm backend needs one GPU per rank, but world ranks 0, 1 of the world group all run on GPU 0'
# Failed (not within 90 s: a hang), the message once, no crash (lib.sh's judge_error);
# then the message names the PCI bus id and the way out.
if judge_error "two ranks on one GPU: moving the world to nccl" "$rc" "$msg"; then
  if grep -q 'parallel.comm = "mpi"' "$TMP/err" && grep -q 'PCI [0-9a-f]\{4\}:' "$TMP/err"; then
    pass; echo "two ranks on one GPU: refused in ${secs} s: $(grep "$msg" "$TMP/err")"
  else
    fail "two ranks on one GPU: the message names no PCI bus id or no parallel.comm = \"mpi\""
  fi
fi
[ "$FAILED" -eq 0 ] || cat "$TMP/out" "$TMP/err" >&2
finish
