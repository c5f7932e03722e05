#include "leasehold/lease/assert.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace leasehold::detail {

bool slow_asserts_enabled = false;

void assert_failed(const char* file, int line, const char* expr) noexcept {
  // One write(2) of a stack buffer: no allocation and no stdio lock, so it is safe on any
  // thread (the rt thread included) and cannot deadlock on a lock the failing thread holds.
  char buf[512];
  const int n = std::snprintf(buf, sizeof buf, "%s:%d: LEASEHOLD_ASSERT(%s) failed\n", file, line, expr);
  if (n > 0) {
    const auto len = static_cast<std::size_t>(n) < sizeof buf ? static_cast<std::size_t>(n) : sizeof buf - 1;
    [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, buf, len);
  }
  std::abort();
}

}  // namespace leasehold::detail

namespace leasehold {

void enable_slow_asserts() noexcept { detail::slow_asserts_enabled = true; }

}  // namespace leasehold
