# The shell scripts' own hazards, as a checked fact. Every script of tests/, scripts/,
# bench/ and .ci/ runs under pipefail, where `producer | grep -q PATTERN` is a race:
# grep -q exits at its first match, the producer can die of SIGPIPE writing the rest,
# and the pipeline fails although the line was there. It did in CI: `ldd | grep -q
# libasan` took an ASan build for a release one (test_errors_resources then ran under
# ulimit -v and ASan aborted), and a /proc environ lookup missed a rank under load.
# The reader must read everything: lib.sh's grep_q, or `grep ... >/dev/null`. This
# test refuses the pattern (naming file:line), after a planted case shows it would.
source "$(dirname "$0")/lib.sh"

# racy_greps ROOT: "path:line: text" for every `| grep -q` (any flags with q) at a pipe
# (not `||`) in ROOT's scripts; comment lines are skipped, and so is this file (its
# planted case is such a line).
racy_greps() {
  local root="$1"
  (cd "$root" && find tests scripts bench .ci -type f \( -name '*.sh' -o -path '.ci/*' \) 2>/dev/null |
    grep -v '^tests/test_test_scripts.sh$' | LC_ALL=C sort | while IFS= read -r f; do
      awk -v f="$f" '
        /^[ \t]*#/ { next }
        /(^|[^|])\|[ \t]*grep[ \t]+(-[A-Za-z]*q|--quiet|--silent)/ { printf "%s:%d: %s\n", f, FNR, $0 }
      ' "$f"
    done)
}

# Planted: a pipe into grep -q and into grep -qx is found; `||`, a file and grep_q are not.
mkdir -p "$TMP/fake/tests"
cat > "$TMP/fake/tests/test_fake.sh" <<'SH'
ldd x | grep -q libasan && echo a
tr '\0' '\n' < f |grep -qx y
false || grep -q z file
# a comment: ldd | grep -q
ldd x | grep_q libasan
SH
racy_greps "$TMP/fake" > "$TMP/fake.out"
if [ "$(cut -d: -f1,2 "$TMP/fake.out" | tr '\n' ' ')" = "tests/test_fake.sh:1 tests/test_fake.sh:2 " ]; then
  pass
else
  fail "the checker on the planted file found:"; sed 's/^/    /' "$TMP/fake.out" >&2
fi

# The real tree.
racy_greps "$SRC" > "$TMP/real.out"
if [ ! -s "$TMP/real.out" ]; then pass
else
  fail "a pipe into grep -q (use lib.sh's grep_q, or grep ... >/dev/null):"
  sed 's/^/    /' "$TMP/real.out" >&2
fi

finish
