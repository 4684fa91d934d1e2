// The training and test data of one rank (training_data.h).
#include "train/training_data.h"

#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/agreement.h"
#include "comm/node_shared_memory.h"
#include "core/check.h"
#include "data/dataset_image.h"

namespace ddp {

// A .npy file's mapping already is the node's one copy (the page cache), on every rank.
bool TrainingData::shares(const TrainConfig& cfg, const ProcessGroup& comm) const {
  return cfg.data.share_on_node && comm.local_size() > 1 && cfg.data.format != DataFormat::Npy;
}

void TrainingData::read_splits(const TrainConfig& cfg) {
  const int64_t features = cfg.model.layers.front();
  const int64_t classes = cfg.model.layers.back();
  train = load_split(cfg.data, cfg.data.train, false, features, classes);
  has_test = cfg.data.test.configured();
  if (has_test) test = load_split(cfg.data, cfg.data.test, true, features, classes);
}

void TrainingData::read(const TrainConfig& cfg, const ProcessGroup& comm) {
  has_test = cfg.data.test.configured();
  if (!shares(cfg, comm) || comm.local_rank() == 0) read_splits(cfg);
}

namespace {

// The size of the split's image on the node's first rank, the same on every rank; throws on
// every rank if the nodes' first ranks read splits of different sizes.
size_t node_image_bytes(ProcessGroup& comm, const Dataset& ds, const char* split) {
  const bool first = comm.local_rank() == 0;
  const double bytes = first ? static_cast<double>(image_bytes(ds)) : 0.0;
  double range[2] = {bytes, first ? -bytes : std::numeric_limits<double>::lowest()};
  comm.allreduce(range, 2, ReduceOp::Max);
  const auto most = static_cast<size_t>(range[0]), least = static_cast<size_t>(-range[1]);
  DDP_CHECK(most == least, "data." << split << ": the nodes read different data: their first "
                                   << "ranks' copies hold " << least << " to " << most
                                   << " bytes; every rank must read the same files");
  return most;
}

// One split through the node's shared memory: the first rank's copy written once, every rank
// (the first too) viewing it. Empty on every rank when the node cannot share. Adds a log line
// to `swept` for each copy a dead run of the job had left behind and the nodes removed.
bool share_split(ProcessGroup& comm, Dataset& ds, const char* split, const std::string& job,
                 std::string& why_not, std::string& swept) {
  const size_t bytes = node_image_bytes(comm, ds, split);
  const NodeSharedMemory mem = share_on_node(
      comm, bytes, [&](void* out) { write_image(ds, out); }, job);
  for (const std::string& line : mem.swept) swept += "data: " + line + "\n";
  if (!mem.data) {
    why_not = mem.why_not;
    return false;
  }
  ds = view_image(mem.data.get(), mem.bytes, mem.data);
  return true;
}

// Whether the job shares each node's copy: data.share_on_node and some node of more than one
// rank. Sharing is collective over the whole job, so every rank must decide alike: a node of one
// rank beside larger nodes shares too (its copy, with itself). Collective.
bool job_shares(const TrainConfig& cfg, ProcessGroup& comm) {
  double most = comm.local_size();
  comm.allreduce(&most, 1, ReduceOp::Max);
  return cfg.data.share_on_node && most > 1;
}

std::string mib(size_t bytes) {
  std::ostringstream oss;
  oss << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1024.0 * 1024.0)
      << " MiB";
  return oss.str();
}

}  // namespace

std::string TrainingData::share(const TrainConfig& cfg, ProcessGroup& comm) {
  const std::string stored = std::string(" (") + to_string(train.x.type()) + ")";
  if (cfg.data.format == DataFormat::Npy) {
    return "data: features read in place from the memory-mapped .npy files (one copy per node, "
           "in the page cache): " +
           mib(train.x.bytes()) + " of training features" + stored;
  }
  if (!job_shares(cfg, comm)) {
    if (comm.local_size() == 1) return "";
    return "data: a copy per rank (data.share_on_node: false), " + mib(train.x.bytes()) +
           " of training features each" + stored;
  }
  const std::string job = node_job_key(std::getenv("SLURM_JOB_ID"), cfg.output.dir);
  std::string why_not, swept;
  bool shared = share_split(comm, train, "train", job, why_not, swept);
  if (shared && has_test) shared = share_split(comm, test, "test", job, why_not, swept);
  if (!shared) {
    run_agreed(comm, [&] {
      if (comm.local_rank() != 0) read_splits(cfg);
    });
    return swept + "data: a copy per rank: " + why_not;
  }
  return swept + "data: one copy per node, mapped by its " + std::to_string(comm.local_size()) +
         " ranks (data.share_on_node): " + mib(train.x.bytes()) + " of training features" +
         std::string(" (") + to_string(train.x.type()) + ")";
}

void TrainingData::prepare(const TrainConfig& cfg, int world, int rank) {
  transform = fit_normalization(cfg.data.normalize, train);
  apply_normalization(transform, train);
  if (has_test) apply_normalization(transform, test);
  DistributedSampler probe(train.size, world, rank, false, 0, cfg.data.drop_last);
  DDP_CHECK(probe.num_samples() >= 1, "data.train: " << train.source << " has " << train.size
                                                     << " samples, fewer than the " << world
                                                     << " ranks");
  DDP_CHECK(!cfg.data.drop_last || probe.num_samples() >= cfg.training.batch_size,
            "training.batch_size: " << cfg.training.batch_size
                                    << " is larger than a rank's shard of " << probe.num_samples()
                                    << " samples and data.drop_last is set: "
                                    << "no batch would be left");
  const int64_t batch = cfg.training.batch_size * world;
  DDP_CHECK(!cfg.training.bitwise_across_world_sizes || cfg.data.drop_last ||
                train.size % batch == 0,
            "training.bitwise_across_world_sizes: data.train: the "
                << train.size << " samples of " << train.source
                << " do not split into whole batches of " << batch << " (training.batch_size "
                << cfg.training.batch_size << " x " << world
                << " ranks), and the last one's padding would depend on the number of ranks: "
                   "set data.drop_last: true");
}

std::vector<std::string> TrainingData::fingerprint() const {
  auto line = [](const char* split, const Dataset& ds) {
    const auto* labels = reinterpret_cast<const Bytef*>(ds.y.data());
    const uLong crc = crc32_z(crc32(0L, Z_NULL, 0), labels, ds.y.size() * sizeof(int32_t));
    std::ostringstream oss;
    oss << "data." << split << ": " << ds.size << " samples of " << ds.features << " features ("
        << to_string(ds.x.type()) << "), labels crc32 " << std::hex << crc;
    return oss.str();
  };
  std::vector<std::string> lines = {line("train", train)};
  if (has_test) lines.push_back(line("test", test));
  return lines;
}

int loader_workers(const TrainConfig& cfg, Device device, int local_size) {
  if (cfg.data.workers > 0) return static_cast<int>(cfg.data.workers);
  if (device != Device::CUDA) return 1;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores / std::max(local_size, 1), 1, 4);
}

void TrainingData::start(const TrainConfig& cfg, int world, int rank, int workers) {
  sampler = std::make_unique<DistributedSampler>(train.size, world, rank, cfg.data.shuffle,
                                                 cfg.training.seed, cfg.data.drop_last);
  train_loader = std::make_unique<Loader>(train, cfg.training.batch_size, cfg.data.drop_last,
                                          cfg.data.prefetch, workers);
  if (has_test)
    test_loader = std::make_unique<Loader>(test, kEvalBatch, false, cfg.data.prefetch, workers);
}

int64_t TrainingData::steps_per_epoch(const TrainConfig& cfg) const {
  const int64_t n = sampler->num_samples(), b = cfg.training.batch_size;
  const int64_t batches = cfg.data.drop_last ? n / b : (n + b - 1) / b;
  const int64_t a = cfg.training.accumulate_steps;
  return (batches + a - 1) / a;
}

int64_t TrainingData::max_batch(const TrainConfig& cfg) const {
  return std::max<int64_t>(cfg.training.batch_size, has_test ? kEvalBatch : 1);
}

}  // namespace ddp
