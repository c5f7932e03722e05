// The request client: backoff schedule, deadlines, retries with the same request id, bounds,
// and the blocking variant. Real loopback UDP; a toy codec (8-byte little-endian request id,
// then the body) stands in for the wire protocol.
#include "leasehold/io/client.hpp"

#include "leasehold/io/clock.hpp"
#include "leasehold/io/loop.hpp"
#include "tests/io/io_uring_skip.hpp"

#include <gtest/gtest.h>

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace leasehold {
namespace {

constexpr int kIterationsMax = 2000;  // x 10 ms: a hung test fails instead of hanging CI

std::optional<std::uint64_t> toy_id_of(std::span<const std::byte> d) noexcept {
  if (d.size() < 8) return std::nullopt;
  std::uint64_t id = 0;
  std::memcpy(&id, d.data(), 8);
  return id;
}

std::vector<std::byte> toy_message(std::uint64_t id, const char* body) {
  std::vector<std::byte> m(8 + std::strlen(body));
  std::memcpy(m.data(), &id, 8);
  std::memcpy(m.data() + 8, body, std::strlen(body));
  return m;
}

bool run_until(EventLoop& loop, const std::function<bool()>& done) {
  for (int i = 0; i < kIterationsMax && !done(); ++i)
    if (loop.run_once(10 * kNsPerMs) < 0) return false;
  return done();
}

// A server on the loop that answers a request on its `answer_on`-th receipt (0 = never).
struct ToyServer {
  EventLoop& loop;
  std::uint32_t answer_on;
  SocketId sock;
  SocketAddress addr;
  std::map<std::uint64_t, std::vector<std::vector<std::byte>>> seen;  // id -> datagrams
  std::size_t total = 0;

  ToyServer(EventLoop& l, std::uint32_t on) : loop(l), answer_on(on) {
    UniqueFd fd(open_udp_socket(SocketAddress::loopback_v4(0)));
    addr = *local_address(fd.get());
    sock = loop.add_udp_socket(std::move(fd), [this](const Datagram& d) {
      auto id = toy_id_of(d.payload);
      ASSERT_TRUE(id.has_value());
      auto& v = seen[*id];
      v.emplace_back(d.payload.begin(), d.payload.end());
      ++total;
      if (answer_on != 0 && v.size() == answer_on) {
        auto answer = toy_message(*id, "answer");
        SocketAddress from = d.source_address();
        EXPECT_EQ(loop.send_to(sock, answer, &from), 0);
      }
    });
  }
};

std::unique_ptr<EventLoop> make_loop() {
  ProbeResult error;
  auto loop = EventLoop::create({}, &error);
  EXPECT_NE(loop, nullptr) << error.message;
  return loop;
}

// --- the backoff schedule (pure) ------------------------------------------------------------

TEST(Backoff, GrowsExponentiallyWithinTheJitterBandAndCaps) {
  RetryPolicy p;
  p.first_backoff_ns = 10 * kNsPerMs;
  p.multiplier = 2;
  p.jitter_percent = 20;
  p.backoff_max_ns = 100 * kNsPerMs;
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    std::uint64_t rng = seed;
    std::int64_t previous = 0;
    for (std::uint32_t k = 1; k <= 8; ++k) {
      const std::int64_t base = std::min<std::int64_t>(10 * kNsPerMs << (k - 1), 100 * kNsPerMs);
      const std::int64_t d = backoff_delay_ns(p, k, &rng);
      ASSERT_GE(d, base * 8 / 10) << "seed " << seed << " retry " << k;
      ASSERT_LE(d, base * 12 / 10) << "seed " << seed << " retry " << k;
      if (k <= 4) {  // below the cap
        ASSERT_GT(d, previous) << "seed " << seed << " retry " << k;
      }
      previous = d;
    }
  }
}

TEST(Backoff, JitterSpreadsDelaysAndZeroJitterIsExact) {
  RetryPolicy p;
  p.first_backoff_ns = 1000;
  p.jitter_percent = 0;
  std::uint64_t rng = 7;
  EXPECT_EQ(backoff_delay_ns(p, 1, &rng), 1000);
  EXPECT_EQ(backoff_delay_ns(p, 3, &rng), 4000);
  p.jitter_percent = 20;
  std::vector<std::int64_t> delays;
  for (int i = 0; i < 100; ++i) delays.push_back(backoff_delay_ns(p, 1, &rng));
  std::sort(delays.begin(), delays.end());
  EXPECT_LT(delays.front(), 950);  // spread over the band, not one value
  EXPECT_GT(delays.back(), 1050);
}

TEST(Backoff, HugeRetryCountsSaturateAtTheCap) {
  RetryPolicy p;
  p.jitter_percent = 0;
  p.backoff_max_ns = 5 * kNsPerS;
  std::uint64_t rng = 1;
  EXPECT_EQ(backoff_delay_ns(p, 1000, &rng), 5 * kNsPerS);
}

// --- the asynchronous client --------------------------------------------------------------

TEST(RequestClient, AnsweredOnTheFirstAttempt) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  ToyServer server(*loop, 1);
  RequestClient client(*loop, toy_id_of);
  ASSERT_EQ(client.open(SocketAddress::loopback_v4(0)), 0);
  std::vector<RequestOutcome> outcomes;
  std::vector<std::byte> answer;
  auto req = toy_message(11, "acquire");
  ASSERT_EQ(client.start(req, server.addr, boottime_ns() + kNsPerS, [&](const RequestOutcome& o) {
    outcomes.push_back(o);
    answer.assign(o.answer.begin(), o.answer.end());
  }), 0);
  EXPECT_EQ(client.outstanding(), 1u);
  ASSERT_TRUE(run_until(*loop, [&] { return !outcomes.empty(); }));
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_EQ(outcomes[0].status, RequestStatus::answered);
  EXPECT_EQ(outcomes[0].request_id, 11u);
  EXPECT_EQ(outcomes[0].attempts, 1u);
  EXPECT_EQ(answer, toy_message(11, "answer"));
  EXPECT_EQ(client.outstanding(), 0u);
  EXPECT_EQ(client.stats().answered, 1u);
}

TEST(RequestClient, RetriesResendTheSameBytesUntilAnswered) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  ToyServer server(*loop, 3);
  RetryPolicy p;
  p.first_backoff_ns = 5 * kNsPerMs;
  RequestClient client(*loop, toy_id_of, p, {}, 1234);
  ASSERT_EQ(client.open(SocketAddress::loopback_v4(0)), 0);
  std::vector<RequestOutcome> outcomes;
  auto req = toy_message(77, "heartbeat");
  ASSERT_EQ(client.start(req, server.addr, boottime_ns() + 5 * kNsPerS,
                         [&](const RequestOutcome& o) { outcomes.push_back(o); }), 0);
  ASSERT_TRUE(run_until(*loop, [&] { return !outcomes.empty(); }));
  EXPECT_EQ(outcomes[0].status, RequestStatus::answered);
  EXPECT_EQ(outcomes[0].attempts, 3u);
  EXPECT_LT(outcomes[0].first_send_ns, outcomes[0].last_send_ns);
  ASSERT_EQ(server.seen.size(), 1u);
  ASSERT_EQ(server.seen[77].size(), 3u);
  for (const auto& d : server.seen[77]) EXPECT_EQ(d, req);
  EXPECT_EQ(client.stats().retries, 2u);
}

// A client of several service addresses: the retarget hook moves a retry to another address,
// and the outcome says where the answer came from.
TEST(RequestClient, ARetargetedRetryGoesToTheNewAddressAndTheOutcomeNamesTheSource) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  ToyServer silent(*loop, 0);
  ToyServer answering(*loop, 1);
  RetryPolicy p;
  p.first_backoff_ns = 5 * kNsPerMs;
  RequestClient client(*loop, toy_id_of, p, {}, 4321);
  ASSERT_EQ(client.open(SocketAddress::loopback_v4(0)), 0);
  std::vector<std::string> retargeted;  // the address each retry was about to go to
  client.set_retarget_hook([&](std::uint64_t id, SocketAddress& to) {
    EXPECT_EQ(id, 31u);
    retargeted.push_back(to.str());
    to = answering.addr;
  });
  std::vector<RequestOutcome> outcomes;
  auto req = toy_message(31, "acquire");
  ASSERT_EQ(client.start(req, silent.addr, boottime_ns() + 5 * kNsPerS,
                         [&](const RequestOutcome& o) { outcomes.push_back(o); }), 0);
  ASSERT_TRUE(run_until(*loop, [&] { return !outcomes.empty(); }));
  EXPECT_EQ(outcomes[0].status, RequestStatus::answered);
  EXPECT_EQ(outcomes[0].attempts, 2u);
  EXPECT_EQ(outcomes[0].from.str(), answering.addr.str());
  EXPECT_EQ(retargeted, (std::vector<std::string>{silent.addr.str()}));
  EXPECT_EQ(silent.total, 1u);
  EXPECT_EQ(answering.total, 1u);
}

TEST(Backoff, LongestBackoffBoundsEveryDelay) {
  RetryPolicy p;
  p.first_backoff_ns = 250 * kNsPerMs;
  p.backoff_max_ns = 1000 * kNsPerMs + 7;  // not a multiple of 100: the bound rounds up
  p.jitter_percent = 20;
  EXPECT_EQ(longest_backoff_ns(p), 1200 * kNsPerMs + 9);
  std::uint64_t rng = 5;
  for (std::uint32_t k = 1; k <= 2000; ++k) ASSERT_LE(backoff_delay_ns(p, k % 12 + 1, &rng), longest_backoff_ns(p));
  p.jitter_percent = 90;  // capped at 50 as backoff_delay_ns caps it
  EXPECT_EQ(longest_backoff_ns(p), 1500 * kNsPerMs + 11);
}

TEST(RequestClient, NothingIsSentAtOrAfterTheDeadlineAndSpacingGrows) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  ToyServer server(*loop, 0);  // never answers
  RetryPolicy p;
  p.first_backoff_ns = 10 * kNsPerMs;
  p.multiplier = 2;
  p.jitter_percent = 20;
  RequestClient client(*loop, toy_id_of, p, {}, 99);
  ASSERT_EQ(client.open(SocketAddress::loopback_v4(0)), 0);
  std::vector<std::int64_t> sends;
  std::vector<std::uint32_t> attempt_numbers;
  client.set_send_observer([&](std::uint64_t id, std::uint32_t attempt, std::int64_t t) {
    EXPECT_EQ(id, 5u);
    attempt_numbers.push_back(attempt);
    sends.push_back(t);
  });
  std::vector<RequestOutcome> outcomes;
  std::int64_t outcome_at = 0;
  const std::int64_t deadline = boottime_ns() + 200 * kNsPerMs;
  auto req = toy_message(5, "refresh");
  ASSERT_EQ(client.start(req, server.addr, deadline, [&](const RequestOutcome& o) {
    outcomes.push_back(o);
    outcome_at = boottime_ns();
  }), 0);
  ASSERT_TRUE(run_until(*loop, [&] { return !outcomes.empty(); }));
  const RequestOutcome& o = outcomes[0];
  EXPECT_EQ(o.status, RequestStatus::deadline_passed);
  EXPECT_GE(outcome_at, deadline);
  EXPECT_LT(o.last_send_ns, deadline);
  ASSERT_GE(o.attempts, 2u);
  ASSERT_EQ(sends.size(), o.attempts);
  for (std::size_t i = 0; i < attempt_numbers.size(); ++i) EXPECT_EQ(attempt_numbers[i], i + 1);
  for (std::int64_t t : sends) EXPECT_LT(t, deadline);
  // Timers never fire early, so each gap is at least the smallest jittered backoff of its
  // retry: 8 ms, 16 ms, 32 ms, ... — a lower bound that grows with every retry.
  for (std::size_t k = 1; k < sends.size(); ++k)
    EXPECT_GE(sends[k] - sends[k - 1], (10 * kNsPerMs << (k - 1)) * 8 / 10) << "retry " << k;
  // Nothing more is sent after the outcome.
  for (int i = 0; i < 5; ++i) ASSERT_GE(loop->run_once(10 * kNsPerMs), 0);
  EXPECT_EQ(sends.size(), o.attempts);
  // Every datagram the server saw is the request, byte for byte.
  EXPECT_GE(server.total, 1u);
  EXPECT_LE(server.total, o.attempts);
  for (const auto& d : server.seen[5]) EXPECT_EQ(d, req);
  EXPECT_EQ(client.stats().deadlines_passed, 1u);
}

TEST(RequestClient, AttemptsMaxStopsSendingButTheOutcomeWaitsForTheDeadline) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  ToyServer server(*loop, 0);
  RetryPolicy p;
  p.first_backoff_ns = 2 * kNsPerMs;
  p.attempts_max = 2;
  RequestClient client(*loop, toy_id_of, p);
  ASSERT_EQ(client.open(SocketAddress::loopback_v4(0)), 0);
  std::vector<RequestOutcome> outcomes;
  std::int64_t outcome_at = 0;
  const std::int64_t deadline = boottime_ns() + 60 * kNsPerMs;
  ASSERT_EQ(client.start(toy_message(1, "x"), server.addr, deadline, [&](const RequestOutcome& o) {
    outcomes.push_back(o);
    outcome_at = boottime_ns();
  }), 0);
  ASSERT_TRUE(run_until(*loop, [&] { return !outcomes.empty(); }));
  EXPECT_EQ(outcomes[0].attempts, 2u);
  EXPECT_EQ(outcomes[0].status, RequestStatus::deadline_passed);
  EXPECT_GE(outcome_at, deadline);
}

TEST(RequestClient, RefusesBadRequestsAndBoundsOutstanding) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  ToyServer server(*loop, 0);
  RequestClient client(*loop, toy_id_of, {}, ClientLimits{.outstanding_max = 2});
  const std::int64_t deadline = boottime_ns() + kNsPerS;
  auto ignore = [](const RequestOutcome&) {};
  EXPECT_EQ(client.start(toy_message(1, "x"), server.addr, deadline, ignore), -ENOTCONN);
  ASSERT_EQ(client.open(SocketAddress::loopback_v4(0)), 0);
  EXPECT_EQ(client.open(SocketAddress::loopback_v4(0)), -EALREADY);
  std::vector<std::byte> short_msg(4);
  EXPECT_EQ(client.start(short_msg, server.addr, deadline, ignore), -EINVAL);
  std::vector<std::byte> huge(kUdpPayloadBytesMax + 1);
  EXPECT_EQ(client.start(huge, server.addr, deadline, ignore), -EMSGSIZE);
  EXPECT_EQ(client.start(toy_message(1, "x"), server.addr, boottime_ns() - 1, ignore), -ETIMEDOUT);
  EXPECT_EQ(client.start(toy_message(1, "x"), server.addr, deadline, ignore), 0);
  EXPECT_EQ(client.start(toy_message(1, "y"), server.addr, deadline, ignore), -EEXIST);
  EXPECT_EQ(client.start(toy_message(2, "x"), server.addr, deadline, ignore), 0);
  EXPECT_EQ(client.start(toy_message(3, "x"), server.addr, deadline, ignore), -EBUSY);
  EXPECT_EQ(client.outstanding(), 2u);
}

TEST(RequestClient, CancelEndsTheRequestOnceAndStopsRetries) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  ToyServer server(*loop, 0);
  RetryPolicy p;
  p.first_backoff_ns = 2 * kNsPerMs;
  RequestClient client(*loop, toy_id_of, p);
  ASSERT_EQ(client.open(SocketAddress::loopback_v4(0)), 0);
  std::vector<RequestStatus> statuses;
  int sends = 0;
  client.set_send_observer([&](std::uint64_t, std::uint32_t, std::int64_t) { ++sends; });
  ASSERT_EQ(client.start(toy_message(9, "x"), server.addr, boottime_ns() + kNsPerS,
                         [&](const RequestOutcome& o) { statuses.push_back(o.status); }), 0);
  ASSERT_TRUE(run_until(*loop, [&] { return server.total >= 1; }));
  EXPECT_TRUE(client.cancel(9));
  EXPECT_FALSE(client.cancel(9));
  const int sent = sends;
  for (int i = 0; i < 5; ++i) ASSERT_GE(loop->run_once(10 * kNsPerMs), 0);
  EXPECT_EQ(statuses, std::vector<RequestStatus>{RequestStatus::cancelled});
  EXPECT_EQ(sends, sent);  // no retry after the cancel
  EXPECT_EQ(client.outstanding(), 0u);
}

TEST(RequestClient, UnmatchedDatagramsGoToTheUnsolicitedHandler) {
  LEASEHOLD_REQUIRE_IO_URING();
  auto loop = make_loop();
  RequestClient client(*loop, toy_id_of);
  ASSERT_EQ(client.open(SocketAddress::loopback_v4(0)), 0);
  const SocketAddress client_addr = *local_address(loop->socket_fd(client.socket()));
  UniqueFd peer(open_udp_socket_blocking(SocketAddress::loopback_v4(0)));
  auto query = toy_message(500, "is sandbox running?");
  ASSERT_EQ(::sendto(peer.get(), query.data(), query.size(), 0, client_addr.sa(), client_addr.length),
            static_cast<ssize_t>(query.size()));
  ASSERT_TRUE(run_until(*loop, [&] { return client.stats().answers_unmatched == 1; }));
  std::vector<std::byte> got;
  client.set_unsolicited_handler([&](const Datagram& d) { got.assign(d.payload.begin(), d.payload.end()); });
  ASSERT_EQ(::sendto(peer.get(), query.data(), query.size(), 0, client_addr.sa(), client_addr.length),
            static_cast<ssize_t>(query.size()));
  ASSERT_TRUE(run_until(*loop, [&] { return !got.empty(); }));
  EXPECT_EQ(got, query);
}

// A forgery naming an outstanding request id, sent by anyone who can reach the client's
// socket, must not end the request: the answer check (the codec's HMAC in production; here the
// body) drops it and the real answer still arrives. Without the check the attack succeeds.
std::vector<std::byte> answer_after_a_forgery(bool with_check, ClientStats* stats) {
  auto loop = make_loop();
  ToyServer server(*loop, 2);  // the real answer comes to the second attempt
  RetryPolicy p;
  p.first_backoff_ns = 5 * kNsPerMs;
  RequestClient client(*loop, toy_id_of, p);
  if (with_check)
    client.set_answer_check([](std::span<const std::byte> a) { return a.size() == 14 && std::memcmp(a.data() + 8, "answer", 6) == 0; });
  EXPECT_EQ(client.open(SocketAddress::loopback_v4(0)), 0);
  const SocketAddress client_addr = *local_address(loop->socket_fd(client.socket()));
  std::vector<std::byte> answer;
  bool done = false;
  EXPECT_EQ(client.start(toy_message(77, "heartbeat"), server.addr, boottime_ns() + 5 * kNsPerS,
                         [&](const RequestOutcome& o) {
                           done = true;
                           answer.assign(o.answer.begin(), o.answer.end());
                         }), 0);
  UniqueFd attacker(open_udp_socket_blocking(SocketAddress::loopback_v4(0)));
  const auto forged = toy_message(77, "forged");
  EXPECT_EQ(::sendto(attacker.get(), forged.data(), forged.size(), 0, client_addr.sa(), client_addr.length),
            static_cast<ssize_t>(forged.size()));
  EXPECT_TRUE(run_until(*loop, [&] { return done; }));
  *stats = client.stats();
  return answer;
}

TEST(RequestClient, AForgedAnswerWithAnOutstandingIdDoesNotEndTheRequest) {
  LEASEHOLD_REQUIRE_IO_URING();
  ClientStats stats;
  EXPECT_EQ(answer_after_a_forgery(false, &stats), toy_message(77, "forged"));  // the attack, undefended
  EXPECT_EQ(stats.answers_forged, 0u);
  EXPECT_EQ(answer_after_a_forgery(true, &stats), toy_message(77, "answer"));
  EXPECT_EQ(stats.answers_forged, 1u);
  EXPECT_EQ(stats.answered, 1u);
}

// --- the blocking client ------------------------------------------------------------------

// A plain-socket server thread that answers on the `answer_on`-th receipt (0 = never).
struct ThreadServer {
  UniqueFd fd{open_udp_socket_blocking(SocketAddress::loopback_v4(0))};
  SocketAddress addr = *local_address(fd.get());
  std::atomic<int> received{0};
  std::atomic<bool> stop{false};
  std::thread thread;

  explicit ThreadServer(int answer_on) {
    thread = std::thread([this, answer_on] {
      timeval tv{0, 20000};
      ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      while (!stop.load()) {  // wakes every 20 ms to look at `stop`
        std::byte buf[kUdpPayloadBytesMax];
        SocketAddress from;
        from.length = sizeof from.storage;
        ssize_t n = ::recvfrom(fd.get(), buf, sizeof buf, 0, from.sa(), &from.length);
        if (n < 8) continue;
        int count = received.fetch_add(1) + 1;
        if (count == answer_on) {
          std::uint64_t id = *toy_id_of({buf, static_cast<std::size_t>(n)});
          auto answer = toy_message(id, "granted");
          ::sendto(fd.get(), answer.data(), answer.size(), 0, from.sa(), from.length);
        }
      }
    });
  }
  ~ThreadServer() {
    stop.store(true);
    thread.join();
  }
};

TEST(BlockingRequest, AnsweredAfterARetry) {
  ThreadServer server(2);
  UniqueFd fd(open_udp_socket_blocking(SocketAddress::loopback_v4(0)));
  RetryPolicy p;
  p.first_backoff_ns = 5 * kNsPerMs;
  std::byte answer[64];
  auto req = toy_message(31, "acquire");
  BlockingOutcome o = request_blocking(fd.get(), req, server.addr, boottime_ns() + 5 * kNsPerS,
                                       toy_id_of, answer, p);
  EXPECT_EQ(o.status, RequestStatus::answered);
  EXPECT_EQ(o.error, 0);
  EXPECT_EQ(o.attempts, 2u);
  ASSERT_EQ(o.answer_bytes, 15u);
  EXPECT_EQ(std::vector<std::byte>(answer, answer + o.answer_bytes), toy_message(31, "granted"));
}

TEST(BlockingRequest, DeadlinePassesWithoutAnAnswer) {
  ThreadServer server(0);
  UniqueFd fd(open_udp_socket_blocking(SocketAddress::loopback_v4(0)));
  RetryPolicy p;
  p.first_backoff_ns = 5 * kNsPerMs;
  std::byte answer[64];
  const std::int64_t deadline = boottime_ns() + 80 * kNsPerMs;
  BlockingOutcome o = request_blocking(fd.get(), toy_message(32, "x"), server.addr, deadline,
                                       toy_id_of, answer, p);
  EXPECT_GE(boottime_ns(), deadline);
  EXPECT_EQ(o.status, RequestStatus::deadline_passed);
  EXPECT_EQ(o.error, 0);
  EXPECT_GE(o.attempts, 2u);
  EXPECT_EQ(o.answer_bytes, 0u);
}

TEST(BlockingRequest, AForgedAnswerWithOurIdIsSkippedWhenTheCheckRefusesIt) {
  for (const bool with_check : {false, true}) {
    ThreadServer server(2);
    UniqueFd fd(open_udp_socket_blocking(SocketAddress::loopback_v4(0)));
    const SocketAddress self = *local_address(fd.get());
    UniqueFd attacker(open_udp_socket_blocking(SocketAddress::loopback_v4(0)));
    const auto forged = toy_message(33, "forged!");  // waits in the socket for the first read
    ASSERT_EQ(::sendto(attacker.get(), forged.data(), forged.size(), 0, self.sa(), self.length),
              static_cast<ssize_t>(forged.size()));
    RetryPolicy p;
    p.first_backoff_ns = 5 * kNsPerMs;
    std::byte answer[64];
    AnswerCheck check;
    if (with_check) check = [](std::span<const std::byte> a) { return a.size() == 15 && std::memcmp(a.data() + 8, "granted", 7) == 0; };
    BlockingOutcome o = request_blocking(fd.get(), toy_message(33, "acquire"), server.addr,
                                         boottime_ns() + 5 * kNsPerS, toy_id_of, answer, p, 0, check);
    ASSERT_EQ(o.status, RequestStatus::answered) << with_check;
    EXPECT_EQ(std::vector<std::byte>(answer, answer + o.answer_bytes),
              with_check ? toy_message(33, "granted") : forged);  // undefended, the forgery wins
  }
}

TEST(BlockingRequest, RefusesBadInput) {
  UniqueFd fd(open_udp_socket_blocking(SocketAddress::loopback_v4(0)));
  std::byte answer[64];
  const SocketAddress to = SocketAddress::loopback_v4(9);
  EXPECT_EQ(request_blocking(fd.get(), std::vector<std::byte>(3), to, boottime_ns() + kNsPerS,
                             toy_id_of, answer).error, -EINVAL);
  EXPECT_EQ(request_blocking(fd.get(), toy_message(1, "x"), to, boottime_ns() - 1, toy_id_of,
                             answer).error, -ETIMEDOUT);
}

}  // namespace
}  // namespace leasehold
