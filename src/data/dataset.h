// Datasets: features row-major [size, features] in their source's type (data/features.h),
// read as float32 (and normalised) a row at a time; labels as int32 [size]. Loaders for
// MNIST-style IDX files (.gz or raw), CSV and the seed tutorial's synthetic data; every failure
// names the file (and line/column) so a user can fix the input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/features.h"
#include "ddp/config.h"

namespace ddp {

/// data.normalize's transform: x' = (x - mean[j]) / std[j] for every feature j, in float32.
struct FeatureTransform {
  std::vector<float> mean, std;  ///< one per feature; both empty: features as read
  bool identity() const { return mean.empty(); }
};

struct Dataset {
  int64_t size = 0;        ///< samples
  int64_t features = 0;    ///< values per sample
  FeatureStore x;          ///< size*features, row-major, in the source's type
  std::vector<int32_t> y;  ///< size labels
  std::string source;      ///< human-readable origin for messages (file path, "synthetic(seed=0)")
  FeatureTransform transform;  ///< applied as rows are read (data/normalize.h)

  /// Rows [first, first + n) as the model sees them, into `out` (n * features floats):
  /// converted to float32, then transformed.
  void read_rows(int64_t first, int64_t n, float* out) const;
  /// Every row so (tests, small data).
  std::vector<float> rows() const;
};

/// Loads an MNIST/Fashion-MNIST IDX pair (gzipped or raw): images magic 0x00000803 [n, rows,
/// cols] ubyte, kept as bytes and read scaled to [0,1] by v/255, labels magic 0x00000801 [n] ubyte.
/// Throws ddp::Error naming the file for: cannot open, wrong magic, truncated header/data, count
/// mismatch, n == 0.
Dataset load_idx(const std::string& images_path, const std::string& labels_path);

/// The images of an IDX images file alone (no labels: y stays empty), as load_idx reads them.
Dataset load_idx_images(const std::string& images_path);

/// Maps a NumPy .npy pair: features of shape [samples, ...] (every element after the first
/// dimension is a feature: 784 for [n, 28, 28]) in C order as uint8 (read as v/255, like IDX
/// pixels), float16 or float32, and labels of shape [samples] of any integer dtype (widened to
/// int32). The features are read in place from the mapping as batches are assembled, never
/// whole: they may exceed memory, and every process mapping the file shares its page-cache
/// pages. Throws ddp::Error naming the file and field for any npy header or size error
/// (NpyFile::open), features of fewer than 2 dimensions, zero samples or features, another
/// dtype, labels not 1-D or not integers, a label no int32 holds, and a count mismatch.
/// An empty `labels_path` reads the features alone (y stays empty: data to predict on).
Dataset load_npy(const std::string& features_path, const std::string& labels_path);

/// Writes `ds` as the .npy pair load_npy reads back to the same floats and labels: features
/// [size, features] in their stored type (uint8, float16 or float32), labels as uint8 when every
/// one is in [0, 256), else int32; no labels file when `labels_path` is empty. Each file is
/// replaced atomically (write_npy). Throws ddp::Error for a normalised data set.
void save_npy(const Dataset& ds, const std::string& features_path, const std::string& labels_path);

/// Loads a CSV with rows "f1,...,fd,label" (label last, a non-negative integer), skipping the
/// first line when `header`. Trailing blank lines are ignored. Throws ddp::Error naming the file,
/// line and column for: cannot open, ragged row, non-numeric or non-finite field, bad label,
/// blank line before more data, zero rows.
/// With labeled false every field is a feature and y stays empty (data to predict on).
Dataset load_csv(const std::string& path, bool header, bool labeled = true);

/// `samples` rows of `features` standard-normal floats, then `samples` labels uniform in
/// [0, classes), all drawn in that order from one Rng(seed): fully determined by the seed.
Dataset make_synthetic(int64_t samples, int64_t features, int64_t classes, uint64_t seed);

/// Throws ddp::Error (prefixed with `what`, e.g. "data.train") unless ds has `features` floats
/// per sample and every label lies in [0, classes).
void check_dataset(const Dataset& ds, int64_t features, int64_t classes, const std::string& what);

/// Builds the train (is_test = false) or test split described by `data`, resolving relative
/// paths against data.dir (synthetic: seed data.seed for train, data.seed + 1 for test), then
/// check_dataset. Errors are prefixed with "data.train" / "data.test".
Dataset load_split(const DataConfig& data, const SplitSource& split, bool is_test, int64_t features,
                   int64_t classes);

}  // namespace ddp
