// Features in their source's type (features.h).
#include "data/features.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/float16.h"

namespace ddp {

const char* to_string(FeatureType type) {
  switch (type) {
    case FeatureType::F32:
      return "float32";
    case FeatureType::U8Over255:
      return "uint8 / 255";
    case FeatureType::F16:
      return "float16";
  }
  return "?";
}

size_t feature_bytes(FeatureType type) {
  switch (type) {
    case FeatureType::U8Over255:
      return 1;
    case FeatureType::F16:
      return 2;
    case FeatureType::F32:
      break;
  }
  return 4;
}

namespace {

// "nan", "inf" or "-inf": the sign of a NaN says nothing.
const char* non_finite_name(float v) {
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

// The index of the first of the `n` IEEE values at `data` that is a NaN or an infinity (its
// exponent bits all ones), or n. A block's largest magnitude, compared as bits, tells whether
// the block holds one: a max reduction the compiler vectorises.
template <typename Bits>
size_t first_all_ones_exponent(const void* data, size_t n, Bits exponent, Bits magnitude) {
  constexpr size_t kBlock = 256;
  const auto* bytes = static_cast<const unsigned char*>(data);
  const auto bits = [bytes](size_t i) {
    Bits b;
    std::memcpy(&b, bytes + i * sizeof(Bits), sizeof b);
    return b;
  };
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = std::min(n, begin + kBlock);
    Bits largest = 0;
    for (size_t i = begin; i < end; ++i) largest = std::max<Bits>(largest, bits(i) & magnitude);
    if (largest < exponent) continue;
    for (size_t i = begin; i < end; ++i) {
      if ((bits(i) & magnitude) >= exponent) return i;
    }
  }
  return n;
}

}  // namespace

size_t first_non_finite(const float* v, size_t n) {
  return first_all_ones_exponent<uint32_t>(v, n, 0x7f800000u, 0x7fffffffu);
}

FeatureStore::FeatureStore(std::vector<float> values) {
  auto owned = std::make_shared<const std::vector<float>>(std::move(values));
  data_ = owned->data();
  count_ = owned->size();
  owner_ = std::move(owned);
}

FeatureStore FeatureStore::scaled_bytes(std::vector<uint8_t> bytes) {
  auto owned = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  return FeatureStore(FeatureType::U8Over255, owned->data(), owned->size(), owned);
}

FeatureStore::FeatureStore(FeatureType type, const void* data, size_t count,
                           std::shared_ptr<const void> owner, bool file_backed)
    : type_(type), data_(data), count_(count), owner_(std::move(owner)), file_backed_(file_backed) {
  DDP_CHECK(data != nullptr || count == 0, "FeatureStore: no memory for " << count << " elements");
}

void FeatureStore::to_float(size_t first, size_t n, float* out) const {
  DDP_CHECK(first <= count_ && n <= count_ - first,
            "FeatureStore: elements [" << first << ", " << first + n << ") of " << count_);
  if (type_ == FeatureType::F32) {
    const float* from = static_cast<const float*>(data_) + first;
    std::copy(from, from + n, out);
    return;
  }
  if (type_ == FeatureType::F16) {
    const uint16_t* from = static_cast<const uint16_t*>(data_) + first;
    for (size_t i = 0; i < n; ++i) out[i] = fp16_to_float(from[i]);
    return;
  }
  // As the IDX reader always scaled: one float division, so the floats are those of before.
  const uint8_t* from = static_cast<const uint8_t*>(data_) + first;
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(from[i]) / 255.0f;
}

namespace {

/// The whole pages holding bytes [first * item, (first + n) * item) of `data`, clamped to
/// `count` elements: their start and length.
std::pair<uintptr_t, size_t> page_span(const void* data, size_t item, size_t count, size_t first,
                                       size_t n) {
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto* base = static_cast<const char*>(data);
  const auto begin = reinterpret_cast<uintptr_t>(base + first * item) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(base + std::min(first + n, count) * item);
  return {begin, end - begin};
}

}  // namespace

void FeatureStore::will_need(size_t first, size_t n) const {
  if (!file_backed_ || n == 0 || first >= count_) return;
  const auto [begin, bytes] = page_span(data_, feature_bytes(type_), count_, first, n);
  // A hint: a failure (an old kernel, memory pressure) only means the reads happen on touch.
  ::madvise(reinterpret_cast<void*>(begin), bytes, MADV_WILLNEED);
}

bool FeatureStore::resident(size_t first, size_t n) const {
  if (!file_backed_ || n == 0 || first >= count_) return true;
  static const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const auto [begin, bytes] = page_span(data_, feature_bytes(type_), count_, first, n);
  std::vector<unsigned char> in((bytes + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(begin), bytes, in.data()) != 0) return false;
  return std::all_of(in.begin(), in.end(), [](unsigned char v) { return (v & 1) != 0; });
}

size_t FeatureStore::first_non_finite(size_t first, size_t n) const {
  DDP_CHECK(first <= count_ && n <= count_ - first,
            "FeatureStore: elements [" << first << ", " << first + n << ") of " << count_);
  const size_t item = feature_bytes(type_);
  const void* from = static_cast<const char*>(data_) + first * item;
  if (type_ == FeatureType::F32)
    return first + first_all_ones_exponent<uint32_t>(from, n, 0x7f800000u, 0x7fffffffu);
  if (type_ == FeatureType::F16)
    return first + first_all_ones_exponent<uint16_t>(from, n, 0x7c00u, 0x7fffu);
  return first + n;
}

void require_finite_rows(const FeatureStore& x, int64_t features, int64_t first, int64_t n,
                         const std::string& source) {
  // In chunks, the next one's pages announced: a mapping advised for random reads reads no
  // pages ahead by itself.
  constexpr size_t kChunk = size_t{1} << 20;
  const auto row = static_cast<size_t>(features);
  const size_t begin = static_cast<size_t>(first) * row, end = begin + static_cast<size_t>(n) * row;
  x.will_need(begin, kChunk);
  for (size_t at = begin; at < end; at += kChunk) {
    x.will_need(at + kChunk, kChunk);
    const size_t count = std::min(kChunk, end - at);
    const size_t bad = x.first_non_finite(at, count);
    if (bad == at + count) continue;
    DDP_THROW(source << ": sample " << bad / row << ", feature " << bad % row << " is "
                     << non_finite_name(x[bad]) << " (features must be finite)");
  }
}

float FeatureStore::operator[](size_t i) const {
  float v = 0.0f;
  to_float(i, 1, &v);
  return v;
}

std::vector<float> FeatureStore::floats() const {
  std::vector<float> out(count_);
  to_float(0, count_, out.data());
  return out;
}

}  // namespace ddp
