// oneDNN's matmul (src/kernels/cpu/onednn_matmul.h) against a double-precision reference over
// the same operand values (bf16 operands rounded first): every transpose, operand and result
// type and epilogue at odd shapes, the same bits on every call, one thread, and the errors. A
// build without oneDNN checks only that it says so.
#include <time.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/float16.h"
#include "kernels/cpu/onednn_matmul.h"
#include "test_helpers.h"

namespace {

using ddp::cpu::MatmulShape;
using ddp::cpu::MatType;
using ddp::cpu::OnednnMatmul;

/// A matrix stored as `type`, and the values it holds (after rounding to bf16) in double.
struct Stored {
  MatType type = MatType::F32;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<double> values;

  const void* data() const {
    return type == MatType::F32 ? static_cast<const void*>(f32.data()) : bf16.data();
  }
  void* data() { return type == MatType::F32 ? static_cast<void*>(f32.data()) : bf16.data(); }
  double at(size_t i) const { return type == MatType::F32 ? f32[i] : ddp::bf16_to_float(bf16[i]); }
};

Stored random_stored(int64_t n, MatType type, uint64_t seed) {
  Stored s;
  s.type = type;
  s.f32 = ddp_test::random_vector(static_cast<size_t>(n), seed);
  if (type == MatType::BF16) {
    for (float v : s.f32) s.bf16.push_back(ddp::float_to_bf16(v));
  }
  for (size_t i = 0; i < s.f32.size(); ++i) s.values.push_back(s.at(i));
  return s;
}

/// Element (row, col) of op(X) for X stored row-major as [rows, cols], or as [cols, rows] when
/// transposed.
double op_at(const Stored& x, bool transposed, int64_t rows, int64_t cols, int64_t r, int64_t c) {
  return x.values[static_cast<size_t>(transposed ? c * rows + r : r * cols + c)];
}

/// The exact result of one element, and the bound on its float32 error: every product and sum
/// (k of them, plus the bias and the accumulated C) rounds with at most 2^-23 relative error
/// of the running magnitude, which never exceeds Σ|a||b| + |bias| + |c|.
struct Expected {
  double value = 0.0;
  double bound = 0.0;
};

Expected expected_at(const MatmulShape& s, const Stored& a, const Stored& b,
                     const std::vector<float>& bias, const std::vector<float>& c0, int64_t i,
                     int64_t j) {
  double sum = 0.0, magnitude = 0.0;
  for (int64_t p = 0; p < s.k; ++p) {
    const double prod = op_at(a, s.trans_a, s.m, s.k, i, p) * op_at(b, s.trans_b, s.k, s.n, p, j);
    sum += prod;
    magnitude += std::fabs(prod);
  }
  int64_t roundings = s.k;
  if (s.bias) {
    sum += bias[static_cast<size_t>(j)];
    magnitude += std::fabs(bias[static_cast<size_t>(j)]);
    ++roundings;
  }
  if (s.accumulate) {
    sum += c0[static_cast<size_t>(i * s.n + j)];
    magnitude += std::fabs(c0[static_cast<size_t>(i * s.n + j)]);
    ++roundings;
  }
  // ReLU moves no value further from another: the bound carries over.
  if (s.relu) sum = std::fmax(sum, 0.0);
  Expected e{sum, static_cast<double>(roundings) * 0x1.0p-23 * magnitude};
  // Rounding the result to bf16 adds at most half its ulp, 2^-8 of its magnitude.
  if (s.c == MatType::BF16) e.bound += 0x1.0p-8 * (std::fabs(sum) + e.bound);
  return e;
}

std::string describe(const MatmulShape& s) {
  auto name = [](MatType t) { return t == MatType::F32 ? "f32" : "bf16"; };
  return std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n) +
         " trans_a=" + std::to_string(s.trans_a) + " trans_b=" + std::to_string(s.trans_b) + " " +
         name(s.a) + "->" + name(s.c) + " bias=" + std::to_string(s.bias) +
         " relu=" + std::to_string(s.relu) + " accumulate=" + std::to_string(s.accumulate);
}

/// The operands and the result buffer of one case; run() can be repeated on the same inputs.
struct Case {
  MatmulShape s;
  Stored a, b, c0;
  std::vector<float> bias;

  explicit Case(const MatmulShape& shape) : s(shape) {
    a = random_stored(s.m * s.k, s.a, 1);
    b = random_stored(s.k * s.n, s.b, 2);
    c0 = random_stored(s.m * s.n, s.c, 3);  // what accumulate adds to (F32 only)
    bias = ddp_test::random_vector(static_cast<size_t>(s.n), 4);
  }
  Stored run(OnednnMatmul& mm) const {
    Stored c = c0;
    mm.run(s, a.data(), b.data(), s.bias ? bias.data() : nullptr, c.data());
    return c;
  }
};

void check_against_reference(const Case& cs, const Stored& c) {
  const MatmulShape& s = cs.s;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      const Expected e = expected_at(s, cs.a, cs.b, cs.bias, cs.c0.f32, i, j);
      const double got = c.at(static_cast<size_t>(i * s.n + j));
      if (std::fabs(got - e.value) <= e.bound) continue;  // fast path: no Catch bookkeeping
      INFO(describe(s) << " at (" << i << "," << j << "): got " << got << " expected " << e.value
                       << " bound " << e.bound);
      REQUIRE(std::fabs(got - e.value) <= e.bound);
    }
  }
}

bool same_bits(const Stored& x, const Stored& y) {
  if (x.type == MatType::F32) return std::memcmp(x.f32.data(), y.f32.data(), x.f32.size() * 4) == 0;
  return x.bf16 == y.bf16;
}

/// Every epilogue the interface allows: none, bias, relu, both, and (f32 result) accumulate.
std::vector<MatmulShape> epilogues(MatmulShape s) {
  std::vector<MatmulShape> out;
  for (bool bias : {false, true}) {
    for (bool relu : {false, true}) {
      s.bias = bias;
      s.relu = relu;
      out.push_back(s);
    }
  }
  if (s.c == MatType::F32) {
    s.bias = s.relu = false;
    s.accumulate = true;
    out.push_back(s);
  }
  return out;
}

/// Every transpose, operand type, result type and epilogue of one m x k x n GEMM that oneDNN
/// 2.6 implements: bf16 results only from bf16 operands (see the refusal case below).
std::vector<MatmulShape> all_variants(int64_t m, int64_t k, int64_t n) {
  std::vector<MatmulShape> out;
  for (int t = 0; t < 4; ++t) {
    for (MatType ab : {MatType::F32, MatType::BF16}) {
      for (MatType c : {MatType::F32, MatType::BF16}) {
        if (ab == MatType::F32 && c == MatType::BF16) continue;
        MatmulShape s;
        s.m = m, s.k = k, s.n = n;
        s.trans_a = t & 1, s.trans_b = t & 2;
        s.a = s.b = ab;
        s.c = c;
        for (const MatmulShape& e : epilogues(s)) out.push_back(e);
      }
    }
  }
  return out;
}

bool skip_unbuilt() {
  if (ddp::cpu::onednn_built()) return false;
  WARN("this build has no oneDNN: only its refusal is tested");
  return true;
}

}  // namespace

TEST_CASE("onednn matmul without oneDNN says so and refuses to run", "[kernels][onednn]") {
  if (ddp::cpu::onednn_built()) {
    SUCCEED("built with oneDNN: the other cases test it");
    return;
  }
  CHECK(ddp::cpu::onednn_native_bf16_isa().empty());
  OnednnMatmul mm;
  MatmulShape s;
  s.m = s.n = s.k = 1;
  float a = 1, b = 1, c = 0;
  CHECK(ddp_test::error_of([&] { mm.run(s, &a, &b, nullptr, &c); }) == "this build has no oneDNN");
}

TEST_CASE("onednn matmul matches the double reference for every variant and odd shape",
          "[kernels][onednn]") {
  if (skip_unbuilt()) return;
  const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 129}, {256, 784, 256}};
  // One object for every variant: a cache key missing a field would run the wrong primitive.
  OnednnMatmul mm;
  for (const auto& mkn : shapes) {
    for (const MatmulShape& s : all_variants(mkn[0], mkn[1], mkn[2])) {
      const Case cs(s);
      const Stored first = cs.run(mm);
      check_against_reference(cs, first);
      // Again with the cached primitive, and with a fresh one: the same bits.
      INFO(describe(s));
      CHECK(same_bits(first, cs.run(mm)));
      OnednnMatmul fresh;
      CHECK(same_bits(first, cs.run(fresh)));
    }
  }
}

TEST_CASE("onednn matmul runs on one thread", "[kernels][onednn]") {
  if (skip_unbuilt()) return;
  if (std::thread::hardware_concurrency() < 2) WARN("one core: this check cannot fail here");
  MatmulShape s;
  s.m = s.n = s.k = 1024;
  const Case cs(s);
  OnednnMatmul mm;
  cs.run(mm);  // builds the primitive: only execution is timed
  auto cpu_now = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  auto wall_now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  const double cpu0 = cpu_now(), wall0 = wall_now();
  for (int i = 0; i < 3; ++i) cs.run(mm);
  const double cpu = cpu_now() - cpu0, wall = wall_now() - wall0;
  // More threads would burn CPU time faster than the clock on the wall advances (the process's
  // CPU time counts every thread); waiting for a busy machine only lowers the ratio.
  INFO("process CPU " << cpu << " s over " << wall << " s of wall time");
  CHECK(cpu <= 1.2 * wall + 0.01);
}

TEST_CASE("onednn matmul refuses bad shapes, naming them", "[kernels][onednn]") {
  if (skip_unbuilt()) return;
  OnednnMatmul mm;
  std::vector<float> a(15, 1.0f), b(35, 1.0f), c(21, 0.0f), bias(7, 0.0f);
  MatmulShape s;
  s.m = 3, s.k = 5, s.n = 7;
  s.c = MatType::BF16;
  s.accumulate = true;
  using Catch::Contains;
  CHECK_THAT(ddp_test::error_of([&] { mm.run(s, a.data(), b.data(), nullptr, c.data()); }),
             Contains("oneDNN matmul [3,5]x[5,7] f32->bf16 (accumulate): accumulate needs"));
  s = MatmulShape{};
  s.m = 3, s.k = 5, s.n = 7;
  s.bias = true;
  CHECK_THAT(ddp_test::error_of([&] { mm.run(s, a.data(), b.data(), nullptr, c.data()); }),
             Contains("oneDNN matmul [3,5]x[5,7] f32->f32 (bias): bias pointer"));
  s.bias = false;
  s.n = 0;
  CHECK_THAT(ddp_test::error_of([&] { mm.run(s, a.data(), b.data(), nullptr, c.data()); }),
             Contains("dimensions must be positive"));
}

TEST_CASE("onednn matmul passes on oneDNN's refusals, naming the shape", "[kernels][onednn]") {
  if (skip_unbuilt()) return;
  OnednnMatmul mm;
  MatmulShape s;
  s.m = 3, s.k = 5, s.n = 7;
  s.trans_b = true;
  s.c = MatType::BF16;  // oneDNN 2.6 rounds to bf16 only from bf16 operands
  const Case f32_to_bf16(s);
  CHECK_THAT(ddp_test::error_of([&] { f32_to_bf16.run(mm); }),
             Catch::Contains("oneDNN matmul [3,5]x[5,7] f32->bf16 (trans_b): could not create"));
  s.c = MatType::F32;
  s.b = MatType::BF16;  // and takes no mixed operands
  const Case mixed(s);
  CHECK_THAT(
      ddp_test::error_of([&] { mixed.run(mm); }),
      Catch::Contains("oneDNN matmul [3,5]x[5,7] f32/bf16->f32 (trans_b): could not create"));
}

TEST_CASE("onednn matmul reports the native bf16 ISA oneDNN dispatches to", "[kernels][onednn]") {
  if (skip_unbuilt()) return;
  const std::string isa = ddp::cpu::onednn_native_bf16_isa();
  CHECK((isa.empty() || isa == "avx512_core_bf16" || isa == "avx512_core_amx"));
  WARN("oneDNN native bf16 ISA: " << (isa.empty() ? "(none)" : isa));
}
