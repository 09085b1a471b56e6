#!/usr/bin/env bash
# Download the Debian 12 packages Tessera needs to build and run on a bare GPU machine
# (bench/gpu_check.sh unpacks them there into a private prefix: that machine has the
# CUDA toolkit, a C compiler, CMake and PyTorch, but no MPI, hwloc, libconfig, jansson,
# OpenBLAS or pkg-config, and no network). Run here, on Debian 12 with apt sources:
#
#   scripts/fetch_gpu_debs.sh [DEST]        # DEST defaults to .gpu-debs (git-ignored)
#
# The set is the dependency closure (Depends and Pre-Depends only, first alternative)
# of what the build links and the tests launch, pruned at two lists:
#   BASE: assumed present on the GPU image. That image is this workplace's 'cuda' image
#         (.library/device/KINDS.md): CUDA 13 with nvcc, PyTorch under Python 3.12.3,
#         which says Ubuntu 24.04 (glibc 2.39, gcc 13). So BASE is the C library, the
#         gcc runtime and toolchain nvcc needs as its host compiler, and the Essential
#         set of any Debian/Ubuntu image. Carrying older copies of these would shadow the
#         image's newer ones through LD_LIBRARY_PATH, so they must stay out.
#   SKIP: not needed by a C build and a one-node run (Fortran compilers, ssh for remote
#         launches, JavaScript docs, static-link-only -dev packages, hwloc's optional
#         GPU/PCI discovery plugins, the autotools).
# It then checks that the carried libraries need no newer glibc than the image has,
# and that the debs plus the working tree fit the device tool's 64 MiB carry limit.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-$root/.gpu-debs}
limit_mib=64
image_glibc=2.39 # Ubuntu 24.04's; the carried libraries must need no newer

# What the build and the tests use directly (CMakeLists.txt, scripts/setup.sh).
top=(
  openmpi-bin libopenmpi3 libopenmpi-dev openmpi-common # MPI: mpicc, mpirun/orted, libmpi
  libhwloc15 libhwloc-dev                               # topology and binding
  libconfig9 libconfig-dev                              # config files
  libjansson4 libjansson-dev                            # JSON
  libopenblas0-openmp libopenblas-openmp-dev            # BLAS (OpenMP build)
  zlib1g-dev                                            # crc32 (headers; libz is in BASE)
  pkgconf pkgconf-bin libpkgconf3                       # pkg-config for CMake's pkg_check_modules
  libprotobuf-c1 libprotobuf-c-dev protobuf-c-compiler  # TensorBoard's Events (protoc-c runs at build time)
  libisal2 libisal-dev                                  # CRC-32C of TensorBoard's records
)
base=(
  libc6 libc6-dev libc-dev-bin linux-libc-dev libcrypt1 libcrypt-dev libnsl2 libnsl-dev
  libtirpc3 libtirpc-dev libtirpc-common rpcsvc-proto zlib1g
  gcc-12-base libgcc-s1 libstdc++6 libgomp1 libatomic1 libquadmath0 libitm1 libasan8
  libtsan2 liblsan0 libubsan1 libhwasan0 libcc1-0 libgcc-12-dev libstdc++-12-dev
  gcc gcc-12 cpp cpp-12 g++ g++-12 binutils binutils-common binutils-x86-64-linux-gnu
  libbinutils libctf0 libctf-nobfd0 libgprofng0 libisl23 libmpc3 libmpfr6 libgmp10 make
  debconf dpkg perl-base tar passwd adduser debianutils libpam0g libpam-modules
  libpam-modules-bin libpam-runtime libaudit1 libaudit-common libcap-ng0 libcap2
  libselinux1 libsemanage2 libsemanage-common libsepol2 libpcre2-8-0 libdb5.3 libzstd1
  liblzma5 libbz2-1.0 libmd0 libbsd0 libtinfo6 libudev1 libsystemd0 libacl1 libattr1
  libgcrypt20 libgpg-error0 liblz4-1 libffi8 libssl3 libuuid1 libblkid1 libmount1
)
skip=(
  gfortran gfortran-11 gfortran-12 flang-16 flang-19 flang-22 libgfortran-12-dev
  openssh-client libjs-jquery libjs-jquery-ui
  libevent-dev libpmix-dev libibverbs-dev libnl-3-dev libnl-route-3-dev libltdl-dev
  libhwloc-plugins perl autoconf automake autotools-dev m4 install-info
)

declare -A listed=()
for p in "${base[@]}"; do listed[$p]=base; done
for p in "${skip[@]}"; do listed[$p]=skip; done

# One package's dependencies, one name a line: Depends and Pre-Depends; of an
# alternative group (|Depends ... Depends) the first alternative; a virtual package
# (<name>) stands for its first provider.
deps_of() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances "$1" | awk '
      NR == 1 { next }
      /^ [ |](Pre)?Depends: / {
        alt = ($0 ~ /^ \|/)
        name = $2; virt = (name ~ /^</)
        if (!ingroup) { pick = virt; if (!virt) print name } else pick = 0
        ingroup = alt
        next
      }
      /^    / { if (pick) { print $1; pick = 0 } next }
      { pick = 0 }'
}

queue=("${top[@]}")
carry=()
declare -A seen=()
while [ ${#queue[@]} -gt 0 ]; do
  p=${queue[0]}
  queue=("${queue[@]:1}")
  [ -n "${seen[$p]:-}" ] && continue
  seen[$p]=1
  case "${listed[$p]:-}" in base | skip) continue ;; esac
  if ! apt-cache show --no-all-versions "$p" >/dev/null 2>&1; then
    echo "fetch_gpu_debs: apt knows no package '$p': run apt-get update, or check the" \
      "package lists in $0 against Debian 12" >&2
    exit 1
  fi
  carry+=("$p")
  while read -r d; do
    [ -n "$d" ] && [ -z "${seen[$d]:-}" ] && queue+=("$d")
  done < <(deps_of "$p")
done

mkdir -p "$dest"
rm -f "$dest"/*.deb
echo "fetch_gpu_debs: downloading ${#carry[@]} packages into $dest" >&2
# apt drops privileges to _apt where it can; a root-owned destination only warns.
# Failures show in the count check below.
(cd "$dest" && { apt-get download -q "${carry[@]}" 2>&1 |
  grep -v '^W: Download is performed unsandboxed' >&2 || true; })
got=$(find "$dest" -maxdepth 1 -name '*.deb' | wc -l)
if [ "$got" -ne ${#carry[@]} ]; then
  echo "fetch_gpu_debs: expected ${#carry[@]} .deb files in $dest, found $got" >&2
  exit 1
fi
printf '%s\n' "${carry[@]}" | sort >"$dest/PACKAGES.txt"

# The newest glibc symbol version any carried ELF file needs must be one the image has.
command -v objdump >/dev/null || { echo "fetch_gpu_debs: objdump (binutils) is needed to check the carried libraries' glibc" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "$dest"/*.deb; do dpkg -x "$f" "$tmp"; done
need=$(find "$tmp" -type f \( -name '*.so*' -o -perm -u+x \) -print0 |
  { xargs -0 objdump -T 2>/dev/null || true; } | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' |
  sort -uV | tail -1)
[ -n "$need" ] || { echo "fetch_gpu_debs: found no glibc symbol versions in the carried files (objdump failed?)" >&2; exit 1; }
if [ "$(printf '%s\n%s\n' "$need" "$image_glibc" | sort -V | tail -1)" != "$image_glibc" ]; then
  echo "fetch_gpu_debs: the carried libraries need glibc $need, newer than the GPU image's" \
    "$image_glibc" >&2
  exit 1
fi

# Size: what travels is the working tree (tracked + untracked, not ignored) plus carry.
debs_b=$(du -cb "$dest"/*.deb | tail -1 | cut -f1)
tree_b=$(cd "$root" && { git ls-files -z --cached --others --exclude-standard |
  xargs -0 -r stat -c %s -- 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
total_b=$((debs_b + tree_b))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "fetch_gpu_debs: ${#carry[@]} packages, $(mib "$debs_b") of .deb; working tree" \
  "$(mib "$tree_b"); together $(mib "$total_b") of the $limit_mib MiB carry limit;" \
  "newest glibc needed: $need (image: $image_glibc)"
if [ "$total_b" -gt $((limit_mib * 1048576)) ]; then
  echo "fetch_gpu_debs: over the carry limit: trim the package list or the tree" >&2
  exit 1
fi
