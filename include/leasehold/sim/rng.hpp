// leasehold/sim: the simulator's one source of randomness.
//
// xoshiro256** (Blackman & Vigna 2018) seeded through SplitMix64, as TigerBeetle's VOPR and
// FoundationDB's simulator do: every draw of a run comes from one 64-bit seed, so a run replays
// exactly on any machine and any build (no std::random_device, no clock, no distribution of the
// standard library, whose algorithms differ between implementations).
#pragma once

#include <cstdint>

namespace leasehold::sim {

/// SplitMix64 step: used to expand a seed and to derive independent streams.
constexpr std::uint64_t splitmix64(std::uint64_t& x) noexcept {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit constexpr Rng(std::uint64_t seed) noexcept {
    std::uint64_t x = seed;
    for (auto& w : s_) w = splitmix64(x);
  }

  /// The next 64 random bits.
  constexpr std::uint64_t next() noexcept {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform in [0, n); 0 when n == 0. Lemire's multiply-shift with rejection (unbiased).
  constexpr std::uint64_t below(std::uint64_t n) noexcept {
    if (n == 0) return 0;
    const std::uint64_t threshold = (0 - n) % n;
    for (;;) {
      const unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
      if (static_cast<std::uint64_t>(m) >= threshold) return static_cast<std::uint64_t>(m >> 64);
    }
  }

  /// Uniform in [lo, hi] (inclusive); lo when hi <= lo.
  constexpr std::int64_t range(std::int64_t lo, std::int64_t hi) noexcept {
    if (hi <= lo) return lo;
    return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo) + 1));
  }

  /// Uniform in [0, 1) with 53 bits.
  constexpr double unit() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  /// True with probability p (p <= 0: never, p >= 1: always).
  constexpr bool chance(double p) noexcept { return unit() < p; }

  /// An independent generator for stream `stream` (one per node, per path...), so adding draws
  /// in one part of the world does not shift the draws of another.
  constexpr Rng fork(std::uint64_t stream) noexcept {
    std::uint64_t x = next() ^ (stream * 0xD1B54A32D192ED03ULL);
    return Rng(splitmix64(x));
  }

 private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) noexcept {
    return (x << k) | (x >> (64 - k));
  }
  std::uint64_t s_[4]{};
};

}  // namespace leasehold::sim
