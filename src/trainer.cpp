// The training loop (see trainer.h). One optimizer step, as data flows:
//   loader batch -> forward -> softmax-xent -> backward (each gradient announced to the
//   Reducer the moment it is final; full buckets start their allreduce on the comm thread)
//   -> finalize (wait for the buckets: gradients are now averaged) -> SGD on every rank.
#include "ddp/trainer.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "ddp/backend.h"
#include "ddp/check.h"
#include "ddp/data/dataset.h"
#include "ddp/data/loader.h"
#include "ddp/data/sampler.h"
#include "ddp/nn/sequential.h"
#include "ddp/optim.h"
#include "ddp/random.h"
#include "ddp/reducer.h"

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

}  // namespace

struct Trainer::State {
  TrainConfig cfg;
  Communicator& comm;
  std::ostream* log;
  std::unique_ptr<Backend> backend;
  Dataset train, test;
  bool has_test = false;
  std::unique_ptr<Sequential> model;
  BucketPlan plan;
  Buffer values, dlogits;
  float* grads = nullptr;  // the communicator's gradient arena (bucket memory)
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<Sgd> sgd;
  std::unique_ptr<DistributedSampler> sampler;
  std::unique_ptr<Loader> train_loader, test_loader;
  std::ofstream metrics;
  bool shapes_printed = false;

  State(const TrainConfig& c, Communicator& cm, std::ostream* lg) : cfg(c), comm(cm), log(lg) {}
  bool is_root() const { return comm.rank() == 0; }
  void say(const std::string& line) const {
    if (is_root() && log != nullptr) *log << line << std::endl;
  }
  void record(const nlohmann::json& j) {
    if (metrics.is_open()) metrics << j.dump() << "\n" << std::flush;
  }
  Tensor flat(Buffer& b) {
    return Tensor{b.data(), 1, static_cast<int64_t>(b.numel()), b.device()};
  }

  void setup();
  void load_data();
  void build_model();
  void init_parameters();
  void open_outputs();
  void print_shapes(const Tensor& x, const Tensor& logits);
  Tally evaluate();
  void save_weights(const std::vector<NamedTensor>& w);
};

void Trainer::State::setup() {
  run_agreed(comm, [&] {
    DDP_CHECK(cfg.device == "cpu", "device: '" << cfg.device << "' is not available in this build");
    backend = make_cpu_backend();
    set_flush_denormals(true);  // this is the thread that computes (see backend.h)
    load_data();
    build_model();
    open_outputs();
  });
  // Compare before any collective whose size depends on the model, so a mismatch is a message
  // and not a truncated broadcast or a hang.
  run_agreed(comm, [&] {
    check_same_as_rank0(comm, startup_fingerprint(cfg, *model, plan, comm.size()));
  });
  run_agreed(comm, [&] {
    grads = comm.gradient_arena(plan.total_numel, cfg.distributed.shared_memory);
    model->bind(values.data(), grads, plan.param_offset);
  });
  run_agreed(comm, [&] {
    if (is_root()) init_parameters();
  });
  comm.broadcast(values.data(), values.bytes(), 0);

  reducer = std::make_unique<Reducer>(plan, model->parameter_names(), grads, comm);
  SgdOptions opt;
  opt.lr = static_cast<float>(cfg.optimizer.lr);
  opt.momentum = static_cast<float>(cfg.optimizer.momentum);
  opt.dampening = static_cast<float>(cfg.optimizer.dampening);
  opt.weight_decay = static_cast<float>(cfg.optimizer.weight_decay);
  opt.nesterov = cfg.optimizer.nesterov;
  sgd = std::make_unique<Sgd>(opt, plan.total_numel, Device::CPU);
  sampler =
      std::make_unique<DistributedSampler>(train.size, comm.size(), comm.rank(), cfg.data.shuffle,
                                           cfg.training.seed, cfg.data.drop_last);
  const int64_t b = cfg.training.batch_size;
  train_loader = std::make_unique<Loader>(train, b, cfg.data.drop_last, cfg.data.prefetch);
  if (has_test) test_loader = std::make_unique<Loader>(test, kEvalBatch, false, cfg.data.prefetch);

  say("model: " + model->describe() + ", " + std::to_string(plan.total_numel) + " parameters in " +
      std::to_string(plan.buckets.size()) + " bucket(s)");
  std::istringstream plan_lines(describe_plan(plan, model->parameter_names()));
  for (std::string line; std::getline(plan_lines, line);) say("  " + line);
  say("data: " + std::to_string(train.size) + " training samples (" + train.source + "), " +
      std::to_string(sampler->num_samples()) + " per rank per epoch; global batch " +
      std::to_string(b * comm.size() * cfg.training.accumulate_steps) + " = " + std::to_string(b) +
      " per rank x " + std::to_string(comm.size()) + " ranks x " +
      std::to_string(cfg.training.accumulate_steps) + " accumulation step(s)");
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
  model = std::make_unique<Sequential>(cfg.model.layers, cfg.model.activation, max_batch);
  plan = compute_bucket_plan(model->parameter_numels(),
                             static_cast<size_t>(cfg.distributed.first_bucket_mb * kMiB),
                             static_cast<size_t>(cfg.distributed.bucket_cap_mb * kMiB));
  values = Buffer(plan.total_numel);
  dlogits = Buffer(static_cast<size_t>(max_batch * model->out_features()));
}

void Trainer::State::init_parameters() {
  if (cfg.model.init_from.empty()) {
    Rng rng(cfg.training.seed);
    model->init_uniform(rng);
    return;
  }
  const std::string& path = cfg.model.init_from;
  auto tensors = load_safetensors(path);
  for (Parameter* p : model->parameters()) {
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const NamedTensor& t) { return t.name == p->name; });
    DDP_CHECK(it != tensors.end(),
              "model.init_from: " << path << " has no tensor named " << p->name);
    DDP_CHECK(it->shape == p->shape,
              "model.init_from: " << path << ": tensor " << p->name
                                  << " has a different shape than the model's");
    std::copy(it->data.begin(), it->data.end(), p->value.data);
  }
  DDP_CHECK(tensors.size() == model->parameters().size(),
            "model.init_from: " << path << " has " << tensors.size() << " tensors, the model has "
                                << model->parameters().size() << " parameters");
}

void Trainer::State::open_outputs() {
  if (!is_root()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(cfg.output.dir, ec);
  DDP_CHECK(!ec, "output.dir: cannot create " << cfg.output.dir << ": " << ec.message());
  const std::string path = cfg.output.dir + "/metrics.jsonl";
  metrics.open(path, std::ios::out | std::ios::trunc);
  DDP_CHECK(metrics.is_open(), "output.dir: cannot write " << path << ": " << std::strerror(errno));
  std::ofstream(cfg.output.dir + "/config.yaml") << to_yaml(cfg);
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
    const Tensor& logits = model->forward(*backend, x);
    t.add(backend->softmax_xent(logits, batch->y.data(), 0.0f, nullptr), batch->rows);
  }
  return t.reduced(comm);
}

void Trainer::State::save_weights(const std::vector<NamedTensor>& w) {
  if (!is_root() || !cfg.output.save_model) return;
  save_safetensors(cfg.output.dir + "/model.safetensors", w, {{"format", "pt"}});
}

Trainer::Trainer(const TrainConfig& cfg, Communicator& comm, std::ostream* log)
    : s_(std::make_unique<State>(cfg, comm, log)) {
  s_->setup();
}

Trainer::~Trainer() = default;

std::vector<NamedTensor> Trainer::weights() const {
  std::vector<NamedTensor> out;
  for (const Parameter* p : s_->model->parameters()) {
    out.push_back(NamedTensor{p->name, p->shape,
                              std::vector<float>(p->value.data, p->value.data + p->numel())});
  }
  return out;
}

TrainSummary Trainer::run() {
  State& s = *s_;
  const TrainConfig& cfg = s.cfg;
  Backend& be = *s.backend;
  TrainSummary sum;
  const int64_t B = cfg.training.batch_size;
  const int64_t A = cfg.training.accumulate_steps;
  const int64_t features = s.train.features;
  const int world = s.comm.size();
  const double t_start = seconds_now();
  double train_seconds = 0.0;
  bool stop = false;

  for (int64_t epoch = 0; epoch < cfg.training.epochs && !stop; ++epoch) {
    const double epoch_start = seconds_now();
    s.sampler->set_epoch(epoch);
    s.train_loader->start_epoch(s.sampler->indices());
    const int64_t nb = s.train_loader->batches_in_epoch();
    const int64_t shard = s.sampler->num_samples();
    const int64_t steps_in_epoch = (nb + A - 1) / A;
    Tally epoch_tally, log_tally;
    double log_start = seconds_now();
    int64_t step_in_epoch = 0;

    for (int64_t i = 0; const Batch* batch = s.train_loader->next(); ++i) {
      const int64_t group_begin = (i / A) * A;
      const int64_t group_end = std::min(group_begin + A, nb);
      const bool last_micro = i + 1 == group_end;
      // The gradient is a mean over every sample of the optimizer step: all micro-batches and,
      // because the Reducer sums over ranks, all ranks (DDP's 1/world pre-scale, folded in
      // here). So the step means what one process would do with the global batch.
      const int64_t group_rows = std::min(group_end * B, shard) - group_begin * B;
      Tensor x{const_cast<float*>(batch->x.data()), batch->rows, features, Device::CPU};
      const Tensor& logits = s.model->forward(be, x);
      if (cfg.training.print_shapes && !s.shapes_printed) {
        s.print_shapes(x, logits);
        s.shapes_printed = true;
      }
      Tensor dlogits = Tensor::of(s.dlogits, batch->rows, logits.cols);
      const XentResult r = be.softmax_xent(logits, batch->y.data(),
                                           1.0f / static_cast<float>(group_rows * world), &dlogits);
      DDP_CHECK(std::isfinite(r.loss_sum), "loss is " << r.loss_sum << " at epoch " << epoch + 1
                                                      << " step " << step_in_epoch + 1
                                                      << " (lower optimizer.lr?)");
      epoch_tally.add(r, batch->rows);
      log_tally.add(r, batch->rows);

      s.reducer->prepare_for_backward(last_micro);
      BackwardWindow bw{seconds_now(), 0.0, thread_cpu_seconds()};
      s.model->backward(be, dlogits, i > group_begin, [&](size_t p) { s.reducer->mark_ready(p); });
      bw.end = seconds_now();
      bw.cpu_seconds = thread_cpu_seconds() - bw.cpu_seconds;
      if (!last_micro) continue;
      const ReducerStepStats st = s.reducer->finalize(bw);
      sum.comm_seconds += st.comm_seconds;
      sum.hidden_seconds += st.hidden_seconds;
      sum.wait_seconds += st.wait_seconds;
      s.sgd->step(be, s.flat(s.values),
                  Tensor{s.grads, 1, static_cast<int64_t>(s.plan.total_numel), Device::CPU});
      ++step_in_epoch;
      ++sum.steps;

      const bool limit = cfg.training.max_steps > 0 && sum.steps >= cfg.training.max_steps;
      if (cfg.training.log_every > 0 && (sum.steps % cfg.training.log_every == 0 || limit)) {
        const Tally g = log_tally.reduced(s.comm);
        const double now = seconds_now();
        const double rate = g.count / std::max(1e-9, now - log_start);
        std::ostringstream line;
        line << "epoch " << epoch + 1 << "/" << cfg.training.epochs << " step " << step_in_epoch
             << "/" << steps_in_epoch << " loss " << std::fixed << std::setprecision(4) << g.loss()
             << " acc " << percent(g.accuracy()) << " " << format_rate(rate);
        s.say(line.str());
        s.record({{"type", "train"},
                  {"epoch", epoch + 1},
                  {"step", step_in_epoch},
                  {"global_step", sum.steps},
                  {"loss", g.loss()},
                  {"accuracy", g.accuracy()},
                  {"samples", g.count},
                  {"samples_per_sec", rate},
                  {"time", now - t_start}});
        log_tally = Tally{};
        log_start = seconds_now();
      }
      if (limit) {
        stop = true;
        break;
      }
    }
    const double epoch_seconds = seconds_now() - epoch_start;
    train_seconds += epoch_seconds;
    sum.epochs = epoch + 1;
    const Tally e = epoch_tally.reduced(s.comm);
    sum.samples += static_cast<int64_t>(e.count);
    sum.train_loss = e.loss();
    sum.train_accuracy = e.accuracy();
    std::ostringstream line;
    line << "epoch " << epoch + 1 << "/" << cfg.training.epochs << " done in " << std::fixed
         << std::setprecision(epoch_seconds < 1 ? 4 : 2) << epoch_seconds << " s: train loss "
         << std::setprecision(4) << e.loss() << " acc " << percent(e.accuracy()) << ", "
         << format_rate(e.count / std::max(1e-9, epoch_seconds));
    nlohmann::json record = {{"type", "epoch"},
                             {"epoch", epoch + 1},
                             {"global_step", sum.steps},
                             {"train_loss", e.loss()},
                             {"train_accuracy", e.accuracy()},
                             {"seconds", epoch_seconds},
                             {"samples_per_sec", e.count / std::max(1e-9, epoch_seconds)}};
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
  }

  sum.seconds = train_seconds;
  sum.samples_per_sec = sum.samples / std::max(1e-9, train_seconds);
  sum.data_wait_seconds = s.train_loader->wait_seconds();
  // Overlap as the whole job saw it: ranks' allreduce and hidden time summed.
  double comm_totals[2] = {sum.comm_seconds, sum.hidden_seconds};
  s.comm.allreduce(comm_totals, 2, ReduceOp::Sum);
  const double overlap = comm_totals[0] > 0 ? comm_totals[1] / comm_totals[0] : 1.0;
  std::ostringstream line;
  line << "done: " << sum.epochs << " epoch(s), " << sum.steps << " steps, " << sum.samples
       << " samples in " << std::fixed << std::setprecision(sum.seconds < 1 ? 4 : 2) << sum.seconds
       << " s (" << format_rate(sum.samples_per_sec) << ", " << world << " rank(s))";
  if (sum.evaluated) line << "; test accuracy " << percent(sum.test_accuracy);
  line << "; allreduce " << std::setprecision(3) << sum.comm_seconds << " s on rank 0, "
       << percent(overlap) << " hidden behind backward; data wait " << sum.data_wait_seconds
       << " s";
  s.say(line.str());
  s.record({{"type", "summary"},
            {"epochs", sum.epochs},
            {"steps", sum.steps},
            {"samples", sum.samples},
            {"seconds", sum.seconds},
            {"samples_per_sec", sum.samples_per_sec},
            {"world_size", world},
            {"test_accuracy", sum.evaluated ? nlohmann::json(sum.test_accuracy) : nlohmann::json()},
            {"test_loss", sum.evaluated ? nlohmann::json(sum.test_loss) : nlohmann::json()},
            {"allreduce_seconds", sum.comm_seconds},
            {"allreduce_hidden_fraction", overlap},
            {"allreduce_wait_seconds", sum.wait_seconds},
            {"data_wait_seconds", sum.data_wait_seconds}});
  run_agreed(s.comm, [&] { s.save_weights(weights()); });
  if (s.is_root() && cfg.output.save_model)
    s.say("weights: " + cfg.output.dir + "/model.safetensors");
  return sum;
}

}  // namespace ddp
