// Host casts and sums of distributed.compression (compression.h). Each loop is one scalar
// conversion per value, integer operations the compiler vectorises.
#include "dist/compression.h"

#include "core/check.h"
#include "core/float16.h"

namespace ddp {

namespace {

// Calls fn with the format's encode and decode functions.
template <class Fn>
void with_format(Compression format, Fn&& fn) {
  switch (format) {
    case Compression::Bf16:
      return fn(float_to_bf16, bf16_to_float);
    case Compression::Fp16:
      return fn(float_to_fp16, fp16_to_float);
    case Compression::None:
      break;
  }
  DDP_THROW("gradient compression: no 16-bit type for distributed.compression: none");
}

}  // namespace

size_t compressed_value_bytes(Compression format) {
  return format == Compression::None ? sizeof(float) : sizeof(uint16_t);
}

void compress(Compression format, const float* in, size_t count, uint16_t* out) {
  with_format(format, [&](auto encode, auto) {
    for (size_t i = 0; i < count; ++i) out[i] = encode(in[i]);
  });
}

void decompress(Compression format, const uint16_t* in, size_t count, float* out) {
  with_format(format, [&](auto, auto decode) {
    for (size_t i = 0; i < count; ++i) out[i] = decode(in[i]);
  });
}

void add_compressed(Compression format, const uint16_t* in, size_t count, uint16_t* inout) {
  with_format(format, [&](auto encode, auto decode) {
    for (size_t i = 0; i < count; ++i) inout[i] = encode(decode(inout[i]) + decode(in[i]));
  });
}

void round_to(Compression format, float* data, size_t count) {
  with_format(format, [&](auto encode, auto decode) {
    for (size_t i = 0; i < count; ++i) data[i] = decode(encode(data[i]));
  });
}

void add_rounded(Compression format, const float* in, size_t count, float* acc) {
  with_format(format, [&](auto encode, auto decode) {
    for (size_t i = 0; i < count; ++i) acc[i] = decode(encode(acc[i] + in[i]));
  });
}

}  // namespace ddp
