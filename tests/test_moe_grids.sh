# The Mixture-of-Experts layer on the grids it runs on (config_moe.c refuses the rest): a
# DeepSeek-style MoE of llama-tiny with Qwen3's q/k norms (a dense first block, sigmoid
# router in groups, a shared expert, the z-loss, the balance loss, the moving bias) gives
# the one-rank losses and gradient norms within 1e-4 (4 steps; the checkpoint cases 8) on dp 2 with ZeRO-1 (counts and loss
# sums over the replicas, the bias moved alike on each), tp 2 (the MoE replicated on both
# ranks and counted once; q_norm/k_norm gradients summed over them) and pp 2 with zb-v's
# V placement, its split backward (the MoE's weight gradients in the input pass) and full
# recompute (a replayed forward counts nothing: the counts are the backward's); cp 2
# and tp 2 with sequence parallelism (without and with ep 2), the balance loss's counts
# summed over the ranks that split a sequence (and its metrics held to one rank's too);
# expert parallelism (ep 2 over dp 2 with ZeRO-1 and an uneven validation, ep 4 over
# dp 4, ep 2 over dp 4 with ZeRO-3, ep 2 over tp 2 and a bit-identical rerun, ep 2 over
# cp 2, pp 2 x dp 2 x ep 2 with 1f1b, zb-v with full
# recompute and dualpipe-v, whose overlapped pairs on two baton threads equal them run in
# turn bit for bit, eager and grouped); expert tensor parallelism (etp 2 over dp 2, over pp 2 x dp 2
# with zb-v, etp 2 x ep 2 over cp 2 x dp 2, etp 2 over tp 2 with and without sp); a
# checkpoint saved under ep or etp (each expert, or etp slice, by its own ranks; the bias
# in its state.json; on dp 2 x ep 2, on pp 2 x dp 2 x ep 2, on dp 2 x etp 2 and on
# tp 2 x etp 2) resumes on other grids into the same losses,
# on its own bit for bit, and reshards byte for byte (onto etp too); bf16 against fp32
# and on ep 2 over dp 2 and pp 2. Another
# micro-batch split is test_moe_fixture's. Measured at
# 2e-7 when written, also: ZeRO-2/3, pp 2 x dp 2, tp 4, tp 2 x dp 2, tp 2 x pp 2, 1f1b,
# interleaved-1f1b, zb-h1, interleaved-zb, dualpipe-v, gpipe, recompute selective,
# except_last and auto, micro_batch 2, cp 2 x dp 2; ep 2 over dp 4 (edp 2) with ZeRO-0,
# 1 and 2, ep 2 over dp 2 with ZeRO-1, 2 and 3; pp 2 x dp 2 x ep 2 with interleaved-1f1b,
# interleaved-zb, looped-bfs, zb-h1 + full recompute, 1f1b + selective and auto
# recompute; pp 2 x tp 2 x ep 2 with zb-v; ep 4 over tp 2 x dp 2, ep 2 over dp with tp 2
# (order dp-tp-cp-pp: edp across the tp ranks), ep 4 over cp 2 x dp 2 and over tp 2 x
# cp 2 (all within 5e-8); etp 2 over dp 2 with ZeRO-1, recompute full and micro_batch 1,
# etp 2 over dp 4 with ZeRO-3, etp 4 over dp 4, etp 2 x ep 2 over dp 4 with ZeRO-2 (and
# reruns of etp 2 x ep 2 bit-identical), etp 2 x ep 2 over dp 4, etp 2 over cp 2, over pp 2
# x dp 2 with 1f1b and dualpipe-v (within 2.3e-8). Muon on dp 2, etp 2 over dp 2 and ep 2 over dp 4.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
common=(train "$SRC/configs/llama-tiny.cfg" --set train.steps=8
        --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set train.threads=1
        --set log.progress=false --set model.moe_experts=8 --set model.moe_top_k=2
        --set model.moe_ffn_hidden=64 --set model.moe_shared_experts=1
        --set model.moe_router=sigmoid --set model.moe_groups=4 --set model.moe_topk_groups=2
        --set model.moe_route_scale=2.5 --set model.moe_first_dense=1
        --set train.moe_z_loss=1e-3 --set train.moe_aux_loss=1e-2
        --set train.moe_bias_rate=1e-3 --set model.qk_norm=true)

# covered WHAT BY: under the sanitizers WHAT is left to the release build, since BY, a
# superset of its MoE code, runs there too (CI time); elsewhere returns 1.
covered() {
  [ "${TS_TEST_SANITIZERS:-0}" = 1 ] || return 1
  skip_case "$1 (the release build runs it; under the sanitizers $2 covers its code)"
}

# The reference writes TensorBoard events too: its MoE metrics (the losses, the load,
# each block's tokens per expert as moe/block<L>/expert<e>) read back by
# tests/check_tfevents.py.
check ref 1 --set "log.tensorboard=\"$TMP/tb_ref\""
python3 "$SRC/tests/check_tfevents.py" "$TMP/ref.jsonl" "$TMP"/tb_ref/events.out.tfevents.* &&
  pass || fail "the MoE reference's TensorBoard events"
# The grid cases train 4 steps against the reference's first 4 (grid4 ... grid8 below; the
# llama-tiny warm-up is 20 steps, so a step's learning rate does not depend on
# train.steps): four updates carry every grid's sums, exchanges and moved bias into the
# losses, as MLA's cases (docs/CI.md). The checkpoint cases keep 8 (saved at 4, resumed
# over 4..7) and so does the reference.
grep '"loss"' "$TMP/ref.jsonl" | head -n 4 >"$TMP/ref4.jsonl"
common8=("${common[@]}")
grid4() { common=("${common8[@]}" --set train.steps=4); export CHECK_REF="$TMP/ref4.jsonl"; }
grid8() { common=("${common8[@]}"); unset CHECK_REF; }
grid4
covered dp2_zero1 dp2_ep2_zero1 || check dp2_zero1 2 --set parallel.dp=2 --set parallel.zero=1
covered "tp2 (the MoE replicated)" "tp2_sp and tp2_ep2" || check tp2 2 --set parallel.tp=2
check pp2_zbv_full 2 --set parallel.pp=2 --set parallel.schedule=zb-v \
  --set parallel.virtual_stages=2 --set parallel.recompute=full
# Expert parallelism over dp: each rank holds E/ep experts, the rows travel over the ep
# group and back (expert_dispatch.h), expert gradients reduce over edp and count once in
# the norm. ep 4 over dp 4 (two experts a rank, no edp partner) trains in the checkpoint
# cases' resumes below; ep 2 over dp 4 with ZeRO-3: edp pairs, each bucket sharded over
# its own group.
# Under the sanitizers (4 ranks on 2 cores) the 4-rank cases are the
# release build's: ep 2 over dp 2 runs the same exchange there.
ep_max_ranks="${TS_TEST_MAX_RANKS:-1000}"
[ -n "${TS_TEST_SANITIZERS:-}" ] && ep_max_ranks=2
TS_TEST_MAX_RANKS=$ep_max_ranks check dp4_ep2_zero3 4 --set parallel.dp=4 --set parallel.ep=2 \
  --set parallel.zero=3
# Expert tensor parallelism: each rank an F/2 slice of its experts, the etp pair's rows
# gathered and the partial outputs (and input gradients) summed back (expert_tp.h).
# etp 2 over dp 2 (every expert on both ranks, halved) is a checkpoint case below
# (ep_ckpt_case: the same check, saving); pp 2 x dp 2 with etp 2 (each stage's own etp
# pairs) under zb-v and full recompute; etp 2 x ep 2 over cp 2 x dp 2 below (the ep
# exchange first, then the etp gather of the received rows).
TS_TEST_MAX_RANKS=$ep_max_ranks check pp2_dp2_etp2_zbv 4 --set parallel.pp=2 --set parallel.dp=2 \
  --set parallel.etp=2 --set parallel.schedule=zb-v --set parallel.virtual_stages=2 \
  --set parallel.recompute=full
# blocking_twin NAME NP SETS...: NAME's run (SETS on NP ranks, the ep exchange overlapped:
# parallel.ep_overlap's default) again with the blocking exchange; every step's loss and
# gradient norm bit for bit the same (the overlap moves no sum: tensor/expert_dispatch.h).
blocking_twin() {
  local name="$1" np="$2"; shift 2
  if [ "$np" -gt "$ep_max_ranks" ]; then
    skip_case "$name's blocking twin on $np ranks (the release build runs it)"; return 0
  fi
  [ -f "$TMP/$name.jsonl" ] || { fail "$name's blocking twin: $name did not run"; return 0; }
  if run_np "$np" "${common[@]}" --set parallel.ep_overlap=false \
       --set "log.metrics=\"$TMP/${name}_blocking.jsonl\"" "$@"; then
    if cmp -s <(losses "$TMP/$name.jsonl"; norms "$TMP/$name.jsonl") \
              <(losses "$TMP/${name}_blocking.jsonl"; norms "$TMP/${name}_blocking.jsonl") &&
       [ -n "$(losses "$TMP/$name.jsonl")" ]; then pass
    else fail "$name: the overlapped ep exchange is not bit for bit the blocking one"; fi
  else fail "run ${name}_blocking: $*"; sed 's/^/    /' "$TMP/err" >&2; fi
}
# a2a_trace_check NAME TRACE: NAME's run (its stderr still in $TMP/err, log.progress on)
# traced its ep exchanges ("F dispatch L1" ... on the communication track, a2a), reported
# the share of them hidden behind compute in [0, 1] (the trace's, on stderr, and every
# step's a2a_hidden metric), and its blocked parts lie inside them.
a2a_trace_check() {
  local name="$1" trace="$2" out
  if out=$(python3 - "$trace" "$TMP/$name.jsonl" "$TMP/err" 2>&1 <<'PY'
import json, re, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
a2a = [e for e in ev if e.get("cat") == "a2a"]
names = {re.sub(r"L\d+$", "L", e["name"]) for e in a2a}
if names != {"F dispatch L", "F combine L", "B dispatch L", "B combine L"} or \
        any(e["pid"] != 1 or e["args"]["mb"] < 0 for e in a2a):
    sys.exit("a2a spans: %d, names %s" % (len(a2a), sorted(names)))
m = re.search(r"ep all-to-all [0-9.]+ ms over all ranks, ([0-9.]+)% of it hidden",
              open(sys.argv[3]).read())
if not m or not 0 <= float(m.group(1)) <= 100:
    sys.exit("no trace share of the all-to-all hidden on stderr (or out of range)")
import bisect
by_rank = {}
for e in a2a:
    by_rank.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
for v in by_rank.values():
    v.sort()
for w in (e for e in ev if e.get("cat") == "a2await"):
    v = by_rank.get(w["tid"], [])
    i = bisect.bisect_right(v, (w["ts"] + 1, float("inf")))  # the spans started by then
    if not any(w["ts"] + w["dur"] <= b + 1 for _, b in v[max(0, i - 4):i]):
        sys.exit("a blocked part outside its exchange: %s" % w)
shares = [json.loads(l)["a2a_hidden"] for l in open(sys.argv[2]) if '"a2a_hidden"' in l]
steps = sum(1 for l in open(sys.argv[2]) if '"loss"' in l)  # one share a step
if not shares or len(shares) != steps or not all(0 <= x <= 1 for x in shares):
    sys.exit("a2a_hidden metrics %s" % shares)
PY
  ); then pass; else fail "$name's a2a trace: $out"; fi
}

# Expert parallelism over tp ranks (etp 1): every tp rank routes all rows, sends its half
# to the experts, the halves are all-gathered (moe.c); run twice, bit-identical. Traced:
# its all-to-all spans and the share hidden (a2a_trace_check); under the sanitizers
# its blocking twin (the release build's are the 4-rank grids' below).
check tp2_ep2 2 --set parallel.tp=2 --set parallel.ep=2 --set log.progress=true \
  --set "log.trace=\"$TMP/tp2_ep2_trace.json\""
a2a_trace_check tp2_ep2 "$TMP/tp2_ep2_trace.json"
[ "${TS_TEST_SANITIZERS:-0}" = 1 ] && blocking_twin tp2_ep2 2 --set parallel.tp=2 --set parallel.ep=2
# The rerun (untraced) trains 4 steps, tp2_ep2's first 4 bit for bit: a rerun's bits part
# at the first step that differs (docs/CI.md).
release_only "tp 2 x ep 2 run twice, bit for bit" ||
  if run_np 2 "${common[@]}" --set parallel.tp=2 --set parallel.ep=2 --set train.steps=4 \
       --set "log.metrics=\"$TMP/tp2_ep2_again.jsonl\""; then
    if [ "$(losses "$TMP/tp2_ep2_again.jsonl" | wc -l)" = 4 ] &&
       cmp -s <(losses "$TMP/tp2_ep2.jsonl" | head -n 4; norms "$TMP/tp2_ep2.jsonl" | head -n 4) \
              <(losses "$TMP/tp2_ep2_again.jsonl"; norms "$TMP/tp2_ep2_again.jsonl"); then pass
    else fail "tp 2 x ep 2 run twice is not bit-identical"; fi
  else fail "rerun tp2_ep2"; sed 's/^/    /' "$TMP/err" >&2; fi
# Pipeline stages with their own expert grids (ep 2 over each stage's dp 2): the ep peers
# of a stage run the same schedule, so they meet in the same dispatches, with zb-v's V
# placement and full recompute's replays and dualpipe-v's two chunks a rank (1f1b: the
# checkpoint case pp2_dp2_ep2 below).
TS_TEST_MAX_RANKS=$ep_max_ranks check pp2_dp2_ep2_zbv_full 4 --set parallel.pp=2 \
  --set parallel.dp=2 --set parallel.ep=2 --set parallel.schedule=zb-v \
  --set parallel.virtual_stages=2 --set parallel.recompute=full
TS_TEST_MAX_RANKS=$ep_max_ranks check pp2_dp2_ep2_dualpipev 4 --set parallel.pp=2 \
  --set parallel.dp=2 --set parallel.ep=2 --set parallel.schedule=dualpipe-v \
  --set parallel.virtual_stages=2 --set parallel.micro_batch=2
# Overlap changes no bits: the overlapped runs (zb-v, dualpipe-v here, 1f1b and ep 4 with
# the checkpoints below) against their blocking twins.
blocking_twin pp2_dp2_ep2_zbv_full 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2 \
  --set parallel.schedule=zb-v --set parallel.virtual_stages=2 --set parallel.recompute=full
blocking_twin pp2_dp2_ep2_dualpipev 4 --set parallel.pp=2 --set parallel.dp=2 \
  --set parallel.ep=2 --set parallel.schedule=dualpipe-v --set parallel.virtual_stages=2 \
  --set parallel.micro_batch=2
# dualpipe-v's overlapped F/B pairs run as two threads with one baton under ep (engine.c,
# pipeline/pair.h): the case above ran them so (eager transfers), and equals its blocking
# twin, whose pairs run one after the other. Paired with grouped transfers (the group
# between a pair's actions issued after the first's post-work) it is the same bit for bit,
# and the trace shows a body's segments with its partner's in between (the pairs did
# interleave). (TS_PP_PAIRS=sequential runs them one after the other with the overlap on:
# checked by hand, bit for bit, not in CI's time.)
dualpipev=(--set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2
           --set parallel.schedule=dualpipe-v --set parallel.virtual_stages=2
           --set parallel.micro_batch=2)
for how in grouped; do
  release_only "dualpipe-v's pairs $how vs paired, bit for bit" && continue
  if [ $how = sequential ]; then export TS_PP_PAIRS=sequential; else export TS_PP_EXCHANGE=grouped; fi
  if run_np 4 "${common[@]}" "${dualpipev[@]}" --set "log.metrics=\"$TMP/dualpipev_$how.jsonl\"" \
       --set "log.trace=\"$TMP/dualpipev_$how.json\""; then
    if cmp -s <(losses "$TMP/pp2_dp2_ep2_dualpipev.jsonl"; norms "$TMP/pp2_dp2_ep2_dualpipev.jsonl") \
              <(losses "$TMP/dualpipev_$how.jsonl"; norms "$TMP/dualpipev_$how.jsonl"); then pass
    else fail "dualpipe-v pp 2 x dp 2 x ep 2: pairs $how differ from paired"; fi
  else fail "dualpipe-v pairs $how"; sed 's/^/    /' "$TMP/err" >&2; fi
  unset TS_PP_PAIRS TS_PP_EXCHANGE
done
release_only "dualpipe-v's pairs interleave (trace)" ||
  if out=$(python3 - "$TMP/dualpipev_grouped.json" 2>&1 <<'PY'
import json, sys
def pair_spans(path):
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "pair"]
    return sorted(ev, key=lambda e: (e["tid"], e["ts"]))
paired = pair_spans(sys.argv[1])
# An action split around its partner's segment: X, Y, X on one rank.
key = lambda e: (e["tid"], e["name"], e["args"]["chunk"])
split = sum(1 for a, b, c in zip(paired, paired[1:], paired[2:])
            if key(a) == key(c) and key(b) != key(a) and a["tid"] == b["tid"])
if split == 0:
    sys.exit("no action split around its partner's segment (%d pair spans)" % len(paired))
PY
); then pass; else fail "dualpipe-v pairs in the trace: $out"; fi

grid8
# Checkpoints under expert parallelism: each expert is stored whole under its global id,
# written once by its own ep rank's edp group, weights and AdamW moments (ZeRO shards
# them over edp), and read back by whichever ranks hold it on the loading grid.
# ep_ckpt_case NAME NP SETS...: NAME's grid (SETS, NP ranks) trains the 8 steps against
# one rank (check), saving after 4 and 8; its step 4 (the bias moved by then, kept in
# state.json) resumes on one rank and on dp 4 x ep 4 into the one-rank run's steps 4..7
# (1e-4), and on its own grid bit for bit: the same metrics and, at step 8, the same
# files (same=1), and on dp 4 x ep 4 (ep4=1).
grep '"step":[4-7],' "$TMP/ref.jsonl" > "$TMP/ref_tail.jsonl"
# resume NAME NP FROM TOL SETS...: "${common[@]}" SETS on NP ranks from FROM's step 4,
# saving at the end to $TMP/ck_NAME; steps 4..7 against one rank's within TOL, or with
# TOL = 0 against FROM's own run bit for bit (metrics and step 8's files).
resume() {
  local name="$1" np="$2" from="$3" tol="$4"; shift 4
  if [ "$np" -gt "$ep_max_ranks" ]; then
    skip_case "resume $name on $np ranks (the release build runs it)"; return 0
  fi
  if run_np "$np" "${common[@]}" --set "checkpoint.load=\"$TMP/ck_$from/step_00000004\"" \
       --set "checkpoint.dir=\"$TMP/ck_$name\"" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
    pass
  else
    fail "resume $name: $*"; sed 's/^/    /' "$TMP/err" >&2; return 0
  fi
  if [ "$tol" = 0 ]; then
    grep '"step":[4-7],' "$TMP/$from.jsonl" > "$TMP/${from}_tail.jsonl"
    compare_runs "resumed $name vs uninterrupted (bit for bit)" "$TMP/$name.jsonl" \
      "$TMP/${from}_tail.jsonl" 0 0
    same_ckpt "$TMP/ck_$from/step_00000008" "$TMP/ck_$name/step_00000008" "resumed $name at step 8"
  else
    compare_runs "resumed $name vs one rank" "$TMP/$name.jsonl" "$TMP/ref_tail.jsonl" "$tol" "$tol"
  fi
}
ep_ckpt_case() {
  local name="$1" np="$2"; shift 2
  if [ "$np" -gt "$ep_max_ranks" ]; then
    skip_case "checkpoints of $name on $np ranks (the release build runs them)"; return 0
  fi
  check "$name" "$np" "$@" --set "checkpoint.dir=\"$TMP/ck_$name\"" --set checkpoint.every=4
  resume "${name}_on1" 1 "$name" 1e-4
  # (The bit-for-bit resume is a property of the numbers: the release build's.)
  if [ "$same" = 1 ] && ! release_only "$name resumed on its own grid, bit for bit"; then
    resume "${name}_same" "$np" "$name" 0 "$@"
  fi
  if [ "$ep4" = 1 ]; then
    resume "${name}_dp4_ep4" 4 "$name" 1e-4 --set parallel.dp=4 --set parallel.ep=4
  fi
}
# dp 2 x ep 2 with ZeRO-1, its validation uneven (9 windows: 4 for one replica, 5 for the
# other) run as many batches on each, the extra one padding, so the ep group meets in
# every dispatch (engine.c); resumed on one rank and on its own grid bit for bit.
# With log.moe_every = 4 its tokens per expert come after steps 3 and 7, the reference's
# (0: the default) after step 7 alone: each MoE block's counts over the global batch, the
# same on both grids, each block's summing to its tokens x top_k.
same=1 ep4=0 ep_ckpt_case dp2_ep2_zero1 2 --set parallel.dp=2 --set parallel.ep=2 \
  --set parallel.zero=1 --set "data.val=\"$TMP/train.bin\"" --set data.eval_every=4 \
  --set data.val_windows=9 --set log.moe_every=4
if out=$(python3 - "$TMP/ref.jsonl" "$TMP/dp2_ep2_zero1.jsonl" 2>&1 <<'PY'
import json, sys
def lines(path):
    return [d for d in map(json.loads, open(path)) if "moe_tokens" in d]
ref, ep = lines(sys.argv[1]), lines(sys.argv[2])
steps = ([d["step"] for d in ref], [d["step"] for d in ep])
if steps != ([7], [3, 7]):
    sys.exit("moe_tokens after steps %s (one rank) and %s (log.moe_every = 4)" % steps)
for d in ref + ep:
    if d["moe_layers"] != [1, 2, 3] or any(len(r) != 8 or sum(r) != 16 * 64 * 2
                                            for r in d["moe_tokens"]):
        sys.exit("step %d: blocks %s, counts %s" % (d["step"], d["moe_layers"], d["moe_tokens"]))
if ref[0] != ep[1]:
    sys.exit("step 7's counts differ: %s (one rank), %s (ep 2)" % (ref[0], ep[1]))
PY
); then pass; else fail "log.moe_every: $out"; fi
# pp 2 x dp 2 x ep 2 with 1f1b (each stage its own expert grid and writers), resumed on
# one rank and on dp 4 x ep 4.
same=0 ep4=1 ep_ckpt_case pp2_dp2_ep2 4 --set parallel.pp=2 --set parallel.dp=2 \
  --set parallel.ep=2 --set parallel.schedule=1f1b
blocking_twin pp2_dp2_ep2 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2 \
  --set parallel.schedule=1f1b
# ep 4 (its resume on dp 4 x ep 4, 4 steps) against its blocking twin.
blocking_twin pp2_dp2_ep2_dp4_ep4 4 --set parallel.dp=4 --set parallel.ep=4 \
  --set "checkpoint.load=\"$TMP/ck_pp2_dp2_ep2/step_00000004\""
# Under etp each expert's F/2 slices are written by their own ranks, tiled whole (the
# reshards below read and write slices on 4 ranks).
# Its validation is uneven too (9 windows over the 2 replicas): the etp gather is as
# collective as the ep exchange.
same=0 ep4=0 ep_ckpt_case dp2_etp2 2 --set parallel.dp=2 --set parallel.etp=2 \
  --set "data.val=\"$TMP/train.bin\"" --set data.eval_every=4 --set data.val_windows=9
# etp 2 over the tp ranks (no sp): each tp rank brings its half of the replicated rows
# into the etp gather and runs its F/2 slice on both halves, the halves' outputs
# all-gathered over tp (moe.c); each slice written by its own tp rank, resumed on one.
covered "tp2_etp2 and its checkpoint" \
  "tp2_ep2 (the shares), dp2_etp2 (the slices' exchange and checkpoint), tp2_sp_etp2" ||
  same=0 ep4=0 ep_ckpt_case tp2_etp2 2 --set parallel.tp=2 --set parallel.etp=2

# Resharded bytes: dp2_ep2_zero1's step 4 loaded on dp 4 x ep 2 (edp pairs: ZeRO-0 splits
# each expert's writing over the pair, ZeRO-3 shards its weights and moments there), on
# dp 4 x etp 2 x ep 2 (each rank reads, then writes, its F/2 slice of its experts) and
# on dp 4 x etp 2 with ZeRO-3 (each slice's weights and moments sharded over its edp
# pair) and saved at once (nothing trained) is the same files byte for byte.
ck="$TMP/ck_dp2_ep2_zero1/step_00000004"
for grid in "ep=2 zero=0" "ep=2 zero=3" "ep=2 etp=2 zero=2" "etp=2 zero=3"; do
  [ 4 -gt "$ep_max_ranks" ] && { skip_case "reshard to dp4 $grid (release)"; continue; }
  sets=(); for kv in $grid; do sets+=(--set "parallel.$kv"); done
  if run_np 4 "${common[@]}" --set train.steps=4 --set parallel.dp=4 "${sets[@]}" \
       --set "checkpoint.load=\"$ck\"" \
       --set "checkpoint.dir=\"$TMP/ck_r\"" --set 'log.metrics=""'; then
    pass; same_ckpt "$ck" "$TMP/ck_r/step_00000004" "dp2 ep2 zero1 -> dp4 $grid"
  else
    fail "reshard to dp4 $grid"; sed 's/^/    /' "$TMP/err" >&2
  fi
  rm -rf "$TMP/ck_r"
done

# model.init under ep: the saved step directory (a save_pretrained directory of every
# expert) read by dp 2 x ep 2, each rank its own experts, and saved at once: the same
# weights byte for byte.
# The same on etp 2, each rank its F/2 slice of every expert.
for grid in ep etp; do
  rm -rf "$TMP/ck_init"
  if run_np 2 "${common[@]}" --set train.steps=0 --set parallel.dp=2 --set parallel.$grid=2 \
       --set "model.init=\"$ck\"" --set "checkpoint.dir=\"$TMP/ck_init\"" --set 'log.metrics=""'; then
    pass; same_files "$ck" "$TMP/ck_init/step_00000000" "model.init on $grid 2" model.safetensors
  else
    fail "model.init on dp 2 x $grid 2"; sed 's/^/    /' "$TMP/err" >&2
  fi
done

# split_check NAME NP SETS...: check, and the step's moe_aux_loss and moe_z_loss metrics
# (sums of every rank's share) within 1e-4 of the one rank's too.
split_check() {
  local name="$1"
  check "$@"
  [ -f "$TMP/$name.jsonl" ] || return 0
  local out ref="${CHECK_REF:-$TMP/ref.jsonl}" want
  want=$(grep -c '"moe_aux_loss"' "$ref") # the reference's steps: every one compared
  if out=$(paste <(grep -o '"moe_aux_loss":[^,]*,"moe_z_loss":[^,]*' "$TMP/$name.jsonl") \
                 <(grep -o '"moe_aux_loss":[^,]*,"moe_z_loss":[^,]*' "$ref") |
           tr ':,' '  ' | awk -v want="$want" '
      function rel(x, y,   d) { d = x - y; if (d < 0) d = -d; if (y < 0) y = -y; return d / (y > 1e-30 ? y : 1e-30) }
      NF != 8 { bad = 1; next }
      { a = rel($2, $6); z = rel($4, $8); if (a > w) w = a; if (z > w) w = z; if ($6 <= 0) bad = 1; n++ }
      END { printf "%d steps: worst relative moe_aux_loss/moe_z_loss difference %.3g\n", n, w
            exit !(!bad && n == want && n > 0 && w <= 1e-4) }'); then pass
  else fail "$name's MoE loss metrics vs one rank: $out"; fi
}
# Context parallelism: each rank holds T/cp positions of each sequence; the balance loss
# sums each sequence's expert counts over the cp ranks and each rank adds its positions'
# share of the loss (moe.c balance_split). 4 steps (grid4 above).
grid4
covered cp2 cp2_ep2 || split_check cp2 2 --set parallel.cp=2
# ep 2 over the cp ranks: each sends its own positions' rows, as a dp rank would.
split_check cp2_ep2 2 --set parallel.cp=2 --set parallel.ep=2
# etp 2 x ep 2 over cp 2 x dp 2: the ep exchange, then the etp gather of the received rows.
TS_TEST_MAX_RANKS=$ep_max_ranks split_check cp2_dp2_ep2_etp2 4 \
  --set parallel.cp=2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.etp=2
# Sequence parallelism: each tp rank routes its own rows, nothing gathered; the router's,
# the shared expert's and (ep 1) the experts' gradients summed over tp, the counts and
# loss sums every tp rank's (moe.c), the balance loss's sequence counts summed over tp
# (a rank's rows may cut a sequence); with ep 2 over the tp ranks each sends its rows to
# the experts' rank (one sequence a micro-batch: each rank holds half of it).
split_check tp2_sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
split_check tp2_sp_ep2_mb1 2 --set parallel.tp=2 --set parallel.ep=2 --set parallel.micro_batch=1 \
  --set parallel.sequence_parallel=true
# etp 2 over the tp ranks with sp: each tp rank's own rows into the etp gather; the
# experts' slices whole over the pair (not summed over tp as with etp 1).
split_check tp2_sp_etp2 2 --set parallel.tp=2 --set parallel.etp=2 \
  --set parallel.sequence_parallel=true
grid8

# bf16 (train.precision = "bf16": the router in fp32 from the widened rows, the experts,
# the dispatch and the combine on bf16 rows; moe.c), with test_bf16_train.sh's tolerances:
# the one-rank run tracks fp32 within 2% (loss and gradient norm) and differs from it
# somewhere; a rerun is bit-identical; ep 2 over dp 2 (bf16 rows exchanged) and pp 2 with
# zb-v and full recompute (the widened rows saved again by the replayed forward) give the
# one-rank bf16 losses and norms within 1e-2 relative. Measured when written (on a CPU
# without BF16 instructions, through a local reference bf16 GEMM in place of oneDNN's):
# bf16 vs fp32 5e-5 (loss) and 1e-3 (norm), ep 2 over dp 2 2e-5 and 2e-4, pp 2 the same
# bits. Skipped without BF16 instructions (tessera refuses bf16 there, as
# test_bf16_train.sh checks).
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  BF16=(--set 'train.precision="bf16"')
  bf16_run() { # NAME NP SETS...: the run, metrics in $TMP/NAME.jsonl
    local name="$1" np="$2"; shift 2
    if run_np "$np" "${common[@]}" "${BF16[@]}" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
      pass; return 0
    fi
    fail "run $name (bf16, $np ranks): $*"; sed 's/^/    /' "$TMP/err" >&2; return 1
  }
  if bf16_run bf16 1; then
    compare_runs "bf16 vs fp32, one rank" "$TMP/bf16.jsonl" "$TMP/ref.jsonl" 0.02 0.02
    if cmp -s <(losses "$TMP/bf16.jsonl") <(losses "$TMP/ref.jsonl"); then
      fail "bf16 gave the fp32 losses bit for bit: train.precision = \"bf16\" changed nothing"
    else pass; fi
    bf16_run bf16_again 1 &&
      if cmp -s <(losses "$TMP/bf16_again.jsonl") <(losses "$TMP/bf16.jsonl") &&
         cmp -s <(norms "$TMP/bf16_again.jsonl") <(norms "$TMP/bf16.jsonl"); then pass
      else fail "two one-rank bf16 MoE runs differ"; fi
    bf16_run bf16_dp2_ep2 2 --set parallel.dp=2 --set parallel.ep=2 &&
      compare_runs "bf16 ep 2 over dp 2 vs one rank" "$TMP/bf16_dp2_ep2.jsonl" "$TMP/bf16.jsonl" \
        1e-2 1e-2
    bf16_run bf16_pp2_zbv_full 2 --set parallel.pp=2 --set parallel.schedule=zb-v \
      --set parallel.virtual_stages=2 --set parallel.recompute=full &&
      compare_runs "bf16 pp 2 zb-v full recompute vs one rank" "$TMP/bf16_pp2_zbv_full.jsonl" \
        "$TMP/bf16.jsonl" 1e-2 1e-2
  fi
else
  skip_case "bf16: this CPU has neither AVX512_BF16 nor AMX-BF16 (tessera refuses bf16 here)"
fi

# Muon (train.optimizer = "muon", data/muon_dist.h) with the MoE: the router, the shared
# expert's and every routed expert's matrices are Muon's, each owned by one member of the
# group reducing it: dp 2 with ZeRO-1 (the experts' group is the replica group), etp 2
# over dp 2 with ZeRO-3 (each expert's etp slices gathered into its logical matrix for
# the iteration, its masters compact) and (release) ep 2 over dp 4 with ZeRO-2 (experts
# owned over their edp pair) give the one-rank losses and norms within 1e-4 (4 steps, no
# warm-up, lr 0.02); bf16 on ep 2 over dp 2 against bf16's one rank within 1e-2 (where
# the CPU has BF16 instructions). Measured at 6e-8 (loss) and 4.4e-7 (norm) when written,
# also ep 2 over dp 2 with ZeRO-0 and 1, ep 2 over tp 2, etp 2 over tp 2, etp 2 x ep 2
# over dp 4 with ZeRO-3.
muon=(--set 'train.optimizer="muon"' --set train.steps=4 --set train.warmup=0 --set train.lr=0.02)
CHECK_REF="$TMP/muon_ref.jsonl"
check muon_ref 1 "${muon[@]}"
covered muon_dp2_zero1 muon_dp2_etp2_zero3 ||
  check muon_dp2_zero1 2 "${muon[@]}" --set parallel.dp=2 --set parallel.zero=1
check muon_dp2_etp2_zero3 2 "${muon[@]}" --set parallel.dp=2 --set parallel.etp=2 --set parallel.zero=3
if [ 4 -gt "$ep_max_ranks" ]; then
  skip_case "Muon on ep 2 over dp 4 with ZeRO-2 (4 ranks: the release build runs it)"
else
  check muon_dp4_ep2_zero2 4 "${muon[@]}" --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=2 \
    --set parallel.micro_batch=2
fi
unset CHECK_REF
if [ -n "${BF16+set}" ]; then
  bf16_run muon_bf16 1 "${muon[@]}" &&
    bf16_run muon_bf16_dp2_ep2 2 "${muon[@]}" --set parallel.dp=2 --set parallel.ep=2 &&
    compare_runs "Muon bf16 ep 2 over dp 2 vs one rank" "$TMP/muon_bf16_dp2_ep2.jsonl" \
      "$TMP/muon_bf16.jsonl" 1e-2 1e-2
fi

# Upcycling (model.init_upcycle, checkpoint/upcycle.h): llama-tiny trained 2 steps (its
# MLPs no longer the init) and saved; a Mixtral-shaped MoE of its shape (4 experts of its
# MLP's width, top 2 renormalised: each token's weights sum to one) started from it, each
# expert a copy of the dense MLP, the router drawn by index. Its first loss is the dense
# model's on the same batch (the dense weights through model.init, one step) within 1e-5
# relative, on one rank and on ep 2 over dp 2 (each rank reads its own experts): not bit
# for bit, since the combine rounds k equal outputs times weights that sum to one. Then
# it trains: each grid's loss at its last step (3) is below its first, ep 2 within 1e-4 of one
# rank (8 sequences a step, CI's time). Under the sanitizers one rank alone, 2 steps
# (each ep and etp rank's reading is test_safetensors', the exchange the cases above).
up=(train "$SRC/configs/llama-tiny.cfg" --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""'
    --set train.threads=1 --set log.progress=false --set train.global_batch=8 --set train.warmup=2)
up_steps=4
[ "${TS_TEST_SANITIZERS:-0}" = 1 ] && up_steps=2
up_moe=(--set model.moe_experts=4 --set model.moe_top_k=2 --set model.moe_ffn_hidden=384
        --set model.init_upcycle=true --set "model.init=\"$TMP/ck_dense/step_00000002\""
        --set train.steps=$up_steps)
# upcycled NAME: the first loss of $TMP/NAME.jsonl is the dense one's within 1e-5, and its
# last below its first.
upcycled() {
  local out
  if out=$(paste <(losses "$TMP/dense0.jsonl") <(losses "$TMP/$1.jsonl" | sed -n "1p;${up_steps}p" | paste -sd' ') |
           awk -v n="$up_steps" '{ d = $2 - $1; if (d < 0) d = -d
                  printf "first loss %s vs the dense %s (relative %.2g), at step %d %s\n", $2, $1, d / $1, n - 1, $3
                  exit !(NF == 3 && d <= 1e-5 * $1 && $3 < $2) }'); then pass; echo "upcycled $1: $out"
  else fail "upcycled $1: $out"; fi
}
if run_np 1 "${up[@]}" --set train.steps=2 --set "checkpoint.dir=\"$TMP/ck_dense\"" \
     --set 'log.metrics=""' &&
   run_np 1 "${up[@]}" --set train.steps=1 --set "model.init=\"$TMP/ck_dense/step_00000002\"" \
     --set "log.metrics=\"$TMP/dense0.jsonl\""; then
  pass
  # up_run NAME NP SETS...: the upcycled MoE on NP ranks, metrics in $TMP/NAME.jsonl.
  up_run() {
    local name="$1" np="$2"; shift 2
    if run_np "$np" "${up[@]}" "${up_moe[@]}" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
      pass; upcycled "$name"
    else fail "run $name: $*"; sed 's/^/    /' "$TMP/err" >&2; fi
  }
  up_run up_one 1
  covered "upcycled on ep 2 over dp 2" "one rank, test_safetensors' ep ranks, dp2_ep2_zero1" ||
    up_run up_dp2_ep2 2 --set parallel.dp=2 --set parallel.ep=2
  [ -f "$TMP/up_one.jsonl" ] && [ -f "$TMP/up_dp2_ep2.jsonl" ] &&
    compare_runs "upcycled ep 2 over dp 2 vs one rank" "$TMP/up_dp2_ep2.jsonl" "$TMP/up_one.jsonl" \
      1e-4 1e-4
else
  fail "the dense model to upcycle"; sed 's/^/    /' "$TMP/err" >&2
fi
# Capacity (model.moe_capacity): each expert takes at most ceil(T*K/E * factor) of each
# sequence's assignments, the largest-weight ones (ties to the earlier position), decided
# per whole sequence before dispatch (moe.c capacity_keep). Factor 2 drops 17-19% of
# this model's assignments in each of the 4 steps run here (its experts' loads are 3x
# uneven); the grids give the one-rank losses within 1e-4 and the same moe_dropped each
# step (each sequence's drops do not depend on the grid): cp 2 x ep 2 (each sequence's
# positions gathered over cp), tp 2 with sp x ep 2 over one-sequence micro-batches (each
# tp rank half a sequence, gathered over tp), tp 2 x ep 2 (the tp shares' kept counts
# summed over tp) and, release only, pp 2 x dp 2 x ep 2 with zb-v and full recompute (a
# replayed forward decides again, and counts nothing). Factor 1000 keeps every
# assignment: the dropless run's 4 first steps bit for bit (warm-up: the same rates).
# Under the sanitizers the cp case (the gather, the ep exchange of a kept set, the
# sentinel-aware kernels) and the one-rank run stand for the others (CI time).
cap=(--set model.moe_capacity=2 --set train.steps=4)
if run_np 1 "${common[@]}" "${cap[@]}" --set "log.metrics=\"$TMP/cap.jsonl\""; then
  pass
  if grep -o '"moe_dropped":[^,}]*' "$TMP/cap.jsonl" | cut -d: -f2 |
       awk '{ n++; if ($1 < 0.1 || $1 > 0.5) bad = 1 } END { exit !(n == 4 && !bad) }'; then pass
  else fail "capacity 2 on one rank: moe_dropped not in [0.1, 0.5] each step:" \
         "$(grep -o '"moe_dropped":[^,}]*' "$TMP/cap.jsonl" | tr '\n' ' ')"; fi
else fail "run capacity 2 on one rank"; sed 's/^/    /' "$TMP/err" >&2; fi
cap_check() { # NAME NP SETS...: check against cap, and the same moe_dropped every step
  local name="$1"
  CHECK_REF="$TMP/cap.jsonl" check "$@" "${cap[@]}"
  [ -f "$TMP/$name.jsonl" ] || return 0
  if cmp -s <(grep -o '"moe_dropped":[^,}]*' "$TMP/$name.jsonl") \
            <(grep -o '"moe_dropped":[^,}]*' "$TMP/cap.jsonl"); then pass
  else fail "$name: moe_dropped differs from one rank's"; fi
}
cap_check cap_cp2_ep2 2 --set parallel.cp=2 --set parallel.ep=2
covered cap_tp2_sp_ep2_mb1 "cap_cp2_ep2 (the same gather over cp), tp2_sp_ep2_mb1" ||
  cap_check cap_tp2_sp_ep2_mb1 2 --set parallel.tp=2 --set parallel.sequence_parallel=true \
    --set parallel.ep=2 --set parallel.micro_batch=1
covered cap_tp2_ep2 "cap_cp2_ep2 (a kept set's exchange), tp2_ep2 (the shares)" ||
  cap_check cap_tp2_ep2 2 --set parallel.tp=2 --set parallel.ep=2
TS_TEST_MAX_RANKS=$ep_max_ranks cap_check cap_pp2_dp2_ep2_zbv_full 4 --set parallel.pp=2 \
  --set parallel.dp=2 --set parallel.ep=2 --set parallel.schedule=zb-v \
  --set parallel.virtual_stages=2 --set parallel.recompute=full
release_only "capacity 1000 against dropless, bit for bit" ||
  if run_np 1 "${common[@]}" --set model.moe_capacity=1000 --set train.steps=4 \
       --set "log.metrics=\"$TMP/cap1000.jsonl\""; then
    if cmp -s <(losses "$TMP/cap1000.jsonl"; norms "$TMP/cap1000.jsonl") \
              <(losses "$TMP/ref.jsonl" | head -4; norms "$TMP/ref.jsonl" | head -4) &&
       [ "$(grep -c '"moe_dropped":0.000000' "$TMP/cap1000.jsonl")" = 4 ]; then pass
    else fail "capacity 1000 differs from the dropless run (or dropped some)"; fi
  else fail "run capacity 1000"; sed 's/^/    /' "$TMP/err" >&2; fi

# Multi-head latent attention (model/mla.c; DeepSeek-V3's attention) on llama-tiny
# reshaped (64 wide, 4 heads, q latent 32, k/v latent 16, heads of 16 + 8 rope channels,
# values of 16, YaRN with mscale_all_dim: cos/sin and the softmax scaled), 4 steps against
# its own one-rank run within 1e-4: tp 2 with sequence parallelism, selective recompute
# and tp_overlap's 2 sub-batches (the latent trunk replicated, its gradients summed over
# tp; k, v and the probabilities rebuilt from the latent; the work region by sub-batch), pp 2 with interleaved-zb (virtual stages and
# the zero-bubble split: MLA's weight gradients in its input pass), dp 2 with ZeRO-3, a
# rerun bit-identical; with the DeepSeek MoE (the MTP section below), ep 4
# over dp 4 (release); a checkpoint saved on pp 2 x dp 2 x tp 2 (release) reloads on one
# rank and saves the same bytes. bf16 where the CPU has it. The gradients themselves:
# tests/test_mla_grad.c (and the fixture against transformers').
saved_common=("${common[@]}")
mla=(--set model.n_layer=2 --set model.n_embd=64 --set model.n_head=4 --set model.n_kv_head=0
     --set model.ffn_hidden=128 --set model.seq_len=32 --set model.q_lora_rank=32
     --set model.kv_lora_rank=16 --set model.qk_nope_head_dim=16 --set model.qk_rope_head_dim=8
     --set model.v_head_dim=16 --set 'model.rope_type="yarn"' --set model.rope_scaling=4.0
     --set model.rope_original_context=16 --set model.rope_mscale_all_dim=1.0)
mla_steps=4 # CI's time: 4 optimizer steps on every grid
common=(train "$SRC/configs/llama-tiny.cfg" --set train.steps=$mla_steps --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false "${mla[@]}")
if run_np 1 "${common[@]}" --set "log.metrics=\"$TMP/mla_ref.jsonl\""; then pass
else fail "run mla_ref"; sed 's/^/    /' "$TMP/err" >&2; fi
export CHECK_REF="$TMP/mla_ref.jsonl"
check mla_tp2_sp_selective 2 --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set parallel.recompute=selective --set parallel.tp_overlap=2
covered mla_pp2_interleaved_zb "test_mla_grad (MLA's split backward, bit for bit)" ||
  check mla_pp2_interleaved_zb 2 --set parallel.pp=2 --set parallel.virtual_stages=2 \
    --set parallel.schedule=interleaved-zb --set parallel.micro_batch=2
covered mla_dp2_zero3 "mla_tp2_sp_selective (ZeRO-3 changes no MLA code)" ||
  check mla_dp2_zero3 2 --set parallel.dp=2 --set parallel.zero=3
# MLA under context parallelism (model/mla_cp.c: the latent [c_kv normed | k_pe rotated]
# gathered over cp and expanded through kv_b_proj on every rank, its gradient
# reduce-scattered): cp 2 with selective recompute (the expansion and the probabilities
# rebuilt from the kept latent), and in the release build (CI's time: the selective run
# goes through the same exchange and expansion) cp 2, cp 2 x tp 2 with sequence
# parallelism and tp_overlap 2 (4 ranks: each tp rank its heads of the same latent, the
# sub-batches' slices of the kept latent), and the memory estimate's activations against
# the trainer's (the kept latent in kvg's place).
check mla_cp2_selective 2 --set parallel.cp=2 --set parallel.recompute=selective
release_only "MLA cp 2, cp 2 x tp 2 and their memory estimate" || {
  check mla_cp2 2 --set parallel.cp=2
  check mla_cp2_tp2_sp 4 --set parallel.cp=2 --set parallel.tp=2 \
    --set parallel.sequence_parallel=true --set parallel.tp_overlap=2
  if "$TESSERA" plan "${common[@]:1}" --set parallel.cp=2 --json >"$TMP/plan_mla_cp2.json" 2>"$TMP/err" &&
     python3 - "$TMP" <<'PY'
import json, sys
d, bad = sys.argv[1], 0
want = json.load(open("%s/plan_mla_cp2.json" % d))["ranks"][0]["memory"]["activation_sets"] / 1048576.0
got = json.loads(open("%s/mla_cp2.jsonl" % d).read().strip().splitlines()[-1])["activation_mb"]
for r, mb in enumerate(got):
    ok = abs(mb - want) <= 0.02 * want + 0.05
    print("  mla cp2 rank %d: activation_mb %.2f, plan %.2f MiB%s" % (r, mb, want, "" if ok else "  <-- MISS"))
    bad += not ok
sys.exit(bad)
PY
  then pass; else fail "MLA cp memory: the trainer's activations against plan's (above) $(cat "$TMP/err")"; fi
}
release_only "MLA tp 2 rerun, bit for bit" ||
  if run_np 2 "${common[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true \
       --set parallel.recompute=selective --set parallel.tp_overlap=2 \
       --set "log.metrics=\"$TMP/mla_again.jsonl\""; then
    if cmp -s <(losses "$TMP/mla_again.jsonl"; norms "$TMP/mla_again.jsonl") \
              <(losses "$TMP/mla_tp2_sp_selective.jsonl"; norms "$TMP/mla_tp2_sp_selective.jsonl"); then pass
    else fail "MLA tp 2 run twice is not bit-identical"; fi
  else fail "rerun mla tp2"; sed 's/^/    /' "$TMP/err" >&2; fi
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  bf16_run mla_bf16 1 &&
    compare_runs "MLA bf16 vs fp32, one rank" "$TMP/mla_bf16.jsonl" "$TMP/mla_ref.jsonl" 0.02 0.02
  bf16_run mla_bf16_tp2_sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true &&
    compare_runs "MLA bf16 tp 2 sp vs one rank" "$TMP/mla_bf16_tp2_sp.jsonl" "$TMP/mla_bf16.jsonl" \
      1e-2 1e-2
else
  skip_case "MLA bf16: this CPU has neither AVX512_BF16 nor AMX-BF16"
fi
# The checkpoint: pp 2 x dp 2 x tp 2 (8 ranks, release), 3 steps, reloaded on one rank
# with nothing to train and saved again: the same bytes.
if [ "${TS_TEST_SANITIZERS:-0}" = 1 ] || [ 8 -gt "${TS_TEST_MAX_RANKS:-1000}" ]; then
  skip_case "MLA checkpoint 2x2x2 -> 1 (8 ranks: the release build runs it)"
elif run_np 8 "${common[@]}" --set parallel.pp=2 --set parallel.dp=2 --set parallel.tp=2 \
       --set parallel.micro_batch=2 --set parallel.zero=1 --set train.steps=3 \
       --set "checkpoint.dir=\"$TMP/mla_ck8\""; then
  pass
  if run_np 1 "${common[@]}" --set train.steps=3 --set "checkpoint.load=\"$TMP/mla_ck8/step_00000003\"" \
       --set "checkpoint.dir=\"$TMP/mla_ck1\""; then
    pass; same_ckpt "$TMP/mla_ck8/step_00000003" "$TMP/mla_ck1/step_00000003" "MLA 2x2x2 -> 1"
  else fail "MLA checkpoint reload on one rank"; sed 's/^/    /' "$TMP/err" >&2; fi
else fail "run MLA pp2 dp2 tp2 checkpoint"; sed 's/^/    /' "$TMP/err" >&2; fi
# MLA with the DeepSeek MoE on ep 4 over dp 4: the MTP section below (its model is MLA +
# DeepSeekMoE + MTP).
unset CHECK_REF
common=("${saved_common[@]}")


# Multi-token prediction with the MoE (model.mtp_layers = 2; model/mtp.c): each module's
# block is an MoE block (its block index n_layer + k - 1 is past moe_first_dense), routed,
# balanced and counted as the others (the counts' and the bias's rows after the main
# blocks'): ep 4 over dp 4 with ZeRO-1 (release; the modules' experts exchanged over ep, the depth
# losses summed over the replicas) and pp 2 (the modules and the embedding's copy on the
# last stage) give the one-rank losses, norms and depth losses within 1e-4. The model is
# DeepSeek-V3's whole shape: MLA (the section above's) + DeepSeekMoE + MTP, so the
# modules' blocks are MLA + MoE blocks (GQA modules: test_llama_grid.sh).
mtp=(--set model.mtp_layers=2 --set train.mtp_loss=0.3 --set train.steps=4
     --set model.seq_len=32 --set train.global_batch=8 --set model.qk_norm=false "${mla[@]}")
# The reference runs apart from check, which would compare it with itself.
if run_np 1 "${common[@]}" "${mtp[@]}" --set "log.metrics=\"$TMP/mtp_ref.jsonl\""; then pass
else fail "run mtp_ref"; sed 's/^/    /' "$TMP/err" >&2; fi
CHECK_REF="$TMP/mtp_ref.jsonl"
if [ 4 -gt "$ep_max_ranks" ]; then
  skip_case "MLA + MoE + MTP on ep 4 over dp 4 (4 ranks: the release build runs it)"
else
  check mtp_dp4_ep4_zero1 4 "${mtp[@]}" --set parallel.dp=4 --set parallel.ep=4 --set parallel.micro_batch=2 \
    --set parallel.zero=1 && mtp_same mtp_dp4_ep4_zero1
fi
check mtp_pp2 2 "${mtp[@]}" --set parallel.pp=2 && mtp_same mtp_pp2
unset CHECK_REF
finish
