// The optimizer base and the choice of one from the config (see optimizer.h).
#include "nn/optimizer.h"

#include <algorithm>

#include "core/check.h"
#include "nn/adam.h"
#include "nn/sgd.h"

namespace ddp {

std::vector<std::string> Optimizer::state_names() const { return names_; }

Tensor Optimizer::state(const std::string& name) {
  const auto it = std::find(names_.begin(), names_.end(), name);
  DDP_CHECK(it != names_.end(), "the optimizer keeps no state named " << name);
  return state_at(static_cast<size_t>(it - names_.begin()));
}

void Optimizer::add_state(const std::string& name, size_t numel, Device device) {
  names_.push_back(name);
  buffers_.emplace_back(numel, device);
}

Tensor Optimizer::state_at(size_t i) {
  Buffer& b = buffers_.at(i);
  return Tensor{b.data(), 1, static_cast<int64_t>(b.numel()), b.device()};
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, size_t numel, Device device) {
  if (cfg.name == OptimizerName::Sgd) {
    SgdOptions opt;
    opt.lr = static_cast<float>(cfg.lr);
    opt.momentum = static_cast<float>(cfg.momentum);
    opt.dampening = static_cast<float>(cfg.dampening);
    opt.weight_decay = static_cast<float>(cfg.weight_decay);
    opt.nesterov = cfg.nesterov;
    return std::make_unique<Sgd>(opt, numel, device);
  }
  AdamOptions opt;
  opt.betas = {cfg.betas.at(0), cfg.betas.at(1)};
  opt.eps = cfg.eps;
  opt.weight_decay = cfg.weight_decay;
  opt.amsgrad = cfg.amsgrad;
  opt.decoupled = cfg.name == OptimizerName::AdamW;
  return std::make_unique<Adam>(opt, numel, device);
}

std::vector<std::string> optimizer_state_names(const OptimizerConfig& cfg) {
  if (cfg.name == OptimizerName::Sgd) {
    if (cfg.momentum == 0.0) return {};
    return {"momentum"};
  }
  std::vector<std::string> names = {"exp_avg", "exp_avg_sq"};
  if (cfg.amsgrad) names.push_back("max_exp_avg_sq");
  return names;
}

}  // namespace ddp
