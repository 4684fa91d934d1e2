// A small deterministic random number generator (xoshiro256**, seeded by splitmix64).
// Portable by construction: the same seed gives the same stream on every compiler and platform,
// which std:: distributions do not promise. Used for init, synthetic data and shuffling, and
// on a device for PowerSGD's random start (kernels/cuda/powersgd_kernels.h).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DDP_HOST_DEVICE __host__ __device__
#else
#define DDP_HOST_DEVICE
#endif

namespace ddp {

class Rng {
 public:
  DDP_HOST_DEVICE explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& s : s_) s = splitmix64(x);
  }

  DDP_HOST_DEVICE uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform double in [0, 1) with 53 random bits.
  DDP_HOST_DEVICE double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  /// Uniform double in [lo, hi).
  DDP_HOST_DEVICE double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

  /// Uniform integer in [0, bound), bound > 0, without modulo bias (rejection sampling).
  DDP_HOST_DEVICE uint64_t below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x;
    do {
      x = next_u64();
    } while (x >= limit);
    return x % bound;
  }

  /// Standard normal sample (Box-Muller; one value per call for a simple, stateless stream).
  DDP_HOST_DEVICE double normal() {
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  DDP_HOST_DEVICE static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  DDP_HOST_DEVICE static uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t s_[4];
};

}  // namespace ddp
