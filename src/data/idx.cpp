// MNIST-format IDX reader. zlib's gzread reads gzipped and raw files alike, so one path serves
// both; every check names the file, because a wrong or half-downloaded file is the usual cause.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "core/check.h"
#include "core/input_file.h"
#include "core/stop_flag.h"
#include "data/dataset.h"

namespace ddp {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr size_t kChunk = size_t{1} << 20;
// Most pixels a set may claim: their float copy must be addressable.
constexpr uint64_t kMaxPixels = uint64_t{PTRDIFF_MAX} / sizeof(float);

std::string hex32(uint32_t v) {
  std::ostringstream oss;
  oss << "0x" << std::hex << std::setw(8) << std::setfill('0') << v;
  return oss.str();
}

/// RAII gzFile; throws naming the path when it cannot be opened or is not a regular file.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    InputFile input(path, path);
    errno = 0;
    file_ = gzdopen(input.fd(), "rb");
    DDP_CHECK(file_ != nullptr, path << ": cannot open ("
                                     << (errno ? std::strerror(errno) : "gzdopen failed") << ")");
    input.release();  // gzclose closes it
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  /// Reads up to n bytes (fewer only at end of file); throws on a decompression error.
  size_t read(unsigned char* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      throw_if_stopped("reading " + path_);  // a one-shot command stops within a chunk
      const unsigned want = static_cast<unsigned>(std::min(n - got, kChunk));
      const int r = gzread(file_, dst + got, want);
      if (r < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        DDP_THROW(path_ << ": read error after " << got << " bytes (" << msg << ")");
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

/// Reads the magic and `dims` big-endian sizes; checks the magic against `expected`.
std::vector<uint32_t> read_header(GzReader& in, const std::string& path, uint32_t expected,
                                  const char* kind, int dims) {
  const size_t header_bytes = 4 + 4 * static_cast<size_t>(dims);
  unsigned char buf[16];
  size_t got = in.read(buf, 4);
  DDP_CHECK(got == 4,
            path << ": truncated header: expected " << header_bytes << " bytes, got " << got);
  const uint32_t magic = be32(buf);
  if (magic != expected) {
    const bool swapped = magic == (expected == kImagesMagic ? kLabelsMagic : kImagesMagic);
    DDP_THROW(path << ": wrong magic number " << hex32(magic) << ", expected " << hex32(expected)
                   << " (IDX " << kind << ")"
                   << (swapped ? "; the images and labels files look swapped"
                               : "; is this an IDX file?"));
  }
  got += in.read(buf + 4, header_bytes - 4);
  DDP_CHECK(got == header_bytes,
            path << ": truncated header: expected " << header_bytes << " bytes, got " << got);
  std::vector<uint32_t> sizes;
  for (int d = 0; d < dims; ++d) sizes.push_back(be32(buf + 4 + 4 * d));
  return sizes;
}

/// Reads exactly n payload bytes, growing the buffer as data arrives so a corrupt header that
/// claims a huge size fails with "truncated" rather than a giant allocation.
std::vector<unsigned char> read_payload(GzReader& in, const std::string& path, size_t n,
                                        size_t header_bytes) {
  std::vector<unsigned char> data;
  size_t got = 0;
  while (got < n) {
    const size_t want = std::min(n - got, kChunk);
    // Doubling up to exactly n: a whole file leaves no unused capacity (the bytes are kept).
    if (data.capacity() < got + want)
      data.reserve(std::min(n, std::max(2 * data.capacity(), got + want)));
    data.resize(got + want);
    const size_t r = in.read(data.data() + got, want);
    got += r;
    if (r < want) break;
  }
  DDP_CHECK(got == n, path << ": truncated data: expected " << n << " bytes after the "
                           << header_bytes << "-byte header, got " << got);
  return data;
}

}  // namespace

namespace {

// Samples and pixels per image from an images header, checked: at least one of each, and few
// enough to hold as floats. `labels` names the labels file in the message of an empty set.
std::pair<uint64_t, uint64_t> image_counts(const std::vector<uint32_t>& dims,
                                           const std::string& images_path,
                                           const std::string& labels) {
  // Unsigned 64-bit: rows * cols of two 32-bit fields cannot wrap; n * features is checked below.
  const uint64_t n = dims[0];
  const uint64_t features = uint64_t{dims[1]} * dims[2];
  DDP_CHECK(n > 0, images_path << ": zero samples" << labels);
  DDP_CHECK(features > 0, images_path << ": images are " << dims[1] << "x" << dims[2]
                                      << " pixels; need at least one");
  // The pixels become floats; a header whose product does not fit is corrupt, not just short.
  DDP_CHECK(features <= kMaxPixels / n,
            images_path << ": header claims " << n << " images of " << dims[1] << "x" << dims[2]
                        << " pixels, too many to hold in memory; corrupt header?");
  return {n, features};
}

// The images' pixels, kept as bytes and read scaled to [0, 1] by v / 255.
void read_pixels(GzReader& images, const std::string& images_path, uint64_t n, uint64_t features,
                 Dataset& ds) {
  auto pixels = read_payload(images, images_path, static_cast<size_t>(n * features), 16);
  ds.size = static_cast<int64_t>(n);
  ds.features = static_cast<int64_t>(features);
  ds.x = FeatureStore::scaled_bytes(std::move(pixels));
}

}  // namespace

Dataset load_idx(const std::string& images_path, const std::string& labels_path) {
  GzReader images(images_path);
  GzReader labels(labels_path);
  const auto img_dims = read_header(images, images_path, kImagesMagic, "images: ubyte, 3 dims", 3);
  const auto lbl_dims = read_header(labels, labels_path, kLabelsMagic, "labels: ubyte, 1 dim", 1);
  DDP_CHECK(img_dims[0] == lbl_dims[0],
            "image/label count mismatch: " << images_path << " has " << img_dims[0]
                                           << " images but " << labels_path << " has "
                                           << lbl_dims[0] << " labels");
  const auto [n, features] = image_counts(img_dims, images_path, " (labels " + labels_path + ")");
  Dataset ds;
  read_pixels(images, images_path, n, features, ds);
  const auto label_bytes = read_payload(labels, labels_path, static_cast<size_t>(n), 8);
  ds.source = images_path + " (labels " + labels_path + ")";
  ds.y.assign(label_bytes.begin(), label_bytes.end());
  return ds;
}

Dataset load_idx_images(const std::string& images_path) {
  GzReader images(images_path);
  const auto dims = read_header(images, images_path, kImagesMagic, "images: ubyte, 3 dims", 3);
  const auto [n, features] = image_counts(dims, images_path, "");
  Dataset ds;
  read_pixels(images, images_path, n, features, ds);
  ds.source = images_path;
  return ds;
}

}  // namespace ddp
