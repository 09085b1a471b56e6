# Errors that only one rank sees: the config file missing on its node, a different
# value or command line there. Every rank must exit non-zero within seconds (not hang
# in the first collective), and rank 0 prints the failing rank's message once, naming
# that rank and its host.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
cfg="$SRC/configs/tiny.cfg"
base=(train "$cfg" --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set train.steps=2
      --set train.threads=1 --set "log.metrics=\"$TMP/m.jsonl\"" --set log.progress=false
      --set parallel.dp=2 --set parallel.micro_batch=2)

# A launcher that changes rank 1's command line: RANK1_EXTRA is appended there, and with
# RANK1_CONFIG its config path is replaced.
cat > "$TMP/rank1.sh" <<'WRAP'
#!/usr/bin/env bash
if [ "${OMPI_COMM_WORLD_RANK:-0}" = 1 ]; then
  args=()
  for a in "$@"; do
    if [ -n "${RANK1_CONFIG:-}" ] && [ "$a" = "$CONFIG" ]; then a="$RANK1_CONFIG"; fi
    args+=("$a")
  done
  # shellcheck disable=SC2086
  exec "${args[@]}" $RANK1_EXTRA
fi
exec "$@"
WRAP
chmod +x "$TMP/rank1.sh"

# rank1_error PATTERN EXTRA [CONFIG_ON_RANK1]: run 2 ranks through the launcher; they
# fail as lib.sh's judge_error wants (non-zero, no hang, PATTERN once, no crash).
rank1_error() {
  local pattern="$1"
  export CONFIG="$cfg" RANK1_EXTRA="$2" RANK1_CONFIG="${3:-}"
  FAIL_FAST timeout 120 mpirun --oversubscribe -np 2 -x CONFIG -x RANK1_EXTRA -x RANK1_CONFIG \
    "$TMP/rank1.sh" "$TESSERA" "${base[@]}" >"$TMP/out" 2>"$TMP/err"
  judge_error "2 ranks, rank 1 with '$2'${3:+ and config $3}" $? "$pattern"
}

rank1_error "on rank 1 \(host [^)]+\): cannot open config file '$TMP/absent.cfg'" "" "$TMP/absent.cfg"
rank1_error "on rank 1 \(host [^)]+\): the grid pp\*dp\*cp\*tp = 1\*3\*1\*1" "--set parallel.dp=3"
rank1_error "on rank 1 \(host [^)]+\): .*different config.*train.steps = 4 here but 2 on rank 0" \
  "--set train.steps=4"
rank1_error "on rank 1 \(host [^)]+\): unknown option '--bogus'" "--bogus"
rank1_error "on rank 1 \(host [^)]+\): .*different config.*model.init" \
  "--set model.init=\"$TMP/other.safetensors\""

# The same launcher with nothing changed runs (the control).
export CONFIG="$cfg" RANK1_EXTRA="" RANK1_CONFIG=""
if timeout 120 mpirun --oversubscribe -np 2 -x CONFIG -x RANK1_EXTRA -x RANK1_CONFIG \
     "$TMP/rank1.sh" "$TESSERA" "${base[@]}" >"$TMP/out" 2>"$TMP/err"; then
  pass
else
  fail "control run"; sed 's/^/    /' "$TMP/err" >&2
fi
finish
