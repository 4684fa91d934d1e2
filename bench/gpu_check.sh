#!/usr/bin/env bash
# gpu_check.sh: the one command to run on a GPU machine. Builds the kernel library's CUDA tests
# and ddp_bench_cuda_kernels in a fresh DDP_KERNELS_ONLY build, runs both under time limits
# (the whole run stays under 6 minutes) and ends with a short summary table.
#
# usage: bench/gpu_check.sh [--quick]    build, test, benchmark (--quick: the benchmark's)
#        bench/gpu_check.sh --pack [DIR] here, where Debian's libeigen3-dev and catch2 are
#                                        installed: pack their headers into DIR (default
#                                        $DDP_DEPS or ./.gpu-deps) for a machine without them
#
# Environment:
#   DDP_DEPS         packed headers (default ./.gpu-deps); used for whichever of Eigen3 and
#                    Catch2 v2 CMake cannot find on the machine itself
#   DDP_DEPS_MODE    auto (default) | packed (both from DDP_DEPS) | system (never DDP_DEPS)
#   DDP_CUDA_ARCH    CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200)
#   DDP_BUILD_DIR    build directory, deleted and made afresh (default ./build-gpu-check)
#   DDP_BENCH_ARGS   extra arguments for ddp_bench_cuda_kernels (e.g. "--only gemm")
#   DDP_CHECK_BUDGET_S  seconds for the whole run (default 345); each stage has its own
#                    limit as well and gets at most what is left
#   OUT              if set, every log goes there (gpu_check.log, build.log, tests.log,
#                    bench.md, bench.csv, summary.md); else to <build dir>-logs
# Exit status: 0 all passed, 1 a test failed or a result was wrong or a stage timed out,
# 2 configure or build failed, 77 nothing failed but there is no GPU (tests and benchmark
# skipped). It only reads the GPU's state (nvidia-smi -L / --query-gpu): it changes no setting.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=${DDP_DEPS:-$REPO/.gpu-deps}
MARKER=DDP_GPU_DEPS

die() {
  echo "gpu_check.sh: $*" >&2
  exit 2
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

pack() {
  local dest=${1:-$DEPS}
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
  # Eigen/ is what the project includes; unsupported/ (3 MB) is not used.
  cp -r "$eigen/Eigen" "$tmp/include/eigen3/" || die "--pack: copying Eigen failed"
  [[ -f $eigen/signature_of_eigen3_matrix_library ]] && cp "$eigen/signature_of_eigen3_matrix_library" "$tmp/include/eigen3/"
  cp "$catch"/*.hpp "$tmp/include/catch2/" || die "--pack: copying Catch2 failed"
  write_config Eigen3 Eigen3::Eigen /eigen3 "$ev" "$tmp/lib/cmake/Eigen3"
  write_config Catch2 Catch2::Catch2 "" "$cv" "$tmp/lib/cmake/Catch2"
  printf 'Eigen %s from %s\nCatch2 %s from %s\npacked %s by bench/gpu_check.sh --pack\n' \
    "$ev" "$eigen" "$cv" "$catch" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$tmp/$MARKER"
  rm -rf "$dest"
  mv "$tmp" "$dest" || die "--pack: cannot move $tmp to $dest"
  echo "packed Eigen $ev and Catch2 $cv into $dest ($(du -sh "$dest" | cut -f1))"
  echo "on the GPU machine: DDP_DEPS=<that folder> bench/gpu_check.sh (default ./.gpu-deps)"
}

# --------------------------------------------------------------------------------------------
# Arguments

QUICK=0
case ${1:-} in
  --pack)
    pack "${2:-}"
    exit 0
    ;;
  --quick) QUICK=1 ;;
  -h | --help)
    sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  "") ;;
  *) die "unknown argument '$1' (try --help)" ;;
esac

BUILD=${DDP_BUILD_DIR:-$REPO/build-gpu-check}
ARCH=${DDP_CUDA_ARCH:-90}
MODE=${DDP_DEPS_MODE:-auto}
BUDGET=${DDP_CHECK_BUDGET_S:-345}
LOGDIR=${OUT:-${BUILD%/}-logs}
[[ $MODE == auto || $MODE == packed || $MODE == system ]] ||
  die "DDP_DEPS_MODE must be auto, packed or system (got '$MODE')"
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

# Seconds a stage may take: its own limit, capped by what is left of the budget (0: none left).
limit_for() {
  local left=$((BUDGET - (SECONDS - START)))
  ((left < 5)) && left=0
  ((left < $1)) && echo "$left" || echo "$1"
}

# run_stage NAME LIMIT LOG CMD...: runs CMD with its output teed to LOG; sets RC and TOOK.
run_stage() {
  local name=$1 cap=$2 log=$3
  shift 3
  local limit
  limit=$(limit_for "$cap")
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

stage_environment() {
  echo "=== environment ==="
  echo "repository: $REPO"
  echo "build: $BUILD   logs: $LOGDIR   CUDA architectures: $ARCH   budget: ${BUDGET}s"
  local gpu="no nvidia-smi"
  if command -v nvidia-smi >/dev/null 2>&1; then
    # Queries only.
    timeout 20 nvidia-smi -L || true
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu --format=csv || true
    gpu=$(timeout 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    [[ -n $gpu ]] || gpu="nvidia-smi found no GPU"
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
  JOBS=$(nproc 2>/dev/null || echo 4)
  note "environment" "${gpu:-?}; ${nvcc_version:-?}; $(cmake --version | head -n 1); ${JOBS} cores" 0
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

executable() {  # name -> path of the built program
  find "$BUILD" -type f -name "$1" -perm -u+x 2>/dev/null | head -n 1
}

stage_tests() {
  local exe
  exe=$(executable ddp_cuda_tests)
  [[ -n $exe ]] || die "ddp_cuda_tests was not built"
  : >"$LOGDIR/tests.log"
  run_stage ddp_cuda_tests 150 "$LOGDIR/tests.log" "$exe" -r console -d yes
  local line
  line=$(grep -E '^(All tests passed|test cases:|skipped:)' "$LOGDIR/tests.log" | tail -n 1)
  case $RC in
    0) note ddp_cuda_tests "passed: ${line:-exit 0}" "$TOOK" ;;
    77)
      note ddp_cuda_tests "skipped (no GPU): ${line#skipped: }" "$TOOK"
      worsen 77
      ;;
    124 | 137)
      note ddp_cuda_tests "**TIMED OUT**" "$TOOK"
      worsen 1
      ;;
    *)
      note ddp_cuda_tests "**FAILED** (exit $RC): ${line:-see tests.log}" "$TOOK"
      worsen 1
      ;;
  esac
}

stage_bench() {
  local exe
  exe=$(executable ddp_bench_cuda_kernels)
  [[ -n $exe ]] || die "ddp_bench_cuda_kernels was not built"
  local args=()
  ((QUICK)) && args+=(--quick)
  # shellcheck disable=SC2206 # word splitting of the user's extra arguments is intended
  [[ -n ${DDP_BENCH_ARGS:-} ]] && args+=(${DDP_BENCH_ARGS})
  rm -f "$LOGDIR/bench.csv"
  : >"$LOGDIR/bench.md"
  run_stage ddp_bench_cuda_kernels 150 "$LOGDIR/bench.md" \
    "$exe" "${args[@]}" --csv "$LOGDIR/bench.csv"
  case $RC in
    0) note ddp_bench_cuda_kernels "ok, every result verified" "$TOOK" ;;
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
    echo "## gpu_check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), $((SECONDS - START)) s)"
    echo
    echo "| stage | result | seconds |"
    echo "|---|---|---:|"
    printf '%s\n' "${SUMMARY[@]}"
    bench_summary
    echo
    case $STATUS in
      0) echo "result: PASSED" ;;
      77) echo "result: SKIPPED (no GPU): built, but nothing could run" ;;
      1) echo "result: FAILED" ;;
      *) echo "result: BUILD FAILED" ;;
    esac
  } | tee "$LOGDIR/summary.md"
}

main() {
  stage_environment
  if stage_dependencies && stage_build; then
    stage_tests
    stage_bench
  fi
  print_summary
  return "$STATUS"
}

main 2>&1 | tee "$LOGDIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
