// The model replica of one rank (replica.h).
#include "train/replica.h"

#include <algorithm>
#include <utility>

#include "comm/agreement.h"
#include "comm/device_communicators.h"
#include "comm/powersgd_communicator.h"
#include "core/check.h"
#include "core/random.h"

namespace ddp {

namespace {
constexpr double kMiB = 1024.0 * 1024.0;
}  // namespace

std::optional<Half> mixed_format(Precision p) {
  if (p == Precision::Bf16) return Half::Bf16;
  if (p == Precision::Fp16) return Half::Fp16;
  return std::nullopt;
}

std::string describe_precision(Precision p, Backend& be) {
  const std::optional<Half> format = mixed_format(p);
  if (!format) return "precision: fp32";
  MixedLinear* kernels = be.mixed_linear(*format);
  DDP_CHECK(kernels != nullptr,
            "training.precision: "
                << to_string(p) << " has no kernels on the " << be.name() << " backend of this rank"
                << (p == Precision::Fp16 ? " (fp16 runs on GPUs only; on CPUs use bf16)"
                                         : "; use fp32 there"));
  return std::string("precision: ") + to_string(p) + " GEMM operands on " + kernels->describe() +
         "; float32 accumulation, loss, gradients, optimizer and master weights";
}

Replica::Replica(const TrainConfig& cfg, const GradientPath& path, DeviceContext& ctx,
                 int64_t max_batch, int world)
    : cfg_(cfg), ctx_(ctx), path_(path) {
  precision_line_ = describe_precision(cfg.training.precision, ctx.backend());
  model_ = std::make_unique<Sequential>(cfg.model.layers, cfg.model.activation, max_batch,
                                        ctx.device(), mixed_format(cfg.training.precision));
  plan_ = compute_bucket_plan(
      model_->parameter_numels(), static_cast<size_t>(cfg.distributed.first_bucket_mb * kMiB),
      static_cast<size_t>(cfg.distributed.bucket_cap_mb * kMiB), ctx.arena_alignment());
  if (path_.equal_parts) plan_ = pad_buckets_to_equal_parts(std::move(plan_), world);
  dlogits_ = Buffer(static_cast<size_t>(max_batch * model_->out_features()), ctx.device());
}

void Replica::connect(ProcessGroup& group, HostGradientCommunicator& host, const TrainConfig& cfg) {
  const bool sharded = path_.sharded;
  shards_ = compute_shard_plan(plan_, sharded ? group.size() : 1, sharded ? group.rank() : 0);
  run_agreed(group, [&] { make_communicators(group, host, cfg.distributed); });
  run_agreed(group, [&] {
    grads_ = buckets_->gradient_arena(plan_.total_numel, path_.wire);
    if (sharded) {
      params_ = sharded_->parameter_arena(plan_.total_numel, path_.wire.shared_memory);
    } else {
      values_ = Buffer(plan_.total_numel, ctx_.device());
      params_ = values_.data();
    }
    model_->bind(params_, grads_, plan_.param_offset);
  });
  broadcast_parameters(group);
  const std::vector<std::string> names = model_->parameter_names();
  reducer_ = sharded ? std::make_unique<Reducer>(Reducer::sharded(plan_, names, grads_, *sharded_))
                     : std::make_unique<Reducer>(plan_, names, grads_, *buckets_);
  optimizer_ = make_optimizer(
      cfg.optimizer, sharded ? shards_.owned : whole_arena(plan_.total_numel), ctx_.device());
  if (path_.fused_update) fuse_update();
}

// The device's communicator where it has one (NCCL, or staged through `host`), else `host`.
void Replica::make_communicators(ProcessGroup& group, HostGradientCommunicator& host,
                                 const DistributedConfig& cfg) {
  host_ = &host;
  if (path_.sharded) {
    std::unique_ptr<ShardedCommunicator> own = ctx_.make_sharded_communicator(group, cfg);
    sharded_ = own ? own.get() : &host;
    buckets_ = sharded_;
    device_gradients_ = std::move(own);
    return;
  }
  device_gradients_ = ctx_.make_gradient_communicator(group, host, cfg);
  buckets_ = device_gradients_ ? device_gradients_.get() : &host;
  if (path_.powersgd_rank > 0) {
    powersgd_ = make_powersgd(host, *buckets_, group.size());
    buckets_ = powersgd_.get();
  }
}

// distributed.compression powersgd in front of `whole` (the host, or NCCL on a GPU): each
// bucket's parameters as matrices (a weight out x in, a bias out x 1), in the plan's order.
std::unique_ptr<PowerSgdCommunicator> Replica::make_powersgd(HostGradientCommunicator& host,
                                                             GradientCommunicator& whole,
                                                             int world) const {
  const std::vector<PowerSgdLayout> layouts =
      powersgd_layouts(plan_, model_->parameter_numels(), model_->parameter_rows());
  PowerSgdOptions options;
  options.rank = path_.powersgd_rank;
  PowerSgdCompressors compressors = device_gradients_
                                        ? nccl_powersgd_compressors(whole, layouts, options, world)
                                        : host_powersgd_compressors(host, layouts, options, world);
  return std::make_unique<PowerSgdCommunicator>(whole, std::move(compressors),
                                                path_.powersgd_start_step, cfg_.training.seed);
}

// distributed.overlap_optimizer: each bucket's reduce-scatter hands this rank's sums to the
// optimizer (on the host: the path fuses on CPU ranks only). The consumer holds what it uses: a
// collective declared lost may still return after the replica is gone.
void Replica::fuse_update() {
  DDP_CHECK(sharded_ == host_, "the fused update needs the host communicator");
  fused_ = std::make_shared<FusedShardUpdate>(ctx_.backend(), optimizer_, params_, grads_);
  reducer_->fuse(
      *host_,
      [fused = fused_](float* at, const float* sum, size_t n) { fused->consume(at, sum, n); },
      model_->parameter_layers());
}

std::shared_ptr<Work> Replica::allgather_parameters(ScalarRiders riders) {
  if (riders.mine.empty()) return sharded_->allgather_async(params_, shards_.buckets);
  DDP_CHECK(sharded_ == host_, "riders travel on the host communicator's allgather only");
  return host_->allgather_with_riders(params_, shards_.buckets, std::move(riders));
}

void Replica::write_parameters(const std::vector<float>& host) {
  DDP_CHECK(host.size() == plan_.total_numel,
            "parameters: " << host.size() << " values for an arena of " << plan_.total_numel);
  if (!path_.sharded) {
    ctx_.copy_from_host(params_, host.data(), host.size());
    return;
  }
  for (const Span& s : shards_.owned)
    ctx_.copy_from_host(params_ + s.offset, host.data() + s.offset, s.numel);
  allgather_parameters()->wait();
}

Tensor Replica::parameters() {
  return Tensor{params_, 1, static_cast<int64_t>(plan_.total_numel), ctx_.device()};
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
  write_parameters(host);
}

void Replica::init_parameters(Sequential& target) const {
  if (cfg_.model.init_from.empty()) {
    Rng rng(cfg_.training.seed);
    target.init_uniform(rng);
    return;
  }
  const std::string& path = cfg_.model.init_from;
  auto tensors = load_safetensors(path);
  require_finite(tensors, "model.init_from '" + path + "'");
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
  std::vector<float> host;
  host_parameters(host);
  return host;
}

void Replica::host_parameters(std::vector<float>& host) {
  host.resize(plan_.total_numel);
  ctx_.copy_to_host(host.data(), params_, host.size());
}

std::vector<float> Replica::host_optimizer_state(const std::string& name) {
  std::vector<float> host;
  host_optimizer_state(name, host);
  return host;
}

void Replica::host_optimizer_state(const std::string& name, std::vector<float>& host) {
  const Tensor state = optimizer_->state(name);
  host.assign(plan_.total_numel, 0.0f);
  size_t at = 0;  // the state holds the optimizer's spans one after another
  for (const Span& s : optimizer_->spans()) {
    ctx_.copy_to_host(host.data() + s.offset, state.data + at, s.numel);
    at += s.numel;
  }
  // The host communicator gathers host memory on any device.
  if (path_.sharded) host_->allgather_async(host.data(), shards_.buckets)->wait();
}

std::vector<NamedTensor> Replica::named(const std::vector<float>& arena) const {
  std::vector<NamedTensor> out;
  named(arena, out);
  return out;
}

void Replica::named(const std::vector<float>& arena, std::vector<NamedTensor>& out) const {
  const auto& params = model_->parameters();
  out.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter* p = params[i];
    const float* first = arena.data() + plan_.param_offset[i];
    out[i].name = p->name;
    out[i].shape = p->shape;
    out[i].data.assign(first, first + p->numel());
  }
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
  write_parameters(parameters);
  const std::vector<std::string> names = optimizer_->state_names();
  DDP_CHECK(optimizer_state.size() == names.size(), "restore: " << optimizer_state.size()
                                                                << " optimizer state arrays for "
                                                                << names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const std::vector<float>& host = optimizer_state[i];
    DDP_CHECK(host.size() == plan_.total_numel,
              "restore: optimizer state " << names[i] << " has " << host.size()
                                          << " values for an arena of " << plan_.total_numel);
    float* state = optimizer_->state(names[i]).data;
    for (const Span& s : optimizer_->spans()) {
      ctx_.copy_from_host(state, host.data() + s.offset, s.numel);
      state += s.numel;
    }
  }
  optimizer_->set_steps_taken(static_cast<long>(optimizer_steps));
}

}  // namespace ddp
