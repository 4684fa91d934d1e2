// distributed.compression powersgd on the host: the gradient communicator the Reducer drives,
// in front of the MPI one. For the first powersgd_start_step optimizer steps every bucket is
// summed whole (PyTorch's start_powerSGD_iter); from then on each bucket is reduced on the
// communication lane by its PowerSgdBucket (powersgd.h): the whole parameters and P in one sum,
// Q in a second. Q's random start is seeded by the job's seed, the bucket and the step, the
// same on every rank.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "comm/gradient_communicator.h"
#include "comm/powersgd.h"
#include "comm/reducer.h"

namespace ddp {

/// One bucket as the compressor sees it: its parameters as matrices (offsets within the
/// bucket, in bucket order) and its size.
struct PowerSgdLayout {
  std::vector<GradientMatrix> params;
  size_t numel = 0;
};

/// The buckets of `plan` as the compressor sees them: parameter p, numel[p] floats in rows[p]
/// rows (a weight out x in, a bias out x 1), as a rows x numel[p]/rows[p] matrix.
std::vector<PowerSgdLayout> powersgd_layouts(const BucketPlan& plan,
                                             const std::vector<size_t>& numel,
                                             const std::vector<size_t>& rows);

/// PowerSGD's state in the gradient arena's terms, as a checkpoint keeps it.
struct PowerSgdState {
  /// This rank's error feedback, arena-shaped: zeros where a bucket has none yet, which is the
  /// same as none. Empty: none anywhere.
  std::vector<float> error;
  /// Q of each matrix sent as factors (cols x rank, row-major), by the matrix's first float in
  /// the arena; none where its bucket starts afresh (no compressed step yet, or a non-finite one
  /// last). The same on every rank.
  std::map<size_t, std::vector<float>> q;
};

class PowerSgdCommunicator final : public GradientCommunicator {
 public:
  /// `buckets` in the bucket plan's order; `world`: the job's ranks.
  PowerSgdCommunicator(HostGradientCommunicator& host, const std::vector<PowerSgdLayout>& buckets,
                       const PowerSgdOptions& options, int64_t start_step, uint64_t seed,
                       int world);

  float* gradient_arena(size_t numel, const BucketWire& wire) override;
  /// Bucket `data` (it must start a bucket of the plan, with its size): summed whole before the
  /// start step, reduced by its PowerSgdBucket after. The step counts up once the plan's last
  /// bucket is launched.
  std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average) override;
  void set_timeout(double seconds) override { host_.set_timeout(seconds); }
  double timeout() const override { return host_.timeout(); }

  /// Optimizer steps whose buckets were launched (a resumed run continues from its checkpoint).
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  /// Whether a compressed step was launched: only then is there state to keep.
  bool compressed_yet() const { return steps_ > start_step_; }
  /// This rank's state, between steps (no bucket in flight).
  PowerSgdState state() const;
  /// Restores a state() (of any bucket plan over the same parameters), between steps; a bucket
  /// that holds Q for some of its matrices only starts afresh. Throws ddp::Error where an error
  /// feedback or a Q has another size, or a Q is for no factored matrix.
  void restore(const PowerSgdState& state);
  /// The factors' rank of the matrix whose first float is at `offset` in the arena (0: it is
  /// sent whole, or no matrix starts there).
  size_t factor_rank(size_t offset) const;

  /// Floats one rank sends per step once compressed, and whole.
  size_t sent_floats() const;
  size_t whole_floats() const;

 private:
  size_t bucket_of(const float* data, size_t count) const;

  HostGradientCommunicator& host_;
  std::vector<std::shared_ptr<PowerSgdBucket>> buckets_;  // held by lost collectives too
  std::vector<size_t> offsets_;                           // each bucket's first float
  float* arena_ = nullptr;
  int64_t start_step_ = 0, steps_ = 0;
  uint64_t seed_ = 0;
  int world_ = 1;
};

}  // namespace ddp
