// MPI test helpers. A REQUIRE that fails on one rank only would send that rank out of the test
// case while the others wait in the next collective: a hang instead of a failure. So ranks check
// locally, then agree (nccl-tests' way: error counts reduced across ranks), and every rank fails
// at the same point.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/agreement.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/clock.h"
#include "ddp/safetensors.h"
#include "ddp/trainer.h"
#include "scratch_dirs.h"

namespace ddp_test {

/// Polls `done` every millisecond for up to `seconds`; whether it held.
template <class Done>
bool within(double seconds, Done done) {
  const double deadline = ddp::seconds_now() + seconds;
  while (!done()) {
    if (ddp::seconds_now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// REQUIREs on every rank that no rank counted an error.
inline void require_on_all_ranks(ddp::ProcessGroup& comm, long local_errors,
                                 const std::string& what) {
  double errors = static_cast<double>(local_errors);
  comm.allreduce(&errors, 1, ddp::ReduceOp::Sum);
  INFO(what << ": " << local_errors << " error(s) on rank " << comm.rank() << ", " << errors
            << " on all ranks");
  REQUIRE(errors == 0);
}

/// The largest of `value` over all ranks.
inline double max_over_ranks(ddp::ProcessGroup& comm, double value) {
  comm.allreduce(&value, 1, ddp::ReduceOp::Max);
  return value;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

/// Rank 0's scratch_dir, on every rank: for files rank 0 writes and every rank reads.
inline std::string shared_scratch_dir(const std::string& prefix, const std::string& name) {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const std::string dir = ddp::broadcast_string(*comm, scratch_dir(prefix, name), 0);
  std::filesystem::create_directories(dir);
  return dir;
}

/// The training tests' model and optimizer: a 12-24-16-5 MLP on synthetic data with momentum
/// and weight decay, parameters spread over many small buckets (~26 and ~52 floats), no
/// progress lines, no saved model, output in `dir`. Each test sets its data size and seeds.
inline ddp::TrainConfig small_training_config(const std::string& dir) {
  ddp::TrainConfig cfg;
  cfg.model.layers = {12, 24, 16, 5};
  cfg.data.format = ddp::DataFormat::Synthetic;
  cfg.optimizer.lr = 0.05;
  cfg.optimizer.momentum = 0.9;
  cfg.optimizer.weight_decay = 0.01;
  cfg.training.log_every = 0;
  cfg.distributed.first_bucket_mb = 100.0 / (1 << 20);
  cfg.distributed.bucket_cap_mb = 200.0 / (1 << 20);
  cfg.output.dir = dir;
  cfg.output.save_model = false;
  return cfg;
}

/// small_training_config for 2 epochs of 190 synthetic samples, 7 a batch on each rank (13
/// steps at 2 ranks), in the shared scratch folder `prefix` + `name`.
inline ddp::TrainConfig two_epoch_config(const std::string& prefix, const std::string& name) {
  ddp::TrainConfig cfg = small_training_config(shared_scratch_dir(prefix, name));
  cfg.data.train.samples = 190;
  cfg.data.seed = 5;
  cfg.training.seed = 3;
  cfg.training.batch_size = 7;
  cfg.training.epochs = 2;
  return cfg;
}

/// `cfg` switched to torch.optim.Adam (AdamW when `decoupled`, AMSGrad when `amsgrad`): the
/// SGD-only keys back at their defaults, weight decay kept.
inline ddp::TrainConfig with_adam(ddp::TrainConfig cfg, bool decoupled, bool amsgrad) {
  const ddp::OptimizerConfig defaults;
  cfg.optimizer.name = decoupled ? ddp::OptimizerName::AdamW : ddp::OptimizerName::Adam;
  cfg.optimizer.lr = 0.01;
  cfg.optimizer.momentum = defaults.momentum;
  cfg.optimizer.dampening = defaults.dampening;
  cfg.optimizer.nesterov = defaults.nesterov;
  cfg.optimizer.amsgrad = amsgrad;
  return cfg;
}

/// A warmup then `schedule` (cosine and linear decay to 1e-4, step halves every 5 steps), and
/// clipping at a norm the small models' gradients exceed on some steps.
inline ddp::TrainConfig with_schedule(ddp::TrainConfig cfg, ddp::SchedulerName schedule) {
  cfg.scheduler.name = schedule;
  cfg.scheduler.warmup_steps = 4;
  cfg.scheduler.warmup_start_factor = 0.1;
  if (schedule == ddp::SchedulerName::Step) {
    cfg.scheduler.step_size = 5;
    cfg.scheduler.gamma = 0.5;
  } else if (schedule != ddp::SchedulerName::Constant) {
    cfg.scheduler.min_lr = 1e-4;
  }
  cfg.training.clip_grad_norm = 0.05;
  return cfg;
}

/// Every rank must hold bitwise the same weights as rank 0.
inline void require_identical_replicas(const std::vector<ddp::NamedTensor>& w) {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  long errors = 0;
  for (const auto& t : w) {
    std::vector<float> root = t.data;
    comm->broadcast(root.data(), root.size() * sizeof(float), 0);
    errors += std::memcmp(root.data(), t.data.data(), root.size() * sizeof(float)) != 0;
  }
  require_on_all_ranks(*comm, errors, "tensors that differ from rank 0's");
}

/// Every rank agrees whether a and b are bitwise the same (names' shapes and data).
inline bool bitwise_equal(const std::vector<ddp::NamedTensor>& a,
                          const std::vector<ddp::NamedTensor>& b) {
  long differ = a.size() != b.size();
  for (size_t t = 0; t < std::min(a.size(), b.size()); ++t) {
    differ += a[t].shape != b[t].shape || a[t].data.size() != b[t].data.size() ||
              std::memcmp(a[t].data.data(), b[t].data.data(),
                          std::min(a[t].data.size(), b[t].data.size()) * sizeof(float)) != 0;
  }
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  return max_over_ranks(*comm, static_cast<double>(differ)) == 0.0;
}

/// Trains `cfg` on a communicator over `mpi_comm`; returns the weights (and the summary).
inline std::vector<ddp::NamedTensor> train(const ddp::TrainConfig& cfg, MPI_Comm mpi_comm,
                                           ddp::TrainSummary* summary = nullptr) {
  auto comm = ddp::make_mpi_communicator(mpi_comm);
  ddp::Trainer trainer(cfg, *comm, nullptr);
  ddp::TrainSummary s = trainer.run();
  if (summary != nullptr) *summary = s;
  return trainer.weights();
}

/// Largest |a - b| over all tensors and all ranks (infinite if the structure differs or a value
/// is not finite), agreed by every rank so a failure fails everywhere at once.
inline double max_abs_diff(const std::vector<ddp::NamedTensor>& a,
                           const std::vector<ddp::NamedTensor>& b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t t = 0; t < std::min(a.size(), b.size()); ++t) {
    if (a[t].name != b[t].name || a[t].data.size() != b[t].data.size()) worst = INFINITY;
    for (size_t i = 0; i < std::min(a[t].data.size(), b[t].data.size()); ++i) {
      const double d = std::fabs(static_cast<double>(a[t].data[i]) - b[t].data[i]);
      worst = std::isfinite(d) ? std::max(worst, d) : INFINITY;
    }
  }
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  return max_over_ranks(*comm, worst);
}

/// A 3-feature, 3-class CSV data set whose sample `bad` has every feature `value`, and a model
/// `init` (layers [3, 8, 3]). With the default 3e38, 3 x 0.5 x 3e38 overflows the first layer
/// in any summation order, so the batch holding it has non-finite logits, loss and gradients.
/// Written by rank 0.
struct OverflowData {
  std::string csv, init;
};
inline OverflowData write_overflow_data(const std::string& dir, int64_t samples, int64_t bad,
                                        double value = 3e38) {
  OverflowData d{dir + "/overflow.csv", dir + "/overflow_init.safetensors"};
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::ofstream out(d.csv);
    for (int64_t i = 0; i < samples; ++i) {
      if (i == bad) {
        out << value << "," << value << "," << value << ",1\n";
      } else {
        out << 0.1 * static_cast<double>(i % 7) << "," << -0.2 * static_cast<double>(i % 3)
            << ",0.5," << (i % 3) << "\n";
      }
    }
    std::vector<float> w1(3 * 8);
    for (size_t i = 0; i < w1.size(); ++i) w1[i] = i % 2 ? 0.5f : -0.5f;
    ddp::save_safetensors(d.init, {{"layers.0.weight", {8, 3}, std::vector<float>(8 * 3, 0.5f)},
                                   {"layers.0.bias", {8}, std::vector<float>(8, 0.0f)},
                                   {"layers.1.weight", {3, 8}, w1},
                                   {"layers.1.bias", {3}, std::vector<float>(3, 0.0f)}});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return d;
}

/// Training on write_overflow_data's set: the [3, 8, 3] model from its weights, the CSV in file
/// order (sample k in the batch of step k / (4 x ranks) + 1, on rank k % ranks), lr 0.1, batch
/// 4, 2 epochs, no progress lines or saved model, output in `dir`/out.
inline ddp::TrainConfig overflow_config(const OverflowData& d, const std::string& dir) {
  ddp::TrainConfig cfg;
  cfg.model.layers = {3, 8, 3};
  cfg.model.init_from = d.init;
  cfg.data.format = ddp::DataFormat::Csv;
  cfg.data.train.path = d.csv;
  cfg.data.shuffle = false;
  cfg.optimizer.lr = 0.1;
  cfg.training.batch_size = 4;
  cfg.training.epochs = 2;
  cfg.training.log_every = 0;
  cfg.output.dir = dir + "/out";
  cfg.output.save_model = false;
  return cfg;
}

/// A pseudo-random float for rank `rank`, element i, round k (a hash: cheap, the same on every
/// rank), in (-3, 3) x 2^(i % 9 - 4): sums over ranks that round in the 16-bit types.
inline float hashed_value(int rank, size_t i, int round) {
  uint64_t z = (static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(round) << 40) ^ i;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const float unit = static_cast<float>(z >> 40) / static_cast<float>(1 << 24);  // [0, 1)
  return (6.0f * unit - 3.0f) * std::ldexp(1.0f, static_cast<int>(i % 9) - 4);
}

}  // namespace ddp_test
