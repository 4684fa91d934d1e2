// The CUDA backend's mixed-precision Linear kernels (MixedLinear: WMMA GEMMs, gemm16.cuh) in
// bf16 and fp16: every operation against a double reference of the same rounding points (the
// operands are 16-bit values, the sums float32, the 16-bit outputs one rounding of that sum),
// and in bf16 against the CPU backend's implementation, at ragged shapes (no extent a multiple
// of 16) and at shapes whose every extent allows 16-byte loads, in views on and off a 16-byte
// boundary with guard zones around them; accumulation; the bias gradient bitwise equal to the
// CPU's (one order of addition); the same bits on every call; the refusals.
//
// Tolerance: an element's float32 sum of k exact products plus a bias or an initial value
// makes k + 1 additions, each off by at most one unit in the last place of a partial sum,
// which is at most cond (the sum of the terms' magnitudes): |sum - ref| <= (k + 2)·2^-23·cond.
// (A full unit rather than half: tensor cores need not round to nearest inside an mma.) A
// 16-bit output is that sum rounded once more: within one unit of the format of the reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/float16.h"
#include "kernels/column_sum_order.h"
#include "cuda_test_support.h"
#if defined(DDP_CUDA_EMULATION)
#include "cuda_emu.h"
#endif

namespace {

using ddp::Half;
using ddp::Tensor;
using ddp::Tensor16;
using ddp_kernel_test::LinearData;
using ddp_kernel_test::LinearShape;
using ddp_kernel_test::make_linear_data;

constexpr uint16_t kGuardBits = 0x7fc1;  // a NaN in either format
constexpr int64_t kGuardHalves = 8;

uint16_t encode(Half f, float v) {
  return f == Half::Bf16 ? ddp::float_to_bf16(v) : ddp::float_to_fp16(v);
}
double decode(Half f, uint16_t h) {
  return f == Half::Bf16 ? ddp::bf16_to_float(h) : ddp::fp16_to_float(h);
}
const char* name(Half f) { return f == Half::Bf16 ? "bf16" : "fp16"; }

std::vector<uint16_t> encode_all(Half f, const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = encode(f, v[i]);
  return out;
}

// One unit in the last place of the format at |v| (the subnormal spacing at the bottom).
double ulp(Half f, double v) {
  const int mantissa = f == Half::Bf16 ? 7 : 10;
  const int min_exp = f == Half::Bf16 ? -126 : -14;
  const int e = v == 0.0 ? min_exp : std::max(std::ilogb(v), min_exp);
  return std::ldexp(1.0, e - mantissa);
}

/// Device tensors of both kinds with guard zones (NaN halves, kGuardValue floats) on each side,
/// `front` elements before the view: on a 16-byte boundary, or one element off it.
class Memory {
 public:
  explicit Memory(bool misaligned) : misaligned_(misaligned) {}

  Tensor16 halves(Half f, const std::vector<uint16_t>& v, int64_t rows, int64_t cols) {
    const int64_t front = misaligned_ ? 1 : kGuardHalves;
    std::vector<uint16_t> host(v.size() + static_cast<size_t>(front + kGuardHalves), kGuardBits);
    std::copy(v.begin(), v.end(), host.begin() + front);
    if (host.size() % 2) host.push_back(kGuardBits);
    halves_.push_back({ddp::Buffer(host.size() / 2, ddp::Device::CUDA), front, rows * cols});
    ddp::cuda_copy_bytes(halves_.back().buffer.data(), host.data(), host.size() * 2);
    auto* base = reinterpret_cast<uint16_t*>(halves_.back().buffer.data());
    return Tensor16{base + front, rows, cols, ddp::Device::CUDA, f};
  }
  Tensor16 poisoned_halves(Half f, int64_t rows, int64_t cols) {
    return halves(f, std::vector<uint16_t>(static_cast<size_t>(rows * cols), kGuardBits), rows,
                  cols);
  }
  Tensor floats(const std::vector<float>& v, int64_t rows, int64_t cols) {
    const int64_t front = misaligned_ ? 1 : ddp_kernel_test::kGuard;
    std::vector<float> host(v.size() + static_cast<size_t>(front + ddp_kernel_test::kGuard),
                            ddp_kernel_test::kGuardValue);
    std::copy(v.begin(), v.end(), host.begin() + front);
    floats_.push_back({ddp::Buffer(host.size(), ddp::Device::CUDA), front, rows * cols});
    ddp::cuda_copy_bytes(floats_.back().buffer.data(), host.data(), host.size() * 4);
    return Tensor{floats_.back().buffer.data() + front, rows, cols, ddp::Device::CUDA};
  }
  static std::vector<uint16_t> read(const Tensor16& t) {
    std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
    ddp::cuda_copy_bytes(out.data(), t.data, out.size() * 2);
    return out;
  }
  static std::vector<float> read(const Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    ddp::cuda_copy_bytes(out.data(), t.data, out.size() * 4);
    return out;
  }
  void require_guards_intact() const {
    for (const Allocation& a : halves_) {
      std::vector<uint16_t> all(a.buffer.numel() * 2);
      ddp::cuda_copy_bytes(all.data(), a.buffer.data(), all.size() * 2);
      for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i) {
        if (i >= a.front && i < a.front + a.numel) continue;
        INFO("a store outside a 16-bit view, at offset " << i - a.front);
        REQUIRE(all[static_cast<size_t>(i)] == kGuardBits);
      }
    }
    for (const Allocation& a : floats_) {
      std::vector<float> all(a.buffer.numel());
      ddp::cuda_copy_bytes(all.data(), a.buffer.data(), a.buffer.bytes());
      for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i) {
        if (i >= a.front && i < a.front + a.numel) continue;
        INFO("a store outside a float view, at offset " << i - a.front);
        REQUIRE(all[static_cast<size_t>(i)] == ddp_kernel_test::kGuardValue);
      }
    }
  }

 private:
  struct Allocation {
    ddp::Buffer buffer;
    int64_t front, numel;
  };
  bool misaligned_;
  std::vector<Allocation> halves_, floats_;
};

/// One layer's operands in the format (the values the kernels see) and as doubles.
struct Operands {
  LinearShape s;
  Half f;
  std::vector<uint16_t> x, w, dy, relu;
  std::vector<float> bias, dw0, db0;
  double at(const std::vector<uint16_t>& v, int64_t i) const {
    return decode(f, v[static_cast<size_t>(i)]);
  }
};

Operands make_operands(Half f, const LinearShape& s, uint64_t seed) {
  const LinearData d = make_linear_data(s, seed);
  return Operands{s,
                  f,
                  encode_all(f, d.x),
                  encode_all(f, d.w),
                  encode_all(f, d.dy),
                  encode_all(f, d.relu_out),
                  d.bias,
                  d.dw0,
                  d.db0};
}

struct Expected {
  std::vector<double> value, cond;
  int64_t k = 0;
};

// sum over j < k of a(r, j)·b(j, c) plus `start`, for every (r, c) of rows x cols.
template <typename A, typename B, typename Start>
Expected products(int64_t rows, int64_t cols, int64_t k, A a, B b, Start start) {
  Expected e;
  e.k = k;
  e.value.resize(static_cast<size_t>(rows * cols));
  e.cond.resize(e.value.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      double acc = start(c, r), cond = std::fabs(acc);
      for (int64_t j = 0; j < k; ++j) {
        const double t = a(r, j) * b(j, c);
        acc += t;
        cond += std::fabs(t);
      }
      e.value[static_cast<size_t>(r * cols + c)] = acc;
      e.cond[static_cast<size_t>(r * cols + c)] = cond;
    }
  }
  return e;
}

double tolerance(const Expected& e, size_t i) {
  return static_cast<double>(e.k + 2) * std::ldexp(1.0, -23) * e.cond[i];
}

void require_floats(const std::vector<float>& got, const Expected& e, const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == e.value.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", reference " << e.value[i]);
    REQUIRE(std::fabs(got[i] - e.value[i]) <= tolerance(e, i));
  }
}

// 16-bit outputs: the float32 sum, after `epilogue` (ReLU, mask), rounded once.
template <typename Epilogue>
void require_halves(Half f, const std::vector<uint16_t>& got, const Expected& e, Epilogue epilogue,
                    const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == e.value.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double ref = epilogue(i, e.value[i]);
    const double g = decode(f, got[i]);
    INFO("element " << i << ": got " << g << ", reference " << ref);
    REQUIRE(std::fabs(g - ref) <= ulp(f, std::fabs(ref)) + tolerance(e, i));
  }
}

// ---- the operations ---------------------------------------------------------------------------

Expected expected_forward(const Operands& o) {
  const LinearShape& s = o.s;
  return products(
      s.batch, s.out, s.in, [&](int64_t b, int64_t i) { return o.at(o.x, b * s.in + i); },
      [&](int64_t i, int64_t c) { return o.at(o.w, c * s.in + i); },
      [&](int64_t c, int64_t) { return double(o.bias[static_cast<size_t>(c)]); });
}

Expected expected_backward_input(const Operands& o) {
  const LinearShape& s = o.s;
  return products(
      s.batch, s.in, s.out, [&](int64_t b, int64_t j) { return o.at(o.dy, b * s.out + j); },
      [&](int64_t j, int64_t i) { return o.at(o.w, j * s.in + i); },
      [](int64_t, int64_t) { return 0.0; });
}

Expected expected_dw(const Operands& o, bool accumulate) {
  const LinearShape& s = o.s;
  return products(
      s.out, s.in, s.batch, [&](int64_t c, int64_t b) { return o.at(o.dy, b * s.out + c); },
      [&](int64_t b, int64_t i) { return o.at(o.x, b * s.in + i); },
      [&](int64_t i, int64_t c) {
        return accumulate ? double(o.dw0[static_cast<size_t>(c * s.in + i)]) : 0.0;
      });
}

// db as kernels/column_sum_order.h defines it: the batch cut into kColumnSumChunks chunks of
// column_sum_chunk_rows(batch) rows, each summed in batch order onto 0 in float32, the chunks'
// sums added in order onto 0, the total added to db0 with accumulate.
std::vector<float> chunked_column_sums(const Operands& o, const LinearShape& s, bool accumulate) {
  const int64_t per = ddp::column_sum_chunk_rows(s.batch);
  std::vector<float> db(static_cast<size_t>(s.out));
  for (int64_t c = 0; c < s.out; ++c) {
    float total = 0.0f;
    for (int64_t chunk = 0; chunk < ddp::kColumnSumChunks; ++chunk) {
      float sum = 0.0f;
      for (int64_t b = chunk * per; b < std::min(s.batch, (chunk + 1) * per); ++b)
        sum += static_cast<float>(o.at(o.dy, b * s.out + c));
      total += sum;
    }
    const float db0 = o.db0[static_cast<size_t>(c)];
    db[static_cast<size_t>(c)] = accumulate ? db0 + total : total;
  }
  return db;
}

// The same operations on the CPU backend's bf16 kernels, over the same bits.
struct CpuResults {
  std::vector<uint16_t> hidden, dx;
  std::vector<float> logits, dw, db;
};

CpuResults run_on_cpu(Operands o, bool accumulate) {
  const LinearShape& s = o.s;
  auto cpu = ddp::make_cpu_backend();
  ddp::MixedLinear& k = *cpu->mixed_linear(Half::Bf16);
  auto h16 = [&](std::vector<uint16_t>& v, int64_t r, int64_t c) {
    return Tensor16{v.data(), r, c, ddp::Device::CPU, Half::Bf16};
  };
  auto h32 = [](std::vector<float>& v, int64_t r, int64_t c) {
    return Tensor{v.data(), r, c, ddp::Device::CPU};
  };
  CpuResults out;
  out.hidden.resize(static_cast<size_t>(s.batch * s.out));
  out.logits.resize(out.hidden.size());
  out.dx.resize(static_cast<size_t>(s.batch * s.in));
  out.dw = accumulate ? o.dw0 : std::vector<float>(static_cast<size_t>(s.out * s.in));
  out.db = accumulate ? o.db0 : std::vector<float>(static_cast<size_t>(s.out));
  Tensor16 x = h16(o.x, s.batch, s.in), w = h16(o.w, s.out, s.in);
  Tensor16 dy = h16(o.dy, s.batch, s.out), relu = h16(o.relu, s.batch, s.in);
  Tensor16 hidden = h16(out.hidden, s.batch, s.out), dx = h16(out.dx, s.batch, s.in);
  Tensor logits = h32(out.logits, s.batch, s.out), bias = h32(o.bias, 1, s.out);
  Tensor dw = h32(out.dw, s.out, s.in), db = h32(out.db, 1, s.out);
  k.forward_relu(x, w, bias, hidden);
  k.forward(x, w, bias, logits);
  k.backward_input_relu(dy, w, relu, dx);
  k.backward_params(dy, x, accumulate, dw, db);
  return out;
}

// 16-bit results of two engines: each within a unit of the other (their sums round apart
// only where the float32 sums straddle a rounding boundary).
void require_within_a_unit(Half f, const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                           const Expected& e, const std::string& what) {
  INFO(what << " against the CPU backend");
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = decode(f, a[i]), y = decode(f, b[i]);
    INFO("element " << i << ": " << x << " and " << y);
    REQUIRE(std::fabs(x - y) <= ulp(f, std::max(std::fabs(x), std::fabs(y))) + 2 * tolerance(e, i));
  }
}

// Every operation of one layer at shape s, in format f, in aligned or misaligned views.
void check_layer(ddp::Backend& be, Half f, const LinearShape& s, bool misaligned, bool accumulate,
                 uint64_t seed) {
  INFO(name(f) << ", batch " << s.batch << ", in " << s.in << ", out " << s.out
               << (misaligned ? ", misaligned" : ", aligned")
               << (accumulate ? ", accumulating" : ""));
  const Operands o = make_operands(f, s, seed);
  ddp::MixedLinear& k = *be.mixed_linear(f);
  Memory mem(misaligned);
  const Tensor16 x = mem.halves(f, o.x, s.batch, s.in), w = mem.halves(f, o.w, s.out, s.in);
  const Tensor16 dy = mem.halves(f, o.dy, s.batch, s.out);
  const Tensor16 relu = mem.halves(f, o.relu, s.batch, s.in);
  const Tensor bias = mem.floats(o.bias, 1, s.out);
  Tensor16 hidden = mem.poisoned_halves(f, s.batch, s.out);
  Tensor16 dx = mem.poisoned_halves(f, s.batch, s.in);
  Tensor logits =
      mem.floats(std::vector<float>(static_cast<size_t>(s.batch * s.out), NAN), s.batch, s.out);
  Tensor dw = mem.floats(accumulate ? o.dw0 : std::vector<float>(o.dw0.size(), NAN), s.out, s.in);
  Tensor db = mem.floats(accumulate ? o.db0 : std::vector<float>(o.db0.size(), NAN), 1, s.out);
  k.forward_relu(x, w, bias, hidden);
  k.forward(x, w, bias, logits);
  k.backward_input_relu(dy, w, relu, dx);
  k.backward_params(dy, x, accumulate, dw, db);
  mem.require_guards_intact();

  const Expected fwd = expected_forward(o), bwd = expected_backward_input(o);
  const Expected grad = expected_dw(o, accumulate);
  const std::vector<uint16_t> got_hidden = Memory::read(hidden), got_dx = Memory::read(dx);
  require_halves(
      f, got_hidden, fwd, [](size_t, double v) { return std::max(v, 0.0); }, "forward_relu");
  require_floats(Memory::read(logits), fwd, "forward");
  require_halves(
      f, got_dx, bwd, [&](size_t i, double v) { return o.at(o.relu, int64_t(i)) > 0 ? v : 0.0; },
      "backward_input_relu");
  const std::vector<float> got_dw = Memory::read(dw), got_db = Memory::read(db);
  require_floats(got_dw, grad, "backward_params: dw");
  ddp_kernel_test::require_bitwise_equal(got_db, chunked_column_sums(o, s, accumulate),
                                         "backward_params: db");

  if (f == Half::Bf16) {
    const CpuResults cpu = run_on_cpu(o, accumulate);
    require_within_a_unit(f, got_hidden, cpu.hidden, fwd, "forward_relu");
    require_within_a_unit(f, got_dx, cpu.dx, bwd, "backward_input_relu");
    ddp_kernel_test::require_bitwise_equal(got_db, cpu.db, "backward_params: db on the CPU");
    const std::vector<float> logits_now = Memory::read(logits);
    for (size_t i = 0; i < cpu.logits.size(); ++i) {
      INFO("forward element " << i << " against the CPU backend");
      REQUIRE(std::fabs(logits_now[i] - cpu.logits[i]) <= 2 * tolerance(fwd, i));
    }
    for (size_t i = 0; i < cpu.dw.size(); ++i) {
      INFO("dw element " << i << " against the CPU backend");
      REQUIRE(std::fabs(got_dw[i] - cpu.dw[i]) <= 2 * tolerance(grad, i));
    }
  }
}

// Ragged shapes (no extent a multiple of 8 or 16; batch 1; more than one tile and K step in
// each extent) and shapes whose every extent is a multiple of 8 (16-byte loads when aligned).
std::vector<LinearShape> mixed_shapes() {
  std::vector<LinearShape> shapes = {{3, 7, 5},     {1, 33, 9},   {17, 70, 45},
                                     {66, 37, 130}, {16, 64, 24}, {72, 40, 136}};
  if (!ddp_cuda_test::kEmulated) {
    shapes.insert(shapes.end(), {{256, 784, 256}, {256, 256, 10}, {129, 257, 65}, {512, 512, 512}});
  }
  return shapes;
}

std::unique_ptr<ddp::Backend> make_cuda() { return ddp::make_cuda_backend(0); }

// bf16 and fp16; fp16 only on a device older than sm_80, which refuses bf16 (checked below).
std::vector<Half> formats() {
  if (ddp::cuda_device_info(0).compute_major >= 8) return {Half::Bf16, Half::Fp16};
  WARN("bf16 left out: this device is older than compute capability 8.0");
  return {Half::Fp16};
}

TEST_CASE("cuda mixed linear: every operation against the references, bf16 and fp16",
          DDP_CUDA_TAGS "[mixed]") {
  auto be = make_cuda();
  uint64_t seed = 500;
  for (Half f : formats()) {
    for (const LinearShape& s : mixed_shapes()) {
      for (bool misaligned : {false, true}) {
        check_layer(*be, f, s, misaligned, misaligned, seed += 10);
      }
    }
  }
}

TEST_CASE("cuda mixed linear: round is the format's rounding, bit for bit",
          DDP_CUDA_TAGS "[mixed]") {
  auto be = make_cuda();
  std::vector<float> v = ddp_kernel_test::random_floats(1001, 9, -70000.0, 70000.0);
  v.insert(v.end(), {0.0f, -0.0f, 65519.0f, 65520.0f, 1e-7f, -3e-8f, INFINITY, NAN, 1e-40f});
  const int64_t n = static_cast<int64_t>(v.size());
  for (Half f : formats()) {
    for (bool misaligned : {false, true}) {
      INFO(name(f) << (misaligned ? ", misaligned" : ""));
      Memory mem(misaligned);
      Tensor16 y = mem.poisoned_halves(f, 1, n);
      be->mixed_linear(f)->round(mem.floats(v, 1, n), y);
      mem.require_guards_intact();
      const std::vector<uint16_t> got = Memory::read(y);
      CHECK(got == encode_all(f, v));
    }
  }
}

TEST_CASE("cuda mixed linear: the same bits on every call", DDP_CUDA_TAGS "[mixed]") {
  if (formats().size() < 2) return;
  auto be = make_cuda();
  const LinearShape s{40, 70, 33};
  const Operands o = make_operands(Half::Bf16, s, 77);
  Memory mem(false);
  ddp::MixedLinear& k = *be->mixed_linear(Half::Bf16);
  const Tensor16 dy = mem.halves(Half::Bf16, o.dy, s.batch, s.out);
  const Tensor16 x = mem.halves(Half::Bf16, o.x, s.batch, s.in);
  Tensor dw = mem.floats(o.dw0, s.out, s.in), db = mem.floats(o.db0, 1, s.out);
  k.backward_params(dy, x, false, dw, db);
  const std::vector<float> first = Memory::read(dw);
  k.backward_params(dy, x, false, dw, db);
  ddp_kernel_test::require_bitwise_equal(Memory::read(dw), first, "dw");
}

TEST_CASE("cuda mixed linear: wrong formats, places and shapes are refused by name",
          DDP_CUDA_TAGS "[mixed]") {
  if (formats().size() < 2) return;
  auto be = make_cuda();
  ddp::MixedLinear& k = *be->mixed_linear(Half::Bf16);
  Memory mem(false);
  const std::vector<uint16_t> six(6, 0);
  const Tensor16 fp16 = mem.halves(Half::Fp16, six, 2, 3);
  const Tensor16 w = mem.halves(Half::Bf16, six, 2, 3);
  const Tensor bias = mem.floats({0.0f, 0.0f}, 1, 2);
  Tensor16 y = mem.halves(Half::Bf16, std::vector<uint16_t>(4, 0), 2, 2);
  ddp_cuda_test::require_error([&] { k.forward_relu(fp16, w, bias, y); },
                               "bf16 forward_relu: x must be bf16 in device memory");
  std::vector<uint16_t> host(6, 0);
  const Tensor16 on_host{host.data(), 2, 3, ddp::Device::CPU, Half::Bf16};
  ddp_cuda_test::require_error([&] { k.forward_relu(on_host, w, bias, y); },
                               "x must be bf16 in device memory");
  Tensor16 one_row = y.first_rows(1);
  ddp_cuda_test::require_error([&] { k.forward_relu(w, w, bias, one_row); },
                               "do not fit y = x·wᵀ + bias");
  CHECK_THAT(k.describe(), Catch::Contains("WMMA"));
}

#if defined(DDP_CUDA_EMULATION)
TEST_CASE("cuda mixed linear: bf16 is refused below compute capability 8.0, fp16 is not",
          DDP_CUDA_TAGS "[mixed]") {
  ddp_emu::set_compute_capability(7, 5);
  auto be = make_cuda();
  ddp_emu::set_compute_capability(8, 0);
  ddp_cuda_test::require_error([&] { be->mixed_linear(Half::Bf16); },
                               "training.precision: bf16 needs a GPU of compute capability 8.0");
  CHECK(be->mixed_linear(Half::Fp16) != nullptr);
}
#endif

}  // namespace
