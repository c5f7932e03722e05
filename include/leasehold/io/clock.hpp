// leasehold/io: the one clock every deadline is measured on.
//
// DESIGN.md "Time": all deadlines use CLOCK_BOOTTIME, which keeps counting while a VM is
// suspended (CLOCK_MONOTONIC does not, so a resumed holder could believe a lease is still
// valid). Never wall-clock time. The read goes through the vDSO (tens of ns, no syscall).
#pragma once

#include <cstdint>
#include <ctime>

namespace leasehold {

/// Nanoseconds since boot on CLOCK_BOOTTIME. Never decreases; includes suspended time.
/// Never fails on Linux >= 2.6.39 (the clock id is always valid), so there is no error path.
inline std::int64_t now_boottime_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

inline constexpr std::int64_t kNsPerMs = 1'000'000;
inline constexpr std::int64_t kNsPerS = 1'000'000'000;

}  // namespace leasehold
