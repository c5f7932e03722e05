// The loop's hot path does not allocate: receiving, sending, and adding/cancelling timers with
// small captures, once the loop is set up. Counted by replacing the global operator new in this
// test binary only.
#include "leasehold/io/clock.hpp"
#include "leasehold/io/loop.hpp"
#include "tests/common/alloc_counter.hpp"
#include "tests/io/io_uring_skip.hpp"

#include <gtest/gtest.h>

namespace leasehold {
namespace {

TEST(EventLoopAllocation, PingPongAndTimersDoNotAllocate) {
  LEASEHOLD_REQUIRE_IO_URING();
  ProbeResult error;
  auto loop = EventLoop::create({}, &error);
  ASSERT_NE(loop, nullptr) << error.message;
  UniqueFd fa(open_udp_socket(SocketAddress::loopback_v4(0)));
  UniqueFd fb(open_udp_socket(SocketAddress::loopback_v4(0)));
  const SocketAddress b_addr = *local_address(fb.get());
  int echoes = 0;
  int timers_fired = 0;
  SocketId a = loop->add_udp_socket(std::move(fa), [&echoes](const Datagram&) { ++echoes; });
  SocketId b;
  EventLoop* l = loop.get();
  b = loop->add_udp_socket(std::move(fb), [l, &b](const Datagram& d) {
    SocketAddress from = d.source_address();
    l->send_to(b, d.payload, &from);
  });
  ASSERT_TRUE(a.valid() && b.valid());
  const std::byte payload[64] = {};

  using test::g_allocations;
  auto& counting = test::g_count_allocations;
  counting.store(false);
  g_allocations.store(0);
  // Control: the counter sees an allocation (a handler too big to be stored inline).
  counting.store(true);
  {
    char big[64] = {};
    TimerHandler heavy = [big] { (void)big[0]; };
    ASSERT_TRUE(static_cast<bool>(heavy));
  }
  counting.store(false);
  ASSERT_GE(g_allocations.load(), 1);
  g_allocations.store(0);

  constexpr int kRounds = 1000;
  counting.store(true);
  for (int round = 0; round < kRounds; ++round) {
    ASSERT_EQ(loop->send_to(a, payload, &b_addr), 0);
    // Two timers with small captures: one fires now, one is cancelled.
    loop->add_timer_after(0, [&timers_fired] { ++timers_fired; });
    TimerId later = loop->add_timer_after(kNsPerS, [&timers_fired] { ++timers_fired; });
    loop->cancel_timer(later);
    for (int i = 0; i < 1000 && echoes <= round; ++i) ASSERT_GE(loop->run_once(10 * kNsPerMs), 0);
    ASSERT_EQ(echoes, round + 1);
  }
  for (int i = 0; i < 1000 && loop->timers_live() != 0; ++i) ASSERT_GE(loop->run_once(10 * kNsPerMs), 0);
  counting.store(false);
  EXPECT_EQ(g_allocations.load(), 0);
  EXPECT_EQ(timers_fired, kRounds);
  EXPECT_EQ(loop->timers_live(), 0u);
}

}  // namespace
}  // namespace leasehold
