// The order of additions in the 16-bit Linear layer's bias gradient (MixedLinear's db), shared
// by the CPU and CUDA backends so that both give the same bits while the device sums the rows
// in parallel: the rows are cut into kColumnSumChunks consecutive chunks of
// column_sum_chunk_rows(rows) rows (the last ones shorter, or empty); each chunk's rows are added
// in order onto 0, the chunks' sums in chunk order onto 0 (an empty chunk adds 0), and that
// total onto db with accumulate. A pure function of the row count: the same on every device.
#pragma once

#include <cstdint>

namespace ddp {

constexpr int kColumnSumChunks = 32;

/// Rows per chunk for a batch of `rows` (0 for an empty batch).
constexpr int64_t column_sum_chunk_rows(int64_t rows) {
  return (rows + kColumnSumChunks - 1) / kColumnSumChunks;
}

}  // namespace ddp
