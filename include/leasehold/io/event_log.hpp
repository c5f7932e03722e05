// leasehold/io: the daemons' event log, one line format for lockd and the supervisor.
//
// Both daemons describe an event as logfmt fields (`event=grant name=orders epoch=3`), stamped
// with the CLOCK_BOOTTIME reading of the moment it happened. An EventLog puts a header in front
// of those fields and hands the line to a LogWriter (io/log_writer.hpp), so it inherits the
// writer's rule: never a blocking write on the io thread; a line that does not fit the bounded
// queue is dropped and counted. Formatting is a little CPU on the caller's thread, nothing more:
// no lock but the writer's, no system call (the two clock reads are vDSO reads).
//
// A line, logfmt (the default):
//   time=2025-05-01T10:00:00.123Z ts_boot_ns=1234567890123 level=info event=grant name=orders ...
// and JSON (--log-format json), one object per line, every event field a string:
//   {"time":"2025-05-01T10:00:00.123Z","ts_boot_ns":1234567890123,"level":"info","event":"grant",...}
// `time` is the wall clock (RFC 3339, UTC, milliseconds) of the event, derived from its boot
// stamp and the current offset between CLOCK_REALTIME and CLOCK_BOOTTIME; `ts_boot_ns` is the
// stamp itself, the clock every deadline and every other log of the project is measured on
// (DESIGN.md "Time"), so lines of different daemons on one machine order exactly even across a
// wall-clock step. A producer chooses an event's level by starting its fields with `level=L`
// (debug, info, warn, error); without it the event is `info`. Events below the configured level
// are skipped (not counted as dropped); the level can change at any time (SIGHUP).
#pragma once

#include "leasehold/io/log_writer.hpp"

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace leasehold {

enum class LogLevel : std::uint8_t { debug = 0, info = 1, warn = 2, error = 3 };
enum class LogFormat : std::uint8_t { logfmt = 0, json = 1 };

std::string_view to_string(LogLevel level) noexcept;
std::string_view to_string(LogFormat format) noexcept;
/// "debug" | "info" | "warn" | "error" (also "warning"); nullopt otherwise.
std::optional<LogLevel> parse_log_level(std::string_view text) noexcept;
/// "logfmt" | "json"; nullopt otherwise.
std::optional<LogFormat> parse_log_format(std::string_view text) noexcept;

/// RFC 3339 UTC with milliseconds ("2025-05-01T10:00:00.123Z") of `wall_ns` (ns since the epoch).
std::string rfc3339_ms(std::int64_t wall_ns);

/// Appends one formatted line (with its '\n') to `out`. `fields` is the producer's logfmt text
/// without a line break; a leading `level=L` in it is the event's level, else `level`. Values in
/// double quotes may hold spaces; `\"` and `\\` inside them are escapes. Pure: the wall clock is
/// a parameter (tests format with a fixed one).
void format_event(LogFormat format, LogLevel level, std::int64_t boot_ns, std::int64_t wall_ns,
                  std::string_view fields, std::string& out);

/// `text` as a double-quoted logfmt value: `"` and `\` escaped, line breaks as spaces.
std::string quoted_value(std::string_view text);
/// `text` as one logfmt value: as it is when it has no space, quote, '=', backslash or control
/// character (and is not empty), else quoted_value(text).
std::string logfmt_value(std::string_view text);

/// The level of `fields`: its leading `level=L`, or `fallback`.
LogLevel level_of(std::string_view fields, LogLevel fallback = LogLevel::info) noexcept;

class EventLog {
 public:
  /// Lines go to `sink` (not owned; it outlives this).
  explicit EventLog(LogWriter& sink) noexcept : sink_(sink) {}
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  /// Both may be called from any thread at any time (a SIGHUP reload sets the level).
  void set_format(LogFormat format) noexcept { format_.store(format, std::memory_order_relaxed); }
  void set_level(LogLevel level) noexcept { level_.store(level, std::memory_order_relaxed); }
  LogFormat format() const noexcept { return format_.load(std::memory_order_relaxed); }
  LogLevel level() const noexcept { return level_.load(std::memory_order_relaxed); }
  bool enabled(LogLevel level) const noexcept { return level >= this->level(); }

  /// One event at boot-clock time `boot_ns`: `fields` as for format_event. Skipped below the
  /// level; false if the writer's queue was full (the line dropped and counted).
  bool emit(std::int64_t boot_ns, std::string_view fields);
  /// Several events, one per line of `text`, each `ts_boot_ns=N ` followed by its fields (the
  /// form lockd's service collects its log in). A line without the stamp is stamped now.
  bool emit_lines(std::string_view text);
  /// Lines dropped by the writer since start (a full queue).
  std::uint64_t dropped() const noexcept { return sink_.dropped(); }

 private:
  LogWriter& sink_;
  std::atomic<LogFormat> format_{LogFormat::logfmt};
  std::atomic<LogLevel> level_{LogLevel::info};
};

/// The process's event log, over stderr_log(): what both daemons log to.
EventLog& daemon_log();

}  // namespace leasehold
