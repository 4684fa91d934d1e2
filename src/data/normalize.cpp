// Feature normalisation (normalize.h).
#include "data/normalize.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "data/features.h"

namespace ddp {

namespace {

constexpr const char* kMeanKey = "ddp.normalize.mean";
constexpr const char* kStdKey = "ddp.normalize.std";

// Rows read in order, a chunk at a time: a file-backed store (a .npy mapping, advised for the
// training's random order) reads the next chunk's pages ahead, in the background.
constexpr int64_t kAheadRows = 1024;
void read_ahead(const Dataset& ds, int64_t i) {
  if (i % kAheadRows != 0) return;
  const auto d = static_cast<size_t>(ds.features);
  if (i == 0) ds.x.will_need(0, static_cast<size_t>(kAheadRows) * d);
  ds.x.will_need(static_cast<size_t>(i + kAheadRows) * d, static_cast<size_t>(kAheadRows) * d);
}

// Each feature's mean and population standard deviation over the rows of `ds`, in double.
// The features as stored, converted row by row (not through ds.transform). A NaN or an
// infinity, which would turn every value of its feature into nan, is refused by name.
void feature_moments(const Dataset& ds, std::vector<double>& mean, std::vector<double>& std) {
  const int64_t n = ds.size, d = ds.features;
  mean.assign(d, 0.0);
  std.assign(d, 0.0);
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t i = 0; i < n; ++i) {
    read_ahead(ds, i);
    ds.x.to_float(static_cast<size_t>(i * d), row.size(), row.data());
    if (first_non_finite(row.data(), row.size()) != row.size())
      require_finite_rows(ds.x, d, i, 1, ds.source);
    for (int64_t j = 0; j < d; ++j) mean[j] += row[j];
  }
  for (int64_t j = 0; j < d; ++j) mean[j] /= static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) {
    read_ahead(ds, i);
    ds.x.to_float(static_cast<size_t>(i * d), row.size(), row.data());
    for (int64_t j = 0; j < d; ++j) {
      const double c = row[j] - mean[j];
      std[j] += c * c;
    }
  }
  for (int64_t j = 0; j < d; ++j) std[j] = std::sqrt(std[j] / static_cast<double>(n));
}

std::string json_floats(const std::vector<float>& v) {
  std::string out = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v[i]));
    out += (i ? "," : "") + std::string(buf);
  }
  return out + "]";
}

// The JSON list under `key`: `features` finite floats, each also a normal float > 0 when
// `positive` (a std: the compute thread flushes denormals, which would divide by 0).
std::vector<float> read_floats(const std::map<std::string, std::string>& metadata, const char* key,
                               const std::string& where, int64_t features, bool positive) {
  const auto it = metadata.find(key);
  DDP_CHECK(it != metadata.end(), where << ": metadata '" << key << "' is missing");
  nlohmann::json list;
  try {
    list = nlohmann::json::parse(it->second);
  } catch (const std::exception&) {  // left null: refused below, as not a list
  }
  const auto is_number = [](const nlohmann::json& v) { return v.is_number(); };
  DDP_CHECK(list.is_array() && std::all_of(list.begin(), list.end(), is_number),
            where << ": metadata '" << key << "' is not a list of numbers");
  DDP_CHECK(static_cast<int64_t>(list.size()) == features,
            where << ": metadata '" << key << "' has " << list.size() << " values, the model "
                  << features << " input features");
  std::vector<float> out;
  for (const nlohmann::json& v : list) {
    // Compared in double first: a value beyond float's range has no float to become.
    const auto d = v.get<double>();
    const bool in_range = std::abs(d) <= std::numeric_limits<float>::max();
    const float f = in_range ? static_cast<float>(d) : 0.0f;
    DDP_CHECK(in_range && (!positive || f >= std::numeric_limits<float>::min()),
              where << ": metadata '" << key << "' entry " << out.size() << " is " << v.dump()
                    << (positive ? " (must be a normal float > 0)" : " (must be a finite float)"));
    out.push_back(f);
  }
  return out;
}

}  // namespace

FeatureTransform fit_normalization(const Normalization& n, const Dataset& train) {
  FeatureTransform t;
  if (n.mode == Normalization::Mode::None) return t;
  const auto d = static_cast<size_t>(train.features);
  if (n.mode == Normalization::Mode::Fixed) {
    t.mean.assign(d, static_cast<float>(n.mean));
    t.std.assign(d, static_cast<float>(n.std));
    return t;
  }
  std::vector<double> mean, std;
  feature_moments(train, mean, std);
  for (size_t j = 0; j < d; ++j) {
    t.mean.push_back(static_cast<float>(mean[j]));
    const auto s = static_cast<float>(std[j]);
    t.std.push_back(s > 0.0f ? s : 1.0f);
  }
  return t;
}

void apply_normalization(const FeatureTransform& t, Dataset& ds) {
  DDP_CHECK(
      t.identity() || static_cast<int64_t>(t.mean.size()) == ds.features,
      ds.source << ": " << ds.features << " features, the normalisation has " << t.mean.size());
  ds.transform = t;
}

std::map<std::string, std::string> normalization_metadata(const FeatureTransform& t) {
  if (t.identity()) return {};
  return {{kMeanKey, json_floats(t.mean)}, {kStdKey, json_floats(t.std)}};
}

FeatureTransform normalization_from_metadata(const std::map<std::string, std::string>& metadata,
                                             const std::string& where, int64_t features) {
  FeatureTransform t;
  if (metadata.count(kMeanKey) == 0 && metadata.count(kStdKey) == 0) return t;
  t.mean = read_floats(metadata, kMeanKey, where, features, /*positive=*/false);
  t.std = read_floats(metadata, kStdKey, where, features, /*positive=*/true);
  return t;
}

}  // namespace ddp
