// The io_uring event loop over real loopback UDP: multishot receive and its re-arm, the send
// bound, timers, polls. Skips with the probe's reason where io_uring is unavailable.
#include "leasehold/io/loop.hpp"

#include "leasehold/io/clock.hpp"
#include "leasehold/io/udp.hpp"
#include "leasehold/harness/process.hpp"
#include "tests/io/io_uring_skip.hpp"

#include <gtest/gtest.h>
#include <liburing.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <vector>

namespace leasehold {
namespace {

constexpr int kIterationsMax = 2000;  // x 10 ms: a hung test fails instead of hanging CI

std::unique_ptr<EventLoop> make_loop(const LoopConfig& config = {}) {
  ProbeResult error;
  auto loop = EventLoop::create(config, &error);
  EXPECT_NE(loop, nullptr) << error.message;
  return loop;
}

// Runs the loop until `done` (idempotent) holds; false if it never did within kIterationsMax rounds.
bool run_until(EventLoop& loop, const std::function<bool()>& done) {
  for (int i = 0; i < kIterationsMax && !done(); ++i) {
    int r = loop.run_once(10 * kNsPerMs);
    EXPECT_GE(r, 0);
    if (r < 0) return false;
  }
  return done();
}

struct Sender {
  UniqueFd fd{open_udp_socket_blocking(SocketAddress::loopback_v4(0))};
  void send(const SocketAddress& to, const void* data, std::size_t len) {
    ASSERT_EQ(::sendto(fd.get(), data, len, 0, to.sa(), to.length), static_cast<ssize_t>(len));
  }
  void send_index(const SocketAddress& to, std::uint32_t i) { send(to, &i, sizeof i); }
};

struct Received {
  std::vector<std::uint32_t> indices;
  std::vector<SocketAddress> sources;
  RecvHandler handler() {
    return [this](const Datagram& d) {
      std::uint32_t i = 0;
      ASSERT_EQ(d.payload.size(), sizeof i);
      std::memcpy(&i, d.payload.data(), sizeof i);
      indices.push_back(i);
      sources.push_back(d.source_address());
    };
  }
};

SocketId add_socket(EventLoop& loop, RecvHandler h, SocketAddress* bound) {
  UniqueFd fd(open_udp_socket(SocketAddress::loopback_v4(0)));
  EXPECT_TRUE(fd.valid());
  *bound = *local_address(fd.get());
  return loop.add_udp_socket(std::move(fd), std::move(h));
}

std::vector<std::uint32_t> iota(std::uint32_t n) {
  std::vector<std::uint32_t> v(n);
  for (std::uint32_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

// run_once() from inside one of the loop's own handlers aborts (every build): the completions
// being dispatched would be reaped a second time under the dispatch in progress.
TEST(EventLoopDeathTest, RunOnceFromInsideAHandlerAborts) {
  LEASEHOLD_REQUIRE_IO_URING();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto loop = make_loop();
        loop->add_timer_after(0, [&] { loop->run_once(0); });
        for (int i = 0; i < kIterationsMax; ++i) loop->run_once(10 * kNsPerMs);
      },
      "LEASEHOLD_ASSERT\\(!dispatching_\\) failed");
  auto loop = make_loop();
  bool fired = false;
  loop->add_timer_after(0, [&] { fired = true; });
  ASSERT_TRUE(run_until(*loop, [&] { return fired; })) << "the same timer, run from outside, fires";
}

// The descriptors of this process's io_uring instances.
std::vector<int> io_uring_fds() {
  std::vector<int> fds;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string() == "anon_inode:[io_uring]") fds.push_back(std::stoi(e.path().filename().string()));
  }
  return fds;
}

// With the submission queue full, the loop pushes it to the kernel to take a fresh entry; a
// kernel that refuses that submission outright (an unusable ring: here its descriptor was
// replaced by /dev/null) leaves no entry to take, and the loop aborts rather than prepare a
// request in none. A working ring with a one-entry queue goes on.
TEST(EventLoopDeathTest, AFullSubmissionQueueTheKernelRefusesToTakeAborts) {
  LEASEHOLD_REQUIRE_IO_URING();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  LoopConfig c;
  c.sq_entries = 1;  // the wake-up's read, prepared at creation, fills it
  EXPECT_DEATH(
      {
        auto loop = make_loop(c);
        const UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
        for (int fd : io_uring_fds()) ::dup2(null.get(), fd);
        SocketAddress bound;
        add_socket(*loop, [](const Datagram&) {}, &bound);  // its receive needs an entry
      },
      "LEASEHOLD_ASSERT\\(s != nullptr\\) failed");
  auto loop = make_loop(c);
  Received got;
  SocketAddress bound;
  ASSERT_TRUE(add_socket(*loop, got.handler(), &bound).valid());
  bool fired = false;
  loop->add_timer_after(0, [&] { fired = true; });
  Sender sender;
  sender.send_index(bound, 7);
  ASSERT_TRUE(run_until(*loop, [&] { return fired && got.indices.size() == 1; }));
  EXPECT_EQ(got.indices[0], 7u);
}

// Each submitted send completes once: a completion for a send slot at a generation it is not
// at (a duplicate, or one for a reused slot) would free the slot twice and hand its buffer to
// two sends, so it aborts. Posted here from another ring (IORING_OP_MSG_RING) with a send's
// user_data as io/loop.cpp lays it out: kind (2: send) << 56 | slot index << 32 | generation.
TEST(EventLoopDeathTest, ACompletionForASendSlotAtAnotherGenerationAborts) {
  LEASEHOLD_REQUIRE_IO_URING();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto loop = make_loop();
        const std::vector<int> rings = io_uring_fds();
        if (rings.size() != 1) std::_Exit(3);
        io_uring injector{};
        if (io_uring_queue_init(2, &injector, 0) != 0) std::_Exit(4);
        constexpr std::uint64_t kSlot0AtAStaleGeneration = (std::uint64_t{2} << 56) | 0xfffffff0u;
        io_uring_prep_msg_ring(io_uring_get_sqe(&injector), rings[0], 0, kSlot0AtAStaleGeneration, 0);
        io_uring_submit(&injector);
        io_uring_cqe* cqe = nullptr;
        if (io_uring_wait_cqe(&injector, &cqe) != 0 || cqe->res < 0) std::_Exit(5);
        for (int i = 0; i < kIterationsMax; ++i) loop->run_once(10 * kNsPerMs);
      },
      "LEASEHOLD_ASSERT\\(slot.gen == gen_of\\(c.user_data\\)\\) failed");
}

TEST(EventLoop, InvalidConfigIsRefusedWithTheFieldNamed) {
  LEASEHOLD_REQUIRE_IO_URING();
  LoopConfig c;
  c.recv_buffer_count = 3;
  ProbeResult error;
  EXPECT_EQ(EventLoop::create(c, &error), nullptr);
  EXPECT_EQ(error.error, EINVAL);
  EXPECT_NE(error.message.find("recv_buffer_count"), std::string::npos) << error.message;
}

TEST(EventLoop, MultishotReceivesManyDatagramsInOrderWithTheirSource) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  Received got;
  SocketAddress addr;
  ASSERT_TRUE(add_socket(*loop, got.handler(), &addr).valid());
  Sender s;
  const SocketAddress sender_addr = *local_address(s.fd.get());
  constexpr std::uint32_t kRounds = 20, kPerRound = 50;
  for (std::uint32_t r = 0; r < kRounds; ++r) {
    for (std::uint32_t i = 0; i < kPerRound; ++i) s.send_index(addr, r * kPerRound + i);
    ASSERT_TRUE(run_until(*loop, [&] { return got.indices.size() == (r + 1) * kPerRound; }));
  }
  EXPECT_EQ(got.indices, iota(kRounds * kPerRound));
  for (const SocketAddress& a : got.sources) ASSERT_EQ(a, sender_addr) << a.str();
  EXPECT_EQ(loop->stats().datagrams_received, kRounds * kPerRound);
  EXPECT_EQ(loop->stats().kernel_drops, 0u);
}

TEST(EventLoop, TinyBufferRingHitsEnobufsAndRearmsWithoutLoss) {
  LEASEHOLD_REQUIRE_IO_URING();
  LoopConfig c;
  c.recv_buffer_count = 4;
  auto loop = make_loop(c);
  Received got;
  SocketAddress addr;
  ASSERT_TRUE(add_socket(*loop, got.handler(), &addr).valid());
  ASSERT_GE(loop->run_once(0), 0);  // the recvmsg is armed before the burst lands
  Sender s;
  constexpr std::uint32_t kBurst = 64;  // 16x the buffers; fits the socket's receive queue
  for (std::uint32_t i = 0; i < kBurst; ++i) s.send_index(addr, i);
  ASSERT_TRUE(run_until(*loop, [&] { return got.indices.size() == kBurst; }));
  EXPECT_EQ(got.indices, iota(kBurst));
  EXPECT_GE(loop->stats().recv_enobufs, 1u);
  EXPECT_GE(loop->stats().recv_rearms, loop->stats().recv_enobufs);
  EXPECT_EQ(loop->stats().kernel_drops, 0u);
}

TEST(EventLoop, KernelDropsOnAFullReceiveQueueAreCounted) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  Received got;
  UniqueFd fd(open_udp_socket(SocketAddress::loopback_v4(0)));
  ASSERT_EQ(set_socket_buffers(fd.get(), 1, 0), 0);  // the kernel's minimum receive queue
  const SocketAddress addr = *local_address(fd.get());
  Sender s;
  constexpr std::uint32_t kBurst = 200;  // sent before the socket is read at all
  for (std::uint32_t i = 0; i < kBurst; ++i) s.send_index(addr, i);
  ASSERT_TRUE(loop->add_udp_socket(std::move(fd), got.handler()).valid());
  ASSERT_TRUE(run_until(*loop, [&] { return !got.indices.empty(); }));
  std::size_t before = 0;
  for (int i = 0; i < kIterationsMax && got.indices.size() != before; ++i) {  // drain the rest
    before = got.indices.size();
    ASSERT_GE(loop->run_once(20 * kNsPerMs), 0);
  }
  ASSERT_LT(got.indices.size(), kBurst);
  // The drop count travels with the next queued datagram: a sentinel brings it in.
  s.send_index(addr, kBurst);
  ASSERT_TRUE(run_until(*loop, [&] { return !got.indices.empty() && got.indices.back() == kBurst; }));
  EXPECT_EQ(loop->stats().kernel_drops + got.indices.size(), kBurst + 1);
}

TEST(EventLoop, OversizedDatagramIsDroppedAndCounted) {
  LEASEHOLD_REQUIRE_IO_URING();
  LoopConfig c;
  c.recv_buffer_bytes = kRecvOverheadBytes + 64;
  auto loop = make_loop(c);
  std::vector<std::size_t> sizes;
  SocketAddress addr;
  ASSERT_TRUE(add_socket(*loop, [&](const Datagram& d) { sizes.push_back(d.payload.size()); }, &addr).valid());
  Sender s;
  char big[100] = {};
  char small[10] = {};
  s.send(addr, big, sizeof big);
  s.send(addr, small, sizeof small);
  ASSERT_TRUE(run_until(*loop, [&] { return !sizes.empty(); }));
  EXPECT_EQ(sizes, std::vector<std::size_t>{10});
  EXPECT_EQ(loop->stats().datagrams_truncated, 1u);
}

TEST(EventLoop, SendsBeyondTheInFlightBoundAreDroppedAndCounted) {
  LEASEHOLD_REQUIRE_IO_URING();
  LoopConfig c;
  c.sends_in_flight_max = 4;
  auto loop = make_loop(c);
  SocketAddress from;
  SocketId sock = add_socket(*loop, [](const Datagram&) {}, &from);
  UniqueFd sink(open_udp_socket(SocketAddress::loopback_v4(0)));
  const SocketAddress to = *local_address(sink.get());
  std::vector<int> results;
  for (std::uint32_t i = 0; i < 10; ++i) {
    results.push_back(loop->send_to(sock, std::as_bytes(std::span(&i, 1)), &to));
  }
  EXPECT_EQ(results, (std::vector<int>{0, 0, 0, 0, -EAGAIN, -EAGAIN, -EAGAIN, -EAGAIN, -EAGAIN, -EAGAIN}));
  EXPECT_EQ(loop->sends_in_flight(), 4u);
  EXPECT_EQ(loop->stats().sends_dropped_in_flight_full, 6u);
  ASSERT_TRUE(run_until(*loop, [&] { return loop->stats().sends_completed == 4; }));
  EXPECT_EQ(loop->sends_in_flight(), 0u);
  std::vector<std::uint32_t> got;
  std::uint32_t v = 0;
  while (::recv(sink.get(), &v, sizeof v, MSG_DONTWAIT) == sizeof v) got.push_back(v);
  EXPECT_EQ(got, (std::vector<std::uint32_t>{0, 1, 2, 3}));
  std::uint32_t next = 99;
  EXPECT_EQ(loop->send_to(sock, std::as_bytes(std::span(&next, 1)), &to), 0);  // room again
}

TEST(EventLoop, SendRefusesBadArguments) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  SocketAddress from;
  SocketId sock = add_socket(*loop, [](const Datagram&) {}, &from);
  std::vector<std::byte> big(kUdpPayloadBytesMax + 1);
  EXPECT_EQ(loop->send_to(sock, big, &from), -EMSGSIZE);
  EXPECT_EQ(loop->send_to(SocketId{}, std::span(big).first(1), &from), -EBADF);
  EXPECT_EQ(loop->send_to(SocketId{12345ull << 32}, std::span(big).first(1), &from), -EBADF);
  SocketAddress unset;
  EXPECT_EQ(loop->send_to(sock, std::span(big).first(1), &unset), -EDESTADDRREQ);
}

TEST(EventLoop, TimersFireInDeadlineOrderAndNeverEarly) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  std::vector<int> order;
  std::vector<bool> early;
  const std::int64_t t0 = boottime_ns();
  for (int ms : {30, 10, 20}) {
    const std::int64_t deadline = t0 + ms * kNsPerMs;
    ASSERT_TRUE(loop->add_timer_at(deadline, [&order, &early, ms, deadline] {
      order.push_back(ms);
      early.push_back(boottime_ns() < deadline);
    }).valid());
  }
  EXPECT_EQ(loop->timers_live(), 3u);
  ASSERT_TRUE(run_until(*loop, [&] { return order.size() == 3; }));
  EXPECT_EQ(order, (std::vector<int>{10, 20, 30}));
  EXPECT_EQ(early, (std::vector<bool>{false, false, false}));
  EXPECT_EQ(loop->timers_live(), 0u);
  EXPECT_EQ(loop->stats().timers_fired, 3u);
}

TEST(EventLoop, CancelledTimerNeverFires) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  bool cancelled_fired = false;
  bool later_fired = false;
  TimerId t1 = loop->add_timer_after(5 * kNsPerMs, [&] { cancelled_fired = true; });
  TimerId t2 = loop->add_timer_after(30 * kNsPerMs, [&] { later_fired = true; });
  ASSERT_GE(loop->run_once(0), 0);  // t1 is in the kernel now
  EXPECT_TRUE(loop->cancel_timer(t1));
  EXPECT_FALSE(loop->cancel_timer(t1));  // twice: refused
  ASSERT_TRUE(run_until(*loop, [&] { return later_fired; }));
  EXPECT_FALSE(cancelled_fired);
  EXPECT_FALSE(loop->cancel_timer(t2));  // already fired
  ASSERT_TRUE(run_until(*loop, [&] { return loop->timers_live() == 0; }));
}

TEST(EventLoop, PeriodicTimerRepeatsUntilItCancelsItself) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  int ticks = 0;
  TimerId periodic;
  std::vector<std::int64_t> times;
  periodic = loop->add_periodic(5 * kNsPerMs, boottime_ns() + 5 * kNsPerMs, [&] {
    ++ticks;
    times.push_back(boottime_ns());
    if (ticks == 3) {
      EXPECT_TRUE(loop->cancel_timer(periodic));
    }
  });
  ASSERT_TRUE(periodic.valid());
  ASSERT_TRUE(run_until(*loop, [&] { return ticks >= 3; }));
  bool done = false;  // then give a fourth tick every chance to (wrongly) come
  loop->add_timer_after(30 * kNsPerMs, [&] { done = true; });
  ASSERT_TRUE(run_until(*loop, [&] { return done; }));
  EXPECT_EQ(ticks, 3);
  ASSERT_EQ(times.size(), 3u);
  EXPECT_GE(times[1] - times[0], 0);
  EXPECT_EQ(loop->timers_live(), 0u);
  EXPECT_FALSE(loop->add_periodic(0, boottime_ns(), [] {}).valid());
}

TEST(EventLoop, TimerPoolIsBounded) {
  LEASEHOLD_REQUIRE_IO_URING();
  LoopConfig c;
  c.timers_max = 2;
  auto loop = make_loop(c);
  EXPECT_TRUE(loop->add_timer_after(kNsPerS, [] {}).valid());
  EXPECT_TRUE(loop->add_timer_after(kNsPerS, [] {}).valid());
  EXPECT_FALSE(loop->add_timer_after(kNsPerS, [] {}).valid());
  EXPECT_EQ(loop->stats().refused_pool_full, 1u);
}

TEST(EventLoop, PidfdPollFiresWhenTheChildExits) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  int go[2];
  ASSERT_EQ(::pipe2(go, O_CLOEXEC), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    char c;
    (void)!::read(go[0], &c, 1);  // wait for the parent's go
    ::_exit(7);
  }
  ::close(go[0]);
  UniqueFd pidfd(harness::pidfd_open(pid));
  ASSERT_TRUE(pidfd.valid()) << std::strerror(errno);
  int result = 0;
  int calls = 0;
  ASSERT_TRUE(loop->add_poll(pidfd.get(), POLLIN, PollMode::oneshot, [&](int r) {
    result = r;
    ++calls;
  }).valid());
  ASSERT_GE(loop->run_once(0), 0);
  EXPECT_EQ(calls, 0);  // alive: not readable yet
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  ::close(go[1]);
  ASSERT_TRUE(run_until(*loop, [&] { return calls == 1; }));
  EXPECT_TRUE(result & POLLIN);
  siginfo_t info{};
  ASSERT_EQ(::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd.get()), &info, WEXITED), 0);
  EXPECT_EQ(info.si_code, CLD_EXITED);
  EXPECT_EQ(info.si_status, 7);
}

TEST(EventLoop, MultishotPollOnAUnixSocketUntilCancelled) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  int reads = 0;
  PollId poll = loop->add_poll(a.get(), POLLIN, PollMode::multishot, [&](int r) {
    ASSERT_TRUE(r & POLLIN);
    char c;
    while (::recv(a.get(), &c, 1, MSG_DONTWAIT) == 1) ++reads;
  });
  ASSERT_TRUE(poll.valid());
  for (int i = 1; i <= 3; ++i) {
    ASSERT_EQ(::send(b.get(), "x", 1, 0), 1);
    ASSERT_TRUE(run_until(*loop, [&] { return reads == i; }));
  }
  EXPECT_TRUE(loop->cancel_poll(poll));
  EXPECT_FALSE(loop->cancel_poll(poll));
  ASSERT_EQ(::send(b.get(), "x", 1, 0), 1);
  for (int i = 0; i < 5; ++i) ASSERT_GE(loop->run_once(2 * kNsPerMs), 0);
  EXPECT_EQ(reads, 3);
}

TEST(EventLoop, ClosedSocketDeliversNothingAndItsFdGoes) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  int delivered = 0;
  SocketAddress addr;
  SocketId sock = add_socket(*loop, [&](const Datagram&) { ++delivered; }, &addr);
  ASSERT_GE(loop->run_once(0), 0);
  EXPECT_GE(loop->socket_fd(sock), 0);
  EXPECT_TRUE(loop->close_socket(sock));
  EXPECT_FALSE(loop->close_socket(sock));
  EXPECT_EQ(loop->send_to(sock, std::as_bytes(std::span("x", 1)), &addr), -EBADF);
  ASSERT_TRUE(run_until(*loop, [&] { return loop->socket_fd(sock) == -1; }));
  EXPECT_EQ(delivered, 0);
  // The slot is reusable and the old handle does not alias the new socket.
  SocketAddress addr2;
  SocketId sock2 = add_socket(*loop, [&](const Datagram&) { ++delivered; }, &addr2);
  EXPECT_TRUE(sock2.valid());
  EXPECT_NE(sock2, sock);
  EXPECT_EQ(loop->socket_fd(sock), -1);
}

TEST(EventLoop, HandlerCanReplyToTheSource) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  SocketAddress addr;
  SocketId sock;
  sock = add_socket(*loop, [&](const Datagram& d) {
    SocketAddress from = d.source_address();
    EXPECT_EQ(loop->send_to(sock, d.payload, &from), 0);
  }, &addr);
  Sender s;
  s.send_index(addr, 4242);
  std::uint32_t echoed = 0;
  bool got = false;
  ASSERT_TRUE(run_until(*loop, [&] {
    got = got || ::recv(s.fd.get(), &echoed, sizeof echoed, MSG_DONTWAIT) == sizeof echoed;
    return got;
  }));
  EXPECT_EQ(echoed, 4242u);
}

// submit_queued() hands a queued send to the kernel with no run_once: the datagram is at its
// destination before the loop turns again (lockd sends a turn's answers before its log lines).
TEST(EventLoop, SubmitQueuedSendsWithoutATurn) {
  LEASEHOLD_REQUIRE_IO_URING();
  for (const bool single_issuer : {false, true}) {
    LoopConfig c;
    c.single_issuer = single_issuer;
    auto loop = make_loop(c);
    SocketAddress addr;
    const SocketId sock = add_socket(*loop, [](const Datagram&) {}, &addr);
    ASSERT_TRUE(sock.valid());
    Sender to;
    const SocketAddress dest = *local_address(to.fd.get());
    ASSERT_GE(loop->run_once(0), 0);  // the receive and the wake-up armed
    EXPECT_EQ(loop->submit_queued(), 0) << "nothing queued";
    const std::uint32_t value = 7 + (single_issuer ? 1u : 0u);
    ASSERT_EQ(loop->send_to(sock, std::as_bytes(std::span(&value, 1)), &dest), 0);
    EXPECT_EQ(loop->submit_queued(), 1);
    pollfd p{to.fd.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1) << "the datagram did not arrive";
    std::uint32_t got = 0;
    ASSERT_EQ(::recv(to.fd.get(), &got, sizeof got, MSG_DONTWAIT), static_cast<ssize_t>(sizeof got));
    EXPECT_EQ(got, value);
    EXPECT_EQ(loop->submit_queued(), 0) << "submitted once";
    ASSERT_GE(loop->run_once(0), 0);  // reaps the send's completion
  }
}

TEST(EventLoop, SingleIssuerModeReceivesSendsAndFiresTimers) {
  LEASEHOLD_REQUIRE_IO_URING();
  LoopConfig c;
  c.single_issuer = true;
  auto loop = make_loop(c);
  Received got;
  SocketAddress addr;
  ASSERT_TRUE(add_socket(*loop, got.handler(), &addr).valid());
  bool fired = false;
  ASSERT_TRUE(loop->add_timer_after(0, [&] { fired = true; }).valid());
  ASSERT_GE(loop->run_once(0), 0);
  Sender s;
  for (std::uint32_t i = 0; i < 10; ++i) s.send_index(addr, i);
  // Non-waiting iterations must pick completions up too (deferred task work runs on them).
  for (int i = 0; i < kIterationsMax && (got.indices.size() < 10 || !fired); ++i) {
    ASSERT_GE(loop->run_once(0), 0);
    ::usleep(1000);
  }
  EXPECT_EQ(got.indices, iota(10));
  EXPECT_TRUE(fired);
}

TEST(EventLoop, PollsAndSocketsAreBoundedAndBadFdsRefused) {
  LEASEHOLD_REQUIRE_IO_URING();
  LoopConfig c;
  c.polls_max = 1;
  c.sockets_max = 1;
  auto loop = make_loop(c);
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  EXPECT_FALSE(loop->add_poll(-1, POLLIN, PollMode::oneshot, [](int) {}).valid());
  EXPECT_TRUE(loop->add_poll(a.get(), POLLIN, PollMode::oneshot, [](int) {}).valid());
  EXPECT_FALSE(loop->add_poll(b.get(), POLLIN, PollMode::oneshot, [](int) {}).valid());
  EXPECT_FALSE(loop->add_udp_socket(UniqueFd(), [](const Datagram&) {}).valid());
  SocketAddress addr;
  EXPECT_TRUE(add_socket(*loop, [](const Datagram&) {}, &addr).valid());
  EXPECT_FALSE(add_socket(*loop, [](const Datagram&) {}, &addr).valid());
  EXPECT_EQ(loop->stats().refused_pool_full, 2u);
}

TEST(EventLoop, UnixDatagramSocketsReceiveLikeUdp) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd peer(sv[1]);
  Received got;
  ASSERT_TRUE(loop->add_udp_socket(UniqueFd(sv[0]), got.handler()).valid());
  for (std::uint32_t i = 0; i < 5; ++i) ASSERT_EQ(::send(peer.get(), &i, sizeof i, 0), 4);
  ASSERT_TRUE(run_until(*loop, [&] { return got.indices.size() == 5; }));
  EXPECT_EQ(got.indices, iota(5));
}

// A connected UDP socket whose peer is gone gets ICMP port-unreachable as -ECONNREFUSED on its
// receive: the loop counts it, re-arms, and keeps receiving (lockd restarting must not deafen
// a supervisor).
TEST(EventLoop, ReceiveErrorIsCountedAndTheSocketKeepsReceiving) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  UniqueFd fd(open_udp_socket(SocketAddress::loopback_v4(0)));
  const SocketAddress self = *local_address(fd.get());
  SocketAddress gone;
  {
    UniqueFd dead(open_udp_socket(SocketAddress::loopback_v4(0)));
    gone = *local_address(dead.get());
  }  // closed: nothing listens on `gone` any more
  ASSERT_EQ(::connect(fd.get(), gone.sa(), gone.length), 0);
  const int raw = fd.get();
  Received got;
  SocketId sock = loop->add_udp_socket(std::move(fd), got.handler());
  ASSERT_TRUE(sock.valid());
  std::uint32_t v = 1;
  ASSERT_EQ(loop->send_to(sock, std::as_bytes(std::span(&v, 1)), nullptr), 0);
  ASSERT_TRUE(run_until(*loop, [&] { return loop->stats().recv_errors >= 1; }));
  EXPECT_EQ(loop->socket_error(sock), -ECONNREFUSED);
  // A new peer: the same registered socket still receives.
  Sender peer;
  const SocketAddress peer_addr = *local_address(peer.fd.get());
  ASSERT_EQ(::connect(raw, peer_addr.sa(), peer_addr.length), 0);
  peer.send_index(self, 7);
  ASSERT_TRUE(run_until(*loop, [&] { return got.indices.size() == 1; }));
  EXPECT_EQ(got.indices, std::vector<std::uint32_t>{7});
  EXPECT_GE(loop->stats().recv_rearms, 1u);
}

// More requests than the submission queue holds: the loop submits as the SQ fills.
TEST(EventLoop, ThousandsOfTimersBeyondTheSubmissionQueue) {
  LEASEHOLD_REQUIRE_IO_URING();
  LoopConfig c;
  c.sq_entries = 16;
  auto loop = make_loop(c);
  constexpr int kTimers = 2000;
  std::vector<TimerId> ids;
  int fired = 0;
  const std::int64_t now = boottime_ns();
  for (int i = 0; i < kTimers; ++i) {
    // Half fire at once, half are an hour away and get cancelled.
    const std::int64_t deadline = i % 2 == 0 ? now : now + 3600 * kNsPerS;
    ids.push_back(loop->add_timer_at(deadline, [&fired] { ++fired; }));
    ASSERT_TRUE(ids.back().valid());
  }
  EXPECT_EQ(loop->timers_live(), static_cast<std::size_t>(kTimers));
  ASSERT_TRUE(run_until(*loop, [&] { return fired == kTimers / 2; }));
  for (int i = 1; i < kTimers; i += 2) ASSERT_TRUE(loop->cancel_timer(ids[i]));
  ASSERT_TRUE(run_until(*loop, [&] { return loop->timers_live() == 0; }));
  EXPECT_EQ(fired, kTimers / 2);
}

}  // namespace
}  // namespace leasehold
