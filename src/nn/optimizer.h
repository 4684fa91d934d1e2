// The optimizers: one fused kernel call per span of the flat parameter arena per step (one span,
// the whole arena, unless the optimizer is sharded), the same on every rank, so replicas that
// start identical and see identical averaged gradients stay identical. A sharded optimizer
// updates this rank's parts of the arena and keeps state for those alone; the elementwise
// kernels give every element the bits the whole-arena call gives it. torch.optim's semantics
// (nn/sgd.h, nn/adam.h); make_optimizer picks one from the config. To add one: a Backend kernel
// (kernels/backend.h, both backends), a class here, a name in OptimizerName (include/ddp/config.h)
// and its keys in the schema (config/schema.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ddp/config.h"
#include "kernels/backend.h"

namespace ddp {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  /// One update of the spans of `params` (the arena, or this rank's shard of it) from the
  /// averaged `grads` (arena-shaped too) with learning rate `lr` (this step's).
  void step(Backend& be, Tensor params, const Tensor& grads, double lr);

  /// What step() does to [offset, offset + numel) of the arena `params` (host memory), a range
  /// inside one of spans(), from that range's averaged gradients at `grads` (anywhere in host
  /// memory): the sharded update fused with the reduce-scatter, a block at a time, during
  /// backward (train/fused_shard_update.h). Every element gets the bits step() gives it.
  /// end_step() once every range of the step has been updated.
  void update_range(Backend& be, float* params, size_t offset, const float* grads, size_t numel,
                    double lr);
  void end_step() { ++steps_; }

  /// The parts of the arena this optimizer updates: all of it, or this rank's shard
  /// (distributed.shard_optimizer). Its state arrays hold exactly these, one after another.
  const std::vector<Span>& spans() const { return spans_; }
  size_t state_numel() const { return state_numel_; }

  /// The state a checkpoint keeps, as arrays of state_numel() floats on the device, by name
  /// ("momentum"; "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), in a fixed order.
  std::vector<std::string> state_names() const;
  Tensor state(const std::string& name);

  /// Updates applied so far (Adam's bias correction counts them).
  long steps_taken() const { return steps_; }
  /// Continues from a checkpoint that had taken `steps` updates (its state restored through
  /// state()).
  void set_steps_taken(long steps) { steps_ = steps; }

 protected:
  explicit Optimizer(std::vector<Span> spans);

  /// The update of one span: params and grads are its views, its state starts at
  /// state_offset in every state array. steps_taken() is the updates before this step.
  virtual void update(Backend& be, Tensor& params, const Tensor& grads, size_t state_offset,
                      double lr) = 0;

  /// A zeroed state array of state_numel() floats named `name`.
  void add_state(const std::string& name, Device device);
  /// State array i's floats [offset, offset + numel), a view like the span's parameters.
  Tensor state_view(size_t i, size_t offset, int64_t numel);

 private:
  std::vector<Span> spans_;
  std::vector<size_t> state_offsets_;  // per span: where its state starts in every state array
  size_t state_numel_ = 0;
  long steps_ = 0;
  std::vector<std::string> names_;
  std::vector<Buffer> buffers_;
};

/// One span covering an arena of `numel` floats: what an unsharded optimizer updates.
std::vector<Span> whole_arena(size_t numel);

/// The optimizer `cfg` names, updating `spans` of a parameter arena on `device`.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, std::vector<Span> spans,
                                          Device device);

/// The state names make_optimizer(cfg, ...)->state_names() has (what a checkpoint must hold).
std::vector<std::string> optimizer_state_names(const OptimizerConfig& cfg);

}  // namespace ddp
