# Module boundaries (docs/ARCHITECTURE.md "Backends"): only src/comm calls MPI. Outside it,
# no MPI_ name and no <mpi.h> may appear in the code of src/ (comments do not count),
# except communicator creation in src/topology (MPI_Comm_split, MPI_Comm_split_type,
# MPI_Comm_free and the constants they take), which the issue allows there even though
# today the topology makes its groups through ts_comm_split. Every offending file:line
# is printed. The scanner is checked first on planted violations, so a broken scanner
# cannot pass silently.
source "$(dirname "$0")/lib.sh"

# scan ROOT: print "path:line: code" (path relative to ROOT) for every violation under
# ROOT/src; exit status 0 when there is none.
scan() {
  local root="$1"
  find "$root/src" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
    ! -path "$root/src/comm/*" | sort | while IFS= read -r file; do
    local rel="${file#"$root"/}" topo=0
    case "$rel" in src/topology/*) topo=1 ;; esac
    awk -v rel="$rel" -v topo="$topo" '
      # Blank out comments (keeping strings, which are code, and line numbers).
      function strip(line,    out, i, c, n) {
        out = ""; n = length(line)
        for (i = 1; i <= n; i++) {
          c = substr(line, i, 1)
          if (inblock) {
            if (c == "*" && substr(line, i + 1, 1) == "/") { inblock = 0; i++ }
            out = out " "; continue
          }
          if (instr) {
            out = out c
            if (c == "\\") { out = out substr(line, i + 1, 1); i++ }
            else if (c == quote) instr = 0
            continue
          }
          if (c == "/" && substr(line, i + 1, 1) == "*") { inblock = 1; i++; out = out "  "; continue }
          if (c == "/" && substr(line, i + 1, 1) == "/") break
          if (c == "\"" || c == "\047") { instr = 1; quote = c }
          out = out c
        }
        instr = 0 # a string never spans lines here (no backslash-newline in src)
        return out
      }
      BEGIN {
        split("MPI_Comm MPI_Comm_split MPI_Comm_split_type MPI_Comm_free MPI_COMM_NULL " \
              "MPI_COMM_WORLD MPI_UNDEFINED MPI_COMM_TYPE_SHARED MPI_INFO_NULL", a, " ")
        for (k in a) allowed[a[k]] = 1
      }
      {
        code = strip($0); bad = 0
        if (code ~ /#[ \t]*include[ \t]*[<"]mpi\.h[>"]/ && !topo) bad = 1
        rest = code
        while (!bad && match(rest, /(^|[^A-Za-z0-9_])MPI_[A-Za-z0-9_]*/)) {
          tok = substr(rest, RSTART, RLENGTH); sub(/^[^M]/, "", tok)
          if (!(topo && (tok in allowed))) bad = 1
          rest = substr(rest, RSTART + RLENGTH)
        }
        if (bad) { sub(/^[ \t]+/, "", $0); printf "%s:%d: %s\n", rel, FNR, $0; found = 1 }
      }
      END { exit found ? 1 : 0 }
    ' "$file"
  done | tee "$TMP/offenders"
  [ ! -s "$TMP/offenders" ]
}

# The scanner on a planted tree: a call in the pipeline, a header include in train, an
# MPI name only in comments (allowed), communicator creation in topology (allowed) and
# a collective in topology (not allowed).
fake="$TMP/fake"
mkdir -p "$fake/src/pipeline" "$fake/src/train" "$fake/src/topology" "$fake/src/comm"
printf 'int f(void)\n{\n    /* MPI_Barrier in a comment is fine */\n    return MPI_Barrier(w); // MPI_x\n}\n' \
  > "$fake/src/pipeline/a.c"
printf '#include <stdio.h>\n#include <mpi.h>\n' > "$fake/src/train/b.h"
printf '/* MPI_Allreduce\n   spans lines, MPI_Bcast */ int ok = 1; // MPI_Send\nconst char *s = "/* not a comment"; int x = MPI_Send;\n' \
  > "$fake/src/train/c.c"
printf '#include <mpi.h>\nvoid g(MPI_Comm w, MPI_Comm *o) { MPI_Comm_split(w, MPI_UNDEFINED, 0, o); MPI_Comm_free(o); }\nvoid h(MPI_Comm w) { MPI_Bcast(0, 0, MPI_INT, 0, w); }\n' \
  > "$fake/src/topology/t.c"
printf '#include <mpi.h>\nvoid c(void) { MPI_Barrier(MPI_COMM_WORLD); }\n' > "$fake/src/comm/mpi.c"
if scan "$fake" > "$TMP/fake.out"; then
  fail "the scanner found nothing in the planted tree"
else
  expected='src/pipeline/a.c:4: return MPI_Barrier(w); // MPI_x
src/topology/t.c:3: void h(MPI_Comm w) { MPI_Bcast(0, 0, MPI_INT, 0, w); }
src/train/b.h:2: #include <mpi.h>
src/train/c.c:3: const char *s = "/* not a comment"; int x = MPI_Send;'
  if [ "$(cat "$TMP/fake.out")" = "$expected" ]; then pass; else
    fail "the scanner's report on the planted tree differs:"
    diff <(echo "$expected") "$TMP/fake.out" | sed 's/^/    /' >&2
  fi
fi

# The real tree.
if scan "$SRC" > "$TMP/real.out"; then
  pass
else
  fail "MPI outside src/comm ($(wc -l < "$TMP/real.out") line(s)); call the ts_comm wrappers of src/comm/comm.h instead:"
  sed 's/^/    /' "$TMP/real.out" >&2
fi

finish
