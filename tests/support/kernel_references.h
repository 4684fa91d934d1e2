// The double-precision references every kernel of every backend is checked against (plain loops,
// each value with its condition: the sum of the magnitudes of the terms that make it), the
// float32 transcription of torch.optim.SGD, the test data they run on, and the two comparisons
// every result goes through: accurate to a tolerance of its condition, or bitwise equal.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "kernels/backend.h"
#include "test_helpers.h"

namespace ddp_kernel_test {

constexpr double kTol = 1e-5;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
// Written around every view a test makes; a kernel that stores past its view's ends changes it.
constexpr float kGuardValue = -7777.25f;
// Floats of guard zone on each side: 4 keeps a view of a fresh buffer 16-byte aligned.
constexpr int64_t kGuard = 4;

inline std::vector<float> random_floats(size_t n, uint64_t seed, double lo = -1.0,
                                        double hi = 1.0) {
  return ddp_test::random_vector(n, seed, lo, hi);
}

inline std::vector<int32_t> random_labels(int64_t n, int64_t classes, uint64_t seed) {
  ddp::Rng rng(seed);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (auto& l : labels) l = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
  return labels;
}

// ---- Linear layer products ---------------------------------------------------------------

struct LinearShape {
  int64_t batch, in, out;
};

inline std::string describe(const LinearShape& s) {
  std::ostringstream oss;
  oss << "batch " << s.batch << ", in " << s.in << ", out " << s.out;
  return oss.str();
}

/// Inputs of all three products of one layer: x, w, bias (forward), dy and the ReLU output
/// that masks dx (backward input), and dw0/db0 that accumulation starts from.
struct LinearData {
  LinearShape s;
  std::vector<float> x, w, bias, dy, relu_out, dw0, db0;
};

inline LinearData make_linear_data(const LinearShape& s, uint64_t seed) {
  LinearData d;
  d.s = s;
  d.x = random_floats(static_cast<size_t>(s.batch * s.in), seed);
  d.w = random_floats(static_cast<size_t>(s.out * s.in), seed + 1, -0.5, 0.5);
  d.bias = random_floats(static_cast<size_t>(s.out), seed + 2);
  d.dy = random_floats(static_cast<size_t>(s.batch * s.out), seed + 3);
  d.relu_out = random_floats(static_cast<size_t>(s.batch * s.in), seed + 4);
  for (float& v : d.relu_out) v = v < 0.0f ? 0.0f : v;  // about half of the units dead
  d.dw0 = random_floats(static_cast<size_t>(s.out * s.in), seed + 5);
  d.db0 = random_floats(static_cast<size_t>(s.out), seed + 6);
  return d;
}

/// Reference values in double and each element's condition (sum of |terms|).
struct Reference {
  std::vector<double> value, cond;
};

inline Reference ref_forward(const LinearData& d, bool relu) {
  const LinearShape& s = d.s;
  Reference r;
  r.value.resize(static_cast<size_t>(s.batch * s.out));
  r.cond.resize(r.value.size());
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t o = 0; o < s.out; ++o) {
      double acc = d.bias[o], cond = std::fabs(double(d.bias[o]));
      for (int64_t i = 0; i < s.in; ++i) {
        const double t = double(d.x[b * s.in + i]) * double(d.w[o * s.in + i]);
        acc += t;
        cond += std::fabs(t);
      }
      r.value[b * s.out + o] = relu ? std::max(acc, 0.0) : acc;
      r.cond[b * s.out + o] = cond;
    }
  }
  return r;
}

inline Reference ref_backward_input(const LinearData& d, bool mask) {
  const LinearShape& s = d.s;
  Reference r;
  r.value.resize(static_cast<size_t>(s.batch * s.in));
  r.cond.resize(r.value.size());
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.in; ++i) {
      double acc = 0.0, cond = 0.0;
      for (int64_t o = 0; o < s.out; ++o) {
        const double t = double(d.dy[b * s.out + o]) * double(d.w[o * s.in + i]);
        acc += t;
        cond += std::fabs(t);
      }
      // A dead unit's gradient is exactly 0 (a select): condition 0 demands it exactly.
      if (mask && !(d.relu_out[b * s.in + i] > 0.0f)) acc = cond = 0.0;
      r.value[b * s.in + i] = acc;
      r.cond[b * s.in + i] = cond;
    }
  }
  return r;
}

/// {dw, db}, starting from dw0/db0 when accumulating.
inline std::pair<Reference, Reference> ref_backward_params(const LinearData& d, bool accumulate) {
  const LinearShape& s = d.s;
  Reference dw, db;
  dw.value.resize(static_cast<size_t>(s.out * s.in));
  dw.cond.resize(dw.value.size());
  db.value.resize(static_cast<size_t>(s.out));
  db.cond.resize(db.value.size());
  for (int64_t o = 0; o < s.out; ++o) {
    for (int64_t i = 0; i < s.in; ++i) {
      double acc = accumulate ? d.dw0[o * s.in + i] : 0.0;
      double cond = std::fabs(acc);
      for (int64_t b = 0; b < s.batch; ++b) {
        const double t = double(d.dy[b * s.out + o]) * double(d.x[b * s.in + i]);
        acc += t;
        cond += std::fabs(t);
      }
      dw.value[o * s.in + i] = acc;
      dw.cond[o * s.in + i] = cond;
    }
    double acc = accumulate ? d.db0[o] : 0.0;
    double cond = std::fabs(acc);
    for (int64_t b = 0; b < s.batch; ++b) {
      acc += d.dy[b * s.out + o];
      cond += std::fabs(double(d.dy[b * s.out + o]));
    }
    db.value[o] = acc;
    db.cond[o] = cond;
  }
  return {dw, db};
}

// ---- softmax cross-entropy ---------------------------------------------------------------

struct XentReference {
  double loss_sum = 0.0, loss_cond = 0.0;
  int64_t correct = 0;
  Reference dlogits;
};

/// Uniform logits, plus rows that test the first-maximum rule (row 0: all equal; row 1: the
/// maximum twice, label on the second) and stability (row 2: shifted by +60).
inline std::vector<float> make_logits(int64_t rows, int64_t classes, uint64_t seed) {
  std::vector<float> l = random_floats(static_cast<size_t>(rows * classes), seed, -4.0, 4.0);
  if (rows > 0)
    for (int64_t c = 0; c < classes; ++c) l[c] = 0.5f;
  if (rows > 1 && classes >= 3) l[classes + 1] = l[classes + 2] = 9.0f;
  if (rows > 2)
    for (int64_t c = 0; c < classes; ++c) l[2 * classes + c] += 60.0f;
  return l;
}

inline std::vector<int32_t> make_xent_labels(int64_t rows, int64_t classes, uint64_t seed) {
  std::vector<int32_t> labels = random_labels(rows, classes, seed);
  if (rows > 0) labels[0] = 0;
  if (rows > 1 && classes >= 3) labels[1] = 2;
  return labels;
}

inline XentReference ref_xent(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                              int64_t classes, double grad_scale) {
  XentReference ref;
  ref.dlogits.value.resize(logits.size());
  ref.dlogits.cond.resize(logits.size());
  for (size_t r = 0; r < labels.size(); ++r) {
    const float* l = &logits[r * classes];
    int64_t argmax = 0;
    for (int64_t j = 1; j < classes; ++j)
      if (l[j] > l[argmax]) argmax = j;
    const double max = l[argmax];
    double sum = 0.0;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(double(l[j]) - max);
    const double lse = max + std::log(sum);
    const double label_logit = l[labels[r]];
    ref.loss_sum += lse - label_logit;
    ref.loss_cond += std::fabs(lse) + std::fabs(label_logit) + 1.0;
    ref.correct += argmax == labels[r] ? 1 : 0;
    for (int64_t j = 0; j < classes; ++j) {
      const double p = std::exp(double(l[j]) - lse);
      const double onehot = j == labels[r] ? 1.0 : 0.0;
      ref.dlogits.value[r * classes + j] = (p - onehot) * grad_scale;
      // p = exp(l - lse): an error in the exponent's operands is a relative error in p.
      ref.dlogits.cond[r * classes + j] =
          std::fabs(grad_scale) * (p * (1.0 + std::fabs(lse) + std::fabs(double(l[j]))) + onehot);
    }
  }
  return ref;
}

// ---- gradient norm and clipping ------------------------------------------------------------

/// Gradients for the norm: uniform in (-1, 1) times 2^k (k uniform in -8..8, so magnitudes
/// spread over five decades) times `scale`. At scale 1e25 or 1e-25 every square overflows or
/// underflows float32: only a sum of squares in double gets the norm.
inline std::vector<float> make_norm_values(int64_t n, uint64_t seed, double scale) {
  ddp::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    const int k = static_cast<int>(rng.below(17)) - 8;
    x = static_cast<float>(std::ldexp(rng.uniform(-1.0, 1.0), k) * scale);
  }
  return v;
}

/// The L2 norm of v with every square and the sum in long double (64 significant bits on x86:
/// 2^11 times double's precision, so the reference error is far below the 1e-12 tolerance).
inline double ref_l2_norm(const std::vector<float>& v) {
  long double sum = 0.0L;
  for (float x : v) sum += static_cast<long double>(x) * static_cast<long double>(x);
  return static_cast<double>(std::sqrt(sum));
}

/// clip_grad_norm_ on the host with a given norm: g * clip_coefficient(norm, max_norm) when
/// max_norm > 0 and that factor is below 1 (NaN is not), else g unchanged. Every backend's
/// clipped gradients are bitwise this with its own norm.
inline std::vector<float> clipped_reference(const std::vector<float>& g, double norm,
                                            double max_norm) {
  if (!(max_norm > 0)) return g;
  const float coef = ddp::clip_coefficient(norm, max_norm);
  if (!(coef < 1.0f)) return g;
  std::vector<float> out(g.size());
  for (size_t i = 0; i < g.size(); ++i) out[i] = g[i] * coef;
  return out;
}

// ---- SGD ---------------------------------------------------------------------------------

/// ATen's `self.add(other, alpha=a)` on float: vec::fmadd(other, a, self) on the vectorised CPU
/// path and a contracted multiply-add under nvcc, i.e. one rounding.
inline float aten_add(float self, float other, float alpha) { return std::fma(other, alpha, self); }

/// torch.optim.SGD's _single_tensor_sgd, transcribed op for op in float32.
inline void torch_sgd_reference(std::vector<float>& p, const std::vector<float>& grad,
                                std::vector<float>& buf, const ddp::SgdOptions& o,
                                bool first_step) {
  for (size_t i = 0; i < p.size(); ++i) {
    float g = grad[i];
    if (o.weight_decay != 0.0f) g = aten_add(g, p[i], o.weight_decay);
    if (o.momentum != 0.0f) {
      if (first_step) {
        buf[i] = g;  // torch.clone(grad)
      } else {
        buf[i] = buf[i] * o.momentum;                                                 // mul_
        buf[i] = aten_add(buf[i], g, static_cast<float>(1.0 - double(o.dampening)));  // add_
      }
      g = o.nesterov ? aten_add(g, buf[i], o.momentum) : buf[i];
    }
    p[i] = aten_add(p[i], g, -o.lr);
  }
}

/// The documented algorithm in double: an independent check of the float transcription.
inline void sgd_reference_double(std::vector<double>& p, const std::vector<float>& grad,
                                 std::vector<double>& buf, const ddp::SgdOptions& o,
                                 bool first_step) {
  for (size_t i = 0; i < p.size(); ++i) {
    double g = grad[i];
    if (o.weight_decay != 0.0f) g += double(o.weight_decay) * p[i];
    if (o.momentum != 0.0f) {
      buf[i] = first_step ? g : double(o.momentum) * buf[i] + (1.0 - double(o.dampening)) * g;
      g = o.nesterov ? g + double(o.momentum) * buf[i] : buf[i];
    }
    p[i] -= double(o.lr) * g;
  }
}

/// Every option combination torch.optim.SGD accepts (nesterov needs momentum, no dampening).
inline std::vector<ddp::SgdOptions> sgd_option_combinations() {
  std::vector<ddp::SgdOptions> all;
  for (float momentum : {0.0f, 0.9f})
    for (float dampening : {0.0f, 0.1f})
      for (float weight_decay : {0.0f, 0.01f})
        for (bool nesterov : {false, true}) {
          if (nesterov && !(momentum > 0.0f && dampening == 0.0f)) continue;
          ddp::SgdOptions o;
          o.lr = 0.1f;
          o.momentum = momentum;
          o.dampening = dampening;
          o.weight_decay = weight_decay;
          o.nesterov = nesterov;
          all.push_back(o);
        }
  return all;
}

inline std::string describe(const ddp::SgdOptions& o) {
  std::ostringstream oss;
  oss << "lr " << o.lr << ", momentum " << o.momentum << ", dampening " << o.dampening
      << ", weight_decay " << o.weight_decay << ", nesterov " << o.nesterov;
  return oss.str();
}

// ---- Adam / AdamW -------------------------------------------------------------------------

/// torch.optim.Adam's / AdamW's hyper-parameters as Python holds them (doubles).
struct AdamCase {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool amsgrad = false, decoupled = false;  ///< decoupled: AdamW
};

/// The kernel's scalars for update number `step`, formed as torch 1.13's Python code forms
/// them (_single_tensor_adam, capturable=False): doubles, each rounded to float where a tensor
/// op takes it.
inline ddp::AdamStep torch_adam_scalars(const AdamCase& c, long step) {
  const double t = static_cast<double>(static_cast<float>(step));  // state['step'].item()
  const double bias_correction1 = 1 - std::pow(c.beta1, t);
  const double bias_correction2 = 1 - std::pow(c.beta2, t);
  const double step_size = c.lr / bias_correction1;
  ddp::AdamStep s;
  s.beta1 = static_cast<float>(c.beta1);
  s.one_minus_beta1 = static_cast<float>(1 - c.beta1);
  s.beta2 = static_cast<float>(c.beta2);
  s.one_minus_beta2 = static_cast<float>(1 - c.beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.neg_step_size = static_cast<float>(-step_size);
  s.eps = static_cast<float>(c.eps);
  s.decoupled = c.decoupled;
  s.amsgrad = c.amsgrad;
  if (c.decoupled) {
    s.decay = static_cast<float>(1 - c.lr * c.weight_decay);
  } else {
    s.weight_decay = static_cast<float>(c.weight_decay);
  }
  return s;
}

/// ATen's `self.addcmul(a, b, value=v)` on float: `self + v * a * b`, which the CPU kernel's
/// compiler contracts into one fused multiply-add of (v·a) and b (checked against torch 1.13).
inline float aten_addcmul(float self, float a, float b, float value) {
  return std::fma(value * a, b, self);
}

/// torch.maximum on float: NaN when either is NaN.
inline float aten_maximum(float a, float b) { return (a != a || b != b) ? a + b : std::max(a, b); }

/// torch 1.13's _single_tensor_adam / _single_tensor_adamw, transcribed op for op in float32.
inline void torch_adam_reference(std::vector<float>& p, const std::vector<float>& grad,
                                 std::vector<float>& m, std::vector<float>& v,
                                 std::vector<float>& vmax, const ddp::AdamStep& s) {
  for (size_t i = 0; i < p.size(); ++i) {
    float g = grad[i];
    if (s.decoupled) {
      p[i] = p[i] * s.decay;  // param.mul_(1 - lr * wd)
    } else if (s.weight_decay != 0.0f) {
      g = aten_add(g, p[i], s.weight_decay);  // grad.add(param, alpha=wd)
    }
    m[i] = aten_add(m[i] * s.beta1, g, s.one_minus_beta1);         // mul_(beta1).add_(g, 1-beta1)
    v[i] = aten_addcmul(v[i] * s.beta2, g, g, s.one_minus_beta2);  // mul_(beta2).addcmul_
    float second = v[i];
    if (s.amsgrad) second = vmax[i] = aten_maximum(vmax[i], v[i]);
    const float denom = std::sqrt(second) / s.bias_correction2_sqrt + s.eps;
    p[i] = p[i] + s.neg_step_size * m[i] / denom;  // addcdiv_: self + value * t1 / t2
  }
}

/// The textbook algorithm in double (Kingma & Ba; Loshchilov & Hutter for AdamW): an
/// independent check of the float transcription.
inline void adam_reference_double(std::vector<double>& p, const std::vector<float>& grad,
                                  std::vector<double>& m, std::vector<double>& v,
                                  std::vector<double>& vmax, const AdamCase& c, long step) {
  const double bc1 = 1 - std::pow(c.beta1, double(step)), bc2 = 1 - std::pow(c.beta2, double(step));
  for (size_t i = 0; i < p.size(); ++i) {
    double g = grad[i];
    if (c.decoupled) {
      p[i] -= c.lr * c.weight_decay * p[i];
    } else {
      g += c.weight_decay * p[i];
    }
    m[i] = c.beta1 * m[i] + (1 - c.beta1) * g;
    v[i] = c.beta2 * v[i] + (1 - c.beta2) * g * g;
    double second = v[i];
    if (c.amsgrad) second = vmax[i] = std::max(vmax[i], v[i]);
    p[i] -= c.lr * (m[i] / bc1) / (std::sqrt(second / bc2) + c.eps);
  }
}

/// Adam and AdamW, with and without weight decay and AMSGrad, at PyTorch's defaults otherwise
/// (one case with other betas and eps).
inline std::vector<AdamCase> adam_cases() {
  std::vector<AdamCase> all;
  for (bool decoupled : {false, true})
    for (double weight_decay : {0.0, 0.01})
      for (bool amsgrad : {false, true}) {
        AdamCase c;
        c.decoupled = decoupled;
        c.weight_decay = weight_decay;
        c.amsgrad = amsgrad;
        all.push_back(c);
      }
  AdamCase other;
  other.lr = 0.05, other.beta1 = 0.5, other.beta2 = 0.9, other.eps = 1e-3;
  all.push_back(other);
  return all;
}

inline std::string describe(const AdamCase& c) {
  std::ostringstream oss;
  oss << (c.decoupled ? "adamw" : "adam") << ", lr " << c.lr << ", betas (" << c.beta1 << ", "
      << c.beta2 << "), eps " << c.eps << ", weight_decay " << c.weight_decay << ", amsgrad "
      << c.amsgrad;
  return oss.str();
}

// ---- comparisons -------------------------------------------------------------------------

/// The accuracy check of every float kernel result: each value finite,
/// ||got - ref|| <= tol * ||ref|| and |got_i - ref_i| <= tol * cond_i + tiny for every i, where
/// cond_i is the sum of the magnitudes of the terms that make element i (a dot product's
/// sum of |a_k * b_k|, plus |bias| or |initial value|). cond_i = 0 demands ref_i exactly.
inline void require_accurate(const std::vector<float>& got, const std::vector<double>& ref,
                             const std::vector<double>& cond, const std::string& what,
                             double tol = kTol) {
  INFO(what);
  REQUIRE(got.size() == ref.size());
  REQUIRE(cond.size() == ref.size());
  constexpr double kTiny = 1e-30;
  double diff2 = 0.0, ref2 = 0.0;
  int64_t bad = -1;
  std::string reason;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = got[i], r = ref[i];
    const double err = std::fabs(g - r);
    diff2 += (g - r) * (g - r);
    ref2 += r * r;
    if (bad < 0 && !std::isfinite(g)) {
      bad = static_cast<int64_t>(i);
      reason = "not finite";
    } else if (bad < 0 && !(err <= tol * cond[i] + kTiny)) {
      bad = static_cast<int64_t>(i);
      reason = "error above tol * cond";
    }
  }
  if (bad >= 0) {
    const size_t i = static_cast<size_t>(bad);
    std::ostringstream oss;
    oss << std::setprecision(10) << "element " << i << " (" << reason << "): got " << got[i]
        << ", reference " << ref[i] << ", cond " << cond[i];
    FAIL(oss.str());
  }
  const double diff_norm = std::sqrt(diff2), ref_norm = std::sqrt(ref2);
  INFO("norm-wise: ||got - ref|| = " << diff_norm << ", ||ref|| = " << ref_norm);
  REQUIRE(diff_norm <= tol * ref_norm + kTiny);
}

inline void require_accurate(const std::vector<float>& got, const Reference& ref,
                             const std::string& what, double tol = kTol) {
  require_accurate(got, ref.value, ref.cond, what, tol);
}

/// Bitwise equality (NaN payloads included), reporting the first difference.
inline void require_bitwise_equal(const std::vector<float>& got, const std::vector<float>& want,
                                  const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], sizeof a);
    std::memcpy(&b, &want[i], sizeof b);
    if (a != b) {
      std::ostringstream oss;
      oss << std::setprecision(10) << "element " << i << ": got " << got[i] << " (0x" << std::hex
          << a << "), want " << std::dec << want[i] << " (0x" << std::hex << b << ")";
      FAIL(oss.str());
    }
  }
}

/// Bitwise equality, except that where `want` is NaN any NaN will do: IEEE 754 leaves the payload
/// of an arithmetic result's NaN to the implementation (x86 keeps the operand's, an NVIDIA GPU
/// gives the canonical 0x7fffffff), so only selects and copies must keep it.
inline void require_equal_any_nan(const std::vector<float>& got, const std::vector<float>& want,
                                  const std::string& what) {
  std::vector<float> expected = want;
  for (size_t i = 0; i < expected.size() && i < got.size(); ++i)
    if (std::isnan(expected[i]) && std::isnan(got[i])) expected[i] = got[i];
  require_bitwise_equal(got, expected, what + " (any NaN payload)");
}

// Gram-Schmidt in double on the columns of a rows x cols row-major matrix, as PowerSGD's
// orthogonalize_columns (comm/powersgd.h) and its device kernel do it: each column projected out
// of the ones before it twice, then normalised; a zero column left zero.
inline void orthogonalize_columns(std::vector<double>& a, size_t rows, size_t cols) {
  const auto dot = [&](size_t x, size_t y) {
    double d = 0.0;
    for (size_t i = 0; i < rows; ++i) d += a[i * cols + x] * a[i * cols + y];
    return d;
  };
  for (size_t c = 0; c < cols; ++c) {
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t before = 0; before < c; ++before) {
        const double d = dot(before, c);
        for (size_t i = 0; i < rows; ++i) a[i * cols + c] -= d * a[i * cols + before];
      }
    }
    const double norm = std::sqrt(dot(c, c));
    if (norm > 0.0)
      for (size_t i = 0; i < rows; ++i) a[i * cols + c] /= norm;
  }
}

}  // namespace ddp_kernel_test
