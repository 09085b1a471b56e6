#!/usr/bin/env bash
# Check, on a Debian 12 machine that has Tessera's dependencies installed, that the
# carried packages (.gpu-debs, scripts/fetch_gpu_debs.sh) are enough on their own: in a
# private mount namespace every file of the installed copies of those packages (and of
# the rest of their dependency closure outside the assumed GPU-image base) is hidden by
# an overlay of whiteouts on /usr, their /etc folders by empty mounts; then Tessera is
# configured and built (CPU backend) against the unpacked prefix alone, trains two steps
# of the tiny model on one rank and on two under the prefix's mpirun, and every file the
# runs opened outside the prefix is checked to belong to a base package.
#
#   bench/gpu/bare_test.sh [BUILD_DIR]     # as root (mount namespaces); default build-bare
#   TS_BARE_GPU_CHECK=1 bench/gpu/bare_test.sh   # also run bench/gpu_check.sh --dry-run there
#
# Other processes on the machine see nothing of this: the mounts live in the namespace.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build-bare}
debs=$root/.gpu-debs
work=$(mktemp -d) # a private scratch folder under $TMPDIR or /tmp
trap 'rm -rf "$work"' EXIT

if [ "$(id -u)" -ne 0 ]; then
  echo "bare_test: needs root (unshare -m, overlay mounts)" >&2
  exit 1
fi
[ -f "$debs/PACKAGES.txt" ] || { echo "bare_test: run scripts/fetch_gpu_debs.sh first" >&2; exit 1; }

# The packages to hide: what the carried ones pull in, installed here, minus the base
# the GPU image is assumed to have (the BASE list of fetch_gpu_debs.sh), plus hwloc's
# plugins and what they load (they would be found through hwloc's compiled-in path).
mapfile -t base < <(sed -n '/^base=(/,/^)/p' "$root/scripts/fetch_gpu_debs.sh" |
  sed '1d;$d' | tr -s ' ' '\n' | sed '/^$/d')
declare -A is_base=() is_tool=()
for p in "${base[@]}"; do is_base[$p]=1; done
mapfile -t carried <"$debs/PACKAGES.txt"
mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances "${carried[@]}" libhwloc-plugins 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u)
# The tools this test runs (the GPU image has its own cmake, compiler and make) keep
# what they need, except the carried packages themselves: binutils' ld needs libjansson4,
# and gets the prefix's copy through LD_LIBRARY_PATH.
mapfile -t tools < <(apt-cache depends --recurse --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances cmake gcc make strace dpkg \
  coreutils 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u)
for p in "${tools[@]}"; do is_tool[$p]=1; done
for p in "${carried[@]}"; do unset "is_tool[$p]"; done # those are always hidden
hide=()
for p in "${closure[@]}"; do
  [ -n "${is_base[$p]:-}" ] || [ -n "${is_tool[$p]:-}" ] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null && hide+=("$p")
done
up=$work/up
mkdir -p "$up" "$work/ovl" "$work/empty"
n=0
while IFS= read -r f; do
  case $f in
    /usr/*) rel=${f#/usr/} ;;
    /lib/* | /lib64/* | /bin/* | /sbin/*) rel=${f#/} ;; # merged /usr: /lib is /usr/lib
    *) continue ;;
  esac
  [ -d "$f" ] && [ ! -L "$f" ] && continue
  mkdir -p "$up/$(dirname "$rel")"
  [ -e "$up/$rel" ] || { mknod "$up/$rel" c 0 0 && n=$((n + 1)); }
done < <(dpkg -L "${hide[@]}" 2>/dev/null | sort -u)
echo "bare_test: hiding $n files of ${#hide[@]} installed packages"

cat >"$work/inner.sh" <<'EOF'
set -euo pipefail
mount -t overlay overlay -o "lowerdir=/usr,upperdir=$W/up,workdir=$W/ovl" /usr
for d in /etc/openmpi /etc/libibverbs.d /etc/libnl-3 /etc/hwloc; do
  [ -d "$d" ] && mount --bind "$W/empty" "$d"
done
for f in /usr/bin/mpirun /usr/include/hwloc.h /usr/lib/x86_64-linux-gnu/libjansson.so.4; do
  [ -e "$f" ] || continue
  echo "bare_test: the host's $f is still visible" >&2
  exit 1
done
source "$ROOT/bench/gpu/prefix_env.sh"
ts_prefix_setup "$ROOT/.gpu-debs" "$W/prefix"
rm -rf "$BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTS_WERROR=ON -DTS_CUDA=OFF \
  "${TS_PREFIX_CMAKE_ARGS[@]}" >"$W/cmake.log" 2>&1 || { cat "$W/cmake.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target tessera >"$W/build.log" 2>&1 ||
  { tail -40 "$W/build.log"; exit 1; }
echo "bare_test: configured and built against the prefix alone"
ompi_info | grep -E '^ +Open MPI:|MCA btl: (self|vader)|MCA pml: ob1'
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
cd "$W"
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 400) >text.txt
"$BUILD/tessera" data text.txt train.bin >/dev/null
args=(train "$ROOT/configs/tiny.cfg" --set train.steps=2 --set data.train=\"$W/train.bin\"
  --set data.val=\"\" --set log.progress=false)
strace -f -qq -e trace=openat,execve -o "$W/trace1" \
  "$BUILD/tessera" "${args[@]}" --set log.metrics=\"$W/m1.jsonl\"
strace -f -qq -e trace=openat,execve -o "$W/trace2" \
  mpirun --oversubscribe -np 2 "$BUILD/tessera" "${args[@]}" --set parallel.dp=2 \
  --set log.metrics=\"$W/m2.jsonl\"
echo "bare_test: 1 rank: $(grep -c '"step"' m1.jsonl) steps; 2 ranks under the prefix's mpirun: $(grep -c '"step"' m2.jsonl) steps"
check_rc=0
if [ "${TS_BARE_GPU_CHECK:-0}" = 1 ]; then # the GPU machine's script, dry, in here too
  # A failure is remembered, not fatal here: the opened-files list below still gets written.
  TS_GPU_CHECK_BUILD=$W/check-build TS_GPU_CHECK_PREFIX=$W/check-prefix \
    bash "$ROOT/bench/gpu_check.sh" "$W/check" --dry-run || check_rc=$?
  [ "$check_rc" -eq 0 ] || echo "bare_test: gpu_check --dry-run failed (exit $check_rc)" >&2
fi
grep -h -v ENOENT trace1 trace2 | grep -o '"/[^"]*"' | tr -d '"' | sort -u |
  grep -E '^/(usr|lib|lib64|bin|sbin|etc)/' | grep -v -e /locale -e /gconv -e '^/etc/' >"$W/outside"
exit "$check_rc"
EOF
# The inner script's exit status crosses the namespace boundary: a failure there (the
# build, the runs, or gpu_check --dry-run) fails this script, after the files check
# below where the inner script got as far as writing its list.
inner_rc=0
W=$work ROOT=$root BUILD=$build unshare -m bash "$work/inner.sh" || inner_rc=$?
if [ ! -f "$work/outside" ]; then
  echo "bare_test: the namespaced part failed (exit $inner_rc) before listing the opened files" >&2
  exit 1
fi

# Each file opened outside the prefix must be a base package's (or no package's: the
# dynamic loader's cache, /usr/bin/env and the like are checked by name below).
bad=0
while IFS= read -r f; do
  [ -d "$f" ] && continue
  pkg=$(dpkg -S "$(readlink -f "$f")" 2>/dev/null | head -1 | cut -d: -f1 || true)
  [ -z "$pkg" ] && pkg=$(dpkg -S "$f" 2>/dev/null | head -1 | cut -d: -f1 || true)
  if [ -z "${is_base[$pkg]:-}" ]; then
    echo "bare_test: $f (package '${pkg:-none}') was opened from outside the prefix and is not in BASE"
    bad=1
  fi
done <"$work/outside"
[ $bad -eq 0 ] && echo "bare_test: every file opened outside the prefix belongs to a BASE package:" \
  "$(tr '\n' ' ' <"$work/outside")"
[ "$inner_rc" -eq 0 ] || { echo "bare_test: the namespaced part failed (exit $inner_rc)" >&2; bad=1; }
exit $bad
