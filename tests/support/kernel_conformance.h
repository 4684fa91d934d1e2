// The kernel conformance suite: what every backend (CPU, CUDA, the CUDA emulation) must compute,
// checked against the double-precision references of kernel_references.h. A backend's test file
// runs each conform_* function on a KernelTarget of its own: the backend plus tensors in its
// memory, NaN-poisoned where a kernel must write, with guard zones that catch a store past a
// view's ends, aligned or one float off a 16-byte boundary.
#pragma once

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernel_references.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"
#include "test_helpers.h"

namespace ddp_kernel_test {

/// A backend and the tensors a test made in its memory. Every tensor has kGuard floats holding
/// kGuardValue on each side; require_guards_intact() checks all of them. Valid until clear().
class KernelTarget {
 public:
  explicit KernelTarget(ddp::Backend& backend) : backend_(backend) {}

  ddp::Backend& backend() { return backend_; }
  /// Views made from now on start one float past a 16-byte boundary (the kernels' scalar paths).
  void set_misaligned(bool misaligned) { front_ = misaligned ? 1 : kGuard; }

  ddp::Tensor make(const std::vector<float>& values, int64_t rows, int64_t cols) {
    REQUIRE(static_cast<int64_t>(values.size()) == rows * cols);
    std::vector<float> host(values.size() + static_cast<size_t>(front_ + kGuard), kGuardValue);
    std::copy(values.begin(), values.end(), host.begin() + front_);
    buffers_.push_back({ddp::Buffer(host.size(), backend_.device()), front_, rows * cols});
    to_device(buffers_.back().buffer.data(), host.data(), host.size() * sizeof(float));
    return ddp::Tensor{buffers_.back().buffer.data() + front_, rows, cols, backend_.device()};
  }
  /// A tensor every element of which is NaN: whatever a kernel fails to write stays NaN.
  ddp::Tensor poisoned(int64_t rows, int64_t cols) {
    return make(std::vector<float>(static_cast<size_t>(rows * cols), kNaN), rows, cols);
  }
  std::vector<float> read(const ddp::Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    to_host(out.data(), t.data, out.size() * sizeof(float));
    return out;
  }
  /// Labels in the backend's memory (the CUDA kernels read them on the device).
  const int32_t* labels(const std::vector<int32_t>& values) {
    std::vector<float> bits(values.size());
    std::memcpy(bits.data(), values.data(), values.size() * sizeof(int32_t));
    return reinterpret_cast<const int32_t*>(make(bits, 1, static_cast<int64_t>(bits.size())).data);
  }
  void require_guards_intact(const std::string& what) {
    for (const Allocation& a : buffers_) {
      const int64_t tail = a.front + a.numel, size = static_cast<int64_t>(a.buffer.numel());
      std::vector<float> guards(static_cast<size_t>(size - a.numel));
      to_host(guards.data(), a.buffer.data(), static_cast<size_t>(a.front) * sizeof(float));
      to_host(guards.data() + a.front, a.buffer.data() + tail,
              static_cast<size_t>(size - tail) * sizeof(float));
      for (size_t g = 0; g < guards.size(); ++g) {
        if (guards[g] == kGuardValue) continue;
        const int64_t i = static_cast<int64_t>(g);  // offsets relative to the view's start
        const int64_t at = i < a.front ? i - a.front : a.numel + (i - a.front);
        FAIL(what << ": a store outside a view changed the guard at offset " << at);
      }
    }
  }
  void clear() { buffers_.clear(); }

 private:
  struct Allocation {
    ddp::Buffer buffer;
    int64_t front, numel;
  };
  void to_device(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;  // an empty view's pointers may be null
    if (backend_.device() == ddp::Device::CPU) {
      std::memcpy(dst, src, bytes);
    } else {
      ddp::cuda_copy_bytes(dst, src, bytes);
    }
  }
  void to_host(void* dst, const void* src, size_t bytes) { to_device(dst, src, bytes); }

  ddp::Backend& backend_;
  int64_t front_ = kGuard;
  std::vector<Allocation> buffers_;
};

/// Sizes that are multiples of no vector width or tile edge, sizes whose every GEMM extent is a
/// multiple of 4 (16-byte paths), batch 1 (the first four one of each kind), and `random` more
/// up to `limit` in each extent.
inline std::vector<LinearShape> conformance_linear_shapes(int random, uint64_t limit) {
  std::vector<LinearShape> shapes = {{3, 7, 5},   {8, 16, 12},  {1, 64, 12}, {17, 33, 9},
                                     {1, 1, 1},   {1, 5, 3},    {13, 70, 45}, {20, 132, 36},
                                     {37, 4, 4},  {6, 130, 129}, {65, 1, 130}};
  ddp::Rng rng(77);
  for (int i = 0; i < random; ++i) {
    shapes.push_back({static_cast<int64_t>(rng.below(limit) + 1),
                      static_cast<int64_t>(rng.below(limit) + 1),
                      static_cast<int64_t>(rng.below(limit) + 1)});
  }
  return shapes;
}

// ---- Linear layer products ---------------------------------------------------------------

inline std::vector<float> run_forward(KernelTarget& t, const LinearData& d, bool relu) {
  const LinearShape& s = d.s;
  ddp::Tensor y = t.poisoned(s.batch, s.out);
  t.backend().linear_forward(t.make(d.x, s.batch, s.in), t.make(d.w, s.out, s.in),
                             t.make(d.bias, 1, s.out), relu, y);
  return t.read(y);
}

inline std::vector<float> run_backward_input(KernelTarget& t, const LinearData& d, bool mask) {
  const LinearShape& s = d.s;
  ddp::Tensor dx = t.poisoned(s.batch, s.in);
  const ddp::Tensor relu_out = t.make(d.relu_out, s.batch, s.in);
  t.backend().linear_backward_input(t.make(d.dy, s.batch, s.out), t.make(d.w, s.out, s.in),
                                    mask ? &relu_out : nullptr, dx);
  return t.read(dx);
}

/// {dw, db}: accumulated into dw0/db0, or overwriting NaN.
inline std::pair<std::vector<float>, std::vector<float>> run_backward_params(KernelTarget& t,
                                                                             const LinearData& d,
                                                                             bool accumulate) {
  const LinearShape& s = d.s;
  ddp::Tensor dw = accumulate ? t.make(d.dw0, s.out, s.in) : t.poisoned(s.out, s.in);
  ddp::Tensor db = accumulate ? t.make(d.db0, 1, s.out) : t.poisoned(1, s.out);
  t.backend().linear_backward_params(t.make(d.dy, s.batch, s.out), t.make(d.x, s.batch, s.in),
                                     accumulate, dw, db);
  return {t.read(dw), t.read(db)};
}

/// Runs check(d, option) on every shape with the product's option off and on, then checks the
/// guards and frees the tensors.
template <typename Check>
void for_each_linear_case(KernelTarget& t, const char* product, const char* option,
                          const std::vector<LinearShape>& shapes, uint64_t seed, Check check) {
  for (const LinearShape& s : shapes) {
    const LinearData d = make_linear_data(s, seed += 10);
    for (bool on : {false, true}) {
      INFO(t.backend().name() << " " << product << ", " << describe(s) << (on ? ", " : "")
                              << (on ? option : ""));
      check(d, on);
      t.require_guards_intact(product);
      t.clear();
    }
  }
}

inline void conform_linear_forward(KernelTarget& t, const std::vector<LinearShape>& shapes,
                                   uint64_t seed) {
  for_each_linear_case(t, "linear_forward", "fused relu", shapes, seed,
                       [&](const LinearData& d, bool relu) {
                         require_accurate(run_forward(t, d, relu), ref_forward(d, relu), "y");
                       });
}

inline void conform_linear_backward_input(KernelTarget& t, const std::vector<LinearShape>& shapes,
                                          uint64_t seed) {
  for_each_linear_case(t, "linear_backward_input", "relu_output mask", shapes, seed,
                       [&](const LinearData& d, bool mask) {
                         require_accurate(run_backward_input(t, d, mask),
                                          ref_backward_input(d, mask), "dx");
                       });
}

inline void conform_linear_backward_params(KernelTarget& t, const std::vector<LinearShape>& shapes,
                                           uint64_t seed) {
  for_each_linear_case(t, "linear_backward_params", "accumulate", shapes, seed,
                       [&](const LinearData& d, bool accumulate) {
                         const auto ref = ref_backward_params(d, accumulate);
                         const auto got = run_backward_params(t, d, accumulate);
                         require_accurate(got.first, ref.first, "dw");
                         require_accurate(got.second, ref.second, "db");
                       });
}

// ---- softmax cross-entropy ---------------------------------------------------------------

struct XentCase {
  int64_t rows, classes;
  bool every_dlogits_mode;  ///< also without dlogits and with dlogits aliasing the logits
};

enum class DlogitsMode { kSeparate, kNone, kAliased };

inline const char* describe(DlogitsMode mode) {
  return mode == DlogitsMode::kSeparate ? "separate"
         : mode == DlogitsMode::kNone   ? "null"
                                        : "aliasing logits";
}

/// One call in `mode`; returns the result and the dlogits written (empty for kNone), and
/// requires the logits untouched unless dlogits alias them.
inline std::pair<ddp::XentResult, std::vector<float>> run_xent(KernelTarget& t,
                                                               const std::vector<float>& logits,
                                                               const std::vector<int32_t>& labels,
                                                               int64_t classes, float grad_scale,
                                                               DlogitsMode mode) {
  const int64_t rows = static_cast<int64_t>(labels.size());
  ddp::Tensor l = t.make(logits, rows, classes);
  const int32_t* device_labels = t.labels(labels);
  ddp::Tensor d = mode == DlogitsMode::kAliased ? l : t.poisoned(rows, classes);
  const ddp::XentResult r = t.backend().softmax_xent(l, device_labels, grad_scale,
                                                     mode == DlogitsMode::kNone ? nullptr : &d);
  if (mode != DlogitsMode::kAliased) require_bitwise_equal(t.read(l), logits, "logits are input");
  return {r, mode == DlogitsMode::kNone ? std::vector<float>{} : t.read(d)};
}

inline void conform_softmax_xent(KernelTarget& t, const std::vector<XentCase>& cases,
                                 uint64_t seed) {
  for (const XentCase& c : cases) {
    const std::vector<float> logits = make_logits(c.rows, c.classes, seed += 10);
    const std::vector<int32_t> labels = make_xent_labels(c.rows, c.classes, seed + 1);
    for (DlogitsMode mode : {DlogitsMode::kSeparate, DlogitsMode::kNone, DlogitsMode::kAliased}) {
      if (!c.every_dlogits_mode && mode != DlogitsMode::kSeparate) continue;
      const float grad_scale =
          mode == DlogitsMode::kAliased ? 0.37f : 1.0f / static_cast<float>(c.rows);
      INFO(t.backend().name() << " softmax_xent, rows " << c.rows << ", classes " << c.classes
                              << ", grad_scale " << grad_scale << ", dlogits " << describe(mode));
      const XentReference ref = ref_xent(logits, labels, c.classes, grad_scale);
      const auto got = run_xent(t, logits, labels, c.classes, grad_scale, mode);
      CHECK(got.first.correct == ref.correct);
      INFO("loss_sum " << got.first.loss_sum << ", reference " << ref.loss_sum << ", cond "
                       << ref.loss_cond);
      CHECK(std::isfinite(got.first.loss_sum));
      CHECK(std::fabs(got.first.loss_sum - ref.loss_sum) <= kTol * ref.loss_cond);
      // Relative to the loss itself too (the rows term is for one class, where the loss is 0).
      CHECK(std::fabs(got.first.loss_sum - ref.loss_sum) <=
            kTol * std::fabs(ref.loss_sum) + 1e-6 * c.rows);
      if (mode != DlogitsMode::kNone) require_accurate(got.second, ref.dlogits, "dlogits");
      t.require_guards_intact("softmax_xent");
      t.clear();
    }
  }
}

/// Logits of magnitude 1000 (exp overflows unless the maximum is subtracted first) and a
/// three-way tie (the first maximum is the prediction, as torch.argmax).
inline void conform_softmax_xent_extremes(KernelTarget& t) {
  INFO(t.backend().name() << " softmax_xent with huge logits and ties");
  const std::vector<float> logits{1000.0f,  -1000.0f, 0.0f,  //
                                  1000.0f,  -1000.0f, 0.0f,  //
                                  -1000.0f, -1000.0f, -1000.0f};
  ddp::Tensor d = t.poisoned(3, 3);
  const ddp::XentResult r =
      t.backend().softmax_xent(t.make(logits, 3, 3), t.labels({0, 1, 2}), 1.0f, &d);
  // Row losses: 0, 2000 and log 3 (three equal logits).
  CHECK(r.loss_sum == Approx(2000.0 + std::log(3.0)).epsilon(1e-6));
  // Row 0 is right; row 1 (label 1) is not; row 2 is a three-way tie won by index 0, not label 2.
  CHECK(r.correct == 1);
  const double third = 1.0 / 3.0;
  require_accurate(t.read(d), {0, 0, 0, 1, -1, 0, third, third, -2 * third},
                   std::vector<double>(9, 1.0), "dlogits");
  const std::vector<float> tie{1.0f, 3.0f, 3.0f, 2.0f};
  CHECK(t.backend().softmax_xent(t.make(tie, 1, 4), t.labels({2}), 1.0f, nullptr).correct == 0);
  CHECK(t.backend().softmax_xent(t.make(tie, 1, 4), t.labels({1}), 1.0f, nullptr).correct == 1);
  t.require_guards_intact("softmax_xent");
  t.clear();
}

// ---- SGD ---------------------------------------------------------------------------------

/// Three steps of every option combination over `n` values, starting from first_step and from
/// a preset momentum buffer: bitwise the float32 transcription of torch.optim.SGD, within 1e-6
/// of the algorithm in double; grads are only read; momentum 0 never touches the buffer.
inline void conform_sgd_step(KernelTarget& t, int64_t n, uint64_t seed) {
  for (const ddp::SgdOptions& o : sgd_option_combinations()) {
    for (bool starts_first : {true, false}) {
      INFO(t.backend().name() << " sgd_step, n " << n << ", " << describe(o)
                              << (starts_first ? ", from first_step" : ", momentum_buf preset"));
      std::vector<float> p = random_floats(static_cast<size_t>(n), seed += 10);
      // From first_step the buffer must not be read: NaN would show.
      std::vector<float> buf = starts_first ? std::vector<float>(static_cast<size_t>(n), kNaN)
                                            : random_floats(static_cast<size_t>(n), seed + 1);
      std::vector<double> dp(p.begin(), p.end()), dbuf(buf.begin(), buf.end());
      const std::vector<float> buf0 = buf;
      ddp::Tensor pt = t.make(p, 1, n), bt = t.make(buf, 1, n);
      for (int step = 0; step < 3; ++step) {
        INFO("step " << step);
        const std::vector<float> g = random_floats(static_cast<size_t>(n), seed + 2 + step, -2, 2);
        ddp::Tensor gt = t.make(g, 1, n);
        const bool first = starts_first && step == 0;
        t.backend().sgd_step(pt, gt, bt, o, first);
        torch_sgd_reference(p, g, buf, o, first);
        sgd_reference_double(dp, g, dbuf, o, first);
        require_bitwise_equal(t.read(pt), p, "params vs torch.optim.SGD in float32");
        ddp_test::require_close(p, dp, 1e-6);  // params vs the algorithm in double
        require_bitwise_equal(t.read(bt), o.momentum != 0.0f ? buf : buf0, "momentum_buf");
        if (o.momentum != 0.0f) ddp_test::require_close(buf, dbuf, 1e-6);
        require_bitwise_equal(t.read(gt), g, "grads are input");
      }
      t.require_guards_intact("sgd_step");
      t.clear();
    }
  }
}

// ---- Adam / AdamW -------------------------------------------------------------------------

/// Every case of adam_cases() over `n` values, three updates from fresh (zero) state and three
/// more from state left by earlier updates (steps 5 to 7): parameters and state bitwise the
/// float32 transcription of torch 1.13, parameters within 1e-6 of the algorithm in double;
/// grads are only read; without amsgrad max_exp_avg_sq is never touched.
inline void conform_adam_step(KernelTarget& t, int64_t n, uint64_t seed) {
  const size_t count = static_cast<size_t>(n);
  for (const AdamCase& c : adam_cases()) {
    for (long first : {1L, 5L}) {
      INFO(t.backend().name() << " adam_step, n " << n << ", " << describe(c) << ", steps " << first
                              << " to " << first + 2);
      std::vector<float> p = random_floats(count, seed += 10);
      std::vector<float> m(count, 0.0f), v(count, 0.0f), vmax(count, 0.0f);
      if (first > 1) {  // state of earlier updates: m of either sign, v >= 0, vmax >= v
        m = random_floats(count, seed + 1, -0.1, 0.1);
        v = random_floats(count, seed + 2, 0.0, 0.01);
        vmax = v;
        for (size_t i = 0; i < count; i += 2) vmax[i] *= 1.5f;
      }
      if (!c.amsgrad) vmax.assign(count, kNaN);  // must not be read or written
      std::vector<double> dp(p.begin(), p.end()), dm(m.begin(), m.end()), dv(v.begin(), v.end()),
          dvmax(vmax.begin(), vmax.end());
      ddp::Tensor pt = t.make(p, 1, n), mt = t.make(m, 1, n), vt = t.make(v, 1, n),
                  xt = t.make(vmax, 1, n);
      for (long step = first; step < first + 3; ++step) {
        INFO("step " << step);
        const std::vector<float> g = random_floats(count, seed + 3 + step, -2, 2);
        ddp::Tensor gt = t.make(g, 1, n);
        const ddp::AdamStep s = torch_adam_scalars(c, step);
        t.backend().adam_step(pt, gt, mt, vt, xt, s);
        torch_adam_reference(p, g, m, v, vmax, s);
        adam_reference_double(dp, g, dm, dv, dvmax, c, step);
        require_bitwise_equal(t.read(pt), p, "params vs torch.optim.Adam in float32");
        ddp_test::require_close(p, dp, 1e-6);  // params vs the algorithm in double
        require_bitwise_equal(t.read(mt), m, "exp_avg");
        require_bitwise_equal(t.read(vt), v, "exp_avg_sq");
        require_bitwise_equal(t.read(xt), vmax, "max_exp_avg_sq");
        require_bitwise_equal(t.read(gt), g, "grads are input");
      }
      t.require_guards_intact("adam_step");
      t.clear();
    }
  }
}

// ---- gradient norm and clipping ------------------------------------------------------------

/// l2_norm of make_norm_values(n, seed, scale): within 1e-12 (relative) of the long double
/// reference; the same bits when asked again and in a view at another alignment (the order of
/// additions is fixed by the size alone), with NaN on both sides of that view; the input only
/// read. Returns the norm.
inline double conform_l2_norm(KernelTarget& t, int64_t n, uint64_t seed, double scale) {
  INFO(t.backend().name() << " l2_norm, n " << n << ", scale " << scale);
  const std::vector<float> v = make_norm_values(n, seed, scale);
  const double ref = ref_l2_norm(v);
  const ddp::Tensor x = t.make(v, 1, n);
  const double norm = t.backend().l2_norm(x);
  INFO(std::setprecision(17) << "norm " << norm << ", reference " << ref);
  CHECK(std::isfinite(norm));
  if (n == 0) CHECK(norm == 0.0);
  CHECK(std::fabs(norm - ref) <= 1e-12 * ref);
  const double again = t.backend().l2_norm(x);
  CHECK(std::memcmp(&again, &norm, sizeof norm) == 0);
  // One float further along than x (x's alignment, whichever it is, plus 4 bytes).
  std::vector<float> padded(v.size() + 3, kNaN);
  std::copy(v.begin(), v.end(), padded.begin() + 2);
  const ddp::Tensor whole = t.make(padded, 1, n + 3);
  const double shifted = t.backend().l2_norm(ddp::Tensor{whole.data + 2, 1, n, whole.device});
  INFO("at another alignment " << shifted);
  CHECK(std::memcmp(&shifted, &norm, sizeof norm) == 0);
  require_bitwise_equal(t.read(x), v, "l2_norm's input");
  t.require_guards_intact("l2_norm");
  t.clear();
  return norm;
}

/// One clip_grad_norm_deferred(g, max_norm, slot 0) on a copy of g: the norm taken from the
/// slot is l2_norm(g) bitwise and the gradients are clipped_reference(g, that norm, max_norm)
/// bitwise. Returns {norm, clipped gradients}.
inline std::pair<double, std::vector<float>> run_clip_grad_norm(KernelTarget& t,
                                                                const std::vector<float>& g,
                                                                double max_norm) {
  const int64_t n = static_cast<int64_t>(g.size());
  ddp::Tensor gt = t.make(g, 1, n);
  const double expected_norm = t.backend().l2_norm(gt);
  t.backend().clip_grad_norm_deferred(gt, max_norm, 0);
  const double norm = t.backend().take_grad_norm(0);
  INFO(std::setprecision(17) << "norm " << norm << ", l2_norm " << expected_norm);
  CHECK(std::memcmp(&norm, &expected_norm, sizeof norm) == 0);
  const std::vector<float> got = t.read(gt);
  // Bitwise, except that an Inf scaled by 0 may be any NaN (the x86 and the GPU one differ).
  std::vector<float> got_bits = got, want_bits = clipped_reference(g, norm, max_norm);
  for (size_t i = 0; i < got_bits.size() && i < want_bits.size(); ++i)
    if (std::isnan(got_bits[i]) && std::isnan(want_bits[i]) && !std::isnan(g[i]))
      got_bits[i] = want_bits[i];
  require_bitwise_equal(got_bits, want_bits, "clipped gradients");
  return {norm, got};
}

/// clip_grad_norm_deferred over n gradients with max_norm below the norm (clips), at the norm
/// (the factor rounds to just below 1, or to 1), above it (no change), 0 and -1 (the norm
/// only), and with an Inf (factor 0) or a NaN (no clipping) among the gradients.
inline void conform_clip_grad_norm(KernelTarget& t, int64_t n, uint64_t seed) {
  const std::vector<float> g = make_norm_values(n, seed, 1.0);
  const double norm = ref_l2_norm(g);
  const struct {
    double max_norm;
    const char* what;
    bool clips;
  } cases[] = {{0.37 * norm, "below the norm", true}, {1e-3 * norm, "far below the norm", true},
               {norm, "at the norm", false},          {3.0 * norm, "above the norm", false},
               {0.0, "0: norm only", false},          {-1.0, "-1: norm only", false}};
  for (const auto& c : cases) {
    INFO(t.backend().name() << " clip_grad_norm_deferred, n " << n << ", max_norm " << c.what);
    const auto got = run_clip_grad_norm(t, g, c.max_norm);
    if (c.clips && n > 0) CHECK(got.second != g);
    if (c.max_norm != norm && !c.clips) require_bitwise_equal(got.second, g, "not clipped");
    t.require_guards_intact("clip_grad_norm_deferred");
    t.clear();
  }
  if (n < 3) return;
  for (float special : {std::numeric_limits<float>::infinity(), kNaN}) {
    INFO(t.backend().name() << " clip_grad_norm_deferred, n " << n << ", with " << special);
    std::vector<float> bad = g;
    bad[static_cast<size_t>(n / 2)] = special;
    const auto got = run_clip_grad_norm(t, bad, 1.0);
    CHECK(std::isnan(got.first) == std::isnan(special));
    t.require_guards_intact("clip_grad_norm_deferred");
    t.clear();
  }
}

// ---- elementwise -------------------------------------------------------------------------

inline float quiet_nan_with_payload(uint32_t payload) {
  const uint32_t bits = 0x7fc00000u | payload;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// Random values with exact zeros of both signs and a NaN whose payload the poison lacks.
inline std::vector<float> special_values(int64_t n, uint64_t seed) {
  std::vector<float> v = random_floats(static_cast<size_t>(n), seed);
  if (n > 1) v[1] = 0.0f;
  if (n > 2) v[2] = -0.0f;
  if (n > 3) v[static_cast<size_t>(n - 1)] = quiet_nan_with_payload(0x123);
  return v;
}

/// relu(x): a negative x becomes +0; anything else passes unchanged: NaN, payload and all, as
/// in torch (a diverged run must show), and -0.
inline std::vector<float> relu_reference(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
  return y;
}

/// The ReLU backward is a select: dy where y > 0, else exactly 0 (even for an infinite or NaN
/// gradient behind a dead unit).
inline std::vector<float> relu_backward_reference(const std::vector<float>& dy,
                                                  const std::vector<float>& y) {
  std::vector<float> dx(dy.size());
  for (size_t i = 0; i < dy.size(); ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  return dx;
}

inline void conform_relu(KernelTarget& t, int64_t rows, int64_t cols, uint64_t seed) {
  const int64_t n = rows * cols;
  INFO(t.backend().name() << " relu, shape " << rows << " x " << cols);
  const std::vector<float> x = special_values(n, seed);
  const std::vector<float> y_ref = relu_reference(x);
  ddp::Tensor xt = t.make(x, rows, cols), yt = t.poisoned(rows, cols);
  t.backend().relu_forward(xt, yt);
  require_bitwise_equal(t.read(yt), y_ref, "relu_forward");
  t.backend().relu_forward(xt, xt);
  require_bitwise_equal(t.read(xt), y_ref, "relu_forward in place");

  // Backward through the forward's output (zeros, positives, a NaN), with NaN gradients behind a
  // dead unit (the last) and a live one (the first, when there is room).
  std::vector<float> y = y_ref, g = special_values(n, seed + 1);
  if (n > 4) {
    y[0] = 0.75f;
    g[0] = quiet_nan_with_payload(0x456);
  }
  const std::vector<float> dx_ref = relu_backward_reference(g, y);
  ddp::Tensor gt = t.make(g, rows, cols), y2 = t.make(y, rows, cols), dxt = t.poisoned(rows, cols);
  t.backend().relu_backward(gt, y2, dxt);
  require_bitwise_equal(t.read(dxt), dx_ref, "relu_backward");
  t.backend().relu_backward(gt, y2, gt);
  require_bitwise_equal(t.read(gt), dx_ref, "relu_backward in place");
  t.require_guards_intact("relu");
  t.clear();
}

inline void conform_fill_scale_copy(KernelTarget& t, int64_t rows, int64_t cols, uint64_t seed) {
  const int64_t n = rows * cols;
  INFO(t.backend().name() << " fill, scale, copy, shape " << rows << " x " << cols);
  ddp::Tensor a = t.poisoned(rows, cols);
  t.backend().fill(a, 1.5f);
  require_bitwise_equal(t.read(a), std::vector<float>(static_cast<size_t>(n), 1.5f), "fill");

  const std::vector<float> v = special_values(n, seed);
  std::vector<float> scaled(v.size());
  for (size_t i = 0; i < v.size(); ++i) scaled[i] = v[i] * -0.37f;
  ddp::Tensor s = t.make(v, rows, cols);
  t.backend().scale(s, -0.37f);
  require_equal_any_nan(t.read(s), scaled, "scale");

  // A copy keeps every bit, the NaN's payload included.
  ddp::Tensor dst = t.poisoned(rows, cols);
  t.backend().copy(t.make(v, rows, cols), dst);
  require_bitwise_equal(t.read(dst), v, "copy");
  t.backend().copy(dst, dst);  // the same view: nothing to do
  require_bitwise_equal(t.read(dst), v, "copy onto itself");
  t.require_guards_intact("fill, scale, copy");
  t.clear();
}

/// Non-finite values at the ends and in the middle (the largest finite float and a denormal are
/// not), counted in a view whose neighbours are NaN too: only the view's own count.
inline void conform_count_nonfinite(KernelTarget& t, int64_t rows, int64_t cols, uint64_t seed) {
  const int64_t n = rows * cols;
  INFO(t.backend().name() << " count_nonfinite, shape " << rows << " x " << cols);
  std::vector<float> v = random_floats(static_cast<size_t>(n), seed);
  CHECK(t.backend().count_nonfinite(t.make(v, rows, cols)) == 0);
  const float specials[] = {kNaN, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  const std::set<int64_t> at = {0, n / 2, n - 1};  // fewer than 3 for tiny shapes
  int64_t expected = 0;
  for (int64_t i : at) v[static_cast<size_t>(i)] = specials[expected++];
  std::vector<size_t> others;
  for (int64_t i = 0; i < n && others.size() < 2; ++i)
    if (!at.count(i)) others.push_back(static_cast<size_t>(i));
  if (others.size() > 0) v[others[0]] = std::numeric_limits<float>::max();
  if (others.size() > 1) v[others[1]] = std::numeric_limits<float>::denorm_min();
  std::vector<float> padded = v;
  padded.insert(padded.begin(), kNaN);
  padded.push_back(kNaN);
  const ddp::Tensor whole = t.make(padded, 1, n + 2);
  CHECK(t.backend().count_nonfinite(ddp::Tensor{whole.data + 1, rows, cols, whole.device}) ==
        expected);
  CHECK(t.backend().count_nonfinite(ddp::Tensor{whole.data, 0, 5, whole.device}) == 0);
  t.require_guards_intact("count_nonfinite");
  t.clear();
}

/// Shapes of the elementwise kernels: around the vector width, and ragged.
inline std::vector<std::pair<int64_t, int64_t>> conformance_elementwise_shapes(bool large) {
  std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {1, 3},  {1, 4},   {1, 5},
                                                     {3, 5}, {8, 16}, {17, 33}, {65, 33}};
  if (large) shapes.insert(shapes.end(), {{1000, 1027}, {256, 4096}});
  return shapes;
}

}  // namespace ddp_kernel_test
