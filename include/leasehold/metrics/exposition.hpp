// leasehold/metrics: a daemon's counters as values with a name, a type and a help text, and
// their Prometheus text exposition (format 0.0.4, what /metrics serves).
//
// One list per daemon names every value once (lockd: LockService::metrics(), which its Stats
// answer is built from too; the supervisor: Supervisor's snapshot); the formatter turns it
// into text. Names are snake_case; the exposition prefixes the daemon's ("leasehold_lockd_")
// and gives a counter the `_total` suffix. A value with a `reason` is one series of a family
// labelled reason="<reason>" (refusals, rejections), one name for every reason.
//
// Every string_view of a Sample or a HistogramSample points at static storage (a literal, an
// enum's to_string): a snapshot is copied between threads without owning its text.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold::metrics {

enum class Kind : std::uint8_t {
  counter,  ///< only grows while the daemon runs; exported as <name>_total
  gauge,    ///< a value now (a size, a setting, a latency quantile, a flag 0/1)
};

/// One value of a daemon.
struct Sample {
  std::string_view name;    ///< snake_case, e.g. "grants"; with a reason the family, e.g. "refusal"
  Kind kind = Kind::counter;
  std::uint64_t value = 0;  ///< exported as value / scale
  std::string_view reason;  ///< empty: no label; else the series reason="<reason>" of family `name`
  std::string_view help;    ///< one line, for # HELP
  /// Left out of lockd's Stats answer while zero (a reason that never occurred: the datagram
  /// must stay within one datagram); /metrics lists every series, zero or not.
  bool sparse = false;
  /// The unit divisor: 1 for a count; 1'000'000'000 for a value in ns exported in seconds.
  std::uint64_t scale = 1;
};

/// The buckets of the shm table's histograms (shm/layout.hpp Histogram): bucket b counts the
/// values v with bit_width(v) == b, so bucket 0 holds v == 0 and bucket b >= 1 holds
/// 2^(b-1) .. 2^b - 1; bucket 64 holds v >= 2^63.
inline constexpr std::size_t kLog2Buckets = 65;

/// A log2-bucket histogram as the shm table records it, exported as a Prometheus histogram
/// <name>_bucket{le="..."} (cumulative; le of bucket b is (2^b - 1) / scale, bucket 64 is
/// le="+Inf"), <name>_sum and <name>_count (the sum of the buckets, so it always equals the
/// +Inf bucket even when the snapshot raced a writer).
struct HistogramSample {
  std::string_view name;  ///< e.g. "heartbeat_rtt_seconds"
  std::string_view help;
  std::array<std::uint64_t, kLog2Buckets> buckets{};  ///< per bucket, not cumulative
  std::uint64_t sum = 0;        ///< of the recorded values, in the recorded unit
  std::uint64_t scale = 1;      ///< as Sample::scale
};

/// What a daemon publishes for /metrics and /healthz at one moment.
struct Snapshot {
  std::vector<Sample> samples;
  std::vector<HistogramSample> histograms;
  bool healthy = true;
  std::string health;  ///< "serving", or why not (one line)
};

/// `value / scale` as an exact decimal ("12", "0.000001023"): no trailing zeros, no exponent.
/// `scale` is 1 or a power of ten up to 10^18.
std::string decimal(std::uint64_t value, std::uint64_t scale);

/// The Prometheus text exposition of `snap` (histograms after the samples). Each family is
/// written once, with its # HELP and # TYPE lines, its series in the order they first appear
/// in the list. `prefix` is the daemon's, e.g. "leasehold_lockd_".
std::string format_text(std::string_view prefix, const Snapshot& snap);

}  // namespace leasehold::metrics
