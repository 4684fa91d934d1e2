// Bucket plan (a pure function) and the Reducer's launch logic against a recording fake
// communicator: order, timing of launches, averaging requests and misuse errors.
#include <catch2/catch.hpp>
#include <numeric>

#include "comm/powersgd_communicator.h"
#include "comm/reducer.h"
#include "core/check.h"

using ddp::BucketPlan;
using ddp::compute_bucket_plan;

namespace {

constexpr size_t kKiB = 1024;

std::vector<size_t> all_params(const BucketPlan& plan) {
  std::vector<size_t> out;
  for (const auto& b : plan.buckets) out.insert(out.end(), b.params.begin(), b.params.end());
  return out;
}

// Checks the invariants every plan must satisfy: each parameter exactly once, buckets
// contiguous in the arena, locator table consistent with the buckets.
void require_consistent(const BucketPlan& plan, const std::vector<size_t>& numel) {
  std::vector<int> seen(numel.size(), 0);
  size_t offset = 0;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const auto& bucket = plan.buckets[b];
    REQUIRE(bucket.offset == offset);
    size_t inner = bucket.offset;
    for (size_t p : bucket.params) {
      REQUIRE(p < numel.size());
      ++seen[p];
      REQUIRE(plan.param_bucket[p] == b);
      REQUIRE(plan.param_offset[p] == inner);
      inner += numel[p];
    }
    REQUIRE(inner - bucket.offset == bucket.numel);
    offset += bucket.numel;
  }
  REQUIRE(plan.total_numel == std::accumulate(numel.begin(), numel.end(), size_t{0}));
  REQUIRE(offset == plan.total_numel);
  for (int s : seen) REQUIRE(s == 1);
}

}  // namespace

TEST_CASE("bucket plan takes parameters in reverse registration order", "[reducer]") {
  const std::vector<size_t> numel = {100, 10, 200, 20, 30, 3};
  const BucketPlan plan = compute_bucket_plan(numel, 1 << 20, 1 << 20);
  require_consistent(plan, numel);
  REQUIRE(plan.buckets.size() == 1);
  REQUIRE(all_params(plan) == std::vector<size_t>{5, 4, 3, 2, 1, 0});
}

TEST_CASE("bucket plan closes the first bucket at its own cap, later ones at bucket_cap",
          "[reducer]") {
  // 256 floats = 1 KiB. First cap 1 KiB, later caps 2 KiB.
  const std::vector<size_t> numel = {256, 256, 256, 256, 256, 256};
  const BucketPlan plan = compute_bucket_plan(numel, 1 * kKiB, 2 * kKiB);
  require_consistent(plan, numel);
  REQUIRE(plan.buckets.size() == 4);
  REQUIRE(plan.buckets[0].params == std::vector<size_t>{5});
  REQUIRE(plan.buckets[1].params == std::vector<size_t>{4, 3});
  REQUIRE(plan.buckets[2].params == std::vector<size_t>{2, 1});
  REQUIRE(plan.buckets[3].params == std::vector<size_t>{0});
}

TEST_CASE("bucket plan closes a bucket once it reaches the cap, not before", "[reducer]") {
  // 100 floats = 400 B; cap 1000 B: 400, 800 (< cap, keep adding), 1200 (>= cap, close).
  const std::vector<size_t> numel(7, 100);
  const BucketPlan plan = compute_bucket_plan(numel, 1000, 1000);
  require_consistent(plan, numel);
  REQUIRE(plan.buckets.size() == 3);
  REQUIRE(plan.buckets[0].params == std::vector<size_t>{6, 5, 4});
  REQUIRE(plan.buckets[1].params == std::vector<size_t>{3, 2, 1});
  REQUIRE(plan.buckets[2].params == std::vector<size_t>{0});
}

TEST_CASE("a parameter larger than the cap is never split", "[reducer]") {
  const std::vector<size_t> numel = {10, 5000, 10, 10};  // 5000 floats = 20000 B >> 1 KiB cap
  const BucketPlan plan = compute_bucket_plan(numel, kKiB, kKiB);
  require_consistent(plan, numel);
  REQUIRE(plan.buckets.size() == 2);
  REQUIRE(plan.buckets[0].params == std::vector<size_t>{3, 2, 1});  // closes when the big one lands
  REQUIRE(plan.buckets[1].params == std::vector<size_t>{0});
  REQUIRE(plan.buckets[0].numel == 5020);
}

TEST_CASE("bucket plan of the Fashion-MNIST MLP with DDP's default caps is one bucket",
          "[reducer]") {
  // 784-256-256-10: weights and biases in registration order.
  const std::vector<size_t> numel = {256 * 784, 256, 256 * 256, 256, 10 * 256, 10};
  const BucketPlan one = compute_bucket_plan(numel, 1 << 20, 25 << 20);
  require_consistent(one, numel);
  REQUIRE(one.buckets.size() == 1);
  const BucketPlan small = compute_bucket_plan(numel, 1 << 18, 1 << 18);  // 256 KiB
  require_consistent(small, numel);
  REQUIRE(small.buckets.size() == 2);
  REQUIRE(small.buckets[0].params == std::vector<size_t>{5, 4, 3, 2});
  REQUIRE(small.buckets[1].params == std::vector<size_t>{1, 0});
}

TEST_CASE("bucket plan is deterministic and rejects zero caps", "[reducer]") {
  const std::vector<size_t> numel = {7, 300, 11, 999, 1};
  const BucketPlan a = compute_bucket_plan(numel, 500, 900);
  const BucketPlan b = compute_bucket_plan(numel, 500, 900);
  REQUIRE(ddp::describe_plan(a, {}) == ddp::describe_plan(b, {}));
  REQUIRE(a.param_offset == b.param_offset);
  REQUIRE_THROWS_AS(compute_bucket_plan(numel, 0, 900), ddp::Error);
  REQUIRE_THROWS_AS(compute_bucket_plan(numel, 500, 0), ddp::Error);
}

namespace {

// Records each collective instead of communicating; completes them immediately.
class RecordingComm : public ddp::HostGradientCommunicator {
 public:
  struct Call {
    float* data;
    size_t count;
    bool average;
  };
  std::vector<Call> calls;
  std::vector<float> arena, parameters;
  size_t fail_call = SIZE_MAX;  // this call's wait() throws, as a timed-out collective does
  size_t reduce_scatters = 0;
  size_t consumed = 0;  // floats handed to reduce_scatter_into_async's consumers
  std::shared_ptr<ddp::Work> reduce_scatter_async(float* data, size_t count) override {
    ++reduce_scatters;
    return allreduce_async(data, count, false);
  }
  // Hands the whole bucket to the consumer, as if this rank owned all of it.
  std::shared_ptr<ddp::Work> reduce_scatter_into_async(float* data, size_t count,
                                                       PartConsumer consume) override {
    consume(data, data, count);
    consumed += count;
    return reduce_scatter_async(data, count);
  }
  std::shared_ptr<ddp::Work> allreduce_on_lane(float* data, size_t count, bool average,
                                               const ddp::LaneHooks&) override {
    return allreduce_async(data, count, average);
  }
  std::shared_ptr<ddp::Work> allreduce_async(float* data, size_t count, bool average) override {
    calls.push_back({data, count, average});
    auto work = std::make_shared<DoneWork>();
    work->fail = calls.size() - 1 == fail_call;
    work->start = static_cast<double>(calls.size());
    return work;
  }
  float* gradient_arena(size_t numel, const ddp::BucketWire&) override {
    arena.assign(numel, 0.0f);
    return arena.data();
  }
  float* parameter_arena(size_t numel, bool) override {
    parameters.assign(numel, 0.0f);
    return parameters.data();
  }
  std::shared_ptr<ddp::Work> allgather_async(float* arena_,
                                             const std::vector<ddp::Span>&) override {
    return allreduce_async(arena_, 0, false);
  }
  std::shared_ptr<ddp::Work> allgather_with_riders(float* arena_,
                                                   const std::vector<ddp::Span>& buckets,
                                                   ddp::ScalarRiders) override {
    return allgather_async(arena_, buckets);
  }
  std::shared_ptr<ddp::Work> reduce_on_lane(std::string, size_t, float* data, size_t count,
                                            BucketReduction) override {
    return allreduce_async(data, count, false);
  }
  double* exact_sum_arena(size_t count, bool) override {
    exact.assign(count, 0.0);
    return exact.data();
  }
  std::shared_ptr<ddp::Work> allreduce_exact_async(ExactConsumer consume) override {
    consume(0, exact.data(), exact.size());
    return allreduce_async(nullptr, exact.size(), false);
  }
  void set_timeout(double) override {}
  double timeout() const override { return 1.0; }
  std::vector<double> exact;

 private:
  // Call k "ran" from k to k + 0.5 s.
  struct DoneWork : ddp::Work {
    bool fail = false;
    double start = 0;
    void wait() override {
      if (fail) DDP_THROW("allreduce of 5 floats did not complete within 1 s");
    }
    double start_time() const override { return start; }
    double end_time() const override { return start + 0.5; }
  };
};

}  // namespace

TEST_CASE("Reducer launches buckets in index order as soon as they are complete", "[reducer]") {
  const std::vector<size_t> numel(6, 256);                       // 1 KiB each
  BucketPlan plan = compute_bucket_plan(numel, kKiB, 2 * kKiB);  // {5} {4,3} {2,1} {0}
  std::vector<float> arena(plan.total_numel);
  RecordingComm comm;
  ddp::Reducer reducer(plan, {"p0", "p1", "p2", "p3", "p4", "p5"}, arena.data(), comm);

  reducer.prepare_for_backward(true);
  reducer.mark_ready(4);  // bucket 1 half full
  REQUIRE(comm.calls.empty());
  reducer.mark_ready(3);  // bucket 1 complete, but bucket 0 has not launched: must wait
  REQUIRE(comm.calls.empty());
  reducer.mark_ready(5);  // bucket 0 complete: launches 0 then 1
  REQUIRE(comm.calls.size() == 2);
  REQUIRE(comm.calls[0].data == arena.data() + plan.buckets[0].offset);
  REQUIRE(comm.calls[0].count == 256);
  REQUIRE(comm.calls[1].data == arena.data() + plan.buckets[1].offset);
  REQUIRE(comm.calls[1].count == 512);
  REQUIRE_FALSE(comm.calls[0].average);  // summed: the loss is pre-scaled by 1/world
  reducer.mark_ready(0);                 // bucket 3 complete, bucket 2 not: nothing may start
  reducer.mark_ready(2);
  REQUIRE(comm.calls.size() == 2);
  reducer.mark_ready(1);  // bucket 2 complete: 2 and 3 start, in that order
  REQUIRE(comm.calls.size() == 4);
  REQUIRE(comm.calls[2].data == arena.data() + plan.buckets[2].offset);
  REQUIRE(comm.calls[3].data == arena.data() + plan.buckets[3].offset);
  REQUIRE(reducer.launched() == 4);
  reducer.finalize();

  // The next backward starts over.
  reducer.prepare_for_backward(true);
  REQUIRE(reducer.launched() == 0);
  for (size_t p = 6; p-- > 0;) reducer.mark_ready(p);
  REQUIRE(comm.calls.size() == 8);
  reducer.finalize();
}

TEST_CASE("Reducer of a sharded optimizer reduce-scatters each bucket, in the same order",
          "[reducer][shard]") {
  const std::vector<size_t> numel(6, 256);
  BucketPlan plan = compute_bucket_plan(numel, kKiB, 2 * kKiB);  // {5} {4,3} {2,1} {0}
  std::vector<float> arena(plan.total_numel);
  RecordingComm comm;
  ddp::Reducer reducer =
      ddp::Reducer::sharded(plan, {"p0", "p1", "p2", "p3", "p4", "p5"}, arena.data(), comm);
  reducer.prepare_for_backward(true);
  for (size_t p = 6; p-- > 0;) reducer.mark_ready(p);
  REQUIRE(comm.reduce_scatters == 4);
  REQUIRE(comm.calls.size() == 4);
  for (size_t b = 0; b < 4; ++b) {
    REQUIRE(comm.calls[b].data == arena.data() + plan.buckets[b].offset);
    REQUIRE(comm.calls[b].count == plan.buckets[b].numel);
  }
  reducer.finalize();
  // A failed one is named as a reduce-scatter.
  comm.fail_call = 4;
  reducer.prepare_for_backward(true);
  for (size_t p = 6; p-- > 0;) reducer.mark_ready(p);
  REQUIRE_THROWS_WITH(reducer.finalize(),
                      Catch::Contains("gradient reduce-scatter of bucket 0 (p5)"));
}

TEST_CASE("Reducer fused with the optimizer launches a bucket once backward has left its layers",
          "[reducer][shard]") {
  const std::vector<size_t> numel(6, 256);
  BucketPlan plan = compute_bucket_plan(numel, kKiB, 2 * kKiB);  // {5} {4,3} {2,1} {0}
  std::vector<float> arena(plan.total_numel);
  RecordingComm comm;
  ddp::Reducer reducer =
      ddp::Reducer::sharded(plan, {"p0", "p1", "p2", "p3", "p4", "p5"}, arena.data(), comm);
  std::vector<float*> consumed_at;
  // Three Linear layers (weight, bias) with a ReLU between each: layers 0, 2, 4.
  reducer.fuse(comm, [&](float* at, const float*, size_t) { consumed_at.push_back(at); },
               {0, 0, 2, 2, 4, 4});
  reducer.prepare_for_backward(true);
  reducer.mark_ready(5);  // bucket 0 complete, but layer 4's backward still reads its values
  reducer.mark_ready(4);
  REQUIRE(comm.calls.empty());
  reducer.mark_ready(3);  // layer 2 began: layer 4 is done; bucket 1 holds p3 of layer 2
  REQUIRE(comm.calls.size() == 1);
  reducer.mark_ready(2);
  REQUIRE(comm.calls.size() == 1);
  reducer.mark_ready(1);  // layer 0 began: bucket 1 goes; bucket 2 holds p1 of layer 0
  REQUIRE(comm.calls.size() == 2);
  reducer.mark_ready(0);  // bucket 3 complete, behind bucket 2
  REQUIRE(comm.calls.size() == 2);
  reducer.finalize();  // backward has ended: 2 and 3, in order
  REQUIRE(comm.calls.size() == 4);
  REQUIRE(comm.reduce_scatters == 4);
  REQUIRE(comm.consumed == plan.total_numel);
  for (size_t b = 0; b < 4; ++b) {
    REQUIRE(comm.calls[b].data == arena.data() + plan.buckets[b].offset);
    REQUIRE(consumed_at[b] == arena.data() + plan.buckets[b].offset);
  }
  // A no_sync micro-batch still communicates nothing.
  reducer.prepare_for_backward(false);
  for (size_t p = 6; p-- > 0;) reducer.mark_ready(p);
  reducer.finalize();
  REQUIRE(comm.calls.size() == 4);
}

TEST_CASE("Reducer::fuse needs a sharded Reducer and a layer per parameter", "[reducer][shard]") {
  const std::vector<size_t> numel(2, 8);
  BucketPlan plan = compute_bucket_plan(numel, kKiB, kKiB);
  std::vector<float> arena(plan.total_numel);
  RecordingComm comm;
  auto consume = [](float*, const float*, size_t) {};
  ddp::Reducer replicated(plan, {"w", "b"}, arena.data(), comm);
  REQUIRE_THROWS_WITH(replicated.fuse(comm, consume, {0, 0}), Catch::Contains("sharded optimizer"));
  ddp::Reducer sharded = ddp::Reducer::sharded(plan, {"w", "b"}, arena.data(), comm);
  REQUIRE_THROWS_WITH(sharded.fuse(comm, consume, {0}),
                      Catch::Contains("1 layers for 2 parameters"));
  RecordingComm other;
  REQUIRE_THROWS_WITH(sharded.fuse(other, consume, {0, 0}),
                      Catch::Contains("the Reducer's communicator"));
}

TEST_CASE("Reducer in no_sync mode communicates nothing", "[reducer]") {
  const std::vector<size_t> numel(3, 10);
  BucketPlan plan = compute_bucket_plan(numel, 8, 8);
  std::vector<float> arena(plan.total_numel);
  RecordingComm comm;
  ddp::Reducer reducer(plan, {"a", "b", "c"}, arena.data(), comm);
  reducer.prepare_for_backward(false);
  for (size_t p = 0; p < 3; ++p) reducer.mark_ready(p);
  reducer.finalize();
  REQUIRE(comm.calls.empty());
  reducer.prepare_for_backward(true);
  for (size_t p = 0; p < 3; ++p) reducer.mark_ready(p);
  reducer.finalize();
  REQUIRE(comm.calls.size() == 3);
}

TEST_CASE("Reducer rejects a gradient marked twice or never marked", "[reducer]") {
  const std::vector<size_t> numel(3, 10);
  BucketPlan plan = compute_bucket_plan(numel, 1 << 20, 1 << 20);
  std::vector<float> arena(plan.total_numel);
  RecordingComm comm;
  ddp::Reducer reducer(plan, {"w0", "b0", "w1"}, arena.data(), comm);
  reducer.prepare_for_backward(true);
  reducer.mark_ready(2);
  REQUIRE_THROWS_WITH(reducer.mark_ready(2),
                      Catch::Contains("w1") && Catch::Contains("marked ready twice"));
  reducer.prepare_for_backward(true);
  reducer.mark_ready(2);
  reducer.mark_ready(0);
  REQUIRE_THROWS_WITH(reducer.finalize(),
                      Catch::Contains("b0") && Catch::Contains("never marked ready"));
  REQUIRE_THROWS_AS(reducer.mark_ready(7), ddp::Error);
}

TEST_CASE("Reducer names the bucket whose collective failed, at finalize and synchronize",
          "[reducer]") {
  const std::vector<size_t> numel(4, 256);
  BucketPlan plan = compute_bucket_plan(numel, kKiB, kKiB);  // {3} {2} {1} {0}
  std::vector<float> arena(plan.total_numel);
  RecordingComm comm;
  comm.fail_call = 1;
  ddp::Reducer reducer(plan, {"w0", "b0", "w1", "b1"}, arena.data(), comm);
  reducer.prepare_for_backward(true);
  for (size_t p = 4; p-- > 0;) reducer.mark_ready(p);
  REQUIRE_THROWS_WITH(reducer.finalize(),
                      Catch::Contains("gradient allreduce of bucket 1 (w1): allreduce of 5 floats "
                                      "did not complete within 1 s"));
  const auto works = reducer.works();
  REQUIRE(works.size() == 4);
  REQUIRE_THROWS_WITH(reducer.synchronize(works, 17),
                      Catch::Contains("gradient allreduce of bucket 1 (w1) (global step 17): "));
}

TEST_CASE("overlap_stats: allreduce time inside backward, less time off the core", "[reducer]") {
  RecordingComm comm;
  std::vector<std::shared_ptr<ddp::Work>> works;
  for (int k = 0; k < 3; ++k) works.push_back(comm.allreduce_async(nullptr, 1, false));
  // Works ran [1, 1.5], [2, 2.5], [3, 3.5]: 1.5 s in all.
  auto stats = ddp::overlap_stats(works, {0.0, 2.25, 2.25});
  CHECK(stats.comm_seconds == Approx(1.5));
  CHECK(stats.hidden_seconds == Approx(0.75));          // [1, 1.5] and [2, 2.25]
  stats = ddp::overlap_stats(works, {0.0, 2.25, 2.0});  // 0.25 s of backward off its core
  CHECK(stats.hidden_seconds == Approx(0.5));
  stats = ddp::overlap_stats(works, {4.0, 5.0, 1.0});  // backward after every allreduce
  CHECK(stats.hidden_seconds == 0.0);
  CHECK(ddp::overlap_stats({}, {0.0, 1.0, 1.0}).comm_seconds == 0.0);
}

// A bucket whose gradients were ready at `ready`, its collective ran [start, end].
struct TimedWork : ddp::Work {
  TimedWork(double ready, double start, double end) : ready(ready), start(start), end(end) {}
  double ready, start, end;
  void wait() override {}
  double start_time() const override { return start; }
  double end_time() const override { return end; }
  double ready_time() const override { return ready; }
};

TEST_CASE("bucket_wait: the buckets' last end less the last bucket's ready time", "[reducer]") {
  using Works = std::vector<std::shared_ptr<ddp::Work>>;
  // Backward readied buckets at 1, 2, 3; the peers held the last one until 7.
  const Works waited = {std::make_shared<TimedWork>(1.0, 1.0, 2.5),
                        std::make_shared<TimedWork>(2.0, 2.5, 4.0),
                        std::make_shared<TimedWork>(3.0, 4.0, 7.0)};
  CHECK(ddp::bucket_wait(waited) == Approx(4.0));
  // Every bucket done before backward readied the last: its own collective alone.
  const Works overlapped = {std::make_shared<TimedWork>(1.0, 1.0, 1.5),
                            std::make_shared<TimedWork>(3.0, 3.0, 3.25)};
  CHECK(ddp::bucket_wait(overlapped) == Approx(0.25));
  // The last to end need not be the last launched; the clocks never make the wait negative.
  const Works crossed = {std::make_shared<TimedWork>(2.0, 2.0, 6.0),
                         std::make_shared<TimedWork>(5.0, 5.0, 5.5)};
  CHECK(ddp::bucket_wait(crossed) == Approx(1.0));
  CHECK(ddp::bucket_wait({std::make_shared<TimedWork>(2.0, 2.0, 1.9)}) == 0.0);
  CHECK(ddp::bucket_wait({}) == 0.0);
  // A lane's collective is ready when it starts (Work::ready_time's default).
  RecordingComm comm;
  const Works lane = {comm.allreduce_async(nullptr, 1, false)};  // ran [1, 1.5]
  CHECK(ddp::bucket_wait(lane) == Approx(0.5));
}

TEST_CASE("bucket plan with alignment: every tensor starts on a multiple of 4 floats", "[bucket]") {
  // A 784-256-256-10 MLP's parameters and some awkward sizes.
  const std::vector<size_t> numel = {200704, 256, 65536, 256, 2560, 10, 7, 3, 5};
  for (size_t align : {size_t{1}, size_t{4}}) {
    const BucketPlan plan = compute_bucket_plan(numel, 4 * kKiB, 64 * kKiB, align);
    INFO("align " << align);
    size_t covered = 0, end_of_previous = 0;
    for (size_t b = 0; b < plan.buckets.size(); ++b) {
      const auto& bucket = plan.buckets[b];
      CHECK(bucket.offset % align == 0);
      CHECK(bucket.offset >= end_of_previous);
      for (size_t p : bucket.params) {
        CHECK(plan.param_offset[p] % align == 0);
        CHECK(plan.param_offset[p] >= bucket.offset);
        CHECK(plan.param_offset[p] + numel[p] <= bucket.offset + bucket.numel);
        covered += numel[p];
      }
      end_of_previous = bucket.offset + bucket.numel;
    }
    CHECK(covered == std::accumulate(numel.begin(), numel.end(), size_t{0}));
    CHECK(plan.total_numel == end_of_previous);
    if (align == 1) CHECK(plan.total_numel == covered);
    if (align == 4) CHECK(plan.total_numel < covered + 4 * numel.size());
  }
  REQUIRE_THROWS_AS(compute_bucket_plan(numel, 4 * kKiB, 64 * kKiB, 0), ddp::Error);
}

// PowerSGD's state in the arena's terms (what checkpoints keep): two buckets, each with one
// matrix that gains from rank-1 factors (10 x 8) and one too small (2 x 2); restored into the
// same layout it is the state, a bucket with Q for some of its matrices starts afresh, and
// sizes of another layout are refused by name.
TEST_CASE(
    "PowerSGD state: restored as kept, a bucket of mixed histories afresh, wrong sizes "
    "refused",
    "[reducer][powersgd]") {
  RecordingComm host;
  const std::vector<ddp::PowerSgdLayout> layouts = {{{{0, 10, 8}, {80, 2, 2}}, 84},
                                                    {{{0, 2, 2}, {4, 10, 8}}, 84}};
  ddp::PowerSgdCommunicator comm(
      host, ddp::host_powersgd_compressors(host, layouts, ddp::PowerSgdOptions{}, 2), 0, 7);
  comm.gradient_arena(168, ddp::BucketWire{});
  CHECK(comm.factor_rank(0) == 1);
  CHECK(comm.factor_rank(80) == 0);
  CHECK(comm.factor_rank(88) == 1);
  CHECK(comm.factor_rank(5) == 0);  // no matrix starts there
  CHECK(comm.state().error.empty());
  ddp::PowerSgdState kept;
  kept.error.resize(168);
  std::iota(kept.error.begin(), kept.error.end(), 0.0f);
  kept.q[0] = std::vector<float>(8, 0.5f);
  kept.q[88] = std::vector<float>(8, -0.25f);
  comm.restore(kept);
  CHECK(comm.state().error == kept.error);
  CHECK(comm.state().q == kept.q);
  // A second bucket whose Q is missing keeps none; its error feedback still comes back.
  ddp::PowerSgdState partial = kept;
  partial.q.erase(88);
  comm.restore(partial);
  CHECK(comm.state().q == partial.q);
  CHECK(comm.state().error == kept.error);
  ddp::PowerSgdState bad = kept;
  bad.q[0].resize(9);
  CHECK_THROWS_WITH(comm.restore(bad),
                    Catch::Contains("a Q of 9 floats for the matrix at float 0, whose factors "
                                    "take 8"));
  bad = kept;
  bad.q[80] = std::vector<float>(2, 1.0f);
  CHECK_THROWS_WITH(comm.restore(bad), Catch::Contains("1 Q(s) for matrices sent whole"));
  bad = kept;
  bad.error.resize(100);
  CHECK_THROWS_WITH(comm.restore(bad), Catch::Contains("an error feedback of 100 floats for a "
                                                       "gradient arena of 168"));
}
