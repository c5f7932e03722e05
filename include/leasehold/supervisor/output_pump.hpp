#pragma once
// The sandboxes' output, bounded (DESIGN.md "The supervisor"). A sandbox writes its stdout and
// stderr into a pipe; one thread of the supervisor copies each pipe into the sandbox's log file
// up to a cap and reads and discards the rest, so a sandbox can neither fill the log directory's
// filesystem (a tmpfs under /run for root) nor stall on a full pipe, and the io thread never
// does file i/o for it.
#include "leasehold/lease/result.hpp"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace leasehold {

class OutputPump {
 public:
  /// Starts the copying thread. Errors: as eventfd(2) (errc_of_errno).
  Status start();
  /// Stops the thread; pipes still open are drained of what is already in them, then closed,
  /// so every byte read is in its log file when it returns. Idempotent; add() after it is not
  /// copied (the streams are closed by the next stop() or the destructor).
  void stop();
  ~OutputPump();  ///< stop()

  /// Takes ownership of `pipe_read_fd` (the read end of a sandbox's output pipe) and `log_fd` (its
  /// log file, opened for append): copies at most `cap_bytes` into the file, then one line
  /// saying the rest was discarded; closes both at the pipe's end of file. Thread-safe.
  void add(int pipe_read_fd, int log_fd, std::uint64_t cap_bytes);

  /// The bytes read and not written to any log (output past a cap) since start.
  std::uint64_t discarded_bytes() const noexcept { return discarded_.load(std::memory_order_relaxed); }

 private:
  struct Stream {
    int pipe_fd = -1;
    int log_fd = -1;
    std::uint64_t cap = 0;
    std::uint64_t written = 0;
    bool capped = false;
  };
  void run();
  bool pump(Stream& s);  // one read (false: nothing read); closes nothing
  void drain_and_close(Stream& s);

  std::thread thread_;
  int wake_fd_ = -1;  // eventfd: new streams, or stop
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> discarded_{0};
  std::mutex mu_;
  std::vector<Stream> incoming_;  // guarded by mu_
};

}  // namespace leasehold
