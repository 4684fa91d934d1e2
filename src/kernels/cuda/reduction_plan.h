// How the reductions of reductions.cuh split their work over the grid: pure host functions of
// the shape, never of the device's SM count, so the order of additions (and so the bits of a
// result) is the same on every GPU. Host-only, so the tests can model the exact order.
#pragma once

#include <cstdint>

namespace ddp {
namespace cuda {

/// Column sums over `rows`: chunks of chunk_rows consecutive rows (the last one shorter), each
/// summed by its own blocks; one chunk means one pass straight into the result.
struct ColumnSumChunks {
  int64_t chunks = 1;
  int64_t chunk_rows = 0;
};

// The grid aimed for, column blocks x chunks: about an H200's 132 SMs and a little more. A
// constant, not the device's SM count, so the order of additions is (rows, cols)'s alone.
constexpr int64_t kColumnSumTargetBlocks = 160;
// Up to this many rows one pass costs no more than chunks and a second launch: on an H200 the
// split pass made the 10-column weight gradient at batch 1024 slower (17.8 -> 26.5 us with its
// GEMM) and the 256-column one no faster (19.4 -> 19.3 us), so chunks start above the training
// batches measured.
constexpr int64_t kColumnSumOnePassRows = 1024;
// A chunk gives at least half of a block's 8 rows of threads a row to add.
constexpr int64_t kColumnSumMinChunkRows = 4;

/// One pass when rows <= 1024 or when the column blocks (ceil(cols / 32)) alone reach 160;
/// otherwise ceil(160 / column blocks) chunks of ceil(rows / that) rows, at least 4 rows each.
/// Batch 4096: 256 columns give 8 x 20 = 160 blocks; 10 columns 1 x 158 (26 rows per chunk).
inline ColumnSumChunks column_sum_chunks(int64_t rows, int64_t cols) {
  const int64_t column_blocks = (cols + 31) / 32;
  ColumnSumChunks plan;
  plan.chunk_rows = rows;
  if (rows <= kColumnSumOnePassRows || column_blocks >= kColumnSumTargetBlocks) return plan;
  const int64_t want = (kColumnSumTargetBlocks + column_blocks - 1) / column_blocks;
  const int64_t per = (rows + want - 1) / want;
  plan.chunk_rows = per < kColumnSumMinChunkRows ? kColumnSumMinChunkRows : per;
  plan.chunks = (rows + plan.chunk_rows - 1) / plan.chunk_rows;
  return plan;
}

/// Floats of scratch the column sums need: a partial sum per chunk and column, or none.
inline int64_t column_sum_scratch_floats(int64_t rows, int64_t cols) {
  const ColumnSumChunks plan = column_sum_chunks(rows, cols);
  return plan.chunks > 1 ? plan.chunks * cols : 0;
}

// The cross-entropy totals' first pass: a block of 256 threads per 1024 rows (4 per thread),
// at most 1024 blocks (the finishing block's 256 threads then add 4 partials each).
constexpr int64_t kXentRowsPerTotalBlock = 1024;
constexpr int64_t kXentMaxTotalBlocks = 1024;

/// Blocks of the totals' first pass over `rows` per-row results: ceil(rows / 1024), between 1
/// and 1024. One block (rows <= 1024, the training batch) stores the totals itself: a
/// finishing launch would cost more than its four rows per thread.
inline int xent_total_blocks(int64_t rows) {
  const int64_t want = (rows + kXentRowsPerTotalBlock - 1) / kXentRowsPerTotalBlock;
  return static_cast<int>(want < 1 ? 1 : want > kXentMaxTotalBlocks ? kXentMaxTotalBlocks : want);
}

}  // namespace cuda
}  // namespace ddp
