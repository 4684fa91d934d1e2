// libFuzzer harness for the IDX reader (ddp::load_idx). One input is both files: a 2-byte
// little-endian length, that many bytes of images file, then the labels file. zlib reads raw and
// gzipped files alike, so the corpus holds both and the fuzzer mutates either.
#include <cstddef>
#include <cstdint>

#include "data/dataset.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ddp::fuzz::MemFile images("idx-images");
  static ddp::fuzz::MemFile labels("idx-labels");
  if (size < 2) return -1;  // not a pair: keep it out of the corpus
  size_t images_size = data[0] | (size_t{data[1]} << 8);
  if (images_size > size - 2) images_size = size - 2;
  const std::string& images_path = images.write(data + 2, images_size);
  const std::string& labels_path = labels.write(data + 2 + images_size, size - 2 - images_size);
  ddp::fuzz::expect_only_ddp_errors([&] {
    const ddp::Dataset ds = ddp::load_idx(images_path, labels_path);
    using ddp::fuzz::require;
    require(ds.size > 0 && ds.features > 0, "a loaded IDX set has samples and pixels");
    require(ds.x.size() == static_cast<size_t>(ds.size * ds.features), "x holds size*features");
    require(ds.y.size() == static_cast<size_t>(ds.size), "y holds one label per sample");
    for (float v : ds.x.floats()) require(v >= 0.0f && v <= 1.0f, "pixels scale into [0, 1]");
    for (int32_t l : ds.y) require(l >= 0 && l <= 255, "labels are bytes");
    // Labels are bytes, so 256 classes accept every file; 10 exercises the rejection path.
    ddp::check_dataset(ds, ds.features, 256, "fuzz");
    ddp::check_dataset(ds, ds.features, 10, "fuzz");
  });
  return 0;
}
