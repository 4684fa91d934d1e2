// The sharded update fused with the reduce-scatter (fused_shard_update.h).
#include "train/fused_shard_update.h"

#include <utility>

namespace ddp {

FusedShardUpdate::FusedShardUpdate(Backend& be, std::shared_ptr<Optimizer> optimizer, float* params,
                                   const float* grads)
    : be_(be), optimizer_(std::move(optimizer)), params_(params), grads_(grads) {}

void FusedShardUpdate::begin_step(double lr, bool norm) {
  lr_ = lr;
  norm_ = norm;
  squares_ = 0.0;
  nonfinite_ = 0;
}

void FusedShardUpdate::consume(float* at, const float* sum, size_t n) {
  const Tensor block{const_cast<float*>(sum), 1, static_cast<int64_t>(n), Device::CPU};
  nonfinite_ += be_.count_nonfinite(block);
  if (norm_) {
    const double norm = be_.l2_norm(block);
    squares_ += norm * norm;
  }
  optimizer_->update_range(be_, params_, static_cast<size_t>(at - grads_), sum, n, lr_);
}

std::vector<double> FusedShardUpdate::end_step() {
  optimizer_->end_step();
  return {squares_, static_cast<double>(nonfinite_)};
}

}  // namespace ddp
