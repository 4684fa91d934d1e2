// The subset of mma.h (nvcuda::wmma, the CUDA C++ Programming Guide's "Warp Matrix Functions")
// the kernels use, for the CPU emulation: m16n16k16 fragments of __nv_bfloat16 or __half
// operands (matrix_a, matrix_b; row_major or col_major) and float accumulators,
// fill_fragment, load_matrix_sync, mma_sync and store_matrix_sync. What the guide leaves open is
// chosen so that a kernel relying on more than it promises fails here:
// - The mapping of matrix elements to the lanes and slots of a fragment is unspecified; here it
//   is a scrambled bijection, different for matrix_a, matrix_b and the accumulator, so a kernel
//   that reads or writes fragment.x[] as if it knew which element is where gets wrong results.
//   (Elementwise work that is the same for every element, such as scaling x[i], stays right.)
// - The *_sync functions are warp-collective: all 32 lanes of a full warp must call them with
//   the same pointer, leading dimension and layout (ddp_emu::detail::warp_all_gather, the
//   emulation's warp barrier: a lane missing, another warp operation or a partial warp fault
//   like a divergent shuffle). The pointer must be 256-bit aligned and ldm a multiple of 16
//   bytes' worth of elements (8 for 16-bit types, 4 for float), as the guide requires.
// - mma_sync accumulates in float32: each product of two 16-bit values is exact in float32,
//   added to c one k at a time (a device's order of addition is unspecified too).
#pragma once

#if defined(__CUDACC__)
#error "cuda_emu_wmma.h is for host compilers; nvcc must use <mma.h>"
#endif

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_emu.h"
#include "cuda_emu_fp16.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

constexpr int kDim = 16;
constexpr int kSlots = 8;  // 256 elements over 32 lanes

template <class Use>
constexpr unsigned scramble_offset() {
  return std::is_same<Use, matrix_a>::value ? 13u : std::is_same<Use, matrix_b>::value ? 101u : 59u;
}
constexpr unsigned kScramble = 77u;  // odd: a bijection of [0, 256)
constexpr unsigned inverse_mod256(unsigned a) {
  unsigned x = 1;
  for (int i = 0; i < 8; ++i) x = (x * (2u - a * x)) & 255u;  // Newton: doubles correct bits
  return x;
}
static_assert((kScramble * inverse_mod256(kScramble) & 255u) == 1u, "not an inverse");

/// The element (row, col) that slot `slot` of lane `lane` holds, in a fragment for `Use`.
template <class Use>
inline void element_of(unsigned lane, unsigned slot, int& row, int& col) {
  const unsigned p = slot * 32u + lane;
  const unsigned idx = ((p - scramble_offset<Use>()) * inverse_mod256(kScramble)) & 255u;
  row = static_cast<int>(idx / kDim);
  col = static_cast<int>(idx % kDim);
}

inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float to_float(__half v) { return __half2float(v); }
inline float to_float(float v) { return v; }

// The calling thread's lane: its linear index in the block, modulo the warp size.
inline unsigned lane_id() {
  return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32u;
}

// What every lane of a warp must pass alike to a *_sync call.
struct SyncArgs {
  uintptr_t ptr;
  unsigned ldm;
  int layout;
};

[[noreturn]] inline void refuse(const char* call, const std::string& why) {
  throw std::invalid_argument(std::string("nvcuda::wmma::") + call + ": " + why);
}

// The warp meets; all lanes' arguments must agree and fit the guide's rules.
inline void meet_with(::ddp_emu::detail::WarpOp op, const char* call, const SyncArgs& mine,
                      unsigned elem_bytes, const char* file, int line) {
  SyncArgs all[32];
  ::ddp_emu::detail::warp_all_gather(op, &mine, sizeof mine, all, file, line);
  for (const SyncArgs& a : all) {
    if (a.ptr != mine.ptr || a.ldm != mine.ldm || a.layout != mine.layout)
      refuse(call, "the lanes of a warp passed different pointers, ldm or layouts");
  }
  if (mine.ptr % 32 != 0) refuse(call, "the pointer is not 256-bit aligned");
  if (mine.ldm % (16 / elem_bytes) != 0 || mine.ldm < kDim)
    refuse(call, "ldm " + std::to_string(mine.ldm) +
                     " is not a multiple of 16 bytes' elements (or < 16)");
}

template <class Use, class Layout>
constexpr int layout_code() {
  return std::is_same<Layout, col_major>::value ? 1 : 0;
}

}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has m16n16k16 fragments only");
  static_assert(
      std::is_same<Use, accumulator>::value
          ? std::is_same<T, float>::value && std::is_void<Layout>::value
          : (std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value) &&
                (std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value),
      "operands: __nv_bfloat16 or __half with row_major or col_major; accumulator: float");

 public:
  using element_type = T;
  enum { num_elements = detail::kSlots };
  T x[detail::kSlots];
};

template <class Use, int M, int N, int K, class T, class Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const T& v) {
  for (T& e : f.x) e = v;
}

/// Operand fragment: A(r, k) / B(k, c) = mptr[row * ldm + col] in row_major, mptr[col * ldm +
/// row] in col_major (row, col: the matrix's own indices).
template <class Use, class T, class Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* mptr, unsigned ldm,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  detail::meet_with(::ddp_emu::detail::WarpOp::kWmmaLoad, "load_matrix_sync",
                    {reinterpret_cast<uintptr_t>(mptr), ldm, detail::layout_code<Use, Layout>()},
                    sizeof(T), file, line);
  const unsigned lane = detail::lane_id();
  for (unsigned s = 0; s < detail::kSlots; ++s) {
    int r, c;
    detail::element_of<Use>(lane, s, r, c);
    const bool row_major_mem = std::is_same<Layout, row_major>::value;
    f.x[s] = row_major_mem ? mptr[r * ldm + c] : mptr[c * ldm + r];
  }
}

/// Accumulator fragment from memory in `layout`.
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* mptr,
                             unsigned ldm, layout_t layout, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  detail::meet_with(::ddp_emu::detail::WarpOp::kWmmaLoad, "load_matrix_sync",
                    {reinterpret_cast<uintptr_t>(mptr), ldm, static_cast<int>(layout)},
                    sizeof(float), file, line);
  const unsigned lane = detail::lane_id();
  for (unsigned s = 0; s < detail::kSlots; ++s) {
    int r, c;
    detail::element_of<accumulator>(lane, s, r, c);
    f.x[s] = layout == mem_row_major ? mptr[r * ldm + c] : mptr[c * ldm + r];
  }
}

inline void store_matrix_sync(float* mptr, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  detail::meet_with(::ddp_emu::detail::WarpOp::kWmmaStore, "store_matrix_sync",
                    {reinterpret_cast<uintptr_t>(mptr), ldm, static_cast<int>(layout)},
                    sizeof(float), file, line);
  const unsigned lane = detail::lane_id();
  for (unsigned s = 0; s < detail::kSlots; ++s) {
    int r, c;
    detail::element_of<accumulator>(lane, s, r, c);
    (layout == mem_row_major ? mptr[r * ldm + c] : mptr[c * ldm + r]) = f.x[s];
  }
}

/// d = a·b + c, in float32: each lane gathers the warp's fragments of a and b, then sums the 16
/// exact products of each of its elements onto c in k order.
template <class T, class LayoutA, class LayoutB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c, bool satf = false,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  if (satf) detail::refuse("mma_sync", "satf is not emulated");
  struct Operands {
    T a[detail::kSlots], b[detail::kSlots];
  } mine, all[32];
  for (int s = 0; s < detail::kSlots; ++s) mine.a[s] = a.x[s], mine.b[s] = b.x[s];
  ::ddp_emu::detail::warp_all_gather(::ddp_emu::detail::WarpOp::kWmmaMma, &mine, sizeof mine, all,
                                     file, line);
  float am[16][16], bm[16][16];
  for (unsigned lane = 0; lane < 32; ++lane) {
    for (unsigned s = 0; s < detail::kSlots; ++s) {
      int r, k;
      detail::element_of<matrix_a>(lane, s, r, k);
      am[r][k] = detail::to_float(all[lane].a[s]);
      detail::element_of<matrix_b>(lane, s, k, r);
      bm[k][r] = detail::to_float(all[lane].b[s]);
    }
  }
  const unsigned me = detail::lane_id();
  for (unsigned s = 0; s < detail::kSlots; ++s) {
    int r, col;
    detail::element_of<accumulator>(me, s, r, col);
    float acc = c.x[s];
    for (int k = 0; k < 16; ++k) acc = __fadd_rn(acc, am[r][k] * bm[k][col]);
    d.x[s] = acc;
  }
}

}  // namespace wmma
}  // namespace nvcuda
