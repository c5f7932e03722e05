// leasehold/pause: the pause-tolerance model behind `leasehold pause-probe` — pure functions.
//
// What it is for: a perf engineer freezes a supervisor for a sweep of pause lengths and needs to
// know, per pause, whether mutual exclusion held, and whether the result agrees with the safety
// condition of DESIGN.md "Time":
//
//   kill_after·(1+ρ) + wheel_granularity + kill_latency_budget  <  ttl·(1−ρ)
//   configured pause budget  B_cfg = ttl − (kill_after·(1+ρ) + wheel_granularity + kill_latency_budget)
//
// A pause shorter than B_cfg must never let another holder acquire the name while the old sandbox
// still runs; past it, recovery (the kill-switch at resume, or the first heartbeat answer `lost`)
// bounds the overlap (EventualMutualExclusion). The probe also reports the budget the machine
// actually delivers, with the two assumed terms replaced by measurements:
//
//   measured pause budget  B_meas(q) = ttl − (kill_after·(1+ρ) + lateness_q + kill_latency_q)
//
// lateness_q: the rt thread's wake-up lateness (shm stats histogram, counted only outside the
// probe's own freezes, upper bound of the log2 bucket holding the q-quantile; q = p99 or max);
// kill_latency_q: per trial, from the moment the supervisor could act on a due kill deadline
// (max(thaw, valid_until)) to the sandbox's death seen on its pidfd; q over the trials that needed
// a kill (nearest rank).
//
// Everything here is pure (times are parameters, CLOCK_BOOTTIME ns as int64), so the verdicts are
// unit-tested without processes. Header-only (library leasehold_pause): the trial runner
// (harness/pause_trial.hpp), the `leasehold` CLI (tools/cmd_pause_probe.cpp) and the tests link it.
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/lease/timing.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold::pause {

// ---- bounds ------------------------------------------------------------------------------------
inline constexpr std::size_t kPausesMax = 256;             ///< pauses in one sweep
inline constexpr std::uint32_t kStepsMax = 255;            ///< --steps upper bound
inline constexpr std::uint64_t kPauseMsMax = 3'600'000;    ///< one pause: at most an hour
inline constexpr std::size_t kSandboxLogLinesMax = 100'000;  ///< lines parsed from one sandbox log
inline constexpr std::size_t kHistogramBuckets = 65;       ///< shm/layout.hpp Histogram
/// A trial's measured freeze (freeze request → thaw request) that differs from the requested
/// pause by more than this is reported, and classified, with the measured length.
inline constexpr std::int64_t kPauseToleranceNs = 1'000'000;
/// ρ accepted by the probe: DESIGN.md "Time" (the supervisor refuses above 10 % as well).
inline constexpr double kClockRateBoundMax = 0.1;

/// The configured timing of the supervisor under test (its flags, or its `status` answer).
struct Timing {
  std::uint64_t ttl_ms = 0;
  std::uint64_t kill_after_ms = 0;
  std::uint64_t heartbeat_interval_ms = 0;
  std::uint64_t kill_latency_budget_ms = 0;
  std::uint64_t wheel_granularity_ns = 0;
  double clock_rate_bound = 1e-3;  ///< ρ
};

/// B_cfg in ns (may be negative: the configuration is unsafe). DESIGN.md "Time".
inline std::int64_t configured_budget_ns(const Timing& t) {
  return timing::check_safety(timing::inputs_of(t)).pause_budget_ns;
}

/// B_meas in ns for a measured lateness and kill latency (both ns).
inline std::int64_t measured_budget_ns(const Timing& t, std::uint64_t lateness_ns,
                                       std::uint64_t kill_latency_ns) {
  return timing::measured_pause_budget_ns(
      timing::inputs_of(t), static_cast<std::int64_t>(std::min<std::uint64_t>(lateness_ns, INT64_MAX)),
      static_cast<std::int64_t>(std::min<std::uint64_t>(kill_latency_ns, INT64_MAX)));
}

// ---- the sweep ---------------------------------------------------------------------------------

/// The default sweep: `steps`+1 pauses evenly from 0 to 2·ttl (ms, rounded to whole ms).
/// Empty when steps is 0 or above kStepsMax, or ttl_ms is 0.
inline std::vector<std::uint64_t> default_sweep_ms(std::uint64_t ttl_ms, std::uint32_t steps) {
  std::vector<std::uint64_t> out;
  if (steps == 0 || steps > kStepsMax || ttl_ms == 0 || ttl_ms > kPauseMsMax / 2) return out;
  for (std::uint32_t i = 0; i <= steps; ++i) out.push_back((2 * ttl_ms * i + steps / 2) / steps);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

/// Parses a comma-separated list of pause lengths: "0,250,500", each optionally suffixed "ms"
/// or "s" (fractions allowed with "s": "1.5s"). The lengths in ms, or invalid_argument naming
/// the bad element (empty, not a number, above kPauseMsMax, more than kPausesMax elements).
inline Result<std::vector<std::uint64_t>> parse_pause_list(std::string_view text) {
  std::vector<std::uint64_t> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = text.find(',', pos);
    std::string_view item = text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) return Status::invalid("empty pause length in \"" + std::string(text) + "\"");
    double scale = 1.0;  // ms
    std::string_view num = item;
    if (num.size() > 2 && num.substr(num.size() - 2) == "ms") {
      num.remove_suffix(2);
    } else if (num.size() > 1 && num.back() == 's') {
      num.remove_suffix(1);
      scale = 1000.0;
    }
    double v = 0;
    const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    if (ec != std::errc() || end != num.data() + num.size() || !(v >= 0) || !std::isfinite(v))
      return Status::invalid("pause length \"" + std::string(item) + "\" is not a non-negative number of ms (e.g. 250, 250ms, 1.5s)");
    const double ms = v * scale;
    if (ms > static_cast<double>(kPauseMsMax)) {
      return Status::invalid("pause length \"" + std::string(item) + "\" is above the limit of " +
                             std::to_string(kPauseMsMax) + " ms");
    }
    if (out.size() == kPausesMax)
      return Status::invalid("more than " + std::to_string(kPausesMax) + " pause lengths");
    out.push_back(static_cast<std::uint64_t>(std::llround(ms)));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

// ---- histograms (shm stats, log2 buckets) ------------------------------------------------------

/// A copy of one shm stats histogram (shm/layout.hpp: bucket b counts values with bit_width == b).
struct HistogramSnapshot {
  std::uint64_t count = 0;
  std::uint64_t sum = 0;
  std::uint64_t max = 0;
  std::array<std::uint64_t, kHistogramBuckets> buckets{};
};

/// Largest value bucket b can hold: 0 for b = 0, else 2^b − 1 (UINT64_MAX for b = 64).
inline std::uint64_t bucket_upper(std::size_t b) {
  if (b == 0) return 0;
  if (b >= 64) return UINT64_MAX;
  return (std::uint64_t{1} << b) - 1;
}

/// What was recorded between two snapshots of the same histogram (after − before). `max` is the
/// exact maximum when it rose in between, else the upper bound of the highest non-empty bucket.
inline HistogramSnapshot histogram_delta(const HistogramSnapshot& before, const HistogramSnapshot& after) {
  HistogramSnapshot d;
  d.count = after.count - before.count;
  d.sum = after.sum - before.sum;
  std::size_t top = 0;
  for (std::size_t b = 0; b < kHistogramBuckets; ++b) {
    d.buckets[b] = after.buckets[b] >= before.buckets[b] ? after.buckets[b] - before.buckets[b] : 0;
    if (d.buckets[b] != 0) top = b;
  }
  if (d.count == 0) return d;
  d.max = after.max > before.max ? after.max : bucket_upper(top);
  return d;
}

/// Adds `delta` into `total` (a running sum of clean windows). `max` keeps the larger.
inline void histogram_add(HistogramSnapshot& total, const HistogramSnapshot& delta) {
  total.count += delta.count;
  total.sum += delta.sum;
  total.max = std::max(total.max, delta.max);
  for (std::size_t b = 0; b < kHistogramBuckets; ++b) total.buckets[b] += delta.buckets[b];
}

/// Upper bound of the q-quantile (0 < q ≤ 1): the upper value of the bucket holding the
/// ceil(q·count)-th smallest value, capped by `max`. 0 for an empty histogram.
inline std::uint64_t histogram_quantile_upper(const HistogramSnapshot& h, double q) {
  if (h.count == 0) return 0;
  const double want = std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(h.count));
  const std::uint64_t rank = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(want));
  std::uint64_t seen = 0;
  for (std::size_t b = 0; b < kHistogramBuckets; ++b) {
    seen += h.buckets[b];
    if (seen >= rank) return std::min(bucket_upper(b), h.max == 0 ? bucket_upper(b) : h.max);
  }
  return h.max;
}

/// Nearest-rank quantile of samples (0 for none).
inline std::int64_t sample_quantile(std::vector<std::int64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double want = std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size()));
  const std::size_t rank = std::max<std::size_t>(1, static_cast<std::size_t>(want));
  return v[std::min(rank, v.size()) - 1];
}

// ---- the probe sandbox's log -------------------------------------------------------------------
//
// The sandbox (`leasehold pause-probe-sandbox`) polls check_deadline on its slot every ~1 ms and
// writes one line per change of the answer, each with CLOCK_BOOTTIME ns:
//   start t=<ns> slot=<n> epoch=<n> pid=<n>
//   valid t=<ns> vu=<ns>                first accepted check (after start or after a refusal)
//   refused t=<ns> last=<ns> vu=<ns>    first refused check; last = the last accepted check
//   late t=<ns> vu=<ns>                 an accepted check at t > valid_until read after it (a bug)
//   exit t=<ns> accepts=<n> refusals=<n> late=<n>
// A killed sandbox cannot write its end: an interval still open at the end of the log lasted
// until the process died (the caller knows when).

/// One run of accepted checks: [first_ns, last_ns]; open = still accepting when the log ended.
struct ValidityInterval {
  std::int64_t first_ns = 0;
  std::int64_t last_ns = 0;
  bool open = false;
};

struct SandboxLog {
  std::int64_t start_ns = 0;
  std::uint32_t slot = 0;
  std::uint64_t epoch = 0;
  std::vector<ValidityInterval> intervals;
  std::vector<std::int64_t> refusals_ns;  ///< time of each first refused check
  std::uint64_t late_accepts = 0;
  std::int64_t late_accept_max_ns = 0;    ///< largest t − valid_until among late accepts
  bool exited = false;                    ///< the sandbox ended by itself (wrote `exit`)
};

namespace detail {
inline bool field(std::string_view line, std::string_view key, std::int64_t& out) {
  const std::string k = " " + std::string(key) + "=";
  const std::size_t p = line.find(k);
  if (p == std::string_view::npos) return false;
  const char* b = line.data() + p + k.size();
  const char* e = line.data() + line.size();
  return std::from_chars(b, e, out).ec == std::errc();
}
}  // namespace detail

/// Parses a sandbox log. A torn last line (the process was killed mid-write) is ignored; any
/// other malformed line, or more than kSandboxLogLinesMax lines, is corrupt, the message naming
/// the line number.
inline Result<SandboxLog> parse_sandbox_log(std::string_view text) {
  SandboxLog log;
  std::size_t lines = 0;
  std::size_t pos = 0;
  bool started = false;
  while (pos < text.size()) {
    const std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) break;  // torn last line
    const std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (++lines > kSandboxLogLinesMax)
      return Status{Errc::corrupt, "sandbox log has more than " + std::to_string(kSandboxLogLinesMax) + " lines"};
    if (line.empty() || line.front() == '#') continue;
    const std::string_view kind = line.substr(0, line.find(' '));
    std::int64_t t = 0, a = 0, b = 0;
    auto bad = [&](const char* what) {
      return Status{Errc::corrupt, "sandbox log line " + std::to_string(lines) + ": " + what + ": \"" + std::string(line) + "\""};
    };
    if (!detail::field(line, "t", t)) return bad("no t=");
    if (kind == "start") {
      if (!detail::field(line, "slot", a) || !detail::field(line, "epoch", b)) return bad("start needs slot= and epoch=");
      log.start_ns = t;
      log.slot = static_cast<std::uint32_t>(a);
      log.epoch = static_cast<std::uint64_t>(b);
      started = true;
    } else if (!started) {
      return bad("before the start line");
    } else if (kind == "valid") {
      if (!log.intervals.empty() && log.intervals.back().open) return bad("valid twice without a refusal");
      log.intervals.push_back({t, t, true});
    } else if (kind == "refused") {
      if (!detail::field(line, "last", a)) return bad("refused needs last=");
      if (!log.intervals.empty() && log.intervals.back().open) {
        log.intervals.back().last_ns = a;
        log.intervals.back().open = false;
      }
      log.refusals_ns.push_back(t);
    } else if (kind == "late") {
      if (!detail::field(line, "vu", a)) return bad("late needs vu=");
      ++log.late_accepts;
      log.late_accept_max_ns = std::max(log.late_accept_max_ns, t - a);
    } else if (kind == "exit") {
      if (!log.intervals.empty() && log.intervals.back().open) {
        log.intervals.back().last_ns = t;
        log.intervals.back().open = false;
      }
      log.exited = true;
    } else {
      return bad("unknown line kind");
    }
  }
  if (!started) return Status{Errc::corrupt, "sandbox log has no start line"};
  return log;
}

/// The sandbox also keeps the time of its latest accepted check in a small shared file (one
/// store per check, no syscall), which survives its SIGKILL. An interval the log left open ended
/// there — not at the death, which can come much later on a busy host. Returns false when the
/// value contradicts the log (earlier than the open interval's first accept).
inline bool close_open_interval(SandboxLog& log, std::int64_t last_accept_ns) {
  if (log.intervals.empty() || !log.intervals.back().open) return true;
  if (last_accept_ns < log.intervals.back().first_ns) return false;
  log.intervals.back().last_ns = last_accept_ns;
  log.intervals.back().open = false;
  return true;
}

/// Did the sandbox accept a check (its own go-ahead for a side effect) anywhere in [from, to]?
/// An open interval counts as accepting until `open_until_ns` (the process's death, or now).
inline bool accepted_within(const SandboxLog& log, std::int64_t from_ns, std::int64_t to_ns,
                            std::int64_t open_until_ns) {
  if (to_ns < from_ns) return false;
  for (const auto& iv : log.intervals) {
    const std::int64_t last = iv.open ? std::max(iv.last_ns, open_until_ns) : iv.last_ns;
    if (iv.first_ns <= to_ns && last >= from_ns) return true;
  }
  return false;
}

/// The last accepted check at or before `at_ns` (0 if none).
inline std::int64_t last_accept_before(const SandboxLog& log, std::int64_t at_ns) {
  std::int64_t best = 0;
  for (const auto& iv : log.intervals) {
    if (iv.first_ns > at_ns) continue;
    best = std::max(best, iv.open ? at_ns : std::min(iv.last_ns, at_ns));
  }
  return best;
}

// ---- one trial ---------------------------------------------------------------------------------

/// Where in the heartbeat cycle the freeze starts.
enum class Phase : std::uint8_t {
  /// Refreshes to lockd are dropped first (the probe's relay), and the freeze starts `guard`
  /// before the sandbox's valid_until: the worst case the pause budget is defined for.
  worst = 0,
  /// The freeze starts at a random moment of a healthy heartbeat cycle.
  random = 1,
};
inline std::string_view to_string(Phase p) { return p == Phase::worst ? "worst" : "random"; }

/// What one trial observed (CLOCK_BOOTTIME ns; 0 = did not happen / unknown).
struct TrialObservation {
  std::uint64_t pause_ms = 0;
  Phase phase = Phase::random;
  std::int64_t cut_ns = 0;            ///< refreshes dropped from here (worst phase)
  std::int64_t freeze_ns = 0;         ///< freeze requested
  std::int64_t frozen_ns = 0;         ///< freeze confirmed (cgroup.events frozen 1 / state T)
  std::int64_t thaw_ns = 0;           ///< thaw requested (freeze_ns + pause, unless the probe was late)
  std::int64_t thawed_ns = 0;         ///< thaw confirmed
  std::int64_t end_ns = 0;            ///< observation ended
  std::int64_t valid_until_ns = 0;    ///< the slot's valid_until when the freeze started
  std::int64_t expiry_lo_ns = 0;      ///< lockd's expiry of the lease, lower bound (show: send + ttl_left)
  std::int64_t expiry_hi_ns = 0;      ///< upper bound (show: receive + ttl_left + 1 ms)
  std::int64_t grant_send_ns = 0;     ///< the contender's first successful acquire: sent
  std::int64_t grant_recv_ns = 0;     ///<   and answered
  std::int64_t last_deny_send_ns = 0; ///< its last refused attempt (lockd answered Deny), sent
  std::int64_t death_ns = 0;          ///< the sandbox's pidfd was seen readable (by the probe)
  std::int64_t revoked_ns = 0;        ///< the slot's revoked bit first seen set
  std::int64_t refreshed_ns = 0;      ///< valid_until first moved after the thaw (lease kept)
  std::int64_t sup_confirmed_ns = 0;  ///< the supervisor's own kill-confirmed time (shm kill stats)
  std::uint64_t kills_deadline = 0;   ///< supervisor status counters: deadline kills in the trial
  std::uint64_t recovery_answers = 0; ///<   heartbeat answers lost/unknown in the trial
  std::string error;                  ///< the trial could not be run (then nothing else counts)
};

/// The codes are the CSV's `outcome_code` and the plot's classes: they never change meaning.
enum class Outcome : std::uint8_t {
  kept = 0,                  ///< no kill needed: the lease was refreshed after the pause
  killed_before_expiry = 1,  ///< the sandbox died before lockd's expiry / any other grant
  violation = 2,             ///< another holder was granted the name while the sandbox ran
  unbounded = 3,             ///< a violation that recovery did not end while observed
  error = 4,                 ///< the trial could not be run, or lockd's side of it is unknown
  killed_after_expiry = 5,   ///< died after lockd's expiry, but no other holder was granted first
};
inline std::string_view to_string(Outcome o) {
  switch (o) {
    case Outcome::kept: return "kept";
    case Outcome::killed_before_expiry: return "killed-before-expiry";
    case Outcome::violation: return "violation";
    case Outcome::unbounded: return "unbounded";
    case Outcome::error: return "error";
    case Outcome::killed_after_expiry: return "killed-after-expiry";
  }
  return "error";
}

/// The verdict on one trial (all durations ns; nullopt = not applicable / unknown).
struct TrialResult {
  Outcome outcome = Outcome::error;
  bool under_budget = false;          ///< pause < B_cfg
  bool killed = false;                ///< the sandbox died during the trial
  std::string killed_by;              ///< "kill-switch", "recovery", "" (not killed)
  bool killed_before_expiry = false;  ///< died before lockd's expiry (lower bound)
  std::optional<std::int64_t> margin_ns;        ///< expiry_lo − death (> 0: safe side)
  bool violation = false;             ///< grant answered before the sandbox died
  std::int64_t window_ns = 0;         ///< death − grant_send (upper estimate of the overlap)
  std::int64_t pause_ns = 0;          ///< the pause classified: effective_pause_ns()
  std::optional<std::int64_t> window_bound_ns;  ///< pause − (ttl − kill_after) + recovery
  std::optional<std::int64_t> recovery_ns;      ///< death − thaw
  std::optional<std::int64_t> kill_latency_ns;  ///< death − max(thawed, valid_until)
  std::optional<std::int64_t> refusal_lag_ns;   ///< first refusal after the freeze − valid_until
  bool side_effects_refused = true;   ///< no accepted check after valid_until nor in the window
  bool ok = false;                    ///< agrees with DESIGN.md "Time"
  bool pause_missed = false;          ///< the sandbox died before the freeze took hold
  std::string note;
};

/// The sandbox's death: every observation of it comes after the fact, so the earliest one is the
/// tightest bound — the probe's pidfd watch or the supervisor's own kill-confirmed time (its
/// SCHED_FIFO rt thread sees `populated 0` / the pidfd at once, while a busy host can delay the
/// probe's thread). 0 when neither saw it.
inline std::int64_t effective_death_ns(const TrialObservation& o) {
  if (o.death_ns == 0) return o.sup_confirmed_ns;
  if (o.sup_confirmed_ns == 0) return o.death_ns;
  return std::min(o.death_ns, o.sup_confirmed_ns);
}

/// The freeze as the probe timed it: thaw request − freeze request (nullopt before both).
inline std::optional<std::int64_t> measured_pause_ns(const TrialObservation& o) {
  if (o.freeze_ns == 0 || o.thaw_ns == 0 || o.thaw_ns < o.freeze_ns) return std::nullopt;
  return o.thaw_ns - o.freeze_ns;
}

/// True when the measured freeze differs from the requested pause by more than
/// kPauseToleranceNs (the probe thawed late, e.g. on a loaded host).
inline bool pause_differs(const TrialObservation& o) {
  const auto m = measured_pause_ns(o);
  const std::int64_t asked = static_cast<std::int64_t>(o.pause_ms) * 1'000'000;
  return m && (*m - asked > kPauseToleranceNs || asked - *m > kPauseToleranceNs);
}

/// The pause the trial stands for: the measured one when it differs, else the requested one.
inline std::int64_t effective_pause_ns(const TrialObservation& o) {
  return pause_differs(o) ? *measured_pause_ns(o) : static_cast<std::int64_t>(o.pause_ms) * 1'000'000;
}

/// Classifies one trial against the configured timing. Rules (DESIGN.md "Time"):
///  * violation  ⇔ the contender's grant was answered before the sandbox's death (a certain
///    overlap); window = death − grant_send (an upper estimate). A grant with the sandbox still
///    alive at the end of the observation is `unbounded`.
///  * side effects refused ⇔ no late accept, no accepted check in [valid_until, lease refreshed
///    again or death or end], none in [grant_send, death].
///  * lockd's expiry = Show's lower bound, else the contender's grant (sent). A death with neither,
///    and no Deny sent at or after the death (lockd still held the name then), says nothing
///    about lockd: `error` (e.g. the probe cannot reach lockd, or holds the wrong key).
///  * ok ⇔ no error, side effects refused, not unbounded, and no violation under the budget.
/// The pause is effective_pause_ns(o): what the supervisor really got when the probe thawed late.
inline TrialResult classify(const TrialObservation& o, const SandboxLog* log, const Timing& t) {
  TrialResult r;
  const std::int64_t budget = configured_budget_ns(t);
  const std::int64_t pause_ns = effective_pause_ns(o);
  r.pause_ns = pause_ns;
  r.under_budget = pause_ns < budget;
  if (!o.error.empty()) {
    r.outcome = Outcome::error;
    r.note = o.error;
    return r;
  }
  const std::int64_t death = effective_death_ns(o);
  const std::int64_t end = o.end_ns != 0 ? o.end_ns : std::max({o.thawed_ns, o.thaw_ns, death});
  r.killed = death != 0;
  if (r.killed) {
    r.killed_by = o.kills_deadline > 0 ? "kill-switch" : o.recovery_answers > 0 ? "recovery" : "unknown";
    const std::int64_t resumed = std::max(o.thawed_ns, o.thaw_ns);
    if (o.thaw_ns != 0 && death >= o.thaw_ns) r.recovery_ns = death - o.thaw_ns;
    if (death >= resumed) r.kill_latency_ns = death - std::max(resumed, o.valid_until_ns);
    const std::int64_t expiry = o.expiry_lo_ns != 0 ? o.expiry_lo_ns : o.grant_send_ns;
    if (expiry != 0) {
      r.margin_ns = expiry - death;
      r.killed_before_expiry = death < expiry;
    } else if (o.last_deny_send_ns != 0 && o.last_deny_send_ns >= death) {
      r.killed_before_expiry = true;  // lockd still refused the name after the death
    } else {
      r.outcome = Outcome::error;
      r.killed = false;
      r.killed_by.clear();
      r.pause_missed = o.frozen_ns != 0 && death <= o.frozen_ns;
      r.note = "lockd's side is unknown: no expiry from Show and no answer to the contender after the "
               "sandbox died (is the probe's --lockd the supervisor's lockd, with the same key?)";
      return r;
    }
  }
  if (o.grant_recv_ns != 0 && (!r.killed || o.grant_recv_ns < death)) {
    r.violation = true;
    r.window_ns = (r.killed ? death : end) - o.grant_send_ns;
  }
  if (r.recovery_ns)
    r.window_bound_ns = pause_ns - static_cast<std::int64_t>(t.ttl_ms - std::min(t.ttl_ms, t.kill_after_ms)) * 1'000'000 + *r.recovery_ns;

  if (r.killed && o.frozen_ns != 0 && death <= o.frozen_ns) {
    r.pause_missed = true;
    r.note = "killed before the freeze took hold";
  }
  if (r.violation) {
    r.outcome = r.killed ? Outcome::violation : Outcome::unbounded;
  } else if (r.killed) {
    r.outcome = r.killed_before_expiry ? Outcome::killed_before_expiry : Outcome::killed_after_expiry;
    if (r.outcome == Outcome::killed_after_expiry)
      r.note += (r.note.empty() ? "" : "; ") + std::string("died after lockd's expiry; no other holder was granted first");
  } else if (o.refreshed_ns != 0) {
    r.outcome = Outcome::kept;
  } else {
    r.outcome = Outcome::unbounded;  // neither refreshed nor killed: nothing bounded it
    r.note = "the sandbox was neither refreshed nor killed while observed";
  }

  if (log != nullptr) {
    const std::int64_t open_until = r.killed ? death : end;
    if (log->late_accepts > 0) {
      r.side_effects_refused = false;
      r.note += (r.note.empty() ? "" : "; ") + std::to_string(log->late_accepts) + " check(s) accepted after valid_until";
    }
    if (o.valid_until_ns != 0) {
      const std::int64_t stop = o.refreshed_ns != 0 ? o.refreshed_ns - 1 : open_until;
      // The valid_until seen at the freeze may still have been extended by an answer in flight;
      // an accept after it is only a failure if the lease was not refreshed in between.
      if (o.refreshed_ns == 0 && accepted_within(*log, o.valid_until_ns, stop, open_until)) {
        r.side_effects_refused = false;
        r.note += (r.note.empty() ? "" : "; ") + std::string("accepted a check after valid_until");
      }
      for (std::int64_t ref : log->refusals_ns) {
        if (ref >= o.freeze_ns || (o.cut_ns != 0 && ref >= o.cut_ns)) {
          r.refusal_lag_ns = ref - o.valid_until_ns;
          break;
        }
      }
    }
    if (r.violation && accepted_within(*log, o.grant_send_ns, open_until, open_until)) {
      r.side_effects_refused = false;
      r.note += (r.note.empty() ? "" : "; ") + std::string("accepted a check while another holder had the name");
    }
  }
  r.ok = r.side_effects_refused && r.outcome != Outcome::unbounded && !(r.violation && r.under_budget);
  if (r.violation && r.under_budget)
    r.note += (r.note.empty() ? "" : "; ") + std::string("violation under the pause budget");
  return r;
}

// ---- the sweep's verdict -----------------------------------------------------------------------

struct SweepVerdict {
  bool ok = true;
  std::size_t trials = 0, errors = 0, violations = 0, violations_under_budget = 0, unbounded = 0,
              side_effects_accepted = 0;
  std::optional<std::int64_t> window_max_ns;      ///< largest violation window
  std::optional<std::int64_t> recovery_max_ns;    ///< largest resume → death
  std::optional<std::int64_t> window_excess_max_ns;  ///< max(window − (pause − B_cfg)) over violations
  std::optional<std::uint64_t> safe_pause_max_ms;     ///< longest pause without a violation (that took hold)
  std::optional<std::uint64_t> violating_pause_min_ms;  ///< shortest pause with one
  std::string line;  ///< the final verdict line
};

/// Sums up the trials. `ok` is false when a pause under the budget produced a violation, when a
/// sandbox accepted a check it should have refused, or when a violation was not ended by
/// recovery, or when no trial measured anything (every one an error, or none run); otherwise
/// errors do not fail the sweep but are counted in the line.
inline SweepVerdict sweep_verdict(const std::vector<TrialObservation>& obs,
                                  const std::vector<TrialResult>& res, const Timing& t) {
  SweepVerdict v;
  const std::int64_t budget = configured_budget_ns(t);
  for (std::size_t i = 0; i < res.size() && i < obs.size(); ++i) {
    const auto& r = res[i];
    ++v.trials;
    if (r.outcome == Outcome::error) {
      ++v.errors;
      continue;
    }
    if (!r.side_effects_refused) ++v.side_effects_accepted;
    if (r.outcome == Outcome::unbounded) ++v.unbounded;
    if (r.recovery_ns) v.recovery_max_ns = std::max(v.recovery_max_ns.value_or(INT64_MIN), *r.recovery_ns);
    // The pause the trial stands for (the measured one when the probe thawed late).
    const std::int64_t pause_ns = effective_pause_ns(obs[i]);
    const auto pause_ms = static_cast<std::uint64_t>(std::llround(static_cast<double>(pause_ns) / 1e6));
    if (r.violation) {
      ++v.violations;
      if (r.under_budget) ++v.violations_under_budget;
      v.window_max_ns = std::max(v.window_max_ns.value_or(INT64_MIN), r.window_ns);
      const std::int64_t excess = pause_ns - budget;
      v.window_excess_max_ns = std::max(v.window_excess_max_ns.value_or(INT64_MIN), r.window_ns - excess);
      v.violating_pause_min_ms = std::min(v.violating_pause_min_ms.value_or(UINT64_MAX), pause_ms);
    } else if (!r.pause_missed) {
      v.safe_pause_max_ms = std::max(v.safe_pause_max_ms.value_or(0), pause_ms);
    }
  }
  v.ok = v.trials > v.errors && v.violations_under_budget == 0 && v.side_effects_accepted == 0 && v.unbounded == 0;
  auto ms = [](std::int64_t ns) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f ms", static_cast<double>(ns) / 1e6);
    return std::string(b);
  };
  std::string line = v.ok ? "PASS" : "FAIL";
  line += ": " + std::to_string(v.trials - v.errors) + " pause(s) measured, budget " + ms(budget);
  line += "; violations under the budget: " + std::to_string(v.violations_under_budget);
  line += "; past it: " + std::to_string(v.violations - v.violations_under_budget);
  if (v.window_max_ns) line += " (window <= " + ms(*v.window_max_ns) + ")";
  if (v.recovery_max_ns) line += "; recovery <= " + ms(*v.recovery_max_ns);
  if (v.unbounded) line += "; UNBOUNDED: " + std::to_string(v.unbounded);
  if (v.side_effects_accepted) line += "; SIDE EFFECTS ACCEPTED: " + std::to_string(v.side_effects_accepted);
  if (v.errors) line += "; errors: " + std::to_string(v.errors);
  v.line = std::move(line);
  return v;
}

/// The verdict of a sweep stopped before its end (Ctrl-C): never ok, whatever the trials run so
/// far showed, and the line says so first: "INTERRUPTED after k of n trial(s): <the rest>".
inline SweepVerdict interrupted_verdict(SweepVerdict v, std::size_t planned) {
  v.ok = false;
  const std::size_t colon = v.line.find(": ");
  const std::string rest = colon == std::string::npos ? v.line : v.line.substr(colon + 2);
  v.line = "INTERRUPTED after " + std::to_string(v.trials) + " of " + std::to_string(planned) +
           " trial(s): " + rest;
  return v;
}

}  // namespace leasehold::pause
