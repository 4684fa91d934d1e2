// Self-tests of the emulated warp matrix functions (cuda_emu_wmma.h) and 16-bit types
// (cuda_emu_fp16.h): the conversions against the project's own casts, mma_sync against a double
// reference in both formats and every operand layout, load/store round trips in both layouts
// with a leading dimension wider than the tile, and the faults a kernel breaking the guide's
// rules (a lane missing, a misaligned pointer, a bad ldm, a partial warp) must raise.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/float16.h"
#include "cuda_emu.h"
#include "cuda_emu_wmma.h"

namespace {

namespace wmma = nvcuda::wmma;
using Catch::Contains;

constexpr int kLd = 24;  // a leading dimension wider than the tile: padding the loads must skip

std::string fault_of(void (*run)()) {
  try {
    run();
  } catch (const ddp_emu::KernelFault& e) {
    return e.what();
  }
  return "no KernelFault";
}

// ----- 16-bit conversions ---------------------------------------------------------------------

// Random bit patterns of every binade and the special values.
std::vector<float> conversion_inputs() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          1e-8f,
                          5.96e-8f,
                          2.98e-8f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          3.0e38f,
                          1.0e-40f};
  std::mt19937 gen(5);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = gen();
    float f;
    std::memcpy(&f, &bits, sizeof f);
    v.push_back(f);
  }
  return v;
}

TEST_CASE("emulated 16-bit types round to nearest even as the project's casts do", "[emu][wmma]") {
  size_t wrong = 0;
  for (const float f : conversion_inputs()) {
    if (__float2bfloat16_rn(f).__x != ddp::float_to_bf16(f)) ++wrong;
    if (__float2half_rn(f).__x != ddp::float_to_fp16(f)) ++wrong;
  }
  CHECK(wrong == 0);
  // Decoding is exact for every pattern.
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<unsigned short>(h);
    const float b = __bfloat162float(__nv_bfloat16{bits});
    const float f = __half2float(__half{bits});
    if (ddp::float_bits(b) != ddp::float_bits(ddp::bf16_to_float(bits))) ++wrong;
    if (ddp::float_bits(f) != ddp::float_bits(ddp::fp16_to_float(bits)) &&
        !(std::isnan(f) && std::isnan(ddp::fp16_to_float(bits))))
      ++wrong;
  }
  CHECK(wrong == 0);
}

// ----- mma_sync against a double reference -------------------------------------------------

// A 16 x 16 operand tile in memory: element (r, c) at r * kLd + c (row major) or c * kLd + r.
template <class T>
struct alignas(32) Tile {
  T v[16 * kLd];
};
struct alignas(32) FloatTile {
  float v[16 * kLd];
};

template <class T, class LayoutA, class LayoutB>
__global__ void mma_kernel(const T* a, const T* b, const float* c, float* d, bool c_col_major) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::load_matrix_sync(fa, a, kLd);
  wmma::load_matrix_sync(fb, b, kLd);
  const wmma::layout_t cl = c_col_major ? wmma::mem_col_major : wmma::mem_row_major;
  wmma::load_matrix_sync(fc, c, kLd, cl);
  wmma::mma_sync(fc, fa, fb, fc);
  // Stored in the other layout than c was loaded in: the two layouts checked against each other.
  wmma::store_matrix_sync(d, fc, kLd, c_col_major ? wmma::mem_row_major : wmma::mem_col_major);
}

template <class T>
T encode(float f) {
  if constexpr (std::is_same<T, __half>::value) {
    return __float2half_rn(f);
  } else {
    return __float2bfloat16_rn(f);
  }
}
inline float decode(__half h) { return __half2float(h); }
inline float decode(__nv_bfloat16 h) { return __bfloat162float(h); }

// Fills a tile's 16 x 16 elements with random values and its padding with NaN; returns the
// values as a 16 x 16 row-major matrix of the logical operand.
template <class T>
std::vector<double> fill(Tile<T>& t, bool col_major, std::mt19937& gen) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (T& e : t.v) e = encode<T>(std::numeric_limits<float>::quiet_NaN());
  std::vector<double> m(256);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      const T e = encode<T>(dist(gen));
      t.v[col_major ? c * kLd + r : r * kLd + c] = e;
      m[r * 16 + c] = decode(e);
    }
  }
  return m;
}

template <class T, class LayoutA, class LayoutB>
void check_mma(std::mt19937& gen) {
  const bool a_col = std::is_same<LayoutA, wmma::col_major>::value;
  const bool b_col = std::is_same<LayoutB, wmma::col_major>::value;
  for (const bool c_col : {false, true}) {
    INFO("a " << (a_col ? "col" : "row") << "_major, b " << (b_col ? "col" : "row")
              << "_major, c in mem_" << (c_col ? "col" : "row") << "_major");
    static Tile<T> a, b;
    static FloatTile c, d;
    const std::vector<double> am = fill(a, a_col, gen), bm = fill(b, b_col, gen);
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    for (float& e : c.v) e = std::numeric_limits<float>::quiet_NaN();
    for (float& e : d.v) e = -1.0f;
    std::vector<double> cm(256);
    for (int r = 0; r < 16; ++r) {
      for (int k = 0; k < 16; ++k) {
        const float x = dist(gen);
        c.v[c_col ? k * kLd + r : r * kLd + k] = x;
        cm[r * 16 + k] = x;
      }
    }
    ddp_emu::launch(mma_kernel<T, LayoutA, LayoutB>, dim3(1), dim3(32), nullptr, a.v, b.v, c.v, d.v,
                    c_col);
    size_t wrong = 0;
    for (int r = 0; r < 16; ++r) {
      for (int col = 0; col < 16; ++col) {
        double ref = cm[r * 16 + col], magnitude = std::fabs(ref);
        for (int k = 0; k < 16; ++k) {
          ref += am[r * 16 + k] * bm[k * 16 + col];
          magnitude += std::fabs(am[r * 16 + k] * bm[k * 16 + col]);
        }
        // 16 float32 additions of exact products: each rounding at most half an ulp of the
        // running sum, which is at most the sum of magnitudes.
        const double tol = 16 * std::ldexp(1.0, -24) * magnitude;
        const float got = c_col ? d.v[r * kLd + col] : d.v[col * kLd + r];
        if (!(std::fabs(got - ref) <= tol)) ++wrong;
      }
    }
    CHECK(wrong == 0);
    // The padding between rows was neither read (NaN would spread) nor written.
    size_t padding = 0;
    for (int i = 0; i < 16 * kLd; ++i)
      if (i % kLd >= 16 && d.v[i] != -1.0f) ++padding;
    CHECK(padding == 0);
  }
}

TEST_CASE("wmma::mma_sync matches a double reference in bf16 and fp16, every layout",
          "[emu][wmma]") {
  std::mt19937 gen(11);
  check_mma<__nv_bfloat16, wmma::row_major, wmma::row_major>(gen);
  check_mma<__nv_bfloat16, wmma::row_major, wmma::col_major>(gen);
  check_mma<__nv_bfloat16, wmma::col_major, wmma::row_major>(gen);
  check_mma<__nv_bfloat16, wmma::col_major, wmma::col_major>(gen);
  check_mma<__half, wmma::row_major, wmma::col_major>(gen);
  check_mma<__half, wmma::col_major, wmma::row_major>(gen);
}

// ----- load/store round trips ------------------------------------------------------------------

// An operand through the identity: A·I and I·B give A and B back exactly (one exact product per
// element), stored row-major, whatever layout they were loaded in.
template <class LayoutA, class LayoutB>
__global__ void identity_kernel(const __nv_bfloat16* a, const __nv_bfloat16* identity,
                                const __nv_bfloat16* b, float* a_out, float* b_out) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> fa, fi_a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> fb, fi_b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(fa, a, kLd);
  wmma::load_matrix_sync(fi_b, identity, kLd);
  wmma::fill_fragment(acc, 0.0f);
  wmma::mma_sync(acc, fa, fi_b, acc);
  wmma::store_matrix_sync(a_out, acc, kLd, wmma::mem_row_major);
  wmma::load_matrix_sync(fi_a, identity, kLd);
  wmma::load_matrix_sync(fb, b, kLd);
  wmma::fill_fragment(acc, 0.0f);
  wmma::mma_sync(acc, fi_a, fb, acc);
  wmma::store_matrix_sync(b_out, acc, kLd, wmma::mem_row_major);
}

template <class LayoutA, class LayoutB>
void check_round_trip(std::mt19937& gen) {
  const bool a_col = std::is_same<LayoutA, wmma::col_major>::value;
  const bool b_col = std::is_same<LayoutB, wmma::col_major>::value;
  INFO("a " << (a_col ? "col" : "row") << "_major, b " << (b_col ? "col" : "row") << "_major");
  static Tile<__nv_bfloat16> a, b, identity;
  static FloatTile a_out, b_out;
  const std::vector<double> am = fill(a, a_col, gen), bm = fill(b, b_col, gen);
  for (auto& e : identity.v) e = __float2bfloat16_rn(std::numeric_limits<float>::quiet_NaN());
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      identity.v[r * kLd + c] = __float2bfloat16_rn(r == c ? 1.0f : 0.0f);
  ddp_emu::launch(identity_kernel<LayoutA, LayoutB>, dim3(1), dim3(32), nullptr, a.v, identity.v,
                  b.v, a_out.v, b_out.v);
  size_t wrong = 0;
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      if (a_out.v[r * kLd + c] != am[r * 16 + c]) ++wrong;
      if (b_out.v[r * kLd + c] != bm[r * 16 + c]) ++wrong;
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("wmma load/store round trips in both layouts with ldm wider than the tile",
          "[emu][wmma]") {
  std::mt19937 gen(12);
  check_round_trip<wmma::row_major, wmma::row_major>(gen);
  check_round_trip<wmma::col_major, wmma::col_major>(gen);
  check_round_trip<wmma::row_major, wmma::col_major>(gen);
}

// Accumulators: loaded row-major and stored column-major is the transpose, exactly.
__global__ void transpose_kernel(const float* in, float* out, unsigned ldm_in, unsigned ldm_out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::load_matrix_sync(f, in, ldm_in, wmma::mem_row_major);
  wmma::store_matrix_sync(out, f, ldm_out, wmma::mem_col_major);
}

TEST_CASE("wmma accumulators: a row-major load stored column-major is the transpose",
          "[emu][wmma]") {
  static FloatTile in, out;
  for (int i = 0; i < 16 * kLd; ++i) in.v[i] = static_cast<float>(i);
  for (float& e : out.v) e = -1.0f;
  ddp_emu::launch(transpose_kernel, dim3(1), dim3(32), nullptr, in.v, out.v, unsigned{kLd}, 16u);
  size_t wrong = 0;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      if (out.v[c * 16 + r] != in.v[r * kLd + c]) ++wrong;
  CHECK(wrong == 0);
}

// ----- what the guide leaves unspecified, and its rules ------------------------------------

// Writes what lane l holds in slot s to out[l * 8 + s].
__global__ void slots_kernel(const float* in, float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::load_matrix_sync(f, in, 16, wmma::mem_row_major);
  const unsigned lane = threadIdx.x % 32;
  for (int s = 0; s < f.num_elements; ++s) out[lane * 8 + s] = f.x[s];
}

TEST_CASE("wmma fragments hold every element once, in no obvious order", "[emu][wmma]") {
  static FloatTile in;
  static float out[256];
  for (int i = 0; i < 256; ++i) in.v[i] = static_cast<float>(i);
  ddp_emu::launch(slots_kernel, dim3(1), dim3(32), nullptr, in.v, out);
  std::vector<int> seen(256, 0);
  int in_place = 0, transposed = 0;
  for (int i = 0; i < 256; ++i) {
    const int e = static_cast<int>(out[i]);
    REQUIRE(e >= 0);
    REQUIRE(e < 256);
    ++seen[e];
    in_place += e == i;
    transposed += e == (i % 16) * 16 + i / 16;
  }
  CHECK(std::count(seen.begin(), seen.end(), 1) == 256);
  // A kernel that assumed row-major or column-major slots would misplace nearly everything.
  CHECK(in_place < 8);
  CHECK(transposed < 8);
}

__global__ void half_warp_kernel(const float* in, float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  if (threadIdx.x < 16) wmma::load_matrix_sync(f, in, 16, wmma::mem_row_major);
  (void)out;
}
__global__ void misaligned_kernel(const float* in, float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::load_matrix_sync(f, in + 4, 16, wmma::mem_row_major);
  (void)out;
}
__global__ void bad_ldm_kernel(const float* in, float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::fill_fragment(f, 1.0f);
  wmma::store_matrix_sync(out, f, 18, wmma::mem_row_major);
  (void)in;
}
__global__ void lane_pointer_kernel(const float* in, float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::load_matrix_sync(f, in + (threadIdx.x % 2) * 8, 16, wmma::mem_row_major);
  (void)out;
}

TEST_CASE("wmma rule violations throw KernelFault instead of computing", "[emu][wmma]") {
  static FloatTile in, out;
  static const float* src = in.v;
  static float* dst = out.v;
  const std::string half =
      fault_of([] { ddp_emu::launch(half_warp_kernel, dim3(1), dim3(32), nullptr, src, dst); });
  INFO(half);
  CHECK_THAT(half, Contains("wmma::load_matrix_sync()"));
  const std::string partial =
      fault_of([] { ddp_emu::launch(misaligned_kernel, dim3(1), dim3(16), nullptr, src, dst); });
  INFO(partial);
  CHECK_THAT(partial, Contains("need all 32 lanes"));
  const std::string misaligned =
      fault_of([] { ddp_emu::launch(misaligned_kernel, dim3(1), dim3(32), nullptr, src, dst); });
  INFO(misaligned);
  CHECK_THAT(misaligned, Contains("256-bit aligned"));
  const std::string ldm =
      fault_of([] { ddp_emu::launch(bad_ldm_kernel, dim3(1), dim3(32), nullptr, src, dst); });
  INFO(ldm);
  CHECK_THAT(ldm, Contains("ldm 18"));
  const std::string lanes =
      fault_of([] { ddp_emu::launch(lane_pointer_kernel, dim3(1), dim3(32), nullptr, src, dst); });
  INFO(lanes);
  CHECK_THAT(lanes, Contains("different pointers"));
}

}  // namespace
