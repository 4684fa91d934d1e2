#!/usr/bin/env bash
# gpu_check.sh: the one command to run on a GPU machine. With a packed runtime in .gpu-deps
# (made here by --pack) it runs the prebuilt programs: an MPI smoke run of ddp-train, the CUDA
# kernel tests, the GPU trainer tests on 1 and 2 ranks, the kernel benchmark and the training
# benchmark against PyTorch in fp32, bf16 and fp16 (bench/gpu_train_bench.sh; its table is the
# end of the summary). Without one it builds the kernel library (DDP_KERNELS_ONLY) there and
# runs its tests and benchmark. Every stage has a time limit, the whole run a budget; it ends
# with a short summary table.
#
# usage: bench/gpu_check.sh [--quick|--full]   on the GPU machine (--quick / --full: the kernel
#                                              benchmark's length; kit default --quick, build
#                                              default full)
#        bench/gpu_check.sh --pack [DIR]       here (CUDA toolkit, NCCL, Open MPI, yaml-cpp,
#                                              Eigen, Catch2 installed): build the whole tree and
#                                              pack programs, libraries, Open MPI and headers into
#                                              DIR (default $DDP_DEPS or ./.gpu-deps; see
#                                              bench/pack_runtime.sh --help)
#        bench/gpu_check.sh --pack-headers [DIR]  only Eigen's and Catch2's headers (build mode)
#
# Environment:
#   DDP_DEPS         the packed folder (default ./.gpu-deps): runtime/ (programs, libraries,
#                    Open MPI), include/ and lib/cmake/ (headers for the build mode)
#   DDP_CHECK_MODE   auto (default: kit when DDP_DEPS/runtime exists, else build) | kit | build
#   DDP_DEPS_MODE    build mode: auto (default) | packed (headers from DDP_DEPS) | system
#   DDP_CUDA_ARCH    build mode: CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200)
#   DDP_BUILD_DIR    build mode: build directory, made afresh (default ./build-gpu-check)
#   DDP_BENCH_ARGS   extra arguments for ddp_bench_cuda_kernels (e.g. "--only gemm")
#   DDP_TRAIN_BENCH_ARGS  extra arguments for bench/gpu_train_bench.sh (e.g. '--cases "small64
#                    wide1024"'); both are split into words with the shell's quoting
#   DDP_CHECK_BUDGET_S  seconds for the whole run (default 420 kit, 345 build); each stage has
#                    its own limit as well and gets at most what is left
#   DDP_TRAIN_BENCH_RESERVE_S  kit mode: seconds of the budget kept for the training benchmark
#                    while the stages before it run (default 240: its 20 runs took ~11 s
#                    each on an H200, PyTorch's start-up included)
#   DDP_BENCH_DEVICE cpu: run the training benchmark on the CPU even without a GPU (a check of
#                    the script, not a measurement)
#   DDP_NCCL_LIB, DDP_CUBLAS_LIB  kit mode: the libnccl.so.2 / libcublas.so.13 to use (default:
#                    found in PyTorch's nvidia-* wheels, the CUDA toolkit, ldconfig)
#   OUT              if set, the logs go there, else to <build dir>-logs: gpu_check.log,
#                    summary.md, bench.md, bench.csv, and in kit mode train_bench.md,
#                    train_bench.csv and details.tar.gz (every stage's own log and outputs, the kit's KIT and RESOURCES); in
#                    build mode build.log and tests.log
# Exit status: 0 all passed, 1 a test failed or a result was wrong or a stage timed out,
# 2 configure, build or packed runtime failed, 77 nothing failed but there is no GPU (GPU tests
# and benchmarks skipped). It only reads the GPU's state (nvidia-smi -L / --query-gpu): it changes
# no setting.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=${DDP_DEPS:-$REPO/.gpu-deps}
MARKER=DDP_GPU_DEPS

die() {
  echo "gpu_check.sh: $*" >&2
  exit 2
}

# split_args VALUE NAME: VALUE's words into the array SPLIT, with the shell's quoting
# ('--cases "small64 wide1024"' is two words, where plain word splitting made three); a value
# that does not parse is an error naming the variable NAME.
split_args() {
  SPLIT=()
  [[ -z $1 ]] && return 0
  eval "SPLIT=($1)" 2>/dev/null || die "$2 does not split into arguments: $1"
}

# --------------------------------------------------------------------------------------------
# --pack: copy the headers and write CMake package files whose paths are relative to
# themselves, so the folder works wherever it is copied to.

write_config() {  # name target include_subdir version dir
  local name=$1 target=$2 sub=$3 version=$4 dir=$5
  mkdir -p "$dir"
  cat >"$dir/${name}Config.cmake" <<EOF
# ${name} ${version} headers packed by bench/gpu_check.sh --pack. Paths are relative to this
# file, so the packed folder can move to another machine.
get_filename_component(_ddp_deps_root "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET ${target})
  add_library(${target} INTERFACE IMPORTED)
  set_target_properties(${target} PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "\${_ddp_deps_root}/include${sub}")
endif()
set(${name}_INCLUDE_DIR "\${_ddp_deps_root}/include${sub}")
unset(_ddp_deps_root)
EOF
  if [[ $name == Eigen3 ]]; then
    # The legacy variables Eigen's own config file sets.
    cat >>"$dir/${name}Config.cmake" <<EOF
set(EIGEN3_FOUND TRUE)
set(EIGEN3_INCLUDE_DIR "\${Eigen3_INCLUDE_DIR}")
set(EIGEN3_INCLUDE_DIRS "\${Eigen3_INCLUDE_DIR}")
set(EIGEN3_VERSION_STRING "${version}")
EOF
  fi
  # Both upstream version files accept the same major version only (Eigen's too).
  cat >"$dir/${name}ConfigVersion.cmake" <<EOF
# ${name} ${version} satisfies a request for any version up to it with the same major version.
set(PACKAGE_VERSION "${version}")
set(PACKAGE_VERSION_COMPATIBLE FALSE)
if(NOT PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
elseif(NOT PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION
       AND PACKAGE_FIND_VERSION_MAJOR STREQUAL "${version%%.*}")
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
EOF
}

define_version() {  # file macro -> value of "#define macro value"
  sed -n "s/^#define $2 \\([0-9][0-9]*\\).*/\\1/p" "$1" | head -n 1
}

pack_headers() {  # with_runtime [dest]
  local with_runtime=$1 dest=${2:-$DEPS}
  local eigen=${DDP_PACK_EIGEN:-/usr/include/eigen3} catch=${DDP_PACK_CATCH2:-/usr/include/catch2}
  [[ -f $eigen/Eigen/Core && -f $eigen/Eigen/src/Core/util/Macros.h ]] ||
    die "--pack: no Eigen headers in $eigen (apt-get install libeigen3-dev, or set DDP_PACK_EIGEN)"
  [[ -f $catch/catch.hpp ]] ||
    die "--pack: no $catch/catch.hpp (apt-get install catch2, or set DDP_PACK_CATCH2)"
  local macros=$eigen/Eigen/src/Core/util/Macros.h
  local ev cv
  ev="$(define_version "$macros" EIGEN_WORLD_VERSION).$(define_version "$macros" EIGEN_MAJOR_VERSION).$(define_version "$macros" EIGEN_MINOR_VERSION)"
  cv="$(define_version "$catch/catch.hpp" CATCH_VERSION_MAJOR).$(define_version "$catch/catch.hpp" CATCH_VERSION_MINOR).$(define_version "$catch/catch.hpp" CATCH_VERSION_PATCH)"
  [[ $ev =~ ^3\.[0-9]+\.[0-9]+$ ]] || die "--pack: cannot read Eigen's version from $macros ($ev)"
  [[ $cv =~ ^2\.[0-9]+\.[0-9]+$ ]] || die "--pack: $catch/catch.hpp is not Catch2 v2 ($cv)"
  if [[ -e $dest && ! -f $dest/$MARKER && -n $(ls -A "$dest" 2>/dev/null) ]]; then
    die "--pack: $dest exists and was not made by --pack; not overwriting it"
  fi
  local tmp=$dest.tmp.$$
  rm -rf "$tmp"
  mkdir -p "$tmp/include/eigen3" "$tmp/include/catch2" || die "--pack: cannot create $tmp"
  # shellcheck disable=SC2064 # $tmp is meant to be expanded now
  trap "rm -rf '$tmp'" EXIT
  if ((with_runtime)); then
    # The programs first: when the build fails, the folder there is left as it was.
    bash "$REPO/bench/pack_runtime.sh" "$tmp" || die "--pack: packing the runtime failed"
  fi
  # Eigen/ is what the project includes; unsupported/ (3 MB) is not used.
  cp -r "$eigen/Eigen" "$tmp/include/eigen3/" || die "--pack: copying Eigen failed"
  [[ -f $eigen/signature_of_eigen3_matrix_library ]] && cp "$eigen/signature_of_eigen3_matrix_library" "$tmp/include/eigen3/"
  cp "$catch"/*.hpp "$tmp/include/catch2/" || die "--pack: copying Catch2 failed"
  write_config Eigen3 Eigen3::Eigen /eigen3 "$ev" "$tmp/lib/cmake/Eigen3"
  write_config Catch2 Catch2::Catch2 "" "$cv" "$tmp/lib/cmake/Catch2"
  printf 'Eigen %s from %s\nCatch2 %s from %s\npacked %s by bench/gpu_check.sh --pack\n' \
    "$ev" "$eigen" "$cv" "$catch" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$tmp/$MARKER"
  # The packed runtime of an earlier --pack stays unless this pack makes a new one.
  if [[ -d $dest/runtime && ! -d $tmp/runtime ]]; then
    mv "$dest/runtime" "$tmp/runtime" || die "--pack: cannot keep $dest/runtime"
  fi
  rm -rf "$dest"
  mv "$tmp" "$dest" || die "--pack: cannot move $tmp to $dest"
  echo "packed Eigen $ev and Catch2 $cv into $dest ($(du -sh "$dest" | cut -f1) in all)"
  echo "on the GPU machine: DDP_DEPS=<that folder> bench/gpu_check.sh (default ./.gpu-deps)"
}

# --------------------------------------------------------------------------------------------
# Arguments

QUICK=""  # "", 1 (--quick) or 0 (--full); the default depends on the mode
case ${1:-} in
  --pack)
    pack_headers 1 "${2:-}"
    exit 0
    ;;
  --pack-headers)
    pack_headers 0 "${2:-}"
    exit 0
    ;;
  --quick) QUICK=1 ;;
  --full) QUICK=0 ;;
  -h | --help)
    sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  "") ;;
  *) die "unknown argument '$1' (try --help)" ;;
esac

CHECK_MODE=${DDP_CHECK_MODE:-auto}
case $CHECK_MODE in
  auto) [[ -f $DEPS/runtime/KIT ]] && CHECK_MODE=kit || CHECK_MODE=build ;;
  kit) [[ -f $DEPS/runtime/KIT ]] || die "DDP_CHECK_MODE=kit but there is no $DEPS/runtime/KIT (run --pack)" ;;
  build) ;;
  *) die "DDP_CHECK_MODE must be auto, kit or build (got '$CHECK_MODE')" ;;
esac
if [[ -z $QUICK ]]; then
  [[ $CHECK_MODE == kit ]] && QUICK=1 || QUICK=0
fi
BUILD=${DDP_BUILD_DIR:-$REPO/build-gpu-check}
ARCH=${DDP_CUDA_ARCH:-90}
MODE=${DDP_DEPS_MODE:-auto}
if [[ $CHECK_MODE == kit ]]; then
  BUDGET=${DDP_CHECK_BUDGET_S:-420}
else
  BUDGET=${DDP_CHECK_BUDGET_S:-345}
fi
LOGDIR=${OUT:-${BUILD%/}-logs}
[[ $MODE == auto || $MODE == packed || $MODE == system ]] ||
  die "DDP_DEPS_MODE must be auto, packed or system (got '$MODE')"
[[ $BUDGET =~ ^[0-9]+$ ]] || die "DDP_CHECK_BUDGET_S must be a number of seconds (got '$BUDGET')"
TRAIN_RESERVE=${DDP_TRAIN_BENCH_RESERVE_S:-240}
[[ $TRAIN_RESERVE =~ ^[0-9]+$ ]] ||
  die "DDP_TRAIN_BENCH_RESERVE_S must be a number of seconds (got '$TRAIN_RESERVE')"
mkdir -p "$LOGDIR" || die "cannot create the log folder $LOGDIR"

# --------------------------------------------------------------------------------------------
# Stages. Each runs under timeout(1) with min(its own limit, what is left of the budget).

START=$SECONDS
declare -a SUMMARY=()
STATUS=0  # worst so far: 0 ok, 77 skipped, 1 failed, 2 build failed

note() {  # stage result seconds; a '|' in the result would split its table cell
  SUMMARY+=("| $1 | ${2//|/,} | $3 |")
}

# Raises STATUS to $1 if that is worse (0 < 77 < 1 < 2).
severity() { case $1 in 0) echo 0 ;; 77) echo 1 ;; 1) echo 2 ;; *) echo 3 ;; esac }
worsen() {
  (($(severity "$1") > $(severity "$STATUS"))) && STATUS=$1
  return 0
}

# Seconds a stage may take: its own limit, capped by what is left of the budget less what later
# stages are promised (0: none left).
limit_for() {  # cap [reserve]
  local left=$((BUDGET - (SECONDS - START) - ${2:-0}))
  ((left < 5)) && left=0
  ((left < $1)) && echo "$left" || echo "$1"
}

# run_stage NAME LIMIT LOG CMD...: runs CMD with its output teed to LOG; sets RC and TOOK.
# RESERVE (seconds kept for later stages) applies when set.
run_stage() {
  local name=$1 cap=$2 log=$3
  shift 3
  local limit
  limit=$(limit_for "$cap" "${RESERVE:-0}")
  echo
  echo "=== $name (limit ${limit}s) ==="
  local t0=$SECONDS
  if ((limit == 0)); then
    RC=124
    TOOK=0
    echo "not run: the time budget (${BUDGET}s) is spent"
    return
  fi
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
  RC=${PIPESTATUS[0]}
  TOOK=$((SECONDS - t0))
  ((RC == 124 || RC == 137)) && echo "=== $name: TIMED OUT after ${limit}s ==="
  return 0
}

find_nvcc() {
  if [[ -n ${CUDACXX:-} && -x ${CUDACXX:-} ]]; then
    echo "$CUDACXX"
  elif command -v nvcc >/dev/null 2>&1; then
    command -v nvcc
  else
    local c
    for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
      [[ -x $c ]] && echo "$c" && return
    done
  fi
}

# CMake and ninja may come as Python packages (a virtual environment's bin/) that is not on PATH.
add_python_bin_to_path() {
  command -v cmake >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1 && return
  command -v python3 >/dev/null 2>&1 || return
  local bin
  bin=$(python3 -c 'import os, sys; print(os.path.dirname(sys.executable))' 2>/dev/null)
  [[ -n $bin && -d $bin ]] && PATH=$PATH:$bin
}

# The GPUs nvidia-smi lists (queries only); sets GPU (words for the summary) and HAVE_GPU.
probe_gpu() {
  GPU="no nvidia-smi"
  GPU_MODE=""
  HAVE_GPU=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 20 nvidia-smi -L || true
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu --format=csv || true
    GPU=$(timeout 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    if [[ -n $GPU ]]; then
      HAVE_GPU=1
      # Exclusive_Process admits one process per GPU: two ranks on one GPU cannot start there.
      GPU_MODE=$(timeout 20 nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -n 1)
      GPU="$GPU, compute mode ${GPU_MODE:-?}"
    else
      GPU="nvidia-smi found no GPU"
    fi
  fi
}

stage_environment() {
  echo "=== environment ==="
  echo "repository: $REPO"
  if [[ $CHECK_MODE == kit ]]; then
    echo "mode: kit (prebuilt programs from $DEPS/runtime)   logs: $LOGDIR   budget: ${BUDGET}s"
  else
    echo "mode: build   build: $BUILD   logs: $LOGDIR   CUDA architectures: $ARCH   budget: ${BUDGET}s"
  fi
  probe_gpu
  JOBS=$(nproc 2>/dev/null || echo 4)
  if [[ $CHECK_MODE == kit ]]; then
    note "environment" "${GPU:-?}; kit mode; ${JOBS} cores" 0
    return 0
  fi
  NVCC=$(find_nvcc)
  local nvcc_version="no nvcc"
  if [[ -n $NVCC ]]; then
    timeout 20 "$NVCC" --version || true
    nvcc_version=$(timeout 20 "$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p')
    export CUDACXX=$NVCC
  fi
  add_python_bin_to_path
  command -v cmake >/dev/null 2>&1 || die "cmake is not on PATH"
  cmake --version | head -n 1
  c++ --version 2>/dev/null | head -n 1 || true
  GENERATOR=()
  if command -v ninja >/dev/null 2>&1; then
    GENERATOR=(-G Ninja)
    echo "ninja $(ninja --version)"
  fi
  note "environment" "${GPU:-?}; ${nvcc_version:-?}; $(cmake --version | head -n 1); ${JOBS} cores" 0
}

# Which of Eigen3 and Catch2 v2 CMake finds on this machine (a CMake run with no languages: a
# second or so), the same requests as the project's find_package calls.
probe_system_deps() {
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/ddp-deps-probe.XXXXXX") || die "mktemp failed"
  cat >"$dir/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(ddp_deps_probe NONE)
find_package(Eigen3 3.3 NO_MODULE QUIET)
find_package(Catch2 2 QUIET)
message(STATUS "probe Eigen3 ${Eigen3_FOUND} ${Eigen3_DIR}")
message(STATUS "probe Catch2 ${Catch2_FOUND} ${Catch2_DIR}")
EOF
  local out
  out=$(timeout 60 cmake -S "$dir" -B "$dir/build" 2>&1)
  rm -rf "$dir"
  SYS_EIGEN=$(sed -En 's/^-- probe Eigen3 (1|ON|TRUE|YES) //p' <<<"$out")
  SYS_CATCH=$(sed -En 's/^-- probe Catch2 (1|ON|TRUE|YES) //p' <<<"$out")
}

stage_dependencies() {
  echo
  echo "=== dependencies (DDP_DEPS_MODE=$MODE, DDP_DEPS=$DEPS) ==="
  DEP_ARGS=()
  SYS_EIGEN=""
  SYS_CATCH=""
  [[ $MODE == auto ]] && probe_system_deps
  local eigen catch
  for pkg in Eigen3 Catch2; do
    local found
    [[ $pkg == Eigen3 ]] && found=$SYS_EIGEN || found=$SYS_CATCH
    local where
    if [[ $MODE == system || ($MODE == auto && -n $found) ]]; then
      where="system${found:+ ($found)}"
    else
      local dir=$DEPS/lib/cmake/$pkg
      if [[ ! -f $dir/${pkg}Config.cmake ]]; then
        echo "$pkg: not installed here and not packed in $DEPS"
        echo "  run 'bench/gpu_check.sh --pack' on a machine that has it and copy .gpu-deps here"
        note "dependencies" "**$pkg missing** (not found by CMake here, no $dir)" 0
        STATUS=2
        return 1
      fi
      DEP_ARGS+=("-D${pkg}_DIR=$dir")
      where="packed ($dir)"
    fi
    echo "$pkg: $where"
    [[ $pkg == Eigen3 ]] && eigen=$where || catch=$where
  done
  note "dependencies" "Eigen3: $eigen; Catch2: $catch" 0
}

failure() {  # exit status -> words for the summary
  case $1 in
    124 | 137) echo "**TIMED OUT** or not run (time budget)" ;;
    *) echo "**FAILED** (exit $1)" ;;
  esac
}

fresh_build_dir() {
  if [[ -e $BUILD ]]; then
    if [[ -f $BUILD/.ddp-gpu-check || -f $BUILD/CMakeCache.txt || -z $(ls -A "$BUILD") ]]; then
      rm -rf "$BUILD"
    else
      die "$BUILD exists and is not a build directory; set DDP_BUILD_DIR elsewhere"
    fi
  fi
  mkdir -p "$BUILD" && touch "$BUILD/.ddp-gpu-check"
}

stage_build() {
  fresh_build_dir
  : >"$LOGDIR/build.log"
  run_stage configure 120 "$LOGDIR/build.log" \
    cmake -S "$REPO" -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DDDP_KERNELS_ONLY=ON -DDDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DDDP_BUILD_TESTS=ON -DDDP_BUILD_BENCH=ON "${DEP_ARGS[@]}"
  if ((RC != 0)); then
    note configure "$(failure "$RC") ($LOGDIR/build.log)" "$TOOK"
    worsen 2
    return 1
  fi
  note configure "ok (CUDA architectures $ARCH)" "$TOOK"
  # Where the headers really came from: the configured package directories.
  grep -E '^(Eigen3|Catch2)_DIR:' "$BUILD/CMakeCache.txt" || true

  run_stage build 240 "$LOGDIR/build.log" \
    cmake --build "$BUILD" -j "$JOBS" --target ddp_cuda_tests ddp_bench_cuda_kernels
  if ((RC != 0)); then
    note build "$(failure "$RC") ($LOGDIR/build.log)" "$TOOK"
    worsen 2
    return 1
  fi
  note build "ok: ddp_cuda_tests, ddp_bench_cuda_kernels" "$TOOK"
  if [[ ${#GENERATOR[@]} -gt 0 ]]; then
    # The headers each object was compiled against, as ninja recorded them: the proof of which
    # Eigen and Catch2 were used.
    echo "headers used (ninja -t deps):"
    (cd "$BUILD" && ninja -t deps 2>/dev/null) |
      grep -E '/(Eigen/Core|catch2/catch\.hpp)$' | sed 's/^ *//' | sort -u | sed 's/^/  /'
  fi
}

executable() {  # name -> path of the built (or packed) program
  if [[ $CHECK_MODE == kit ]]; then
    [[ -x $DEPS/runtime/bin/$1 ]] && echo "$DEPS/runtime/bin/$1"
    return 0
  fi
  find "$BUILD" -type f -name "$1" -perm -u+x 2>/dev/null | head -n 1
}

# note_test NAME LOG: the summary line of a test program's run from RC and its log.
note_test() {
  local name=$1 log=$2 line
  line=$(grep -E '^(All tests passed|test cases:|skipped:)' "$log" | tail -n 1)
  case $RC in
    0) note "$name" "passed: ${line:-exit 0}" "$TOOK" ;;
    77)
      note "$name" "skipped (no GPU): ${line#skipped: }" "$TOOK"
      worsen 77
      ;;
    124 | 137)
      note "$name" "**TIMED OUT**" "$TOOK"
      worsen 1
      ;;
    *)
      note "$name" "**FAILED** (exit $RC): ${line:-see $(basename "$log")}" "$TOOK"
      worsen 1
      ;;
  esac
}

stage_tests() {
  local exe
  exe=$(executable ddp_cuda_tests)
  [[ -n $exe ]] || die "ddp_cuda_tests was not built"
  : >"$TESTLOG"
  run_stage ddp_cuda_tests 150 "$TESTLOG" "$exe" -r console -d yes
  note_test ddp_cuda_tests "$TESTLOG"
}

stage_bench() {
  local exe
  exe=$(executable ddp_bench_cuda_kernels)
  [[ -n $exe ]] || die "ddp_bench_cuda_kernels was not built"
  local args=()
  ((QUICK)) && args+=(--quick)
  split_args "${DDP_BENCH_ARGS:-}" DDP_BENCH_ARGS
  args+=("${SPLIT[@]}")
  rm -f "$LOGDIR/bench.csv"
  : >"$LOGDIR/bench.md"
  run_stage ddp_bench_cuda_kernels "${BENCH_CAP:-150}" "$LOGDIR/bench.md" \
    "$exe" "${args[@]}" --csv "$LOGDIR/bench.csv"
  local what="every result verified${args[*]:+ (${args[*]})}"
  case $RC in
    0) note ddp_bench_cuda_kernels "ok, $what" "$TOOK" ;;
    77)
      note ddp_bench_cuda_kernels "skipped (no GPU)" "$TOOK"
      worsen 77
      ;;
    124 | 137)
      note ddp_bench_cuda_kernels "**TIMED OUT** (partial results in bench.md)" "$TOOK"
      worsen 1
      ;;
    *)
      note ddp_bench_cuda_kernels "**FAILED** (exit $RC: a wrong result or an error)" "$TOOK"
      worsen 1
      ;;
  esac
}

# --------------------------------------------------------------------------------------------
# Kit mode: the packed programs, libraries and Open MPI (bench/pack_runtime.sh).

stage_kit() {
  echo
  echo "=== packed runtime ($DEPS/runtime) ==="
  sed -n '1,4p' "$DEPS/runtime/KIT"
  # shellcheck source=bench/pack_runtime.sh
  source "$REPO/bench/pack_runtime.sh"
  if ! ddp_kit_env "$DEPS/runtime"; then
    note "packed runtime" "**FAILED**: not a packed runtime (see gpu_check.log)" 0
    worsen 2
    return 1
  fi
  echo "NCCL: $DDP_KIT_NCCL"
  echo "cuBLAS: $DDP_KIT_CUBLAS"
  echo "libstdc++: $DDP_KIT_CXXRT"
  echo "mpirun: $(command -v mpirun) ($(mpirun --version 2>&1 | head -n 1))"
  # Every packed program must find every library it needs.
  local exe missing="" out
  for exe in "$DEPS"/runtime/bin/*; do
    command -v ldd >/dev/null 2>&1 || break
    out=$(ldd "$exe" 2>&1 | grep -E 'not found|No such file') || continue
    echo "$(basename "$exe"): $out"
    missing+=" $(basename "$exe")"
  done
  if [[ -n $missing ]]; then
    note "packed runtime" "**FAILED**: libraries missing for$missing (see gpu_check.log)" 0
    worsen 2
    return 1
  fi
  local nccl=$DDP_KIT_NCCL cublas=$DDP_KIT_CUBLAS
  # The version NCCL's file carries (libnccl.so.2.X.Y) is the one the programs load.
  [[ $nccl == none* ]] || nccl="$(basename "$(readlink -f "$nccl")") ($nccl)"
  [[ $nccl == none* ]] && nccl="stub (none on this machine)"
  [[ $cublas == none* ]] && cublas="stub (none on this machine)"
  note "packed runtime" "ok: $(sed -n 's/^size: //p' "$DEPS/runtime/KIT"), NCCL ${nccl}, cuBLAS ${cublas}, libstdc++ ${DDP_KIT_CXXRT%%:*}" 0
  kit_matches_tree
}

# The kit's programs were built from this tree's sources, or every result below is of other code:
# said loudly, in the summary, and the run cannot pass (it still runs: the machine's time is
# short, and the numbers are of the commit the kit names).
kit_matches_tree() {
  local packed here
  packed=$(sed -n 's/^sources: //p' "$DEPS/runtime/KIT")
  here=$(ddp_source_digest "$REPO")
  if [[ ${packed%% *} == "$here" ]]; then
    note "kit matches the tree" "yes: sources $packed" 0
    return 0
  fi
  echo "gpu_check.sh: WARNING: the kit was packed from other sources (${packed:-not stamped}) than this tree's ($here): re-pack it (bench/gpu_check.sh --pack)" >&2
  note "kit matches the tree" "**NO**: packed from ${packed:-unstamped sources}, the tree is $here; results are of the kit's code" 0
  worsen 1
}

# ddp-train on 2 CPU ranks from the kit: proves Open MPI, yaml-cpp and the rest start.
stage_mpi_smoke() {
  local log=$WORK/mpi_smoke.log
  : >"$log"
  run_stage "mpirun -n 2 ddp-train (cpu)" 60 "$log" \
    mpirun -n 2 --oversubscribe ddp-train --config "$REPO/configs/seed.yaml" --set device=cpu \
    --set training.epochs=2 --set "output.dir=$WORK/mpi_smoke"
  local done_line
  done_line=$(grep -m 1 '^done:' "$log" | cut -c1-90)
  if ((RC == 0)) && [[ -n $done_line ]]; then
    note "mpirun -n 2 ddp-train (cpu)" "ok: $done_line" "$TOOK"
  else
    note "mpirun -n 2 ddp-train (cpu)" "$(failure "$RC") (mpi_smoke.log)" "$TOOK"
    worsen 1
  fi
}

stage_gpu_tests() {  # ranks
  local n=$1 log=$WORK/gpu_tests_n$1.log exe
  exe=$(executable ddp_gpu_tests)
  [[ -n $exe ]] || die "ddp_gpu_tests was not packed"
  : >"$log"
  local flags=()
  ((n > 1)) && flags=(--oversubscribe)
  if ((n > 1)) && [[ $GPU_MODE == Exclusive_Process ]] && (($(nvidia-smi -L 2>/dev/null | wc -l) < n)); then
    note "mpirun -n $n ddp_gpu_tests" "skipped: compute mode Exclusive_Process admits one process per GPU, and there are fewer GPUs than $n ranks" 0
    return 0
  fi
  run_stage "mpirun -n $n ddp_gpu_tests" 100 "$log" mpirun -n "$n" "${flags[@]}" "$exe" -r console
  note_test "mpirun -n $n ddp_gpu_tests" "$log"
}

stage_train_bench() {
  if ((!HAVE_GPU)) && [[ ${DDP_BENCH_DEVICE:-cuda} == cuda ]]; then
    note gpu_train_bench "skipped (no GPU)" 0
    worsen 77
    return 0
  fi
  local log=$WORK/train_bench.log args=()
  split_args "${DDP_TRAIN_BENCH_ARGS:-}" DDP_TRAIN_BENCH_ARGS
  args=("${SPLIT[@]}")
  : >"$log"
  DDP_TRAIN=$(executable ddp-train) run_stage gpu_train_bench 300 "$log" \
    bash "$REPO/bench/gpu_train_bench.sh" --out "$WORK/train_bench" "${args[@]}"
  local f
  for f in train_bench.md train_bench.csv; do
    [[ -f $WORK/train_bench/$f ]] && cp "$WORK/train_bench/$f" "$LOGDIR/$f"
  done
  case $RC in
    0) note gpu_train_bench "ok (train_bench.md)" "$TOOK" ;;
    77)
      note gpu_train_bench "skipped (no GPU)" "$TOOK"
      worsen 77
      ;;
    *)
      note gpu_train_bench "$(failure "$RC") (train_bench.log in details.tar.gz)" "$TOOK"
      worsen 1
      ;;
  esac
}

# The benchmark's headline numbers, from its CSV.
bench_summary() {
  local csv=$LOGDIR/bench.csv
  [[ -s $csv ]] || return 0
  echo
  awk -F, '$1 == "ceiling" && $2 == "copy_d2d" { copy = $6 }
           $1 == "ceiling" && $2 == "cublas_sgemm" { sgemm = $6 }
           END { printf "measured ceilings: copy %.0f GB/s (read + written), cuBLAS SGEMM 4096^3 %.0f GFLOP/s\n",
                 copy, sgemm }' "$csv"
  if grep -q '^gemm,' "$csv"; then
    echo
    echo "| GEMM layer | product | m x n x k | ours/cuBLAS | % of fp32 peak | >= 0.70 |"
    echo "|---|---|---|---:|---:|---|"
    awk -F, '$1 == "gemm" { printf "| %s | %s | %s | %s | %s | %s |\n", $15, $2, $3,
             ($9 == "" ? "-" : sprintf("%.2f", $9)), ($10 == "" ? "-" : sprintf("%.1f", $10)),
             $12 }' "$csv"
  fi
  if grep -q '^gemm16,' "$csv"; then
    echo
    echo "| bf16 GEMM layer | product | m x n x k | ours/cuBLAS bf16 | >= 0.70 |"
    echo "|---|---|---|---:|---|"
    awk -F, '$1 == "gemm16" { printf "| %s | %s | %s | %s | %s |\n", $15, $2, $3,
             ($9 == "" ? "-" : sprintf("%.2f", $9)), $12 }' "$csv"
  fi
  if grep -q '^mem,' "$csv"; then
    echo
    echo "| op | shape | GB/s | % of copy | >= 80% |"
    echo "|---|---|---:|---:|---|"
    awk -F, '$1 == "mem" { printf "| %s | %s | %s | %s | %s |\n", $2, $3,
             ($6 == "" ? "-" : sprintf("%.0f", $6)), ($9 == "" ? "-" : sprintf("%.1f", 100 * $9)),
             $12 }' "$csv"
  fi
}

print_summary() {
  {
    echo
    echo "## gpu_check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), $((SECONDS - START)) s, $CHECK_MODE mode)"
    echo
    echo "| stage | result | seconds |"
    echo "|---|---|---:|"
    printf '%s\n' "${SUMMARY[@]}"
    bench_summary
    if [[ -s $LOGDIR/train_bench.md ]]; then
      echo
      cat "$LOGDIR/train_bench.md"
    fi
    echo
    case $STATUS in
      0) echo "result: PASSED" ;;
      77) echo "result: SKIPPED (no GPU): nothing failed, but the GPU stages could not run" ;;
      1) echo "result: FAILED" ;;
      *) echo "result: BUILD FAILED (or the packed runtime is unusable)" ;;
    esac
  } | tee "$LOGDIR/summary.md"
}

main_kit() {
  # Per-stage logs and outputs; they come back as one file (details.tar.gz), since only a few
  # files come back from a GPU machine.
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/ddp-gpu-check.XXXXXX") || die "mktemp failed"
  TESTLOG=$WORK/cuda_tests.log
  rm -f "$LOGDIR"/train_bench.md "$LOGDIR"/train_bench.csv "$LOGDIR"/details.tar.gz
  if stage_kit; then
    # The training benchmark is promised its time: the stages before it get what is left.
    RESERVE=$TRAIN_RESERVE
    stage_mpi_smoke
    stage_tests
    stage_gpu_tests 1
    stage_gpu_tests 2
    BENCH_CAP=100 stage_bench
    RESERVE=0
    stage_train_bench
  fi
  print_summary
  cp "$LOGDIR/summary.md" "$WORK/" 2>/dev/null
  cp "$DEPS/runtime/KIT" "$DEPS/runtime/RESOURCES" "$WORK/" 2>/dev/null
  # Run outputs without the model files (the trained weights are not wanted back).
  tar -czf "$LOGDIR/details.tar.gz" -C "$WORK" --exclude='*.safetensors' . 2>/dev/null ||
    echo "gpu_check.sh: could not write $LOGDIR/details.tar.gz"
  rm -rf "$WORK" "${DDP_KIT_LINKS:-}"
}

main() {
  stage_environment
  if [[ $CHECK_MODE == kit ]]; then
    main_kit
    return "$STATUS"
  fi
  TESTLOG=$LOGDIR/tests.log
  if stage_dependencies && stage_build; then
    stage_tests
    stage_bench
  fi
  print_summary
  return "$STATUS"
}

main 2>&1 | tee "$LOGDIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
