// Data sets as NumPy .npy pairs: features memory-mapped and read in place, labels widened to
// int32; and the pair written back from any data set (ddp-train convert).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>

#include "core/check.h"
#include "data/dataset.h"
#include "data/npy.h"

namespace ddp {

namespace {

std::string where(const std::string& file) { return "npy file '" + file + "'"; }

FeatureType feature_type(const NpyFile& f) {
  switch (f.type()) {
    case NpyType::U8:
      return FeatureType::U8Over255;
    case NpyType::F16:
      return FeatureType::F16;
    case NpyType::F32:
      return FeatureType::F32;
    default:
      break;
  }
  DDP_THROW(where(f.path()) << ": descr '" << to_string(f.type())
                            << "': features must be uint8 (read as v/255), float16 or float32; "
                               "save them with x.astype(numpy.float32)");
}

// The features file, mapped: [samples, ...] with at least one sample of at least one value.
std::shared_ptr<const NpyFile> map_features(const std::string& path) {
  auto f = std::make_shared<NpyFile>(NpyFile::open(path, NpyAccess::Random));
  const auto& shape = f->header().shape;
  DDP_CHECK(shape.size() >= 2, where(path) << ": shape " << npy_shape_repr(shape)
                                           << ": features need (samples, features...); for one "
                                              "feature per sample save x.reshape(-1, 1)");
  DDP_CHECK(f->rows() > 0, where(path) << ": shape " << npy_shape_repr(shape) << ": zero samples");
  DDP_CHECK(f->row_elements() > 0,
            where(path) << ": shape " << npy_shape_repr(shape) << ": samples of zero features");
  feature_type(*f);  // refuses other dtypes before anything is read
  return f;
}

template <typename T>
void widen_labels(const NpyFile& f, std::vector<int32_t>& y) {
  const auto* v = static_cast<const T*>(f.data());
  y.resize(static_cast<size_t>(f.rows()));
  for (size_t i = 0; i < y.size(); ++i) {
    // Negative labels stay negative (check_dataset names them against the class count); only
    // values no int32 holds are refused here.
    bool fits = false;
    if constexpr (std::is_signed_v<T>) {
      fits = static_cast<int64_t>(v[i]) >= std::numeric_limits<int32_t>::min() &&
             static_cast<int64_t>(v[i]) <= std::numeric_limits<int32_t>::max();
    } else {
      fits = static_cast<uint64_t>(v[i]) <= uint64_t{std::numeric_limits<int32_t>::max()};
    }
    DDP_CHECK(fits, where(f.path()) << ": label " << +v[i] << " at sample " << i
                                    << " does not fit a 32-bit class index");
    y[i] = static_cast<int32_t>(v[i]);
  }
}

// The labels file: [samples] of an integer dtype, widened to int32.
std::vector<int32_t> read_labels(const std::string& path) {
  const NpyFile f = NpyFile::open(path);
  const auto& shape = f.header().shape;
  DDP_CHECK(shape.size() == 1, where(path) << ": shape " << npy_shape_repr(shape)
                                           << ": labels need (samples,); save y.reshape(-1)");
  std::vector<int32_t> y;
  switch (f.type()) {
    case NpyType::U8:
      widen_labels<uint8_t>(f, y);
      break;
    case NpyType::I8:
      widen_labels<int8_t>(f, y);
      break;
    case NpyType::U16:
      widen_labels<uint16_t>(f, y);
      break;
    case NpyType::I16:
      widen_labels<int16_t>(f, y);
      break;
    case NpyType::U32:
      widen_labels<uint32_t>(f, y);
      break;
    case NpyType::I32:
      widen_labels<int32_t>(f, y);
      break;
    case NpyType::U64:
      widen_labels<uint64_t>(f, y);
      break;
    case NpyType::I64:
      widen_labels<int64_t>(f, y);
      break;
    default:
      DDP_THROW(where(path) << ": descr '" << to_string(f.type())
                            << "': labels must be integers (class indices); save them with "
                               "y.astype(numpy.int64)");
  }
  return y;
}

}  // namespace

Dataset load_npy(const std::string& features_path, const std::string& labels_path) {
  std::shared_ptr<const NpyFile> f = map_features(features_path);
  Dataset ds;
  ds.size = f->rows();
  ds.features = f->row_elements();
  ds.source = features_path;
  if (!labels_path.empty()) {
    ds.y = read_labels(labels_path);
    DDP_CHECK(static_cast<int64_t>(ds.y.size()) == f->rows(),
              "sample/label count mismatch: "
                  << where(features_path) << " has " << f->rows() << " samples (shape "
                  << npy_shape_repr(f->header().shape) << ") but " << where(labels_path) << " has "
                  << ds.y.size() << " labels");
    ds.source += " (labels " + labels_path + ")";
  }
  const FeatureType type = feature_type(*f);
  const void* data = f->data();
  const auto count = static_cast<size_t>(f->header().elements);
  // The mapping lives as long as the store.
  ds.x = FeatureStore(type, data, count, std::move(f), /*file_backed=*/true);
  return ds;
}

void save_npy(const Dataset& ds, const std::string& features_path, const std::string& labels_path) {
  DDP_CHECK(ds.transform.identity(), ds.source << ": convert writes features as stored, "
                                               << "before data.normalize");
  NpyType type = NpyType::F32;
  if (ds.x.type() == FeatureType::U8Over255) type = NpyType::U8;
  if (ds.x.type() == FeatureType::F16) type = NpyType::F16;
  write_npy(features_path, type, {ds.size, ds.features}, ds.x.data());
  if (labels_path.empty()) return;
  DDP_CHECK(static_cast<int64_t>(ds.y.size()) == ds.size, ds.source << ": no labels to write");
  const bool bytes =
      std::all_of(ds.y.begin(), ds.y.end(), [](int32_t v) { return v >= 0 && v < 256; });
  if (!bytes) return write_npy(labels_path, NpyType::I32, {ds.size}, ds.y.data());
  const std::vector<uint8_t> narrow(ds.y.begin(), ds.y.end());
  write_npy(labels_path, NpyType::U8, {ds.size}, narrow.data());
}

}  // namespace ddp
