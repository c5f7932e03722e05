// Cross-thread wake-up and stop of the event loop (label: concurrent, runs under TSan).
#include "leasehold/io/loop.hpp"

#include "tests/io/io_uring_skip.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace leasehold {
namespace {

TEST(EventLoopWake, WakeFromAnotherThreadRunsTheWakeHandler) {
  LEASEHOLD_REQUIRE_IO_URING();
  ProbeResult error;
  auto loop = EventLoop::create({}, &error);
  ASSERT_NE(loop, nullptr) << error.message;
  std::atomic<int> posted{0};
  int seen = 0;
  loop->set_wake_handler([&] {
    seen = posted.load(std::memory_order_acquire);
    if (seen == 42) loop->stop();
  });
  std::thread other([&] {
    posted.store(42, std::memory_order_release);
    loop->wake();
  });
  EXPECT_EQ(loop->run(), 0);  // returns only through the wake handler's stop()
  other.join();
  EXPECT_EQ(seen, 42);
  EXPECT_GE(loop->stats().wakes, 1u);
}

TEST(EventLoopWake, StopFromAnotherThreadEndsRun) {
  LEASEHOLD_REQUIRE_IO_URING();
  ProbeResult error;
  auto loop = EventLoop::create({}, &error);
  ASSERT_NE(loop, nullptr) << error.message;
  std::atomic<bool> started{false};
  loop->add_timer_after(0, [&] { started.store(true, std::memory_order_release); });
  std::thread other([&] {
    while (!started.load(std::memory_order_acquire)) std::this_thread::yield();
    loop->stop();
  });
  EXPECT_EQ(loop->run(), 0);
  other.join();
  EXPECT_TRUE(started.load());
  // run() can be entered again after a stop.
  loop->add_timer_after(0, [&] { loop->stop(); });
  EXPECT_EQ(loop->run(), 0);
}

TEST(EventLoopWake, ManyWakesFromTwoThreadsCoalesce) {
  LEASEHOLD_REQUIRE_IO_URING();
  ProbeResult error;
  auto loop = EventLoop::create({}, &error);
  ASSERT_NE(loop, nullptr) << error.message;
  constexpr int kPerThread = 1000;
  std::atomic<int> done_threads{0};
  std::atomic<int> produced{0};
  int consumed_max = 0;
  loop->set_wake_handler([&] {
    consumed_max = produced.load(std::memory_order_acquire);
    if (done_threads.load(std::memory_order_acquire) == 2 && consumed_max == 2 * kPerThread) loop->stop();
  });
  auto producer = [&] {
    for (int i = 0; i < kPerThread; ++i) {
      produced.fetch_add(1, std::memory_order_release);
      loop->wake();
    }
    done_threads.fetch_add(1, std::memory_order_release);
    loop->wake();
  };
  std::thread a(producer), b(producer);
  EXPECT_EQ(loop->run(), 0);
  a.join();
  b.join();
  EXPECT_EQ(consumed_max, 2 * kPerThread);
  EXPECT_GE(loop->stats().wakes, 1u);
  // Each drained wake-up consumes at least one write: 2 * kPerThread + 2 from the producers
  // and one from stop(). Spurious poll completions are not counted.
  EXPECT_LE(loop->stats().wakes, static_cast<std::uint64_t>(2 * kPerThread + 3));
}

}  // namespace
}  // namespace leasehold
