// <Eigen/Core> for the CPU backend and the benchmarks that time it against plain Eigen.
// GCC 12.1-12.2 report false "may be used uninitialized" warnings from their own AVX-512
// intrinsics headers under -march=native (gcc.gnu.org/bugzilla PR105593, fixed in 12.3). Include
// this before anything that pulls in <immintrin.h>, so the suppression covers those headers and
// applies to nothing of ours.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
