// ddp_bench_cuda_kernels: the CUDA backend's kernels on one GPU against that GPU's measured
// ceilings: the three Linear GEMMs against cuBLAS SGEMM (fp32, TF32 off) on the same row-major
// operands, the same products in bf16 (training.precision: our WMMA kernels against cuBLAS's
// bf16 GEMM with float32 accumulation), and softmax_xent / sgd_step against a
// device-to-device copy's bandwidth.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/float16.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"

// The library's DDP_CUDA_CHECK lives in a header that only nvcc can compile; this file is C++.
#define BENCH_CUDA_CHECK(call)                                              \
  do {                                                                      \
    const cudaError_t bench_rc_ = (call);                                   \
    if (bench_rc_ != cudaSuccess)                                           \
      DDP_THROW(#call << " failed: " << cudaGetErrorName(bench_rc_) << ": " \
                      << cudaGetErrorString(bench_rc_));                    \
  } while (0)

#define BENCH_CUBLAS_CHECK(call)                                           \
  do {                                                                     \
    const cublasStatus_t bench_st_ = (call);                               \
    if (bench_st_ != CUBLAS_STATUS_SUCCESS)                                \
      DDP_THROW(#call << " failed: " << cublasGetStatusString(bench_st_)); \
  } while (0)

namespace ddp {
namespace {

constexpr int kExitSkipped = 77;
// float32 arithmetic lands far below this (TF32 would land near 3e-4): a result above it is
// wrong, and then its timing is not reported.
constexpr double kMaxRelError = 1e-4;
// bf16 outputs carry a rounding of up to half a unit of 2^-8: a bf16 result is wrong above one.
constexpr double kMaxRelError16 = 1.0 / 256;
constexpr double kGemmTarget = 0.70;       // ours / cuBLAS
constexpr double kBandwidthTarget = 0.80;  // of the measured copy bandwidth
// An op whose bytes would move in less than this at copy bandwidth is bound by launch and
// synchronisation costs, not by memory: its bandwidth is shown but judged against no target.
constexpr double kLaunchBoundSeconds = 10e-6;

struct Options {
  bool quick = false;
  std::string only;  // "", "gemm", "gemm16", "xent" or "sgd"
  std::string csv;
  int repeats() const { return quick ? 5 : 15; }
  double min_run_seconds() const { return quick ? 4e-3 : 20e-3; }
  bool wants(const char* section) const { return only.empty() || only == section; }
};

// ---------------------------------------------------------------------------------------------
// Timing

/// Seconds per call over the timed runs: the median (what is reported) and the fastest.
struct Timing {
  double median = 0.0;
  double best = 0.0;
};

/// Times device work with events recorded on the legacy default stream. The backend queues its
/// kernels on a stream of its own that it does not expose, but that stream is a blocking one,
/// and the legacy default stream is ordered against every blocking stream in both directions:
/// an event recorded there completes only after all work queued before it on any blocking
/// stream, and no work queued after it starts earlier. So the two events bracket exactly the
/// device work of the calls in between (ours and cuBLAS's, whose handle also uses the legacy
/// stream), not the host's launch loop; where an op itself waits for the device (softmax_xent
/// returns the loss to the host), those waits fall inside the bracket as they do in training.
class EventTimer {
 public:
  explicit EventTimer(Backend& backend) : backend_(backend) {
    BENCH_CUDA_CHECK(cudaEventCreate(&start_));
    BENCH_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  /// f(i) runs call i; calls are numbered on across runs, so f can rotate between input sets.
  /// Warm-up calls first, then the number of calls per run doubles until a run lasts
  /// min_run_seconds (event resolution and launch gaps then stay small), then `repeats` runs.
  Timing time(const std::function<void(int64_t)>& f, const Options& opt) {
    for (int i = 0; i < 3; ++i) f(next_++);
    backend_.synchronize();
    int64_t calls = 1;
    while (run(f, calls) < opt.min_run_seconds() && calls < (int64_t{1} << 20)) calls *= 2;
    std::vector<double> per_call;
    for (int r = 0; r < opt.repeats(); ++r)
      per_call.push_back(run(f, calls) / static_cast<double>(calls));
    std::sort(per_call.begin(), per_call.end());
    return Timing{per_call[per_call.size() / 2], per_call.front()};
  }

 private:
  double run(const std::function<void(int64_t)>& f, int64_t calls) {
    backend_.synchronize();
    BENCH_CUDA_CHECK(cudaEventRecord(start_, cudaStreamLegacy));
    for (int64_t i = 0; i < calls; ++i) f(next_++);
    BENCH_CUDA_CHECK(cudaEventRecord(stop_, cudaStreamLegacy));
    BENCH_CUDA_CHECK(cudaEventSynchronize(stop_));
    BENCH_CUDA_CHECK(cudaGetLastError());
    float ms = 0.0f;
    BENCH_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return static_cast<double>(ms) * 1e-3;
  }

  Backend& backend_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  int64_t next_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Data

/// Fills a device array with values from U(lo, hi), generated on the host in chunks (never
/// zeros: zeros hide unwritten outputs and can run faster than real data).
void upload_random(float* device, int64_t n, float lo, float hi, Rng& rng) {
  constexpr int64_t kChunk = int64_t{1} << 22;
  std::vector<float> host(static_cast<size_t>(std::min(n, kChunk)));
  for (int64_t done = 0; done < n; done += kChunk) {
    const int64_t count = std::min(kChunk, n - done);
    for (int64_t i = 0; i < count; ++i)
      host[static_cast<size_t>(i)] = static_cast<float>(rng.uniform(lo, hi));
    cuda_copy_bytes(device + done, host.data(), static_cast<size_t>(count) * sizeof(float));
  }
}

std::vector<float> download(const float* device, int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  cuda_copy_bytes(host.data(), device, static_cast<size_t>(n) * sizeof(float));
  return host;
}

/// Fills with 0xFF bytes (a NaN): an element the op under test does not write stays NaN.
void poison(float* device, int64_t n) {
  BENCH_CUDA_CHECK(
      cudaMemsetAsync(device, 0xFF, static_cast<size_t>(n) * sizeof(float), cudaStreamLegacy));
  BENCH_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

/// How many rotating input sets of `set_bytes` make the working set three times the L2, so
/// every call finds its inputs in device memory, not in the cache (at least 2, at most 4096).
int64_t rotation_sets(int64_t set_bytes, int64_t l2_bytes) {
  const int64_t want = (3 * l2_bytes + set_bytes - 1) / std::max<int64_t>(set_bytes, 1);
  return std::min<int64_t>(std::max<int64_t>(want, 2), 4096);
}

/// Elements per set rounded up to 64 floats (256 bytes), so each set keeps 16-byte alignment.
int64_t padded(int64_t n) { return (n + 63) / 64 * 64; }

/// The larger of ‖a − b‖ / ‖b‖ and max|a − b| / max|b| (b the reference): the first is the
/// usual measure, the second catches a few wrong elements that a norm over millions dilutes.
/// NaN or inf in `a` (an unwritten, poisoned element) gives inf.
double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff2 = 0.0, ref2 = 0.0, diff_max = 0.0, ref_max = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    const double d = std::abs(a[i] - b[i]);
    diff2 += d * d;
    ref2 += b[i] * b[i];
    diff_max = std::max(diff_max, d);
    ref_max = std::max(ref_max, std::abs(b[i]));
  }
  if (ref2 == 0.0) return diff_max;
  return std::max(std::sqrt(diff2 / ref2), diff_max / ref_max);
}

// ---------------------------------------------------------------------------------------------
// Output

std::string fmt(const char* format, double v) {
  char text[64];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

std::string format_time(double seconds) {
  if (seconds < 1e-3) return fmt("%.2f us", seconds * 1e6);
  return fmt("%.3f ms", seconds * 1e3);
}

std::string format_count(int64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_table_header(const std::vector<std::string>& columns, const std::string& align) {
  std::string head = "|", rule = "|";
  for (size_t i = 0; i < columns.size(); ++i) {
    head += " " + columns[i] + " |";
    rule += align[i] == 'r' ? "---:|" : "---|";
  }
  std::printf("%s\n%s\n", head.c_str(), rule.c_str());
}

void print_table_row(const std::vector<std::string>& cells) {
  std::string row = "|";
  for (const std::string& c : cells) row += " " + c + " |";
  std::printf("%s\n", row.c_str());
}

/// The machine-readable copy (--csv): one line per measured row, same numbers as the tables.
class CsvOut {
 public:
  explicit CsvOut(const std::string& path) {
    if (path.empty()) return;
    file_.open(path);
    DDP_CHECK(file_.good(), "--csv: cannot write '" << path << "'");
    file_ << "section,op,shape,time_us,best_us,rate,unit,ref_rate,ratio,pct_peak,target,met,"
             "plan,max_rel_err,note\n";
  }
  struct Row {
    std::string section, op, shape;
    double time_s = NAN, best_s = NAN, rate = NAN;
    std::string unit;
    double ref_rate = NAN, ratio = NAN, pct_peak = NAN, target = NAN;
    std::string met, plan;
    double err = NAN;
    std::string note;
  };
  void write(const Row& r) {
    if (!file_.is_open()) return;
    file_ << clean(r.section) << ',' << clean(r.op) << ',' << clean(r.shape) << ','
          << num(r.time_s * 1e6) << ',' << num(r.best_s * 1e6) << ',' << num(r.rate) << ','
          << clean(r.unit) << ',' << num(r.ref_rate) << ',' << num(r.ratio) << ','
          << num(r.pct_peak) << ',' << num(r.target) << ',' << clean(r.met) << ',' << clean(r.plan)
          << ',' << num(r.err) << ',' << clean(r.note) << '\n';
    file_.flush();
  }

 private:
  // Thousands separators go; any other comma becomes ';' (fields are not quoted).
  static std::string clean(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      const bool digit_before = i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]));
      const bool digit_after =
          i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]));
      if (s[i] != ',') {
        out += s[i];
      } else if (!(digit_before && digit_after)) {
        out += ';';
      }
    }
    return out;
  }
  static std::string num(double v) { return std::isfinite(v) ? fmt("%.6g", v) : ""; }
  std::ofstream file_;
};

// ---------------------------------------------------------------------------------------------
// The device, its ceilings and cuBLAS

class Cublas {
 public:
  Cublas() {
    BENCH_CUBLAS_CHECK(cublasCreate(&handle_));
    // Plain fp32 FMA: the default math mode uses no TF32 unless asked (CUBLAS_TF32_TENSOR_OP_MATH
    // or NVIDIA_TF32_OVERRIDE); the fp64 sample checks below would catch TF32's errors (~3e-4).
    BENCH_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
    // The NULL stream: the legacy default stream (neither this program nor cuBLAS is built with
    // per-thread default streams), which the timing events are recorded on.
    BENCH_CUBLAS_CHECK(cublasSetStream(handle_, nullptr));
  }
  ~Cublas() { (void)cublasDestroy(handle_); }
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;

  /// Column-major C[m,n] = op(A)·op(B) (beta = 0).
  /// C = op(A)·op(B) with bf16 A and B, float32 accumulation, C in float32 or bf16.
  void gemm_bf16(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                 const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, void* c,
                 cudaDataType c_type, int64_t ldc) {
    const float one = 1.0f, zero = 0.0f;
    BENCH_CUBLAS_CHECK(cublasGemmEx(
        handle_, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &one, a,
        CUDA_R_16BF, static_cast<int>(lda), b, CUDA_R_16BF, static_cast<int>(ldb), &zero, c, c_type,
        static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  void sgemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
             const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
    const float one = 1.0f, zero = 0.0f;
    BENCH_CUBLAS_CHECK(cublasSgemm(handle_, ta, tb, static_cast<int>(m), static_cast<int>(n),
                                   static_cast<int>(k), &one, a, static_cast<int>(lda), b,
                                   static_cast<int>(ldb), &zero, c, static_cast<int>(ldc)));
  }
  int version() {
    int v = 0;
    BENCH_CUBLAS_CHECK(cublasGetVersion(handle_, &v));
    return v;
  }

 private:
  cublasHandle_t handle_ = nullptr;
};

struct GpuInfo {
  CudaDeviceInfo info;
  int64_t l2_bytes = 0;
};

struct Ceilings {
  double copy_gbs = 0.0;      // bytes read + written per second, device-to-device copy
  double sgemm_gflops = 0.0;  // cuBLAS SGEMM 4096^3, fp32 FMA
  double sgemm_err = 0.0;
};

/// One cuBLAS SGEMM on n x n column-major matrices, with its fp64 check on sampled elements.
struct SquareSgemm {
  int64_t n;
  DeviceArray<float> a, b, c;
  SquareSgemm(int64_t size, Rng& rng) : n(size), a(size * size), b(size * size), c(size * size) {
    upload_random(a.data(), n * n, -1.0f, 1.0f, rng);
    upload_random(b.data(), n * n, -1.0f, 1.0f, rng);
  }
  void run(Cublas& blas) {
    blas.sgemm(CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, a.data(), n, b.data(), n, c.data(), n);
  }
  double sample_error(Rng& rng) {
    const std::vector<float> ha = download(a.data(), n * n), hb = download(b.data(), n * n),
                             hc = download(c.data(), n * n);
    std::vector<double> got, ref;
    for (int s = 0; s < 256; ++s) {
      const int64_t i = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
      const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
      double sum = 0.0;
      for (int64_t k = 0; k < n; ++k) sum += static_cast<double>(ha[i + k * n]) * hb[k + j * n];
      ref.push_back(sum);
      got.push_back(hc[i + j * n]);
    }
    return rel_error(got, ref);
  }
};

Ceilings measure_ceilings(Backend& be, Cublas& blas, EventTimer& timer, const Options& opt,
                          Rng& rng, CsvOut& csv) {
  Ceilings c;
  {
    SquareSgemm g(4096, rng);
    // Brings the clocks up from idle before anything is timed.
    for (int i = 0; i < (opt.quick ? 10 : 40); ++i) g.run(blas);
    BENCH_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    c.sgemm_err = g.sample_error(rng);
    const Timing t = timer.time([&](int64_t) { g.run(blas); }, opt);
    const double n = static_cast<double>(g.n);
    c.sgemm_gflops = 2.0 * n * n * n / t.median * 1e-9;
    CsvOut::Row row;
    row.section = "ceiling";
    row.op = "cublas_sgemm";
    row.shape = "4096x4096x4096";
    row.time_s = t.median, row.best_s = t.best, row.rate = c.sgemm_gflops, row.unit = "GFLOP/s";
    row.err = c.sgemm_err;
    csv.write(row);
  }
  {
    const int64_t bytes = int64_t{1} << 30;
    DeviceArray<float> src(static_cast<size_t>(bytes / 4)), dst(static_cast<size_t>(bytes / 4));
    upload_random(src.data(), bytes / 4, -1.0f, 1.0f, rng);
    const Timing t = timer.time(
        [&](int64_t) {
          BENCH_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes),
                                           cudaMemcpyDeviceToDevice, cudaStreamLegacy));
        },
        opt);
    c.copy_gbs = 2.0 * static_cast<double>(bytes) / t.median * 1e-9;
    CsvOut::Row row;
    row.section = "ceiling";
    row.op = "copy_d2d";
    row.shape = "1 GiB";
    row.time_s = t.median, row.best_s = t.best, row.rate = c.copy_gbs, row.unit = "GB/s";
    row.note = "bytes read + written";
    csv.write(row);
  }
  be.synchronize();
  return c;
}

void print_device(const GpuInfo& dev, const Ceilings& c, Cublas& blas) {
  int driver = 0, runtime = 0;
  BENCH_CUDA_CHECK(cudaDriverGetVersion(&driver));
  BENCH_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  const CudaDeviceInfo& i = dev.info;
  std::printf("## Device and measured ceilings\n\n");
  print_table_header({"", "value"}, "lr");
  print_table_row({"device", i.name + " (ordinal " + std::to_string(i.ordinal) + ", compute " +
                                 std::to_string(i.compute_major) + "." +
                                 std::to_string(i.compute_minor) + ")"});
  print_table_row({"multiprocessors", std::to_string(i.sm_count)});
  print_table_row({"memory", fmt("%.1f GiB", static_cast<double>(i.memory_bytes) / (1 << 30)) +
                                 ", L2 " +
                                 fmt("%.0f MiB", static_cast<double>(dev.l2_bytes) / (1 << 20))});
  print_table_row({"CUDA driver / runtime / cuBLAS", std::to_string(driver) + " / " +
                                                         std::to_string(runtime) + " / " +
                                                         std::to_string(blas.version())});
  print_table_row(
      {"fp32 peak (2 x FP32 lanes x SMs x clock)", fmt("%.0f GFLOP/s", i.fp32_peak_gflops)});
  print_table_row({"memory bandwidth (bus width x memory clock x 2)",
                   fmt("%.0f GB/s", i.memory_bandwidth_gbs)});
  print_table_row({"**measured** device-to-device copy, 1 GiB (read + written)",
                   fmt("%.0f GB/s", c.copy_gbs) + " (" +
                       fmt("%.0f%%", 100.0 * c.copy_gbs / i.memory_bandwidth_gbs) +
                       " of the bus figure)"});
  print_table_row({"**measured** cuBLAS SGEMM 4096^3, fp32 FMA (no TF32)",
                   fmt("%.0f GFLOP/s", c.sgemm_gflops) + " (" +
                       fmt("%.0f%%", 100.0 * c.sgemm_gflops / i.fp32_peak_gflops) +
                       " of fp32 peak; error vs fp64 " + fmt("%.1e", c.sgemm_err) + ")"});
  const char* tf32 = std::getenv("NVIDIA_TF32_OVERRIDE");
  if (tf32 != nullptr) print_table_row({"NVIDIA_TF32_OVERRIDE", tf32});
  std::printf("\n");
}

// ---------------------------------------------------------------------------------------------
// GEMM: the three Linear products, ours against cuBLAS

struct LinearShape {
  const char* label;
  int64_t batch, in, out;
};

enum class Product { Forward, BackwardInput, BackwardParams };

const char* product_name(Product p) {
  switch (p) {
    case Product::Forward:
      return "forward y=x·Wᵀ+b";
    case Product::BackwardInput:
      return "backward_input dx=dy·W";
    default:
      return "backward_params dW=dyᵀ·x (+db)";
  }
}

const char* product_key(Product p) {
  switch (p) {
    case Product::Forward:
      return "forward";
    case Product::BackwardInput:
      return "backward_input";
    default:
      return "backward_params";
  }
}

/// A Linear layer's operands on the host (the 16-bit rows: their values widened to float).
struct HostOperands {
  const std::vector<float>& x;  ///< [batch, in]
  const std::vector<float>& w;  ///< [out, in]
  const std::vector<float>& bias;
  const std::vector<float>& dy;  ///< [batch, out]
};

/// Element (r, c) of product `p`'s row-major output, summed in fp64: the reference both the
/// float32 and the 16-bit rows check against.
double reference_element(Product p, const LinearShape& s, const HostOperands& h, int64_t r,
                         int64_t c) {
  auto at = [](const std::vector<float>& v, int64_t i) {
    return static_cast<double>(v[static_cast<size_t>(i)]);
  };
  double sum = 0.0;
  switch (p) {
    case Product::Forward:
      for (int64_t k = 0; k < s.in; ++k) sum += at(h.x, r * s.in + k) * at(h.w, c * s.in + k);
      return sum + at(h.bias, c);
    case Product::BackwardInput:
      for (int64_t k = 0; k < s.out; ++k) sum += at(h.dy, r * s.out + k) * at(h.w, k * s.in + c);
      return sum;
    default:
      for (int64_t k = 0; k < s.batch; ++k) sum += at(h.dy, k * s.out + r) * at(h.x, k * s.in + c);
      return sum;
  }
}

std::string plan_string(const GemmPlan& plan) {
  static const char* const kTiles[3] = {"128x128", "64x64", "32x32"};
  std::string s = kTiles[plan.tile >= 0 && plan.tile < 3 ? plan.tile : 2];
  if (plan.splits > 1) s += " split-K " + std::to_string(plan.splits);
  s += plan.vectorized ? " vec4" : " scalar";
  return s;
}

/// One Linear layer's operands on the device, with cuBLAS's outputs beside ours.
class LinearBench {
 public:
  LinearBench(const LinearShape& s, Rng& rng)
      : s_(s),
        x_(n(s.batch * s.in)),
        w_(n(s.out * s.in)),
        bias_(n(s.out)),
        dy_(n(s.batch * s.out)),
        y_(n(s.batch * s.out)),
        dx_(n(s.batch * s.in)),
        dw_(n(s.out * s.in)),
        db_(n(s.out)),
        y_ref_(n(s.batch * s.out)),
        dx_ref_(n(s.batch * s.in)),
        dw_ref_(n(s.out * s.in)) {
    upload_random(x_.data(), s.batch * s.in, -1.0f, 1.0f, rng);
    upload_random(w_.data(), s.out * s.in, -1.0f, 1.0f, rng);
    upload_random(bias_.data(), s.out, -1.0f, 1.0f, rng);
    upload_random(dy_.data(), s.batch * s.out, -1.0f, 1.0f, rng);
    hx_ = download(x_.data(), s.batch * s.in);
    hw_ = download(w_.data(), s.out * s.in);
    hbias_ = download(bias_.data(), s.out);
    hdy_ = download(dy_.data(), s.batch * s.out);
  }

  /// The product as the backend runs it: m x n x k and whether it takes the vectorised path
  /// (the backend's own test: contiguous extents % 4; cudaMalloc'd operands are aligned).
  void dims(Product p, int64_t& m, int64_t& nn, int64_t& k, bool& vec) const {
    dims_of(s_, p, m, nn, k);
    vec = (p == Product::BackwardParams ? m : k) % 4 == 0 && nn % 4 == 0;
  }
  /// The product's m x n x k at layer shape s.
  static void dims_of(const LinearShape& s, Product p, int64_t& m, int64_t& nn, int64_t& k) {
    switch (p) {
      case Product::Forward:
        m = s.batch, nn = s.out, k = s.in;
        break;
      case Product::BackwardInput:
        m = s.batch, nn = s.in, k = s.out;
        break;
      default:
        m = s.out, nn = s.in, k = s.batch;
        break;
    }
  }

  void ours(Backend& be, Product p) {
    const ddp::Device d = ddp::Device::CUDA;
    Tensor x{x_.data(), s_.batch, s_.in, d}, w{w_.data(), s_.out, s_.in, d};
    Tensor bias{bias_.data(), 1, s_.out, d}, dy{dy_.data(), s_.batch, s_.out, d};
    switch (p) {
      case Product::Forward: {
        Tensor y{y_.data(), s_.batch, s_.out, d};
        be.linear_forward(x, w, bias, false, y);
        break;
      }
      case Product::BackwardInput: {
        Tensor dx{dx_.data(), s_.batch, s_.in, d};
        be.linear_backward_input(dy, w, nullptr, dx);
        break;
      }
      default: {
        Tensor dw{dw_.data(), s_.out, s_.in, d}, db{db_.data(), 1, s_.out, d};
        be.linear_backward_params(dy, x, false, dw, db);
        break;
      }
    }
  }

  // cuBLAS is column-major: a row-major r x c array is the column-major c x r matrix (its
  // transpose), so each row-major product is computed as its transpose, Cᵀ = op(B)ᵀ·op(A)ᵀ.
  void cublas(Cublas& blas, Product p) {
    const int64_t b = s_.batch, in = s_.in, out = s_.out;
    switch (p) {
      case Product::Forward:  // yᵀ[out,b] = W[out,in] · xᵀ[in,b]; W's storage is Wᵀ: OP_T
        blas.sgemm(CUBLAS_OP_T, CUBLAS_OP_N, out, b, in, w_.data(), in, x_.data(), in,
                   y_ref_.data(), out);
        break;
      case Product::BackwardInput:  // dxᵀ[in,b] = Wᵀ[in,out] · dyᵀ[out,b]
        blas.sgemm(CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, w_.data(), in, dy_.data(), out,
                   dx_ref_.data(), in);
        break;
      default:  // dWᵀ[in,out] = xᵀ[in,b] · dy[b,out]; dy's storage is dyᵀ: OP_T
        blas.sgemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, x_.data(), in, dy_.data(), out,
                   dw_ref_.data(), in);
        break;
    }
  }

  struct Check {
    double vs_cublas = 0.0;  // ‖ours − (cuBLAS + bias)‖ / ‖·‖ over every element
    double ours_fp64 = 0.0;  // over sampled elements, against fp64 sums on the host
    double cublas_fp64 = 0.0;
    double db_fp64 = 0.0;  // backward_params' bias gradient against fp64 column sums
    bool finite = true;
    double worst() const {
      if (!finite) return INFINITY;
      return std::max({vs_cublas, ours_fp64, db_fp64});
    }
  };

  /// Runs both once on poisoned outputs and compares them with each other and with fp64.
  Check verify(Backend& be, Cublas& blas, Product p, Rng& rng) {
    int64_t rows = 0, cols = 0;
    float *mine = nullptr, *ref = nullptr;
    switch (p) {
      case Product::Forward:
        rows = s_.batch, cols = s_.out, mine = y_.data(), ref = y_ref_.data();
        break;
      case Product::BackwardInput:
        rows = s_.batch, cols = s_.in, mine = dx_.data(), ref = dx_ref_.data();
        break;
      default:
        rows = s_.out, cols = s_.in, mine = dw_.data(), ref = dw_ref_.data();
        poison(db_.data(), s_.out);
        break;
    }
    poison(mine, rows * cols);
    poison(ref, rows * cols);
    ours(be, p);
    cublas(blas, p);
    be.synchronize();
    BENCH_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    const std::vector<float> got = download(mine, rows * cols), want = download(ref, rows * cols);

    Check c;
    std::vector<double> a, b;
    a.reserve(got.size()), b.reserve(got.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t col = 0; col < cols; ++col) {
        const size_t i = static_cast<size_t>(r * cols + col);
        if (!std::isfinite(got[i])) c.finite = false;
        a.push_back(got[i]);
        b.push_back(static_cast<double>(want[i]) + (p == Product::Forward ? hbias_[col] : 0.0f));
      }
    }
    c.vs_cublas = rel_error(a, b);

    // Sampled elements, the four corners (edge tiles) among them, against fp64 on the host.
    std::vector<double> mine_s, ref_s, blas_s, fp64;
    auto sample = [&](int64_t r, int64_t col) {
      const size_t i = static_cast<size_t>(r * cols + col);
      mine_s.push_back(got[i]);
      blas_s.push_back(b[i]);
      fp64.push_back(reference(p, r, col));
    };
    sample(0, 0), sample(0, cols - 1), sample(rows - 1, 0), sample(rows - 1, cols - 1);
    for (int s = 0; s < 508; ++s)
      sample(static_cast<int64_t>(rng.below(static_cast<uint64_t>(rows))),
             static_cast<int64_t>(rng.below(static_cast<uint64_t>(cols))));
    c.ours_fp64 = rel_error(mine_s, fp64);
    c.cublas_fp64 = rel_error(blas_s, fp64);

    if (p == Product::BackwardParams) {
      const std::vector<float> db = download(db_.data(), s_.out);
      std::vector<double> got_db(db.begin(), db.end()), ref_db(static_cast<size_t>(s_.out), 0.0);
      for (int64_t r = 0; r < s_.batch; ++r)
        for (int64_t o = 0; o < s_.out; ++o)
          ref_db[static_cast<size_t>(o)] += hdy_[static_cast<size_t>(r * s_.out + o)];
      c.db_fp64 = rel_error(got_db, ref_db);
    }
    return c;
  }

 private:
  static size_t n(int64_t v) { return static_cast<size_t>(v); }

  /// Element (r, c) of the product's row-major output, summed in fp64.
  double reference(Product p, int64_t r, int64_t c) const {
    return reference_element(p, s_, {hx_, hw_, hbias_, hdy_}, r, c);
  }

  LinearShape s_;
  DeviceArray<float> x_, w_, bias_, dy_, y_, dx_, dw_, db_, y_ref_, dx_ref_, dw_ref_;
  std::vector<float> hx_, hw_, hbias_, hdy_;
};

struct GemmSummary {
  double min_ratio = INFINITY;
  bool wrong = false;
};

/// The GEMM rows' layers: a wide square one and the Fashion-MNIST model's three.
std::vector<LinearShape> gemm_shapes() {
  return {
      {"4096x4096x4096 (wide MLP layer: batch 4096, 4096->4096)", 4096, 4096, 4096},
      {"Fashion MLP 784->256, batch 1024", 1024, 784, 256},
      {"Fashion MLP 256->256, batch 1024", 1024, 256, 256},
      {"Fashion MLP 256->10, batch 1024", 1024, 256, 10},
  };
}

GemmSummary bench_gemm(Backend& be, Cublas& blas, EventTimer& timer, const GpuInfo& dev,
                       const Options& opt, Rng& rng, CsvOut& csv) {
  std::printf(
      "## GEMM: the Linear products, ours vs cuBLAS SGEMM\n\n"
      "Row-major operands as the layers hold them (x [b,in], W [out,in], dy [b,out]); cuBLAS "
      "gets the same buffers with transposes chosen for its column-major view. Ours includes "
      "the bias add (forward) and the bias gradient db = column sums of dy (backward_params); "
      "cuBLAS does the bare product. GFLOP/s = 2·m·n·k / median time of %d runs after a "
      "warm-up. Target: ours >= %.0f%% of cuBLAS. Errors: the larger of ‖out − ref‖/‖ref‖ and "
      "max|out − ref|/max|ref| against fp64 sums on 512 sampled elements (ours / cuBLAS); "
      "every element of ours is also compared with cuBLAS's, on outputs poisoned with NaN "
      "first; above %.0e the result is WRONG and its timing is not shown.\n\n",
      opt.repeats(), 100.0 * kGemmTarget, kMaxRelError);
  print_table_header(
      {"layer", "product", "m x n x k", "ours", "ours GFLOP/s", "cuBLAS GFLOP/s", "ours/cuBLAS",
       "% of fp32 peak", "plan_gemm", "err vs fp64 (ours / cuBLAS)", "target >= 70%"},
      "lllrrrrrlll");
  GemmSummary summary;
  for (const LinearShape& s : gemm_shapes()) {
    LinearBench lb(s, rng);
    for (Product p : {Product::Forward, Product::BackwardInput, Product::BackwardParams}) {
      int64_t m = 0, nn = 0, k = 0;
      bool vec = false;
      lb.dims(p, m, nn, k, vec);
      const GemmPlan plan = plan_gemm(m, nn, k, dev.info.sm_count, vec);
      const LinearBench::Check check = lb.verify(be, blas, p, rng);
      const bool right = check.worst() <= kMaxRelError;
      const Timing mine = timer.time([&](int64_t) { lb.ours(be, p); }, opt);
      const Timing theirs = timer.time([&](int64_t) { lb.cublas(blas, p); }, opt);
      const double flops =
          2.0 * static_cast<double>(m) * static_cast<double>(nn) * static_cast<double>(k);
      const double ours_gflops = flops / mine.median * 1e-9;
      const double blas_gflops = flops / theirs.median * 1e-9;
      const double ratio = ours_gflops / blas_gflops;
      const double peak = ours_gflops / dev.info.fp32_peak_gflops;
      const std::string shape =
          std::to_string(m) + "x" + std::to_string(nn) + "x" + std::to_string(k);
      std::string errors = fmt("%.1e", check.ours_fp64) + " / " + fmt("%.1e", check.cublas_fp64);
      if (p == Product::BackwardParams) errors += "; db " + fmt("%.1e", check.db_fp64);
      std::string verdict;
      if (!right) {
        verdict = "**WRONG RESULT** (vs cuBLAS " + fmt("%.1e", check.vs_cublas) +
                  (check.finite ? "" : ", unwritten/NaN elements") + ")";
        summary.wrong = true;
      } else {
        verdict = ratio >= kGemmTarget ? "met" : "**NOT met**";
        summary.min_ratio = std::min(summary.min_ratio, ratio);
      }
      print_table_row({s.label, product_name(p), shape, right ? format_time(mine.median) : "-",
                       right ? fmt("%.0f", ours_gflops) : "-", fmt("%.0f", blas_gflops),
                       right ? fmt("%.2f", ratio) : "-", right ? fmt("%.1f%%", 100.0 * peak) : "-",
                       plan_string(plan), errors, verdict});
      CsvOut::Row row;
      row.section = "gemm";
      row.op = product_key(p);
      row.shape = shape;
      row.time_s = right ? mine.median : NAN;
      row.best_s = right ? mine.best : NAN;
      row.rate = right ? ours_gflops : NAN;
      row.unit = "GFLOP/s";
      row.ref_rate = blas_gflops;
      row.ratio = right ? ratio : NAN;
      row.pct_peak = right ? 100.0 * peak : NAN;
      row.target = kGemmTarget;
      row.met = !right ? "wrong" : (ratio >= kGemmTarget ? "yes" : "no");
      row.plan = plan_string(plan);
      row.err = check.worst();
      row.note = s.label;
      csv.write(row);
    }
  }
  std::printf("\n");
  return summary;
}

// ---------------------------------------------------------------------------------------------
// GEMM in bf16: the mixed-precision Linear products, ours (WMMA) against cuBLAS's bf16 GEMM

/// One Linear layer's bf16 operands on the device, with cuBLAS's outputs beside ours. forward
/// writes the float32 logits, backward_input_relu bf16 (its mask all ones: every unit live, so
/// the result is the bare product cuBLAS computes, and the mask is still read), and
/// backward_params float32 dW plus db.
class Linear16Bench {
 public:
  Linear16Bench(const LinearShape& s, MixedLinear& k, Rng& rng)
      : s_(s),
        k_(k),
        x_(n(s.batch * s.in)),
        w_(n(s.out * s.in)),
        dy_(n(s.batch * s.out)),
        live_(n(s.batch * s.in)),
        bias_(n(s.out)),
        y_(n(s.batch * s.out)),
        dx_(n(s.batch * s.in)),
        dw_(n(s.out * s.in)),
        db_(n(s.out)),
        y_ref_(n(s.batch * s.out)),
        dx_ref_(n(s.batch * s.in)),
        dw_ref_(n(s.out * s.in)) {
    hx_ = random_bf16(x_, s.batch, s.in, rng);
    hw_ = random_bf16(w_, s.out, s.in, rng);
    hdy_ = random_bf16(dy_, s.batch, s.out, rng);
    const std::vector<uint16_t> ones(n(s.batch * s.in), float_to_bf16(1.0f));
    live_.upload(ones.data(), ones.size());
    upload_random(bias_.data(), s.out, -1.0f, 1.0f, rng);
    hbias_ = download(bias_.data(), s.out);
  }

  void dims(Product p, int64_t& m, int64_t& nn, int64_t& k) const {
    LinearBench::dims_of(s_, p, m, nn, k);
  }

  void ours(Product p) {
    const Tensor16 x = half(x_, s_.batch, s_.in), w = half(w_, s_.out, s_.in);
    const Tensor16 dy = half(dy_, s_.batch, s_.out);
    const Tensor bias{bias_.data(), 1, s_.out, Device::CUDA};
    switch (p) {
      case Product::Forward: {
        Tensor y{y_.data(), s_.batch, s_.out, Device::CUDA};
        k_.forward(x, w, bias, y);
        break;
      }
      case Product::BackwardInput: {
        Tensor16 dx = half(dx_, s_.batch, s_.in);
        k_.backward_input_relu(dy, w, half(live_, s_.batch, s_.in), dx);
        break;
      }
      default: {
        Tensor dw{dw_.data(), s_.out, s_.in, Device::CUDA}, db{db_.data(), 1, s_.out, Device::CUDA};
        k_.backward_params(dy, x, false, dw, db);
        break;
      }
    }
  }

  // The fp32 rows' transposes (LinearBench::cublas), on bf16 operands.
  void cublas(Cublas& blas, Product p) {
    const int64_t b = s_.batch, in = s_.in, out = s_.out;
    switch (p) {
      case Product::Forward:
        blas.gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, out, b, in, w_.data(), in, x_.data(), in,
                       y_ref_.data(), CUDA_R_32F, out);
        break;
      case Product::BackwardInput:
        blas.gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, w_.data(), in, dy_.data(), out,
                       dx_ref_.data(), CUDA_R_16BF, in);
        break;
      default:
        blas.gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, x_.data(), in, dy_.data(), out,
                       dw_ref_.data(), CUDA_R_32F, in);
        break;
    }
  }

  /// The larger of ours against cuBLAS (every element) and against fp64 sums of the same bf16
  /// operands (512 sampled elements), after one run of each on poisoned outputs; and the limit
  /// that applies (bf16 outputs carry their rounding).
  double verify(Cublas& blas, Product p, Rng& rng, double& limit) {
    int64_t rows = 0, cols = 0;
    std::vector<double> got, want;
    poison_outputs();
    ours(p);
    cublas(blas, p);
    BENCH_CUDA_CHECK(cudaDeviceSynchronize());
    limit = p == Product::BackwardInput ? kMaxRelError16 : kMaxRelError;
    switch (p) {
      case Product::Forward:
        rows = s_.batch, cols = s_.out;
        got = widen(download(y_.data(), rows * cols));
        want = widen(download(y_ref_.data(), rows * cols));
        for (int64_t i = 0; i < rows * cols; ++i) want[n(i)] += hbias_[n(i % cols)];
        break;
      case Product::BackwardInput:
        rows = s_.batch, cols = s_.in;
        got = widen(download16(dx_, rows * cols));
        want = widen(download16(dx_ref_, rows * cols));
        break;
      default:
        rows = s_.out, cols = s_.in;
        got = widen(download(dw_.data(), rows * cols));
        want = widen(download(dw_ref_.data(), rows * cols));
        break;
    }
    for (double v : got)
      if (!std::isfinite(v)) return INFINITY;
    std::vector<double> mine_s, fp64;
    for (int i = 0; i < 512; ++i) {
      const int64_t r = static_cast<int64_t>(rng.below(static_cast<uint64_t>(rows)));
      const int64_t c = static_cast<int64_t>(rng.below(static_cast<uint64_t>(cols)));
      mine_s.push_back(got[n(r * cols + c)]);
      fp64.push_back(reference(p, r, c));
    }
    return std::max(rel_error(got, want), rel_error(mine_s, fp64));
  }

 private:
  static size_t n(int64_t v) { return static_cast<size_t>(v); }
  static Tensor16 half(DeviceArray<uint16_t>& a, int64_t rows, int64_t cols) {
    return Tensor16{a.data(), rows, cols, Device::CUDA, Half::Bf16};
  }
  // U(-1, 1) rounded to bf16 by the kernels' own round; returns the values as the host sees them.
  std::vector<float> random_bf16(DeviceArray<uint16_t>& a, int64_t rows, int64_t cols, Rng& rng) {
    DeviceArray<float> f(n(rows * cols));
    upload_random(f.data(), rows * cols, -1.0f, 1.0f, rng);
    Tensor16 h = half(a, rows, cols);
    k_.round(Tensor{f.data(), rows, cols, Device::CUDA}, h);
    std::vector<float> out;
    for (uint16_t v : download16(a, rows * cols)) out.push_back(bf16_to_float(v));
    return out;
  }
  static std::vector<uint16_t> download16(const DeviceArray<uint16_t>& a, int64_t count) {
    std::vector<uint16_t> out(n(count));
    a.download(out.data(), out.size());
    return out;
  }
  static std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }
  static std::vector<double> widen(const std::vector<uint16_t>& v) {
    std::vector<double> out;
    for (uint16_t h : v) out.push_back(bf16_to_float(h));
    return out;
  }
  void poison_outputs() {
    poison(y_.data(), s_.batch * s_.out);
    poison(y_ref_.data(), s_.batch * s_.out);
    poison(dw_.data(), s_.out * s_.in);
    poison(dw_ref_.data(), s_.out * s_.in);
    poison(db_.data(), s_.out);
    BENCH_CUDA_CHECK(cudaMemset(dx_.data(), 0xff, dx_.size() * sizeof(uint16_t)));
    BENCH_CUDA_CHECK(cudaMemset(dx_ref_.data(), 0xff, dx_ref_.size() * sizeof(uint16_t)));
  }
  double reference(Product p, int64_t r, int64_t c) const {
    return reference_element(p, s_, {hx_, hw_, hbias_, hdy_}, r, c);
  }

  LinearShape s_;
  MixedLinear& k_;
  DeviceArray<uint16_t> x_, w_, dy_, live_;
  DeviceArray<float> bias_, y_;
  DeviceArray<uint16_t> dx_;
  DeviceArray<float> dw_, db_, y_ref_;
  DeviceArray<uint16_t> dx_ref_;
  DeviceArray<float> dw_ref_;
  std::vector<float> hx_, hw_, hdy_, hbias_;
};

/// The bf16 rows: every shape of the fp32 rows (4096^3 and the Fashion model's), each product.
GemmSummary bench_gemm16(Backend& be, Cublas& blas, EventTimer& timer, const GpuInfo& dev,
                         const Options& opt, Rng& rng, CsvOut& csv) {
  std::printf(
      "## GEMM in bf16 (training.precision): ours (WMMA) vs cuBLAS bf16 GEMM\n\n"
      "The same layers and products as above on bf16 operands with float32 accumulation: ours "
      "through the backend's MixedLinear (forward to float32 logits with the bias; "
      "backward_input_relu to bf16 with its mask read; backward_params to float32 dW plus db), "
      "cuBLAS's cublasGemmEx (CUBLAS_COMPUTE_32F) on the same buffers. Errors: ours against "
      "cuBLAS on every element and against fp64 sums of the same bf16 values on 512 sampled "
      "ones; above %.0e (float32 outputs) or %.1e (bf16 outputs, one unit) the result is WRONG. "
      "Target: ours >= %.0f%% of cuBLAS.\n\n",
      kMaxRelError, kMaxRelError16, 100.0 * kGemmTarget);
  if (dev.info.compute_major < 8) {
    std::printf("skipped: bf16 needs compute capability 8.0 (this device is %d.%d)\n\n",
                dev.info.compute_major, dev.info.compute_minor);
    return GemmSummary{};
  }
  print_table_header({"layer", "product", "m x n x k", "ours", "ours GFLOP/s", "cuBLAS GFLOP/s",
                      "ours/cuBLAS", "error", "target >= 70%"},
                     "lllrrrrrl");
  MixedLinear& k = *be.mixed_linear(Half::Bf16);
  GemmSummary summary;
  for (const LinearShape& s : gemm_shapes()) {
    Linear16Bench lb(s, k, rng);
    for (Product p : {Product::Forward, Product::BackwardInput, Product::BackwardParams}) {
      int64_t m = 0, nn = 0, kk = 0;
      lb.dims(p, m, nn, kk);
      double limit = 0.0;
      const double err = lb.verify(blas, p, rng, limit);
      const bool right = err <= limit;
      const Timing mine = timer.time([&](int64_t) { lb.ours(p); }, opt);
      const Timing theirs = timer.time([&](int64_t) { lb.cublas(blas, p); }, opt);
      const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(nn) * kk;
      const double ours_gflops = flops / mine.median * 1e-9;
      const double blas_gflops = flops / theirs.median * 1e-9;
      const double ratio = ours_gflops / blas_gflops;
      const std::string shape =
          std::to_string(m) + "x" + std::to_string(nn) + "x" + std::to_string(kk);
      std::string verdict = right ? (ratio >= kGemmTarget ? "met" : "**NOT met**")
                                  : "**WRONG RESULT** (" + fmt("%.1e", err) + ")";
      summary.wrong = summary.wrong || !right;
      if (right) summary.min_ratio = std::min(summary.min_ratio, ratio);
      print_table_row({s.label, product_name(p), shape, right ? format_time(mine.median) : "-",
                       right ? fmt("%.0f", ours_gflops) : "-", fmt("%.0f", blas_gflops),
                       right ? fmt("%.2f", ratio) : "-", fmt("%.1e", err), verdict});
      CsvOut::Row row;
      row.section = "gemm16";
      row.op = product_key(p);
      row.shape = shape;
      row.time_s = right ? mine.median : NAN;
      row.best_s = right ? mine.best : NAN;
      row.rate = right ? ours_gflops : NAN;
      row.unit = "GFLOP/s";
      row.ref_rate = blas_gflops;
      row.ratio = right ? ratio : NAN;
      row.target = kGemmTarget;
      row.met = !right ? "wrong" : (ratio >= kGemmTarget ? "yes" : "no");
      row.plan = "wmma 64x64 bf16";
      row.err = err;
      row.note = s.label;
      csv.write(row);
    }
  }
  std::printf("\n");
  return summary;
}

// ---------------------------------------------------------------------------------------------
// Memory-bound kernels: softmax_xent and sgd_step against the copy bandwidth

struct MemSummary {
  double min_fraction = INFINITY;  // of the copy bandwidth, over the rows with a target
  bool wrong = false;
};

void print_mem_header(const char* title, const std::string& formula, const char* reference,
                      const Options& opt) {
  std::printf(
      "## %s\n\nGB/s = bytes per call / median time of %d runs after a warm-up; bytes = %s "
      "(each array once: the fewest any kernel must move). Inputs rotate between enough sets to "
      "make the working set 3x the L2, so every call reads device memory. Target: >= %.0f%% of "
      "the measured copy bandwidth, where the bytes take >= %.0f us at that bandwidth (below "
      "that the op is launch-bound and only shown). Max rel err: one call checked against %s "
      "(the larger of the normwise and the max-element error); above %.0e the result is WRONG "
      "and its timing is not shown.\n\n",
      title, opt.repeats(), formula.c_str(), 100.0 * kBandwidthTarget, kLaunchBoundSeconds * 1e6,
      reference, kMaxRelError);
  print_table_header({"op", "shape", "bytes per call", "time/call", "GB/s", "% of copy",
                      "max rel err", "target >= 80%"},
                     "llrrrrrl");
}

/// One table row (and CSV row) for a memory-bound op; returns the fraction of copy bandwidth.
double mem_row(const char* op, const std::string& shape, double bytes, const Timing& t, double err,
               const Ceilings& ceil, MemSummary& summary, CsvOut& csv) {
  const bool right = err <= kMaxRelError;
  const double gbs = bytes / t.median * 1e-9;
  const double fraction = gbs / ceil.copy_gbs;
  const bool launch_bound = bytes / (ceil.copy_gbs * 1e9) < kLaunchBoundSeconds;
  std::string verdict;
  if (!right) {
    verdict = "**WRONG RESULT**";
    summary.wrong = true;
  } else if (launch_bound) {
    verdict = "n/a (launch-bound)";
  } else {
    verdict = fraction >= kBandwidthTarget ? "met" : "**NOT met**";
    summary.min_fraction = std::min(summary.min_fraction, fraction);
  }
  print_table_row({op, shape, format_count(static_cast<int64_t>(bytes)),
                   right ? format_time(t.median) : "-", right ? fmt("%.0f", gbs) : "-",
                   right ? fmt("%.1f%%", 100.0 * fraction) : "-", fmt("%.1e", err), verdict});
  CsvOut::Row row;
  row.section = "mem";
  row.op = op;
  row.shape = shape;
  row.time_s = right ? t.median : NAN;
  row.best_s = right ? t.best : NAN;
  row.rate = right ? gbs : NAN;
  row.unit = "GB/s";
  row.ref_rate = ceil.copy_gbs;
  row.ratio = right ? fraction : NAN;
  row.target = launch_bound ? NAN : kBandwidthTarget;
  row.met = !right ? "wrong" : launch_bound ? "n/a" : (fraction >= kBandwidthTarget ? "yes" : "no");
  row.err = err;
  row.note = launch_bound ? "launch-bound" : "";
  csv.write(row);
  return fraction;
}

/// Softmax cross-entropy of `sets` rotating [rows, classes] batches, with dlogits.
class XentBench {
 public:
  XentBench(int64_t rows, int64_t classes, int64_t l2_bytes, Rng& rng)
      : rows_(rows), classes_(classes) {
    const int64_t set_bytes = rows * classes * 8 + rows * 4;
    sets_ = rotation_sets(set_bytes, l2_bytes);
    stride_ = padded(rows * classes);
    logits_ = DeviceArray<float>(static_cast<size_t>(sets_ * stride_));
    dlogits_ = DeviceArray<float>(static_cast<size_t>(sets_ * stride_));
    labels_ = DeviceArray<int32_t>(static_cast<size_t>(sets_ * padded(rows)));
    // Spread like real logits, so the exponentials span many orders of magnitude.
    upload_random(logits_.data(), sets_ * stride_, -8.0f, 8.0f, rng);
    std::vector<int32_t> labels(static_cast<size_t>(sets_ * padded(rows)));
    for (int32_t& l : labels) l = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
    labels_.upload(labels.data(), labels.size());
  }

  double bytes() const { return 8.0 * static_cast<double>(rows_ * classes_) + 4.0 * rows_; }
  int64_t sets() const { return sets_; }

  XentResult run(Backend& be, int64_t i) {
    const int64_t s = i % sets_;
    Tensor logits{logits_.data() + s * stride_, rows_, classes_, ddp::Device::CUDA};
    Tensor dlogits{dlogits_.data() + s * stride_, rows_, classes_, ddp::Device::CUDA};
    return be.softmax_xent(logits, labels_.data() + s * padded(rows_),
                           1.0f / static_cast<float>(rows_), &dlogits);
  }

  /// Set 0 once on a poisoned dlogits against fp64 on the host: the worst of the loss sum's and
  /// dlogits' relative errors, or inf when the count of correct rows differs.
  double verify(Backend& be) {
    poison(dlogits_.data(), rows_ * classes_);
    const XentResult r = run(be, 0);
    const std::vector<float> l = download(logits_.data(), rows_ * classes_);
    const std::vector<float> d = download(dlogits_.data(), rows_ * classes_);
    std::vector<int32_t> labels(static_cast<size_t>(rows_));
    labels_.download(labels.data(), labels.size());
    double loss = 0.0;
    int64_t correct = 0;
    std::vector<double> got(d.begin(), d.end()), ref(d.size());
    const double grad_scale = 1.0f / static_cast<float>(rows_);  // as run() passes it
    for (int64_t row = 0; row < rows_; ++row) {
      const float* x = l.data() + row * classes_;
      int64_t argmax = 0;
      for (int64_t c = 1; c < classes_; ++c)
        if (x[c] > x[argmax]) argmax = c;
      double sum = 0.0;
      for (int64_t c = 0; c < classes_; ++c) sum += std::exp(static_cast<double>(x[c]) - x[argmax]);
      const double lse = x[argmax] + std::log(sum);
      const int32_t label = labels[static_cast<size_t>(row)];
      loss += lse - x[label];
      if (argmax == label) ++correct;
      for (int64_t c = 0; c < classes_; ++c)
        ref[static_cast<size_t>(row * classes_ + c)] =
            (std::exp(x[c] - lse) - (c == label ? 1.0 : 0.0)) * grad_scale;
    }
    if (r.correct != correct) return INFINITY;
    return std::max(std::abs(r.loss_sum - loss) / std::abs(loss), rel_error(got, ref));
  }

 private:
  int64_t rows_, classes_, sets_ = 0, stride_ = 0;
  DeviceArray<float> logits_, dlogits_;
  DeviceArray<int32_t> labels_;
};

MemSummary bench_xent(Backend& be, EventTimer& timer, const GpuInfo& dev, const Ceilings& ceil,
                      const Options& opt, Rng& rng, CsvOut& csv) {
  print_mem_header("softmax_xent (with dlogits)",
                   "4·r·c (logits read) + 4·r·c (dlogits written) + 4·r (labels read), r x c = "
                   "rows x classes",
                   "fp64 on the host (loss sum, count of correct rows, dlogits written over NaN)",
                   opt);
  MemSummary summary;
  // The fixed cost of a call: two kernels, the copy of the totals to the host and the wait.
  XentBench tiny(1, 10, dev.l2_bytes, rng);
  const double floor_err = tiny.verify(be);
  const Timing floor = timer.time([&](int64_t i) { tiny.run(be, i); }, opt);
  mem_row("softmax_xent", "1x10 (the per-call round trip)", tiny.bytes(), floor, floor_err, ceil,
          summary, csv);
  double big_gbs_net = 0.0;
  const std::pair<int64_t, int64_t> shapes[] = {{65536, 1000}, {1024, 10}};
  for (const auto& shape : shapes) {
    XentBench xb(shape.first, shape.second, dev.l2_bytes, rng);
    const double err = xb.verify(be);
    const Timing t = timer.time([&](int64_t i) { xb.run(be, i); }, opt);
    const std::string label = std::to_string(shape.first) + "x" + std::to_string(shape.second) +
                              " (" + std::to_string(xb.sets()) + " sets)";
    mem_row("softmax_xent", label, xb.bytes(), t, err, ceil, summary, csv);
    if (shape.first == 65536 && t.median > floor.median)
      big_gbs_net = xb.bytes() / (t.median - floor.median) * 1e-9;
  }
  std::printf(
      "\nEvery softmax_xent call returns the loss to the host: a device-to-host copy and a wait "
      "(the 1x10 row, %s). The 1024x10 batch is launch-bound: its bytes would take %.2f us at "
      "copy bandwidth. Less the round trip, 65536x1000 moves %.0f GB/s (%.1f%% of copy).\n\n",
      format_time(floor.median).c_str(), (8.0 * 1024 * 10 + 4.0 * 1024) / ceil.copy_gbs * 1e-3,
      big_gbs_net, 100.0 * big_gbs_net / ceil.copy_gbs);
  return summary;
}

/// sgd_step with momentum and weight decay over `sets` rotating parameter / gradient /
/// momentum arrays of n floats.
class SgdBench {
 public:
  SgdBench(int64_t n, int64_t l2_bytes, Rng& rng) : n_(n) {
    sets_ = rotation_sets(n * 12, l2_bytes);
    stride_ = padded(n);
    const size_t total = static_cast<size_t>(sets_ * stride_);
    p_ = DeviceArray<float>(total);
    g_ = DeviceArray<float>(total);
    buf_ = DeviceArray<float>(total);
    upload_random(p_.data(), sets_ * stride_, -1.0f, 1.0f, rng);
    upload_random(g_.data(), sets_ * stride_, -1e-2f, 1e-2f, rng);
    upload_random(buf_.data(), sets_ * stride_, -1e-2f, 1e-2f, rng);
    opt_.lr = 0.01f;
    opt_.momentum = 0.9f;
    opt_.weight_decay = 5e-4f;
  }

  double bytes() const { return 20.0 * static_cast<double>(n_); }
  int64_t sets() const { return sets_; }

  void run(Backend& be, int64_t i) {
    const int64_t s = i % sets_;
    Tensor p{p_.data() + s * stride_, 1, n_, ddp::Device::CUDA};
    Tensor g{g_.data() + s * stride_, 1, n_, ddp::Device::CUDA};
    Tensor buf{buf_.data() + s * stride_, 1, n_, ddp::Device::CUDA};
    be.sgd_step(p, g, buf, opt_, false);
  }

  /// One step on set 0 against the same update on the host (torch.optim.SGD's formula, in the
  /// backend's order of fused multiply-adds): the worst relative error of p and buf.
  double verify(Backend& be) {
    const std::vector<float> p0 = download(p_.data(), n_), g0 = download(g_.data(), n_),
                             b0 = download(buf_.data(), n_);
    run(be, 0);
    be.synchronize();
    const std::vector<float> p1 = download(p_.data(), n_), b1 = download(buf_.data(), n_);
    std::vector<double> got_p(p1.begin(), p1.end()), got_b(b1.begin(), b1.end());
    std::vector<double> ref_p(p1.size()), ref_b(b1.size());
    for (size_t i = 0; i < p0.size(); ++i) {
      const float g = std::fma(p0[i], opt_.weight_decay, g0[i]);
      const float b = std::fma(g, 1.0f - opt_.dampening, b0[i] * opt_.momentum);
      ref_b[i] = b;
      ref_p[i] = std::fma(b, -opt_.lr, p0[i]);
    }
    return std::max(rel_error(got_p, ref_p), rel_error(got_b, ref_b));
  }

 private:
  int64_t n_, sets_ = 0, stride_ = 0;
  DeviceArray<float> p_, g_, buf_;
  SgdOptions opt_;
};

MemSummary bench_sgd(Backend& be, EventTimer& timer, const GpuInfo& dev, const Ceilings& ceil,
                     const Options& opt, Rng& rng, CsvOut& csv) {
  print_mem_header("sgd_step (momentum 0.9, weight decay 5e-4)",
                   "5·4·n (params, grads, momentum read; params, momentum written)",
                   "the same update on the host (params and momentum)", opt);
  MemSummary summary;
  // The Fashion MLP 784-256-256-10: 784·256+256 + 256·256+256 + 256·10+10 parameters.
  const int64_t fashion = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10;
  for (int64_t n : {int64_t{64} << 20, fashion}) {
    SgdBench sb(n, dev.l2_bytes, rng);
    const double err = sb.verify(be);
    const Timing t = timer.time([&](int64_t i) { sb.run(be, i); }, opt);
    const std::string label = "n=" + format_count(n) +
                              (n == fashion ? " (Fashion MLP)" : " (64M)") + " (" +
                              std::to_string(sb.sets()) + " sets)";
    mem_row("sgd_step", label, sb.bytes(), t, err, ceil, summary, csv);
  }
  std::printf("\n");
  return summary;
}

// ---------------------------------------------------------------------------------------------

Options parse_options(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--only") {
      DDP_CHECK(i + 1 < argc, "--only: missing value (gemm, xent or sgd)");
      opt.only = argv[++i];
      DDP_CHECK(
          opt.only == "gemm" || opt.only == "gemm16" || opt.only == "xent" || opt.only == "sgd",
          "--only: expected gemm, gemm16, xent or sgd, got '" << opt.only << "'");
    } else if (a == "--csv") {
      DDP_CHECK(i + 1 < argc, "--csv: missing file name");
      opt.csv = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: ddp_bench_cuda_kernels [--quick] [--only gemm|gemm16|xent|sgd] [--csv FILE]\n"
          "  --quick   5 timed runs of >= 4 ms per row instead of 15 of >= 20 ms\n"
          "  --only    one section (the ceilings are always measured)\n"
          "  --csv     also write every row to FILE\n"
          "exit status: 0 done, 1 error or a wrong result, 77 skipped (no CUDA device)\n");
      std::exit(0);
    } else {
      DDP_THROW("unknown argument '" << a << "' (try --help)");
    }
  }
  return opt;
}

int run(int argc, char** argv) {
  // Line by line even into a pipe (gpu_check.sh tees it): a run stopped by a time limit still
  // leaves every row it finished.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Options opt = parse_options(argc, argv);
  std::string why;
  if (cuda_device_count(&why) == 0) {
    std::printf("skipped: no CUDA device to benchmark (%s)\n", why.c_str());
    return kExitSkipped;
  }
  CsvOut csv(opt.csv);
  GpuInfo dev;
  dev.info = cuda_device_info(0);
  int l2 = 0;
  BENCH_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  dev.l2_bytes = l2;
  auto be = make_cuda_backend(0);
  Cublas blas;
  EventTimer timer(*be);
  Rng rng(2024);

  std::printf("# ddp CUDA kernels: %s%s\n\n", dev.info.name.c_str(), opt.quick ? " (--quick)" : "");
  const Ceilings ceil = measure_ceilings(*be, blas, timer, opt, rng, csv);
  print_device(dev, ceil, blas);
  bool wrong = ceil.sgemm_err > kMaxRelError;
  if (wrong)
    std::printf(
        "**cuBLAS SGEMM error %.1e vs fp64: not plain fp32 (TF32?); comparisons below are "
        "against a faster, less precise reference**\n\n",
        ceil.sgemm_err);

  GemmSummary gemm, gemm16;
  MemSummary xent, sgd;
  if (opt.wants("gemm")) gemm = bench_gemm(*be, blas, timer, dev, opt, rng, csv);
  if (opt.wants("gemm16")) gemm16 = bench_gemm16(*be, blas, timer, dev, opt, rng, csv);
  if (opt.wants("xent")) xent = bench_xent(*be, timer, dev, ceil, opt, rng, csv);
  if (opt.wants("sgd")) sgd = bench_sgd(*be, timer, dev, ceil, opt, rng, csv);
  wrong = wrong || gemm.wrong || gemm16.wrong || xent.wrong || sgd.wrong;

  // Machine-readable lines for bench/gpu_check.sh.
  std::printf("result.copy_gbs=%.1f\n", ceil.copy_gbs);
  std::printf("result.cublas_sgemm_gflops=%.1f\n", ceil.sgemm_gflops);
  if (std::isfinite(gemm.min_ratio)) std::printf("result.gemm_min_ratio=%.3f\n", gemm.min_ratio);
  if (std::isfinite(gemm16.min_ratio))
    std::printf("result.gemm16_min_ratio=%.3f\n", gemm16.min_ratio);
  if (std::isfinite(xent.min_fraction))
    std::printf("result.xent_min_copy_fraction=%.3f\n", xent.min_fraction);
  if (std::isfinite(sgd.min_fraction))
    std::printf("result.sgd_min_copy_fraction=%.3f\n", sgd.min_fraction);
  std::printf("result.verified=%s\n", wrong ? "no" : "yes");
  if (wrong) {
    std::fprintf(stderr, "ddp_bench_cuda_kernels: some results are wrong (see the tables)\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  try {
    return ddp::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "ddp_bench_cuda_kernels: " << e.what() << "\n";
    return 1;
  }
}
