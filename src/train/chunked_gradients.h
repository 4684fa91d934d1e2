// training.bitwise_across_world_sizes: a step's gradient as the exact sum of the gradients of
// fixed chunks of the global batch, so that the weights depend on the config and the seed, not
// on how many ranks computed them.
//
// Chunk k of a micro-batch of K chunks holds the global batch's positions k, k + K, k + 2K, ...
// The sampler deals position q to rank q mod N, so when N divides K a chunk lies on one rank
// whatever N is: rank r holds chunks r, r + N, r + 2N, ..., and its chunk r + tN is its rows t,
// t + K/N, t + 2K/N, .... Each chunk is gathered into one buffer and runs forward, loss and
// backward alone, with the same shapes and the same kernels on every world size. Its gradient is
// kept until the step's end. Then the largest magnitude of each parameter's gradient over every
// chunk of every rank fixes that parameter's grid (comm/exact_sum.h), and the rounded chunk
// gradients are added exactly in double, inside the rank and across ranks (one allreduce, whose
// order no longer matters). The loss totals are added chunk by chunk in global order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/gradient_communicator.h"
#include "comm/process_group.h"
#include "comm/reducer.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "nn/sequential.h"

namespace ddp {

/// What the exact sum is made of: the samples per chunk, this rank's share of each micro-batch
/// and the step's micro-batches, and the job's ranks.
struct ChunkLayout {
  int64_t chunk = 32;      ///< samples per chunk (training.bitwise_chunk_size)
  int64_t batch_rows = 0;  ///< rows of one micro-batch of this rank (a multiple of chunk)
  int64_t micro_batches = 1;
  int world = 1;
  /// This rank's chunks of one micro-batch, and the micro-batch's chunks over all ranks.
  int64_t local_chunks() const { return batch_rows / chunk; }
  int64_t job_chunks() const { return local_chunks() * world; }
};

class ChunkedGradients {
 public:
  /// Room for every chunk of this rank in one step of `layout` (its gradients kept until
  /// finish), over the parameters of `model` laid out in the arena by `plan`.
  /// Collective: the sums' array from `sums` (exact_sum_arena, `shared` as
  /// distributed.shared_memory says), which also runs their allreduce.
  ChunkedGradients(const Sequential& model, const BucketPlan& plan, const ChunkLayout& layout,
                   HostGradientCommunicator& sums, bool shared);

  /// Starts a step: no chunk kept.
  void begin_step();
  /// Forward, loss (times `coef`) and backward of each of this rank's chunks of one micro-batch
  /// (x [rows, in], labels [rows]; rows must be the layout's batch_rows), in order. Each
  /// chunk's backward writes its gradient straight into a kept chunk: the model's gradient
  /// views point there until finish. `dlogits` has room for a chunk.
  void add_micro_batch(Backend& be, Sequential& model, const Tensor& x, const int32_t* labels,
                       int64_t rows, float coef, Tensor dlogits);
  /// Collective: every rank's chunks of the step added exactly, into `grads` (the averaged
  /// gradient; a parameter with a non-finite value in any chunk becomes NaN), and the job's loss
  /// totals of the step, the same bits on every rank and every world size. The model's
  /// parameters are bound to `values` and `grads` (the arenas) again.
  /// The loss totals and the largest magnitudes travel over `comm`.
  XentResult finish(ProcessGroup& comm, Sequential& model, Tensor values, Tensor grads);
  /// After finish: the lowest rank that computed a chunk with a non-finite loss, or -1.
  int first_nonfinite_loss_rank() const { return first_bad_rank_; }

 private:
  void gather_chunk(const Tensor& x, const int32_t* labels, int64_t t);
  float* kept(int64_t c) { return kept_.data() + static_cast<size_t>(c) * kept_stride_; }
  void note_largest(const float* chunk);
  size_t facts_per_rank() const { return 2 * chunk_totals_.size() + params_.size(); }
  std::vector<double> gather_chunk_facts(ProcessGroup& comm) const;
  XentResult job_totals(const std::vector<double>& all);
  std::vector<double> job_largest(const std::vector<double>& all) const;
  void sum_chunks(int world, const std::vector<double>& largest, Tensor grads);

  std::vector<Span> params_;     ///< each parameter's place in the arena
  std::vector<size_t> offsets_;  ///< the same, as Sequential::bind takes them
  ChunkLayout layout_;
  size_t arena_numel_ = 0;
  /// Floats from one kept chunk to the next: the arena rounded up to 64 bytes, so that a chunk's
  /// gradient has the same alignment whichever rank and slot computes it.
  size_t kept_stride_ = 0;
  Buffer chunk_x_;  ///< one chunk's input rows, gathered
  std::vector<int32_t> chunk_labels_;
  Buffer kept_;  ///< the step's chunk gradients, arena-shaped, one after another
  HostGradientCommunicator& communicator_;
  double* sums_ = nullptr;  ///< the grid sums, arena-shaped (the communicator's array)
  std::vector<XentResult> chunk_totals_;  ///< this rank's chunks' loss totals, in order
  std::vector<double> largest_;  ///< per parameter: the largest magnitude over the kept chunks
  int64_t kept_chunks_ = 0;
  int first_bad_rank_ = -1;
};

}  // namespace ddp
