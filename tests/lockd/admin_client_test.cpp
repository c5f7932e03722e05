// The CLI's lockd client with a replicated lockd's addresses (lockd/admin_client.hpp): it follows
// Error{not_leader, hint} to the leader, goes round the list when no leader is named or an
// address does not answer, and says so clearly when none leads before the timeout. Fake lockd
// processes, each a thread with its own UDP socket, instance id and replay window, answer as a
// leader, as a follower (not_leader) or not at all.
#include "leasehold/io/clock.hpp"
#include "leasehold/io/udp.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"

#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace leasehold::lockd {
namespace {

const WorkerId kWorker{0x3333000000000000ULL + 42, 0xCCCC};

wire::WireKey worker_key() {
  return wire::derive_worker_key(wire::WireKey(std::vector<std::uint8_t>(32, 0x6b)), kWorker);
}

class FakeLockd {
 public:
  /// notice_first: answers as a leader, each answer preceded by a forged key-rejected notice for
  /// the same request id (what anyone on the path can send); notice_only: sends only the notice
  /// (as lockd does for a key it rejects).
  enum class Mode { leader, follower, dead, notice_first, notice_only };

  FakeLockd(std::uint64_t index, const wire::WireKey& key, Mode mode, std::string hint = {})
      : index_(index), mode_(mode), hint_(std::move(hint)), receiver_(key),
        sender_(WorkerId{0x7000 + index, 1}, wire::seq_seed(), key) {
    fd_ = open_udp_socket_blocking(SocketAddress::loopback_v4(0));
    EXPECT_GE(fd_, 0) << std::strerror(-fd_);
    addr_ = local_address(fd_).value_or(SocketAddress{});
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeLockd() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  FakeLockd(const FakeLockd&) = delete;
  FakeLockd& operator=(const FakeLockd&) = delete;

  const SocketAddress& addr() const { return addr_; }
  std::string text() const { return addr_.str(); }
  /// Requests delivered (not_leader ones included).
  std::uint64_t requests() const { return requests_.load(); }
  void set_hint(std::string hint) {
    std::lock_guard lock(mu_);
    hint_ = std::move(hint);
  }

 private:
  void serve() {
    std::uint8_t buf[2048];
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      sockaddr_storage from_storage{};
      socklen_t len = sizeof from_storage;
      const ssize_t n = ::recvfrom(fd_, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from_storage), &len);
      if (n <= 0) continue;
      const SocketAddress from = SocketAddress::from(reinterpret_cast<sockaddr*>(&from_storage), len).value_or(SocketAddress{});
      wire::Admission a = receiver_.admit(std::span<const std::uint8_t>(buf, static_cast<std::size_t>(n)), &from, boottime_ns());
      if (a.verdict != wire::Verdict::deliver || !wire::is_request(a.message.header.type)) continue;
      ++requests_;
      if (mode_ == Mode::notice_first || mode_ == Mode::notice_only) {
        const auto notice = wire::encode_key_rejected(
            wire::KeyRejected{a.message.header.request_id, a.key_id, wire::KeyRejectReason::bad_mac});
        ::sendto(fd_, notice.data(), notice.size(), 0, from.sa(), from.length);
        if (mode_ == Mode::notice_only) continue;
      }
      wire::Body answer;
      {
        std::lock_guard lock(mu_);
        if (mode_ == Mode::dead) continue;
        if (mode_ == Mode::follower) answer = wire::Error{wire::ErrorCode::not_leader, hint_};
        else answer = wire::StatsAnswer{{{"lockd", index_}}};
      }
      wire::Datagram out;
      if (!sender_.seal(a.message.header.request_id, answer, out)) continue;
      ::sendto(fd_, out.view().data(), out.view().size(), 0, from.sa(), from.length);
    }
  }

  std::uint64_t index_;
  std::mutex mu_;
  Mode mode_;
  std::string hint_;
  wire::Receiver receiver_;
  wire::Sender sender_;
  int fd_ = -1;
  SocketAddress addr_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> requests_{0};
  std::thread thread_;
};

int served_by(const Answer& a) {
  const auto* s = a.as<wire::StatsAnswer>();
  return s != nullptr && s->counters.size() == 1 ? static_cast<int>(s->counters[0].value) : -1;
}

constexpr std::int64_t kMs = 1'000'000;

TEST(AdminClientLeader, FollowsARedirectToAConfiguredLeader) {
  const wire::WireKey key = worker_key();
  FakeLockd leader(1, key, FakeLockd::Mode::leader);
  FakeLockd follower(0, key, FakeLockd::Mode::follower, leader.text());
  AdminClient client({follower.addr(), leader.addr()}, key, {}, 5000 * kMs);
  const Answer a = client.stats();
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(served_by(a), 1);
  EXPECT_EQ(client.lockd(), leader.addr());
  EXPECT_EQ(follower.requests(), 1u);
  EXPECT_EQ(leader.requests(), 1u);
  // The client stays with the leader.
  const Answer b = client.stats();
  EXPECT_EQ(served_by(b), 1) << b.message();
  EXPECT_EQ(follower.requests(), 1u);
}

TEST(AdminClientLeader, WithoutAUsableHintTheNextAddressIsAsked) {
  const wire::WireKey key = worker_key();
  FakeLockd unknown(0, key, FakeLockd::Mode::follower);                          // no leader known
  FakeLockd elsewhere(1, key, FakeLockd::Mode::follower, "10.255.255.1:7400");  // not configured
  FakeLockd leader(2, key, FakeLockd::Mode::leader);
  AdminClient client({unknown.addr(), elsewhere.addr(), leader.addr()}, key, {}, 5000 * kMs);
  const Answer a = client.stats();
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(served_by(a), 2);
  EXPECT_EQ(unknown.requests(), 1u);
  EXPECT_EQ(elsewhere.requests(), 1u);
  EXPECT_EQ(client.lockd(), leader.addr());
}

TEST(AdminClientLeader, AnAddressThatDoesNotAnswerIsLeftForTheNext) {
  const wire::WireKey key = worker_key();
  FakeLockd dead(0, key, FakeLockd::Mode::dead);
  FakeLockd leader(1, key, FakeLockd::Mode::leader);
  AdminClient client({dead.addr(), leader.addr()}, key, {}, 2000 * kMs);
  const std::int64_t t0 = boottime_ns();
  const Answer a = client.stats();
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(served_by(a), 1);
  EXPECT_GE(boottime_ns() - t0, 1000 * kMs - 5 * kMs);  // the dead one's share: half the timeout
  EXPECT_GE(dead.requests(), 1u);
}

TEST(AdminClientLeader, NoLeaderIsAClearErrorAtTheTimeout) {
  const wire::WireKey key = worker_key();
  FakeLockd a(0, key, FakeLockd::Mode::follower);
  FakeLockd b(1, key, FakeLockd::Mode::follower, "10.255.255.1:7400");
  AdminClient client({a.addr(), b.addr()}, key, {}, 500 * kMs);
  const std::int64_t t0 = boottime_ns();
  const Answer r = client.stats();
  EXPECT_GE(boottime_ns() - t0, 500 * kMs - 5 * kMs);  // never ends before the deadline
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.no_leader);
  EXPECT_EQ(r.code(), Errc::timeout);
  const std::string expect = "no lockd among " + a.text() + ", " + b.text() + " leads: " + a.text() +
                             ": not_leader, no leader known; " + b.text() +
                             ": not_leader, leader \"10.255.255.1:7400\" (not a configured address)";
  EXPECT_EQ(r.message().rfind(expect, 0), 0u) << r.message();
  // Backoffs of 16..300 ms between rounds: a handful of requests, not a spin.
  EXPECT_LE(a.requests() + b.requests(), 30u);
}

TEST(AdminClientLeader, OneAddressAnsweringNotLeaderIsAskedAgainUntilTheTimeout) {
  const wire::WireKey key = worker_key();
  FakeLockd follower(0, key, FakeLockd::Mode::follower);
  AdminClient client(follower.addr(), key, {}, 400 * kMs);
  const Answer r = client.stats();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.no_leader);
  EXPECT_GE(follower.requests(), 2u);
  EXPECT_NE(r.message().find("no lockd among " + follower.text() + " leads"), std::string::npos) << r.message();
}

TEST(AdminClientLeader, LockdsNamingEachOtherDoNotMakeItSpin) {
  const wire::WireKey key = worker_key();
  FakeLockd a(0, key, FakeLockd::Mode::follower);
  FakeLockd b(1, key, FakeLockd::Mode::follower, a.text());
  a.set_hint(b.text());
  AdminClient client({a.addr(), b.addr()}, key, {}, 400 * kMs);
  const Answer r = client.stats();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.no_leader);
  EXPECT_LE(a.requests() + b.requests(), 40u);
}

// The key-rejected notice is unauthenticated: it never ends a request. A forged one naming the
// request id, sent before lockd's real answer, changes nothing: the real answer is returned.
TEST(AdminClientKeyRejected, AForgedNoticeFollowedByTheRealAnswerReturnsTheAnswer) {
  const wire::WireKey key = worker_key();
  FakeLockd lockd(3, key, FakeLockd::Mode::notice_first);
  AdminClient client(lockd.addr(), key, {}, 5000 * kMs);
  for (int i = 0; i < 3; ++i) {
    const Answer a = client.stats();
    ASSERT_TRUE(a.ok()) << a.message();
    EXPECT_EQ(served_by(a), 3);
    EXPECT_TRUE(a.key_rejected);  // seen, and not taken for the answer
  }
  EXPECT_EQ(lockd.requests(), 3u);
}

// The attack, with the rule ablated (LEASEHOLD_ABLATE=notice-as-answer): the notice taken for an
// answer lets anyone who can send one datagram fail the call that lockd was about to answer.
TEST(AdminClientKeyRejected, AblatedAForgedNoticeFailsTheCall) {
  const wire::WireKey key = worker_key();
  FakeLockd lockd(3, key, FakeLockd::Mode::notice_first);
  AdminClient client(lockd.addr(), key, {}, 5000 * kMs);
  ASSERT_EQ(::setenv("LEASEHOLD_ABLATE", "notice-as-answer", 1), 0);
  const Answer a = client.stats();
  ::unsetenv("LEASEHOLD_ABLATE");
  EXPECT_FALSE(a.ok());
  EXPECT_EQ(a.code(), Errc::permission_denied) << a.message();
  ASSERT_TRUE(a.key_rejected);
  EXPECT_EQ(a.key_rejected->request_id, client.last_request_id());
  // The same client, the rule in place: the next call gets lockd's answer.
  const Answer b = client.stats();
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(served_by(b), 3);
}

// Only notices, no answer: at the deadline the call fails as a rejected key (permission), naming
// the address, the key id and the reason, not as silence.
TEST(AdminClientKeyRejected, OnlyNoticesIsARejectedKeyAtTheDeadline) {
  const wire::WireKey key = worker_key();
  FakeLockd lockd(0, key, FakeLockd::Mode::notice_only);
  AdminClient client(lockd.addr(), key, {}, 300 * kMs);
  const Answer a = client.stats();
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.code(), Errc::permission_denied);
  ASSERT_TRUE(a.key_rejected);
  EXPECT_EQ(a.key_rejected->key_id, key.key_id);
  EXPECT_EQ(a.key_rejected->reason, wire::KeyRejectReason::bad_mac);
  EXPECT_EQ(a.rejected_by, lockd.text());
  EXPECT_NE(a.message().find("lockd at " + lockd.text() + " rejected our key (key id " + std::to_string(key.key_id) +
                             ", bad_mac"),
            std::string::npos)
      << a.message();
  EXPECT_GE(lockd.requests(), 1u);
}

// Nothing listens at the address (a port bound a moment ago and closed): the kernel's ICMP port
// unreachable is reported as such, not as silence.
TEST(AdminClientKeyRejected, NothingListeningIsToldApartFromSilence) {
  const wire::WireKey key = worker_key();
  const int fd = open_udp_socket_blocking(SocketAddress::loopback_v4(0));
  ASSERT_GE(fd, 0);
  const SocketAddress closed = local_address(fd).value();
  ::close(fd);
  AdminClient client(closed, key, {}, 300 * kMs);
  const Answer a = client.stats();
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.code(), Errc::timeout);
  EXPECT_TRUE(a.nothing_listens) << a.message();
  EXPECT_NE(a.message().find("nothing listens at " + closed.str()), std::string::npos) << a.message();
  // A bound socket that never answers is silence.
  FakeLockd dead(0, key, FakeLockd::Mode::dead);
  AdminClient quiet(dead.addr(), key, {}, 300 * kMs);
  const Answer b = quiet.stats();
  EXPECT_EQ(b.code(), Errc::timeout);
  EXPECT_FALSE(b.nothing_listens) << b.message();
  EXPECT_NE(b.message().find("no answer from lockd at " + dead.text()), std::string::npos) << b.message();
}

}  // namespace
}  // namespace leasehold::lockd
