// NumPy .npy reader (memory-mapped) and writer. The header is a Python dict literal; we parse the
// small subset numpy.save writes with an index-checked scanner instead of evaluating it, so a
// corrupt or hostile file can only ever produce a ddp::Error naming the file and the field.
#include "data/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/input_file.h"

namespace ddp {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
constexpr size_t kArrayAlign = 64;           // numpy's ARRAY_ALIGN
constexpr size_t kGrowthAxisDigits = 21;     // numpy's GROWTH_AXIS_MAX_DIGITS (numpy >= 1.24)
constexpr uint64_t kMaxBytes = PTRDIFF_MAX;  // an array must be addressable once mapped

struct TypeInfo {
  NpyType type;
  char kind;  // numpy's kind letter: 'u', 'i' or 'f'
  size_t size;
  const char* descr;
};

constexpr TypeInfo kTypes[] = {
    {NpyType::U8, 'u', 1, "|u1"},  {NpyType::I8, 'i', 1, "|i1"},  {NpyType::U16, 'u', 2, "<u2"},
    {NpyType::I16, 'i', 2, "<i2"}, {NpyType::U32, 'u', 4, "<u4"}, {NpyType::I32, 'i', 4, "<i4"},
    {NpyType::U64, 'u', 8, "<u8"}, {NpyType::I64, 'i', 8, "<i8"}, {NpyType::F16, 'f', 2, "<f2"},
    {NpyType::F32, 'f', 4, "<f4"}, {NpyType::F64, 'f', 8, "<f8"},
};

const TypeInfo& info(NpyType type) {
  for (const TypeInfo& t : kTypes) {
    if (t.type == type) return t;
  }
  DDP_THROW("invalid NpyType " << static_cast<int>(type));
}

// strchr would also match the terminating NUL, and a header may hold NUL bytes.
bool one_of(char c, const char* set) { return c != '\0' && std::strchr(set, c) != nullptr; }

std::string where(const std::string& file) { return "npy file '" + file + "'"; }

// Up to 40 bytes from `pos`, non-printable ones as \xNN, for messages about header syntax.
std::string excerpt(const std::string& text, size_t pos) {
  std::ostringstream out;
  const size_t end = std::min(text.size(), pos + 40);
  for (size_t i = pos; i < end; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out << text[i];
    } else {
      out << "\\x"
          << "0123456789abcdef"[c >> 4] << "0123456789abcdef"[c & 15];
    }
  }
  if (pos >= text.size()) return "end of header";
  return "'" + out.str() + (end < text.size() ? "...'" : "'");
}

// Bytes of one row (item size * product of shape[1:]) and of the whole array, checked so that
// neither, nor `offset` plus the array, exceeds kMaxBytes; `context` prefixes the refusal.
std::pair<uint64_t, uint64_t> checked_bytes(const std::vector<int64_t>& shape, size_t item,
                                            uint64_t offset, const std::string& context) {
  const uint64_t limit = kMaxBytes - std::min<uint64_t>(offset, kMaxBytes);
  uint64_t row = item;
  for (size_t i = 1; i < shape.size(); ++i) {
    const auto d = static_cast<uint64_t>(shape[i]);
    DDP_CHECK(d == 0 || row <= limit / d, context << "shape " << npy_shape_repr(shape)
                                                  << " is too large: its size in bytes overflows");
    row *= d;
  }
  const auto n = static_cast<uint64_t>(shape[0]);
  DDP_CHECK(row == 0 || n <= limit / row, context << "shape " << npy_shape_repr(shape)
                                                  << " is too large: its size in bytes overflows");
  return {row, row * n};
}

// ---------------------------------------------------------------------------------------------
// Header parsing

/// Scans the header dict. Every read goes through peek()/at_end(), which check the index.
class HeaderParser {
 public:
  HeaderParser(std::string file, std::string text)
      : file_(std::move(file)), text_(std::move(text)) {}

  NpyHeader parse() {
    skip_space();
    DDP_CHECK(peek() == '{', where(file_) << ": header is not a dict (it must start with '{'), got "
                                          << excerpt(text_, pos_));
    ++pos_;
    bool seen[3] = {false, false, false};
    NpyHeader header;
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      parse_entry(seen, &header);
      skip_space();
      if (peek() == ',') {
        ++pos_;
      } else {
        DDP_CHECK(peek() == '}', where(file_) << ": header dict: expected ',' or '}', got "
                                              << excerpt(text_, pos_));
      }
    }
    ++pos_;
    skip_space();
    DDP_CHECK(at_end(),
              where(file_) << ": header: unexpected text after the dict: " << excerpt(text_, pos_));
    const char* names[3] = {"descr", "fortran_order", "shape"};
    for (int k = 0; k < 3; ++k) {
      DDP_CHECK(seen[k], where(file_) << ": header field '" << names[k] << "' is missing");
    }
    return header;
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }
  // Python allows any whitespace inside braces; numpy pads with spaces and ends with '\n'.
  void skip_space() {
    while (!at_end() && one_of(text_[pos_], " \t\r\n\f")) ++pos_;
  }
  std::string field(const char* name) const {
    return where(file_) + ": header field '" + name + "': ";
  }

  void parse_entry(bool seen[3], NpyHeader* header) {
    DDP_CHECK(peek() == '\'' || peek() == '"', where(file_) << ": header dict: expected a quoted "
                                                            << "key, got " << excerpt(text_, pos_));
    const std::string key = parse_string("key");
    const int k = key == "descr" ? 0 : key == "fortran_order" ? 1 : key == "shape" ? 2 : -1;
    DDP_CHECK(k >= 0, where(file_) << ": header has unknown key '" << key
                                   << "' (a .npy header has exactly 'descr', 'fortran_order' and "
                                      "'shape')");
    DDP_CHECK(!seen[k], where(file_) << ": header field '" << key << "' appears more than once");
    seen[k] = true;
    skip_space();
    DDP_CHECK(peek() == ':', where(file_) << ": header dict: expected ':' after '" << key
                                          << "', got " << excerpt(text_, pos_));
    ++pos_;
    skip_space();
    if (k == 0) header->type = parse_descr();
    if (k == 1) parse_fortran_order();
    if (k == 2) header->shape = parse_shape();
  }

  // A Python string literal without escapes (numpy never writes any in these fields).
  std::string parse_string(const char* what) {
    const char quote = peek();
    const size_t start = ++pos_;
    while (!at_end() && text_[pos_] != quote && text_[pos_] != '\n') {
      DDP_CHECK(text_[pos_] != '\\', where(file_) << ": header: " << what << " string "
                                                  << excerpt(text_, start - 1)
                                                  << " has an escape sequence (not supported)");
      ++pos_;
    }
    DDP_CHECK(peek() == quote, where(file_) << ": header: unterminated " << what << " string "
                                            << excerpt(text_, start - 1));
    return text_.substr(start, pos_++ - start);
  }

  NpyType parse_descr() {
    DDP_CHECK(peek() != '[', field("descr") << "structured (record) dtypes are not supported; "
                                            << "save each field as its own plain array");
    DDP_CHECK(peek() == '\'' || peek() == '"', field("descr")
                                                   << "must be a dtype string such as '<f4', got "
                                                   << excerpt(text_, pos_));
    return descr_type(parse_string("descr"));
  }

  NpyType descr_type(const std::string& descr) const {
    const bool has_order = !descr.empty() && one_of(descr[0], "<>|=");
    const std::string code = has_order ? descr.substr(1) : descr;
    const char kind = code.empty() ? '\0' : code[0];
    const std::string digits = code.empty() ? "" : code.substr(1);
    const bool sized =
        !digits.empty() && digits.size() <= 2 &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    const size_t size = sized ? std::stoul(digits) : 0;
    const TypeInfo* found = nullptr;
    for (const TypeInfo& t : kTypes) {
      if (t.kind == kind && t.size == size) found = &t;
    }
    if (found == nullptr) refuse_dtype(descr, kind);
    if (has_order && descr[0] == '>' && found->size > 1) {
      DDP_THROW(field("descr") << "'" << descr << "' is big-endian, which is not supported; "
                               << "convert with a.astype('" << found->descr << "') and save again");
    }
    return found->type;
  }

  [[noreturn]] void refuse_dtype(const std::string& descr, char kind) const {
    const char* what = kind == 'O'           ? "object arrays hold pickled Python objects"
                       : kind == 'b'         ? "bool arrays: save a.astype('|u1') instead"
                       : kind == 'c'         ? "complex dtypes"
                       : one_of(kind, "SUa") ? "string and unicode dtypes"
                       : kind == 'V'         ? "void (raw bytes) dtypes"
                       : one_of(kind, "Mm")  ? "datetime and timedelta dtypes"
                       : one_of(kind, "iuf") ? "no such item size"
                                             : "unknown dtype";
    DDP_THROW(field("descr") << "'" << descr << "' is not supported (" << what
                             << "); expected one of |u1 |i1 <u2 <i2 <u4 <i4 <u8 <i8 <f2 <f4 <f8");
  }

  void parse_fortran_order() {
    size_t end = pos_;
    while (end < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[end])) || text_[end] == '_')) {
      ++end;
    }
    const std::string word = text_.substr(pos_, end - pos_);
    DDP_CHECK(word != "True", field("fortran_order")
                                  << "True (column-major) is not supported; save a C-order "
                                  << "array: np.save(path, np.ascontiguousarray(a))");
    DDP_CHECK(word == "False", field("fortran_order")
                                   << "must be True or False, got " << excerpt(text_, pos_));
    pos_ = end;
  }

  std::vector<int64_t> parse_shape() {
    const std::string expected = "must be a tuple of non-negative integers such as (60000, 784)";
    DDP_CHECK(peek() == '(', field("shape") << expected << ", got " << excerpt(text_, pos_));
    const size_t start = pos_++;
    std::vector<int64_t> shape;
    bool trailing_comma = false;
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      shape.push_back(parse_dimension(expected));
      skip_space();
      trailing_comma = peek() == ',';
      if (trailing_comma) {
        ++pos_;
      } else {
        DDP_CHECK(peek() == ')', field("shape") << expected << ", got " << excerpt(text_, start));
      }
    }
    ++pos_;
    DDP_CHECK(!shape.empty(), field("shape") << "() is a 0-d (scalar) array; need at least one "
                                             << "dimension (save np.atleast_1d(a))");
    DDP_CHECK(shape.size() > 1 || trailing_comma,
              field("shape") << "(" << shape[0] << ") is an integer, not a tuple; numpy writes ("
                             << shape[0] << ",)");
    return shape;
  }

  int64_t parse_dimension(const std::string& expected) {
    const size_t start = pos_;
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    DDP_CHECK(peek() >= '0' && peek() <= '9', field("shape")
                                                  << expected << ", got " << excerpt(text_, start));
    uint64_t value = 0;
    constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    bool too_large = false;
    while (peek() >= '0' && peek() <= '9') {
      const auto digit = static_cast<uint64_t>(peek() - '0');
      too_large = too_large || value > (kMax - digit) / 10;
      if (!too_large) value = value * 10 + digit;
      ++pos_;
    }
    if (peek() == 'L') ++pos_;  // Python 2 long literals, as old numpy wrote them
    const std::string literal = text_.substr(start, pos_ - start);
    DDP_CHECK(!negative, field("shape") << "negative dimension " << literal);
    DDP_CHECK(!too_large, field("shape") << "dimension " << literal << " is too large");
    return static_cast<int64_t>(value);
  }

  std::string file_;
  std::string text_;
  size_t pos_ = 0;
};

uint64_t read_le(const uint8_t* p, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Writing

void require_little_endian() {
  const uint32_t probe = 1;
  unsigned char first_byte = 0;
  std::memcpy(&first_byte, &probe, 1);
  DDP_CHECK(first_byte == 1, "npy I/O needs a little-endian host");
}

std::string encode_header(NpyType type, const std::vector<int64_t>& shape,
                          const std::string& context) {
  DDP_CHECK(!shape.empty(), context << "shape is empty; need at least one dimension");
  for (int64_t d : shape) {
    DDP_CHECK(d >= 0,
              context << "negative dimension " << d << " in shape " << npy_shape_repr(shape));
  }
  checked_bytes(shape, npy_item_size(type), 0, context);
  // numpy.lib.format._write_array_header: sorted keys, repr() values, then room for the first
  // axis to grow to 21 digits in place; _wrap_header pads to 64 (a full 64 when already aligned).
  std::string dict = std::string("{'descr': '") + to_string(type) +
                     "', 'fortran_order': False, 'shape': " + npy_shape_repr(shape) + ", }";
  dict.append(kGrowthAxisDigits - std::to_string(shape[0]).size(), ' ');
  const size_t hlen = dict.size() + 1;  // the final '\n'
  int major = 1;
  size_t length_bytes = 2;
  size_t pad = kArrayAlign - (kMagicBytes + 2 + length_bytes + hlen) % kArrayAlign;
  if (hlen + pad > 0xffff) {
    major = 2;
    length_bytes = 4;
    pad = kArrayAlign - (kMagicBytes + 2 + length_bytes + hlen) % kArrayAlign;
  }
  std::string out(kMagic, kMagicBytes);
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < length_bytes; ++i) {
    out += static_cast<char>(((hlen + pad) >> (8 * i)) & 0xff);
  }
  return out + dict + std::string(pad, ' ') + '\n';
}

}  // namespace

const char* to_string(NpyType type) { return info(type).descr; }

size_t npy_item_size(NpyType type) { return info(type).size; }

NpyHeader parse_npy_header(const std::string& file, const uint8_t* bytes, size_t size) {
  const size_t magic_seen = std::min(size, kMagicBytes);
  DDP_CHECK(magic_seen > 0 && std::memcmp(bytes, kMagic, magic_seen) == 0,
            where(file) << ": magic string is not \\x93NUMPY; not a .npy file"
                        << (size == 0 ? " (the file is empty)" : ""));
  DDP_CHECK(size >= kMagicBytes + 2, where(file) << ": truncated header: the file is " << size
                                                 << " bytes, shorter than the magic and version");
  const int major = bytes[6];
  const int minor = bytes[7];
  DDP_CHECK((major == 1 || major == 2 || major == 3) && minor == 0,
            where(file) << ": format version " << major << "." << minor
                        << " is not supported (1.0, 2.0 and 3.0 are)");
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t preamble = kMagicBytes + 2 + length_bytes;
  DDP_CHECK(size >= preamble, where(file) << ": truncated header: the file is " << size
                                          << " bytes, shorter than the " << preamble
                                          << "-byte preamble of version " << major << ".0");
  const uint64_t header_length = read_le(bytes + kMagicBytes + 2, length_bytes);
  DDP_CHECK(header_length <= size - preamble,
            where(file) << ": truncated header: the header length field says " << header_length
                        << " bytes, but only " << size - preamble << " follow the " << preamble
                        << "-byte preamble");
  const std::string text(reinterpret_cast<const char*>(bytes) + preamble, header_length);
  NpyHeader header = HeaderParser(file, text).parse();
  header.data_offset = preamble + header_length;
  const size_t item = npy_item_size(header.type);
  const auto bytes_of = checked_bytes(header.shape, item, header.data_offset,
                                      where(file) + ": header field 'shape': ");
  header.data_bytes = bytes_of.second;
  header.elements = header.data_bytes / item;
  DDP_CHECK(header.data_offset % item == 0,
            where(file) << ": header length: the data starts at byte " << header.data_offset
                        << ", not a multiple of the " << item << "-byte item size of "
                        << to_string(header.type)
                        << ", so it cannot be mapped in place; save it again with numpy.save");
  return header;
}

NpyFile NpyFile::open(const std::string& path, NpyAccess access) {
  const int fd = InputFile(path, where(path)).release();  // a FIFO or a device is refused
  struct stat st {};
  const int stat_rc = ::fstat(fd, &st);
  const int stat_errno = errno;
  NpyFile f;
  f.path_ = path;
  if (stat_rc == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    f.mapped_ = static_cast<size_t>(st.st_size);
    void* base = ::mmap(nullptr, f.mapped_, PROT_READ, MAP_SHARED, fd, 0);
    f.base_ = base == MAP_FAILED ? nullptr : static_cast<const uint8_t*>(base);
    // Before the header's page is touched: its fault would read the window around it.
    if (f.base_ != nullptr && access == NpyAccess::Random) ::madvise(base, f.mapped_, MADV_RANDOM);
  }
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file
  DDP_CHECK(stat_rc == 0, where(path) << ": cannot stat: " << std::strerror(stat_errno));
  DDP_CHECK(S_ISREG(st.st_mode), where(path) << ": not a regular file");
  if (f.mapped_ > 0 && f.base_ == nullptr) {
    f.mapped_ = 0;
    DDP_THROW(where(path) << ": cannot mmap: " << std::strerror(map_errno));
  }
  f.header_ = parse_npy_header(path, f.base_, f.mapped_);
  const uint64_t expected = f.header_.data_offset + f.header_.data_bytes;
  DDP_CHECK(f.mapped_ >= expected,
            where(path) << ": truncated data: shape " << npy_shape_repr(f.header_.shape) << " of "
                        << to_string(f.header_.type) << " needs " << f.header_.data_bytes
                        << " bytes after the " << f.header_.data_offset
                        << "-byte header, but the file has " << f.mapped_ - f.header_.data_offset
                        << " (expected " << expected << " bytes in all, got " << f.mapped_ << ")");
  DDP_CHECK(f.mapped_ == expected,
            where(path) << ": " << f.mapped_ - expected << " bytes after the end of the array "
                        << "(shape " << npy_shape_repr(f.header_.shape) << " of "
                        << to_string(f.header_.type) << " ends at byte " << expected
                        << "); several arrays saved into one file?");
  f.row_elements_ = 1;
  for (size_t i = 1; i < f.header_.shape.size(); ++i) f.row_elements_ *= f.header_.shape[i];
  return f;
}

NpyFile::~NpyFile() { release(); }

NpyFile::NpyFile(NpyFile&& other) noexcept
    : path_(std::move(other.path_)),
      base_(std::exchange(other.base_, nullptr)),
      mapped_(std::exchange(other.mapped_, 0)),
      header_(std::exchange(other.header_, {})),
      row_elements_(std::exchange(other.row_elements_, 0)) {}

NpyFile& NpyFile::operator=(NpyFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    base_ = std::exchange(other.base_, nullptr);
    mapped_ = std::exchange(other.mapped_, 0);
    header_ = std::exchange(other.header_, {});
    row_elements_ = std::exchange(other.row_elements_, 0);
  }
  return *this;
}

void NpyFile::release() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), mapped_);
  base_ = nullptr;
  mapped_ = 0;
}

std::string npy_shape_repr(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

std::string npy_header(NpyType type, const std::vector<int64_t>& shape) {
  return encode_header(type, shape, "npy header: ");
}

void write_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
               const void* data) {
  require_little_endian();
  const std::string context = "cannot write npy file '" + path + "': ";
  const std::string header = encode_header(type, shape, context);
  const uint64_t bytes = checked_bytes(shape, npy_item_size(type), header.size(), context).second;
  DDP_CHECK(data != nullptr || bytes == 0,
            context << "no data for shape " << npy_shape_repr(shape) << " (" << bytes << " bytes)");
  AtomicFile file(path, "npy file");
  file.write(header.data(), header.size());
  if (bytes > 0) file.write(data, bytes);
  file.commit();
}

}  // namespace ddp
