// Host casts and sums of distributed.compression (compression.h). Each loop is one scalar
// conversion per value, integer operations the compiler vectorises.
#include "comm/compression.h"

#include "core/check.h"
#include "core/float16.h"

namespace ddp {

namespace {

// The formats as types, so each loop below is compiled for one of them, inlined and vectorised.
struct Bf16 {
  static uint16_t encode(float f) { return float_to_bf16(f); }
  static float decode(uint16_t h) { return bf16_to_float(h); }
};
struct Fp16 {
  static uint16_t encode(float f) { return float_to_fp16(f); }
  static float decode(uint16_t h) { return fp16_to_float(h); }
};

// Calls fn with the format's type (a value of it).
template <class Fn>
void with_format(Compression format, Fn&& fn) {
  switch (format) {
    case Compression::Bf16:
      return fn(Bf16{});
    case Compression::Fp16:
      return fn(Fp16{});
    case Compression::None:
    case Compression::PowerSgd:
      break;
  }
  DDP_THROW(
      "gradient compression: no 16-bit type for distributed.compression: " << to_string(format));
}

}  // namespace

size_t compressed_value_bytes(Compression format) {
  return format == Compression::None ? sizeof(float) : sizeof(uint16_t);
}

void compress(Compression format, const float* in, size_t count, uint16_t* out) {
  with_format(format, [&](auto f) {
    for (size_t i = 0; i < count; ++i) out[i] = f.encode(in[i]);
  });
}

void decompress(Compression format, const uint16_t* in, size_t count, float* out) {
  with_format(format, [&](auto f) {
    for (size_t i = 0; i < count; ++i) out[i] = f.decode(in[i]);
  });
}

void add_compressed(Compression format, const uint16_t* in, size_t count, uint16_t* inout) {
  with_format(format, [&](auto f) {
    for (size_t i = 0; i < count; ++i) inout[i] = f.encode(f.decode(inout[i]) + f.decode(in[i]));
  });
}

void sum_in_float32(Compression format, const uint16_t* in, size_t parts, size_t count,
                    uint16_t* out) {
  with_format(format, [&](auto f) {
    for (size_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      for (size_t q = 0; q < parts; ++q) sum += f.decode(in[q * count + i]);
      out[i] = f.encode(sum);
    }
  });
}

void round_to(Compression format, float* data, size_t count) {
  with_format(format, [&](auto f) {
    for (size_t i = 0; i < count; ++i) data[i] = f.decode(f.encode(data[i]));
  });
}

void add_rounded(Compression format, const float* in, size_t count, float* acc) {
  with_format(format, [&](auto f) {
    for (size_t i = 0; i < count; ++i) acc[i] = f.decode(f.encode(acc[i] + in[i]));
  });
}

}  // namespace ddp
