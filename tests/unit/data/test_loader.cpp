// Loader: batches reproduce the given index order exactly (checked row by row against the
// dataset), partial/dropped tails, prefetch depths, restarts, abandoning an epoch, a held batch
// surviving the workers running ahead, worker errors surfacing in next() (with several workers
// the first in batch order), a NaN or an infinity in a batch refused by name, and clean
// shutdown; with one worker and with several.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "data/loader.h"
#include "data/sampler.h"

using Catch::Contains;
using ddp::Batch;
using ddp::Dataset;
using ddp::Loader;
using Indices = std::vector<int64_t>;

namespace {

/// Row i holds i*100 + j in column j and label i % 7, so every row is recognisable.
Dataset numbered_dataset(int64_t n, int64_t f) {
  Dataset ds;
  ds.size = n;
  ds.features = f;
  ds.source = "numbered";
  std::vector<float> x;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < f; ++j) x.push_back(static_cast<float>(i * 100 + j));
    ds.y.push_back(static_cast<int32_t>(i % 7));
  }
  ds.x = ddp::FeatureStore(std::move(x));
  return ds;
}

/// REQUIREs that `b` is batch `k` of `order` cut into batches of `bs`.
void require_batch(const Batch& b, const Dataset& ds, const Indices& order, int64_t bs, int64_t k) {
  const int64_t rows = std::min(bs, static_cast<int64_t>(order.size()) - k * bs);
  REQUIRE(b.index == k);
  REQUIRE(b.rows == rows);
  REQUIRE(static_cast<int64_t>(b.x.size()) == rows * ds.features);
  REQUIRE(static_cast<int64_t>(b.y.size()) == rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = order[static_cast<size_t>(k * bs + r)];
    INFO("batch " << k << " row " << r << " sample " << i);
    REQUIRE(b.y[static_cast<size_t>(r)] == ds.y[static_cast<size_t>(i)]);
    for (int64_t j = 0; j < ds.features; ++j)
      REQUIRE(b.x[static_cast<size_t>(r * ds.features + j)] ==
              ds.x[static_cast<size_t>(i * ds.features + j)]);
  }
}

/// Drains an epoch, checking every batch; `pause` lets the worker run as far ahead as it may
/// before the held batch is checked, so a slot reused too early shows up as wrong data.
int64_t drain_and_check(Loader& loader, const Dataset& ds, const Indices& order, int64_t bs,
                        std::chrono::milliseconds pause = std::chrono::milliseconds(0)) {
  int64_t k = 0;
  while (const Batch* b = loader.next()) {
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
    require_batch(*b, ds, order, bs, k);
    ++k;
  }
  REQUIRE(loader.next() == nullptr);  // stays at the end
  return k;
}

}  // namespace

TEST_CASE("loader batches reproduce the index order exactly", "[data][loader]") {
  const Dataset ds = numbered_dataset(23, 3);
  const Indices order = ddp::random_permutation(23, 5);
  for (const auto& [prefetch, workers] : {std::pair{0, 1}, {1, 1}, {4, 1}, {1, 2}, {4, 3}}) {
    INFO("prefetch " << prefetch << ", workers " << workers);
    const std::string with =
        ", prefetch " + std::to_string(prefetch) + ", workers " + std::to_string(workers);
    SECTION("partial last batch" + with) {
      Loader loader(ds, 5, false, prefetch, workers);
      loader.start_epoch(order);
      REQUIRE(loader.batches_in_epoch() == 5);
      REQUIRE(drain_and_check(loader, ds, order, 5) == 5);  // 4 x 5 rows + 3
    }
    SECTION("drop_last" + with) {
      Loader loader(ds, 5, true, prefetch, workers);
      loader.start_epoch(order);
      REQUIRE(loader.batches_in_epoch() == 4);
      REQUIRE(drain_and_check(loader, ds, order, 5) == 4);
    }
    SECTION("held batch survives the workers running ahead" + with) {
      Loader loader(ds, 4, false, prefetch, workers);
      loader.start_epoch(order);
      REQUIRE(drain_and_check(loader, ds, order, 4, std::chrono::milliseconds(5)) == 6);
    }
  }
}

TEST_CASE("loader handles exact multiples, empty epochs and duplicate indices", "[data][loader]") {
  const Dataset ds = numbered_dataset(10, 2);
  Loader loader(ds, 5, true, 2);
  loader.start_epoch({0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  REQUIRE(drain_and_check(loader, ds, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 5) == 2);
  loader.start_epoch({});
  REQUIRE(loader.batches_in_epoch() == 0);
  REQUIRE(loader.next() == nullptr);
  loader.start_epoch({1, 2, 3});  // fewer than one batch with drop_last: nothing
  REQUIRE(loader.next() == nullptr);
  const Indices padded = {9, 9, 0, 9, 0, 0, 3};  // padding repeats samples
  Loader partial(ds, 3, false, 1);
  partial.start_epoch(padded);
  REQUIRE(drain_and_check(partial, ds, padded, 3) == 3);
}

TEST_CASE("loader restarts and abandons epochs", "[data][loader]") {
  const Dataset ds = numbered_dataset(31, 4);
  ddp::DistributedSampler sampler(31, 2, 1, true, 3, false);
  const int workers = GENERATE(1, 3);
  INFO("workers " << workers);
  Loader loader(ds, 4, false, 2, workers);
  std::set<const float*> slots_seen;
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    sampler.set_epoch(epoch);
    const Indices order = sampler.indices();
    loader.start_epoch(order);
    if (epoch % 2 == 1) {  // abandon after one batch, then restart the same epoch
      const Batch* b = loader.next();
      REQUIRE(b != nullptr);
      require_batch(*b, ds, order, 4, 0);
      loader.start_epoch(order);
    }
    int64_t k = 0;
    while (const Batch* b = loader.next()) {
      require_batch(*b, ds, order, 4, k++);
      slots_seen.insert(b->x.data());
      REQUIRE(b->x.capacity() == 4 * 4);  // the reserved capacity: never reallocated
    }
    REQUIRE(k == 4);  // 16 samples per rank
  }
  REQUIRE(slots_seen.size() <= 3);  // prefetch + 1 reusable slots
}

TEST_CASE("loader can be destroyed mid-epoch or before any epoch", "[data][loader]") {
  const Dataset ds = numbered_dataset(1000, 8);
  const Indices order = ddp::random_permutation(1000, 1);
  for (int64_t prefetch : {0, 1, 4}) {
    Loader loader(ds, 7, false, prefetch, 3);
    loader.start_epoch(order);
    REQUIRE(loader.next() != nullptr);
    REQUIRE(loader.next() != nullptr);
  }  // destructor with the workers blocked on a full ring
  { Loader idle(ds, 7, false, 2); }
  for (int workers : {1, 4}) {
    Loader loader(ds, 7, false, 2, workers);
    loader.start_epoch(order);
  }  // destructor while workers may be mid-fill
  SUCCEED("no hang");
}

TEST_CASE("loader surfaces worker errors in next()", "[data][loader]") {
  const Dataset ds = numbered_dataset(10, 2);
  const int workers = GENERATE(1, 3);
  INFO("workers " << workers);
  Loader loader(ds, 5, false, 4, workers);
  const Indices bad = {0, 1, 2, 3, 4, 5, 6, 10, 8, 9};
  loader.start_epoch(bad);
  // Give the worker time to reach the bad batch: the good batch before it must still arrive.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const Batch* first = loader.next();  // batches before the bad one still arrive
  REQUIRE(first != nullptr);
  require_batch(*first, ds, bad, 5, 0);
  REQUIRE_THROWS_WITH(loader.next(),
                      Contains("index 10 at position 7") && Contains("numbered (size 10)"));
  REQUIRE_THROWS_AS(loader.next(), ddp::Error);  // stays failed until the next epoch

  loader.start_epoch({3, -1});
  REQUIRE_THROWS_WITH(loader.next(), Contains("index -1 at position 1"));

  const Indices good = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
  loader.start_epoch(good);  // recovers
  REQUIRE(drain_and_check(loader, ds, good, 5) == 2);
}

TEST_CASE("loader with several workers reports the first failure in batch order",
          "[data][loader]") {
  const Dataset ds = numbered_dataset(40, 2);
  // Batch 1 fails (index 40 at position 5) and so does batch 3 (index -2 at position 12):
  // whichever worker fails first, batch 0 arrives and batch 1's error is the one reported.
  Indices order(20);
  for (int64_t i = 0; i < 20; ++i) order[static_cast<size_t>(i)] = i;
  order[5] = 40;
  order[12] = -2;
  for (int trial = 0; trial < 20; ++trial) {
    Loader loader(ds, 4, false, 4, 4);
    loader.start_epoch(order);
    if (trial % 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const Batch* first = loader.next();
    REQUIRE(first != nullptr);
    require_batch(*first, ds, order, 4, 0);
    REQUIRE_THROWS_WITH(loader.next(), Contains("index 40 at position 5"));
    REQUIRE_THROWS_WITH(loader.next(), Contains("index 40 at position 5"));
  }
}

TEST_CASE("loader rejects bad arguments and misuse", "[data][loader]") {
  const Dataset ds = numbered_dataset(4, 2);
  REQUIRE_THROWS_WITH(Loader(ds, 0, false, 1), Contains("batch_size must be positive, got 0"));
  REQUIRE_THROWS_WITH(Loader(ds, 2, false, -1), Contains("prefetch must be non-negative, got -1"));
  REQUIRE_THROWS_WITH(Loader(ds, 2, false, 1, 0), Contains("workers must be at least 1, got 0"));
  Dataset broken = ds;
  broken.y.pop_back();
  REQUIRE_THROWS_WITH(Loader(broken, 2, false, 1),
                      Contains("dataset numbered is inconsistent") && Contains("3 labels"));
  Loader loader(ds, 2, false, 1);
  REQUIRE_THROWS_WITH(loader.next(), Contains("next() called before start_epoch()"));
}

TEST_CASE("loader wait_seconds accumulates time blocked in next()", "[data][loader]") {
  const Dataset ds = numbered_dataset(2000, 64);
  Loader loader(ds, 16, false, 2);
  REQUIRE(loader.wait_seconds() == 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  loader.start_epoch(ddp::random_permutation(2000, 3));
  int64_t batches = 0;
  while (loader.next() != nullptr) ++batches;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(batches == 125);
  REQUIRE(loader.wait_seconds() >= 0.0);
  REQUIRE(loader.wait_seconds() <= elapsed);
}

TEST_CASE("Loader converts bytes and normalises while assembling: the float32 copy's batches",
          "[data][loader]") {
  // IDX-style bytes read as v / 255, then (x - mean) / std: what a normalised float32 copy of
  // the data set held, value for value.
  const int64_t n = 23, f = 5;
  std::vector<uint8_t> bytes(static_cast<size_t>(n * f));
  for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = static_cast<uint8_t>((k * 37 + 11) % 256);
  Dataset ds;
  ds.size = n;
  ds.features = f;
  ds.source = "bytes";
  ds.x = ddp::FeatureStore::scaled_bytes(bytes);
  for (int64_t i = 0; i < n; ++i) ds.y.push_back(static_cast<int32_t>(i % 3));
  ds.transform.mean = {0.5f, 0.25f, 0.0f, 0.75f, 0.1f};
  ds.transform.std = {0.3f, 1.0f, 2.0f, 0.7f, 0.01f};
  std::vector<float> want(bytes.size());
  for (size_t k = 0; k < bytes.size(); ++k) {
    const size_t j = k % static_cast<size_t>(f);
    const float x = static_cast<float>(bytes[k]) / 255.0f;
    want[k] = (x - ds.transform.mean[j]) / ds.transform.std[j];
  }
  REQUIRE(ds.x.bytes() == bytes.size());
  Indices order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = (i * 7) % n;
  Loader loader(ds, 4, false, 2);
  loader.start_epoch(order);
  int64_t rows = 0;
  while (const Batch* b = loader.next()) {
    for (int64_t r = 0; r < b->rows; ++r) {
      const int64_t i = order[static_cast<size_t>(b->index * 4 + r)];
      for (int64_t j = 0; j < f; ++j)
        REQUIRE(b->x[static_cast<size_t>(r * f + j)] == want[static_cast<size_t>(i * f + j)]);
    }
    rows += b->rows;
  }
  REQUIRE(rows == n);
}

TEST_CASE("loader refuses a NaN or an infinity in a batch, naming the sample and the feature",
          "[data][loader]") {
  Dataset ds = numbered_dataset(10, 3);
  std::vector<float> x = ds.x.floats();
  const Indices order = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (const float bad : {NAN, INFINITY, -INFINITY}) {
    x[7 * 3 + 2] = bad;  // sample 7, feature 2
    ds.x = ddp::FeatureStore(x);
    Loader loader(ds, 4, false, 2);
    loader.start_epoch(order);
    const Batch* first = loader.next();  // the batch before the bad one arrives
    REQUIRE(first != nullptr);
    require_batch(*first, ds, order, 4, 0);
    const std::string name = std::isnan(bad) ? "nan" : bad > 0 ? "inf" : "-inf";
    REQUIRE_THROWS_WITH(loader.next(), Contains("numbered: sample 7, feature 2 is " + name +
                                                " (features must be finite)"));
    loader.start_epoch({0, 1, 2, 3, 4, 5, 6, 8, 9});  // without sample 7, it trains on
    int64_t rows = 0;
    while (const Batch* b = loader.next()) rows += b->rows;
    CHECK(rows == 9);
  }
}

TEST_CASE("loader refuses a normalisation that overflows, naming the value and the transform",
          "[data][loader]") {
  Dataset ds = numbered_dataset(4, 3);  // sample 1, feature 0 is 100
  ds.transform.mean = {0.0f, 0.0f, 0.0f};
  ds.transform.std = {1e-38f, 1.0f, 1.0f};
  Loader loader(ds, 2, false, 0);
  loader.start_epoch({0, 1, 2, 3});
  REQUIRE_THROWS_WITH(loader.next(),
                      Contains("numbered: sample 1, feature 0 is 100, which data.normalize (mean "
                               "0, std 1e-38) turns into inf"));
}
