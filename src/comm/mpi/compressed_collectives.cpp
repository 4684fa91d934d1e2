// Compressed reduce-scatter and allreduce over MPI (compressed_collectives.h).
#include "comm/mpi/compressed_collectives.h"

#include <algorithm>

#include "core/check.h"
#include "core/tensor.h"
#include "comm/compression.h"
#include "comm/shard_plan.h"

namespace ddp {

namespace {

// Every rank's part of a bucket of `count` values: MPI's counts and displacements.
struct PartLayout {
  std::vector<int> counts, offsets;
  PartLayout(size_t count, int size) : counts(static_cast<size_t>(size)), offsets(counts.size()) {
    for (int q = 0; q < size; ++q) {
      const Span part = shard_part(count, size, q);
      counts[static_cast<size_t>(q)] = static_cast<int>(part.numel);
      offsets[static_cast<size_t>(q)] = static_cast<int>(part.offset);
    }
  }
};

// Casts the bucket, sends part q to rank q and sums this rank's part over every rank in rank
// order (in the format, or in float32), into scratch.bucket at the part's place. Returns the
// part.
Span sum_my_part(MPI_Comm comm, const float* data, size_t count, Compression format,
                 CompressedSum sum, CompressedScratch& scratch) {
  DDP_CHECK(count <= static_cast<size_t>(INT32_MAX),
            "compressed collective of " << count << " values is too large");
  int size = 1, rank = 0;
  DDP_MPI_CHECK(MPI_Comm_size(comm, &size));
  DDP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  const Span mine = shard_part(count, size, rank);
  const size_t n = static_cast<size_t>(size);
  if (scratch.bucket.size() < count) scratch.bucket.resize(count);
  if (scratch.received.size() < std::max<size_t>(n * mine.numel, 1))
    scratch.received.resize(std::max<size_t>(n * mine.numel, 1));
  compress(format, data, count, scratch.bucket.data());
  const PartLayout send(count, size);
  std::vector<int> recv_counts(n, static_cast<int>(mine.numel)), recv_offsets(n);
  for (size_t q = 0; q < n; ++q) recv_offsets[q] = static_cast<int>(q * mine.numel);
  DDP_MPI_CHECK(MPI_Alltoallv(scratch.bucket.data(), send.counts.data(), send.offsets.data(),
                              MPI_UINT16_T, scratch.received.data(), recv_counts.data(),
                              recv_offsets.data(), MPI_UINT16_T, comm));
  uint16_t* out = scratch.bucket.data() + mine.offset;
  if (sum == CompressedSum::Float32) {
    sum_in_float32(format, scratch.received.data(), n, mine.numel, out);
    return mine;
  }
  std::copy(scratch.received.data(), scratch.received.data() + mine.numel, out);
  for (size_t q = 1; q < n; ++q)
    add_compressed(format, scratch.received.data() + q * mine.numel, mine.numel, out);
  return mine;
}

}  // namespace

void compressed_reduce_scatter(MPI_Comm comm, float* data, size_t count, Compression format,
                               CompressedSum sum, CompressedScratch& scratch) {
  const Span mine = sum_my_part(comm, data, count, format, sum, scratch);
  decompress(format, scratch.bucket.data() + mine.offset, mine.numel, data + mine.offset);
}

void compressed_allreduce(MPI_Comm comm, float* data, size_t count, Compression format,
                          CompressedSum sum, CompressedScratch& scratch) {
  sum_my_part(comm, data, count, format, sum, scratch);
  int size = 1;
  DDP_MPI_CHECK(MPI_Comm_size(comm, &size));
  const PartLayout parts(count, size);
  DDP_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, scratch.bucket.data(),
                               parts.counts.data(), parts.offsets.data(), MPI_UINT16_T, comm));
  decompress(format, scratch.bucket.data(), count, data);
}

}  // namespace ddp
