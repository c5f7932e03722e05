// leasehold/metrics: the hand-over of a daemon's snapshot from the thread that owns its counters
// (lockd's and the supervisor's io thread) to the thread that serves /metrics.
//
// The io thread never waits for the HTTP thread. The HTTP thread asks by writing an eventfd that
// the io thread's loop polls; the io thread, on its next turn, builds a Snapshot and publishes it
// (a pointer swap under a mutex held for no more than that, never while anything is formatted
// or sent). The HTTP thread waits on a condition variable for it, at most a bounded time, and
// reuses a snapshot younger than `fresh_ns`, so a scrape storm costs the io thread at most one
// snapshot per `fresh_ns`. Formatting and the socket are the HTTP thread's alone.
#pragma once

#include "leasehold/metrics/exposition.hpp"

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

namespace leasehold::metrics {

class SnapshotExchange {
 public:
  /// A snapshot at most this old (ns) is served again without asking the io thread.
  static constexpr std::int64_t kFreshNs = 100'000'000;
  /// Opens the eventfd; throws std::system_error when it cannot.
  explicit SnapshotExchange(std::int64_t fresh_ns = kFreshNs);
  ~SnapshotExchange();
  SnapshotExchange(const SnapshotExchange&) = delete;
  SnapshotExchange& operator=(const SnapshotExchange&) = delete;

  // ---- the HTTP thread

  /// The latest snapshot if it is younger than fresh_ns; otherwise asks the io thread for a new
  /// one and waits for it at most `wait_ns`. nullptr when none came in time (the io thread is
  /// stalled or stopped): /metrics then answers 503.
  std::shared_ptr<const Snapshot> get(std::int64_t wait_ns);

  // ---- the io thread

  /// The fd to poll for POLLIN: readable while a snapshot is wanted.
  int wake_fd() const noexcept { return fd_; }
  /// Reads the eventfd (non-blocking); true when a snapshot was asked for since the last call.
  bool take_request() noexcept;
  /// Makes `snap` the latest snapshot and wakes the waiting HTTP thread.
  void publish(Snapshot snap);

 private:
  int fd_ = -1;
  std::int64_t fresh_ns_;
  std::mutex mu_;
  std::condition_variable published_;
  std::shared_ptr<const Snapshot> latest_;  ///< guarded by mu_
  std::int64_t latest_ns_ = 0;              ///< CLOCK_BOOTTIME of latest_; guarded by mu_
  std::uint64_t generation_ = 0;            ///< publishes so far; guarded by mu_
};

}  // namespace leasehold::metrics
