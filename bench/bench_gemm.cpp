// ddp_bench_gemm: the single-core GEMM ceiling (Eigen, 1024^3) and the CPU backend's Linear
// kernels at the Fashion-MNIST model's shapes, as a table; plus the FLOPs of one training step,
// which bench/compare_ddp.sh uses to turn samples/s into GFLOP/s; and the same GEMMs through
// oneDNN's matmul in float32 and bfloat16 beside the backend's Eigen kernels.
// clang-format off (its include sorting would move this below the headers it must precede)
#include "kernels/cpu/eigen_core.h"  // first: see there
// clang-format on

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/float16.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/cpu/onednn_matmul.h"
#include "nn/sequential.h"

namespace ddp {
namespace {

struct Options {
  int repeats = 15;
  int64_t batch = 64;
  std::vector<int64_t> widths = {784, 256, 256, 10};
};

double seconds_now() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

double time_calls(const std::function<void()>& f, int64_t calls) {
  const double t0 = seconds_now();
  for (int64_t i = 0; i < calls; ++i) f();
  return seconds_now() - t0;
}

/// Seconds per call: the median (the typical cost) and the best (what the core can do when
/// nothing else disturbs it) of the timed runs.
struct Timing {
  double median = 0.0;
  double best = 0.0;
};

/// Times f over `repeats` runs. Each run batches enough calls to last >= 5 ms, so clock
/// resolution and call overhead do not dominate microsecond kernels; the calibration runs
/// double as warm-up, bringing caches and the CPU clock to their steady state.
Timing time_per_call(const std::function<void()>& f, int repeats) {
  int64_t calls = 1;
  while (time_calls(f, calls) < 5e-3) calls *= 2;
  std::vector<double> per_call;
  for (int r = 0; r < repeats; ++r)
    per_call.push_back(time_calls(f, calls) / static_cast<double>(calls));
  std::sort(per_call.begin(), per_call.end());
  return Timing{per_call[per_call.size() / 2], per_call.front()};
}

/// A buffer of n values drawn from U(-1, 1), so no kernel runs on zeros or denormals.
Buffer random_buffer(int64_t n, Rng& rng) {
  Buffer b(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) b.data()[i] = static_cast<float>(rng.uniform(-1.0, 1.0));
  return b;
}

void print_header() {
  std::printf("%-34s %-16s %12s %10s %10s\n", "op", "m x n x k", "time/call", "GFLOP/s", "best");
  std::printf("%-34s %-16s %12s %10s %10s\n", std::string(34, '-').c_str(),
              std::string(16, '-').c_str(), std::string(12, '-').c_str(),
              std::string(10, '-').c_str(), std::string(10, '-').c_str());
}

std::string format_seconds(double seconds) {
  char text[32];
  if (seconds < 1e-3) {
    std::snprintf(text, sizeof text, "%.2f us", seconds * 1e6);
  } else {
    std::snprintf(text, sizeof text, "%.3f ms", seconds * 1e3);
  }
  return text;
}

/// One table row: median time per call, GFLOP/s at the median and at the best time (flops = 0
/// for the non-GEMM parts of a step, which get no rate).
void print_row(const std::string& op, const std::string& shape, double flops, const Timing& t) {
  if (flops > 0.0) {
    std::printf("%-34s %-16s %12s %10.2f %10.2f\n", op.c_str(), shape.c_str(),
                format_seconds(t.median).c_str(), flops / t.median * 1e-9, flops / t.best * 1e-9);
  } else {
    std::printf("%-34s %-16s %12s %10s %10s\n", op.c_str(), shape.c_str(),
                format_seconds(t.median).c_str(), "-", "-");
  }
}

/// A row for one GEMM of m x n x k (2·m·n·k FLOPs).
void print_row(const std::string& op, int64_t m, int64_t n, int64_t k, const Timing& t) {
  const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  print_row(op, shape, 2.0 * static_cast<double>(m * n * k), t);
}

/// Plain Eigen C = A * B on n x n row-major matrices. At n = 1024 its best time is the ceiling
/// the training throughput is reported against.
Timing bench_eigen_gemm(int64_t n, int repeats, Rng& rng) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Buffer a = random_buffer(n * n, rng), b = random_buffer(n * n, rng),
         c(static_cast<size_t>(n * n));
  Eigen::Map<const Matrix> ma(a.data(), n, n), mb(b.data(), n, n);
  Eigen::Map<Matrix> mc(c.data(), n, n);
  const Timing t = time_per_call([&] { mc.noalias() = ma * mb; }, repeats);
  print_row(n == 1024 ? "eigen gemm C=A*B (ceiling)" : "eigen gemm C=A*B", n, n, n, t);
  return t;
}

/// The three Linear kernels for x [batch, in] -> y [batch, out]. The (m, n, k) shown is the GEMM
/// each one runs: forward [b,out] = [b,in]·[in,out], backward_input [b,in] = [b,out]·[out,in],
/// backward_params [out,in] = [out,b]·[b,in].
void bench_linear(Backend& be, int64_t batch, int64_t in, int64_t out, int repeats, Rng& rng) {
  Buffer x = random_buffer(batch * in, rng), w = random_buffer(out * in, rng),
         bias = random_buffer(out, rng);
  Buffer dy = random_buffer(batch * out, rng);
  Buffer y(static_cast<size_t>(batch * out)), dx(static_cast<size_t>(batch * in));
  Buffer dw(static_cast<size_t>(out * in)), db(static_cast<size_t>(out));
  Tensor tx = Tensor::of(x, batch, in), tw = Tensor::of(w, out, in), tb = Tensor::of(bias, 1, out);
  Tensor ty = Tensor::of(y, batch, out), tdy = Tensor::of(dy, batch, out);
  Tensor tdx = Tensor::of(dx, batch, in), tdw = Tensor::of(dw, out, in),
         tdb = Tensor::of(db, 1, out);
  const std::string tag = " " + std::to_string(in) + "->" + std::to_string(out);
  print_row("linear_forward" + tag, batch, out, in,
            time_per_call([&] { be.linear_forward(tx, tw, tb, false, ty); }, repeats));
  print_row("linear_backward_input" + tag, batch, in, out,
            time_per_call([&] { be.linear_backward_input(tdy, tw, nullptr, tdx); }, repeats));
  print_row("linear_backward_params" + tag, out, in, batch,
            time_per_call([&] { be.linear_backward_params(tdy, tx, false, tdw, tdb); }, repeats));
}

/// linear_forward on a square 1024 problem: the backend's overhead over plain Eigen.
void bench_linear_square(Backend& be, int repeats, Rng& rng) {
  const int64_t n = 1024;
  Buffer x = random_buffer(n * n, rng), w = random_buffer(n * n, rng), bias = random_buffer(n, rng);
  Buffer y(static_cast<size_t>(n * n));
  Tensor tx = Tensor::of(x, n, n), tw = Tensor::of(w, n, n), tb = Tensor::of(bias, 1, n);
  Tensor ty = Tensor::of(y, n, n);
  print_row("linear_forward 1024->1024", n, n, n,
            time_per_call([&] { be.linear_forward(tx, tw, tb, false, ty); }, repeats));
}

/// GEMM FLOPs of one training step (2 per multiply-add; bias, ReLU, softmax and SGD are left
/// out, they are O(b·width) against O(b·width²)). Forward: 2·b·Σ in·out. Backward: dW for
/// every layer (same count as forward) and dX for every layer but the first, whose input
/// gradient nobody needs (src/nn/sequential.cpp passes dx = nullptr to it).
struct StepFlops {
  double forward = 0, backward = 0;
  double total() const { return forward + backward; }
};

StepFlops step_flops(const std::vector<int64_t>& widths, int64_t batch) {
  StepFlops f;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const double layer = 2.0 * static_cast<double>(batch * widths[i] * widths[i + 1]);
    f.forward += layer;
    f.backward += i == 0 ? layer : 2.0 * layer;
  }
  return f;
}

/// The real model on one core with no communication and no data loading: what one rank of
/// ddp-train could reach at best. Random inputs and labels; a small lr keeps the weights finite
/// over the thousands of timed steps.
class TrainStepBench {
 public:
  TrainStepBench(const Options& opt, Rng& rng)
      : batch_(opt.batch), model_(opt.widths, "relu", opt.batch) {
    std::vector<size_t> offsets;
    for (size_t n : model_.parameter_numels()) {
      offsets.push_back(numel_);
      numel_ += static_cast<int64_t>(n);
    }
    values_ = Buffer(static_cast<size_t>(numel_));
    grads_ = Buffer(static_cast<size_t>(numel_));
    momentum_ = Buffer(static_cast<size_t>(numel_));
    model_.bind(values_.data(), grads_.data(), offsets);
    model_.init_uniform(rng);
    x_ = random_buffer(batch_ * model_.in_features(), rng);
    dlogits_ = Buffer(static_cast<size_t>(batch_ * model_.out_features()));
    for (int64_t i = 0; i < batch_; ++i)
      labels_.push_back(static_cast<int32_t>(rng.below(model_.out_features())));
    sgd_.lr = 1e-4f;
    sgd_.momentum = 0.9f;
  }

  int64_t numel() const { return numel_; }
  void forward(Backend& be) { model_.forward(be, Tensor::of(x_, batch_, model_.in_features())); }
  void forward_xent(Backend& be) {
    const Tensor& logits = model_.forward(be, Tensor::of(x_, batch_, model_.in_features()));
    Tensor dl = Tensor::of(dlogits_, batch_, model_.out_features());
    be.softmax_xent(logits, labels_.data(), 1.0f / static_cast<float>(batch_), &dl);
  }
  void backward(Backend& be) {
    model_.backward(be, Tensor::of(dlogits_, batch_, model_.out_features()), false, [](size_t) {});
  }
  void sgd(Backend& be) {
    Tensor v = Tensor::of(values_, 1, numel_), m = Tensor::of(momentum_, 1, numel_);
    be.sgd_step(v, Tensor::of(grads_, 1, numel_), m, sgd_, false);
  }
  void step(Backend& be) {
    forward_xent(be);
    backward(be);
    sgd(be);
  }

 private:
  int64_t batch_;
  Sequential model_;
  int64_t numel_ = 0;
  Buffer values_, grads_, momentum_, x_, dlogits_;
  std::vector<int32_t> labels_;
  SgdOptions sgd_;
};

/// Times the parts of a step and the whole; returns the whole step's timing.
Timing bench_train_step(Backend& be, const Options& opt, Rng& rng) {
  TrainStepBench bench(opt, rng);
  const StepFlops f = step_flops(opt.widths, opt.batch);
  const std::string shape = "b=" + std::to_string(opt.batch);
  const Timing fwd = time_per_call([&] { bench.forward(be); }, opt.repeats);
  print_row("  step part: model forward", shape, f.forward, fwd);
  const Timing fwd_xent = time_per_call([&] { bench.forward_xent(be); }, opt.repeats);
  print_row("  step part: softmax_xent", shape, 0.0,
            Timing{std::max(0.0, fwd_xent.median - fwd.median), 0.0});
  print_row("  step part: model backward", shape, f.backward,
            time_per_call([&] { bench.backward(be); }, opt.repeats));
  print_row("  step part: sgd_step (momentum)", "n=" + std::to_string(bench.numel()), 0.0,
            time_per_call([&] { bench.sgd(be); }, opt.repeats));
  const Timing step = time_per_call([&] { bench.step(be); }, opt.repeats);
  print_row("train step (fwd+xent+bwd+sgd)", shape, f.total(), step);
  return step;
}

void print_step_flops(const Options& opt, const Timing& step) {
  const StepFlops f = step_flops(opt.widths, opt.batch);
  std::string model;
  for (size_t i = 0; i < opt.widths.size(); ++i)
    model += (i ? "-" : "") + std::to_string(opt.widths[i]);
  std::printf("\nmodel %s, batch %lld per rank: GEMM FLOPs per step\n", model.c_str(),
              static_cast<long long>(opt.batch));
  std::printf("  forward  %12.0f\n  backward %12.0f  (dW all layers + dX all but the first)\n",
              f.forward, f.backward);
  std::printf("  total    %12.0f  = %.0f per sample\n", f.total(),
              f.total() / static_cast<double>(opt.batch));
  std::printf("one core, compute only (train step above, median): %.0f samples/s\n",
              static_cast<double>(opt.batch) / step.median);
}

/// Operands for the oneDNN side of the comparison: the float32 buffers and their bf16 copies
/// (converted once, outside the timing, as a bf16 model would keep its weights).
struct OnednnOperands {
  OnednnOperands(const float* a_f32, const float* b_f32) : a(a_f32), b(b_f32) {}
  const float* a;
  const float* b;
  std::vector<uint16_t> a16, b16;
};

std::vector<uint16_t> to_bf16(const float* x, int64_t n) {
  std::vector<uint16_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = float_to_bf16(x[i]);
  return out;
}

/// GFLOP/s at the median and at the best time.
struct Rate {
  double median = std::nan(""), best = std::nan("");
};

Rate rate_of(double flops, const Timing& t) {
  return Rate{flops / t.median * 1e-9, flops / t.best * 1e-9};
}

/// nan when oneDNN is not built or refuses (its reason on stderr).
Rate onednn_rate(cpu::OnednnMatmul& mm, cpu::MatmulShape s, const OnednnOperands& ops,
                 const float* bias, float* c, int repeats) {
  if (!cpu::onednn_built()) return Rate{};
  const bool bf16 = s.a == cpu::MatType::BF16;
  const void* a = bf16 ? static_cast<const void*>(ops.a16.data()) : ops.a;
  const void* b = bf16 ? static_cast<const void*>(ops.b16.data()) : ops.b;
  try {
    return rate_of(2.0 * static_cast<double>(s.m * s.n * s.k),
                   time_per_call([&] { mm.run(s, a, b, bias, c); }, repeats));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return Rate{};
  }
}

/// One row: the backend's Eigen kernel, then the same GEMM through oneDNN in f32 and in bf16
/// (bf16 operands, f32 result); each as median / best GFLOP/s.
void print_onednn_row(const std::string& op, cpu::MatmulShape s, const std::function<void()>& eigen,
                      OnednnOperands ops, const float* bias, float* c, int repeats) {
  const Rate eigen_rate =
      rate_of(2.0 * static_cast<double>(s.m * s.n * s.k), time_per_call(eigen, repeats));
  cpu::OnednnMatmul mm;
  const Rate f32 = onednn_rate(mm, s, ops, bias, c, repeats);
  if (cpu::onednn_built()) {
    ops.a16 = to_bf16(ops.a, s.m * s.k);
    ops.b16 = to_bf16(ops.b, s.k * s.n);
  }
  s.a = s.b = cpu::MatType::BF16;
  const Rate bf16 = onednn_rate(mm, s, ops, bias, c, repeats);
  const std::string shape =
      std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
  std::printf("%-30s %-15s", op.c_str(), shape.c_str());
  for (const Rate& r : {eigen_rate, f32, bf16}) std::printf(" %7.1f /%7.1f", r.median, r.best);
  std::printf("\n");
}

cpu::MatmulShape matmul_shape(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
  cpu::MatmulShape s;
  s.m = m, s.n = n, s.k = k;
  s.trans_a = trans_a, s.trans_b = trans_b;
  return s;
}

/// A Linear layer's three GEMMs. forward y = x·Wᵀ + bias (W stored [out,in]: trans_b); input
/// gradient dx = dy·W; weight gradient dW = dyᵀ·x (dy stored [b,out]: trans_a; the backend
/// also sums db, oneDNN does not).
void bench_onednn_linear(Backend& be, int64_t batch, int64_t in, int64_t out, int repeats,
                         Rng& rng) {
  Buffer x = random_buffer(batch * in, rng), w = random_buffer(out * in, rng),
         bias = random_buffer(out, rng), dy = random_buffer(batch * out, rng);
  Buffer y(static_cast<size_t>(batch * out)), dx(static_cast<size_t>(batch * in));
  Buffer dw(static_cast<size_t>(out * in)), db(static_cast<size_t>(out));
  Tensor tx = Tensor::of(x, batch, in), tw = Tensor::of(w, out, in), tb = Tensor::of(bias, 1, out);
  Tensor ty = Tensor::of(y, batch, out), tdy = Tensor::of(dy, batch, out);
  Tensor tdx = Tensor::of(dx, batch, in), tdw = Tensor::of(dw, out, in),
         tdb = Tensor::of(db, 1, out);
  const std::string tag = " " + std::to_string(in) + "->" + std::to_string(out);
  cpu::MatmulShape fwd = matmul_shape(batch, out, in, false, true);
  fwd.bias = true;
  print_onednn_row(
      "forward x*W^T+b" + tag, fwd, [&] { be.linear_forward(tx, tw, tb, false, ty); },
      {x.data(), w.data()}, bias.data(), y.data(), repeats);
  print_onednn_row(
      "input grad dy*W" + tag, matmul_shape(batch, in, out, false, false),
      [&] { be.linear_backward_input(tdy, tw, nullptr, tdx); }, {dy.data(), w.data()}, nullptr,
      dx.data(), repeats);
  print_onednn_row(
      "weight grad dy^T*x" + tag, matmul_shape(out, in, batch, true, false),
      [&] { be.linear_backward_params(tdy, tx, false, tdw, tdb); }, {dy.data(), x.data()}, nullptr,
      dw.data(), repeats);
}

/// 1024^3: plain Eigen C = A·B against oneDNN's.
void bench_onednn_square(int repeats, Rng& rng) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int64_t n = 1024;
  Buffer a = random_buffer(n * n, rng), b = random_buffer(n * n, rng),
         c(static_cast<size_t>(n * n));
  Eigen::Map<const Matrix> ma(a.data(), n, n), mb(b.data(), n, n);
  Eigen::Map<Matrix> mc(c.data(), n, n);
  print_onednn_row(
      "gemm C=A*B", matmul_shape(n, n, n, false, false), [&] { mc.noalias() = ma * mb; },
      {a.data(), b.data()}, nullptr, c.data(), repeats);
}

/// The comparison table at batch 256 (what a bf16 path would be sized for).
void bench_onednn(Backend& be, const Options& opt, Rng& rng) {
  const int64_t batch = 256;
  const std::string isa = cpu::onednn_native_bf16_isa();
  std::printf("\noneDNN matmul against the backend's Eigen kernels, batch %lld, one thread; ",
              static_cast<long long>(batch));
  if (!cpu::onednn_built()) {
    std::printf("this build has no oneDNN (nan)\n");
  } else {
    std::printf("native bf16 ISA: %s\n",
                isa.empty() ? "none (bf16 without native dot products)" : isa.c_str());
  }
  std::printf("GFLOP/s at the median / best time; bf16: bf16 operands, f32 result\n\n");
  std::printf("%-30s %-15s %16s %16s %16s\n", "gemm", "m x n x k", "eigen f32", "onednn f32",
              "onednn bf16");
  std::printf("%-30s %-15s %16s %16s %16s\n", std::string(30, '-').c_str(),
              std::string(15, '-').c_str(), std::string(16, '-').c_str(),
              std::string(16, '-').c_str(), std::string(16, '-').c_str());
  for (size_t i = 0; i + 1 < opt.widths.size(); ++i)
    bench_onednn_linear(be, batch, opt.widths[i], opt.widths[i + 1], opt.repeats, rng);
  bench_onednn_square(opt.repeats, rng);
}

int64_t parse_int(const std::string& flag, const char* value) {
  DDP_CHECK(value != nullptr, flag << ": missing value");
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  DDP_CHECK(end != value && *end == '\0' && v >= 1,
            flag << ": expected a positive integer, got '" << value << "'");
  return v;
}

Options parse_options(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeats") {
      opt.repeats = static_cast<int>(parse_int(a, i + 1 < argc ? argv[++i] : nullptr));
    } else if (a == "--batch") {
      opt.batch = parse_int(a, i + 1 < argc ? argv[++i] : nullptr);
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: ddp_bench_gemm [--repeats N (15)] [--batch B (64)]\n");
      std::exit(0);
    } else {
      DDP_THROW("unknown argument '" << a << "' (try --help)");
    }
  }
  return opt;
}

int run(int argc, char** argv) {
  const Options opt = parse_options(argc, argv);
  Rng rng(0);
  auto be = make_cpu_backend();
  std::printf(
      "single core, Eigen %d.%d.%d (%s); time/call and GFLOP/s: median of %d timed runs after a "
      "warm-up; best: the fastest run\n\n",
      EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION,
      Eigen::SimdInstructionSetsInUse(), opt.repeats);
  print_header();
  const int64_t n = 1024;
  const Timing gemm = bench_eigen_gemm(n, opt.repeats, rng);
  for (int64_t smaller : {512, 256}) bench_eigen_gemm(smaller, opt.repeats, rng);
  bench_linear_square(*be, opt.repeats, rng);
  for (size_t i = 0; i + 1 < opt.widths.size(); ++i) {
    bench_linear(*be, opt.batch, opt.widths[i], opt.widths[i + 1], opt.repeats, rng);
  }
  const Timing step = bench_train_step(*be, opt, rng);
  print_step_flops(opt, step);
  bench_onednn(*be, opt, rng);
  // Machine-readable lines for bench/compare_ddp.sh.
  const StepFlops f = step_flops(opt.widths, opt.batch);
  std::printf("\nresult.gemm_ceiling_gflops=%.3f\n",
              2.0 * static_cast<double>(n * n * n) / gemm.best * 1e-9);
  std::printf("result.step_flops=%.0f\n", f.total());
  std::printf("result.flops_per_sample=%.0f\n", f.total() / static_cast<double>(opt.batch));
  std::printf("result.train_step_samples_per_sec=%.1f\n",
              static_cast<double>(opt.batch) / step.median);
  return 0;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  try {
    return ddp::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "ddp_bench_gemm: " << e.what() << "\n";
    return 1;
  }
}
