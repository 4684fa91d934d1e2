// The straggler report of GPU ranks (train/straggler.h): a rank whose device is slow is named.
// On a GPU the hosts of all ranks wait alike (reading a step waits for the slowest device), so
// only the devices' own times tell who waits for whom: each step's wait for its buckets after
// backward (bucket_wait), from the buckets' events.
#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "ddp/trainer.h"
#include "gpu_training_setup.h"
#include "mpi_test_helpers.h"

#if defined(DDP_CUDA_EMULATION)
#include "cuda_emu.h"

namespace {

// The train records of metrics.jsonl (rank 0 writes it).
std::vector<nlohmann::json> train_records(const std::string& dir) {
  std::vector<nlohmann::json> records;
  std::ifstream metrics(dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    nlohmann::json r = nlohmann::json::parse(line);
    if (r["type"] == "train") records.push_back(std::move(r));
  }
  return records;
}

// Each interval's slowest rank, skew and the ranks' collective waits, for messages.
std::string intervals(const std::vector<nlohmann::json>& train) {
  std::string out;
  for (const nlohmann::json& r : train) {
    const nlohmann::json& ranks = r["ranks"];
    out += "\n  step " + r["global_step"].dump() + ": slowest " + ranks["slowest"].dump() +
           ", skew " + ranks["skew"].dump() + ", collective wait " +
           ranks["collective_wait"]["min"].dump() + " to " +
           ranks["collective_wait"]["max"].dump() + " s (rank " +
           ranks["collective_wait"]["slowest"].dump() + ")";
  }
  return out;
}

// What is wrong with a run whose last rank's device was slow: it must be the run's persistent
// straggler, and at most intervals the slowest rank while a peer waited longest, for a tenth of
// a second at least (the device's wait: the hosts' wait, what the report used before, was
// about 10 us, and named no rank).
std::string verdict_problems(const ddp::TrainSummary& s, const std::vector<nlohmann::json>& train,
                             int slow) {
  if (s.straggler_rank != slow)
    return "the summary names rank " + std::to_string(s.straggler_rank) + ", not " +
           std::to_string(slow);
  int slowest = 0, waited = 0;
  for (const nlohmann::json& r : train) {
    const nlohmann::json& wait = r["ranks"]["collective_wait"];
    slowest += r["ranks"]["slowest"] == slow;
    waited += wait["slowest"] != slow && wait["max"].get<double>() >= 0.1;
  }
  if (2 * slowest <= static_cast<int>(train.size()) || 2 * waited <= static_cast<int>(train.size()))
    return "rank " + std::to_string(slow) + " was the slowest at " + std::to_string(slowest) +
           " and a peer waited longest at " + std::to_string(waited) + " of " +
           std::to_string(train.size()) + " intervals";
  return "";
}

}  // namespace
#endif

TEST_CASE("GPU training: a rank whose device is slow is named the straggler",
          "[gpu][nccl][straggler]") {
  if (!ddp_gpu_test::gpu_per_rank() || ddp_test::world_size() < 2) {
    WARN("skipped: needs 2 ranks and one GPU per rank (NCCL)");
    return;
  }
#if !defined(DDP_CUDA_EMULATION)
  WARN("skipped: slowing one device takes the emulation's kernel delay");
#else
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const int slow = comm->size() - 1;
  // 14 kernels an eager step: 40 ms each make the slow rank's steps far longer than its peers'
  // (a sleep: it stays 40 ms when other programs load the cores, whose share of the peers'
  // own emulated kernels grows; 15 ms gave a skew of 1.1-1.6 beside two other emulated tests).
  if (comm->rank() == slow) ddp_emu::set_kernel_delay(0.04);
  // Eager steps, every one timed. Steps replayed as graphs are estimated from the interval's
  // eager ones (WaitTally, tested in tests/unit/train); in the emulation beside two other
  // emulated tests (CI) one timed step in three made a noisy estimate: the peer of the slow
  // rank seemed to wait longest at 3 of 6 intervals, so replays are not judged here.
  ddp::TrainConfig cfg = ddp_gpu_test::small_config("straggler", ddp::DeviceChoice::Cuda);
  cfg.distributed.backend = ddp::BackendChoice::Nccl;
  cfg.output.dir = ddp_test::shared_scratch_dir("ddp_gpu_test_", "straggler");
  cfg.data.train.samples = 48 * comm->size();  // 6 steps an epoch on each rank
  cfg.training.epochs = 3;
  cfg.training.log_every = 3;  // 6 intervals
  cfg.training.cuda_graphs = false;
  // The peers' own compute swings with whatever else shares the cores (in CI, two more
  // emulated tests: a skew of 1.08-2.3 at 40 ms a kernel there, 2-27 beside two busy loops
  // here): a low threshold, so that the verdict is the split's, not the load's.
  cfg.output.straggler_threshold = 1.1;
  // One bucket. The emulated device runs the compute stream only as far as a collective
  // waits for it, so with several buckets a fast rank's backward would advance one bucket
  // per completed collective, and its wait would be the slow rank's last bucket alone. A GPU
  // runs backward beside the collectives; with one bucket the emulation waits as it does.
  cfg.distributed.first_bucket_mb = 1;
  cfg.distributed.bucket_cap_mb = 1;
  ddp::TrainSummary summary;
  ddp_test::train(cfg, MPI_COMM_WORLD, &summary);
  comm->barrier();  // metrics.jsonl is complete
  ddp_emu::set_kernel_delay(0.0);
  const std::vector<nlohmann::json> train = train_records(cfg.output.dir);
  const std::string problem = verdict_problems(summary, train, slow);
  INFO(problem << intervals(train));
  long errors = problem.empty() ? 0 : 1;
  CHECK(problem.empty());
  CHECK(train.size() == 6);
  errors += train.size() != 6;
  ddp_test::require_on_all_ranks(*comm, errors, "ranks whose run did not name the straggler");
#endif
}
