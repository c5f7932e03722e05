// A counting replacement of the global operator new/delete, so a test can assert that a hot
// path does not allocate instead of assuming it. Include it in exactly ONE translation unit of
// a test binary (it defines the replaceable operators). Counting is on while g_count_allocations
// is true (the default).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace leasehold::test {
inline std::atomic<bool> g_count_allocations{true};
inline std::atomic<std::uint64_t> g_allocations{0};
}  // namespace leasehold::test

void* operator new(std::size_t n) {
  if (leasehold::test::g_count_allocations.load(std::memory_order_relaxed))
    leasehold::test::g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// g++ 12 sees free() on memory it believes came from the library operator new; the operator new
// above is malloc, so the pairing is right.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
