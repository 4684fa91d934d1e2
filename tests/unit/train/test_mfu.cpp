// Model FLOPs utilisation (src/train/mfu.h): FLOPs per sample of a model, the MFU arithmetic,
// the GPU peak table, and the CPU backend's measured GEMM ceiling (within its time budget, only
// at precisions the backend has kernels for, never below a single GEMM timed here).
#include <catch2/catch.hpp>

#include "core/clock.h"
#include "core/tensor.h"
#include "train/mfu.h"
#include "train/report.h"

using ddp::Precision;

TEST_CASE("mfu: 6 FLOPs per weight of each Linear layer, per sample", "[mfu]") {
  // 784*128 + 128*64 + 64*10 = 109184 weights.
  CHECK(ddp::flops_per_sample({784, 128, 64, 10}) == 6.0 * 109184);
  CHECK(ddp::flops_per_sample({4, 3}) == 72.0);
  CHECK(ddp::flops_per_sample({5}) == 0.0);
  // Wide layers do not overflow: in double.
  CHECK(ddp::flops_per_sample({1000000000, 1000000000}) == 6e18);
}

TEST_CASE("mfu: model FLOP/s of the job over the peak of every rank", "[mfu]") {
  // 1e6 FLOPs/sample x 3000 samples/s = 3 GFLOP/s over 2 ranks x 10 GFLOP/s.
  CHECK(ddp::model_flops_utilisation(1e6, 3000, 10e9, 2) == Approx(0.15).epsilon(1e-12));
  CHECK(ddp::model_flops_utilisation(1e6, 3000, 10e9, 1) == Approx(0.3).epsilon(1e-12));
  CHECK(ddp::model_flops_utilisation(1e6, 3000, 0.0, 2) == 0.0);
}

TEST_CASE("mfu: the GPU peak table knows sm_80 and sm_90 only", "[mfu]") {
  // A100: 108 SMs x 1.41 GHz x 2048 = 312 TFLOP/s bf16; x 128 = 19.5 TFLOP/s fp32.
  CHECK(108 * 1.41e9 * ddp::gpu_flops_per_clock_per_sm(8, 0, Precision::Bf16) / 1e12 ==
        Approx(311.9).epsilon(1e-3));
  CHECK(108 * 1.41e9 * ddp::gpu_flops_per_clock_per_sm(8, 0, Precision::Fp32) / 1e12 ==
        Approx(19.49).epsilon(1e-3));
  // H100 SXM: 132 SMs x 1.83 GHz x 4096 = 989 TFLOP/s dense fp16/bf16; fp32 67 at 1.98 GHz.
  CHECK(132 * 1.83e9 * ddp::gpu_flops_per_clock_per_sm(9, 0, Precision::Fp16) / 1e12 ==
        Approx(989.4).epsilon(1e-3));
  CHECK(132 * 1.98e9 * ddp::gpu_flops_per_clock_per_sm(9, 0, Precision::Fp32) / 1e12 ==
        Approx(66.9).epsilon(1e-3));
  CHECK(ddp::gpu_flops_per_clock_per_sm(8, 6, Precision::Bf16) == 0.0);
  CHECK(ddp::gpu_flops_per_clock_per_sm(7, 0, Precision::Fp32) == 0.0);
  CHECK(ddp::gpu_flops_per_clock_per_sm(10, 0, Precision::Bf16) == 0.0);
}

TEST_CASE("mfu: a configured peak is taken as it is", "[mfu]") {
  auto be = ddp::make_cpu_backend();
  const double t0 = ddp::seconds_now();
  const ddp::PeakFlops p = ddp::rank_peak(1.5, *be, -1, Precision::Fp32);
  CHECK(ddp::seconds_now() - t0 < 0.05);  // nothing measured
  CHECK(p.per_rank == 1.5e12);
  CHECK(p.source == "output.peak_tflops");
}

TEST_CASE("mfu: the CPU GEMM ceiling is measured within its budget, once per process", "[mfu]") {
  auto be = ddp::make_cpu_backend();
  const double t0 = ddp::seconds_now();
  const double ceiling = ddp::measure_gemm_ceiling(*be, Precision::Fp32, 0.15);
  const double took = ddp::seconds_now() - t0;
  INFO("ceiling " << ceiling / 1e9 << " GFLOP/s in " << took << " s");
  // The budget (0.15 s), the warm-up call and the call that crosses the budget (a call takes
  // at least the best call's time: 70 ms under a sanitizer), one call more for their spread,
  // and 50 ms for the set-up.
  const double call = 2.0 * 512 * 512 * 512 / ceiling;
  CHECK(took < 0.15 + 3 * call + 0.05);
  // rank_peak measures the same way, once: a second run in the process reuses the number.
  const ddp::PeakFlops p = ddp::rank_peak(0.0, *be, -1, Precision::Fp32);
  const double t1 = ddp::seconds_now();
  CHECK(ddp::rank_peak(0.0, *be, -1, Precision::Fp32).per_rank == p.per_rank);
  CHECK(ddp::seconds_now() - t1 < 0.01);
  CHECK(p.source == "measured GEMM ceiling");
  // One core: more than 100 MFLOP/s, less than 10 TFLOP/s.
  CHECK(p.per_rank > 1e8);
  CHECK(p.per_rank < 1e13);
  // The ceiling is the best call: one 512^3 GEMM timed here is no faster, give or take noise.
  ddp::Buffer x(512 * 512), w(512 * 512), y(512 * 512), b(512);
  ddp::Tensor X = ddp::Tensor::of(x, 512, 512), W = ddp::Tensor::of(w, 512, 512),
              Y = ddp::Tensor::of(y, 512, 512), B = ddp::Tensor::of(b, 1, 512);
  for (ddp::Tensor* t : {&X, &W, &B}) be->fill(*t, 0.01f);
  be->linear_forward(X, W, B, false, Y);
  const double c0 = ddp::seconds_now();
  be->linear_forward(X, W, B, false, Y);
  const double one = 2.0 * 512 * 512 * 512 / (ddp::seconds_now() - c0);
  CHECK(one < 1.5 * p.per_rank);
  CHECK(Y.data[0] == Approx(512 * 0.01f * 0.01f + 0.01f).epsilon(1e-5));
}

TEST_CASE("mfu: the ceiling at a precision the backend has no kernels for is unknown", "[mfu]") {
  auto be = ddp::make_cpu_backend();
  CHECK(ddp::measure_gemm_ceiling(*be, Precision::Fp16, 0.01) == 0.0);  // fp16: GPUs only
  CHECK(ddp::measure_gemm_ceiling(*be, Precision::Bf16, 0.01) > 0.0);
}

TEST_CASE("mfu: the summary's words for a known and an unknown peak, and a straggler", "[mfu]") {
  ddp::TrainSummary sum;
  sum.peak_flops = 1.2e12;
  sum.mfu = 0.123;
  sum.peak_source = "measured GEMM ceiling";
  CHECK(ddp::describe_mfu(sum) == "MFU 12.3% of 1.20 TFLOP/s per rank (measured GEMM ceiling)");
  sum.peak_flops = 0;
  sum.peak_source = "sm_86 bf16 is not in the peak table";
  CHECK(ddp::describe_mfu(sum) ==
        "MFU unknown (sm_86 bf16 is not in the peak table; output.peak_tflops sets it)");
  sum.straggler_threshold = 1.5;
  sum.straggler_rank = 1;
  sum.straggler_slowest_at = 9;
  sum.straggler_flagged = 10;
  sum.straggler_skew = 2.44;
  CHECK(ddp::describe_straggler(sum) ==
        "straggler: rank 1 was slowest at 9 of 10 logged steps past 1.5x (compute+data 2.4x the "
        "median)");
}
