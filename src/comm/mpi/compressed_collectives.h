// The compressed gradient collectives of the MPI communicator across nodes
// (distributed.compression): a bucket is cast to 16 bits, each rank sums its part of it in
// that type (comm/compression.h: rank order, rounding after every addition) or in float32
// (distributed.compression_sum: rank order, rounded once), and for an
// allreduce the summed parts are allgathered, then everything is cast back into the float32
// bucket. Two bytes per value cross the link where float32 sends four, in the same pattern as a
// ring allreduce: (N-1)/N of the bucket out and in per rank for each half. The sums are the
// same bits on every rank, on any layout of ranks over nodes, as the shared-memory path's with
// compression_on_node. Blocking MPI calls: the communication lane's thread runs them.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/config.h"

namespace ddp {

/// The 16-bit buffers the calls reuse (the lane runs one collective at a time).
struct CompressedScratch {
  std::vector<uint16_t> bucket;    ///< the rank's bucket, cast; then the summed parts
  std::vector<uint16_t> received;  ///< every rank's copy of this rank's part
};

/// Reduce-scatter of [data, data + count): afterwards this rank's part (shard_part) of `data`
/// holds the compressed sum; the rest of the bucket is unchanged.
void compressed_reduce_scatter(MPI_Comm comm, float* data, size_t count, Compression format,
                               CompressedSum sum, CompressedScratch& scratch);

/// Allreduce of [data, data + count): the reduce-scatter, then an allgather of the 16-bit
/// parts; afterwards all of `data` holds the compressed sum.
void compressed_allreduce(MPI_Comm comm, float* data, size_t count, Compression format,
                          CompressedSum sum, CompressedScratch& scratch);

}  // namespace ddp
