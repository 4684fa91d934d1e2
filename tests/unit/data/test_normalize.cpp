// Feature normalisation: standardize against a double-precision reference, a fixed [mean, std],
// constant features, non-finite features refused, the metadata round trip (every float back
// exactly) and its refusals.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "core/check.h"
#include "core/random.h"
#include "data/dataset.h"
#include "data/normalize.h"
#include "test_helpers.h"

using ddp::Dataset;
using ddp::FeatureTransform;
using ddp::Normalization;

namespace {

Dataset random_dataset(int64_t n, int64_t d, uint64_t seed) {
  Dataset ds = ddp::make_synthetic(n, d, 3, seed);
  std::vector<float> x = ds.x.floats();
  for (int64_t i = 0; i < n; ++i) x[i * d + 1] = 3.0f * x[i * d + 1] + 7.0f;  // shifted
  for (int64_t i = 0; i < n; ++i) x[i * d + 2] = 0.5f;                        // constant
  ds.x = ddp::FeatureStore(std::move(x));
  return ds;
}

Normalization mode(Normalization::Mode m, double mean = 0.0, double std = 1.0) {
  Normalization n;
  n.mode = m;
  n.mean = mean;
  n.std = std;
  return n;
}

}  // namespace

TEST_CASE("normalize: standardize is each feature's mean and population std, in float",
          "[data][normalize]") {
  const Dataset train = random_dataset(501, 5, 3);
  const FeatureTransform t = ddp::fit_normalization(mode(Normalization::Mode::Standardize), train);
  REQUIRE(t.mean.size() == 5);
  for (int64_t j = 0; j < 5; ++j) {
    long double sum = 0, sq = 0;
    for (int64_t i = 0; i < train.size; ++i) sum += train.x[i * 5 + j];
    const long double mean = sum / train.size;
    for (int64_t i = 0; i < train.size; ++i) sq += std::pow(train.x[i * 5 + j] - mean, 2);
    const long double std = std::sqrt(sq / train.size);
    CHECK(t.mean[j] == static_cast<float>(mean));
    if (j == 2) {
      CHECK(t.std[j] == 1.0f);  // constant: std 0 becomes 1, the feature becomes 0
    } else {
      CHECK(t.std[j] == static_cast<float>(std));
    }
  }
  Dataset x = train;
  ddp::apply_normalization(t, x);
  const std::vector<float> rows = x.rows();  // read through the transform
  for (int64_t i = 0; i < x.size; ++i) {
    for (int64_t j = 0; j < 5; ++j)
      REQUIRE(rows[i * 5 + j] == (train.x[i * 5 + j] - t.mean[j]) / t.std[j]);
  }
  CHECK(rows[2] == 0.0f);
  CHECK(train.rows() == train.x.floats());  // the copy's transform is its own
  std::vector<float> row(5);
  x.read_rows(7, 1, row.data());
  CHECK(std::equal(row.begin(), row.end(), rows.begin() + 7 * 5));
}

TEST_CASE("normalize: standardize refuses a NaN or an infinity, naming sample and feature",
          "[data][normalize]") {
  Dataset train = random_dataset(40, 5, 3);
  train.source = "x.npy";
  std::vector<float> x = train.x.floats();
  x[33 * 5 + 4] = INFINITY;  // it would make every value of feature 4 nan
  train.x = ddp::FeatureStore(x);
  CHECK(ddp_test::error_of([&] {
          ddp::fit_normalization(mode(Normalization::Mode::Standardize), train);
        }) == "x.npy: sample 33, feature 4 is inf (features must be finite)");
  CHECK(ddp::fit_normalization(mode(Normalization::Mode::Fixed, 0.5, 2.0), train).mean.size() ==
        5);  // nothing read: the loader finds it in its batch
}

TEST_CASE("normalize: none is the identity, [mean, std] is the same for every feature",
          "[data][normalize]") {
  const Dataset train = random_dataset(10, 4, 1);
  CHECK(ddp::fit_normalization(Normalization{}, train).identity());
  Dataset same = train;
  ddp::apply_normalization(FeatureTransform{}, same);
  CHECK(same.rows() == train.x.floats());
  const FeatureTransform t =
      ddp::fit_normalization(mode(Normalization::Mode::Fixed, 0.25, 0.5), train);
  CHECK(t.mean == std::vector<float>(4, 0.25f));
  CHECK(t.std == std::vector<float>(4, 0.5f));
}

TEST_CASE("normalize: the metadata gives every float back; malformed metadata is refused",
          "[data][normalize]") {
  const FeatureTransform t =
      ddp::fit_normalization(mode(Normalization::Mode::Standardize), random_dataset(97, 6, 9));
  auto metadata = ddp::normalization_metadata(t);
  const FeatureTransform back = ddp::normalization_from_metadata(metadata, "m.safetensors", 6);
  CHECK(back.mean == t.mean);
  CHECK(back.std == t.std);
  CHECK(ddp::normalization_metadata(FeatureTransform{}).empty());
  CHECK(ddp::normalization_from_metadata({}, "m", 6).identity());
  using ddp_test::error_of;
  CHECK(error_of([&] { ddp::normalization_from_metadata(metadata, "m.safetensors", 7); }) ==
        "m.safetensors: metadata 'ddp.normalize.mean' has 6 values, the model 7 input features");
  auto broken = metadata;
  broken.erase("ddp.normalize.std");
  CHECK(error_of([&] { ddp::normalization_from_metadata(broken, "m", 6); }) ==
        "m: metadata 'ddp.normalize.std' is missing");
  broken = metadata;
  broken["ddp.normalize.std"] = "[1, 2, oops]";
  CHECK(error_of([&] { ddp::normalization_from_metadata(broken, "m", 6); }) ==
        "m: metadata 'ddp.normalize.std' is not a list of numbers");
  broken["ddp.normalize.std"] = "[1, 1, 1, 0, 1, 1]";
  CHECK(error_of([&] { ddp::normalization_from_metadata(broken, "m", 6); }) ==
        "m: metadata 'ddp.normalize.std' entry 3 is 0 (must be a normal float > 0)");
  broken["ddp.normalize.std"] = "[1, 1e-50, 1, 1, 1, 1]";  // 0 as a float
  CHECK(error_of([&] { ddp::normalization_from_metadata(broken, "m", 6); }) ==
        "m: metadata 'ddp.normalize.std' entry 1 is 1e-50 (must be a normal float > 0)");
  broken["ddp.normalize.std"] = "[1, 1, 1e-39, 1, 1, 1]";  // denormal: 0 once flushed
  CHECK(error_of([&] { ddp::normalization_from_metadata(broken, "m", 6); }) ==
        "m: metadata 'ddp.normalize.std' entry 2 is 1e-39 (must be a normal float > 0)");
  broken["ddp.normalize.std"] = "[1, 1, 1, 1, 1, -1e300]";
  CHECK(error_of([&] { ddp::normalization_from_metadata(broken, "m", 6); }) ==
        "m: metadata 'ddp.normalize.std' entry 5 is -1e+300 (must be a normal float > 0)");
  broken["ddp.normalize.std"] = "{\"a\": 1, \"b\": 1, \"c\": 1, \"d\": 1, \"e\": 1, \"f\": 1}";
  CHECK(error_of([&] { ddp::normalization_from_metadata(broken, "m", 6); }) ==
        "m: metadata 'ddp.normalize.std' is not a list of numbers");
  broken = metadata;
  broken["ddp.normalize.mean"] = "[0, 0, -3.5e38, 0, 0, 0]";  // the std's check said nothing of it
  CHECK(error_of([&] { ddp::normalization_from_metadata(broken, "m", 6); }) ==
        "m: metadata 'ddp.normalize.mean' entry 2 is -3.5e+38 (must be a finite float)");
  Dataset wrong = random_dataset(3, 4, 1);
  wrong.source = "w.csv";
  CHECK(error_of([&] { ddp::apply_normalization(t, wrong); }) ==
        "w.csv: 4 features, the normalisation has 6");
}
