// leasehold/io: the one log path of the daemons, bounded and non-blocking.
//
// lockd and the supervisor used to write each log line with write(2) on the io thread, so a
// full stderr pipe (a log shipper that stalls, a terminal paused with ^S) stalled every answer,
// heartbeat and expiry. A LogWriter puts lines into a bounded in-memory queue and a writer
// thread of its own drains it to the fd; `write()` never waits for the fd. A line that does not
// fit is dropped whole and counted (`dropped()`): logs are best effort, answers are not.
// The line format is the caller's (unchanged).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace leasehold {

/// Default queue bound (bytes of log text waiting for the fd).
inline constexpr std::size_t kLogQueueBytesDefault = std::size_t{256} << 10;
/// How long the destructor waits for the queue to reach the fd before it leaves the rest.
inline constexpr std::chrono::milliseconds kLogFlushAtExit{1000};

class LogWriter {
 public:
  /// Starts the writer thread for `fd` (not owned, not closed). `capacity_bytes` >= 1 bounds the
  /// queue; the memory is reserved up front, so `write` does not allocate.
  explicit LogWriter(int fd, std::size_t capacity_bytes = kLogQueueBytesDefault);
  /// Waits up to kLogFlushAtExit for the queue to drain, then stops. A writer stuck in write(2)
  /// on a full pipe is left behind (it owns its state), so exit never hangs on a reader.
  ~LogWriter();
  LogWriter(const LogWriter&) = delete;
  LogWriter& operator=(const LogWriter&) = delete;

  /// Queues `text` (one or more whole lines). Never blocks on the fd and never allocates: only
  /// a short mutex hold to copy the bytes. False if it did not fit (dropped, counted per line).
  bool write(std::string_view text) noexcept;
  /// Lines dropped because the queue was full, since start.
  std::uint64_t dropped() const noexcept;
  /// Waits until everything queued so far has reached the fd; false on timeout.
  bool flush(std::chrono::milliseconds timeout) noexcept;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

/// The process's stderr log, started at first use and flushed (bounded) at exit.
LogWriter& stderr_log();

}  // namespace leasehold
