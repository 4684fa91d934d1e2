// NumPy .npy files (numpy.lib.format, versions 1.0-3.0): a strict header parser, a read-only
// memory map that never reads the array whole (it may be larger than RAM), and a writer whose
// bytes equal numpy.save's. Every refusal names the file and the header field at fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

/// The element types we read and write: little-endian integers and IEEE floats.
enum class NpyType { U8, I8, U16, I16, U32, I32, U64, I64, F16, F32, F64 };

/// numpy's descr of the type as numpy.save writes it: "|u1", "<i4", "<f4", ...
const char* to_string(NpyType type);

/// Bytes per element (1, 2, 4 or 8).
size_t npy_item_size(NpyType type);

struct NpyHeader {
  NpyType type = NpyType::F32;
  std::vector<int64_t> shape;  ///< C order, at least one dimension, each >= 0
  size_t data_offset = 0;      ///< bytes from the start of the file to the first element
  uint64_t elements = 0;       ///< product of shape
  uint64_t data_bytes = 0;     ///< elements * item size; data_offset + data_bytes cannot overflow
};

/// Parses the preamble and header dict at the start of `bytes` (`size` bytes, the file's start)
/// of `file`, which is used in messages only. Accepts what numpy.save writes: versions 1, 2 and 3,
/// keys 'descr', 'fortran_order' and 'shape' in any order. Throws ddp::Error naming the file and
/// the field for: wrong magic, unsupported version, truncated header, a header that is not a
/// dict, a missing, repeated or unknown key, any dtype but the NpyType ones in little-endian (or
/// native, or not-applicable) byte order, fortran_order True, a shape that is not a non-empty
/// tuple of non-negative integers or whose byte size overflows, and a data offset that is not a
/// multiple of the item size. Does not check that `size` holds the data.
NpyHeader parse_npy_header(const std::string& file, const uint8_t* bytes, size_t size);

/// How the pages of a mapping are read on a fault.
enum class NpyAccess {
  Default,  ///< with the kernel's read-around: the device's read-ahead window around the page
  /// The faulting page alone (MADV_RANDOM), for rows read in no order (a shuffled sampler's):
  /// the window around each fault would evict pages still to be read when the file is larger
  /// than the memory the job may use. Read-ahead is then the reader's (FeatureStore::will_need).
  Random,
};

/// A read-only memory map of a whole .npy file. open() checks the header and that the file holds
/// exactly the array (data_offset + data_bytes bytes). Move-only; unmaps in the destructor.
class NpyFile {
 public:
  /// Maps `path`; throws ddp::Error naming it (cannot open, not a regular file, any header error,
  /// truncated data with the expected and actual sizes, trailing bytes after the array).
  static NpyFile open(const std::string& path, NpyAccess access = NpyAccess::Default);

  NpyFile() = default;
  ~NpyFile();
  NpyFile(NpyFile&& other) noexcept;
  NpyFile& operator=(NpyFile&& other) noexcept;
  NpyFile(const NpyFile&) = delete;
  NpyFile& operator=(const NpyFile&) = delete;

  const std::string& path() const { return path_; }
  const NpyHeader& header() const { return header_; }
  NpyType type() const { return header_.type; }
  /// The first element, aligned to the item size; valid while this object lives. Pages are read
  /// on first touch. nullptr only for an empty array.
  const void* data() const {
    return base_ != nullptr && data_bytes() > 0 ? base_ + header_.data_offset : nullptr;
  }
  uint64_t data_bytes() const { return header_.data_bytes; }
  /// shape[0]: samples, for a features or labels file.
  int64_t rows() const { return header_.shape.empty() ? 0 : header_.shape[0]; }
  /// Product of shape[1:] (1 for a 1-D array): elements per sample, 784 for [n, 28, 28].
  int64_t row_elements() const { return row_elements_; }

 private:
  void release();
  std::string path_;
  const uint8_t* base_ = nullptr;  // the mapping of the whole file
  size_t mapped_ = 0;
  NpyHeader header_;
  int64_t row_elements_ = 0;
};

/// A shape as numpy prints it, for messages: "(60000, 28, 28)", "(60000,)".
std::string npy_shape_repr(const std::vector<int64_t>& shape);

/// The preamble and header numpy.save writes for a C-order array of `type` and `shape`
/// (version 1.0 unless the header needs 2.0; padded with spaces and a final '\n' so the data
/// starts at a multiple of 64 bytes). write_npy writes this, then the data.
std::string npy_header(NpyType type, const std::vector<int64_t>& shape);

/// Writes `data` (product(shape) elements of `type`, C order, host = little-endian byte order)
/// as a .npy file that atomically replaces `path` (temp file, fsync, rename). Throws ddp::Error
/// naming the path for an empty or negative shape, a byte size that overflows, or an OS error;
/// the old file at `path` is then left intact.
void write_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
               const void* data);

}  // namespace ddp
