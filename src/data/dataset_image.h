// A Dataset as one flat block of memory, and a Dataset that reads its features in place from such
// a block: how the ranks of a node share one copy of a data set (comm/node_shared_memory.h).
// Layout: a header (sizes, the feature type), the source's name, the labels, then the features
// in their stored type on a 64-byte boundary.
#pragma once

#include <cstddef>
#include <memory>

#include "data/dataset.h"

namespace ddp {

/// Bytes write_image needs for `ds`.
size_t image_bytes(const Dataset& ds);
/// Writes `ds` (without its transform) into `out`, image_bytes(ds) bytes.
void write_image(const Dataset& ds, void* out);
/// The Dataset in `image` (`bytes` long), its features read in place (kept alive by `keep`),
/// labels and source copied. Throws ddp::Error if the image is not one write_image made.
Dataset view_image(const void* image, size_t bytes, std::shared_ptr<const void> keep);

}  // namespace ddp
