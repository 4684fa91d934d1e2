// libFuzzer harness for the safetensors reader (ddp::load_safetensors), which takes a path: each
// input becomes the contents of an in-memory file. A file it accepts must describe its tensors
// consistently (values == product of the shape) and hold at most kMaxSafetensorsTensors.
//
// An input starting with "MANY" or "HUGE" describes a header of many entries instead, which no
// input of a few kilobytes could spell out: byte 4 picks the count's power of two, byte 5 adds
// its value - 128, and the rest is one entry's text, repeated with "#i" replaced by the entry's
// number and "#b", "#e" by its offsets (entry i holds one float: bytes [4i, 4i + 4)), followed by
// 4 data bytes per entry. MANY goes up to 2^10 entries, cheap enough to fuzz from. HUGE goes up
// to 2^17, past the tensor cap, for the seeds ctest replays (corpus/safetensors_many): a parse
// that grows faster than the header times out there (the quadratic one took 24 s at 16k
// entries); accepted counts stop at 2^14, as a file of 65,536 tensors takes 8 s to load when
// instrumented, close to the 10 s timeout (the unit tests load one in an optimised build).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "ddp/safetensors.h"
#include "fuzz_support.h"

namespace {

constexpr size_t kMaxHeaderBytes = 8u << 20;  // keeps each input's run well under the timeout
constexpr int64_t kMaxHugeLoaded = int64_t{1} << 14;

// `text` with every "#i", "#b" and "#e" replaced for entry i.
std::string expand_entry(const std::string& text, uint64_t i) {
  std::string out;
  for (size_t k = 0; k < text.size(); ++k) {
    const char next = k + 1 < text.size() ? text[k + 1] : '\0';
    if (text[k] == '#' && (next == 'i' || next == 'b' || next == 'e')) {
      out += std::to_string(next == 'i' ? i : next == 'b' ? 4 * i : 4 * i + 4);
      ++k;
    } else {
      out += text[k];
    }
  }
  return out;
}

// The file a "MANY" or "HUGE" input describes.
std::string many_entries_file(const uint8_t* data, size_t size, bool huge) {
  const int powers = huge ? 18 : 11;
  int64_t count = std::max<int64_t>(0, (int64_t{1} << (data[4] % powers)) + data[5] - 128);
  if (huge && count > kMaxHugeLoaded && count <= static_cast<int64_t>(ddp::kMaxSafetensorsTensors))
    count = kMaxHugeLoaded;
  const std::string entry(reinterpret_cast<const char*>(data) + 6, size - 6);
  std::string header = "{";
  for (int64_t i = 0; i < count && header.size() < kMaxHeaderBytes; ++i) {
    if (i > 0) header += ',';
    header += expand_entry(entry, static_cast<uint64_t>(i));
  }
  header += '}';
  std::string file(8, '\0');
  for (size_t b = 0; b < 8; ++b) file[b] = static_cast<char>((header.size() >> (8 * b)) & 0xff);
  return file + header + std::string(4 * static_cast<size_t>(count), '\0');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ddp::fuzz::MemFile file("safetensors");
  std::string many;
  const bool huge = size >= 6 && std::equal(data, data + 4, "HUGE");
  if (huge || (size >= 6 && std::equal(data, data + 4, "MANY"))) {
    many = many_entries_file(data, size, huge);
    data = reinterpret_cast<const uint8_t*>(many.data());
    size = many.size();
  }
  const std::string& path = file.write(data, size);
  ddp::fuzz::expect_only_ddp_errors([&] {
    std::map<std::string, std::string> metadata;
    const auto tensors = ddp::load_safetensors(path, &metadata);
    ddp::fuzz::require(tensors.size() <= ddp::kMaxSafetensorsTensors, "at most the tensor cap");
    for (const ddp::NamedTensor& t : tensors) {
      uint64_t numel = 1;
      for (int64_t d : t.shape) {
        ddp::fuzz::require(d >= 0, "dimensions are non-negative");
        numel *= static_cast<uint64_t>(d);
      }
      ddp::fuzz::require(t.data.size() == numel, "a tensor holds product(shape) values");
      ddp::fuzz::require(t.name != "__metadata__", "the metadata key is not a tensor");
    }
  });
  return 0;
}
