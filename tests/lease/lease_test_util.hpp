// Shared fixtures for the lease/ tests.
#pragma once

#include "leasehold/lease/lease_table.hpp"

namespace leasehold::testing {

inline constexpr std::int64_t kSecondNs = 1'000'000'000;

inline const SandboxId kA{0xA, 1};
inline const SandboxId kB{0xB, 2};
inline const SandboxId kC{0xC, 3};
inline const WorkerId kW1{0x1, 0x11};
inline const WorkerId kW2{0x2, 0x22};

inline LeaseConfig small_config(LockMode mode = LockMode::lease) {
  LeaseConfig c;
  c.default_ttl_ns = 10 * kSecondNs;
  c.max_ttl_ns = 60 * kSecondNs;
  c.acquiring_ttl_ns = 5 * kSecondNs;
  c.lock_delay_ns = 0;
  c.mode = mode;
  c.worker_liveness_ttl_ns = 10 * kSecondNs;
  c.capacity = 64;
  return c;
}

}  // namespace leasehold::testing
