// leasehold/lockd: group commit on a dedicated store thread.
//
// The io loop never blocks on disk. It collects the ownership changes of a loop turn into a
// batch, tagged with a sequence number (the highest change sequence in it), hands the batch
// over with `submit()` and keeps serving. The store thread commits the batch in one SQLite
// transaction (one fsync), publishes "durable up to seq" and writes the wake eventfd so the
// loop sends the answers that waited for it (DESIGN.md "lockd": ownership changes are
// durable before the answer goes out).
//
// Optimised for: many changes per fsync. While one batch commits, the loop keeps collecting
// into the next one, so under load the batch grows until one commit absorbs a whole fsync
// time's worth of changes. Bounded: at most kBatchesInFlightMax batches are queued; when the
// queue is full `submit()` says so and the loop keeps collecting (and, past its own bound,
// sheds load).
//
// A commit that fails (disk full, I/O error) is fatal: nothing of that batch was answered, the
// thread stops and reports the error; lockd exits and a restart recovers from the store.
//
// StoreThread is the production DurabilityPort (durability.hpp), over either store (store.hpp
// Store: SQLite or etcd). A batch is all durable, or all failed (StoreError: lockd cannot know
// what was written), or all rejected (StoreRejected: etcd refused it because this lockd no
// longer leads; nothing of it was written).
#pragma once

#include "leasehold/lockd/durability.hpp"
#include "leasehold/lockd/store.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace leasehold::lockd {

inline constexpr std::size_t kBatchesInFlightMax = 2;
/// Change-log compaction: a fold of kCompactRowsStep rows dirties random B-tree pages and takes
/// a few hundred ms, so it runs when the store has been idle for kCompactIdleNs and the log holds
/// more than kLogRowsCompactAt rows; under sustained load only once the log exceeds kLogRowsMax
/// (which bounds the log's size and the replay at restart).
inline constexpr std::size_t kLogRowsCompactAt = 32'768;
inline constexpr std::size_t kLogRowsMax = 262'144;
inline constexpr std::size_t kCompactRowsStep = 32'768;
inline constexpr std::int64_t kCompactIdleNs = 200'000'000;
/// Commit latencies kept for the p50/p99 in stats (a ring of the most recent commits).
inline constexpr std::size_t kCommitSamplesMax = 4096;

class StoreThread final : public DurabilityPort {
 public:
  /// Takes the opened store. `wake` runs on the store thread after every commit and on
  /// failure (lockd passes EventLoop::wake; empty = no wake, tests poll durable_seq()). It
  /// must be cheap and thread-safe.
  StoreThread(std::unique_ptr<Store> store, std::function<void()> wake);
  /// Commits what is queued, then stops and joins.
  ~StoreThread() override;
  StoreThread(const StoreThread&) = delete;
  StoreThread& operator=(const StoreThread&) = delete;

  /// Loop thread: queue `changes` (at most kStoreBatchChangesMax), durable once durable_seq()
  /// >= seq. `seq` must not decrease from call to call (a batch of marks only may repeat the
  /// last seq: nothing waits for it). Returns false (and leaves `changes`
  /// untouched) when kBatchesInFlightMax batches are already queued or the thread failed.
  /// `epoch_high_water`: the table's high-water mark when the batch was cut (written with it);
  /// `marks`: restart marks written in the same transaction (`changes` may then be empty; like
  /// `changes`, the caller keeps them when this returns false).
  bool submit(std::vector<StoredName>& changes, std::uint64_t seq, Epoch epoch_high_water = 0,
              const StoreMarks& marks = {});

  // --- DurabilityPort (loop thread) ---------------------------------------------------------
  /// Queues `b` (b.changes.size() <= kStoreBatchChangesMax, b.last_seq not below the last
  /// batch's). false when kBatchesInFlightMax batches are queued or the thread failed; then `b`
  /// is left as it was.
  bool submit(DurableBatch&& b) override;
  /// One `durable` verdict per seq of every batch committed since the last poll; after a
  /// failure, one `failed` verdict (with failure()) per seq of the batch that failed and of the
  /// batches queued behind it, or a single one at the next unsubmitted seq when the store failed
  /// between batches (a compaction). A batch the store rejected (StoreRejected) and the batches
  /// behind it get `rejected` verdicts instead.
  void poll(std::vector<DurabilityVerdict>& out) override;

  /// Waits until every submitted batch is committed (or the thread failed).
  void drain();

  /// Highest seq whose batch is durable (acquire ordering: pairs with the commit's release).
  std::uint64_t durable_seq() const noexcept { return durable_seq_.load(std::memory_order_acquire); }
  /// Batches queued or committing.
  std::size_t in_flight() const;
  /// Set once a commit failed; the message names the store and the cause.
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  std::string failure() const;
  StoreStats stats() const override;

 private:
  using Batch = DurableBatch;
  /// Records `b` and the queued batches as failed (rejected: refused) with `why` (mu_ held).
  void fail_locked(std::string why, const Batch* b, bool rejected = false);
  void run();
  /// Compacts one step if the log is over its bound, or over kLogRowsCompactAt when `idle`.
  void maybe_compact(bool idle);
  void wake() const noexcept;

  std::unique_ptr<Store> store_;
  std::function<void()> wake_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;  ///< signalled after every commit
  std::deque<Batch> queue_;      // guarded by mu_
  bool committing_ = false;      // guarded by mu_
  bool stop_ = false;            // guarded by mu_
  std::string failure_;          // guarded by mu_
  bool rejected_ = false;        // guarded by mu_: the failure was a StoreRejected
  std::vector<std::uint64_t> samples_ns_;  // guarded by mu_; ring of kCommitSamplesMax
  std::size_t sample_next_ = 0;  // guarded by mu_
  StoreStats stats_;             // guarded by mu_ (percentiles computed in stats())
  /// Seq ranges committed and not yet polled; seq ranges that failed (guarded by mu_).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> committed_, failed_ranges_;
  bool failure_polled_ = false;  // loop thread only
  std::uint64_t polled_seq_ = 0;  // loop thread only: highest durable seq handed out by poll()
  std::uint64_t last_seq_ = 0;   // loop thread only
  std::atomic<std::uint64_t> durable_seq_{0};
  std::atomic<bool> failed_{false};
  std::thread thread_;
};

}  // namespace leasehold::lockd
