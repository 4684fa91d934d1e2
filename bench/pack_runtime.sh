#!/usr/bin/env bash
# pack_runtime.sh: builds the whole tree for a GPU machine (ddp-train, the CUDA and GPU test
# programs, the CUDA kernel benchmark) and packs the programs with the shared libraries they need
# and a relocatable Open MPI, so that they run where Open MPI, yaml-cpp etc. are not installed.
# Sourced, it defines ddp_kit_env only (bench/gpu_check.sh and bench/gpu_train_bench.sh use it).
#
# usage: bench/pack_runtime.sh [DIR]      pack into DIR/runtime (default $DDP_DEPS or ./.gpu-deps)
#        source bench/pack_runtime.sh; ddp_kit_env DIR/runtime   (then mpirun, ddp-train ... work)
#
# Packing environment:
#   DDP_PACK_BUILD_DIR  build directory, reused between packs (default ./build-gpu-pack)
#   DDP_CUDA_ARCH       CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200)
#   DDP_PACK_JOBS       parallel build jobs (default: the number of cores)
#   DDP_PACK_MAX_MB     refuse a runtime larger than this (default 45)
#
# What the runtime holds and what it leaves to the machine:
#   bin/        ddp-train, ddp_cuda_tests, ddp_gpu_tests, ddp_bench_cuda_kernels
#   lib/        every shared library they and the kept Open MPI plugins need, except glibc's,
#               the CUDA driver's, NCCL and cuBLAS (hundreds of MB: the GPU machine has them in
#               PyTorch's wheels or the CUDA toolkit); libcudart.so.13 is packed (0.7 MB, the one
#               the programs were built against)
#   lib/fallback/  libstdc++ and libgcc_s, used only where the machine's are missing or too old
#   lib/stub/   libnccl.so.2 and libcublas.so.13 that only fail: used where the machine has no
#               real one (a machine without a GPU), so the programs start and report no device
#   ompi/       Open MPI's mpirun, orted, ompi_info, plugins, help texts and MCA parameters;
#               plugins that need UCX, libfabric, verbs, PSM or OpenSHMEM are left out
#   pmix/       PMIx's plugins and help texts (Open MPI 4.1 starts ranks through PMIx)
#   KIT         what was packed, from where, and what was left out; the sources' digest
#               (ddp_source_digest) that bench/gpu_check.sh matches with the tree it runs in
#   RESOURCES   ptxas's registers, stack frame and spills of every kernel per architecture
set -u -o pipefail

# --------------------------------------------------------------------------------------------
# The environment: ddp_kit_env RUNTIME_DIR exports what makes the packed programs and Open MPI
# work from wherever the folder is. It finds NCCL and cuBLAS on the machine (environment
# overrides first: DDP_NCCL_LIB=/path/libnccl.so.2, DDP_CUBLAS_LIB=/path/libcublas.so.13; then
# PyTorch's nvidia-* wheels, the CUDA toolkit, ldconfig) and links them into a private folder
# at the front of LD_LIBRARY_PATH, so no other library of those folders is picked up. Sets
# DDP_KIT_NCCL, DDP_KIT_CUBLAS, DDP_KIT_CXXRT (where each came from) and DDP_KIT_LINKS.

# Folders of PyTorch's nvidia-* wheels (nvidia/nccl/lib, nvidia/cublas/lib, nvidia/cu13/lib).
ddp_kit_wheel_dirs() {
  local py
  for py in "${TORCH_PYTHON:-}" python3 /opt/torch/.venv/bin/python3; do
    if [[ -z $py ]] || ! command -v "$py" >/dev/null 2>&1; then continue; fi
    # find_spec locates the namespace package without importing torch or CUDA.
    timeout 30 "$py" - <<'EOF' 2>/dev/null && return 0
import importlib.util, os
spec = importlib.util.find_spec("nvidia")
for root in (spec.submodule_search_locations or []) if spec else []:
    for sub in sorted(os.listdir(root)):
        lib = os.path.join(root, sub, "lib")
        if os.path.isdir(lib):
            print(lib)
EOF
  done
  return 0
}

# ddp_kit_find NAME DIR... -> the first DIR/NAME that exists, else what ldconfig knows.
ddp_kit_find() {
  local name=$1 dir
  shift
  for dir in "$@"; do
    [[ -n $dir && -e $dir/$name ]] && echo "$dir/$name" && return 0
  done
  command -v ldconfig >/dev/null 2>&1 || return 0
  ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && /x86-64/ { print $NF; exit }'
}

ddp_kit_env() {
  local kit
  kit=$(cd "${1:?ddp_kit_env needs the runtime folder}" && pwd) || return 1
  [[ -f $kit/KIT && -x $kit/bin/ddp-train ]] || {
    echo "ddp_kit_env: $kit is not a packed runtime (no KIT or bin/ddp-train)" >&2
    return 1
  }
  local -a wheels=()
  mapfile -t wheels < <(ddp_kit_wheel_dirs)
  local cuda_dirs=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib)
  local nccl=${DDP_NCCL_LIB:-} cublas=${DDP_CUBLAS_LIB:-}
  [[ -n $nccl ]] || nccl=$(ddp_kit_find libnccl.so.2 "${wheels[@]}" "${cuda_dirs[@]}")
  [[ -n $cublas ]] || cublas=$(ddp_kit_find libcublas.so.13 "${wheels[@]}" "${cuda_dirs[@]}")
  local links
  links=$(mktemp -d "${TMPDIR:-/tmp}/ddp-kit-libs.XXXXXX") || return 1
  if [[ -n $nccl && -e $nccl ]]; then
    ln -s "$(readlink -f "$nccl")" "$links/libnccl.so.2"
    DDP_KIT_NCCL="$nccl"
  else
    ln -s "$kit/lib/stub/libnccl.so.2" "$links/libnccl.so.2"
    DDP_KIT_NCCL="none on this machine: the packed stub (NCCL calls fail)"
  fi
  local lt=""
  [[ -n $cublas ]] && lt=$(dirname "$cublas")/libcublasLt.so.13
  if [[ -n $cublas && -e $cublas && -e $lt ]]; then
    ln -s "$(readlink -f "$cublas")" "$links/libcublas.so.13"
    ln -s "$(readlink -f "$lt")" "$links/libcublasLt.so.13"
    DDP_KIT_CUBLAS="$cublas"
  else
    ln -s "$kit/lib/stub/libcublas.so.13" "$links/libcublas.so.13"
    DDP_KIT_CUBLAS="none on this machine: the packed stub (cuBLAS calls fail)"
  fi
  local path="$links:$kit/lib"
  # The packed libstdc++ only where the machine's cannot run the programs: a newer one there
  # also serves libraries of the machine's (NCCL) that may need it.
  DDP_KIT_CXXRT="the machine's"
  if command -v ldd >/dev/null 2>&1; then
    if LD_LIBRARY_PATH="$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$kit/bin/ddp-train" 2>&1 |
      grep -Eq '(libstdc\+\+|libgcc_s).*not found|(GLIBCXX|CXXABI|GCC)_[0-9.]+.* not found'; then
      path="$path:$kit/lib/fallback"
      DDP_KIT_CXXRT="packed ($kit/lib/fallback): the machine's is missing or too old"
    fi
  elif ! ldconfig -p 2>/dev/null | grep -q 'libstdc++\.so\.6 '; then
    path="$path:$kit/lib/fallback"
    DDP_KIT_CXXRT="packed ($kit/lib/fallback)"
  fi
  DDP_KIT_LINKS=$links
  export DDP_KIT_NCCL DDP_KIT_CUBLAS DDP_KIT_CXXRT DDP_KIT_LINKS
  export LD_LIBRARY_PATH="$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$kit/ompi/bin:$kit/bin:$PATH"
  # Open MPI's install directories (opal/mca/installdirs/env): all of them, since Debian's
  # build keeps some outside its prefix (/etc/openmpi).
  export OPAL_PREFIX="$kit/ompi" OPAL_EXEC_PREFIX="$kit/ompi" OPAL_BINDIR="$kit/ompi/bin" \
    OPAL_SBINDIR="$kit/ompi/bin" OPAL_LIBEXECDIR="$kit/ompi/bin" OPAL_LIBDIR="$kit/lib" \
    OPAL_PKGLIBDIR="$kit/ompi/lib/openmpi3" OPAL_DATAROOTDIR="$kit/ompi/share" \
    OPAL_DATADIR="$kit/ompi/share" OPAL_PKGDATADIR="$kit/ompi/share/openmpi" \
    OPAL_SYSCONFDIR="$kit/ompi/etc" OPAL_INCLUDEDIR="$kit/ompi/include" \
    OPAL_PKGINCLUDEDIR="$kit/ompi/include" OPAL_SHAREDSTATEDIR="${TMPDIR:-/tmp}" \
    OPAL_LOCALSTATEDIR="${TMPDIR:-/tmp}" OPAL_INFODIR="$kit/ompi/share" OPAL_MANDIR="$kit/ompi/share"
  export OMPI_MCA_mca_base_component_path="$kit/ompi/lib/openmpi3"
  export PMIX_INSTALL_PREFIX="$kit/pmix" PMIX_MCA_mca_base_component_path="$kit/pmix/lib/pmix"
  # hwloc's own plugins (PCI, OpenCL, CUDA, NVML) are not packed; an empty folder keeps it from
  # loading the machine's, which may belong to another hwloc version.
  export HWLOC_PLUGINS_PATH="$kit/lib/hwloc"
  # mpirun refuses to start without ssh or rsh, even for ranks on this machine only, unless
  # told to launch locally (the isolated launcher).
  if [[ -z ${OMPI_MCA_plm:-} ]] && ! command -v ssh >/dev/null 2>&1 && ! command -v rsh >/dev/null 2>&1; then
    export OMPI_MCA_plm=isolated
  fi
  if [[ $(id -u) == 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  # One machine, often a container or VM: PMIx's shared-memory data store, Open MPI's transports
  # other than shared memory and self, the kernel-assisted copies (CMA, blocked there) and NCCL's
  # probing of network interfaces all fail in some of them. A user's own setting wins.
  export PMIX_MCA_gds=${PMIX_MCA_gds:-hash} OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
  export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
  # PMIx's zlib plugin may be missing or belong to another PMIx there: it then warns on every
  # start that it cannot compress (only large start-up messages would be).
  export PMIX_MCA_pcompress_base_silence_warning=${PMIX_MCA_pcompress_base_silence_warning:-1}
  export DDP_KIT_ACTIVE="$kit"
}

# ddp_source_digest REPO: a digest of every file the packed programs are built from (C++, CUDA
# and CMake under src, include, emu, cmake, tests, bench, and the top CMakeLists.txt), by path
# and content, so a kit can be matched with a tree without git (a copied tree has none).
ddp_source_digest() {
  (
    cd "${1:?ddp_source_digest needs the repository}" || exit 1
    find CMakeLists.txt src include emu cmake tests bench -type f \( -name '*.cpp' -o -name '*.h' \
      -o -name '*.cu' -o -name '*.cuh' -o -name '*.hpp' -o -name '*.cmake' -o -name '*.in' \
      -o -name CMakeLists.txt \) -print0 2>/dev/null | LC_ALL=C sort -z | xargs -0 sha256sum |
      sha256sum | cut -c1-16
  )
}

# Sourced: the functions above are all that is wanted.
if [[ ${BASH_SOURCE[0]} != "$0" ]]; then
  return 0
fi

# --------------------------------------------------------------------------------------------
# Packing.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() {
  echo "pack_runtime.sh: $*" >&2
  exit 2
}

case ${1:-} in
  -h | --help)
    sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  -*) die "unknown option '$1' (try --help)" ;;
esac

DEST=${1:-${DDP_DEPS:-$REPO/.gpu-deps}}
BUILD=${DDP_PACK_BUILD_DIR:-$REPO/build-gpu-pack}
ARCH=${DDP_CUDA_ARCH:-90}
JOBS=${DDP_PACK_JOBS:-$(nproc 2>/dev/null || echo 2)}
MAX_MB=${DDP_PACK_MAX_MB:-45}
PROGRAMS=(ddp-train tests/ddp_cuda_tests tests/ddp_gpu_tests bench/ddp_bench_cuda_kernels)

# Libraries every Linux machine has (glibc), or that must be the machine's own (the CUDA
# driver), or that are too large and are found on the GPU machine (NCCL, cuBLAS).
GLIBC_RE='^(linux-vdso|linux-gate|ld-linux[-a-z0-9_]*|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libnsl|libBrokenLocale|libthread_db|libcrypt|libnss_[a-z]*)\.so'
MACHINE_RE='^(libcuda|libnvidia-[a-z-]*|libnccl|libcublas|libcublasLt)\.so'
CXXRT_RE='^(libstdc\+\+|libgcc_s)\.so'
# Open MPI plugins whose libraries are large or only serve fabrics a single GPU machine lacks.
HEAVY_RE='^(libucp|libucs|libuct|libucm|libfabric|libibverbs|librdmacm|libpsm2|libpsm_infinipath|libinfinipath|libefa|liboshmem|libmca_common_ucx|libmca_common_ofi|libmca_common_verbs|libcuda)\.so'

command -v ldd >/dev/null || die "ldd is needed"
command -v ompi_info >/dev/null || die "Open MPI is not installed here (ompi_info not found)"

# deps FILE -> "soname path" for each library FILE needs (ldd's view: the whole closure),
# "soname not-found" for those it cannot find.
deps() {
  ldd "$1" 2>/dev/null | awk '$2 == "=>" { print $1, ($3 == "not" ? "not-found" : $3) }'
}

TMP=""
cleanup() { [[ -n $TMP ]] && rm -rf "$TMP"; }
trap cleanup EXIT

build() {
  command -v cmake >/dev/null || die "cmake is not on PATH"
  local gen=()
  if [[ ! -f $BUILD/CMakeCache.txt ]] && command -v ninja >/dev/null; then
    gen=(-G Ninja)
  fi
  echo "pack_runtime.sh: configuring $BUILD (CUDA architectures $ARCH, no -march=native, no oneDNN)"
  # Without oneDNN: its library alone (40 MB) would not fit DDP_PACK_MAX_MB, and the GPU runs do
  # not use it (the CPU ranks there run Eigen's GEMMs, bf16 over widened operands).
  cmake -S "$REPO" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDDP_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DDDP_NATIVE_ARCH=OFF -DDDP_KERNELS_ONLY=OFF \
    -DDDP_ONEDNN=OFF -DDDP_BUILD_TESTS=ON -DDDP_BUILD_BENCH=ON >"$BUILD.configure.log" 2>&1 ||
    { tail -n 30 "$BUILD.configure.log" >&2; die "configure failed ($BUILD.configure.log)"; }
  echo "pack_runtime.sh: building ${PROGRAMS[*]##*/} with $JOBS jobs (minutes)"
  local targets=()
  local p
  for p in "${PROGRAMS[@]}"; do targets+=("${p##*/}"); done
  cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" >"$BUILD.build.log" 2>&1 ||
    { tail -n 40 "$BUILD.build.log" >&2; die "build failed ($BUILD.build.log)"; }
  for p in "${PROGRAMS[@]}"; do
    [[ -x $BUILD/$p ]] || die "$BUILD/$p was not built"
  done
}

# copy_lib SONAME PATH: into lib/ (or lib/fallback/), once, following links.
declare -A COPIED=()
copy_lib() {
  local name=$1 path=$2 dir=$TMP/lib
  [[ -n ${COPIED[$name]:-} ]] && return 0
  [[ $name =~ $CXXRT_RE ]] && dir=$TMP/lib/fallback
  cp -L "$path" "$dir/$name" || die "cannot copy $path"
  chmod u+w "$dir/$name"
  COPIED[$name]=$path
}

# copy_deps FILE: the libraries FILE needs that belong in the runtime; fails on one not found.
copy_deps() {
  local name path
  while read -r name path; do
    [[ $name =~ $GLIBC_RE || $name =~ $MACHINE_RE ]] && continue
    [[ $path == not-found ]] && die "$1 needs $name, which is not installed here"
    copy_lib "$name" "$path"
  done < <(deps "$1")
}

# Stub libraries: every function the programs import from LIB (by PREFIX), returning CODE, or
# a message for the functions that return strings. Versioned symbols keep their version.
make_stub() {  # soname prefix code message
  local soname=$1 prefix=$2 code=$3 msg=$4 src=$TMP/stub-$1.c
  local -a syms
  mapfile -t syms < <(for p in "${PROGRAMS[@]}"; do nm -D --undefined-only "$BUILD/$p"; done |
    awk -v pre="$prefix" '$1 == "U" && index($2, pre) == 1 { print $2 }' | sort -u)
  ((${#syms[@]})) || { echo "  no program imports $soname: no stub"; return 0; }
  local version="" s name
  {
    echo "/* $soname stub: no real one on this machine. Every function fails. */"
    echo "static const char message[] = \"$msg\";"
    for s in "${syms[@]}"; do
      name=${s%%@*}
      [[ $s == *@* ]] && version=${s#*@}
      if [[ $name =~ (String|Name|LastError)$ ]]; then
        echo "const char *$name(void) { return message; }"
      else
        echo "long $name(void) { return $code; }"
      fi
    done
  } >"$src"
  local flags=(-shared -fPIC -O1 "-Wl,-soname,$soname")
  if [[ -n $version ]]; then
    printf '%s { global: *; };\n' "$version" >"$TMP/stub-$soname.map"
    flags+=("-Wl,--version-script,$TMP/stub-$soname.map")
  fi
  cc "${flags[@]}" -o "$TMP/lib/stub/$soname" "$src" || die "cannot build the $soname stub"
  rm -f "$src" "$TMP/stub-$soname.map"
  echo "  stub $soname: ${#syms[@]} functions (${syms[*]%%@*})"
}

ompi_path() {  # name -> Open MPI's install path of that name (ompi_info --path)
  ompi_info --parsable --path "$1" 2>/dev/null | sed -n "s/^path:$1:\(.*\)/\1/p" | head -n 1
}

pack_ompi() {
  local bindir pkglib pkgdata sysconf version
  bindir=$(ompi_path bindir)
  pkglib=$(ompi_path pkglibdir)
  pkgdata=$(ompi_path pkgdatadir)
  sysconf=$(ompi_path sysconfdir)
  version=$(ompi_info --version 2>/dev/null | sed -n "s/^Open MPI v*\([0-9][0-9.a-z]*\).*/\1/p" | head -n 1)
  [[ -d $pkglib && -d $pkgdata ]] || die "cannot find Open MPI's plugins ($pkglib) or data ($pkgdata)"
  mkdir -p "$TMP/ompi/bin" "$TMP/ompi/lib/openmpi3" "$TMP/ompi/share" "$TMP/ompi/etc"
  # Copies, not links: links may not survive the trip to the GPU machine.
  local b
  for b in orterun orted ompi_info; do
    [[ -x $bindir/$b ]] || die "no $bindir/$b"
    cp -L "$bindir/$b" "$TMP/ompi/bin/$b"
    copy_deps "$bindir/$b"
  done
  cp "$TMP/ompi/bin/orterun" "$TMP/ompi/bin/mpirun"
  cp "$TMP/ompi/bin/orterun" "$TMP/ompi/bin/mpiexec"
  cp -rL "$pkgdata" "$TMP/ompi/share/openmpi"
  [[ -d $sysconf ]] && cp -L "$sysconf"/openmpi-mca-params.conf "$sysconf"/openmpi-default-hostfile \
    "$TMP/ompi/etc/" 2>/dev/null
  local plugin name path kept=() skipped=()
  for plugin in "$pkglib"/*.so; do
    local why=""
    while read -r name path; do
      if [[ $path == not-found ]]; then
        why="needs $name (not installed here)"
      elif [[ $name =~ $HEAVY_RE ]]; then
        why="needs $name"
      fi
      [[ -n $why ]] && break
    done < <(deps "$plugin")
    if [[ -n $why ]]; then
      skipped+=("$(basename "$plugin" .so): $why")
      continue
    fi
    cp -L "$plugin" "$TMP/ompi/lib/openmpi3/"
    copy_deps "$plugin"
    kept+=("$(basename "$plugin" .so)")
  done
  {
    echo "Open MPI $version from $(dirname "$bindir") (plugins $pkglib, data $pkgdata, config $sysconf)"
    echo "  plugins kept (${#kept[@]}): ${kept[*]}"
    echo "  plugins left out (${#skipped[@]}):"
    printf '    %s\n' "${skipped[@]}"
  } >>"$TMP/KIT"
  echo "  Open MPI $version: ${#kept[@]} plugins kept, ${#skipped[@]} left out (see KIT)"
}

# PMIx (external to Debian's Open MPI): its plugins and help texts sit under its own prefix,
# found from where libpmix.so.2 really is (.../pmix2/lib/libpmix.so.2.x).
pack_pmix() {
  local lib=${COPIED[libpmix.so.2]:-}
  if [[ -z $lib ]]; then
    echo "  no libpmix.so.2 among the libraries: Open MPI uses its internal PMIx"
    return 0
  fi
  local prefix
  prefix=$(dirname "$(dirname "$(readlink -f "$lib")")")
  mkdir -p "$TMP/pmix/lib/pmix" "$TMP/pmix/share"
  local plugin
  if [[ -d $prefix/lib/pmix ]]; then
    for plugin in "$prefix"/lib/pmix/*.so; do
      [[ -e $plugin ]] || continue
      if deps "$plugin" | grep -q ' not-found$'; then continue; fi
      cp -L "$plugin" "$TMP/pmix/lib/pmix/"
      copy_deps "$plugin"
    done
  fi
  [[ -d $prefix/share ]] && cp -rL "$prefix/share/." "$TMP/pmix/share/"
  echo "PMIx from $prefix: plugins $(cd "$TMP/pmix/lib/pmix" && echo *.so)" >>"$TMP/KIT"
}

# kernel_resources: ptxas's report of every kernel on every architecture the kit was built for
# (registers, shared memory, stack frame, spill stores and loads; cmake/nvcc_resource_report.sh
# keeps it beside each object), kernels that touch local memory first, for gpu_check.sh's
# details archive (the GPU machine has no CUDA toolkit to ask).
kernel_resources() {
  local reports=()
  mapfile -t reports < <(find "$BUILD/CMakeFiles/ddp_kernels.dir" -name '*.resources' | sort)
  ((${#reports[@]})) || { echo "no ptxas reports in $BUILD: resources not recorded"; return 0; }
  echo "# stack bytes, spill stores, spill loads, registers, arch, kernel (ptxas -v, ${#reports[@]} objects)"
  cat "${reports[@]}" | awk '
    /Compiling entry function/ { fn = $7; arch = $9; gsub(/\047/, "", fn); gsub(/\047/, "", arch); stack = st = ld = 0 }
    /bytes stack frame/ { stack = $1; st = $5; ld = $9 }
    /Used [0-9]+ registers/ { print stack + 0, st + 0, ld + 0, $5, arch, fn }' |
    sort -k2,2nr -k1,1nr -k6 | demangle
}
demangle() { if command -v c++filt >/dev/null; then c++filt; else cat; fi; }

pack() {
  mkdir -p "$DEST" || die "cannot create $DEST"
  DEST=$(cd "$DEST" && pwd)
  build
  TMP=$DEST/runtime.tmp.$$
  rm -rf "$TMP"
  mkdir -p "$TMP/bin" "$TMP/lib/fallback" "$TMP/lib/stub" "$TMP/lib/hwloc"
  echo "hwloc plugins are not packed; HWLOC_PLUGINS_PATH points here so none is loaded." \
    >"$TMP/lib/hwloc/README"
  local cache=$BUILD/CMakeCache.txt
  local nccl cudart nvcc cuda_version
  nccl=$(sed -n 's/^DDP_NCCL_LIBRARY:FILEPATH=//p' "$cache")
  nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$cache")
  cuda_version=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  {
    echo "ddp GPU runtime packed $(date -u +%Y-%m-%dT%H:%M:%SZ) by bench/pack_runtime.sh on $(uname -n)"
    echo "build: $BUILD, Release, CUDA ${cuda_version:-?} for architectures $ARCH, DDP_NATIVE_ARCH=OFF"
    echo "system: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(ldd --version 2>/dev/null | head -n 1)"
    echo "NCCL linked at build time: ${nccl:-NONE (distributed.backend nccl unavailable)}; at run time the machine's"
    echo "sources: $(ddp_source_digest "$REPO") (commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')$(
      git -C "$REPO" diff --quiet HEAD 2>/dev/null || echo ', with uncommitted changes'))"
  } >"$TMP/KIT"
  [[ -n $nccl ]] || echo "pack_runtime.sh: warning: the build found no NCCL; ddp-train has no nccl backend" >&2
  local p
  for p in "${PROGRAMS[@]}"; do
    cp "$BUILD/$p" "$TMP/bin/"
    strip --strip-unneeded "$TMP/bin/${p##*/}" 2>/dev/null || true
    copy_deps "$BUILD/$p"
  done
  cudart=${COPIED[libcudart.so.13]:-}
  echo "programs: ${PROGRAMS[*]##*/}" >>"$TMP/KIT"
  kernel_resources >"$TMP/RESOURCES"
  pack_ompi
  pack_pmix
  echo "pack_runtime.sh: stubs for machines without NCCL / cuBLAS"
  make_stub libnccl.so.2 nccl 2 "NCCL is not installed on this machine (stub libnccl.so.2 of the ddp GPU runtime)"
  make_stub libcublas.so.13 cublas 1 "cuBLAS is not installed on this machine (stub libcublas.so.13 of the ddp GPU runtime)"
  {
    echo "libcudart: packed, from ${cudart:-?}"
    echo "libraries packed (lib/, lib/fallback/):"
    local name
    for name in $(printf '%s\n' "${!COPIED[@]}" | sort); do
      echo "  $name <- ${COPIED[$name]}"
    done
    echo "stubs (lib/stub/, used only where the machine has none): $(cd "$TMP/lib/stub" && echo *)"
  } >>"$TMP/KIT"
  local mb
  mb=$(du -sm "$TMP" | cut -f1)
  echo "size: ${mb} MB" >>"$TMP/KIT"
  ((mb <= MAX_MB)) || die "the runtime is ${mb} MB, more than DDP_PACK_MAX_MB=$MAX_MB"
  rm -rf "$DEST/runtime"
  mv "$TMP" "$DEST/runtime" || die "cannot move $TMP to $DEST/runtime"
  TMP=""
  echo "pack_runtime.sh: packed $DEST/runtime (${mb} MB): $(cd "$DEST/runtime/bin" && echo *)"
}

pack
