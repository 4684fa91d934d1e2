// Collectives on exact, rank-valued data (so every check is ==, not a tolerance), and the
// agreement helper that turns one rank's setup failure into the same error on every rank.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <thread>

#include "comm/agreement.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/shard_plan.h"
#include "core/check.h"
#include "core/clock.h"
#include "ddp/trainer.h"
#include "mpi_test_helpers.h"

using ddp_test::require_on_all_ranks;

namespace {

std::unique_ptr<ddp::MpiCommunicator> world() { return ddp::make_mpi_communicator(MPI_COMM_WORLD); }

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
    long errors = 0;
    for (size_t i = 0; i < count; ++i) {
      errors += sum[i] != expected_sum(i, n);
      errors += avg[i] != expected_sum(i, n) / static_cast<float>(n);
    }
    require_on_all_ranks(*comm, errors, "sum and average of " + std::to_string(count) + " floats");
    REQUIRE(w1->end_time() >= w1->start_time());
    REQUIRE(w2->start_time() >= w1->end_time());
  }
}

TEST_CASE("allreduce on the gradient arena (shared-memory path on one node) is exact", "[mpi]") {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  // Buckets of awkward sizes (not multiples of the rank count or of 1024) laid end to end.
  const std::vector<size_t> sizes = {1, 3, 1000, 4099, 70001};
  size_t total = 0;
  for (size_t k : sizes) total += k;
  float* arena = comm->gradient_arena(total, ddp::BucketWire{});
  REQUIRE(arena != nullptr);
  long errors = 0;
  for (size_t i = 0; i < total; ++i) errors += arena[i] != 0.0f;
  require_on_all_ranks(*comm, errors, "arena zero-initialised");
  REQUIRE_THROWS_AS(comm->gradient_arena(total, ddp::BucketWire{}), ddp::Error);
  // Several rounds, rewriting the arena between them as backward would: a rank that started
  // the next round early must not corrupt what a slower rank is still reading.
  for (int round = 0; round < 20; ++round) {
    for (size_t i = 0; i < total; ++i)
      arena[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1) + round);
    std::vector<std::shared_ptr<ddp::Work>> work;
    size_t offset = 0;
    for (size_t b = 0; b < sizes.size(); ++b) {
      work.push_back(comm->allreduce_async(arena + offset, sizes[b], b % 2 == 1));
      offset += sizes[b];
    }
    for (auto& w : work) w->wait();
    offset = 0;
    for (size_t b = 0; b < sizes.size(); ++b) {
      for (size_t i = offset; i < offset + sizes[b]; ++i) {
        const float sum = expected_sum(i, n) + static_cast<float>(n * round);
        errors += arena[i] != (b % 2 == 1 ? sum / static_cast<float>(n) : sum);
      }
      offset += sizes[b];
    }
    require_on_all_ranks(*comm, errors, "round " + std::to_string(round));
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
  long errors = 0;
  for (int b = 0; b < 32; ++b) {
    // Sum over ranks r of (r + b + 1) * k = (n(n+1)/2 + n*b) * k.
    for (size_t i = 0; i < buckets[b].size(); ++i) {
      errors += buckets[b][i] !=
                static_cast<float>((n * (n + 1) / 2 + n * b) * static_cast<int>(i % 7 + 1));
    }
  }
  require_on_all_ranks(*comm, errors, "32 buckets");
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
  INFO("allreduce ran from +" << work->start_time() - launched << " s to +"
                              << work->end_time() - launched
                              << " s; the training thread returned at +" << computed - launched
                              << " s");
  long errors = work->end_time() < computed ? 0 : 1;
  for (size_t i = 0; i < data.size(); ++i) errors += data[i] != expected_sum(i, comm->size());
  require_on_all_ranks(*comm, errors, "allreduce done before the training thread returned");
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

TEST_CASE("process group flags: sum, max, min, behind the gradient buckets on one lane", "[mpi]") {
  auto comm = world();
  const int r = comm->rank(), n = comm->size();
  auto bucket = rank_valued(1000, r);
  float flags[3] = {static_cast<float>(r), static_cast<float>(r), static_cast<float>(r)};
  ddp::GradientCommunicator& gradients = *comm;
  ddp::ProcessGroup& group = *comm;
  auto w_bucket = gradients.allreduce_async(bucket.data(), bucket.size(), false);
  auto w_sum = group.allreduce_async(flags, 1, ddp::ReduceOp::Sum);
  auto w_max = group.allreduce_async(flags + 1, 1, ddp::ReduceOp::Max);
  auto w_min = group.allreduce_async(flags + 2, 1, ddp::ReduceOp::Min);
  w_min->wait();  // runs the lane up to it: the bucket and the other flags first
  w_max->wait();
  w_sum->wait();
  w_bucket->wait();
  long errors = 0;
  for (size_t i = 0; i < bucket.size(); ++i) errors += bucket[i] != expected_sum(i, n);
  errors += flags[0] != static_cast<float>(n * (n - 1) / 2);
  errors += flags[1] != static_cast<float>(n - 1);
  errors += flags[2] != 0.0f;
  errors += w_sum->start_time() < w_bucket->end_time();
  require_on_all_ranks(*comm, errors, "flags and the bucket before them");
}

TEST_CASE("broadcast from every root", "[mpi]") {
  auto comm = world();
  long errors = 0;
  for (int root = 0; root < comm->size(); ++root) {
    int64_t value = comm->rank() == root ? 1000 + root : -1;
    comm->broadcast(&value, sizeof(value), root);
    errors += value != 1000 + root;
    const std::string s =
        ddp::broadcast_string(*comm, "from rank " + std::to_string(comm->rank()), root);
    errors += s != "from rank " + std::to_string(root);
    errors += !ddp::broadcast_string(*comm, comm->rank() == root ? "" : "x", root).empty();
  }
  comm->barrier();
  require_on_all_ranks(*comm, errors, "broadcasts");
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

namespace {

// CPU time of this whole process (every thread: the lane's and the caller's).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

TEST_CASE("a rank waiting for a late peer sleeps: shared-memory allreduce and barrier",
          "[mpi][progress]") {
  auto comm = world();
  const size_t n = 4096;
  float* arena = comm->gradient_arena(n, ddp::BucketWire{});
  for (size_t i = 0; i < n; ++i) arena[i] = static_cast<float>(comm->rank() + 1);
  comm->barrier();
  // The last rank arrives 0.5 s late; everyone else waits for it, in the allreduce of the
  // arena (the training thread in finalize) and then in a barrier (a control collective). A rank
  // must not return before the late rank arrived (its arrival time, on the node's monotonic
  // clock, is broadcast afterwards) and must sleep, not spin, while it waits.
  const int late_rank = comm->size() - 1;
  const bool late = comm->rank() == late_rank;
  std::string errors;
  for (int phase = 0; phase < 2; ++phase) {
    const double cpu0 = process_cpu_seconds();
    if (late) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    double arrived = ddp::seconds_now();
    if (phase == 0) {
      comm->allreduce_async(arena, n, false)->wait();
    } else {
      comm->barrier();
    }
    const double returned = ddp::seconds_now(), cpu = process_cpu_seconds() - cpu0;
    comm->broadcast(&arrived, sizeof(arrived), late_rank);
    const char* what = phase == 0 ? "allreduce" : "barrier";
    if (!late && returned < arrived)
      errors += std::string(what) + ": returned before the late rank arrived; ";
    if (!late && cpu > 0.2)
      errors += std::string(what) + ": used " + std::to_string(cpu) + " s of CPU while waiting; ";
  }
  const float expected = static_cast<float>(comm->size() * (comm->size() + 1) / 2);
  if (comm->size() > 1 && !std::all_of(arena, arena + n, [&](float v) { return v == expected; }))
    errors += "wrong sum; ";
  INFO("rank " << comm->rank() << ": " << errors);
  CHECK(errors.empty());
  require_on_all_ranks(*comm, errors.empty() ? 0 : 1, "late peer waited for without spinning");
}

// The sharded optimizer's collectives, shared-memory and MPI paths: rounds of reduce-scatter of
// rank-valued buckets, each rank rewriting its part of the parameters, allgather; the parts and
// the gathered parameters are exact, and a rank rewriting its buckets right after the allgather
// never disturbs a slower rank's reduction.
TEST_CASE("reduce-scatter and parameter allgather are exact (shared memory and MPI)",
          "[mpi][shard]") {
  for (bool shared : {true, false}) {
    INFO((shared ? "shared-memory window" : "MPI_Reduce_scatter / MPI_Allgatherv"));
    auto comm = world();
    const int n = comm->size(), r = comm->rank();
    const std::vector<size_t> sizes = {1, 3, 1000, 4099, 70001};
    std::vector<ddp::Span> buckets;
    size_t total = 0;
    for (size_t k : sizes) {
      buckets.push_back(ddp::Span{total, k});
      total += k;
    }
    float* grads =
        comm->gradient_arena(total, ddp::BucketWire{ddp::Compression::None, false, false, shared});
    float* params = comm->parameter_arena(total, shared);
    REQUIRE_THROWS_AS(comm->parameter_arena(total, shared), ddp::Error);
    long errors = 0;
    for (int round = 0; round < 10; ++round) {
      for (size_t i = 0; i < total; ++i)
        grads[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1) + round);
      std::vector<std::shared_ptr<ddp::Work>> work;
      for (const ddp::Span& b : buckets)
        work.push_back(comm->reduce_scatter_async(grads + b.offset, b.numel));
      for (auto& w : work) w->wait();
      for (const ddp::Span& b : buckets) {
        const ddp::Span part = ddp::shard_part(b.numel, n, r);
        for (size_t i = b.offset + part.offset; i < b.offset + part.end(); ++i) {
          errors += grads[i] != expected_sum(i, n) + static_cast<float>(n * round);
          params[i] = static_cast<float>(i) + static_cast<float>(round);  // "the update"
        }
      }
      comm->allgather_async(params, buckets)->wait();
      for (size_t i = 0; i < total; ++i)
        errors += params[i] != static_cast<float>(i) + static_cast<float>(round);
      require_on_all_ranks(*comm, errors, "round " + std::to_string(round));
    }
  }
}

TEST_CASE("allgather of host memory: every rank's parts of every bucket reach every rank",
          "[mpi][shard]") {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  const std::vector<ddp::Span> buckets = {{0, 5}, {5, 33}, {40, 1027}};  // a gap at 38..40
  std::vector<float> data(1067, -1.0f);
  for (const ddp::Span& b : buckets) {
    const ddp::Span part = ddp::shard_part(b.numel, n, r);
    for (size_t i = b.offset + part.offset; i < b.offset + part.end(); ++i)
      data[i] = static_cast<float>(i * 3 + 1);
  }
  // At most 4 riders, with room for every rank's.
  CHECK_THROWS_WITH(comm->allgather_with_riders(
                        data.data(), buckets,
                        {std::vector<double>(5, 1.0), std::make_shared<std::vector<double>>()}),
                    Catch::Contains("5 riders (at most 4"));
  CHECK_THROWS_WITH(comm->allgather_with_riders(data.data(), buckets, {{1.0}, nullptr}),
                    Catch::Contains("riders"));
  comm->allgather_async(data.data(), buckets)->wait();
  long errors = 0;
  for (size_t i = 0; i < data.size(); ++i)
    errors += data[i] != (i >= 38 && i < 40 ? -1.0f : static_cast<float>(i * 3 + 1));
  require_on_all_ranks(*comm, errors, "gathered values (the gap untouched)");
}

// The small allgather: MPI before any window exists, through the control window's slots once
// one does (counts up to 4), MPI again above that; many calls in a row, so a rank that races
// ahead into the next call must not overwrite slots a slower rank still reads.
TEST_CASE("allgather of doubles: rank order on every rank, shared memory and MPI", "[mpi][shard]") {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  auto check_rounds = [&](const std::string& what, size_t count) {
    long errors = 0;
    std::vector<double> mine(count), all(count * static_cast<size_t>(n));
    for (int round = 0; round < 50; ++round) {
      for (size_t i = 0; i < count; ++i) mine[i] = r * 1000.0 + static_cast<double>(i) + round;
      comm->allgather(mine.data(), count, all.data());
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; ++i)
          errors += all[static_cast<size_t>(q) * count + i] !=
                    q * 1000.0 + static_cast<double>(i) + round;
    }
    require_on_all_ranks(*comm, errors, what + ", " + std::to_string(count) + " per rank");
  };
  check_rounds("before any window", 2);
  comm->gradient_arena(64, ddp::BucketWire{});  // one node: the control window and its slots
  for (size_t count : {size_t{1}, size_t{2}, size_t{4}, size_t{5}}) check_rounds("window", count);
}

// Rank 0 gives up on an allreduce its peers join only later. MPI cannot cancel a collective, so
// the request stays active and the late peers' sum still arrives: it must land in memory the
// communicator keeps, never in the caller's (freed by then, in a caller that goes on).
TEST_CASE("a collective given up on never writes into the caller's memory afterwards",
          "[mpi][timeout]") {
  auto comm = world();
  const int rank = comm->rank(), size = comm->size();
  if (size < 2) {
    WARN("skipped: needs 2 ranks");
    return;
  }
  const std::vector<double> sent(4, rank + 1.0);
  std::vector<double> data = sent;
  std::string error;
  if (rank == 0) {
    comm->set_timeout(0.3);
    try {
      comm->allreduce(data.data(), data.size(), ddp::ReduceOp::Sum);
    } catch (const ddp::Error& e) {
      error = e.what();
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the peers join rank 0's lost allreduce only now
  if (rank != 0) comm->allreduce(data.data(), data.size(), ddp::ReduceOp::Sum);
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0's MPI progresses here: the sum reaches its request
  long errors = 0;
  if (rank == 0) {
    INFO(error);
    errors += error.find("did not complete within 0.3 s") == std::string::npos;
    errors += data != sent;
  } else {
    errors += data != std::vector<double>(4, size * (size + 1) / 2.0);
  }
  CHECK(errors == 0);
  if (rank == 0) (void)comm.release();  // a lane stuck in a lost collective is left behind
  require_on_all_ranks(*world(), errors, "ranks whose memory a lost collective wrote");
}
