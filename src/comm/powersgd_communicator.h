// distributed.compression powersgd: the gradient communicator the Reducer drives, in front of
// the one that sums buckets whole (MPI on CPUs, NCCL on GPUs). For the first
// powersgd_start_step optimizer steps every bucket is summed whole (PyTorch's
// start_powerSGD_iter); from then on each bucket is reduced by its compressor: on the host, a
// PowerSgdBucket (powersgd.h) on the MPI communicator's lane; on a GPU, the device's
// (comm/nccl/powersgd_device.h) on NCCL's stream. Either sends the whole parameters and P in one
// sum, Q in a second. Q's random start is seeded by the job's seed, the bucket and the step, the
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

/// One bucket's PowerSGD where its gradients live, and its state.
class PowerSgdCompressor {
 public:
  virtual ~PowerSgdCompressor() = default;
  virtual const PowerSgdPlan& plan() const = 0;
  /// Starts the reduction of this rank's share in [data, data + plan().numel()) into the
  /// approximated sum over ranks (divided by the ranks with `average`), in order with the
  /// communicator's other collectives; `seed` for Q's random start where it needs one.
  virtual std::shared_ptr<Work> reduce_async(float* data, bool average, uint64_t seed) = 0;
  /// The state, in host memory, between steps: the error feedback (numel floats, or empty:
  /// none) and Q (q_size floats, or empty: none).
  virtual std::vector<float> error() const = 0;
  virtual std::vector<float> q() const = 0;
  /// Restores that state (check_powersgd_state's sizes), between steps.
  virtual void restore(std::vector<float> error, std::vector<float> q) = 0;
};

using PowerSgdCompressors = std::vector<std::unique_ptr<PowerSgdCompressor>>;

/// The host's compressors of `buckets` (in the plan's order): each a PowerSgdBucket reduced on
/// `host`'s communication lane. `world`: the job's ranks. `host` must outlive them.
PowerSgdCompressors host_powersgd_compressors(HostGradientCommunicator& host,
                                              const std::vector<PowerSgdLayout>& buckets,
                                              const PowerSgdOptions& options, int world);

class PowerSgdCommunicator final : public GradientCommunicator {
 public:
  /// `buckets`: one compressor per bucket of the plan, in its order. `whole` sums buckets
  /// before the start step and owns the gradient arena; it must outlive this.
  PowerSgdCommunicator(GradientCommunicator& whole, PowerSgdCompressors buckets, int64_t start_step,
                       uint64_t seed);

  float* gradient_arena(size_t numel, const BucketWire& wire) override;
  /// Bucket `data` (it must start a bucket of the plan, with its size): summed whole before the
  /// start step, reduced by its compressor after. The step counts up once the plan's last
  /// bucket is launched.
  std::shared_ptr<Work> allreduce_async(float* data, size_t count, bool average) override;
  void set_timeout(double seconds) override { whole_.set_timeout(seconds); }
  double timeout() const override { return whole_.timeout(); }

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
  size_t total() const;

  GradientCommunicator& whole_;
  PowerSgdCompressors buckets_;
  std::vector<size_t> offsets_;  // each bucket's first float
  float* arena_ = nullptr;
  int64_t start_step_ = 0, steps_ = 0;
  uint64_t seed_ = 0;
};

}  // namespace ddp
