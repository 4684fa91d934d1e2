// safetensors read/write for F32 tensors. Writes go through a temp file beside the target
// (fsync, rename, fsync the directory) so a crash or a full disk never leaves a torn checkpoint;
// reads check every header field and that the tensors tile the data section exactly.
#include "ddp/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/input_file.h"
#include "core/tensor.h"

namespace ddp {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;  // keeps the header in the caller's tensor order

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;  // the reference implementation's cap
constexpr uint64_t kLengthFieldBytes = 8;
constexpr const char* kMetadataKey = "__metadata__";

// safetensors data is little-endian; we write and read host floats as they are in memory.
void require_little_endian() {
  const uint32_t probe = 1;
  unsigned char first_byte = 0;
  std::memcpy(&first_byte, &probe, 1);
  DDP_CHECK(first_byte == 1, "safetensors I/O needs a little-endian host");
}

// Element count of `shape`; throws (prefixed by `context`) on a negative dimension or a count
// whose byte size would overflow 64 bits.
uint64_t shape_numel(const std::vector<int64_t>& shape, const std::string& context) {
  for (int64_t d : shape) {
    DDP_CHECK(d >= 0,
              context << ": negative dimension " << d << " in shape " << shape_string(shape));
  }
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  constexpr uint64_t kMaxNumel = std::numeric_limits<uint64_t>::max() / sizeof(float);
  uint64_t numel = 1;
  for (int64_t d : shape) {
    const auto dim = static_cast<uint64_t>(d);
    DDP_CHECK(numel <= kMaxNumel / dim,
              context << ": shape " << shape_string(shape) << " has too many elements");
    numel *= dim;
  }
  return numel;
}

// "nan", "inf" or "-inf": the sign of a NaN says nothing.
const char* non_finite_name(float v) {
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

// ---------------------------------------------------------------------------------------------
// Writing

std::string encode_length(uint64_t n) {
  std::string bytes(kLengthFieldBytes, '\0');
  for (size_t i = 0; i < kLengthFieldBytes; ++i)
    bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes;
}

// Names become JSON keys that a reader matches byte for byte, so one that is not valid UTF-8
// is refused (a replacement character could make two names one); metadata values are text for
// people (a data path, say) and are stored with U+FFFD in place of each invalid byte.
void require_utf8(const std::string& s, const std::string& context) {
  try {
    (void)Json(s).dump();
  } catch (const Json::exception&) {
    DDP_THROW(context << " is not valid UTF-8");
  }
}

// The length field, then the JSON header padded with spaces so the data starts 8-byte aligned.
std::string encode_header(const std::string& where, const std::vector<TensorView>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  OrderedJson header = OrderedJson::object();
  for (const auto& entry : metadata) require_utf8(entry.first, where + ": metadata key");
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  DDP_CHECK(tensors.size() <= kMaxSafetensorsTensors,
            where << ": " << tensors.size() << " tensors, more than the " << kMaxSafetensorsTensors
                  << " a file may hold");
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorView& view : tensors) {
    const NamedTensor& t = *view.tensor;
    const std::string context = where + ": tensor '" + view.name + "'";
    DDP_CHECK(view.name != kMetadataKey, context << ": the name is reserved for metadata");
    DDP_CHECK(names.insert(view.name).second, context << ": duplicate tensor name");
    require_utf8(view.name, context + ": the name");
    const uint64_t numel = shape_numel(t.shape, context);
    DDP_CHECK(t.data.size() == numel, context << ": shape " << shape_string(t.shape) << " needs "
                                              << numel << " values but data has " << t.data.size());
    const uint64_t end = offset + numel * sizeof(float);
    header[view.name] = OrderedJson{
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", OrderedJson::array({offset, end})}};
    offset = end;
  }
  std::string text = header.dump(-1, ' ', false, Json::error_handler_t::replace);
  text.append((kLengthFieldBytes - text.size() % kLengthFieldBytes) % kLengthFieldBytes, ' ');
  return encode_length(text.size()) + text;
}

// ---------------------------------------------------------------------------------------------
// Reading

struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section
  uint64_t end = 0;
};

class ReadOnlyFile {
 public:
  // A FIFO or a device is refused (InputFile) before open() could block on it.
  explicit ReadOnlyFile(const std::string& path)
      : fd_(InputFile(path, "safetensors file '" + path + "'").release()), open_errno_(0) {}
  ~ReadOnlyFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  int fd() const { return fd_; }
  int open_errno() const { return open_errno_; }

 private:
  int fd_;
  int open_errno_;
};

uint64_t regular_file_size(int fd, const std::string& where) {
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  const int err = errno;
  DDP_CHECK(rc == 0, where << ": cannot stat: " << std::strerror(err));
  DDP_CHECK(S_ISREG(st.st_mode), where << ": not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

void read_exact(int fd, uint64_t offset, void* dst, uint64_t bytes, const std::string& where) {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    const int err = errno;
    if (n < 0 && err == EINTR) continue;
    DDP_CHECK(n >= 0, where << ": read at byte " << offset << " failed: " << std::strerror(err));
    DDP_CHECK(n > 0, where << ": unexpected end of file at byte " << offset
                           << " (file changed while reading?)");
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
}

uint64_t read_header_length(int fd, uint64_t file_size, const std::string& where) {
  DDP_CHECK(
      file_size >= kLengthFieldBytes,
      where << ": file is " << file_size
            << " bytes, too short for the 8-byte header length (truncated or not safetensors)");
  unsigned char bytes[kLengthFieldBytes];
  read_exact(fd, 0, bytes, kLengthFieldBytes, where);
  uint64_t n = 0;
  for (size_t i = 0; i < kLengthFieldBytes; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  DDP_CHECK(n <= kMaxHeaderBytes, where
                                      << ": header length " << n
                                      << " exceeds the 100 MB limit (corrupt or not safetensors)");
  DDP_CHECK(n <= file_size - kLengthFieldBytes,
            where << ": header length " << n << " is larger than the "
                  << file_size - kLengthFieldBytes
                  << " bytes that follow it (truncated or corrupt file)");
  return n;
}

// A first pass over the header text with nlohmann's SAX interface, linear in its length and
// building nothing: it refuses a top-level key given twice (the parse that builds the object would
// keep the last one) and more tensors than a file may hold, before any of them is built.
class TopLevelKeys final : public Json::json_sax_t {
 public:
  explicit TopLevelKeys(const std::string& where) : where_(where) {}

  bool key(string_t& name) override {
    if (depth_ != 1) return true;
    DDP_CHECK(keys_.insert(name).second,
              where_ << ": header names '" << name << "' more than once");
    DDP_CHECK(name == kMetadataKey || ++tensors_ <= kMaxSafetensorsTensors,
              where_ << ": header lists more than " << kMaxSafetensorsTensors
                     << " tensors, the most a file may hold (corrupt, or not a model)");
    return true;
  }
  bool start_object(std::size_t) override { return enter(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_object() override { return leave(); }
  bool end_array() override { return leave(); }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  // Syntax errors, invalid UTF-8 and numbers out of range (1e400) all arrive here.
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    DDP_THROW(where_ << ": header is not valid JSON: " << e.what());
  }

 private:
  bool enter() {
    ++depth_;
    return true;
  }
  bool leave() {
    --depth_;
    return true;
  }

  const std::string& where_;
  int depth_ = 0;
  uint64_t tensors_ = 0;
  std::set<std::string> keys_;
};

// Strict like the reference: a JSON object, starting with '{', no NUL bytes (nlohmann would
// stop at one), no duplicate top-level keys; and no more than kMaxSafetensorsTensors entries.
Json parse_header(const std::string& text, const std::string& where) {
  DDP_CHECK(text.find('\0') == std::string::npos, where << ": header is not valid JSON (NUL byte)");
  DDP_CHECK(!text.empty() && text[0] == '{',
            where << ": header is not a JSON object (must start with '{')");
  TopLevelKeys keys(where);
  Json::sax_parse(text, &keys);
  Json header;
  try {
    header = Json::parse(text);
  } catch (const Json::exception& e) {  // the first pass has seen every syntax error already
    DDP_THROW(where << ": header is not valid JSON: " << e.what());
  }
  DDP_CHECK(header.is_object(), where << ": header is not a JSON object");
  return header;
}

std::map<std::string, std::string> parse_metadata(const Json& value, const std::string& where) {
  DDP_CHECK(value.is_object(), where << ": " << kMetadataKey << " must be an object of strings");
  std::map<std::string, std::string> metadata;
  for (auto it = value.begin(); it != value.end(); ++it) {
    DDP_CHECK(it.value().is_string(),
              where << ": " << kMetadataKey << " value for '" << it.key() << "' is not a string");
    metadata[it.key()] = it.value().get<std::string>();
  }
  return metadata;
}

const Json& require_field(const Json& entry, const char* key, const std::string& context) {
  DDP_CHECK(entry.contains(key), context << ": missing \"" << key << "\"");
  return entry[key];
}

void check_dtype(const Json& dtype, const std::string& context) {
  DDP_CHECK(dtype.is_string(), context << ": \"dtype\" must be a string, got " << dtype.dump());
  DDP_CHECK(dtype.get<std::string>() == "F32",
            context << ": dtype " << dtype.get<std::string>() << " is not supported (only F32)");
}

std::vector<int64_t> parse_shape(const Json& shape, const std::string& context) {
  DDP_CHECK(shape.is_array(),
            context << ": \"shape\" must be an array of integers, got " << shape.dump());
  std::vector<int64_t> dims;
  for (const Json& d : shape) {
    DDP_CHECK(d.is_number_integer(),
              context << ": \"shape\" must be an array of integers, got " << shape.dump());
    // nlohmann parses every non-negative integer as unsigned, so signed means negative.
    DDP_CHECK(d.is_number_unsigned(), context << ": negative dimension " << d.get<int64_t>()
                                              << " in shape " << shape.dump());
    DDP_CHECK(d.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
              context << ": dimension " << d.get<uint64_t>() << " is too large");
    dims.push_back(d.get<int64_t>());
  }
  return dims;
}

void parse_offsets(const Json& offsets, uint64_t data_size, const std::string& context,
                   TensorEntry* entry) {
  DDP_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                offsets[1].is_number_unsigned(),
            context << ": \"data_offsets\" must be [begin, end] (non-negative integers), got "
                    << offsets.dump());
  entry->begin = offsets[0].get<uint64_t>();
  entry->end = offsets[1].get<uint64_t>();
  DDP_CHECK(entry->begin <= entry->end,
            context << ": data_offsets " << offsets.dump() << " have begin > end");
  DDP_CHECK(entry->end <= data_size, context << ": data_offsets " << offsets.dump()
                                             << " extend past the end of the data section ("
                                             << data_size << " bytes; truncated file?)");
}

TensorEntry parse_entry(const std::string& name, const Json& value, uint64_t data_size,
                        const std::string& where) {
  const std::string context = where + ": tensor '" + name + "'";
  DDP_CHECK(value.is_object(), context << ": header entry is not a JSON object");
  check_dtype(require_field(value, "dtype", context), context);
  TensorEntry entry;
  entry.name = name;
  entry.shape = parse_shape(require_field(value, "shape", context), context);
  parse_offsets(require_field(value, "data_offsets", context), data_size, context, &entry);
  const uint64_t bytes = shape_numel(entry.shape, context) * sizeof(float);
  DDP_CHECK(entry.end - entry.begin == bytes,
            context << ": shape " << shape_string(entry.shape) << " needs " << bytes
                    << " bytes of F32 but data_offsets [" << entry.begin << ", " << entry.end
                    << "] span " << entry.end - entry.begin);
  return entry;
}

// The reference rejects any data byte that belongs to no tensor or to two: sorted by offset,
// each tensor must start exactly where the previous one ended, and the last end the section.
void check_tiling(std::vector<TensorEntry>* entries, uint64_t data_size, const std::string& where) {
  std::sort(entries->begin(), entries->end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const char* rule = " (tensors must tile the data section exactly)";
  uint64_t covered = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& e : *entries) {
    DDP_CHECK(e.begin >= covered, where << ": tensors '" << previous->name << "' ["
                                        << previous->begin << ", " << previous->end << ") and '"
                                        << e.name << "' [" << e.begin << ", " << e.end
                                        << ") overlap");
    DDP_CHECK(e.begin == covered, where << ": gap: data bytes [" << covered << ", " << e.begin
                                        << ") before tensor '" << e.name
                                        << "' are not covered by any tensor" << rule);
    covered = e.end;
    previous = &e;
  }
  DDP_CHECK(covered == data_size, where << ": gap: trailing data bytes [" << covered << ", "
                                        << data_size << ") are not covered by any tensor" << rule);
}

// The length field and the JSON header, validated; the file's size beside them.
struct Header {
  Json json;
  uint64_t file_size = 0;
  uint64_t size = 0;  ///< bytes of JSON after the length field
};

Header read_header(int fd, const std::string& where) {
  Header h;
  h.file_size = regular_file_size(fd, where);
  h.size = read_header_length(fd, h.file_size, where);
  std::string text(h.size, '\0');
  read_exact(fd, kLengthFieldBytes, text.data(), h.size, where);
  h.json = parse_header(text, where);
  return h;
}

std::vector<NamedTensor> read_tensors(int fd, const std::vector<TensorEntry>& entries,
                                      uint64_t data_start, const std::string& where) {
  std::vector<NamedTensor> tensors;
  tensors.reserve(entries.size());
  for (const TensorEntry& e : entries) {
    NamedTensor t{e.name, e.shape, std::vector<float>((e.end - e.begin) / sizeof(float))};
    read_exact(fd, data_start + e.begin, t.data.data(), e.end - e.begin, where);
    tensors.push_back(std::move(t));
  }
  return tensors;
}

}  // namespace

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const NamedTensor& t : tensors) views.push_back({t.name, &t});
  save_safetensors_views(path, views, metadata);
}

void save_safetensors_views(const std::string& path, const std::vector<TensorView>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  require_little_endian();
  const std::string header =
      encode_header("cannot save safetensors '" + path + "'", tensors, metadata);
  AtomicFile file(path, "safetensors");
  file.write(header.data(), header.size());
  for (const TensorView& t : tensors)
    file.write(t.tensor->data.data(), t.tensor->data.size() * sizeof(float));
  file.commit();
}

std::vector<NamedTensor> load_safetensors(const std::string& path) {
  return load_safetensors(path, nullptr);
}

std::vector<NamedTensor> load_safetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata) {
  require_little_endian();
  const std::string where = "safetensors file '" + path + "'";
  ReadOnlyFile file(path);
  DDP_CHECK(file.fd() >= 0, "cannot open " << where << ": " << std::strerror(file.open_errno()));
  const Header header = read_header(file.fd(), where);
  const uint64_t data_size = header.file_size - kLengthFieldBytes - header.size;
  std::map<std::string, std::string> parsed_metadata;
  std::vector<TensorEntry> entries;
  for (auto it = header.json.begin(); it != header.json.end(); ++it) {
    if (it.key() == kMetadataKey) {
      parsed_metadata = parse_metadata(it.value(), where);
    } else {
      entries.push_back(parse_entry(it.key(), it.value(), data_size, where));
    }
  }
  check_tiling(&entries, data_size, where);
  std::vector<NamedTensor> tensors =
      read_tensors(file.fd(), entries, kLengthFieldBytes + header.size, where);
  if (metadata != nullptr) *metadata = std::move(parsed_metadata);
  return tensors;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  const std::string where = "safetensors file '" + path + "'";
  ReadOnlyFile file(path);
  DDP_CHECK(file.fd() >= 0, "cannot open " << where << ": " << std::strerror(file.open_errno()));
  const Header header = read_header(file.fd(), where);
  const auto it = header.json.find(kMetadataKey);
  if (it == header.json.end()) return {};
  return parse_metadata(*it, where);
}

void require_finite(const std::vector<NamedTensor>& tensors, const std::string& what) {
  for (const NamedTensor& t : tensors) {
    const auto bad =
        std::find_if(t.data.begin(), t.data.end(), [](float v) { return !std::isfinite(v); });
    if (bad == t.data.end()) continue;
    const auto i = static_cast<int64_t>(bad - t.data.begin());
    std::ostringstream at;
    if (t.shape.size() == 2)
      at << " (row " << i / t.shape[1] << ", column " << i % t.shape[1] << ")";
    DDP_THROW(what << ": tensor '" << t.name << "' holds " << non_finite_name(*bad) << " at index "
                   << i << at.str());
  }
}

}  // namespace ddp
