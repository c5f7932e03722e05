// Helpers shared by the shm tests: unique table locations that clean up after themselves.
#pragma once

#include "leasehold/shm/table.hpp"

#include <atomic>
#include <string>
#include <unistd.h>

namespace leasehold::shm::test {

/// A fresh shm name per call ("lh-test-<pid>-<n>"); removed when the guard goes away.
struct TempTable {
  explicit TempTable(bool as_path = false) {
    static std::atomic<int> n{0};
    const std::string base = "lh-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    location = as_path ? "/dev/shm/" + base : base;
    remove();
  }
  ~TempTable() { remove(); }
  TempTable(const TempTable&) = delete;
  TempTable& operator=(const TempTable&) = delete;
  void remove() const {
    const std::string path = location.front() == '/' ? location : "/dev/shm/" + location;
    ::unlink(path.c_str());
  }
  std::string path() const { return location.front() == '/' ? location : "/dev/shm/" + location; }
  std::string location;
};

inline TableOptions options_for(const TempTable& t, std::uint32_t slots = 8) {
  TableOptions o;
  o.location = t.location;
  o.slot_count = slots;
  o.liveness_timeout_ns = 1'000'000'000;
  o.slot_cooldown_ns = 1'000'000;
  return o;
}

inline SandboxId sandbox(std::uint64_t n) { return SandboxId{0xABCD000000000000ULL | n, n * 7 + 1}; }

}  // namespace leasehold::shm::test
