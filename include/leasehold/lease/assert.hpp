// leasehold/lease: assertions that stay on in every build.
//
// LEASEHOLD_ASSERT(cond) guards an invariant that protects data (an epoch that only grows, a
// valid_until that never moves back, a clock read that never goes backwards, two maps that
// agree). It is compiled in every build type, RelWithDebInfo and NDEBUG included: continuing
// past a broken invariant could grant a name twice or publish a stale epoch, which is worse than
// a crash that a supervisor restarts. On failure it writes "file:line: LEASEHOLD_ASSERT(expr)
// failed" to stderr with one write(2) (no allocation, no locks: safe on the rt thread) and
// calls std::abort().
//
// LEASEHOLD_ASSERT_SLOW(cond) is for checks too costly for the hot path of a release build
// (the codec's decode-after-encode round trip). It is compiled on when NDEBUG is not defined
// (the debug and sanitizer presets) or when LEASEHOLD_SLOW_ASSERTS is defined to 1. Otherwise
// `cond` is evaluated only after enable_slow_asserts() (one load and a branch when it was not
// called): the simulator calls it, so the libraries it links - built once, for production too -
// check their slow invariants under it.
#pragma once

namespace leasehold::detail {

/// Reports a failed assertion and aborts. Never returns.
[[noreturn]] void assert_failed(const char* file, int line, const char* expr) noexcept;

/// Whether LEASEHOLD_ASSERT_SLOW runs in code compiled without slow assertions. Written only by
/// enable_slow_asserts(), before the program starts its threads.
extern bool slow_asserts_enabled;

}  // namespace leasehold::detail

namespace leasehold {

/// Turns LEASEHOLD_ASSERT_SLOW on for the whole process (the simulator, at start). Call it
/// before any thread that runs checked code starts; it cannot be turned off again.
void enable_slow_asserts() noexcept;

}  // namespace leasehold

#define LEASEHOLD_ASSERT(cond)                                                   \
  do {                                                                           \
    if (!(cond)) [[unlikely]]                                                    \
      ::leasehold::detail::assert_failed(__FILE__, __LINE__, #cond);             \
  } while (false)

#ifndef LEASEHOLD_SLOW_ASSERTS
#ifdef NDEBUG
#define LEASEHOLD_SLOW_ASSERTS 0
#else
#define LEASEHOLD_SLOW_ASSERTS 1
#endif
#endif

namespace leasehold {

/// Whether LEASEHOLD_ASSERT_SLOW checks run here: always where they are compiled on, else after
/// enable_slow_asserts(). For a slow check that is not one condition (SandboxTable::check).
inline bool slow_asserts_on() noexcept { return LEASEHOLD_SLOW_ASSERTS || detail::slow_asserts_enabled; }

}  // namespace leasehold

#define LEASEHOLD_ASSERT_SLOW(cond)                    \
  do {                                                 \
    if (::leasehold::slow_asserts_on()) [[unlikely]]   \
      LEASEHOLD_ASSERT(cond);                          \
  } while (false)
