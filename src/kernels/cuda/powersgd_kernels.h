// PowerSGD's steps on a device (the algorithm and the host's compressor: comm/powersgd.h), each
// queued on a stream: the error feedback added, Q's random start, Gram-Schmidt, P = M Q,
// Q = M^T P, M = P Q^T, the finiteness check and the new error. Every sum is in double, in an
// order fixed by the shapes alone (no atomics on floats), so every rank computes the same bits
// from the same sums. Not bitwise the host's (its loops are ordered otherwise): within float32's
// reach of the same float64 reference (tests/cuda). Compiled by nvcc and the CPU emulation.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.h"

namespace ddp {
namespace cuda {

/// One matrix of a bucket sent as factors: M (rows x cols, row-major) at `offset` in the bucket,
/// its P (rows x rank) at p_at among the P factors, its Q (cols x rank) at q_at in Q. first_row,
/// first_col and first_value count the rows, columns and values of the factored matrices before
/// it in the bucket's list: where its share of the kernels' threads begins.
struct FactoredMatrix {
  int64_t offset = 0;
  int64_t rows = 0, cols = 0, rank = 0;
  int64_t p_at = 0, q_at = 0;
  int64_t first_row = 0, first_col = 0, first_value = 0;
};

/// A bucket's state flags, in device memory: whether it holds an error feedback and a Q (0:
/// none yet, or none since a step that was not finite), and this step's finiteness.
struct PowerSgdFlags {
  int has_error = 0;
  int has_q = 0;
  int nonfinite = 0;
};

/// What the factor kernels need of a bucket: its factored matrices (`count` of them, in device
/// memory) and their row, column and value totals.
struct FactoredMatrices {
  const FactoredMatrix* list = nullptr;
  int count = 0;
  int64_t rows = 0, cols = 0, values = 0;
};

/// bucket[i] += error[i] (where the flags say there is one), and error[i] = the result: this
/// step's share, from which powersgd_finish makes the next error. i in [0, numel).
void powersgd_add_error(float* bucket, float* error, int64_t numel, const PowerSgdFlags* flags,
                        int sm_count, cudaStream_t stream);

/// Q's random start, where `always` or the flags say there is no Q: q[0, q_size) standard normal
/// values of Rng(seed) in order (core/random.h), what the host's compressor draws.
void powersgd_start_q(float* q, int64_t q_size, uint64_t seed, bool always,
                      const PowerSgdFlags* flags, cudaStream_t stream);

/// Gram-Schmidt on every matrix's P (q_side false) or Q (true), as orthogonalize_columns
/// (comm/powersgd.h): each column projected out of the ones before it twice, then normalised; a
/// zero column stays zero. One block per matrix.
void powersgd_orthogonalize(float* factors, const FactoredMatrices& m, bool q_side,
                            cudaStream_t stream);

/// P = M Q for every matrix (M in `bucket`): one warp per row of M.
void powersgd_compute_p(const float* bucket, const float* q, float* p, const FactoredMatrices& m,
                        cudaStream_t stream);

/// Q = M^T P for every matrix: one thread per column of M, rows in order.
void powersgd_compute_q(const float* bucket, const float* p, float* q, const FactoredMatrices& m,
                        cudaStream_t stream);

/// M = P Q^T for every matrix, into `bucket`: one thread per value, factors in order.
void powersgd_decompress(const float* p, const float* q, float* bucket, const FactoredMatrices& m,
                         int sm_count, cudaStream_t stream);

/// flags->nonfinite = whether bucket[0, numel) holds a NaN or an infinity.
void powersgd_check_finite(const float* bucket, int64_t numel, PowerSgdFlags* flags, int sm_count,
                           cudaStream_t stream);

/// The step's end, after powersgd_check_finite: where the result is finite and with
/// `error_feedback`, error[i] = error[i] - bucket[i] * inv_world (this rank's share less a
/// world-th of the result); with `average`, bucket[i] *= inv_world. The flags then say whether
/// an error feedback and a Q are kept (none after a step that was not finite).
void powersgd_finish(float* bucket, float* error, int64_t numel, float inv_world,
                     bool error_feedback, bool average, PowerSgdFlags* flags, int sm_count,
                     cudaStream_t stream);

}  // namespace cuda
}  // namespace ddp
