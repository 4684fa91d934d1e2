// libFuzzer harness for the safetensors reader (ddp::load_safetensors), which takes a path: each
// input becomes the contents of an in-memory file. A file it accepts must describe its tensors
// consistently (values == product of the shape).
#include <cstddef>
#include <cstdint>
#include <map>

#include "ddp/safetensors.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ddp::fuzz::MemFile file("safetensors");
  const std::string& path = file.write(data, size);
  ddp::fuzz::expect_only_ddp_errors([&] {
    std::map<std::string, std::string> metadata;
    const auto tensors = ddp::load_safetensors(path, &metadata);
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
