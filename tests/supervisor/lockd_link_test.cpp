// LockdLink with several lockd addresses (supervisor/lockd_link.hpp): following the leader of a
// replicated lockd. Fake lockd processes on the test's io_uring loop, on loopback, each with its
// own instance id and its own replay window, answer as a leader would, answer
// Error{not_leader, hint} as a follower would, or stay silent as a dead one would.
#include "leasehold/io/clock.hpp"
#include "leasehold/io/loop.hpp"
#include "leasehold/lease/shard.hpp"
#include "leasehold/supervisor/lockd_link.hpp"
#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"
#include "tests/io/io_uring_skip.hpp"

#include <gtest/gtest.h>

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace leasehold {
namespace {

constexpr int kIterationsMax = 2000;  // x 10 ms: a hung exchange fails instead of hanging CI

WorkerId wid(std::uint64_t n) { return WorkerId{0x3333000000000000ULL + n, 0xCCCC + n}; }
NameId nid(std::uint64_t n) { return NameId{0x1111000000000000ULL + n, 0xAAAA + n}; }
SandboxId sid(std::uint64_t n) { return SandboxId{0x2222000000000000ULL + n, 0xBBBB + n}; }

const WorkerId kWorker = wid(600);

wire::WireKey worker_key() {
  return wire::derive_worker_key(wire::WireKey(std::vector<std::uint8_t>(32, 0x5a)), kWorker);
}

bool run_until(EventLoop& loop, const std::function<bool()>& done) {
  for (int i = 0; i < kIterationsMax && !done(); ++i)
    if (loop.run_once(10 * kNsPerMs) < 0) return false;
  return done();
}

/// One lockd process as the link sees it: its own socket, instance id (sender) and replay
/// window; answers with the worker's key, as lockd does.
struct FakeLockd {
  enum class Mode { leader, follower, dead, rejects_key };
  EventLoop& loop;
  std::uint64_t index;
  wire::Receiver receiver;
  wire::Sender sender;
  SocketId sock;
  SocketAddress addr;
  Mode mode = Mode::leader;
  std::string hint;  ///< a follower's Error{not_leader} message
  /// A lockd of one shard of several: a request this returns a hint for is answered
  /// Error{not_leader, hint} whatever the mode (a name of another shard).
  std::function<std::optional<std::string>(const wire::Body&)> other_shard;
  std::uint64_t datagrams = 0;         ///< every datagram received
  std::vector<std::int64_t> requests;  ///< receive times of the requests delivered
  std::uint64_t errors_sent = 0;       ///< replay-window errors (stale_seq, replayed)
  std::vector<wire::Message> answers;  ///< the worker's answers to our own requests
  SocketAddress worker;                ///< where the last request came from
  std::uint64_t last_request_id = 0;
  bool notice_first = false;  ///< send a key-rejected notice (anyone can) before answering

  FakeLockd(EventLoop& l, std::uint64_t i, const wire::WireKey& key)
      : loop(l), index(i), receiver(key), sender(wid(700 + i), wire::seq_seed(), key) {
    UniqueFd fd(open_udp_socket(SocketAddress::loopback_v4(0)));
    EXPECT_TRUE(fd.valid()) << std::strerror(-fd.get());
    addr = local_address(fd.get()).value_or(SocketAddress{});
    sock = loop.add_udp_socket(std::move(fd), [this](const Datagram& d) { on_datagram(d); });
  }

  void send(const wire::Datagram& out, const SocketAddress& to) {
    EXPECT_EQ(loop.send_to(sock, std::as_bytes(out.view()), &to), 0);
  }
  /// Seals `body` as the answer to `request_id` and sends it to the worker.
  void answer(std::uint64_t request_id, const wire::Body& body) {
    wire::Datagram out;
    ASSERT_TRUE(sender.seal(request_id, body, out));
    send(out, worker);
  }
  /// lockd → worker: one of lockd's own requests.
  void ask(std::uint64_t request_id, const wire::Body& body, const SocketAddress& to) {
    wire::Datagram out;
    ASSERT_TRUE(sender.seal(request_id, body, out));
    send(out, to);
  }

  void on_datagram(const Datagram& d) {
    ++datagrams;
    const SocketAddress from = d.source_address();
    const auto bytes = std::span(reinterpret_cast<const std::uint8_t*>(d.payload.data()), d.payload.size());
    wire::Admission a = receiver.admit(bytes, &from, boottime_ns());
    if (a.verdict == wire::Verdict::drop) return;
    if (a.verdict == wire::Verdict::resend) {
      EXPECT_EQ(loop.send_to(sock, std::as_bytes(a.cached_answer), &from), 0);
      return;
    }
    if (a.verdict == wire::Verdict::answer_error) {
      ++errors_sent;
      wire::Datagram out;
      ASSERT_TRUE(sender.seal(a.message.header.request_id, wire::error_answer(a), out));
      send(out, from);
      return;
    }
    if (!wire::is_request(a.message.header.type)) {
      answers.push_back(std::move(a.message));
      return;
    }
    requests.push_back(boottime_ns());
    worker = from;
    last_request_id = a.message.header.request_id;
    if (other_shard)
      if (const std::optional<std::string> h = other_shard(a.message.body)) {
        answer(a.message.header.request_id, wire::Error{wire::ErrorCode::not_leader, *h});
        return;
      }
    if (mode == Mode::rejects_key || notice_first) {
      const auto notice = wire::encode_key_rejected({a.message.header.request_id, 7, wire::KeyRejectReason::bad_mac});
      EXPECT_EQ(loop.send_to(sock, std::as_bytes(std::span(notice)), &from), 0);
    }
    switch (mode) {
      case Mode::dead:
      case Mode::rejects_key:
        return;
      case Mode::follower:
        answer(a.message.header.request_id, wire::Error{wire::ErrorCode::not_leader, hint});
        return;
      case Mode::leader: {
        wire::Datagram out;
        ASSERT_TRUE(sender.seal(a.message.header.request_id, wire::StatsAnswer{{{"lockd", index}}}, out));
        receiver.remember_answer(a.key, out.view(), from);
        send(out, from);
        return;
      }
    }
  }
};

class LockdLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LEASEHOLD_REQUIRE_IO_URING();
    ProbeResult error;
    loop_ = EventLoop::create({}, &error);
    ASSERT_NE(loop_, nullptr) << error.message;
  }
  void TearDown() override {
    link_.reset();  // before the loop (client.hpp)
    lockds_.clear();
    loop_.reset();
  }

  /// `n` fake lockds and a link to all of them, in that order.
  void start(std::size_t n, const RetryPolicy& retry) {
    for (std::size_t i = 0; i < n; ++i) lockds_.push_back(std::make_unique<FakeLockd>(*loop_, i, key_));
    std::vector<SocketAddress> addrs;
    for (const auto& l : lockds_) addrs.push_back(l->addr);
    auto opened = LockdLink::open(*loop_, addrs, kWorker, key_, retry);
    ASSERT_TRUE(opened.ok()) << opened.message();
    link_ = std::move(opened).value();
  }

  /// One Stats call to completion; the reply and how long it took.
  std::pair<LockdReply, std::int64_t> stats_call(std::int64_t timeout_ns) {
    std::optional<LockdReply> reply;
    const std::int64_t t0 = boottime_ns();
    link_->call(wire::Stats{}, t0 + timeout_ns, [&](LockdReply r) { reply = std::move(r); });
    EXPECT_TRUE(run_until(*loop_, [&] { return reply.has_value(); }));
    return {reply.value_or(LockdReply{}), boottime_ns() - t0};
  }

  /// The index of the lockd that served `r` (its StatsAnswer), or -1.
  static int served_by(const LockdReply& r) {
    if (!r.ok()) return -1;
    const auto* s = std::get_if<wire::StatsAnswer>(&*r.body);
    return s != nullptr && s->counters.size() == 1 ? static_cast<int>(s->counters[0].value) : -1;
  }

  static RetryPolicy policy(std::int64_t first_ms, std::int64_t max_ms) {
    RetryPolicy p;
    p.first_backoff_ns = first_ms * kNsPerMs;
    p.backoff_max_ns = max_ms * kNsPerMs;
    return p;
  }

  wire::WireKey key_ = worker_key();
  std::unique_ptr<EventLoop> loop_;
  std::vector<std::unique_ptr<FakeLockd>> lockds_;
  std::unique_ptr<LockdLink> link_;
};

// The first lockd does not lead and names the second: the call is resent there at once (no
// backoff: the first retry would be 2 s away) and completes with the second's answer; the link
// stays with the leader, and follows it back when it moves again. Each lockd's replay window
// accepts the worker's one seq stream throughout.
TEST_F(LockdLinkTest, NotLeaderNamingAConfiguredAddressIsFollowedAtOnce) {
  start(2, policy(2000, 2000));
  lockds_[0]->mode = FakeLockd::Mode::follower;
  lockds_[0]->hint = lockds_[1]->addr.str();
  const auto [reply, took] = stats_call(10 * kNsPerS);
  ASSERT_TRUE(reply.ok()) << reply.problem;
  EXPECT_EQ(served_by(reply), 1);
  EXPECT_LT(took, 1 * kNsPerS);
  EXPECT_EQ(reply.attempts, 2u);
  EXPECT_EQ(link_->stats().not_leader_answers, 1u);
  EXPECT_EQ(link_->stats().not_leader_waits, 0u);
  EXPECT_EQ(link_->stats().leader_switches, 1u);
  EXPECT_EQ(link_->lockd(), lockds_[1]->addr);

  // The next call goes straight to the leader.
  const auto [second, took2] = stats_call(10 * kNsPerS);
  EXPECT_EQ(served_by(second), 1);
  EXPECT_EQ(lockds_[0]->requests.size(), 1u);
  EXPECT_EQ(lockds_[1]->requests.size(), 2u);

  // Leadership moves back to the first lockd.
  lockds_[0]->mode = FakeLockd::Mode::leader;
  lockds_[1]->mode = FakeLockd::Mode::follower;
  lockds_[1]->hint = lockds_[0]->addr.str();
  const auto [third, took3] = stats_call(10 * kNsPerS);
  EXPECT_EQ(served_by(third), 0) << third.problem;
  EXPECT_LT(took3, 1 * kNsPerS);
  EXPECT_EQ(link_->stats().leader_switches, 2u);
  EXPECT_EQ(link_->stats().not_leader_answers, 2u);
  EXPECT_EQ(lockds_[0]->errors_sent + lockds_[1]->errors_sent, 0u);
  EXPECT_EQ(link_->stats().seq_resyncs, 0u);
}

// Two shards, each led by its own lockd: a call goes to its name's shard's target; the first call
// of shard 1 goes where shard 0's did, is redirected by that lockd to shard 1's leader, and from
// then on each shard's calls go straight to their own leader.
TEST_F(LockdLinkTest, EachShardHasItsOwnTargetLearnedFromTheOtherShardsRedirect) {
  start(2, policy(2000, 2000));
  // "db/primary" is in shard 0 of 2, "agent-1" in shard 1 (tests/lease/shard_test.cpp).
  const NameId of0 = name_id_of("db/primary"), of1 = name_id_of("agent-1");
  for (unsigned k = 0; k < 2; ++k)
    lockds_[k]->other_shard = [this, k](const wire::Body& b) -> std::optional<std::string> {
      const auto* r = std::get_if<wire::Release>(&b);
      if (r == nullptr || shard_of(r->name_id, 2) == k) return std::nullopt;
      return lockds_[1 - k]->addr.str();
    };
  link_->set_shards(2);
  EXPECT_EQ(link_->shards(), 2u);
  const auto release = [&](const NameId& name) {
    std::optional<LockdReply> reply;
    link_->call(wire::Release{name, sid(1), 1}, boottime_ns() + 10 * kNsPerS, [&](LockdReply r) { reply = std::move(r); });
    EXPECT_TRUE(run_until(*loop_, [&] { return reply.has_value(); }));
    return served_by(reply.value_or(LockdReply{}));
  };
  EXPECT_EQ(release(of1), 1);  // via lockd 0's redirect
  EXPECT_EQ(lockds_[0]->requests.size(), 1u);
  EXPECT_EQ(lockds_[1]->requests.size(), 1u);
  EXPECT_EQ(link_->lockd(0), lockds_[0]->addr);
  EXPECT_EQ(link_->lockd(1), lockds_[1]->addr);
  EXPECT_EQ(release(of0), 0);
  EXPECT_EQ(release(of1), 1);
  EXPECT_EQ(release(of0), 0);
  EXPECT_EQ(lockds_[0]->requests.size(), 3u);  // the redirect, then shard 0's two
  EXPECT_EQ(lockds_[1]->requests.size(), 2u);  // shard 1's two, each straight there
  EXPECT_EQ(link_->stats().not_leader_answers, 1u);
  EXPECT_EQ(link_->stats().not_leader_waits, 0u);
  EXPECT_EQ(link_->stats().leader_switches, 1u);
  EXPECT_EQ(lockds_[0]->errors_sent + lockds_[1]->errors_sent, 0u);  // one seq stream, two windows
}

// No leader named (no hint, or one that is not configured): round robin to the next address,
// after a backoff, and the call completes where a leader answers.
TEST_F(LockdLinkTest, NotLeaderWithoutAUsableHintGoesRoundRobinAfterABackoff) {
  start(3, policy(300, 300));  // long enough that no answer on loopback is late for a retry
  lockds_[0]->mode = FakeLockd::Mode::follower;  // no leader known
  lockds_[1]->mode = FakeLockd::Mode::follower;
  lockds_[1]->hint = "10.255.255.1:7400";  // a leader this worker was not given
  std::vector<std::pair<std::string, SocketAddress>> unconfigured;
  link_->set_unconfigured_leader_handler(
      [&](const std::string& hint, const SocketAddress& from) { unconfigured.emplace_back(hint, from); });
  const auto [reply, took] = stats_call(10 * kNsPerS);
  ASSERT_TRUE(reply.ok()) << reply.problem;
  EXPECT_EQ(served_by(reply), 2);
  ASSERT_EQ(lockds_[0]->requests.size(), 1u);
  ASSERT_EQ(lockds_[1]->requests.size(), 1u);
  ASSERT_EQ(lockds_[2]->requests.size(), 1u);
  // A backoff (300 ms, 20 % jitter) before each of the two resends: no spinning.
  EXPECT_GE(lockds_[1]->requests[0] - lockds_[0]->requests[0], 240 * kNsPerMs);
  EXPECT_GE(lockds_[2]->requests[0] - lockds_[1]->requests[0], 240 * kNsPerMs);
  EXPECT_GE(took, 480 * kNsPerMs);
  EXPECT_EQ(link_->stats().not_leader_answers, 2u);
  EXPECT_EQ(link_->stats().not_leader_waits, 2u);
  EXPECT_EQ(link_->stats().leader_switches, 2u);
  EXPECT_EQ(link_->lockd(), lockds_[2]->addr);
  // Not followed, but said once: the supervisor logs it long before a kill-switch is due.
  EXPECT_EQ(link_->stats().unconfigured_leader_hints, 1u);
  ASSERT_EQ(unconfigured.size(), 1u);
  EXPECT_EQ(unconfigured[0].first, "10.255.255.1:7400");
  EXPECT_EQ(unconfigured[0].second, lockds_[1]->addr);
}

// A dead leader: the attempt that got no answer moves the call (and the link) to the next
// address on its retry.
TEST_F(LockdLinkTest, ATimedOutAttemptTriesTheNextAddress) {
  start(2, policy(200, 200));
  lockds_[0]->mode = FakeLockd::Mode::dead;
  const auto [reply, took] = stats_call(10 * kNsPerS);
  ASSERT_TRUE(reply.ok()) << reply.problem;
  EXPECT_EQ(served_by(reply), 1);
  EXPECT_EQ(reply.attempts, 2u);
  EXPECT_EQ(lockds_[0]->datagrams, 1u);
  EXPECT_EQ(lockds_[1]->requests.size(), 1u);
  EXPECT_EQ(link_->stats().leader_switches, 1u);
  EXPECT_EQ(link_->lockd(), lockds_[1]->addr);
}

// lockd's key-rejected notice carries no tag, so it never ends a call: a call to a lockd that
// only sends notices ends unanswered at its deadline, having counted them (the health text then
// names the likely cause), and a notice followed by lockd's authentic answer ends with the answer.
TEST_F(LockdLinkTest, AKeyRejectedNoticeIsCountedAndNeverEndsACall) {
  start(1, policy(100, 100));
  lockds_[0]->mode = FakeLockd::Mode::rejects_key;
  const auto [reply, took] = stats_call(400 * kNsPerMs);
  EXPECT_FALSE(reply.ok());
  EXPECT_GE(took, 400 * kNsPerMs);
  EXPECT_GE(link_->stats().key_rejected_notices, 1u);
  EXPECT_EQ(link_->stats().last_key_rejected.key_id, 7u);
  EXPECT_EQ(link_->stats().last_key_rejected.reason, wire::KeyRejectReason::bad_mac);
  EXPECT_GT(link_->stats().last_key_rejected_ns, 0);
  EXPECT_EQ(link_->stats().calls_unanswered, 1u);

  lockds_[0]->mode = FakeLockd::Mode::leader;
  lockds_[0]->notice_first = true;
  const std::uint64_t before = link_->stats().key_rejected_notices;
  const auto [answered, took2] = stats_call(10 * kNsPerS);
  ASSERT_TRUE(answered.ok()) << answered.problem;
  EXPECT_EQ(served_by(answered), 0);
  EXPECT_EQ(link_->stats().key_rejected_notices, before + 1);

  // A notice from anywhere but a configured lockd (a sandbox on this host) is not counted.
  UniqueFd other(open_udp_socket(SocketAddress::loopback_v4(0)));
  ASSERT_TRUE(other.valid());
  const SocketAddress link_addr = lockds_[0]->worker;
  const auto forged = wire::encode_key_rejected({1, 9, wire::KeyRejectReason::unknown_key});
  ASSERT_EQ(::sendto(other.get(), forged.data(), forged.size(), 0, link_addr.sa(), link_addr.length),
            static_cast<ssize_t>(forged.size()));
  const auto [again, took3] = stats_call(10 * kNsPerS);  // the loop has read the forged notice by its end
  ASSERT_TRUE(again.ok()) << again.problem;
  EXPECT_EQ(link_->stats().key_rejected_notices, before + 2);  // this call's notice, not the forged one
  EXPECT_EQ(link_->stats().last_key_rejected.key_id, 7u);
}

// With one address nothing moves: the retry goes to the same lockd.
TEST_F(LockdLinkTest, WithOneAddressARetryStaysThere) {
  start(1, policy(20, 20));
  lockds_[0]->mode = FakeLockd::Mode::dead;
  const auto [reply, took] = stats_call(150 * kNsPerMs);
  EXPECT_FALSE(reply.ok());
  EXPECT_GE(lockds_[0]->datagrams, 2u);
  EXPECT_EQ(link_->stats().leader_switches, 0u);
  EXPECT_EQ(reply.problem.find("no lockd among"), std::string::npos) << reply.problem;
}

// not_leader is a redirect, not a refusal: while nobody leads the call is resent (at a bounded
// rate) until its deadline, then fails as unanswered, saying that no lockd leads.
TEST_F(LockdLinkTest, NotLeaderNeverEndsACallBeforeItsDeadlineAndDoesNotSpin) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{2}}) {
    SCOPED_TRACE(std::to_string(n) + " address(es)");
    TearDown();
    SetUp();
    start(n, policy(50, 100));
    for (auto& l : lockds_) l->mode = FakeLockd::Mode::follower;
    const std::int64_t deadline = 600 * kNsPerMs;
    const auto [reply, took] = stats_call(deadline);
    EXPECT_FALSE(reply.ok());
    EXPECT_EQ(reply.status, RequestStatus::deadline_passed);
    EXPECT_GE(took, deadline);
    EXPECT_NE(reply.problem.find("no lockd among"), std::string::npos) << reply.problem;
    EXPECT_NE(reply.problem.find("no leader known"), std::string::npos) << reply.problem;
    std::uint64_t sent = 0;
    for (const auto& l : lockds_) sent += l->datagrams;
    // Backoffs of 40..120 ms within 600 ms: a handful of resends, not thousands.
    EXPECT_GE(sent, 3u);
    EXPECT_LE(sent, 16u);
  }
}

// Two lockds that name each other (views that disagree during an election): the immediate
// redirects are bounded, then the link backs off.
TEST_F(LockdLinkTest, LockdsNamingEachOtherDoNotMakeTheLinkSpin) {
  start(2, policy(100, 100));
  lockds_[0]->mode = FakeLockd::Mode::follower;
  lockds_[0]->hint = lockds_[1]->addr.str();
  lockds_[1]->mode = FakeLockd::Mode::follower;
  lockds_[1]->hint = lockds_[0]->addr.str();
  const auto [reply, took] = stats_call(500 * kNsPerMs);
  EXPECT_FALSE(reply.ok());
  EXPECT_NE(reply.problem.find("no lockd among"), std::string::npos) << reply.problem;
  const std::uint64_t sent = lockds_[0]->datagrams + lockds_[1]->datagrams;
  EXPECT_LE(sent, 20u);  // ~3 per backoff of 80..120 ms
  EXPECT_GE(link_->stats().not_leader_waits, 1u);
}

// An answer that arrives while the call waits out a not_leader backoff (e.g. the old leader's
// late answer) ends the call at once; it is not a late answer for a call that gave up.
TEST_F(LockdLinkTest, AnAnswerDuringTheBackoffEndsTheCall) {
  start(2, policy(3000, 3000));
  lockds_[0]->mode = FakeLockd::Mode::follower;
  lockds_[1]->mode = FakeLockd::Mode::dead;
  std::optional<LockdReply> reply;
  std::uint64_t late = 0;
  link_->set_late_answer_handler([&](const wire::Body&) { ++late; });
  const std::int64_t t0 = boottime_ns();
  link_->call(wire::Stats{}, t0 + 20 * kNsPerS, [&](LockdReply r) { reply = std::move(r); });
  ASSERT_TRUE(run_until(*loop_, [&] { return link_->stats().not_leader_waits == 1; }));
  EXPECT_FALSE(reply.has_value());
  EXPECT_EQ(link_->outstanding(), 1u);
  lockds_[0]->answer(lockds_[0]->last_request_id, wire::StatsAnswer{{{"lockd", 0}}});
  ASSERT_TRUE(run_until(*loop_, [&] { return reply.has_value(); }));
  EXPECT_LT(boottime_ns() - t0, 2 * kNsPerS);
  EXPECT_EQ(served_by(*reply), 0) << reply->problem;
  EXPECT_EQ(late, 0u);
  EXPECT_EQ(link_->stats().late_answers, 0u);
  EXPECT_EQ(link_->outstanding(), 0u);
  EXPECT_EQ(lockds_[1]->datagrams, 0u);  // the backoff never ended
}

// lockd's own requests come from whichever lockd leads: IsRunning and Revoked from the second
// one are answered, to the address they came from.
TEST_F(LockdLinkTest, RequestsFromAnyConfiguredLockdAreAnsweredToTheirSender) {
  start(2, policy(2000, 2000));
  link_->set_is_running_handler([](const wire::IsRunning& q) { return q.sandbox == sid(10); });
  link_->set_revoked_handler([](const wire::Revoked&) { return true; });
  const SocketAddress worker = link_->local();
  ASSERT_TRUE(worker.is_set());
  lockds_[1]->ask(9001, wire::IsRunning{nid(10), sid(10), 50}, worker);
  lockds_[1]->ask(9002, wire::Revoked{nid(11), 51, 52}, worker);
  lockds_[0]->ask(9003, wire::IsRunning{nid(12), sid(12), 52}, worker);
  ASSERT_TRUE(run_until(*loop_, [&] { return lockds_[1]->answers.size() == 2 && lockds_[0]->answers.size() == 1; }));
  EXPECT_TRUE(lockds_[1]->answers[0].body == wire::Body(wire::RunningAnswer{nid(10), sid(10), 50, true}));
  EXPECT_EQ(lockds_[1]->answers[0].header.sender, kWorker);
  EXPECT_TRUE(lockds_[1]->answers[1].body == wire::Body(wire::RevokedAck{nid(11), 51, true}));
  EXPECT_TRUE(lockds_[0]->answers[0].body == wire::Body(wire::RunningAnswer{nid(12), sid(12), 52, false}));
  EXPECT_EQ(link_->stats().is_running_answered, 2u);
  EXPECT_EQ(link_->stats().revocations_pushed, 1u);
  EXPECT_EQ(link_->stats().is_running_rejected, 0u);
}

}  // namespace
}  // namespace leasehold
