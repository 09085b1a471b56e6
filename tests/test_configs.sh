# Every config shipped in configs/ loads and plans, and every cluster description in
# configs/clusters/ works with the planner:
# - each model config: `tessera plan CFG --cost model --json` succeeds and prints one
#   JSON object whose world is pp*dp*tp;
# - a config whose header names a cluster file and an `sbatch -N NODES` line (the
#   foundation-model configs): the file exists, NODES * its devices_per_node is the
#   config's world size, and tessera's own memory estimate of every pipeline rank fits
#   the device's memory_gb;
# - those configs fit on their cluster in the planner's prediction (`plan --cluster`),
#   and each cluster file plans the tiny config's grid search on one node (--gpus
#   devices_per_node --search).
# Usage (CTest): bash tests/test_configs.sh TESSERA_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh"

# key FILE NAME: the first number given to NAME in a libconfig file ("NAME = 8;").
key() { sed -nE "s/^[[:space:]]*$2[[:space:]]*=[[:space:]]*([0-9.eE+-]+)[[:space:]]*;.*/\1/p" "$1" | head -1; }

shopt -s nullglob
configs=("$SRC"/configs/*.cfg)
clusters=("$SRC"/configs/clusters/*.cfg)
[ ${#configs[@]} -ge 12 ] && pass || fail "expected the 12+ model configs in configs/, found ${#configs[@]}"
[ ${#clusters[@]} -ge 3 ] && pass || fail "expected cluster files in configs/clusters/, found ${#clusters[@]}"

for cfg in "${configs[@]}"; do
  name="$(basename "$cfg")"
  if ! timeout 60 "$TESSERA" plan "$cfg" --cost model --json >"$TMP/plan.json" 2>"$TMP/err"; then
    fail "$name: tessera plan --cost model failed"; sed 's/^/    /' "$TMP/err" >&2; continue
  fi
  world="$(python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))
assert p["world"] == p["pp"] * p["dp"] * p["tp"], p
print(p["world"])' "$TMP/plan.json" 2>"$TMP/err")" && pass ||
    { fail "$name: plan JSON invalid or world != pp*dp*tp"; sed 's/^/    /' "$TMP/err" >&2; continue; }

  cluster_rel="$(grep -m1 -oE 'configs/clusters/[A-Za-z0-9._-]+\.cfg' "$cfg" || true)"
  nodes="$(grep -m1 -oE 'sbatch -N [0-9]+' "$cfg" | grep -oE '[0-9]+$' || true)"
  [ -n "$cluster_rel" ] && [ -n "$nodes" ] || continue   # tiny.cfg, gpt2-124m.cfg: no stated cluster
  cluster="$SRC/$cluster_rel"
  if [ ! -f "$cluster" ]; then fail "$name names $cluster_rel, which does not exist"; continue; fi
  per_node="$(key "$cluster" devices_per_node)"
  mem_gb="$(key "$cluster" memory_gb)"
  [ "$((nodes * per_node))" -eq "$world" ] && pass ||
    fail "$name: sbatch -N $nodes x $per_node devices per node ($cluster_rel) != world $world"

  # tessera's own float32 estimate (the one `tessera train` checks), largest pipeline rank,
  # less the MPI reduction copies a CPU device's estimate counts: the GPUs reduce through
  # NCCL, which keeps none (src/pipeline/memory.h host_reductions).
  timeout 60 "$TESSERA" plan "$cfg" --cost model >"$TMP/plan.txt" 2>&1
  peak_gib="$(grep -E 'pp rank [0-9]+: [0-9.]+ [KMGT]iB' "$TMP/plan.txt" |
    awk 'function gib(v, u) { return v * ((u == "KiB") ? 1/1048576 : (u == "MiB") ? 1/1024 : (u == "TiB") ? 1024 : 1) }
         { t = gib($4, $5); c = 0
           if (match($0, /MPI reduction copies [0-9.]+ [KMGT]iB/)) {
             split(substr($0, RSTART, RLENGTH), w, " "); c = gib(w[4], w[5]) }
           if (t - c > m) m = t - c } END {printf "%.3f", m}')"
  awk -v p="$peak_gib" -v g="$mem_gb" 'BEGIN {exit !(p > 0 && p * 1073741824 <= g * 1e9)}' && pass ||
    fail "$name: memory estimate $peak_gib GiB per rank does not fit $mem_gb GB ($cluster_rel)"

  if timeout 60 "$TESSERA" plan "$cfg" --cluster "$cluster" --json >"$TMP/pred.json" 2>"$TMP/err"; then
    python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); sys.exit(0 if p["fits"] else 1)' \
      "$TMP/pred.json" && pass || fail "$name: does not fit on $cluster_rel in the planner's prediction"
  else
    fail "$name: tessera plan --cluster $cluster_rel failed"; sed 's/^/    /' "$TMP/err" >&2
  fi
done

for cluster in "${clusters[@]}"; do
  name="$(basename "$cluster")"
  per_node="$(key "$cluster" devices_per_node)"
  if timeout 60 "$TESSERA" plan "$SRC/configs/tiny.cfg" --cluster "$cluster" --gpus "$per_node" \
       --search --json >"$TMP/search.json" 2>"$TMP/err"; then
    python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); assert s["best"]["world"] == int(sys.argv[2])' \
      "$TMP/search.json" "$per_node" && pass || fail "$name: search JSON has no best grid of $per_node devices"
  else
    fail "$name: tessera plan configs/tiny.cfg --cluster $name --gpus $per_node --search failed"
    sed 's/^/    /' "$TMP/err" >&2
  fi
done

finish
