// A data set's features in the type its source stores them in (one byte per IDX pixel, float32
// for CSV and synthetic data, the dtype of a .npy file), converted to float32 row by row as batches
// are assembled: the same floats a float32 copy would hold, for a quarter of the memory from IDX.
// The bytes are immutable once loaded and shared by every copy of the store (and by the ranks of
// a node, in /dev/shm or a .npy file's mapping), so copying a Dataset copies no features.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

/// How a stored element becomes the float the model sees.
enum class FeatureType {
  F32,        ///< float32, as is
  U8Over255,  ///< an unsigned byte v, as float(v) / 255 (IDX pixels, scaled to [0, 1])
  F16,        ///< IEEE binary16, widened exactly
};

const char* to_string(FeatureType type);
size_t feature_bytes(FeatureType type);

/// The index of the first NaN or infinity among v[0, n), or n when every value is finite.
/// Vectorised: cheap enough for every value of every batch.
size_t first_non_finite(const float* v, size_t n);

class FeatureStore {
 public:
  FeatureStore() = default;
  /// Owns `values` (float32).
  explicit FeatureStore(std::vector<float> values);
  /// Owns `bytes`, each read as float(v) / 255.
  static FeatureStore scaled_bytes(std::vector<uint8_t> bytes);
  /// `count` elements of `type` at `data`, kept alive by `owner` (a mapping, shared memory).
  /// `file_backed`: `data` is a file's memory mapping, whose pages the kernel reads on first
  /// touch and may drop again (will_need() then starts their reads ahead).
  FeatureStore(FeatureType type, const void* data, size_t count, std::shared_ptr<const void> owner,
               bool file_backed = false);

  FeatureType type() const { return type_; }
  size_t size() const { return count_; }  ///< elements
  size_t bytes() const { return count_ * feature_bytes(type_); }
  const void* data() const { return data_; }
  bool file_backed() const { return file_backed_; }

  /// Elements [first, first + n) will be read soon: for a file-backed store, their pages not
  /// in memory are read now, in the background (madvise MADV_WILLNEED); otherwise nothing.
  void will_need(size_t first, size_t n) const;
  /// Whether the pages of elements [first, first + n) are in memory (mincore); always true for
  /// a store that is not file-backed. For a file the process may not write, the kernel reports
  /// only the pages this process has mapped, so a page another process read counts as absent.
  bool resident(size_t first, size_t n) const;

  /// The first element of [first, first + n) whose stored value is a NaN or an infinity (bytes
  /// never are), or first + n when there is none.
  size_t first_non_finite(size_t first, size_t n) const;

  /// Elements [first, first + n) as floats into `out`.
  void to_float(size_t first, size_t n, float* out) const;
  /// Element i as a float.
  float operator[](size_t i) const;
  /// Every element as a float (tests, small data).
  std::vector<float> floats() const;

 private:
  FeatureType type_ = FeatureType::F32;
  const void* data_ = nullptr;
  size_t count_ = 0;
  std::shared_ptr<const void> owner_;
  bool file_backed_ = false;
};

/// Throws ddp::Error "<source>: sample i, feature j is nan (features must be finite)" for the
/// first NaN or infinity stored in rows [first, first + n) of `x` (`features` elements a row),
/// which are read in order, a file's pages ahead of the scan.
void require_finite_rows(const FeatureStore& x, int64_t features, int64_t first, int64_t n,
                         const std::string& source);

}  // namespace ddp
