// Model FLOPs utilisation (mfu.h).
#include "train/mfu.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "core/clock.h"
#include "kernels/cuda/cuda.h"
#include "train/replica.h"

namespace ddp {

double flops_per_sample(const std::vector<int64_t>& layers) {
  double weights = 0;
  for (size_t i = 0; i + 1 < layers.size(); ++i)
    weights += static_cast<double>(layers[i]) * static_cast<double>(layers[i + 1]);
  return 6.0 * weights;
}

double model_flops_utilisation(double flops_per_sample, double samples_per_sec,
                               double peak_per_rank, int ranks) {
  if (peak_per_rank <= 0 || ranks <= 0) return 0.0;
  return flops_per_sample * samples_per_sec / (peak_per_rank * ranks);
}

// NVIDIA's A100 and H100 whitepapers, per SM and clock, dense: A100 (8.0) 64 FP32 FMA and 1024
// FP16/BF16 tensor FMA with float32 accumulation; H100 (9.0) twice both. An FMA is 2 FLOPs.
double gpu_flops_per_clock_per_sm(int major, int minor, Precision precision) {
  const bool sixteen = precision != Precision::Fp32;
  if (major == 8 && minor == 0) return sixteen ? 2048.0 : 128.0;
  if (major == 9 && minor == 0) return sixteen ? 4096.0 : 256.0;
  return 0.0;
}

namespace {

// One GEMM y[n,n] = x·wᵀ at `precision`, square so that no shape favours the kernels.
class SquareGemm {
 public:
  static constexpr int64_t kN = 512;
  SquareGemm(Backend& be, Precision precision) : be_(be) {
    const std::optional<Half> format = mixed_format(precision);
    if (format) mixed_ = be.mixed_linear(*format);
    usable_ = !format || mixed_ != nullptr;
    if (!usable_) return;
    for (Buffer* b : {&x_, &w_, &y_}) *b = Buffer(kN * kN, Device::CPU);
    bias_ = Buffer(kN, Device::CPU);
    x = Tensor::of(x_, kN, kN);
    w = Tensor::of(w_, kN, kN);
    y = Tensor::of(y_, kN, kN);
    b = Tensor::of(bias_, 1, kN);
    for (Tensor* t : {&x, &w, &b}) be.fill(*t, 0.01f);
    if (!mixed_) return;
    x16_ = half_buffer(kN * kN, Device::CPU);
    w16_ = half_buffer(kN * kN, Device::CPU);
    x16 = Tensor16::of(x16_, kN, kN, *format);
    w16 = Tensor16::of(w16_, kN, kN, *format);
    mixed_->round(x, x16);
    mixed_->round(w, w16);
  }
  bool usable() const { return usable_; }
  void run() {
    if (mixed_) {
      mixed_->forward(x16, w16, b, y);
    } else {
      be_.linear_forward(x, w, b, /*fuse_relu=*/false, y);
    }
    be_.synchronize();
  }
  static double flops() { return 2.0 * kN * kN * kN; }

 private:
  Backend& be_;
  MixedLinear* mixed_ = nullptr;
  bool usable_ = false;
  Buffer x_, w_, y_, bias_, x16_, w16_;
  Tensor x, w, y, b;
  Tensor16 x16, w16;
};

}  // namespace

double measure_gemm_ceiling(Backend& be, Precision precision, double budget_s) {
  SquareGemm gemm(be, precision);
  if (!gemm.usable()) return 0.0;
  gemm.run();  // warm: first-touch pages, the kernels' own setup
  double best = 0;
  const double start = seconds_now();
  double now = start;
  do {  // the best call: the others lost time to whatever else ran on the core
    const double t0 = now;
    gemm.run();
    now = seconds_now();
    if (now > t0) best = std::max(best, SquareGemm::flops() / (now - t0));
  } while (now - start < budget_s);
  return best;
}

namespace {

// The CPU's ceiling at `precision`, measured once per process: it does not change between runs,
// and a process may train many times (a test suite, a sweep), each paying 0.15 s otherwise.
double cpu_ceiling(Backend& be, Precision precision) {
  static std::mutex mu;
  static std::map<Precision, double> measured;
  std::lock_guard<std::mutex> lock(mu);
  const auto known = measured.find(precision);
  if (known != measured.end()) return known->second;
  return measured[precision] = measure_gemm_ceiling(be, precision, 0.15);
}

}  // namespace

PeakFlops rank_peak(double configured_tflops, Backend& be, int gpu, Precision precision) {
  if (configured_tflops > 0) return {configured_tflops * 1e12, "output.peak_tflops"};
  if (gpu < 0) return {cpu_ceiling(be, precision), "measured GEMM ceiling"};
  const CudaDeviceInfo info = cuda_device_info(gpu);
  const int major = info.compute_major, minor = info.compute_minor;
  std::ostringstream source;
  source << "sm_" << major << minor << " " << to_string(precision);
  const double per_clock = gpu_flops_per_clock_per_sm(major, minor, precision);
  if (per_clock <= 0) return {0.0, source.str() + " is not in the peak table"};
  // fp32_peak_gflops is 2 x FP32 lanes x SMs x clock from the device's properties: the same
  // SMs and clock at the precision's rate.
  const double fp32_per_clock = gpu_flops_per_clock_per_sm(major, minor, Precision::Fp32);
  source << ": " << info.sm_count << " SMs x " << per_clock << " FLOP/clock";
  return {info.fp32_peak_gflops * 1e9 * (per_clock / fp32_per_clock), source.str()};
}

}  // namespace ddp
