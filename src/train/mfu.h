// Model FLOPs utilisation as llm.c reports it: the model's FLOPs per sample times the job's
// samples/s over the peak FLOP/s of all its ranks. The peak per rank is output.peak_tflops, or
// on a GPU the device's SMs x clock x FLOPs per clock per SM of the operand precision (a table
// for sm_80 and sm_90; unknown elsewhere), or on a CPU the measured GEMM ceiling of the backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/config.h"
#include "kernels/backend.h"

namespace ddp {

/// FLOPs one sample costs in training: 6 x sum of in x out over the Linear layers of `layers`
/// (widths, input first): 2 per weight forward (a multiply and an add) and 4 backward (the
/// input's gradient and the weight's), as llm.c and PaLM count; the first layer's input
/// gradient, which training never needs, is counted too, and biases, ReLU and the loss are not.
double flops_per_sample(const std::vector<int64_t>& layers);

/// The achieved share of the peak: flops_per_sample x samples_per_sec / (peak_per_rank x ranks);
/// 0 when the peak is unknown (peak_per_rank <= 0).
double model_flops_utilisation(double flops_per_sample, double samples_per_sec,
                               double peak_per_rank, int ranks);

/// The dense FLOPs per clock per SM of the units that run GEMMs of `precision` on compute
/// capability major.minor: fp32 on the FP32 lanes, bf16/fp16 (float32 accumulation) on the
/// tensor cores. 0 when the architecture is not in the table (only sm_80 and sm_90 are).
double gpu_flops_per_clock_per_sm(int major, int minor, Precision precision);

/// A rank's peak: FLOP/s (0: unknown) and where the number came from, for the summary.
struct PeakFlops {
  double per_rank = 0;
  std::string source;  ///< "output.peak_tflops", "measured GEMM ceiling", "sm_90 ...", ...
};

/// FLOP/s of the best of repeated square GEMMs through the backend's own kernels at
/// `precision` (Backend::linear_forward for fp32, its MixedLinear for bf16/fp16), run for about
/// `budget_s` seconds; 0 when the backend has no kernels of that precision.
double measure_gemm_ceiling(Backend& be, Precision precision, double budget_s);

/// This rank's peak: `configured_tflops` when > 0; else, on CUDA device `gpu`, from its
/// properties; else (gpu < 0) the measured GEMM ceiling of `be` (0.15 s, once per process and
/// precision).
PeakFlops rank_peak(double configured_tflops, Backend& be, int gpu, Precision precision);

}  // namespace ddp
