# Sourced by bench/gpu_check.sh (and usable by hand): unpack the Debian packages that
# scripts/fetch_gpu_debs.sh downloaded into a private prefix and point the build and
# the run at it, on a machine that has none of them installed (the lent GPU machine).
#
#   source bench/gpu/prefix_env.sh
#   ts_prefix_setup DEBDIR PREFIX     # unpack, relocate, export the environment
#   cmake ... "${TS_PREFIX_CMAKE_ARGS[@]}"
#
# Nothing is installed into / (dpkg -x only extracts files). What the packages' maintainer
# scripts would have done is redone inside PREFIX: the alternatives' links (mpirun,
# mpicc), absolute links re-pointed into PREFIX, and pkg-config files rewritten from
# /usr to PREFIX/usr. Open MPI finds itself through OPAL_PREFIX and OPAL_SYSCONFDIR
# (its components, help files and Debian's default MCA parameters under PREFIX).

ts_prefix_setup() {
  local debs=$1 p=$2 f link target arch=x86_64-linux-gnu
  if ! compgen -G "$debs/*.deb" >/dev/null; then
    echo "prefix_env: no .deb files in '$debs': run scripts/fetch_gpu_debs.sh on a" \
      "Debian 12 machine first and carry its folder (.gpu-debs)" >&2
    return 1
  fi
  rm -rf "$p" && mkdir -p "$p" || return 1
  for f in "$debs"/*.deb; do
    if command -v dpkg >/dev/null; then
      dpkg -x "$f" "$p" || { echo "prefix_env: dpkg -x $f failed" >&2; return 1; }
    else # no dpkg: a .deb is an ar archive holding data.tar.{xz,zst,gz}
      local member z
      member=$(ar t "$f" | grep '^data\.tar')
      case $member in *.xz) z=-J ;; *.zst) z=--zstd ;; *.gz) z=-z ;; *) z= ;; esac
      (cd "$p" && ar p "$f" "$member" | tar -x $z -f -) ||
        { echo "prefix_env: unpacking $f failed" >&2; return 1; }
    fi
  done

  # Absolute links (zlib1g-dev's libz.so -> /lib/<arch>/libz.so.1.2.13) point into the
  # host: into PREFIX where the target was carried, else at the host's library of the
  # same soname (libz.so.1: zlib is in every image, maybe in another version).
  while IFS= read -r -d '' link; do
    target=$(readlink "$link")
    if [ -e "$p$target" ]; then
      ln -sfn "$p$target" "$link"
    elif [ -e "$(sed -E 's/(\.so\.[0-9]+)\..*$/\1/' <<<"$target")" ]; then
      ln -sfn "$(sed -E 's/(\.so\.[0-9]+)\..*$/\1/' <<<"$target")" "$link"
    fi
  done < <(find "$p" -type l -lname '/*' -print0)
  # The links Debian's alternatives system makes at install time.
  ln -sfn mpirun.openmpi "$p/usr/bin/mpirun"
  ln -sfn mpiexec.openmpi "$p/usr/bin/mpiexec"
  ln -sfn mpicc.openmpi "$p/usr/bin/mpicc"
  [ -e "$p/usr/lib/libpsm1/libpsm_infinipath.so.1.16" ] && # libfabric's PSM provider
    ln -sfn ../libpsm1/libpsm_infinipath.so.1.16 "$p/usr/lib/$arch/libpsm_infinipath.so.1"
  # pkg-config files name /usr (prefix=/usr, libdir=/usr/lib/...): move them to PREFIX.
  while IFS= read -r -d '' f; do
    sed -i -E "s#(=|-I|-L)/usr([/[:space:]]|\$)#\\1$p/usr\\2#g" "$f"
  done < <(find "$p" -name '*.pc' -print0)

  local libdirs
  libdirs=$(find "$p" -name 'lib*.so*' -printf '%h\n' | sort -u |
    grep -v -e '/openmpi3$' -e '/pmix$' -e '/libibverbs$' -e '/ucx$' | paste -sd:)
  export TS_PREFIX=$p
  # Programs that need none of this (PyTorch) can run with the library path as it was.
  export TS_PREFIX_ORIG_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
  export PATH="$p/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX="$p/usr" OPAL_SYSCONFDIR="$p/etc/openmpi"
  # Open MPI's launcher wants an ssh/rsh binary on PATH even when every rank is local;
  # the image has none, and on one node it is never run: name one that exists.
  export OMPI_MCA_plm_rsh_agent=false
  # PMIx (Open MPI's launcher protocol) finds its plugins, help texts and defaults the
  # same way; Debian installs it under /usr/lib/<arch>/pmix2.
  local x="$p/usr/lib/$arch/pmix2"
  export PMIX_PREFIX="$x" PMIX_LIBDIR="$x/lib" PMIX_PKGLIBDIR="$x/lib/pmix" \
    PMIX_PKGDATADIR="$x/share/pmix" PMIX_SYSCONFDIR="$x/share"
  # Multiarch headers (hwloc's autogen/config.h, OpenBLAS's cblas.h) sit in
  # /usr/include/<arch>, a directory the compiler searches by default and no .pc file
  # names: put PREFIX's copy ahead of the system one for gcc and nvcc's host compiler.
  export C_INCLUDE_PATH="$p/usr/include/$arch${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
  export CPLUS_INCLUDE_PATH="$p/usr/include/$arch${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
  export PKG_CONFIG="$p/usr/bin/pkgconf"
  # hwloc's optional plugins (PCI, OpenCL, NVML discovery) are not carried; without this
  # it would load a host's copies from its compiled-in /usr path.
  export HWLOC_PLUGINS_PATH="$p/usr/lib/$arch/hwloc"
  export PKG_CONFIG_LIBDIR="$p/usr/lib/$arch/pkgconfig:$p/usr/share/pkgconfig"
  unset PKG_CONFIG_PATH
  # The project's CMakeLists searches OpenBLAS at Debian's fixed paths, so name the
  # files outright; the rest is found through the prefix and the relocated .pc files.
  # shellcheck disable=SC2034 # read by the sourcing script
  TS_PREFIX_CMAKE_ARGS=(
    "-DCMAKE_PREFIX_PATH=$p/usr"
    "-DPKG_CONFIG_EXECUTABLE=$p/usr/bin/pkgconf"
    "-DMPI_C_COMPILER=$p/usr/bin/mpicc"
    "-DMPIEXEC_EXECUTABLE=$p/usr/bin/mpirun"
    "-DOPENBLAS_INCLUDE_DIR=$p/usr/include/$arch/openblas-openmp"
    "-DOPENBLAS_LIBRARY=$p/usr/lib/$arch/openblas-openmp/libopenblas.so"
    "-DZLIB_INCLUDE_DIR=$p/usr/include"
    "-DZLIB_LIBRARY=$p/usr/lib/$arch/libz.so"
  )
}
