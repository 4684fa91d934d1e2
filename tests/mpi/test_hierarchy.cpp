// distributed.hierarchical under mpiexec -n 4, the ranks standing in for 2 nodes x 2 ranks
// (make_mpi_communicator's ranks_per_node): each node sums a bucket in its shared-memory window
// in local-rank order, each local rank allreduces its chunk of that sum with the other node's,
// and the node shares the result. Exact on rank-valued data; on random data bitwise the sum
// grouped that way (two nodes: one addition across them, in either order the same); training
// within float rounding of the flat MPI_Allreduce, whose grouping is the library's.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/compression.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"
#include "ddp/trainer.h"
#include "mpi_test_helpers.h"

using ddp::Compression;
using ddp_test::require_on_all_ranks;

namespace {

constexpr int kRanksPerNode = 2;
const std::vector<size_t> kSizes = {1, 3, 1000, 4099, 70001};

bool four_ranks() {
  if (ddp_test::world_size() == 4) return true;
  WARN("needs 4 ranks (2 nodes x 2); skipped at " << ddp_test::world_size());
  return false;
}

std::unique_ptr<ddp::MpiCommunicator> two_nodes() {
  return ddp::make_mpi_communicator(MPI_COMM_WORLD, kRanksPerNode);
}

using ddp_test::hashed_value;

// The hierarchy's sum: each node's ranks in order, then the two nodes' sums (compressed: cast,
// added in 16 bits, cast back).
float grouped_sum(Compression format, size_t i, int round) {
  const float node0 = hashed_value(0, i, round) + hashed_value(1, i, round);
  const float node1 = hashed_value(2, i, round) + hashed_value(3, i, round);
  if (format == Compression::None) return node0 + node1;
  uint16_t a = 0, b = 0;
  ddp::compress(format, &node0, 1, &a);
  ddp::compress(format, &node1, 1, &b);
  ddp::add_compressed(format, &b, 1, &a);
  float out = 0;
  ddp::decompress(format, &a, 1, &out);
  return out;
}

// Rounds of hierarchical allreduces of buckets of awkward sizes; fill writes rank r's arena,
// check counts the wrong values of the result.
template <class Fill, class Check>
void run_rounds(Compression format, int rounds, Fill fill, Check check) {
  auto comm = two_nodes();
  REQUIRE(comm->local_size() == kRanksPerNode);
  const ddp::BucketWire wire{format, false, /*hierarchical=*/true, true};
  size_t total = 0;
  for (size_t k : kSizes) total += k;
  float* arena = comm->gradient_arena(total, wire);
  REQUIRE_THROWS_AS(comm->gradient_arena(total, wire), ddp::Error);
  long errors = 0;
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < total; ++i) arena[i] = fill(comm->rank(), i, round);
    std::vector<std::shared_ptr<ddp::Work>> work;
    size_t offset = 0;
    for (size_t b = 0; b < kSizes.size(); ++b) {
      work.push_back(comm->allreduce_async(arena + offset, kSizes[b], b % 2 == 1));
      offset += kSizes[b];
    }
    for (auto& w : work) w->wait();
    offset = 0;
    for (size_t b = 0; b < kSizes.size(); ++b) {
      for (size_t i = offset; i < offset + kSizes[b]; ++i)
        errors += !check(i, round, b % 2 == 1, arena[i]);
      offset += kSizes[b];
    }
    require_on_all_ranks(*comm, errors, "round " + std::to_string(round));
  }
}

}  // namespace

TEST_CASE("hierarchical allreduce: exact on rank-valued data, the grouped sum on random data",
          "[mpi][hierarchy]") {
  if (!four_ranks()) return;
  // Rank-valued: (r + 1) x (i % 7 + 1) + round sums to 10 x (i % 7 + 1) + 4 x round.
  run_rounds(
      Compression::None, 10,
      [](int r, size_t i, int round) {
        return static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1) + round);
      },
      [](size_t i, int round, bool average, float got) {
        const float sum = static_cast<float>(10 * static_cast<int>(i % 7 + 1) + 4 * round);
        return got == (average ? sum / 4.0f : sum);
      });
  for (Compression format : {Compression::None, Compression::Bf16, Compression::Fp16}) {
    INFO(ddp::to_string(format));
    run_rounds(format, 2, hashed_value, [format](size_t i, int round, bool average, float got) {
      float want = grouped_sum(format, i, round);
      if (average) want *= 1.0f / 4.0f;
      return std::memcmp(&got, &want, sizeof got) == 0;
    });
  }
}

TEST_CASE("hierarchical allreduce refuses nodes of different sizes on every rank",
          "[mpi][hierarchy]") {
  if (!four_ranks()) return;
  auto uneven = ddp::make_mpi_communicator(MPI_COMM_WORLD, 3);  // nodes of 3 and 1 ranks
  std::string message;
  try {
    uneven->gradient_arena(16, ddp::BucketWire{ddp::Compression::None, false, true, true});
  } catch (const ddp::Error& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("needs the same number of ranks on every node"));
  REQUIRE_NOTHROW(uneven->gradient_arena(16, ddp::BucketWire{}));
}

TEST_CASE("a hierarchical wire is refused on one node, where the gradient path never asks for it",
          "[mpi][hierarchy]") {
  auto one_node = ddp::make_mpi_communicator(MPI_COMM_WORLD);  // every rank on this machine
  std::string message;
  try {
    one_node->gradient_arena(16, ddp::BucketWire{ddp::Compression::None, false, true, true});
  } catch (const ddp::Error& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("needs several nodes of more than one rank each"));
  REQUIRE_NOTHROW(one_node->gradient_arena(16, ddp::BucketWire{}));
}

TEST_CASE("hierarchical training: within float rounding of the flat allreduce, and said so",
          "[mpi][hierarchy]") {
  if (!four_ranks()) return;
  ddp::TrainConfig cfg =
      ddp_test::small_training_config(ddp_test::shared_scratch_dir("ddp_hierarchy_", "train"));
  cfg.data.train.samples = 190;
  cfg.training.batch_size = 7;
  cfg.training.epochs = 2;
  auto train = [&](ddp::Hierarchy mode, std::string* log) {
    ddp::TrainConfig c = cfg;
    c.distributed.hierarchical = mode;
    auto comm = two_nodes();
    std::ostringstream out;
    ddp::Trainer trainer(c, *comm, &out);
    trainer.run();
    if (log != nullptr) *log = out.str();
    return trainer.weights();
  };
  std::string log;
  const auto grouped = train(ddp::Hierarchy::Auto, &log);
  if (ddp_test::world_rank() == 0) CHECK_THAT(log, Catch::Contains("hierarchical allreduce"));
  ddp_test::require_identical_replicas(grouped);
  REQUIRE(ddp_test::bitwise_equal(train(ddp::Hierarchy::On, nullptr), grouped));
  const auto flat = train(ddp::Hierarchy::Off, &log);
  if (ddp_test::world_rank() == 0) CHECK_THAT(log, !Catch::Contains("hierarchical allreduce"));
  // The same sums grouped differently: float rounding, amplified a little by 54 steps.
  const double diff = ddp_test::max_abs_diff(grouped, flat);
  INFO("max |hierarchical - flat| = " << diff);
  CHECK(diff <= 1e-5);
}
