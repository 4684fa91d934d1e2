// A Dataset as one flat block (dataset_image.h).
#include "data/dataset_image.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/check.h"

namespace ddp {

namespace {

constexpr uint64_t kMagic = 0x3141544144504444;  // "DDPDATA1", little-endian

struct Header {
  uint64_t magic, size, features, type, labels, source_bytes;
};

constexpr size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Where each part starts.
struct Layout {
  size_t source, labels, features, end;
};

Layout layout(size_t source_bytes, size_t labels, size_t feature_bytes) {
  Layout l{};
  l.source = sizeof(Header);
  l.labels = round_up(l.source + source_bytes, alignof(int32_t));
  l.features = round_up(l.labels + labels * sizeof(int32_t), 64);
  l.end = l.features + feature_bytes;
  return l;
}

}  // namespace

size_t image_bytes(const Dataset& ds) {
  return layout(ds.source.size(), ds.y.size(), ds.x.bytes()).end;
}

void write_image(const Dataset& ds, void* out) {
  const Layout l = layout(ds.source.size(), ds.y.size(), ds.x.bytes());
  auto* base = static_cast<char*>(out);
  std::memset(base, 0, l.features);
  const Header h{kMagic,
                 static_cast<uint64_t>(ds.size),
                 static_cast<uint64_t>(ds.features),
                 static_cast<uint64_t>(ds.x.type()),
                 ds.y.size(),
                 ds.source.size()};
  std::memcpy(base, &h, sizeof h);
  // copy() rather than memcpy: an empty part (no labels) may have no pointer at all.
  std::copy(ds.source.begin(), ds.source.end(), base + l.source);
  std::copy(ds.y.begin(), ds.y.end(), reinterpret_cast<int32_t*>(base + l.labels));
  const auto* x = static_cast<const char*>(ds.x.data());
  std::copy(x, x + ds.x.bytes(), base + l.features);
}

Dataset view_image(const void* image, size_t bytes, std::shared_ptr<const void> keep) {
  Header h{};
  DDP_CHECK(bytes >= sizeof h, "data image: " << bytes << " bytes, shorter than its header");
  std::memcpy(&h, image, sizeof h);
  DDP_CHECK(h.magic == kMagic, "data image: not a data set image");
  const auto type = static_cast<FeatureType>(h.type);
  DDP_CHECK(type == FeatureType::F32 || type == FeatureType::U8Over255 || type == FeatureType::F16,
            "data image: unknown feature type " << h.type);
  const size_t count = static_cast<size_t>(h.size * h.features);
  const Layout l = layout(h.source_bytes, h.labels, count * feature_bytes(type));
  DDP_CHECK(l.end == bytes, "data image: " << bytes << " bytes, its header says " << l.end);
  const char* base = static_cast<const char*>(image);
  Dataset ds;
  ds.size = static_cast<int64_t>(h.size);
  ds.features = static_cast<int64_t>(h.features);
  ds.source.assign(base + l.source, h.source_bytes);
  const auto* labels = reinterpret_cast<const int32_t*>(base + l.labels);
  ds.y.assign(labels, labels + h.labels);
  ds.x = FeatureStore(type, base + l.features, count, std::move(keep));
  return ds;
}

}  // namespace ddp
