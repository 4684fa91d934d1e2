// The training loop (see trainer.h). One optimizer step, as data flows:
//   loader batch -> forward -> softmax-xent -> backward (each gradient announced to the
//   Reducer the moment it is final; full buckets start their allreduce on the comm thread)
//   -> finalize (wait for the buckets: gradients are now averaged) -> SGD on every rank.
#include "ddp/trainer.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "ddp/backend.h"
#include "ddp/check.h"
#include "ddp/cuda.h"
#include "ddp/cuda_comm.h"
#include "ddp/data/dataset.h"
#include "ddp/data/loader.h"
#include "ddp/data/sampler.h"
#include "ddp/env.h"
#include "ddp/nn/sequential.h"
#include "ddp/optim.h"
#include "ddp/random.h"
#include "ddp/reducer.h"
#include "ddp/stop.h"
#include "ddp/trace.h"
#include "ddp/training_checkpoint.h"

namespace ddp {

void run_agreed(Communicator& comm, const std::function<void()>& fn) {
  std::string message;
  try {
    fn();
  } catch (const std::exception& e) {
    message = e.what();
    if (message.empty()) message = "unknown error";
  }
  double first_failed = message.empty() ? comm.size() : comm.rank();
  comm.allreduce(&first_failed, 1, ReduceOp::Min);
  const int root = static_cast<int>(first_failed);
  if (root >= comm.size()) return;
  throw CollectiveError(broadcast_string(comm, message, root));
}

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr int64_t kEvalBatch = 1024;

// "key.path = value" lines of the effective config, in order: what ranks compare at startup,
// so a difference is reported by the key that differs.
void flatten_yaml(const YAML::Node& node, const std::string& prefix,
                  std::vector<std::string>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      flatten_yaml(kv.second, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  YAML::Emitter emitter;
  emitter << YAML::Flow << node;
  out.push_back(prefix + " = " + emitter.c_str());
}

std::vector<std::string> startup_fingerprint(const TrainConfig& cfg, const Sequential& model,
                                             const BucketPlan& plan, int world) {
  std::vector<std::string> lines;
  // Where rank 0 writes its files is nobody else's business; everything else must agree.
  TrainConfig comparable = cfg;
  comparable.source.clear();
  comparable.output = OutputConfig{};
  flatten_yaml(YAML::Load(to_yaml(comparable)), "", lines);
  for (const Parameter* p : model.parameters()) {
    std::ostringstream oss;
    oss << "parameter " << p->name << " [";
    for (size_t i = 0; i < p->shape.size(); ++i) oss << (i ? ", " : "") << p->shape[i];
    oss << "]";
    lines.push_back(oss.str());
  }
  std::istringstream plan_lines(describe_plan(plan, model.parameter_names()));
  for (std::string line; std::getline(plan_lines, line);) lines.push_back(line);
  lines.push_back("world size " + std::to_string(world));
  return lines;
}

// The settings a checkpoint can only continue under: what decides the model, the order of the
// data and the update rule. Paths, epochs, logging, devices, the batch and the world size may
// change (positions in the data are counted in samples of the epoch's global order).
std::string resume_fingerprint(const TrainConfig& cfg) {
  static const std::vector<std::string> kKeys = {
      "model.layers",   "model.activation", "data.format", "data.train.samples", "data.shuffle",
      "data.drop_last", "data.csv_header",  "data.seed",   "optimizer.",         "training.seed"};
  std::vector<std::string> all;
  flatten_yaml(YAML::Load(to_yaml(cfg)), "", all);
  std::string out;
  for (const std::string& line : all) {
    const std::string key = line.substr(0, line.find(" = "));
    for (const std::string& k : kKeys) {
      if (k.back() == '.' ? key.rfind(k, 0) == 0 : key == k) {
        out += line + "\n";
        break;
      }
    }
  }
  return out;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// Throws (on the ranks that differ) naming the first line where this rank differs from rank 0.
void check_same_as_rank0(Communicator& comm, const std::vector<std::string>& mine) {
  const std::string root_text = broadcast_string(comm, join_lines(mine), 0);
  if (comm.rank() == 0) return;
  std::vector<std::string> theirs;
  std::istringstream iss(root_text);
  for (std::string line; std::getline(iss, line);) theirs.push_back(line);
  for (size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
    const std::string a = i < theirs.size() ? theirs[i] : "(nothing)";
    const std::string b = i < mine.size() ? mine[i] : "(nothing)";
    if (a != b) {
      DDP_THROW("model or configuration differs from rank 0's: rank 0 has '"
                << a << "' where rank " << comm.rank() << " has '" << b
                << "'; every rank must run the same config and model");
    }
  }
}

std::string format_rate(double samples_per_sec) {
  std::ostringstream oss;
  oss << std::fixed << std::setprecision(0) << samples_per_sec << " samples/s";
  return oss.str();
}

std::string percent(double fraction) {
  std::ostringstream oss;
  oss << std::fixed << std::setprecision(1) << 100.0 * fraction << "%";
  return oss.str();
}

// Sums of a phase's loss, correct predictions and sample count, reduced over ranks on demand.
struct Tally {
  double loss_sum = 0, correct = 0, count = 0;
  void add(const XentResult& r, int64_t rows) {
    loss_sum += r.loss_sum;
    correct += static_cast<double>(r.correct);
    count += static_cast<double>(rows);
  }
  Tally reduced(Communicator& comm) const {
    double v[3] = {loss_sum, correct, count};
    comm.allreduce(v, 3, ReduceOp::Sum);
    return Tally{v[0], v[1], v[2]};
  }
  double loss() const { return count > 0 ? loss_sum / count : 0.0; }
  double accuracy() const { return count > 0 ? correct / count : 0.0; }
};

// A moment in the step, on the host clock: taken at once on the CPU; on a GPU a mark in the
// compute stream, resolved once the device got there (so recording it never waits).
struct Mark {
  std::shared_ptr<StreamMark> gpu;
  double host = 0.0;
  double time() const { return gpu ? gpu->time() : host; }
};

// A traced span whose times are resolved with its step.
struct TraceSpan {
  int track;
  std::string name;
  Mark begin, end;
};

// A step the host has queued but whose results it has not read yet: on the CPU it is read at
// once; on a GPU one step later, so the host queues step i+1 while the device runs step i.
struct PendingStep {
  int64_t epoch = 0, step_in_epoch = 0, global_step = 0;
  int slot = 0;             // the backend's loss totals slot
  bool has_totals = false;  // totals taken already (to decide on non-finite gradients)
  XentResult totals;
  int64_t rows = 0;  // samples of this rank in the step
  bool log = false;  // ends a progress-line interval
  std::vector<std::shared_ptr<Work>> works;
  Mark backward_begin, backward_end;
  double backward_cpu = 0.0;  // CPU: the training thread's CPU time in backward
  std::vector<TraceSpan> spans;
  std::vector<std::pair<std::string, Mark>> instants;  // on the compute track
};

}  // namespace

struct Trainer::State {
  TrainConfig cfg;
  Communicator& comm;
  std::ostream* log;
  DevicePlacement placement;
  std::unique_ptr<Backend> backend;
  Dataset train, test;
  bool has_test = false;
  std::unique_ptr<Sequential> model;
  BucketPlan plan;
  Buffer values, dlogits;
  // The gradient communicator: on a GPU the NCCL or staged one (over comm), else comm itself.
  std::unique_ptr<Communicator> device_comm;
  float* grads = nullptr;  // the gradient arena (bucket memory)
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<Sgd> sgd;
  std::unique_ptr<DistributedSampler> sampler;
  std::unique_ptr<Loader> train_loader, test_loader;
  std::unique_ptr<BatchUploader> train_uploader, test_uploader;
  std::ofstream metrics;
  bool shapes_printed = false;
  std::unique_ptr<Tracer> tracer = std::make_unique<Tracer>();  // disabled unless output.trace
  int track_compute = -1, track_comm = -1, track_data = -1;
  // Checkpoints: where run() begins (the beginning, or a checkpoint's position) and the newest
  // checkpoint written.
  std::string checkpoint_dir;
  TrainingState start;
  bool resumed = false;
  std::string last_checkpoint;
  int64_t last_checkpoint_step = -1;
  // Stop agreement (poll_stop): each step's flag is reduced on comm's lane and read a step
  // later; the flags outlive the collective that reads them.
  float stop_flags[2] = {0.0f, 0.0f};
  int stop_slot = 0;
  std::shared_ptr<Work> stop_work;
  // Declared last: pending steps hold collectives of device_comm and must go first.
  std::vector<PendingStep> pending;

  State(const TrainConfig& c, Communicator& cm, std::ostream* lg) : cfg(c), comm(cm), log(lg) {}
  bool is_root() const { return comm.rank() == 0; }
  bool on_gpu() const { return placement.device == Device::CUDA; }
  Communicator& grad_comm() { return device_comm ? *device_comm : comm; }
  void say(const std::string& line) const {
    if (is_root() && log != nullptr) *log << line << std::endl;
  }
  void record(const nlohmann::json& j) {
    if (metrics.is_open()) metrics << j.dump() << "\n" << std::flush;
  }
  Tensor flat(Buffer& b) {
    return Tensor{b.data(), 1, static_cast<int64_t>(b.numel()), b.device()};
  }
  Mark mark() {
    Mark m;
    if (on_gpu()) {
      m.gpu = mark_stream(*backend);
    } else {
      m.host = seconds_now();
    }
    return m;
  }

  void setup();
  void choose_placement();
  void load_data();
  void build_model();
  void init_parameters(Sequential& target);
  void broadcast_parameters();
  void open_outputs();
  void start_trace();
  void print_shapes(const Tensor& x, const Tensor& logits);
  Tally evaluate();
  std::vector<float> host_values();
  std::vector<float> host_momentum();
  std::vector<NamedTensor> named(const std::vector<float>& arena) const;
  void resume();
  void save_checkpoint(TrainingState st, const Tally& epoch_tally);
  bool poll_stop();
  void save_weights(const std::vector<NamedTensor>& w);
  void write_trace();
};

void Trainer::State::choose_placement() {
  std::string why_none;
  const int visible = cfg.device == "cpu" ? 0 : cuda_device_count(&why_none);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  Environment env;
  env.rank = comm.rank();
  env.world = comm.size();
  env.local_rank = comm.local_rank();
  env.local_size = comm.local_size();
  env.host = host;
  placement = choose_device(cfg.device, cfg.distributed.backend, cfg.distributed.gpus, env, visible,
                            why_none);
  if (!on_gpu()) {
    backend = make_cpu_backend();
    set_flush_denormals(true);  // this is the thread that computes (see backend.h)
    return;
  }
  backend = make_cuda_backend(placement.gpu);
}

void Trainer::State::setup() {
  comm.set_timeout(cfg.distributed.timeout_s);
  run_agreed(comm, [&] {
    choose_placement();
    load_data();
    build_model();
    open_outputs();
  });
  // Every rank's device, in rank order, from rank 0.
  std::ostringstream mine;
  mine << "  rank " << comm.rank() << ": " << placement.describe();
  if (on_gpu()) mine << " " << cuda_device_info(placement.gpu).name;
  for (int r = 0; r < comm.size(); ++r) say(broadcast_string(comm, mine.str(), r));
  // Compare before any collective whose size depends on the model, so a mismatch is a message
  // and not a truncated broadcast or a hang.
  run_agreed(comm, [&] {
    check_same_as_rank0(comm, startup_fingerprint(cfg, *model, plan, comm.size()));
  });
  if (on_gpu()) {
    run_agreed(comm, [&] {
      if (placement.backend == "nccl") {
        NcclOptions options;
        options.algo = cfg.distributed.nccl_algo;
        options.timeout_s = cfg.distributed.timeout_s;
        device_comm = make_nccl_communicator(comm, *backend, options);
      } else {
        device_comm = make_staged_communicator(comm, *backend);
      }
    });
  }
  run_agreed(comm, [&] {
    grads = grad_comm().gradient_arena(plan.total_numel, cfg.distributed.shared_memory);
    model->bind(values.data(), grads, plan.param_offset);
  });
  broadcast_parameters();

  checkpoint_dir = cfg.checkpoint.directory(cfg.output.dir);
  reducer = std::make_unique<Reducer>(plan, model->parameter_names(), grads, grad_comm());
  SgdOptions opt;
  opt.lr = static_cast<float>(cfg.optimizer.lr);
  opt.momentum = static_cast<float>(cfg.optimizer.momentum);
  opt.dampening = static_cast<float>(cfg.optimizer.dampening);
  opt.weight_decay = static_cast<float>(cfg.optimizer.weight_decay);
  opt.nesterov = cfg.optimizer.nesterov;
  sgd = std::make_unique<Sgd>(opt, plan.total_numel, placement.device);
  sampler =
      std::make_unique<DistributedSampler>(train.size, comm.size(), comm.rank(), cfg.data.shuffle,
                                           cfg.training.seed, cfg.data.drop_last);
  const int64_t b = cfg.training.batch_size;
  train_loader = std::make_unique<Loader>(train, b, cfg.data.drop_last, cfg.data.prefetch);
  if (has_test) test_loader = std::make_unique<Loader>(test, kEvalBatch, false, cfg.data.prefetch);
  resume();
  if (on_gpu()) {
    train_uploader = std::make_unique<BatchUploader>(*backend, b, train.features);
    if (has_test)
      test_uploader = std::make_unique<BatchUploader>(*backend, kEvalBatch, test.features);
  }

  say("model: " + model->describe() + ", " + std::to_string(plan.total_numel) + " parameters in " +
      std::to_string(plan.buckets.size()) + " bucket(s)");
  std::istringstream plan_lines(describe_plan(plan, model->parameter_names()));
  for (std::string line; std::getline(plan_lines, line);) say("  " + line);
  say("data: " + std::to_string(train.size) + " training samples (" + train.source + "), " +
      std::to_string(sampler->num_samples()) + " per rank per epoch; global batch " +
      std::to_string(b * comm.size() * cfg.training.accumulate_steps) + " = " + std::to_string(b) +
      " per rank x " + std::to_string(comm.size()) + " ranks x " +
      std::to_string(cfg.training.accumulate_steps) + " accumulation step(s)");
  if (on_gpu()) {
    std::string algo = "";
    if (placement.backend == "nccl") {
      const char* env_algo = std::getenv("NCCL_ALGO");
      algo = " NCCL " + nccl_version() + ", NCCL_ALGO=" + (env_algo ? env_algo : "(NCCL's choice)");
    }
    say("gradients: " + placement.backend + algo + ", allreduce per bucket on its own stream");
  }
  start_trace();
}

void Trainer::State::load_data() {
  const int64_t features = cfg.model.layers.front();
  const int64_t classes = cfg.model.layers.back();
  train = load_split(cfg.data, cfg.data.train, false, features, classes);
  has_test = cfg.data.test.configured();
  if (has_test) test = load_split(cfg.data, cfg.data.test, true, features, classes);
  const int world = comm.size();
  DistributedSampler probe(train.size, world, comm.rank(), false, 0, cfg.data.drop_last);
  DDP_CHECK(probe.num_samples() >= 1, "data.train: " << train.source << " has " << train.size
                                                     << " samples, fewer than the " << world
                                                     << " ranks");
  DDP_CHECK(!cfg.data.drop_last || probe.num_samples() >= cfg.training.batch_size,
            "training.batch_size: " << cfg.training.batch_size
                                    << " is larger than a rank's shard of " << probe.num_samples()
                                    << " samples and data.drop_last is set: "
                                    << "no batch would be left");
}

void Trainer::State::build_model() {
  const int64_t max_batch = std::max<int64_t>(cfg.training.batch_size, has_test ? kEvalBatch : 1);
  model = std::make_unique<Sequential>(cfg.model.layers, cfg.model.activation, max_batch,
                                       placement.device);
  plan = compute_bucket_plan(model->parameter_numels(),
                             static_cast<size_t>(cfg.distributed.first_bucket_mb * kMiB),
                             static_cast<size_t>(cfg.distributed.bucket_cap_mb * kMiB),
                             on_gpu() ? 4 : 1);  // 16-byte aligned tensors for the GPU kernels
  values = Buffer(plan.total_numel, placement.device);
  dlogits = Buffer(static_cast<size_t>(max_batch * model->out_features()), placement.device);
}

void Trainer::State::init_parameters(Sequential& target) {
  if (cfg.model.init_from.empty()) {
    Rng rng(cfg.training.seed);
    target.init_uniform(rng);
    return;
  }
  const std::string& path = cfg.model.init_from;
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

// Rank 0 initialises (or loads) the parameters, everyone receives them: on a GPU through a
// host copy, initialised by a CPU twin of the model so the values are those of the CPU path.
void Trainer::State::broadcast_parameters() {
  if (!on_gpu()) {
    run_agreed(comm, [&] {
      if (is_root()) init_parameters(*model);
    });
    comm.broadcast(values.data(), values.bytes(), 0);
    return;
  }
  std::vector<float> host(plan.total_numel);
  run_agreed(comm, [&] {
    if (!is_root()) return;
    Sequential twin(cfg.model.layers, cfg.model.activation, 1);
    twin.bind(host.data(), host.data(), plan.param_offset);
    init_parameters(twin);
  });
  comm.broadcast(host.data(), host.size() * sizeof(float), 0);
  if (!host.empty()) cuda_copy_bytes(values.data(), host.data(), values.bytes());
}

void Trainer::State::open_outputs() {
  if (!is_root()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(cfg.output.dir, ec);
  DDP_CHECK(!ec, "output.dir: cannot create " << cfg.output.dir << ": " << ec.message());
  const std::string path = cfg.output.dir + "/metrics.jsonl";
  // A resumed run continues the metrics of the run it resumes.
  metrics.open(path,
               std::ios::out | (cfg.training.resume.empty() ? std::ios::trunc : std::ios::app));
  DDP_CHECK(metrics.is_open(), "output.dir: cannot write " << path << ": " << std::strerror(errno));
  std::ofstream(cfg.output.dir + "/config.yaml") << to_yaml(cfg);
}

void Trainer::State::start_trace() {
  if (!cfg.output.trace) return;
  comm.barrier();  // time 0 of every rank's track is (nearly) the same moment
  const double origin = seconds_now();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  tracer = std::make_unique<Tracer>(comm.rank(), std::string(host) + ", " + placement.describe(),
                                    origin);
  const bool gpu = on_gpu();
  track_compute = tracer->track(gpu ? "compute stream" : "training thread");
  track_comm = tracer->track(
      gpu ? (placement.backend == "nccl" ? "NCCL stream" : "comm thread (staged)") : "comm thread");
  track_data = tracer->track("data (host)");
}

void Trainer::State::print_shapes(const Tensor& x, const Tensor& logits) {
  // Like the seed tutorial's DataParallel demo: each replica sees its part of the global batch.
  std::ostringstream mine;
  mine << "  rank " << comm.rank() << " replica: input " << shape_string(x.rows, x.cols)
       << " -> output " << shape_string(logits.rows, logits.cols);
  say("global batch: input " + shape_string(x.rows * comm.size(), x.cols) + " -> output " +
      shape_string(logits.rows * comm.size(), logits.cols) + " split over " +
      std::to_string(comm.size()) + " replicas:");
  for (int r = 0; r < comm.size(); ++r) say(broadcast_string(comm, mine.str(), r));
}

Tally Trainer::State::evaluate() {
  Tally t;
  test_loader->start_epoch(shard_indices(test.size, comm.size(), comm.rank()));
  while (const Batch* batch = test_loader->next()) {
    Tensor x{const_cast<float*>(batch->x.data()), batch->rows, test.features, Device::CPU};
    const int32_t* labels = batch->y.data();
    if (on_gpu()) {
      test_uploader->upload(batch->x.data(), batch->y.data(), batch->rows);
      const BatchUploader::DeviceBatch db = test_uploader->acquire();
      x = db.x;
      labels = db.labels;
    }
    const Tensor& logits = model->forward(*backend, x);
    t.add(backend->softmax_xent(logits, labels, 0.0f, nullptr), batch->rows);
  }
  return t.reduced(comm);
}

std::vector<float> Trainer::State::host_values() {
  std::vector<float> host(values.numel());
  if (host.empty()) return host;
  if (on_gpu()) {
    cuda_copy_bytes(host.data(), values.data(), values.bytes());
  } else {
    std::copy(values.data(), values.data() + values.numel(), host.begin());
  }
  return host;
}

std::vector<float> Trainer::State::host_momentum() {
  Tensor buf = sgd->momentum_buffer();
  std::vector<float> host(static_cast<size_t>(buf.numel()));
  if (host.empty()) return host;
  if (on_gpu()) {
    cuda_copy_bytes(host.data(), buf.data, host.size() * sizeof(float));
  } else {
    std::copy(buf.data, buf.data + buf.numel(), host.begin());
  }
  return host;
}

// The parameters' slices of an arena-shaped array (values, momentum) as named tensors.
std::vector<NamedTensor> Trainer::State::named(const std::vector<float>& arena) const {
  std::vector<NamedTensor> out;
  const auto& params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter* p = params[i];
    const float* first = arena.data() + plan.param_offset[i];
    out.push_back(NamedTensor{p->name, p->shape, std::vector<float>(first, first + p->numel())});
  }
  return out;
}

// Collective. training.resume: rank 0 finds, reads and validates the checkpoint; every rank
// receives the weights, the momentum and the position, so other nodes need not see the file.
void Trainer::State::resume() {
  const std::string& how = cfg.training.resume;
  if (how.empty()) return;
  std::string path = how;
  if (how == "auto") {
    run_agreed(comm, [&] {
      if (is_root()) path = latest_checkpoint(checkpoint_dir);
    });
    path = broadcast_string(comm, path, 0);
    if (path.empty()) {
      say("resume: no checkpoint in " + checkpoint_dir + ", starting from the beginning");
      return;
    }
  }
  std::vector<float> weights(plan.total_numel, 0.0f), momentum;
  const bool with_momentum = cfg.optimizer.momentum != 0.0;
  if (with_momentum) momentum.assign(plan.total_numel, 0.0f);
  run_agreed(comm, [&] {
    if (!is_root()) return;
    std::error_code ec;
    DDP_CHECK(std::filesystem::exists(path, ec),
              "training.resume: checkpoint file not found: " << path << " (on rank 0)");
    TrainingCheckpoint ck = read_checkpoint(path);
    ResumeExpectation expected;
    for (const Parameter* p : model->parameters())
      expected.parameters.emplace_back(p->name, p->shape);
    expected.momentum = with_momentum;
    expected.train_samples = train.size;
    expected.config = resume_fingerprint(cfg);
    check_resumable(ck, path, expected);
    const auto names = model->parameter_names();
    auto place = [&](const std::vector<NamedTensor>& tensors, std::vector<float>& arena) {
      for (const NamedTensor& t : tensors) {
        const size_t i =
            static_cast<size_t>(std::find(names.begin(), names.end(), t.name) - names.begin());
        std::copy(t.data.begin(), t.data.end(), arena.begin() + plan.param_offset[i]);
      }
    };
    place(ck.weights, weights);
    place(ck.momentum, momentum);
    start = ck.state;
  });
  comm.broadcast(weights.data(), weights.size() * sizeof(float), 0);
  if (with_momentum) comm.broadcast(momentum.data(), momentum.size() * sizeof(float), 0);
  // The position, as exact doubles (every count is far below 2^53).
  double pos[11] = {double(start.epoch),
                    double(start.step_in_epoch),
                    double(start.epoch_position),
                    double(start.global_step),
                    double(start.sgd_steps),
                    double(start.skipped_steps),
                    double(start.world_size),
                    double(start.global_batch),
                    start.epoch_loss_sum,
                    start.epoch_correct,
                    start.epoch_count};
  comm.broadcast(pos, sizeof pos, 0);
  start.epoch = int64_t(pos[0]);
  start.step_in_epoch = int64_t(pos[1]);
  start.epoch_position = int64_t(pos[2]);
  start.global_step = int64_t(pos[3]);
  start.sgd_steps = int64_t(pos[4]);
  start.skipped_steps = int64_t(pos[5]);
  start.world_size = int64_t(pos[6]);
  start.global_batch = int64_t(pos[7]);
  start.epoch_loss_sum = pos[8];
  start.epoch_correct = pos[9];
  start.epoch_count = pos[10];
  if (on_gpu()) {
    if (!weights.empty()) cuda_copy_bytes(values.data(), weights.data(), values.bytes());
    if (with_momentum) {
      cuda_copy_bytes(sgd->momentum_buffer().data, momentum.data(),
                      momentum.size() * sizeof(float));
    }
  } else {
    std::copy(weights.begin(), weights.end(), values.data());
    if (with_momentum) std::copy(momentum.begin(), momentum.end(), sgd->momentum_buffer().data);
  }
  sgd->set_steps_taken(static_cast<long>(start.sgd_steps));
  resumed = true;
  std::ostringstream line;
  line << "resume: " << path << ": epoch " << start.epoch + 1 << " step " << start.step_in_epoch
       << " (" << start.global_step << " steps done)";
  say(line.str());
  const int64_t global_batch =
      cfg.training.batch_size * cfg.training.accumulate_steps * comm.size();
  if (start.global_batch != global_batch) {
    say("warning: the global batch changes from " + std::to_string(start.global_batch) +
        " samples per step (" + std::to_string(start.world_size) +
        " rank(s) in the checkpoint) to " + std::to_string(global_batch) + " = " +
        std::to_string(cfg.training.batch_size) + " per rank x " + std::to_string(comm.size()) +
        " rank(s) x " + std::to_string(cfg.training.accumulate_steps) +
        " accumulation step(s): training continues, but not as the uninterrupted run would "
        "(keep training.batch_size x ranks the same to keep the global batch)");
  } else if (start.world_size != comm.size()) {
    say("resume: " + std::to_string(start.world_size) + " rank(s) in the checkpoint, " +
        std::to_string(comm.size()) + " now; the global batch stays " +
        std::to_string(global_batch));
  }
  record({{"type", "resume"},
          {"checkpoint", path},
          {"epoch", start.epoch + 1},
          {"step", start.step_in_epoch},
          {"global_step", start.global_step},
          {"checkpoint_world_size", start.world_size},
          {"world_size", comm.size()}});
}

// Collective: rank 0 writes the checkpoint; every rank returns once it is durable, or throws
// the writer's error (a full disk: the previous checkpoint is still there).
void Trainer::State::save_checkpoint(TrainingState st, const Tally& epoch_tally) {
  const Tally g = epoch_tally.reduced(comm);
  st.epoch_loss_sum = g.loss_sum;
  st.epoch_correct = g.correct;
  st.epoch_count = g.count;
  st.sgd_steps = sgd->steps_taken();
  st.world_size = comm.size();
  st.global_batch = cfg.training.batch_size * cfg.training.accumulate_steps * comm.size();
  st.train_samples = train.size;
  st.config = resume_fingerprint(cfg);
  const std::string path = checkpoint_path(checkpoint_dir, st.global_step);
  const double t0 = seconds_now();
  backend->synchronize();  // the last step's update has landed
  double megabytes = 0.0;
  run_agreed(comm, [&] {
    if (!is_root()) return;
    TrainingCheckpoint ck;
    ck.state = st;
    ck.weights = named(host_values());
    if (cfg.optimizer.momentum != 0.0) ck.momentum = named(host_momentum());
    std::error_code ec;
    std::filesystem::create_directories(checkpoint_dir, ec);
    DDP_CHECK(!ec, "checkpoint.dir: cannot create " << checkpoint_dir << ": " << ec.message());
    write_checkpoint(path, ck);
    prune_checkpoints(checkpoint_dir, cfg.checkpoint.keep_last);
    megabytes = static_cast<double>(std::filesystem::file_size(path, ec)) / kMiB;
  });
  last_checkpoint = path;
  last_checkpoint_step = st.global_step;
  const double seconds = seconds_now() - t0;
  std::ostringstream line;
  line << "checkpoint: " << path << " (epoch " << st.epoch + 1 << " step " << st.step_in_epoch
       << ", " << std::fixed << std::setprecision(1) << megabytes << " MiB in "
       << std::setprecision(3) << seconds << " s)";
  say(line.str());
  record({{"type", "checkpoint"},
          {"path", path},
          {"epoch", st.epoch + 1},
          {"step", st.step_in_epoch},
          {"global_step", st.global_step},
          {"seconds", seconds}});
}

// Collective, at the same optimizer steps on every rank (every kStopPollSteps): whether any rank
// had a stop request at the previous poll. The flag travels on comm's lane behind this step's
// work and is read at the next poll, so no step waits for the network; every rank sees the same
// sum at the same step.
bool Trainer::State::poll_stop() {
  bool agreed = false;
  if (stop_work) {
    stop_work->wait();
    agreed = stop_flags[stop_slot ^ 1] > 0.0f;
  }
  stop_flags[stop_slot] = stop_requested() != 0 ? 1.0f : 0.0f;
  stop_work = comm.allreduce_async(&stop_flags[stop_slot], 1, false);
  stop_slot ^= 1;
  return agreed;
}

void Trainer::State::save_weights(const std::vector<NamedTensor>& w) {
  if (!is_root() || !cfg.output.save_model) return;
  save_safetensors(cfg.output.dir + "/model.safetensors", w, {{"format", "pt"}});
}

// Collective: every rank's events to rank 0, which writes one file with a process per rank.
void Trainer::State::write_trace() {
  if (!cfg.output.trace) return;
  std::vector<std::string> all;
  for (int r = 0; r < comm.size(); ++r)
    all.push_back(broadcast_string(comm, r == comm.rank() ? tracer->events_json() : "", r));
  run_agreed(comm, [&] {
    if (!is_root()) return;
    write_trace_file(cfg.output.dir + "/trace.json", all,
                     {{"config", cfg.source},
                      {"world_size", std::to_string(comm.size())},
                      {"device", placement.describe()}});
  });
  say("trace: " + cfg.output.dir + "/trace.json (open in ui.perfetto.dev or chrome://tracing)");
}

Trainer::Trainer(const TrainConfig& cfg, Communicator& comm, std::ostream* log)
    : s_(std::make_unique<State>(cfg, comm, log)) {
  s_->setup();
}

Trainer::~Trainer() = default;

std::vector<NamedTensor> Trainer::weights() const { return s_->named(s_->host_values()); }

TrainSummary Trainer::run() {
  State& s = *s_;
  const TrainConfig& cfg = s.cfg;
  Backend& be = *s.backend;
  Tracer& tracer = *s.tracer;
  TrainSummary sum;
  const int64_t B = cfg.training.batch_size;
  const int64_t A = cfg.training.accumulate_steps;
  const int64_t features = s.train.features;
  const int world = s.comm.size();
  const bool gpu = s.on_gpu();
  const bool skip_nonfinite = cfg.training.nan_policy == "skip_step";
  // The averaged gradient is the same on every rank, so each rank decides alone and all
  // decide alike. On a GPU the check costs a host sync: only done where steps are skipped
  // (with abort, a non-finite loss stops the job a step later).
  const bool check_gradients = !gpu || skip_nonfinite;
  const double t_start = seconds_now();
  double train_seconds = 0.0;
  sum.resumed = s.resumed;
  sum.steps = s.start.global_step;
  sum.skipped_steps = s.start.skipped_steps;
  const int64_t first_step = sum.steps;  // this run's steps are traced and timed
  bool stop = cfg.training.max_steps > 0 && sum.steps >= cfg.training.max_steps;
  Tally epoch_tally, log_tally;
  double log_start = 0.0;
  int64_t steps_in_epoch = 0;
  // Where training stands after the last step: what a checkpoint written now records.
  TrainingState at = s.start;
  if (s.resumed && (s.start.epoch >= cfg.training.epochs || stop))
    s.say("resume: the checkpoint is already at the end of training");

  auto fetch = [&](bool traced) {
    const double t0 = seconds_now();
    const Batch* b = s.train_loader->next();
    if (traced) tracer.span(s.track_data, "next batch", t0, seconds_now());
    return b;
  };
  auto take_totals = [&](PendingStep& p) {
    if (p.has_totals) return;
    try {
      p.totals = be.take_xent_totals(p.slot);
    } catch (const Error& e) {
      DDP_THROW("epoch " << p.epoch + 1 << " step " << p.step_in_epoch << ": " << e.message());
    }
    p.has_totals = true;
  };

  // Reads a queued step's results: loss (checked), communication statistics, trace, progress.
  auto resolve = [&](PendingStep& p) {
    take_totals(p);
    const XentResult& r = p.totals;
    if (!std::isfinite(r.loss_sum)) {
      DDP_CHECK(skip_nonfinite, "loss is " << r.loss_sum << " at epoch " << p.epoch + 1 << " step "
                                           << p.step_in_epoch
                                           << " (lower optimizer.lr? training.nan_policy: "
                                           << "skip_step skips such steps)");
    } else {
      epoch_tally.add(r, p.rows);
      log_tally.add(r, p.rows);
    }
    try {
      s.reducer->synchronize(p.works, p.global_step);
    } catch (const Error& e) {
      DDP_THROW("epoch " << p.epoch + 1 << " step " << p.step_in_epoch << ": " << e.message());
    }
    const double bw_begin = p.backward_begin.time(), bw_end = p.backward_end.time();
    const BackwardWindow window{bw_begin, bw_end, gpu ? bw_end - bw_begin : p.backward_cpu};
    const ReducerStepStats st = overlap_stats(p.works, window);
    sum.comm_seconds += st.comm_seconds;
    sum.hidden_seconds += st.hidden_seconds;
    if (!p.spans.empty()) {
      for (size_t b = 0; b < p.works.size(); ++b) {
        tracer.span(s.track_comm, "allreduce bucket " + std::to_string(b), p.works[b]->start_time(),
                    p.works[b]->end_time(),
                    {{"floats", static_cast<double>(s.plan.buckets[b].numel)},
                     {"step", static_cast<double>(p.global_step)}});
      }
      for (const TraceSpan& sp : p.spans)
        tracer.span(sp.track, sp.name, sp.begin.time(), sp.end.time());
      for (const auto& [name, m] : p.instants) tracer.instant(s.track_compute, name, m.time());
    }
    if (!p.log) return;
    const Tally g = log_tally.reduced(s.comm);
    const double now = seconds_now();
    const double rate = g.count / std::max(1e-9, now - log_start);
    std::ostringstream line;
    line << "epoch " << p.epoch + 1 << "/" << cfg.training.epochs << " step " << p.step_in_epoch
         << "/" << steps_in_epoch << " loss " << std::fixed << std::setprecision(4) << g.loss()
         << " acc " << percent(g.accuracy()) << " " << format_rate(rate);
    s.say(line.str());
    s.record({{"type", "train"},
              {"epoch", p.epoch + 1},
              {"step", p.step_in_epoch},
              {"global_step", p.global_step},
              {"loss", g.loss()},
              {"accuracy", g.accuracy()},
              {"samples", g.count},
              {"samples_per_sec", rate},
              {"time", now - t_start}});
    if (tracer.enabled()) tracer.counter("samples/s (all ranks)", now, rate);
    log_tally = Tally{};
    log_start = seconds_now();
  };
  // On the CPU a step is read as soon as it is queued (it has run by then); on a GPU the host
  // keeps one step queued ahead, so the device never idles while the host reads results.
  auto resolve_pending = [&](size_t keep) {
    while (s.pending.size() > keep) {
      resolve(s.pending.front());
      s.pending.erase(s.pending.begin());
    }
  };
  // Non-finite averaged gradients (seen by every rank at once): names the ranks whose loss was
  // non-finite, then stops the job (abort) or skips the step (skip_step). Collective.
  auto on_nonfinite_gradients = [&](PendingStep& step, int64_t count) {
    double first_bad = std::isfinite(step.totals.loss_sum) ? world : s.comm.rank();
    s.comm.allreduce(&first_bad, 1, ReduceOp::Min);
    std::ostringstream msg;
    msg << "epoch " << step.epoch + 1 << " step " << step.step_in_epoch << ": " << count
        << " non-finite gradient value(s) after the allreduce";
    if (first_bad < world) {
      msg << " (the loss was non-finite on rank " << static_cast<int>(first_bad) << ")";
    } else {
      msg << " (every rank's loss was finite)";
    }
    if (!skip_nonfinite) {
      throw CollectiveError(msg.str() +
                            "; lower optimizer.lr? training.nan_policy: skip_step "
                            "skips such steps");
    }
    s.say("warning: " + msg.str() + ": step skipped (training.nan_policy: skip_step)");
    s.record({{"type", "skipped_step"},
              {"epoch", step.epoch + 1},
              {"step", step.step_in_epoch},
              {"global_step", step.global_step},
              {"nonfinite_values", count}});
  };

  for (int64_t epoch = s.start.epoch; epoch < cfg.training.epochs && !stop; ++epoch) {
    const double epoch_start = seconds_now();
    // A resumed epoch continues after the samples its checkpoint had consumed.
    const bool continued = epoch == s.start.epoch && s.start.epoch_position > 0;
    int64_t position = continued ? s.start.epoch_position : 0;
    s.sampler->set_epoch(epoch, position);
    s.train_loader->start_epoch(s.sampler->indices());
    const int64_t nb = s.train_loader->batches_in_epoch();
    const int64_t shard = s.sampler->num_samples();
    int64_t step_in_epoch = continued ? s.start.step_in_epoch : 0;
    steps_in_epoch = step_in_epoch + (nb + A - 1) / A;
    epoch_tally = log_tally = Tally{};
    double restored_count = 0.0;  // samples of this epoch trained before the resume
    if (continued && s.is_root())
      epoch_tally = Tally{s.start.epoch_loss_sum, s.start.epoch_correct, s.start.epoch_count};
    restored_count = continued ? s.start.epoch_count : 0.0;
    log_start = seconds_now();
    bool epoch_complete = nb == 0;
    bool checkpoint_due = false;
    auto traced_now = [&] {
      return tracer.enabled() &&
             (cfg.output.trace_steps == 0 || sum.steps - first_step < cfg.output.trace_steps);
    };
    const Batch* batch = fetch(traced_now());
    if (gpu && batch != nullptr)
      s.train_uploader->upload(batch->x.data(), batch->y.data(), batch->rows);
    PendingStep step;
    Mark step_begin, layer_begin;

    for (int64_t i = 0; batch != nullptr; ++i) {
      const bool traced = traced_now();
      const int64_t group_begin = (i / A) * A;
      const int64_t group_end = std::min(group_begin + A, nb);
      const bool last_micro = i + 1 == group_end;
      // The gradient is a mean over every sample of the optimizer step: all micro-batches and,
      // because the Reducer sums over ranks, all ranks (DDP's 1/world pre-scale, folded in
      // here). So the step means what one process would do with the global batch.
      const int64_t group_rows = std::min(group_end * B, shard) - group_begin * B;
      const int64_t rows = batch->rows;
      Tensor x{const_cast<float*>(batch->x.data()), rows, features, Device::CPU};
      const int32_t* labels = batch->y.data();
      const Batch* next = nullptr;
      if (gpu) {
        // The next batch travels to the device while this one computes.
        const BatchUploader::DeviceBatch db = s.train_uploader->acquire();
        x = db.x;
        labels = db.labels;
        next = fetch(traced);
        if (next != nullptr) s.train_uploader->upload(next->x.data(), next->y.data(), next->rows);
      }
      if (i == group_begin) {
        step = PendingStep{};
        step.epoch = epoch;
        step.slot = static_cast<int>(sum.steps % 2);
        if (traced) step_begin = s.mark();
      }
      step.rows += rows;
      if (traced) {
        s.model->set_layer_observer([&](const std::string& name, bool begin) {
          if (begin) {
            layer_begin = s.mark();
          } else {
            step.spans.push_back({s.track_compute, name, layer_begin, s.mark()});
          }
        });
      } else {
        s.model->set_layer_observer(nullptr);
      }
      const Tensor& logits = s.model->forward(be, x);
      if (cfg.training.print_shapes && !s.shapes_printed) {
        s.print_shapes(x, logits);
        s.shapes_printed = true;
      }
      Tensor dlogits = Tensor::of(s.dlogits, rows, logits.cols);
      be.softmax_xent_deferred(logits, labels, 1.0f / static_cast<float>(group_rows * world),
                               &dlogits, step.slot);

      s.reducer->prepare_for_backward(last_micro);
      step.backward_begin = s.mark();
      const double cpu0 = thread_cpu_seconds();
      try {
        s.model->backward(be, dlogits, i > group_begin, [&](size_t p) {
          const size_t before = s.reducer->launched();
          s.reducer->mark_ready(p);
          if (!traced) return;
          for (size_t b = before; b < s.reducer->launched(); ++b)
            step.instants.emplace_back("bucket " + std::to_string(b) + " ready", s.mark());
        });
        step.backward_end = s.mark();
        step.backward_cpu = thread_cpu_seconds() - cpu0;
        if (last_micro) sum.wait_seconds += s.reducer->finalize();
      } catch (const Error& e) {
        DDP_THROW("epoch " << epoch + 1 << " step " << step_in_epoch + 1 << ": " << e.message());
      }
      if (!last_micro) {
        batch = gpu ? next : fetch(traced);
        continue;
      }
      ++step_in_epoch;
      ++sum.steps;
      step.step_in_epoch = step_in_epoch;
      step.global_step = sum.steps;
      step.works = s.reducer->works();
      Tensor grads{s.grads, 1, static_cast<int64_t>(s.plan.total_numel), s.placement.device};
      bool skip = false;
      if (check_gradients) {
        const int64_t bad = be.count_nonfinite(grads);
        if (bad > 0) {
          take_totals(step);  // which rank's loss went non-finite, for the message
          on_nonfinite_gradients(step, bad);
          skip = true;
          ++sum.skipped_steps;
        }
      }
      const Mark opt_begin = traced ? s.mark() : Mark{};
      if (!skip) s.sgd->step(be, s.flat(s.values), grads);
      if (traced) {
        const Mark opt_end = s.mark();
        step.spans.push_back({s.track_compute, "optimizer (SGD)", opt_begin, opt_end});
        step.spans.push_back(
            {s.track_compute, "step " + std::to_string(sum.steps), step_begin, opt_end});
      }
      const bool limit = cfg.training.max_steps > 0 && sum.steps >= cfg.training.max_steps;
      step.log = cfg.training.log_every > 0 && (sum.steps % cfg.training.log_every == 0 || limit);
      // Every rank's shard has the same number of rows per step (the sampler pads or drops).
      position += step.rows * world;
      epoch_complete = group_end == nb;
      at.epoch = epoch;
      at.step_in_epoch = step_in_epoch;
      at.epoch_position = position;
      at.global_step = sum.steps;
      at.skipped_steps = sum.skipped_steps;
      s.pending.push_back(std::move(step));
      step = PendingStep{};
      resolve_pending(gpu ? 1 : 0);
      if (limit) {
        stop = true;
        break;
      }
      if (sum.steps % kStopPollSteps == 0 && s.poll_stop()) {
        sum.interrupted = true;
        stop = true;
        break;
      }
      const int64_t every = cfg.checkpoint.every_steps;
      if (every > 0 && sum.steps % every == 0) {
        if (epoch_complete) {
          checkpoint_due = true;  // written after the epoch's evaluation
        } else {
          resolve_pending(0);
          s.save_checkpoint(at, epoch_tally);
        }
      }
      batch = gpu ? next : fetch(traced);
    }
    resolve_pending(0);
    be.synchronize();  // the epoch's time includes the device finishing its work
    if (epoch_complete) {
      at = TrainingState{};
      at.epoch = epoch + 1;
      at.global_step = sum.steps;
      at.skipped_steps = sum.skipped_steps;
    }
    if (sum.interrupted) {
      // Preempted: the checkpoint first (the grace period is short), no evaluation.
      s.say("stop requested (SIGTERM/SIGINT/SIGUSR1): writing a checkpoint at epoch " +
            std::to_string(at.epoch + 1) + " step " + std::to_string(at.step_in_epoch));
      s.save_checkpoint(at, epoch_complete ? Tally{} : epoch_tally);
      break;
    }
    const double epoch_seconds = seconds_now() - epoch_start;
    train_seconds += epoch_seconds;
    sum.epochs = epoch + 1;
    const Tally e = epoch_tally.reduced(s.comm);
    const double trained_now = e.count - restored_count;
    sum.samples += static_cast<int64_t>(trained_now);
    sum.train_loss = e.loss();
    sum.train_accuracy = e.accuracy();
    if (!epoch_complete) {
      // Stopped by max_steps inside the epoch: no epoch line, no evaluation.
      break;
    }
    std::ostringstream line;
    line << "epoch " << epoch + 1 << "/" << cfg.training.epochs << " done in " << std::fixed
         << std::setprecision(epoch_seconds < 1 ? 4 : 2) << epoch_seconds << " s: train loss "
         << std::setprecision(4) << e.loss() << " acc " << percent(e.accuracy()) << ", "
         << format_rate(trained_now / std::max(1e-9, epoch_seconds));
    nlohmann::json record = {{"type", "epoch"},
                             {"epoch", epoch + 1},
                             {"global_step", sum.steps},
                             {"train_loss", e.loss()},
                             {"train_accuracy", e.accuracy()},
                             {"seconds", epoch_seconds},
                             {"samples_per_sec", trained_now / std::max(1e-9, epoch_seconds)}};
    if (s.has_test) {
      const Tally t = s.evaluate();
      sum.evaluated = true;
      sum.test_loss = t.loss();
      sum.test_accuracy = t.accuracy();
      line << " | test loss " << std::setprecision(4) << t.loss() << " acc "
           << percent(t.accuracy());
      s.record({{"type", "eval"},
                {"epoch", epoch + 1},
                {"global_step", sum.steps},
                {"loss", t.loss()},
                {"accuracy", t.accuracy()},
                {"samples", t.count}});
    }
    s.say(line.str());
    s.record(record);
    const int64_t every_epochs = cfg.checkpoint.every_epochs;
    if (checkpoint_due || (every_epochs > 0 && (epoch + 1) % every_epochs == 0))
      s.save_checkpoint(at, Tally{});
  }
  s.model->set_layer_observer(nullptr);
  // Training that ends without a checkpoint of its last step leaves one, so it can be
  // extended (more epochs) with --resume auto.
  if (!sum.interrupted && cfg.checkpoint.periodic() && s.last_checkpoint_step != sum.steps &&
      sum.steps > first_step) {
    s.save_checkpoint(at, at.step_in_epoch == 0 ? Tally{} : epoch_tally);
  }
  sum.last_checkpoint = s.last_checkpoint;
  sum.stop_signal = stop_requested();

  sum.seconds = train_seconds;
  sum.samples_per_sec = sum.samples / std::max(1e-9, train_seconds);
  sum.data_wait_seconds = s.train_loader->wait_seconds();
  // Overlap as the whole job saw it: ranks' allreduce and hidden time summed.
  double comm_totals[2] = {sum.comm_seconds, sum.hidden_seconds};
  s.comm.allreduce(comm_totals, 2, ReduceOp::Sum);
  const double overlap = comm_totals[0] > 0 ? comm_totals[1] / comm_totals[0] : 1.0;
  std::ostringstream line;
  line << (sum.interrupted ? "interrupted: " : "done: ") << sum.epochs << " epoch(s), " << sum.steps
       << " steps, " << sum.samples << " samples in " << std::fixed
       << std::setprecision(sum.seconds < 1 ? 4 : 2) << sum.seconds << " s ("
       << format_rate(sum.samples_per_sec) << ", " << world << " rank(s))";
  if (sum.evaluated) line << "; test accuracy " << percent(sum.test_accuracy);
  line << "; allreduce " << std::setprecision(3) << sum.comm_seconds << " s on rank 0, "
       << percent(overlap) << " hidden behind backward; data wait " << sum.data_wait_seconds
       << " s";
  if (sum.skipped_steps > 0) line << "; " << sum.skipped_steps << " step(s) skipped (non-finite)";
  s.say(line.str());
  s.record({{"type", "summary"},
            {"epochs", sum.epochs},
            {"steps", sum.steps},
            {"samples", sum.samples},
            {"seconds", sum.seconds},
            {"samples_per_sec", sum.samples_per_sec},
            {"world_size", world},
            {"device", s.placement.describe()},
            {"test_accuracy", sum.evaluated ? nlohmann::json(sum.test_accuracy) : nlohmann::json()},
            {"test_loss", sum.evaluated ? nlohmann::json(sum.test_loss) : nlohmann::json()},
            {"allreduce_seconds", sum.comm_seconds},
            {"allreduce_hidden_fraction", overlap},
            {"allreduce_wait_seconds", sum.wait_seconds},
            {"data_wait_seconds", sum.data_wait_seconds},
            {"skipped_steps", sum.skipped_steps},
            {"resumed", sum.resumed},
            {"interrupted", sum.interrupted}});
  s.write_trace();
  if (s.stop_work) s.stop_work->wait();  // the last stop flag's collective, before teardown
  if (sum.interrupted) {
    s.say("resume with --resume auto (or --resume " + s.last_checkpoint + ")");
    return sum;
  }
  run_agreed(s.comm, [&] { s.save_weights(weights()); });
  if (s.is_root() && cfg.output.save_model)
    s.say("weights: " + cfg.output.dir + "/model.safetensors");
  return sum;
}

}  // namespace ddp
