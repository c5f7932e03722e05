// leasehold/io: the Clock port over the boot clock (boottime_ns(), lease/clock.hpp), the one
// clock every deadline is measured on (DESIGN.md "Time").
//
// Cores (LockService, LeaseTable, the supervisor's core) never read a clock: a driver reads
// one Clock once per loop turn and passes the reading down as `now_ns`. Production drivers use
// BootClock; the simulator passes its own simulated time through the same port.
#pragma once

#include "leasehold/lease/assert.hpp"
#include "leasehold/lease/clock.hpp"

#include <cinttypes>
#include <cstdint>
#include <cstdio>

namespace leasehold {

inline constexpr std::int64_t kNsPerMs = 1'000'000;
inline constexpr std::int64_t kNsPerS = 1'000'000'000;

/// The clock port: nanoseconds in the CLOCK_BOOTTIME domain, never decreasing. One reading per
/// loop turn, passed down as `now_ns`. Not thread-safe: one driver thread owns an instance.
class Clock {
 public:
  virtual ~Clock() = default;
  /// Nanoseconds (CLOCK_BOOTTIME domain); >= every earlier reading of this clock.
  virtual std::int64_t now_ns() = 0;
};

/// Production clock: CLOCK_BOOTTIME through the vDSO. A reading below the previous one breaks
/// every deadline computed from it (a lease could outlive its kill-switch), so it aborts the
/// process (LEASEHOLD_ASSERT) with a message naming both readings rather than hand it on.
class BootClock final : public Clock {
 public:
  std::int64_t now_ns() override {
    const std::int64_t t = boottime_ns();
    if (t < last_ns_) [[unlikely]]
      std::fprintf(stderr,
                   "leasehold: CLOCK_BOOTTIME went backwards: read %" PRId64 " ns after %" PRId64
                   " ns; every deadline depends on it, aborting\n",
                   t, last_ns_);
    LEASEHOLD_ASSERT(t >= last_ns_);
    last_ns_ = t;
    return t;
  }
  /// Test hook: the floor the next reading is checked against (a reading below it aborts).
  void set_floor_for_test(std::int64_t floor_ns) noexcept { last_ns_ = floor_ns; }

 private:
  std::int64_t last_ns_ = 0;
};

}  // namespace leasehold
