// libFuzzer harness for the .npy reader: each input is parsed as a header from memory
// (ddp::parse_npy_header), then mapped from an in-memory file (ddp::NpyFile::open). What either
// accepts must be self-consistent, lie inside the input, and survive writing its header again.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "data/npy.h"
#include "fuzz_support.h"

namespace {

void check_header(const ddp::NpyHeader& h, size_t size) {
  using ddp::fuzz::require;
  require(!h.shape.empty(), "an accepted array has at least one dimension");
  uint64_t elements = 1;
  for (int64_t d : h.shape) {
    require(d >= 0, "dimensions are non-negative");
    elements *= static_cast<uint64_t>(d);
  }
  const size_t item = ddp::npy_item_size(h.type);
  require(h.elements == elements, "elements is the product of the shape");
  require(h.data_bytes == elements * item, "data_bytes is elements times the item size");
  require(h.data_offset <= size, "the header lies inside the input");
  require(h.data_offset % item == 0, "the data is aligned to the item size");
  require(h.data_offset + h.data_bytes >= h.data_offset, "the end of the data does not wrap");
  // The writer's header for the same array must read back as the same array.
  const std::string again = ddp::npy_header(h.type, h.shape);
  const ddp::NpyHeader r = ddp::parse_npy_header(
      "rewritten", reinterpret_cast<const uint8_t*>(again.data()), again.size());
  require(r.type == h.type && r.shape == h.shape, "npy_header round-trips type and shape");
  require(r.data_offset == again.size() && r.data_offset % 64 == 0, "written data is 64-aligned");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ddp::fuzz::MemFile file("npy");
  ddp::fuzz::expect_only_ddp_errors(
      [&] { check_header(ddp::parse_npy_header("fuzz.npy", data, size), size); });
  const std::string& path = file.write(data, size);
  ddp::fuzz::expect_only_ddp_errors([&] {
    const ddp::NpyFile f = ddp::NpyFile::open(path);
    using ddp::fuzz::require;
    check_header(f.header(), size);
    require(f.header().data_offset + f.data_bytes() == size, "the array fills the file exactly");
    require(static_cast<uint64_t>(f.rows()) * static_cast<uint64_t>(f.row_elements()) ==
                f.header().elements,
            "rows times row_elements is the element count");
    require((f.data_bytes() == 0) == (f.data() == nullptr), "data() is null only when empty");
    // Reads every mapped data byte: a wrong pointer or length faults or differs here.
    require(f.data_bytes() == 0 ||
                std::memcmp(f.data(), data + f.header().data_offset, f.data_bytes()) == 0,
            "data() maps the bytes after the header");
  });
  return 0;
}
