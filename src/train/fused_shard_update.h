// The sharded optimizer's update fused with its reduce-scatter (distributed.overlap_optimizer):
// each bucket's reduce-scatter hands this rank's summed part to consume(), a block at a time,
// and the optimizer updates those parameters from the block while it is still in cache, during
// backward. One pass over this rank's share of the buckets where the unfused step makes three
// (store the sum; read it for the totals; read it again for the update), and the update overlaps
// the rest of backward. The non-finite count and (on logged steps) the squared norm of the sum
// are taken in the same pass, for the checks that follow the parameter allgather.
//
// Only where nothing must be known about the whole gradient before the update: CPU ranks, no
// clipping (the global norm comes first), no nan_policy skip_step (the decision comes first).
// A non-finite gradient under nan_policy abort still stops every rank after the step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/gradient_communicator.h"
#include "kernels/backend.h"
#include "nn/optimizer.h"

namespace ddp {

class FusedShardUpdate {
 public:
  /// Updates `optimizer`'s spans of the parameter arena `params` from the sums of the gradient
  /// arena `grads` (both host memory), with `be`'s kernels.
  FusedShardUpdate(Backend& be, std::shared_ptr<Optimizer> optimizer, float* params,
                   const float* grads);

  /// Training thread, before the step's backward: its learning rate, and whether the squared
  /// norm is wanted (logged steps).
  void begin_step(double lr, bool norm);
  /// Communication lane: this rank's sums of [at, at + n) of the gradient arena are `sum`.
  void consume(float* at, const float* sum, size_t n);
  /// Training thread, after every reduce-scatter of the step has completed: the optimizer has
  /// taken the step; {squared norm (0 unless asked), non-finite count} of this rank's sums.
  std::vector<double> end_step();

 private:
  Backend& be_;
  std::shared_ptr<Optimizer> optimizer_;
  float* params_;
  const float* grads_;
  double lr_ = 0.0;
  bool norm_ = false;
  double squares_ = 0.0;
  int64_t nonfinite_ = 0;
};

}  // namespace ddp
