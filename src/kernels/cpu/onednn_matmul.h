// oneDNN's matmul primitive for the CPU backend's GEMMs: float32 or bfloat16 operands, float32
// accumulation, an optional float32 bias and ReLU fused into the store, the result stored as
// float32 (optionally added to what is there) or rounded to bfloat16. Single-threaded and
// deterministic: the same shapes and inputs give the same bits on every call on one machine
// (oneDNN picks its kernels by the CPU's ISA, so another CPU may round differently).
// A build without oneDNN (DDP_WITH_ONEDNN unset) compiles this file to "not built".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace ddp::cpu {

/// How an operand or the result is stored.
enum class MatType { F32, BF16 };

/// One GEMM over row-major operands: C[m,n] = op(A)·op(B) (+ bias) (relu), or C += op(A)·op(B)
/// with accumulate. op(A) is [m,k]: A is stored [m,k], or [k,m] with trans_a. op(B) is [k,n]:
/// B is stored [k,n], or [n,k] with trans_b. bias is float32 [n], added to every row.
/// accumulate needs c == F32 and neither bias nor relu.
struct MatmulShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  MatType a = MatType::F32, b = MatType::F32, c = MatType::F32;
  bool bias = false;
  bool relu = false;
  bool accumulate = false;
};

/// Whether this build links oneDNN.
bool onednn_built();

/// The instruction set oneDNN runs bfloat16 matmuls with on this CPU when it has native bf16
/// ("avx512_core_bf16", "avx512_core_amx", ...); "" when it has none (or no oneDNN build).
std::string onednn_native_bf16_isa();

/// Runs GEMMs, keeping one oneDNN primitive per distinct MatmulShape (made on first use).
/// Not thread-safe: one per training thread.
class OnednnMatmul {
 public:
  OnednnMatmul();
  ~OnednnMatmul();
  OnednnMatmul(const OnednnMatmul&) = delete;
  OnednnMatmul& operator=(const OnednnMatmul&) = delete;

  /// a, b, c point at the operands' storage (uint16_t bit patterns for BF16, float for F32);
  /// bias is null unless s.bias. Throws ddp::Error naming the shape if oneDNN refuses it.
  void run(const MatmulShape& s, const void* a, const void* b, const float* bias, void* c);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::cpu
