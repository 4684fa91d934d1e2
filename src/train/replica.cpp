// The model replica of one rank (replica.h).
#include "train/replica.h"

#include <algorithm>

#include "core/check.h"
#include "core/random.h"
#include "dist/agreement.h"

namespace ddp {

namespace {
constexpr double kMiB = 1024.0 * 1024.0;
}  // namespace

Replica::Replica(const TrainConfig& cfg, DeviceContext& ctx, int64_t max_batch)
    : cfg_(cfg), ctx_(ctx) {
  model_ =
      std::make_unique<Sequential>(cfg.model.layers, cfg.model.activation, max_batch, ctx.device());
  plan_ = compute_bucket_plan(
      model_->parameter_numels(), static_cast<size_t>(cfg.distributed.first_bucket_mb * kMiB),
      static_cast<size_t>(cfg.distributed.bucket_cap_mb * kMiB), ctx.arena_alignment());
  values_ = Buffer(plan_.total_numel, ctx.device());
  dlogits_ = Buffer(static_cast<size_t>(max_batch * model_->out_features()), ctx.device());
}

void Replica::connect(ProcessGroup& group, GradientCommunicator& host_gradients,
                      const TrainConfig& cfg) {
  host_gradients_ = &host_gradients;
  run_agreed(group, [&] {
    device_gradients_ = ctx_.make_gradient_communicator(group, host_gradients, cfg.distributed);
  });
  run_agreed(group, [&] {
    grads_ = gradient_comm().gradient_arena(plan_.total_numel, cfg.distributed.shared_memory);
    model_->bind(values_.data(), grads_, plan_.param_offset);
  });
  broadcast_parameters(group);
  reducer_ = std::make_unique<Reducer>(plan_, model_->parameter_names(), grads_, gradient_comm());
  optimizer_ = make_optimizer(cfg.optimizer, plan_.total_numel, ctx_.device());
}

Tensor Replica::parameters() {
  return Tensor{values_.data(), 1, static_cast<int64_t>(values_.numel()), values_.device()};
}

Tensor Replica::gradients() {
  return Tensor{grads_, 1, static_cast<int64_t>(plan_.total_numel), ctx_.device()};
}

Tensor Replica::dlogits(int64_t rows) { return Tensor::of(dlogits_, rows, model_->out_features()); }

// The weights come from a CPU twin of the model on every device, so the values are the CPU
// path's; rank 0 makes them, every rank receives them.
void Replica::broadcast_parameters(ProcessGroup& comm) {
  std::vector<float> host(plan_.total_numel);
  run_agreed(comm, [&] {
    if (comm.rank() != 0) return;
    Sequential twin(cfg_.model.layers, cfg_.model.activation, 1);
    twin.bind(host.data(), host.data(), plan_.param_offset);
    init_parameters(twin);
  });
  comm.broadcast(host.data(), host.size() * sizeof(float), 0);
  ctx_.copy_from_host(values_.data(), host.data(), host.size());
}

void Replica::init_parameters(Sequential& target) const {
  if (cfg_.model.init_from.empty()) {
    Rng rng(cfg_.training.seed);
    target.init_uniform(rng);
    return;
  }
  const std::string& path = cfg_.model.init_from;
  auto tensors = load_safetensors(path);
  for (Parameter* p : target.parameters()) {
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const NamedTensor& t) { return t.name == p->name; });
    DDP_CHECK(it != tensors.end(),
              "model.init_from: " << path << " has no tensor named " << p->name);
    DDP_CHECK(it->shape == p->shape,
              "model.init_from: " << path << ": tensor " << p->name
                                  << " has a different shape than the model's");
    std::copy(it->data.begin(), it->data.end(), p->value.data);
  }
  DDP_CHECK(tensors.size() == target.parameters().size(),
            "model.init_from: " << path << " has " << tensors.size() << " tensors, the model has "
                                << target.parameters().size() << " parameters");
}

std::vector<float> Replica::host_parameters() {
  std::vector<float> host(values_.numel());
  ctx_.copy_to_host(host.data(), values_.data(), host.size());
  return host;
}

std::vector<float> Replica::host_optimizer_state(const std::string& name) {
  Tensor buf = optimizer_->state(name);
  std::vector<float> host(static_cast<size_t>(buf.numel()));
  ctx_.copy_to_host(host.data(), buf.data, host.size());
  return host;
}

std::vector<NamedTensor> Replica::named(const std::vector<float>& arena) const {
  std::vector<NamedTensor> out;
  const auto& params = model_->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter* p = params[i];
    const float* first = arena.data() + plan_.param_offset[i];
    out.push_back(NamedTensor{p->name, p->shape, std::vector<float>(first, first + p->numel())});
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> Replica::shapes() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const Parameter* p : model_->parameters()) out.emplace_back(p->name, p->shape);
  return out;
}

void Replica::place(const std::vector<NamedTensor>& tensors, std::vector<float>& arena) const {
  const auto names = model_->parameter_names();
  for (const NamedTensor& t : tensors) {
    const auto it = std::find(names.begin(), names.end(), t.name);
    DDP_CHECK(it != names.end(), "tensor " << t.name << " is not a parameter of the model");
    const size_t i = static_cast<size_t>(it - names.begin());
    std::copy(t.data.begin(), t.data.end(), arena.begin() + plan_.param_offset[i]);
  }
}

void Replica::restore(const std::vector<float>& parameters,
                      const std::vector<std::vector<float>>& optimizer_state,
                      int64_t optimizer_steps) {
  ctx_.copy_from_host(values_.data(), parameters.data(), parameters.size());
  const std::vector<std::string> names = optimizer_->state_names();
  DDP_CHECK(optimizer_state.size() == names.size(), "restore: " << optimizer_state.size()
                                                                << " optimizer state arrays for "
                                                                << names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const std::vector<float>& host = optimizer_state[i];
    ctx_.copy_from_host(optimizer_->state(names[i]).data, host.data(), host.size());
  }
  optimizer_->set_steps_taken(static_cast<long>(optimizer_steps));
}

}  // namespace ddp
