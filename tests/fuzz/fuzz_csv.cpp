// libFuzzer harness for the CSV reader (ddp::load_csv). An input starting with 'H' is read with
// header = true (the 'H' is dropped); any other input is the whole file, read without a header.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "data/dataset.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ddp::fuzz::MemFile file("csv");
  const bool header = size > 0 && data[0] == 'H';
  const size_t skip = header ? 1 : 0;
  const std::string& path = file.write(data + skip, size - skip);
  ddp::fuzz::expect_only_ddp_errors([&] {
    const ddp::Dataset ds = ddp::load_csv(path, header);
    using ddp::fuzz::require;
    require(ds.size > 0 && ds.features > 0, "a loaded CSV has rows and features");
    require(ds.x.size() == static_cast<size_t>(ds.size * ds.features), "x holds size*features");
    require(ds.y.size() == static_cast<size_t>(ds.size), "y holds one label per row");
    for (float v : ds.x.floats()) require(std::isfinite(v), "features are finite");
    for (int32_t l : ds.y) require(l >= 0, "labels are non-negative");
    ddp::check_dataset(ds, ds.features, 3, "fuzz");
  });
  return 0;
}
