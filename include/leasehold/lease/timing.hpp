// leasehold/lease: the safety inequality, the pause budget and the kill deadline (DESIGN.md
// "Time"), computed once.
//
//   safe  ⇔  kill_after·(1+ρ) + wheel_granularity + kill_latency_budget  <  ttl·(1−ρ)
//   pause budget  B = ttl − (kill_after·(1+ρ) + wheel_granularity + kill_latency_budget)
//   measured budget B_meas = ttl − (kill_after·(1+ρ) + lateness + kill_latency)
//
// Everything is integer nanoseconds; ρ (the bound on the clock-rate difference between two
// hosts, dimensionless) is carried in parts per billion. Every rounding goes toward safety:
// ρ is rounded up to the next ppb, kill_after·(1+ρ) up to the next ns and ttl·(1−ρ) down, so
// the check never calls a configuration safe that exact arithmetic would refuse, and a budget
// is never larger than the exact one. Intermediate products are 128-bit; results saturate at
// the int64 range. The supervisor's start-up check, the pause model and the simulator all call
// these functions; nothing else computes the inequality. kill_deadline_ns, the supervisor's
// deadline rule, works on its unsigned boot-clock ns.
#pragma once

#include "leasehold/lease/assert.hpp"

#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>

namespace leasehold::timing {

inline constexpr std::int64_t kPpb = 1'000'000'000;  ///< ρ = rho_ppb / kPpb
inline constexpr std::int64_t kNsPerMs = 1'000'000;

/// ρ in parts per billion, rounded up (toward safety). `rho` must be in [0, 1); a NaN or
/// negative value gives 0 (callers range-check ρ first and name the bad value).
inline std::int64_t rho_ppb_of(double rho) noexcept {
  if (!(rho > 0.0)) return 0;
  if (rho >= 1.0) return kPpb;
  return static_cast<std::int64_t>(std::ceil(rho * static_cast<double>(kPpb)));
}

/// The inputs of the inequality, all in ns except rho_ppb. Negative values are treated as 0.
struct Inputs {
  std::int64_t ttl_ns = 0;
  std::int64_t kill_after_ns = 0;
  std::int64_t wheel_granularity_ns = 0;
  std::int64_t kill_latency_budget_ns = 0;
  std::int64_t rho_ppb = 0;  ///< ρ in ppb, [0, kPpb]; rho_ppb_of() converts a double
};

/// The two sides of the inequality and the budget, in ns.
struct Safety {
  bool safe = false;               ///< left_ns < right_ns
  std::int64_t left_ns = 0;        ///< ceil(kill_after·(1+ρ)) + wheel_granularity + kill_latency_budget
  std::int64_t right_ns = 0;       ///< floor(ttl·(1−ρ))
  std::int64_t pause_budget_ns = 0;///< ttl − left_ns (DESIGN.md's budget; negative: unsafe)
  std::int64_t margin_ns = 0;      ///< right_ns − left_ns: how far inside the inequality (> 0 iff safe)
};

namespace detail {
using Wide = __int128;
constexpr std::int64_t clamp0(std::int64_t v) noexcept { return v < 0 ? 0 : v; }
constexpr std::int64_t saturate(Wide v) noexcept {
  constexpr Wide hi = std::numeric_limits<std::int64_t>::max();
  constexpr Wide lo = std::numeric_limits<std::int64_t>::min();
  return static_cast<std::int64_t>(v > hi ? hi : v < lo ? lo : v);
}
constexpr Wide clamp_ppb(std::int64_t ppb) noexcept { return ppb < 0 ? 0 : ppb > kPpb ? kPpb : ppb; }
}  // namespace detail

/// ceil(ns·(1+ρ)): a local duration as long as it may last on the other host's clock.
constexpr std::int64_t stretch_up_ns(std::int64_t ns, std::int64_t rho_ppb) noexcept {
  const detail::Wide p = static_cast<detail::Wide>(detail::clamp0(ns)) * (kPpb + detail::clamp_ppb(rho_ppb));
  return detail::saturate((p + kPpb - 1) / kPpb);
}

/// floor(ns·(1−ρ)): a remote duration as short as it may last on this host's clock.
constexpr std::int64_t shrink_down_ns(std::int64_t ns, std::int64_t rho_ppb) noexcept {
  const detail::Wide p = static_cast<detail::Wide>(detail::clamp0(ns)) * (kPpb - detail::clamp_ppb(rho_ppb));
  return detail::saturate(p / kPpb);
}

/// The safety inequality and the configured pause budget.
constexpr Safety check_safety(const Inputs& in) noexcept {
  Safety s;
  const detail::Wide left = static_cast<detail::Wide>(stretch_up_ns(in.kill_after_ns, in.rho_ppb)) +
                            detail::clamp0(in.wheel_granularity_ns) + detail::clamp0(in.kill_latency_budget_ns);
  s.left_ns = detail::saturate(left);
  s.right_ns = shrink_down_ns(in.ttl_ns, in.rho_ppb);
  s.safe = left < s.right_ns;
  s.pause_budget_ns = detail::saturate(static_cast<detail::Wide>(detail::clamp0(in.ttl_ns)) - left);
  s.margin_ns = detail::saturate(static_cast<detail::Wide>(s.right_ns) - left);
  return s;
}

/// The pause budget measured on a machine: the configured one with the wheel granularity and
/// the kill-latency budget replaced by a measured timer lateness and kill latency (ns).
constexpr std::int64_t measured_pause_budget_ns(const Inputs& in, std::int64_t lateness_ns,
                                                std::int64_t kill_latency_ns) noexcept {
  Inputs m = in;
  m.wheel_granularity_ns = lateness_ns;
  m.kill_latency_budget_ns = kill_latency_ns;
  return check_safety(m).pause_budget_ns;
}

/// Milliseconds to ns, saturating (the configuration's fields are in ms).
constexpr std::int64_t ms_to_ns(std::uint64_t ms) noexcept {
  return detail::saturate(static_cast<detail::Wide>(ms) * kNsPerMs);
}

/// The supervisor's kill deadline of a lease, ns on its boot clock (DESIGN.md "Time": valid_until
/// = the send time of the last acknowledged request + kill_after): `send_ns` (ns, CLOCK_BOOTTIME,
/// the send time of the request lockd answered) plus `kill_after_ns` (ns; ms_to_ns converts the
/// flag). Both must be at most INT64_MAX (a boot-clock reading, and a flag through ms_to_ns), so
/// the sum is exact; anything else is a caller's arithmetic gone wrong (a send time wrapped below
/// zero), and it aborts (LEASEHOLD_ASSERT) rather than return a deadline: saturating would hand
/// the kill-switch "never", wrapping a deadline in the past. The grant, every refresh answer and
/// every worker-liveness answer compute their deadline here.
constexpr std::uint64_t kill_deadline_ns(std::uint64_t send_ns, std::uint64_t kill_after_ns) noexcept {
  constexpr auto kMaxTerm = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  LEASEHOLD_ASSERT(send_ns <= kMaxTerm && kill_after_ns <= kMaxTerm);
  return send_ns + kill_after_ns;
}

/// A configuration in the units of its flags: `ttl_ms`, `kill_after_ms`, `kill_latency_budget_ms`
/// in ms, `wheel_granularity_ns` in ns, `clock_rate_bound` as ρ (a fraction: 1e-3 = 1000 ppm).
/// The supervisor's SupervisorConfig and the pause model's Timing are such configurations.
template <class C>
concept ConfiguredTiming = requires(const C& c) {
  { c.ttl_ms } -> std::convertible_to<std::uint64_t>;
  { c.kill_after_ms } -> std::convertible_to<std::uint64_t>;
  { c.kill_latency_budget_ms } -> std::convertible_to<std::uint64_t>;
  { c.wheel_granularity_ns } -> std::convertible_to<std::uint64_t>;
  { c.clock_rate_bound } -> std::convertible_to<double>;
};

/// The inputs of the inequality for a configuration: ms to ns and the granularity saturating at
/// the int64 range, ρ to ppb rounded up. The one conversion the supervisor's start-up check and
/// the pause model both use, so the budget they report for the same flags is the same number.
template <ConfiguredTiming C>
Inputs inputs_of(const C& c) noexcept {
  Inputs in;
  in.ttl_ns = ms_to_ns(c.ttl_ms);
  in.kill_after_ns = ms_to_ns(c.kill_after_ms);
  in.wheel_granularity_ns = detail::saturate(static_cast<detail::Wide>(static_cast<std::uint64_t>(c.wheel_granularity_ns)));
  in.kill_latency_budget_ns = ms_to_ns(c.kill_latency_budget_ms);
  in.rho_ppb = rho_ppb_of(c.clock_rate_bound);
  return in;
}

}  // namespace leasehold::timing
