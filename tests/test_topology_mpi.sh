# tessera topo under mpirun: the rank -> (pp,dp,tp) map ((pp,dp,cp,tp) with context
# parallelism), core binding (ours and mpirun's), node-layout warnings with
# TS_FAKE_NODES, and the grid-size error.
source "$(dirname "$0")/lib.sh"

cfg="$SRC/configs/tiny.cfg"

# rows FILE: the rank table's lines (they alone carry "(pp,dp,tp)" coordinates, or
# "(pp,dp,cp,tp)" when cp > 1).
rows() { grep -E '^[0-9]+ +.*\([0-9]+(,[0-9]+){2,3}\)' "$1"; }

# expand LIST: "0-2,5" -> "0 1 2 5" (one per line).
expand() {
  tr ',' '\n' <<<"$1" | awk -F- '{ hi = NF > 1 ? $2 : $1; for (i = $1; i <= hi; i++) print i }'
}

# Columns of a rank row: rank host node local (pp,dp[,cp],tp) cores threads binding gpu...
col() { awk -v c="$1" '{ print $c }'; }

# 1. pp=2 dp=2 tp=2 on 8 ranks: tp varies fastest, then dp, then pp.
if run_np 8 topo "$cfg" --set parallel.pp=2 --set parallel.dp=2 --set parallel.tp=2; then
  n=$(rows "$TMP/out" | wc -l)
  [ "$n" -eq 8 ] && pass || fail "expected 8 rank rows, got $n"
  bad=0
  for r in 0 1 2 3 4 5 6 7; do
    want="($((r / 4)),$((r / 2 % 2)),$((r % 2)))"
    got=$(rows "$TMP/out" | awk -v r="$r" '$1 == r { print $5 }')
    [ "$got" = "$want" ] || { bad=1; echo "rank $r: got '$got', want '$want'" >&2; }
  done
  [ "$bad" -eq 0 ] && pass || fail "wrong coordinates for pp=dp=tp=2"
  grep -q "tensor-parallel.*{0-1} {2-3} {4-5} {6-7}" "$TMP/out" && pass || fail "tp groups"
  grep -q "data-parallel.*{0,2} {1,3} {4,6} {5,7}" "$TMP/out" && pass || fail "dp groups"
  grep -q "pipeline.*{0,4} {1,5} {2,6} {3,7}" "$TMP/out" && pass || fail "pp groups"
  grep -q "embedding.*{0,4} {1,5} {2,6} {3,7}" "$TMP/out" && pass || fail "embedding groups"
  # cp = 1 prints what it did before context parallelism: no cp anywhere.
  grep -q "grid pp=2 dp=2 tp=2, order tp-dp-pp$" "$TMP/out" && pass || fail "grid line"
  grep -q "(pp,dp,tp)" "$TMP/out" && ! grep -q "cp=\|,cp,\|context-parallel\|replica" "$TMP/out" &&
    pass || fail "cp = 1 shows cp"
  # 8 ranks on this 2-core machine share cores: warned once.
  c=$(grep -c "ranks outnumber cores" "$TMP/err" || true)
  [ "$c" -eq 1 ] && pass || fail "expected the oversubscription warning once, got $c"
else
  fail "topo pp=dp=tp=2 on 8 ranks failed"; sed 's/^/    /' "$TMP/err" >&2
fi

# 2. Another order: dp-tp-pp puts data-parallel replicas on consecutive ranks.
if run_np 4 topo "$cfg" --set parallel.dp=2 --set parallel.tp=2 --set parallel.order=dp-tp-pp; then
  got=$(rows "$TMP/out" | col 5 | tr '\n' ' ')
  [ "$got" = "(0,0,0) (0,1,0) (0,0,1) (0,1,1) " ] && pass || fail "dp-tp-pp coordinates: $got"
  grep -q "tensor-parallel.*{0,2} {1,3}" "$TMP/out" && pass || fail "dp-tp-pp tp groups"
else
  fail "topo dp-tp-pp failed"; sed 's/^/    /' "$TMP/err" >&2
fi
# The same order with cp written out where a three-name order puts it (after tp).
if run_np 4 topo "$cfg" --set parallel.dp=2 --set parallel.tp=2 --set parallel.order=dp-tp-cp-pp; then
  got=$(rows "$TMP/out" | col 5 | tr '\n' ' ')
  [ "$got" = "(0,0,0) (0,1,0) (0,0,1) (0,1,1) " ] && pass || fail "dp-tp-cp-pp coordinates: $got"
else
  fail "topo dp-tp-cp-pp failed"; sed 's/^/    /' "$TMP/err" >&2
fi

# 2b. Context parallelism, pp=1 dp=2 cp=2 tp=2 on 8 ranks in the default order, where cp
#     varies right after tp: rank = tp + 2*(cp + 2*dp). The replica groups (same pp and
#     tp: the ranks holding the same weights) are ordered dp*cp + cp.
if run_np 8 topo "$cfg" --set parallel.dp=2 --set parallel.cp=2 --set parallel.tp=2; then
  grep -q "grid pp=1 dp=2 cp=2 tp=2, order tp-dp-pp$" "$TMP/out" && pass || fail "cp grid line"
  grep -q "(pp,dp,cp,tp)" "$TMP/out" && pass || fail "cp table header"
  bad=0
  for r in 0 1 2 3 4 5 6 7; do
    want="(0,$((r / 4)),$((r / 2 % 2)),$((r % 2)))"
    got=$(rows "$TMP/out" | awk -v r="$r" '$1 == r { print $5 }')
    [ "$got" = "$want" ] || { bad=1; echo "rank $r: got '$got', want '$want'" >&2; }
  done
  [ "$bad" -eq 0 ] && pass || fail "wrong coordinates for dp=cp=tp=2"
  grep -q "tensor-parallel.*{0-1} {2-3} {4-5} {6-7}" "$TMP/out" && pass || fail "cp: tp groups"
  grep -q "context-parallel.*(cp=2): {0,2} {1,3} {4,6} {5,7}" "$TMP/out" && pass ||
    fail "cp groups"
  grep -q "data-parallel.*{0,4} {1,5} {2,6} {3,7}" "$TMP/out" && pass || fail "cp: dp groups"
  grep -q "replica.*(dp\*cp=4): {0,2,4,6} {1,3,5,7}" "$TMP/out" && pass || fail "replica groups"
  grep -q "embedding.*{0} {1} {2} {3} {4} {5} {6} {7}" "$TMP/out" && pass ||
    fail "cp: embedding groups"
else
  fail "topo dp=cp=tp=2 on 8 ranks failed"; sed 's/^/    /' "$TMP/err" >&2
fi
# A four-name order: cp fastest, then tp (rank = cp + 2*tp).
if run_np 4 topo "$cfg" --set parallel.dp=1 --set parallel.cp=2 --set parallel.tp=2 \
    --set parallel.order=cp-tp-dp-pp; then
  got=$(rows "$TMP/out" | col 5 | tr '\n' ' ')
  [ "$got" = "(0,0,0,0) (0,0,1,0) (0,0,0,1) (0,0,1,1) " ] && pass ||
    fail "cp-tp-dp-pp coordinates: $got"
  grep -q "tensor-parallel.*{0,2} {1,3}" "$TMP/out" && pass || fail "cp-tp-dp-pp tp groups"
  grep -q "context-parallel.*{0-1} {2-3}" "$TMP/out" && pass || fail "cp-tp-dp-pp cp groups"
else
  fail "topo cp-tp-dp-pp failed"; sed 's/^/    /' "$TMP/err" >&2
fi

# 2c. The communicators themselves (tests/mpi_topology.c): every group's members, in
#     order, and each rank's place, as the grid arithmetic says; the replica group is the
#     dp group with cp = 1. 8 ranks: cp = 2 in the default order and with cp slower than
#     dp (the replica group then out of rank order), and cp = 1; the expert grid's ep,
#     etp and edp groups with ep borrowing tp, cp and dp ranks (ep 4 over tp 2 x dp 2;
#     ep 2 x etp 2 over tp 2 x cp 2; ep 2 on a cp-slower order).
#     The four grids in one launch (the program makes, checks and frees each in turn): a
#     launch of 8 ranks on 2 cores cost about what its checks do (docs/CI.md).
prog="$(dirname "$TESSERA")/tests/mpi_topology"
grids=("1 2 2 2 tp-dp-pp 4 1" "2 2 2 1 tp-dp-cp-pp 2 1" "2 2 1 2 tp-dp-pp 4 1"
       "1 2 2 2 tp-dp-pp 2 2")
# shellcheck disable=SC2048,SC2086 # the grids' words are the program's arguments
if timeout 120 mpirun --oversubscribe -np 8 "$prog" ${grids[*]} >"$TMP/out" 2>"$TMP/err" &&
   [ "$(grep -c ': checked$' "$TMP/out")" -eq ${#grids[@]} ]; then
  pass
else
  fail "communicators of the grids pp dp cp tp order ep etp = ${grids[*]}"; cat "$TMP/out" "$TMP/err" >&2
fi

# 2d. An MoE model's expert grid in `tessera topo`, folded over the same ranks: with ep =
#     etp = 1 each rank is its own ep and etp group and edp is its stage's ranks (the
#     communicators of ep > 1 are 2c's).
moe=(--set model.moe_experts=4 --set model.moe_top_k=2 --set model.moe_ffn_hidden=32)
if timeout 120 mpirun --oversubscribe -np 4 "$TESSERA" topo "$SRC/configs/llama-tiny.cfg" "${moe[@]}" \
     --set parallel.dp=2 --set parallel.pp=2 >"$TMP/out" 2>"$TMP/err"; then
  for want in 'expert-parallel  (ep=1): {0} {1} {2} {3}' 'expert-tensor    (etp=1): {0} {1} {2} {3}' \
              'expert-data      (edp=2): {0-1} {2-3}'; do
    grep -qF -- "$want" "$TMP/out" && pass || fail "topo of an MoE model lacks '$want'"
  done
else
  fail "tessera topo of an MoE model"; cat "$TMP/err" >&2
fi
if timeout 120 mpirun --oversubscribe -np 2 "$TESSERA" topo >"$TMP/out" 2>"$TMP/err" &&
   ! grep -q "expert-" "$TMP/out"; then pass
else fail "a dense model's topo printed expert groups (or failed)"; fi

# 3. No launcher binding, 2 ranks on 2 cores: tessera gives each its own core and thread.
if timeout 120 mpirun --bind-to none -np 2 "$TESSERA" topo >"$TMP/out" 2>"$TMP/err"; then
  c0=$(rows "$TMP/out" | awk '$1 == 0 { print $6 }')
  c1=$(rows "$TMP/out" | awk '$1 == 1 { print $6 }')
  shared=$(cat <(expand "$c0") <(expand "$c1") | sort | uniq -d | wc -l)
  [ -n "$c0" ] && [ -n "$c1" ] && [ "$shared" -eq 0 ] && pass ||
    fail "cores not disjoint: '$c0' '$c1'"
  if [ "$(nproc)" -eq 2 ]; then # this 2-core machine: one core and one thread each
    got=$(rows "$TMP/out" | awk '{ print $6, $7 }' | tr '\n' ' ')
    [ "$got" = "0 1 1 1 " ] && pass || fail "expected cores 0 and 1, 1 thread each: '$got'"
  else
    skip_case "cores 0 and 1 with a thread each for 2 unbound ranks (a 2-CPU machine's layout; this one has $(nproc))"
  fi
  binding=$(rows "$TMP/out" | col 8 | sort -u | tr '\n' ' ')
  [ "$binding" = "tessera " ] && pass || fail "expected binding tessera, got $binding"
  grep -q "rank.*cores.*threads.*binding.*gpu" "$TMP/out" && pass || fail "table header"
else
  fail "topo --bind-to none failed"; sed 's/^/    /' "$TMP/err" >&2
fi

# 4. mpirun's own binding is kept and attributed to it.
if timeout 120 mpirun --bind-to core -np 2 "$TESSERA" topo >"$TMP/out" 2>"$TMP/err"; then
  binding=$(rows "$TMP/out" | col 8 | sort -u | tr '\n' ' ')
  [ "$binding" = "mpirun " ] && pass || fail "expected binding mpirun, got '$binding'"
  c0=$(rows "$TMP/out" | awk '$1 == 0 { print $6 }')
  c1=$(rows "$TMP/out" | awk '$1 == 1 { print $6 }')
  [ "$c0" != "$c1" ] && pass || fail "mpirun --bind-to core: cores '$c0' '$c1'"
else
  fail "topo --bind-to core failed"; sed 's/^/    /' "$TMP/err" >&2
fi

# 5. TS_NO_BIND=1: nothing bound, the 2 cores shared fairly (1 thread each).
if TS_NO_BIND=1 timeout 120 mpirun --bind-to none -np 2 "$TESSERA" topo \
    >"$TMP/out" 2>"$TMP/err"; then
  got=$(rows "$TMP/out" | awk '{ print $6, $8 }' | sort -u | wc -l)
  binding=$(rows "$TMP/out" | col 8 | sort -u | tr '\n' ' ')
  [ "$got" -eq 1 ] && [ "$binding" = "none " ] && pass || fail "TS_NO_BIND: '$binding', $got"
  if [ "$(nproc)" -eq 2 ]; then
    got=$(rows "$TMP/out" | awk '{ print $6, $7 }' | sort -u | tr '\n' ' ')
    [ "$got" = "0-1 1 " ] && pass || fail "TS_NO_BIND: expected both cores, 1 thread: '$got'"
  else
    skip_case "TS_NO_BIND: both cores and a thread each (a 2-CPU machine's layout; this one has $(nproc))"
  fi
else
  fail "topo TS_NO_BIND failed"; sed 's/^/    /' "$TMP/err" >&2
fi

# 6. Pretend nodes of 2 ranks: a tp=4 group spans 2 of them (warned once); tp=2 in
#    tp-dp-pp order stays inside one (no warning).
if TS_FAKE_NODES=2 run_np 4 topo "$cfg" --set parallel.tp=4; then
  warning="tensor-parallel group {ranks 0-3} spans 2 nodes (fakenode0, fakenode1)"
  c=$(cat "$TMP/out" "$TMP/err" | grep -cF "$warning" || true)
  [ "$c" -eq 1 ] && pass || fail "expected the cross-node tp warning once, got $c"
  hosts=$(rows "$TMP/out" | col 2 | tr '\n' ' ')
  [ "$hosts" = "fakenode0 fakenode0 fakenode1 fakenode1 " ] && pass || fail "fake hosts: $hosts"
else
  fail "topo TS_FAKE_NODES tp=4 failed"; sed 's/^/    /' "$TMP/err" >&2
fi
if TS_FAKE_NODES=2 run_np 4 topo "$cfg" --set parallel.tp=2 --set parallel.dp=2; then
  grep -q "spans" "$TMP/err" && fail "tp=2 inside 2-rank nodes warned" || pass
else
  fail "topo TS_FAKE_NODES tp=2 failed"; sed 's/^/    /' "$TMP/err" >&2
fi

# 7. The grid must match the ranks launched: one message, non-zero exit everywhere (an
# explicit dp; "auto", the shipped configs', takes what pp * tp leave, and must divide).
expect_error 3 "pp\*dp\*cp\*tp = 1\*1\*1\*1 = 1 does not match the 3 ranks" topo "$cfg" --set parallel.dp=1
expect_error 3 "parallel.dp = \"auto\" takes what pp \* tp = 1 \* 2 = 2 leave of the 3 ranks" \
  topo "$cfg" --set parallel.dp=auto --set parallel.tp=2
if run_np 3 topo "$cfg" --set parallel.dp=auto --set train.global_batch=12 && grep -q 'dp=3\|dp 3' "$TMP/out"; then
  pass
else
  fail "parallel.dp = auto on 3 ranks: $(cat "$TMP/out" "$TMP/err")"
fi
expect_error 2 "parallel.order" topo "$cfg" --set parallel.order=tp-tp-pp
expect_error 2 "parallel.order.*\"tp-cp-dp-pp\"" topo "$cfg" --set parallel.order=tp-cp-dp
expect_error 2 "parallel.order.*\"tp-cp-dp-pp\"" topo "$cfg" --set parallel.order=tp-cp-cp-pp
expect_error 2 "pp\*dp\*cp\*tp = 1\*2\*2\*1 = 4 does not match the 2 ranks" topo "$cfg" \
  --set parallel.dp=2 --set parallel.cp=2
TS_FAKE_NODES=zero expect_error 2 "TS_FAKE_NODES" topo

# 8. Help.
"$TESSERA" topo --help | grep_q "usage: tessera topo" && pass || fail "topo --help"
"$TESSERA" --help | grep_q "topo" && pass || fail "tessera --help lists topo"
finish
