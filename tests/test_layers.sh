# The include direction of src/ (docs/ARCHITECTURE.md "Include direction"), as a checked
# fact: the folder graph is derived from every `#include "folder/..."` line of src/ and
# compared with the allow-list docs/layers.txt (one line per folder, in bands; a folder
# may include only folders of lower bands). It fails on an include the list does not
# allow (naming its file:line), on an allowance no file uses (the list says exactly what
# each folder includes, so the table cannot drift either way), on a folder of src/ the
# list lacks or a listed one src/ lacks, on a list that breaks its own band rule (the
# only way to allow a cycle), and when ARCHITECTURE.md's table is not the list's lines
# verbatim. It also keeps every file of src/config and src/cli within 700 lines.
# Nothing here names a folder but those two: renaming or adding a folder is one line of
# docs/layers.txt (and the same line of the table). The checker runs first on planted
# violations, so a broken checker cannot pass silently.
source "$(dirname "$0")/lib.sh"

MAX_LINES=700
LIMITED_FOLDERS="config cli" # folders whose files stay within MAX_LINES

# edges ROOT: "folder dep path:line" for every #include "dep/..." of a file in
# ROOT/src/folder/ (any depth) with dep != folder; paths relative to ROOT.
edges() {
  local root="$1"
  find "$root/src" -mindepth 2 -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) |
    LC_ALL=C sort | while IFS= read -r file; do
    local rel="${file#"$root"/}"
    local folder="${rel#src/}"
    folder="${folder%%/*}"
    awk -v rel="$rel" -v folder="$folder" '
      match($0, /^[ \t]*#[ \t]*include[ \t]*"[A-Za-z0-9_]+\//) {
        dep = substr($0, RSTART, RLENGTH); sub(/^.*"/, "", dep); sub(/\/$/, "", dep)
        if (dep != folder) printf "%s %s %s:%d\n", folder, dep, rel, FNR
      }' "$file"
  done
}

# check ROOT LIST DOC: print every problem (one line each); exit status 0 when none.
check() {
  local root="$1" list="$2" doc="$3" bad=0
  local listname="${list#"$root"/}" docname="${doc#"$root"/}"
  edges "$root" > "$TMP/edges"
  (cd "$root/src" && find . -mindepth 1 -maxdepth 1 -type d | sed 's|^\./||' | LC_ALL=C sort) \
    > "$TMP/folders"
  # The list against the tree and against itself (awk reads the list, the folders, then
  # the edges). A rule line: FOLDER DEP... with "(notes)" dropped; "---" starts a band.
  awk -v listname="$listname" '
    FILENAME == ARGV[1] {
      line = $0
      if (line ~ /^[ \t]*#/ || line ~ /^[ \t]*$/) next
      if (line ~ /^[ \t]*-+[ \t]*$/) { band++; next }
      gsub(/\([^)]*\)/, " ", line)
      n = split(line, w, /[ \t]+/)
      folder = ""
      for (i = 1; i <= n; i++) {
        if (w[i] == "") continue
        if (folder == "") {
          folder = w[i]
          if (folder in band_of) { printf "%s:%d: %s is listed twice\n", listname, FNR, folder; bad = 1 }
          band_of[folder] = band; line_of[folder] = FNR; order[++nf] = folder
          continue
        }
        allow[folder, w[i]] = FNR; deps[folder] = deps[folder] " " w[i]
      }
      next
    }
    FILENAME == ARGV[2] { exists[$1] = 1; folders[++nd] = $1; next }
    { used[$1, $2] = 1
      if (!(($1, $2) in allow)) {
        printf "%s: %s includes %s/, which %s does not allow (%s may include:%s)\n", $3, $1, $2,
               listname, $1, ($1 in deps) ? deps[$1] : " nothing listed"
        bad = 1
      }
    }
    END {
      for (k = 1; k <= nd; k++)
        if (!((f = folders[k]) in band_of)) { printf "%s: src/%s has no line (every folder of src/ needs one)\n", listname, f; bad = 1 }
      for (k = 1; k <= nf; k++) {
        f = order[k]
        if (!(f in exists)) { printf "%s:%d: %s is listed, but src/%s does not exist\n", listname, line_of[f], f, f; bad = 1 }
        n = split(deps[f], d, " ")
        for (i = 1; i <= n; i++) {
          if (!(d[i] in band_of)) {
            printf "%s:%d: %s may include %s, which has no line\n", listname, line_of[f], f, d[i]; bad = 1
          } else if (band_of[d[i]] <= band_of[f]) {
            printf "%s:%d: %s may include %s, which is not in a lower band (an include up or sideways: a cycle waiting to happen)\n",
                   listname, line_of[f], f, d[i]; bad = 1
          }
          if (!((f, d[i]) in used)) {
            printf "%s:%d: %s may include %s, but no file of src/%s does: take it off the list and the ARCHITECTURE table\n",
                   listname, line_of[f], f, d[i], f; bad = 1
          }
        }
      }
      exit bad
    }' "$list" "$TMP/folders" "$TMP/edges" || bad=1
  # ARCHITECTURE.md's table: the fenced block after the marker line, verbatim.
  grep -v '^[[:space:]]*#' "$list" | grep -v '^[[:space:]]*$' > "$TMP/table.want"
  awk '/<!-- include table: docs\/layers.txt/ { marked = 1; next }
       marked && /^```/ { if (inside) exit; inside = 1; next }
       inside { print }' "$doc" > "$TMP/table.have"
  if [ ! -s "$TMP/table.have" ]; then
    echo "$docname: no include table after a '<!-- include table: docs/layers.txt -->' line"; bad=1
  elif ! cmp -s "$TMP/table.want" "$TMP/table.have"; then
    echo "$docname: the include table differs from $listname's lines (< the list, > the doc):"
    diff "$TMP/table.want" "$TMP/table.have" | grep '^[<>]' | sed 's/^/    /'
    bad=1
  fi
  # File lengths.
  local f
  for f in $LIMITED_FOLDERS; do
    [ -d "$root/src/$f" ] || continue
    find "$root/src/$f" -type f | LC_ALL=C sort | while IFS= read -r file; do
      local n
      n=$(wc -l < "$file")
      if [ "$n" -gt "$MAX_LINES" ]; then
        echo "${file#"$root"/}: $n lines, more than $MAX_LINES (files of src/$f stay within $MAX_LINES: split it by job)"
      fi
    done
  done > "$TMP/long"
  if [ -s "$TMP/long" ]; then cat "$TMP/long"; bad=1; fi
  return "$bad"
}

# ----------------------------------------------------------- the checker, planted --
# A small tree: top -> mid -> low, a note in parentheses, a subfolder include.
fake="$TMP/fake"
mkdir -p "$fake/src/top" "$fake/src/mid/sub" "$fake/src/low" "$fake/docs"
printf '#include "mid/m.h"\n#include "low/l.h"\n' > "$fake/src/top/t.c"
printf '#include <stdio.h>\n#include "low/sub/x.h"\n#include "mid/sub/y.h"\n' > "$fake/src/mid/sub/m.c"
printf '/* nothing */\n' > "$fake/src/low/l.h"
cat > "$fake/docs/layers.txt" <<'LIST'
# comment
  top   mid low
  ---
  mid   low (a note with words like top)
  ---
  low   (nothing)
LIST
{ echo 'Intro'; echo '<!-- include table: docs/layers.txt (checked) -->'; echo '```'
  grep -v '^#' "$fake/docs/layers.txt"; echo '```'; } > "$fake/docs/ARCHITECTURE.md"
if check "$fake" "$fake/docs/layers.txt" "$fake/docs/ARCHITECTURE.md" > "$TMP/fake.out"; then
  pass
else
  fail "the checker refused a clean planted tree:"; sed 's/^/    /' "$TMP/fake.out" >&2
fi

# plant NAME EXPECTED: run the checker on the planted tree after the caller broke it;
# it must fail and print exactly EXPECTED. The caller restores the tree afterwards.
plant() {
  local name="$1" expected="$2"
  if check "$fake" "$fake/docs/layers.txt" "$fake/docs/ARCHITECTURE.md" > "$TMP/fake.out"; then
    fail "the checker passed $name"
  elif [ "$(cat "$TMP/fake.out")" = "$expected" ]; then
    pass
  else
    fail "the checker's report on $name differs:"
    diff <(echo "$expected") "$TMP/fake.out" | sed 's/^/    /' >&2
  fi
}

# An upward include, in a nested file, after a good one.
cp "$fake/src/low/l.h" "$TMP/l.h.orig"
printf '#include "low/z.h"\n  #  include "top/t.h" /* up */\n' >> "$fake/src/low/l.h"
plant "an upward include" \
  'src/low/l.h:3: low includes top/, which docs/layers.txt does not allow (low may include: nothing listed)'
cp "$TMP/l.h.orig" "$fake/src/low/l.h"

# A sideways allowance in the list (a cycle), the doc's table following the list.
cp "$fake/docs/layers.txt" "$TMP/list.orig"; cp "$fake/docs/ARCHITECTURE.md" "$TMP/doc.orig"
sed -i 's/^  low   (nothing)$/  low   mid/' "$fake/docs/layers.txt"
sed -i 's/^  low   (nothing)$/  low   mid/' "$fake/docs/ARCHITECTURE.md"
plant "an allowance pointing up" \
  'docs/layers.txt:6: low may include mid, which is not in a lower band (an include up or sideways: a cycle waiting to happen)
docs/layers.txt:6: low may include mid, but no file of src/low does: take it off the list and the ARCHITECTURE table'
cp "$TMP/list.orig" "$fake/docs/layers.txt"; cp "$TMP/doc.orig" "$fake/docs/ARCHITECTURE.md"

# A stale allowance, a folder the list lacks, and a table that drifted.
mkdir -p "$fake/src/new"
sed -i 's/^  top   mid low$/  top   mid low new2/' "$fake/docs/layers.txt"
sed -i 's/^  mid   low (a note with words like top)$/  mid   low/' "$fake/docs/ARCHITECTURE.md"
plant "a stale list and a drifted table" \
  'docs/layers.txt: src/new has no line (every folder of src/ needs one)
docs/layers.txt:2: top may include new2, which has no line
docs/layers.txt:2: top may include new2, but no file of src/top does: take it off the list and the ARCHITECTURE table
docs/ARCHITECTURE.md: the include table differs from docs/layers.txt'"'"'s lines (< the list, > the doc):
    <   top   mid low new2
    >   top   mid low
    <   mid   low (a note with words like top)
    >   mid   low'
rmdir "$fake/src/new"; cp "$TMP/list.orig" "$fake/docs/layers.txt"; cp "$TMP/doc.orig" "$fake/docs/ARCHITECTURE.md"

# A long file in a limited folder (and one as long elsewhere, which is fine).
mkdir -p "$fake/src/config" "$fake/src/cli"
seq 701 > "$fake/src/config/big.c"; seq 700 > "$fake/src/cli/ok.c"; seq 900 > "$fake/src/low/long.c"
printf '  config  (nothing)\n  cli     (nothing)\n' >> "$fake/docs/layers.txt"
printf '  config  (nothing)\n  cli     (nothing)\n' > "$TMP/extra"
awk -v extra="$TMP/extra" '/^```/ && n++ == 1 { while ((getline l < extra) > 0) print l } { print }' \
  "$TMP/doc.orig" > "$fake/docs/ARCHITECTURE.md"
plant "a long file" \
  'src/config/big.c: 701 lines, more than 700 (files of src/config stay within 700: split it by job)'

# The real tree, planted: an upward include into a copy of src/ must fail, naming it.
mkdir -p "$TMP/copy"
cp -r "$SRC/src" "$SRC/docs" "$TMP/copy/"
lowest=$(grep -v '^[[:space:]]*#' "$SRC/docs/layers.txt" | grep -v '^[[:space:]]*-*[[:space:]]*$' |
         tail -n 1 | awk '{print $1}')
highest=$(grep -v '^[[:space:]]*#' "$SRC/docs/layers.txt" | grep -v '^[[:space:]]*-*[[:space:]]*$' |
          head -n 1 | awk '{print $1}')
victim=$(cd "$TMP/copy" && find "src/$lowest" -name '*.c' | LC_ALL=C sort | head -n 1)
if [ -z "$victim" ]; then
  fail "no .c file in src/$lowest (the list's lowest folder) to plant an include in"
else
  n=$(($(wc -l < "$TMP/copy/$victim") + 1))
  echo "#include \"$highest/planted.h\"" >> "$TMP/copy/$victim"
  if check "$TMP/copy" "$TMP/copy/docs/layers.txt" "$TMP/copy/docs/ARCHITECTURE.md" > "$TMP/copy.out"; then
    fail "the checker passed $victim including $highest/ (planted in a copy of the tree)"
  elif grep -qF "$victim:$n: $lowest includes $highest/" "$TMP/copy.out"; then
    pass
  else
    fail "the checker did not name the include planted at $victim:$n:"
    sed 's/^/    /' "$TMP/copy.out" >&2
  fi
fi

# ------------------------------------------------------------------ the real tree --
if check "$SRC" "$SRC/docs/layers.txt" "$SRC/docs/ARCHITECTURE.md" > "$TMP/real.out"; then
  pass
else
  fail "the include direction of src/ and docs/layers.txt disagree ($(wc -l < "$TMP/real.out") problem(s)):"
  sed 's/^/    /' "$TMP/real.out" >&2
fi

finish
