// Dataset checks against the model shape, and building a split from the data config: the one
// place that knows which config fields each format reads.
#include "data/dataset.h"

#include <filesystem>

#include "core/check.h"

namespace ddp {

namespace {

/// data.dir joined with a relative path; absolute paths and an empty dir pass through.
std::string resolve(const DataConfig& data, const std::string& path) {
  const std::filesystem::path p(path);
  if (data.dir.empty() || p.is_absolute()) return path;
  return (std::filesystem::path(data.dir) / p).string();
}

Dataset load_source(const DataConfig& data, const SplitSource& split, bool is_test,
                    int64_t features, int64_t classes, const std::string& what) {
  switch (data.format) {
    case DataFormat::Idx:
      DDP_CHECK(!split.images.empty() && !split.labels.empty(),
                what << ": data.format is idx but " << what << ".images and " << what
                     << ".labels are not both set");
      return load_idx(resolve(data, split.images), resolve(data, split.labels));
    case DataFormat::Npy:
      DDP_CHECK(!split.features.empty() && !split.labels.empty(),
                what << ": data.format is npy but " << what << ".features and " << what
                     << ".labels are not both set");
      return load_npy(resolve(data, split.features), resolve(data, split.labels));
    case DataFormat::Csv:
      DDP_CHECK(!split.path.empty(),
                what << ": data.format is csv but " << what << ".path is not set");
      return load_csv(resolve(data, split.path), data.csv_header);
    case DataFormat::Synthetic:
      DDP_CHECK(split.samples > 0,
                what << ".samples: must be positive for synthetic data, got " << split.samples);
      return make_synthetic(split.samples, features, classes, data.seed + (is_test ? 1 : 0));
  }
  DDP_THROW("data.format: not a format (" << static_cast<int>(data.format) << ")");
}

}  // namespace

void Dataset::read_rows(int64_t first, int64_t n, float* out) const {
  DDP_CHECK(first >= 0 && n >= 0 && first <= size && n <= size - first,
            source << ": rows [" << first << ", " << first + n << ") of " << size);
  const auto d = static_cast<size_t>(features);
  x.to_float(static_cast<size_t>(first) * d, static_cast<size_t>(n) * d, out);
  if (transform.identity()) return;
  for (int64_t i = 0; i < n; ++i) {
    float* row = out + static_cast<size_t>(i) * d;
    for (size_t j = 0; j < d; ++j) row[j] = (row[j] - transform.mean[j]) / transform.std[j];
  }
}

std::vector<float> Dataset::rows() const {
  std::vector<float> out(static_cast<size_t>(size * features));
  read_rows(0, size, out.data());
  return out;
}

void check_dataset(const Dataset& ds, int64_t features, int64_t classes, const std::string& what) {
  DDP_CHECK(ds.features == features, what << ": " << ds.source << " has " << ds.features
                                          << " features per sample but model.layers[0] is "
                                          << features);
  for (size_t i = 0; i < ds.y.size(); ++i) {
    const int64_t label = ds.y[i];
    DDP_CHECK(label >= 0 && label < classes,
              what << ": " << ds.source << ": label " << label << " at sample " << i
                   << " is outside [0, " << classes << ") (model.layers[-1] = " << classes << ")");
  }
}

Dataset load_split(const DataConfig& data, const SplitSource& split, bool is_test, int64_t features,
                   int64_t classes) {
  const std::string what = is_test ? "data.test" : "data.train";
  Dataset ds;
  try {
    ds = load_source(data, split, is_test, features, classes, what);
  } catch (const Error& e) {
    // Loader messages name the file; the prefix adds which config entry pointed at it.
    if (e.message().rfind(what, 0) == 0 || e.message().rfind("data.format", 0) == 0) throw;
    DDP_THROW(what << ": " << e.message());
  }
  check_dataset(ds, features, classes, what);
  return ds;
}

}  // namespace ddp
