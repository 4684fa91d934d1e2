// distributed.compression on the host: gradient buckets cast to a 16-bit float type
// (core/float16.h) and summed in it, as PyTorch's bf16_compress_hook and fp16_compress_hook
// do. A sum over ranks adds the ranks' values in rank order 0..N-1 and rounds after every
// addition, the same bits whichever rank computes it and on every path (MPI across nodes, the
// shared-memory window with compression_on_node, the NCCL emulation).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddp/config.h"

namespace ddp {

/// Bytes of one gradient value on the link: 4 for Compression::None, 2 otherwise.
size_t compressed_value_bytes(Compression format);

/// out[i] = in[i] rounded to `format` (not None), as its bit pattern.
void compress(Compression format, const float* in, size_t count, uint16_t* out);
/// out[i] = the float32 value of in[i] (exact).
void decompress(Compression format, const uint16_t* in, size_t count, float* out);
/// inout[i] = inout[i] + in[i], rounded to `format`.
void add_compressed(Compression format, const uint16_t* in, size_t count, uint16_t* inout);
/// distributed.compression_sum float32: out[i] = the sum of in[q * count + i] over q < parts,
/// added in float32 in that order and rounded once to `format`. Its error against the exact sum
/// of the 16-bit values: at most (parts - 1) float32 roundings (each within 2^-24 of the partial
/// sum) and one rounding to the format (within 2^-8 for bf16, 2^-11 for fp16, of the result),
/// where the wire's sum rounds to the format after each of the parts - 1 additions.
void sum_in_float32(Compression format, const uint16_t* in, size_t parts, size_t count,
                    uint16_t* out);

/// The same in float32 storage, for the shared-memory path: data[i] = data[i] rounded to
/// `format`, and acc[i] = acc[i] + in[i] rounded to `format` (for values of the format, the
/// bits add_compressed gives).
void round_to(Compression format, float* data, size_t count);
void add_rounded(Compression format, const float* in, size_t count, float* acc);

}  // namespace ddp
