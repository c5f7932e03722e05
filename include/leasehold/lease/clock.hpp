// leasehold/lease: the one reader of the boot clock, the clock of every deadline.
//
// DESIGN.md "Time": all deadlines use CLOCK_BOOTTIME, which keeps counting while a VM is
// suspended (CLOCK_MONOTONIC does not, so a resumed holder could believe a lease is still
// valid). Never wall-clock time. The read goes through the vDSO (tens of ns, no syscall, no
// allocation, no lock: fine on the rt thread and in the C ABI's check_deadline).
//
// Nothing else in the product calls clock_gettime(CLOCK_BOOTTIME). The reader lives in lease, the
// module every other may depend on, though lease's own code reads no clock (LeaseTable takes
// `now_ns`): io's BootClock, the shm table and its C ABI, the resource, the supervisor's
// kill-switch and control socket, the harness and the CLI all call it. Header-only, so it adds
// nothing to link (libleasehold-check stays self-contained).
#pragma once

#include <cstdint>
#include <ctime>

namespace leasehold {

/// Nanoseconds since boot on CLOCK_BOOTTIME. Never decreases; includes suspended time.
/// Never fails on Linux >= 2.6.39 (the clock id is always valid), so there is no error path.
/// Drivers only (tools, tests, BootClock, the rt thread): a core takes `now_ns` from its caller.
inline std::int64_t boottime_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace leasehold
