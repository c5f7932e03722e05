#include "leasehold/metrics/exchange.hpp"

#include "leasehold/lease/clock.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <system_error>

namespace leasehold::metrics {

SnapshotExchange::SnapshotExchange(std::int64_t fresh_ns) : fresh_ns_(fresh_ns) {
  fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd for the metrics snapshot");
}

SnapshotExchange::~SnapshotExchange() {
  if (fd_ >= 0) ::close(fd_);
}

std::shared_ptr<const Snapshot> SnapshotExchange::get(std::int64_t wait_ns) {
  std::unique_lock lock(mu_);
  if (latest_ && boottime_ns() - latest_ns_ < fresh_ns_) return latest_;
  const std::uint64_t asked_at = generation_;
  lock.unlock();
  const std::uint64_t one = 1;
  // Non-blocking; a full counter (2^64 - 2 asks unread) still leaves the fd readable.
  [[maybe_unused]] const ssize_t n = ::write(fd_, &one, sizeof one);
  lock.lock();
  if (!published_.wait_for(lock, std::chrono::nanoseconds(wait_ns), [&] { return generation_ != asked_at; }))
    return nullptr;
  return latest_;
}

bool SnapshotExchange::take_request() noexcept {
  std::uint64_t asks = 0;
  return ::read(fd_, &asks, sizeof asks) == static_cast<ssize_t>(sizeof asks) && asks != 0;
}

void SnapshotExchange::publish(Snapshot snap) {
  std::shared_ptr<const Snapshot> next = std::make_shared<const Snapshot>(std::move(snap));
  {
    std::lock_guard lock(mu_);
    latest_.swap(next);
    latest_ns_ = boottime_ns();
    ++generation_;
  }
  published_.notify_all();
  // `next` (the previous snapshot) is freed here, outside the lock.
}

}  // namespace leasehold::metrics
