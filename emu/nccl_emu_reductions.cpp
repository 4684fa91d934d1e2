// The reductions of the collectives: each NCCL type's size and name, and the element-wise sum,
// product, maximum, minimum and average of the ranks' staged slots in rank order, with fp16 and
// bf16 values rounded back to their type after every operation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "nccl_emu_internal.h"

namespace {

// Integer sums and products wrap (unsigned arithmetic) instead of overflowing signed types.
template <class T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <class T>
T mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // uint32_t, not the 8-bit type, so the promotion to int cannot overflow.
    using U = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// ----- 16-bit floats -----
// ncclFloat16 and ncclBfloat16 values, stored as their bit patterns. Written apart from the
// library's core/float16.h (bit tricks) on purpose, through frexp/ldexp and an explicit
// round-half-even, so each implementation checks the other. A binary format with kExpBits
// exponent and kFracBits fraction bits, IEEE-style (subnormals, infinities, NaN).
template <int kExpBits, int kFracBits>
class Narrow {
 public:
  Narrow() = default;
  // Rounds to the nearest value of the format, ties to even.
  explicit Narrow(float v) : bits_(encode(v)) {}
  explicit operator float() const { return decode(bits_); }

  friend Narrow operator+(Narrow a, Narrow b) { return Narrow(float(a) + float(b)); }
  friend Narrow operator*(Narrow a, Narrow b) { return Narrow(float(a) * float(b)); }
  friend bool operator<(Narrow a, Narrow b) { return float(a) < float(b); }

 private:
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  static constexpr int kMinExp = 2 - kBias;  // frexp's exponent of the smallest normal value
  static constexpr int kDigits = kFracBits + 1;
  static constexpr uint16_t kInf = ((1u << kExpBits) - 1) << kFracBits;

  static uint16_t encode(float v) {
    const uint16_t sign = std::signbit(v) ? 0x8000u : 0u;
    if (std::isnan(v)) return sign | kInf | (1u << (kFracBits - 1));  // the quiet NaN
    if (std::isinf(v)) return sign | kInf;
    const double a = round_magnitude(std::fabs(static_cast<double>(v)));
    const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -kFracBits), kBias);
    if (a > max_finite) return sign | kInf;
    if (a == 0.0) return sign;
    int e = 0;
    const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    if (e < kMinExp) return sign | static_cast<uint16_t>(std::ldexp(a, kDigits - kMinExp));
    const auto fraction = static_cast<uint16_t>(std::ldexp(2.0 * m - 1.0, kFracBits));
    return sign | static_cast<uint16_t>((e - 1 + kBias) << kFracBits) | fraction;
  }

  // a >= 0 rounded to a multiple of the format's spacing at its binade (fixed below the
  // normal range: gradual underflow). Scaling by a power of two is exact in double.
  static double round_magnitude(double a) {
    int e = 0;
    std::frexp(a, &e);
    const int spacing = std::max(e, kMinExp) - kDigits;
    const double scaled = std::ldexp(a, -spacing);
    double whole = std::floor(scaled);
    const double rest = scaled - whole;
    if (rest > 0.5 || (rest == 0.5 && std::fmod(whole, 2.0) != 0.0)) whole += 1.0;
    return std::ldexp(whole, spacing);
  }

  static float decode(uint16_t h) {
    const double sign = (h & 0x8000u) != 0 ? -1.0 : 1.0;
    const int field = (h & 0x7fffu) >> kFracBits;
    const int fraction = h & ((1 << kFracBits) - 1);
    if (field == (1 << kExpBits) - 1) {
      return static_cast<float>(fraction != 0 ? std::copysign(NAN, sign) : sign * INFINITY);
    }
    if (field == 0) return static_cast<float>(sign * std::ldexp(fraction, kMinExp - kDigits));
    return static_cast<float>(sign *
                              std::ldexp(fraction + (1 << kFracBits), field - kBias - kFracBits));
  }

  uint16_t bits_ = 0;
};

using Half = Narrow<5, 10>;
using BFloat16 = Narrow<8, 7>;
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "stored as their bit patterns");

// ncclAvg's last step; a 16-bit type divides in float, where nranks is exact.
template <class T>
T divide(T sum, int nranks) {
  return static_cast<T>(sum / static_cast<T>(nranks));
}
template <int kExpBits, int kFracBits>
Narrow<kExpBits, kFracBits> divide(Narrow<kExpBits, kFracBits> sum, int nranks) {
  return Narrow<kExpBits, kFracBits>(static_cast<float>(sum) / static_cast<float>(nranks));
}

// out = slot[0] op slot[1] op ... op slot[n-1], left to right, so every rank computes the same
// bits.
template <class T>
void reduce(ncclRedOp_t op, const ncclComm* c, size_t set, void* out_bytes, size_t m) {
  T* out = static_cast<T*>(out_bytes);
  std::memcpy(out, c->slot(set, 0), m * sizeof(T));
  for (int r = 1; r < c->nranks; ++r) {
    const T* x = reinterpret_cast<const T*>(c->slot(set, r));
    switch (op) {
      case ncclSum:
      case ncclAvg:
        for (size_t i = 0; i < m; ++i) out[i] = add(out[i], x[i]);
        break;
      case ncclProd:
        for (size_t i = 0; i < m; ++i) out[i] = mul(out[i], x[i]);
        break;
      case ncclMax:
        for (size_t i = 0; i < m; ++i) out[i] = out[i] < x[i] ? x[i] : out[i];
        break;
      case ncclMin:
        for (size_t i = 0; i < m; ++i) out[i] = x[i] < out[i] ? x[i] : out[i];
        break;
      default:
        break;
    }
  }
  if (op == ncclAvg) {
    for (size_t i = 0; i < m; ++i) out[i] = divide(out[i], c->nranks);
  }
}

}  // namespace

namespace ddp_nccl_emu {
namespace detail {

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* type_name(ncclDataType_t t) {
  static const char* const names[] = {"ncclInt8",     "ncclUint8",      "ncclInt32",
                                      "ncclUint32",   "ncclInt64",      "ncclUint64",
                                      "ncclFloat16",  "ncclFloat32",    "ncclFloat64",
                                      "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return t >= 0 && t < ncclNumTypes ? names[t] : "?";
}

bool reducible(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclInt32:
    case ncclUint32:
    case ncclInt64:
    case ncclUint64:
    case ncclFloat16:
    case ncclFloat32:
    case ncclFloat64:
    case ncclBfloat16:
      return true;
    default:
      return false;
  }
}

void reduce_any(ncclDataType_t t, ncclRedOp_t op, const ncclComm* c, size_t set, void* out,
                size_t m) {
  switch (t) {
    case ncclInt8:
      return reduce<int8_t>(op, c, set, out, m);
    case ncclUint8:
      return reduce<uint8_t>(op, c, set, out, m);
    case ncclInt32:
      return reduce<int32_t>(op, c, set, out, m);
    case ncclUint32:
      return reduce<uint32_t>(op, c, set, out, m);
    case ncclInt64:
      return reduce<int64_t>(op, c, set, out, m);
    case ncclUint64:
      return reduce<uint64_t>(op, c, set, out, m);
    case ncclFloat32:
      return reduce<float>(op, c, set, out, m);
    case ncclFloat64:
      return reduce<double>(op, c, set, out, m);
    case ncclFloat16:
      return reduce<Half>(op, c, set, out, m);
    case ncclBfloat16:
      return reduce<BFloat16>(op, c, set, out, m);
    default:
      return;
  }
}

}  // namespace detail
}  // namespace ddp_nccl_emu
