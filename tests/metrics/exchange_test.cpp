// The snapshot hand-over (metrics/exchange.cpp): the HTTP side asks through the eventfd and gets
// what the io side published; nothing published in time is nullptr; a fresh snapshot is reused
// without asking.
#include "leasehold/metrics/exchange.hpp"

#include <gtest/gtest.h>

#include <poll.h>

#include <atomic>
#include <thread>

namespace leasehold::metrics {
namespace {

/// Serves requests as a daemon's io thread does: poll the eventfd, publish a snapshot whose
/// first sample counts the snapshots made so far.
class IoSide {
 public:
  explicit IoSide(SnapshotExchange& x) : x_(x), thread_([this] { run(); }) {}
  ~IoSide() {
    stop_ = true;
    thread_.join();
  }
  std::uint64_t made() const { return made_.load(); }

 private:
  void run() {
    while (!stop_) {
      pollfd p{x_.wake_fd(), POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      if (!x_.take_request()) continue;
      Snapshot s;
      s.samples.push_back({"snapshots", Kind::counter, made_.fetch_add(1) + 1, {}, "made"});
      x_.publish(std::move(s));
    }
  }
  SnapshotExchange& x_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> made_{0};
  std::thread thread_;
};

TEST(SnapshotExchange, AnAskIsAnsweredByTheIoSide) {
  SnapshotExchange x(0);  // never fresh: every get asks
  IoSide io(x);
  for (std::uint64_t i = 1; i <= 3; ++i) {
    const auto snap = x.get(10'000'000'000);
    ASSERT_NE(snap, nullptr);
    ASSERT_EQ(snap->samples.size(), 1u);
    EXPECT_EQ(snap->samples[0].value, i);
  }
  EXPECT_EQ(io.made(), 3u);
}

TEST(SnapshotExchange, NothingPublishedIsNullAndTheAskStaysPending) {
  SnapshotExchange x(0);
  EXPECT_EQ(x.get(1'000'000), nullptr);
  EXPECT_TRUE(x.take_request());   // the ask is there for the io thread
  EXPECT_FALSE(x.take_request());  // and read once
}

TEST(SnapshotExchange, AFreshSnapshotIsServedWithoutAsking) {
  SnapshotExchange x(3'600'000'000'000);  // an hour: always fresh once there is one
  Snapshot s;
  s.healthy = false;
  s.health = "not leading";
  x.publish(std::move(s));
  const auto snap = x.get(0);
  ASSERT_NE(snap, nullptr);
  EXPECT_FALSE(snap->healthy);
  EXPECT_EQ(snap->health, "not leading");
  EXPECT_FALSE(x.take_request());  // nothing was asked of the io thread
}

}  // namespace
}  // namespace leasehold::metrics
