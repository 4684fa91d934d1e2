// The optimizer base and the choice of one from the config (see optimizer.h).
#include "nn/optimizer.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "core/check.h"
#include "nn/adam.h"
#include "nn/sgd.h"

namespace ddp {

Optimizer::Optimizer(std::vector<Span> spans) : spans_(std::move(spans)) {
  for (size_t i = 0; i < spans_.size(); ++i) {
    DDP_CHECK(i == 0 || spans_[i].offset >= spans_[i - 1].end(),
              "optimizer: spans must be in arena order without overlap");
    state_offsets_.push_back(state_numel_);
    state_numel_ += spans_[i].numel;
  }
}

std::vector<Span> whole_arena(size_t numel) { return {Span{0, numel}}; }

void Optimizer::step(Backend& be, Tensor params, const Tensor& grads, double lr) {
  DDP_CHECK(params.numel() == grads.numel(), "optimizer step: " << params.numel()
                                                                << " parameters but "
                                                                << grads.numel() << " gradients");
  size_t state_offset = 0;
  for (const Span& s : spans_) {
    DDP_CHECK(s.end() <= static_cast<size_t>(params.numel()),
              "optimizer step: span [" << s.offset << ", " << s.end() << ") outside an arena of "
                                       << params.numel());
    const int64_t n = static_cast<int64_t>(s.numel);
    Tensor p{params.data + s.offset, 1, n, params.device};
    const Tensor g{grads.data + s.offset, 1, n, grads.device};
    update(be, p, g, state_offset, lr);
    state_offset += s.numel;
  }
  ++steps_;
}

void Optimizer::update_range(Backend& be, float* params, size_t offset, const float* grads,
                             size_t numel, double lr) {
  // The last span starting at or before offset.
  const auto after = std::upper_bound(spans_.begin(), spans_.end(), offset,
                                      [](size_t at, const Span& s) { return at < s.offset; });
  DDP_CHECK(after != spans_.begin() && offset + numel <= std::prev(after)->end(),
            "optimizer update of [" << offset << ", " << offset + numel
                                    << ") outside the spans this optimizer updates");
  const size_t i = static_cast<size_t>(after - spans_.begin()) - 1;
  const int64_t n = static_cast<int64_t>(numel);
  Tensor p{params + offset, 1, n, Device::CPU};
  const Tensor g{const_cast<float*>(grads), 1, n, Device::CPU};
  update(be, p, g, state_offsets_[i] + (offset - spans_[i].offset), lr);
}

std::vector<std::string> Optimizer::state_names() const { return names_; }

Tensor Optimizer::state(const std::string& name) {
  const auto it = std::find(names_.begin(), names_.end(), name);
  DDP_CHECK(it != names_.end(), "the optimizer keeps no state named " << name);
  return state_view(static_cast<size_t>(it - names_.begin()), 0,
                    static_cast<int64_t>(state_numel_));
}

void Optimizer::add_state(const std::string& name, Device device) {
  names_.push_back(name);
  buffers_.emplace_back(state_numel_, device);
}

Tensor Optimizer::state_view(size_t i, size_t offset, int64_t numel) {
  Buffer& b = buffers_.at(i);
  return Tensor{b.data() + offset, 1, numel, b.device()};
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, std::vector<Span> spans,
                                          Device device) {
  if (cfg.name == OptimizerName::Sgd) {
    SgdOptions opt;
    opt.lr = static_cast<float>(cfg.lr);
    opt.momentum = static_cast<float>(cfg.momentum);
    opt.dampening = static_cast<float>(cfg.dampening);
    opt.weight_decay = static_cast<float>(cfg.weight_decay);
    opt.nesterov = cfg.nesterov;
    return std::make_unique<Sgd>(opt, std::move(spans), device);
  }
  AdamOptions opt;
  opt.betas = {cfg.betas.at(0), cfg.betas.at(1)};
  opt.eps = cfg.eps;
  opt.weight_decay = cfg.weight_decay;
  opt.amsgrad = cfg.amsgrad;
  opt.decoupled = cfg.name == OptimizerName::AdamW;
  return std::make_unique<Adam>(opt, std::move(spans), device);
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
