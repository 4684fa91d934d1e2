// Collectives on exact, rank-valued data (so every check is ==, not a tolerance), and the
// agreement helper that turns one rank's setup failure into the same error on every rank.
#include <algorithm>
#include <chrono>
#include <thread>
#include <catch2/catch.hpp>
#include <cstring>

#include "ddp/check.h"
#include "ddp/comm.h"
#include "ddp/trainer.h"

namespace {

std::unique_ptr<ddp::Communicator> world() { return ddp::make_mpi_communicator(MPI_COMM_WORLD); }

// Rank-valued data whose sum over ranks is exact in float: (rank + 1) * (i % 7 + 1).
std::vector<float> rank_valued(size_t n, int rank) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
  return v;
}

float expected_sum(size_t i, int size) {
  return static_cast<float>(size * (size + 1) / 2 * static_cast<int>(i % 7 + 1));
}

}  // namespace

TEST_CASE("allreduce_async sums and averages rank-valued data exactly", "[mpi]") {
  auto comm = world();
  const int n = comm->size();
  for (size_t count : {size_t{1}, size_t{1000}, size_t{3} << 20}) {
    auto sum = rank_valued(count, comm->rank());
    auto avg = rank_valued(count, comm->rank());
    auto w1 = comm->allreduce_async(sum.data(), count, false);
    auto w2 = comm->allreduce_async(avg.data(), count, true);
    w2->wait();  // waiting out of order is fine: collectives run in submission order
    w1->wait();
    for (size_t i = 0; i < count; ++i) {
      REQUIRE(sum[i] == expected_sum(i, n));
      REQUIRE(avg[i] == expected_sum(i, n) / static_cast<float>(n));
    }
    REQUIRE(w1->end_time() >= w1->start_time());
    REQUIRE(w2->start_time() >= w1->end_time());
  }
}

TEST_CASE("many buckets in flight complete with the right data", "[mpi]") {
  auto comm = world();
  std::vector<std::vector<float>> buckets;
  std::vector<std::shared_ptr<ddp::Work>> work;
  for (int b = 0; b < 32; ++b)
    buckets.push_back(rank_valued(static_cast<size_t>(100 + 37 * b), comm->rank() + b));
  for (auto& bucket : buckets)
    work.push_back(comm->allreduce_async(bucket.data(), bucket.size(), false));
  for (auto& w : work) w->wait();
  const int n = comm->size();
  for (int b = 0; b < 32; ++b) {
    // Sum over ranks r of (r + b + 1) * k = (n(n+1)/2 + n*b) * k.
    for (size_t i = 0; i < buckets[b].size(); ++i) {
      REQUIRE(buckets[b][i] ==
              static_cast<float>((n * (n + 1) / 2 + n * b) * static_cast<int>(i % 7 + 1)));
    }
  }
}

TEST_CASE("an allreduce completes while the training thread makes no MPI call", "[mpi][overlap]") {
  // Open MPI progresses a collective only inside MPI calls; the communication thread is what
  // lets a bucket finish while the training thread computes. Here it "computes" by sleeping
  // (so no core is contended), long enough for the allreduce to finish many times over.
  auto comm = world();
  auto data = rank_valued(1 << 16, comm->rank());
  const double launched = ddp::seconds_now();
  auto work = comm->allreduce_async(data.data(), data.size(), false);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double computed = ddp::seconds_now();
  work->wait();
  INFO("allreduce ran from +" << work->start_time() - launched << " s to +" << work->end_time() - launched
                              << " s; the training thread returned at +" << computed - launched << " s");
  REQUIRE(work->end_time() < computed);
  for (size_t i = 0; i < data.size(); ++i) REQUIRE(data[i] == expected_sum(i, comm->size()));
}

TEST_CASE("blocking allreduce of doubles: sum, max, min", "[mpi]") {
  auto comm = world();
  const int r = comm->rank(), n = comm->size();
  double v[3] = {static_cast<double>(r), static_cast<double>(r), static_cast<double>(r)};
  comm->allreduce(v, 1, ddp::ReduceOp::Sum);
  comm->allreduce(v + 1, 1, ddp::ReduceOp::Max);
  comm->allreduce(v + 2, 1, ddp::ReduceOp::Min);
  REQUIRE(v[0] == n * (n - 1) / 2.0);
  REQUIRE(v[1] == n - 1);
  REQUIRE(v[2] == 0);
}

TEST_CASE("broadcast from every root", "[mpi]") {
  auto comm = world();
  for (int root = 0; root < comm->size(); ++root) {
    int64_t value = comm->rank() == root ? 1000 + root : -1;
    comm->broadcast(&value, sizeof(value), root);
    REQUIRE(value == 1000 + root);
    const std::string s =
        ddp::broadcast_string(*comm, "from rank " + std::to_string(comm->rank()), root);
    REQUIRE(s == "from rank " + std::to_string(root));
    REQUIRE(ddp::broadcast_string(*comm, comm->rank() == root ? "" : "x", root).empty());
  }
  comm->barrier();
}

TEST_CASE("run_agreed: one rank's failure becomes every rank's error", "[mpi]") {
  auto comm = world();
  const int n = comm->size();
  REQUIRE_NOTHROW(ddp::run_agreed(*comm, [] {}));
  const int bad = n - 1;
  try {
    ddp::run_agreed(*comm, [&] {
      if (comm->rank() == bad) DDP_THROW("boom on rank " << bad);
    });
    FAIL("run_agreed did not throw");
  } catch (const ddp::CollectiveError& e) {
    REQUIRE_THAT(e.what(), Catch::Contains("boom on rank " + std::to_string(bad)));
  }
  // Several failing ranks: the lowest one's message wins, on every rank.
  try {
    ddp::run_agreed(*comm, [&] {
      if (comm->rank() >= 1 || n == 1)
        throw std::runtime_error("failed at " + std::to_string(comm->rank()));
    });
    FAIL("run_agreed did not throw");
  } catch (const ddp::CollectiveError& e) {
    REQUIRE(std::string(e.what()) == "failed at " + std::to_string(n == 1 ? 0 : 1));
  }
}
