// The optimizers: one fused kernel call per step over the flat parameter arena, the same on
// every rank, so replicas that start identical and see identical averaged gradients stay
// identical. torch.optim's semantics (nn/sgd.h, nn/adam.h); make_optimizer picks one from the
// config. To add one: a Backend kernel (kernels/backend.h, both backends), a class here, a name
// in OptimizerName (include/ddp/config.h) and its keys in the schema (config/schema.h).
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

  /// One update of `params` from the averaged `grads` with learning rate `lr` (this step's).
  virtual void step(Backend& be, Tensor params, const Tensor& grads, double lr) = 0;

  /// The state a checkpoint keeps, as arena-shaped arrays on the device, by name
  /// ("momentum"; "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), in a fixed order.
  std::vector<std::string> state_names() const;
  Tensor state(const std::string& name);

  /// Updates applied so far (Adam's bias correction counts them).
  long steps_taken() const { return steps_; }
  /// Continues from a checkpoint that had taken `steps` updates (its state restored through
  /// state()).
  void set_steps_taken(long steps) { steps_ = steps; }

 protected:
  /// A zeroed arena-sized state array named `name`.
  void add_state(const std::string& name, size_t numel, Device device);
  Tensor state_at(size_t i);

  long steps_ = 0;

 private:
  std::vector<std::string> names_;
  std::vector<Buffer> buffers_;
};

/// The optimizer `cfg` names, for an arena of `numel` parameters on `device`.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, size_t numel, Device device);

/// The state names make_optimizer(cfg, ...)->state_names() has (what a checkpoint must hold).
std::vector<std::string> optimizer_state_names(const OptimizerConfig& cfg);

}  // namespace ddp
