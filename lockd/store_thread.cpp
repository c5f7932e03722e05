#include "leasehold/lockd/store_thread.hpp"
#include "leasehold/lease/assert.hpp"

#include <algorithm>
#include <chrono>
#include <ctime>

namespace leasehold::lockd {
namespace {

std::uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

}  // namespace

StoreThread::StoreThread(std::unique_ptr<Store> store, std::function<void()> wake)
    : store_(std::move(store)), wake_(std::move(wake)) {
  samples_ns_.reserve(kCommitSamplesMax);
  thread_ = std::thread([this] { run(); });
}

StoreThread::~StoreThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool StoreThread::submit(std::vector<StoredName>& changes, std::uint64_t seq, Epoch epoch_high_water,
                         const StoreMarks& marks) {
  DurableBatch b{std::min(last_seq_ + 1, seq), seq, std::move(changes), marks, epoch_high_water};
  if (submit(std::move(b))) {
    changes.clear();
    return true;
  }
  changes = std::move(b.changes);
  return false;
}

bool StoreThread::submit(DurableBatch&& b) {
  // The seq order is what durable_seq() reports: a batch below the last one would have seqs
  // counted durable that no commit covered, and lockd answer a grant a crash then loses.
  LEASEHOLD_ASSERT(b.changes.size() <= kStoreBatchChangesMax);
  LEASEHOLD_ASSERT(b.last_seq >= last_seq_ && b.first_seq <= b.last_seq);
  {
    std::lock_guard lock(mu_);
    if (!failure_.empty()) return false;
    if (queue_.size() + (committing_ ? 1 : 0) >= kBatchesInFlightMax) return false;
    queue_.push_back(std::move(b));
    last_seq_ = queue_.back().last_seq;
  }
  cv_.notify_one();
  return true;
}

void StoreThread::poll(std::vector<DurabilityVerdict>& out) {
  const bool failed = failed_.load(std::memory_order_acquire);
  if (durable_seq() == polled_seq_ && (!failed || failure_polled_)) return;  // nothing new: no lock
  std::lock_guard lock(mu_);
  for (const auto& [first, last] : committed_)
    for (std::uint64_t s = first; s <= last; ++s) out.push_back(DurabilityVerdict{s, DurabilityVerdict::Kind::durable, {}});
  if (!committed_.empty()) polled_seq_ = committed_.back().second;
  committed_.clear();
  if (!failed || failure_polled_) return;
  failure_polled_ = true;
  const auto kind = rejected_ ? DurabilityVerdict::Kind::rejected : DurabilityVerdict::Kind::failed;
  if (failed_ranges_.empty()) out.push_back(DurabilityVerdict{last_seq_ + 1, kind, failure_});
  for (const auto& [first, last] : failed_ranges_)
    for (std::uint64_t s = first; s <= last; ++s) out.push_back(DurabilityVerdict{s, kind, failure_});
  failed_ranges_.clear();
}

void StoreThread::fail_locked(std::string why, const Batch* b, bool rejected) {
  failure_ = std::move(why);
  rejected_ = rejected;
  if (b != nullptr) failed_ranges_.emplace_back(b->first_seq, b->last_seq);
  for (const Batch& q : queue_) failed_ranges_.emplace_back(q.first_seq, q.last_seq);
  queue_.clear();
}

void StoreThread::drain() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return (queue_.empty() && !committing_) || !failure_.empty(); });
}

std::size_t StoreThread::in_flight() const {
  std::lock_guard lock(mu_);
  return queue_.size() + (committing_ ? 1 : 0);
}

std::string StoreThread::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

StoreStats StoreThread::stats() const {
  std::vector<std::uint64_t> s;
  StoreStats out;
  {
    std::lock_guard lock(mu_);
    out = stats_;
    s = samples_ns_;
  }
  if (!s.empty()) {
    auto pct = [&](double p) {
      const std::size_t k = std::min(s.size() - 1, static_cast<std::size_t>(p * static_cast<double>(s.size())));
      std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k), s.end());
      return s[k];
    };
    out.commit_ns_p50 = pct(0.50);
    out.commit_ns_p99 = pct(0.99);
  }
  return out;
}

void StoreThread::wake() const noexcept {
  if (wake_) wake_();
}

void StoreThread::maybe_compact(bool idle) {
  const std::uint64_t rows = store_->log_rows();
  {
    std::lock_guard lock(mu_);
    stats_.log_rows = rows;
  }
  if (rows <= kLogRowsCompactAt || (!idle && rows <= kLogRowsMax)) return;
  const std::uint64_t t0 = monotonic_ns();
  std::string error;
  try {
    store_->compact(kCompactRowsStep);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::uint64_t dt = monotonic_ns() - t0;
  std::lock_guard lock(mu_);
  if (!error.empty()) {
    fail_locked(std::move(error), nullptr);
    failed_.store(true, std::memory_order_release);
    wake();
    return;
  }
  ++stats_.compactions;
  stats_.compact_ns_max = std::max(stats_.compact_ns_max, dt);
  stats_.log_rows = store_->log_rows();
}

void StoreThread::run() {
  // When the last batch with changes committed. lockd's lived checkpoints (lived_checkpoint_
  // interval_ns, at most 100 ms apart while any lease is held) are batches without changes:
  // they keep the queue from ever staying empty for kCompactIdleNs, so a store that only sees
  // them is idle too.
  std::uint64_t last_change_ns = monotonic_ns();
  for (;;) {
    Batch batch;
    {
      std::unique_lock lock(mu_);
      const bool woken = cv_.wait_for(lock, std::chrono::nanoseconds(kCompactIdleNs),
                                      [&] { return stop_ || !queue_.empty(); });
      if (!woken) {  // idle: a good moment to fold the change log
        if (!failure_.empty()) continue;
        lock.unlock();
        maybe_compact(true);
        continue;
      }
      if (queue_.empty()) return;  // stop_ and drained

      batch = std::move(queue_.front());
      queue_.pop_front();
      committing_ = true;
    }
    const std::uint64_t t0 = monotonic_ns();
    std::string error;
    bool rejected = false;
    try {
      store_->commit(batch.changes, batch.epoch_high_water, batch.marks);
    } catch (const StoreRejected& e) {
      error = e.what();
      rejected = true;
    } catch (const std::exception& e) {
      error = e.what();
    }
    const std::uint64_t dt = monotonic_ns() - t0;
    {
      std::lock_guard lock(mu_);
      committing_ = false;
      if (!error.empty()) {
        fail_locked(error, &batch, rejected);
      } else {
        committed_.emplace_back(batch.first_seq, batch.last_seq);
        ++stats_.commits;
        stats_.changes += batch.changes.size();
        stats_.batch_changes_max = std::max<std::uint64_t>(stats_.batch_changes_max, batch.changes.size());
        stats_.commit_ns_max = std::max(stats_.commit_ns_max, dt);
        if (samples_ns_.size() < kCommitSamplesMax) samples_ns_.push_back(dt);
        else samples_ns_[sample_next_] = dt;
        sample_next_ = (sample_next_ + 1) % kCommitSamplesMax;
      }
    }
    if (!error.empty()) {
      failed_.store(true, std::memory_order_release);
      idle_cv_.notify_all();
      wake();
      return;
    }
    durable_seq_.store(batch.last_seq, std::memory_order_release);
    idle_cv_.notify_all();
    wake();
    const std::uint64_t now = monotonic_ns();
    if (!batch.changes.empty()) last_change_ns = now;
    maybe_compact(now - last_change_ns >= static_cast<std::uint64_t>(kCompactIdleNs));
  }
}

}  // namespace leasehold::lockd
