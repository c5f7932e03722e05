// Who may do what to a name (DESIGN.md "Trust model"), against the real leasehold-lockd on
// loopback: each attack of issue 15 run by someone holding one worker's key (or nothing but a
// captured datagram). Every test runs the attack twice: with the defence switched off
// (LEASEHOLD_ABLATE, see lockd/config.hpp), where it must succeed, and with it on, where it must
// fail and be counted.
#include "leasehold/wire/auth.hpp"
#include "leasehold/io/clock.hpp"
#include "leasehold/io/probe.hpp"
#include "leasehold/wire/replay.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "lockd_process.hpp"

#include <chrono>
#include <gtest/gtest.h>

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <functional>
#include <map>
#include <optional>
#include <thread>

namespace leasehold::lockd {
namespace {

using namespace testing;

const SandboxId S1{0xA1, 1};
const WorkerId W{0xA0, 1};  // the victim worker
const WorkerId X{0xA0, 2};  // the worker whose key the attacker holds
constexpr std::int64_t kTtlMs = 3000;  // lockd's TTL in the heartbeat attacks

/// A raw UDP socket: sends hand-made datagrams, counts what comes back.
class RawSocket {
 public:
  RawSocket() { fd_ = open_udp_socket_blocking(*SocketAddress::parse("127.0.0.1:0")); }
  ~RawSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;
  void send(std::span<const std::uint8_t> d, const SocketAddress& to) const {
    ::sendto(fd_, d.data(), d.size(), 0, to.sa(), to.length);
  }
  /// The next datagram within `timeout_ms`, or empty. A key-rejected notice (lockd's
  /// unauthenticated word on a datagram it dropped for its key) is not an answer: it is counted
  /// in notices() and passed over, as every client does.
  std::vector<std::uint8_t> receive(int timeout_ms) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() < 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return {};
      std::vector<std::uint8_t> buf(wire::kDatagramBytesMax);
      const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
      if (n <= 0) return {};
      buf.resize(static_cast<std::size_t>(n));
      if (wire::decode_key_rejected(buf)) {
        ++notices_;
        continue;
      }
      return buf;
    }
  }
  std::size_t notices() const { return notices_; }
  /// Datagrams that arrive within `timeout_ms` (stops at the first quiet `timeout_ms`).
  std::size_t drain(int timeout_ms) const {
    std::size_t n = 0;
    while (!receive(timeout_ms).empty()) ++n;
    return n;
  }

 private:
  int fd_ = -1;
  mutable std::size_t notices_ = 0;
};

std::vector<std::uint8_t> seal(wire::Sender& s, std::uint64_t request_id, const wire::Body& body) {
  wire::Datagram d;
  EXPECT_TRUE(s.seal(request_id, body, d));
  return {d.bytes.begin(), d.bytes.begin() + d.size};
}

class LockdAuthority : public ::testing::TestWithParam<bool> {
 protected:
  /// GetParam(): the defence is on (true) or ablated (false).
  bool defended() const { return GetParam(); }

  void SetUp() override {
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    cluster_ = make_key(dir_.path());
  }
  void TearDown() override { ::unsetenv("LEASEHOLD_ABLATE"); }

  /// Starts lockd; `ablation` is set in its environment when the defence is ablated.
  void start(const std::string& ablation, std::vector<std::string> extra = {}) {
    if (!defended()) ::setenv("LEASEHOLD_ABLATE", ablation.c_str(), 1);
    ablation_ = ablation;
    std::vector<std::string> args{"--key-file", key_path(), "--store", (dir_.path() / "lockd.db").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string err;
    ASSERT_TRUE(lockd_.start(args, dir_.path() / "lockd.log", &err)) << err;
  }
  std::string key_path() const { return (dir_.path() / "lockd.key").string(); }

  /// W's sandbox S1 acquires `name` with W's own key: the heartbeat W's supervisor would send
  /// for that grant, for a test to forge, capture or replay. nullopt (a failure recorded) when
  /// lockd does not grant it.
  std::optional<wire::Heartbeat> held_by_w(const std::string& name) {
    AdminClient w(lockd_.address(), worker_key(W));
    const Answer g = w.acquire(name, S1, W);
    const auto* grant = g.as<wire::Grant>();
    EXPECT_NE(grant, nullptr) << name << ": " << g.message();
    if (grant == nullptr) return std::nullopt;
    wire::Heartbeat hb;
    hb.entries.push_back(wire::HeartbeatEntry{name_id_of(name), S1, grant->epoch});
    return hb;
  }
  /// `hb` sealed with W's key as its supervisor sends it (request id 9), sent from `from` and
  /// answered: the bytes an attacker on the wire captures.
  std::vector<std::uint8_t> genuine(const wire::Heartbeat& hb, RawSocket& from) {
    wire::Sender sup(W, wire::seq_seed(), worker_key(W));
    std::vector<std::uint8_t> bytes = seal(sup, 9, hb);
    from.send(bytes, lockd_.address());
    EXPECT_FALSE(from.receive(2000).empty()) << "the genuine heartbeat is not answered";
    return bytes;
  }

  /// The key lockd issues to `worker`, made as an operator makes it (leasehold-lockd
  /// --derive-worker-key), under the same ablation as the running lockd.
  wire::WireKey worker_key(const WorkerId& worker) {
    const fs::path out = dir_.path() / ("worker-" + worker.str() + ".key");
    if (!fs::exists(out)) {
      const ExitResult r = run_lockd_to_exit(
          {"--derive-worker-key", "--worker-id", worker.str(), "--key-file", key_path(), "--out", out.string()},
          dir_.path());
      EXPECT_EQ(r.code, 0) << r.err;
    }
    auto k = wire::load_key_file(out.string());
    EXPECT_TRUE(k) << k.message();
    EXPECT_EQ(k->kind, wire::KeyKind::worker);
    EXPECT_EQ(k->worker, worker);
    return *k;
  }

  std::map<std::string, std::uint64_t> counters() {
    AdminClient admin(lockd_.address(), cluster_);
    auto c = admin.counters();
    EXPECT_TRUE(c) << c.message();
    std::map<std::string, std::uint64_t> v;
    if (c)
      for (const auto& k : *c) v[k.key] = k.value;
    return v;
  }
  /// Sends next() every 100 ms for 3 TTLs (kTtlMs) or, with the defence on, until `name` is no
  /// longer held; true if it stopped being held. (A loaded machine may stall the sender for a
  /// while: the TTL is long enough that the ablated run's refreshes still land in time.)
  bool sent_until_not_held(const std::function<std::vector<std::uint8_t>()>& next, const std::string& name) {
    RawSocket s;
    const std::int64_t until = boottime_ns() + 3 * kTtlMs * 1'000'000;
    while (boottime_ns() < until) {
      s.send(next(), lockd_.address());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (defended() && state_of(name) != LockPhase::held) return true;
    }
    return state_of(name) != LockPhase::held;
  }
  LockPhase state_of(const std::string& name) {
    AdminClient admin(lockd_.address(), cluster_);
    const Answer a = admin.show(name);
    if (const auto* i = a.as<wire::NameInfo>()) return i->record.state;
    return LockPhase::free;
  }

  TempDir dir_;
  wire::WireKey cluster_;
  LockdProcess lockd_;
  std::string ablation_;
};

// One datagram claiming worker W with the highest sequence number, signed by another worker's
// key, used to poison W's replay window: every later datagram of W was refused as stale.
TEST_P(LockdAuthority, ForeignKeyCannotPoisonAnotherWorkersReplayWindow) {
  start("shared-worker-key");
  const wire::WireKey kx = worker_key(X);
  // Claims W, under X's key, with the highest seq lockd would accept from anyone: half an hour
  // ahead of its clock (a seq further ahead is refused as seq_jump whoever signs it), far above
  // any seq W's own sender, seeded from the clock now, will use for that half hour.
  const auto now_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                     std::chrono::system_clock::now().time_since_epoch())
                                                     .count());
  wire::Sender forged(W, now_ns + wire::kSeqAheadMaxNs / 2, kx);
  RawSocket s;
  s.send(seal(forged, 1, wire::Stats{}), lockd_.address());
  const bool answered = !s.receive(defended() ? 300 : 2000).empty();

  AdminClient w(lockd_.address(), worker_key(W));
  ASSERT_EQ(w.self(), W);
  const Answer a = w.acquire("auth/poison", S1, W);
  if (defended()) {
    EXPECT_FALSE(answered) << "a datagram that is not W's was answered";
    ASSERT_NE(a.as<wire::Grant>(), nullptr) << a.message();
    EXPECT_GE(counters()["reject_bad_tag"], 1u);
    EXPECT_EQ(counters()["reject_stale_seq"], 0u) << "W's window was moved by a datagram not W's";
  } else {
    // The ablated lockd executed X's datagram as W's and moved W's window: W's first datagram
    // was refused as stale. (W then recovers from the stale_seq answer's floor, since no window
    // can be moved more than kSeqAheadMaxNs ahead; before that bound it stayed locked out.)
    EXPECT_TRUE(answered) << "the ablated lockd was expected to execute the forged datagram";
    EXPECT_GE(counters()["reject_stale_seq"], 1u) << "the ablated lockd was expected to be poisoned";
  }
}

// `release` of a name W's sandbox holds, sent with worker X's own key (and X's id): refused as
// forbidden, counted, and the name stays held.
TEST_P(LockdAuthority, ReleaseFromAnotherWorkerIsRefused) {
  start("no-authz");
  AdminClient w(lockd_.address(), worker_key(W));
  const Answer g = w.acquire("auth/release", S1, W);
  const auto* grant = g.as<wire::Grant>();
  ASSERT_NE(grant, nullptr) << g.message();

  AdminClient x(lockd_.address(), worker_key(X));
  const Answer r = x.release(name_id_of("auth/release"), S1, grant->epoch);
  if (defended()) {
    const auto* d = r.as<wire::Deny>();
    ASSERT_NE(d, nullptr) << r.message();
    EXPECT_EQ(d->refusal, Refusal::forbidden);
    EXPECT_TRUE(d->holder.is_nil());  // the refusal tells nothing of the holder
    EXPECT_EQ(state_of("auth/release"), LockPhase::held);
    auto c = counters();
    EXPECT_EQ(c["refusal_forbidden"], 1u);
    EXPECT_EQ(c["forbidden"], 1u);
    // Acting as another worker is refused too: X acquiring for W, X committing as W.
    const Answer a2 = x.acquire("auth/other", S1, W);
    ASSERT_NE(a2.as<wire::Deny>(), nullptr) << a2.message();
    EXPECT_EQ(a2.as<wire::Deny>()->refusal, Refusal::forbidden);
    // The rightful holder's worker can still release.
    const Answer own = w.release(name_id_of("auth/release"), S1, grant->epoch);
    EXPECT_NE(own.as<wire::Ok>(), nullptr) << own.message();
  } else {
    EXPECT_NE(r.as<wire::Ok>(), nullptr) << r.message();
    EXPECT_EQ(state_of("auth/release"), LockPhase::free);
  }
}

// W's 2-phase acquire is pending; X knows its name, sandbox id and epoch (they are no secret:
// the CLI prints them, a sandbox sees its own) and commits it to itself with its own key and id.
// The Acquiring record is bound to W, so X's commit and X's abort are refused as forbidden.
TEST_P(LockdAuthority, CommitOfAnotherWorkersAcquireIsRefused) {
  start("acquiring-unbound");
  AdminClient w(lockd_.address(), worker_key(W));
  const Answer g = w.acquire("auth/commit", S1, W, 0, /*two_phase=*/true);
  const auto* grant = g.as<wire::Grant>();
  ASSERT_NE(grant, nullptr) << g.message();
  ASSERT_EQ(grant->state, LockPhase::acquiring);

  AdminClient x(lockd_.address(), worker_key(X));
  const Answer c = x.commit(name_id_of("auth/commit"), S1, grant->epoch, X);
  AdminClient admin(lockd_.address(), cluster_);
  const Answer shown = admin.show("auth/commit");
  const auto* info = shown.as<wire::NameInfo>();
  ASSERT_NE(info, nullptr) << shown.message();
  if (defended()) {
    const auto* d = c.as<wire::Deny>();
    ASSERT_NE(d, nullptr) << c.message();
    EXPECT_EQ(d->refusal, Refusal::forbidden);
    EXPECT_TRUE(d->holder.is_nil());
    EXPECT_EQ(info->record.state, LockPhase::acquiring);
    EXPECT_EQ(info->record.worker, W);  // the record names the worker it is bound to
    // X's abort of W's acquire is refused the same way.
    const Answer abort = x.release(name_id_of("auth/commit"), S1, grant->epoch);
    ASSERT_NE(abort.as<wire::Deny>(), nullptr) << abort.message();
    EXPECT_EQ(abort.as<wire::Deny>()->refusal, Refusal::forbidden);
    auto n = counters();
    EXPECT_EQ(n["refusal_forbidden"], 2u);
    EXPECT_EQ(n["forbidden"], 2u);
    // W commits its own acquire.
    const Answer own = w.commit(name_id_of("auth/commit"), S1, grant->epoch, W);
    ASSERT_NE(own.as<wire::Grant>(), nullptr) << own.message();
    EXPECT_EQ(own.as<wire::Grant>()->state, LockPhase::held);
    EXPECT_EQ(own.as<wire::Grant>()->epoch, grant->epoch);
  } else {
    const auto* held = c.as<wire::Grant>();
    ASSERT_NE(held, nullptr) << "the ablated lockd was expected to let X commit: " << c.message();
    EXPECT_EQ(held->state, LockPhase::held);
    EXPECT_EQ(info->record.worker, X);  // W's sandbox's name now belongs to X's worker
  }
}

// Heartbeats claiming W's id, signed with X's key, sent for W's name: they must not keep it
// held; lockd's TTL expires it.
TEST_P(LockdAuthority, HeartbeatClaimingAnotherWorkersIdDoesNotRefresh) {
  start("shared-worker-key", {"--ttl-ms", std::to_string(kTtlMs)});
  const auto hb = held_by_w("auth/heartbeat");
  ASSERT_TRUE(hb);

  wire::Sender forged(W, wire::seq_seed(), worker_key(X));
  std::uint64_t rid = 1;
  const bool expired = sent_until_not_held([&] { return seal(forged, rid++, *hb); }, "auth/heartbeat");
  if (defended()) {
    EXPECT_TRUE(expired) << "forged heartbeats kept W's name held";
    EXPECT_GE(counters()["reject_bad_tag"], 1u);
  } else {
    EXPECT_EQ(state_of("auth/heartbeat"), LockPhase::held) << "the ablated lockd was expected to refresh";
  }
}

// A heartbeat datagram captured on the wire and replayed (no key needed) kept a name held after
// its sandbox had been killed: a replayed seq is never executed.
TEST_P(LockdAuthority, ReplayedHeartbeatIsNotExecuted) {
  start("replay-heartbeats", {"--ttl-ms", std::to_string(kTtlMs)});
  const auto hb = held_by_w("auth/replay");
  ASSERT_TRUE(hb);
  RawSocket s;
  const std::vector<std::uint8_t> captured = genuine(*hb, s);
  ASSERT_FALSE(HasFailure());
  // The sandbox is gone; the attacker replays the captured bytes.
  const bool expired = sent_until_not_held([&] { return captured; }, "auth/replay");
  if (defended()) {
    EXPECT_TRUE(expired) << "a replayed heartbeat kept the name held";
    EXPECT_GE(counters()["reject_replayed"], 1u);
  } else {
    EXPECT_EQ(state_of("auth/replay"), LockPhase::held) << "the ablated lockd was expected to refresh";
  }
}

// A captured stats request replayed from many source ports returned its (larger) answer to
// each: a cached answer goes only to where it went first, and only a bounded number of times.
TEST_P(LockdAuthority, CachedAnswerIsNotReflectedToOtherAddresses) {
  start("reflection");
  wire::Sender client(WorkerId{0xC0, 1}, wire::seq_seed(),
                      wire::WireKey(cluster_.bytes, wire::KeyKind::admin,
                                    static_cast<std::uint16_t>(cluster_.key_id | wire::kAdminKeyIdBit)));
  const std::vector<std::uint8_t> request = seal(client, 77, wire::Stats{});
  RawSocket original;
  original.send(request, lockd_.address());
  const std::vector<std::uint8_t> answer = original.receive(2000);
  ASSERT_FALSE(answer.empty());
  EXPECT_GT(answer.size(), request.size());  // the amplification the attack is after

  constexpr int kPorts = 20;
  std::size_t reflected = 0;
  for (int i = 0; i < kPorts; ++i) {
    RawSocket other;
    other.send(request, lockd_.address());
    reflected += other.drain(defended() ? 100 : 1000);
  }
  // From the original address too: at most kResendsPerAnswerMax copies, however many replays.
  for (int i = 0; i < 3 * static_cast<int>(wire::kResendsPerAnswerMax); ++i) original.send(request, lockd_.address());
  const std::size_t resent = original.drain(300);
  if (defended()) {
    EXPECT_EQ(reflected, 0u);
    EXPECT_LE(resent, wire::kResendsPerAnswerMax);
    auto c = counters();
    EXPECT_EQ(c["resends_refused_source"], static_cast<std::uint64_t>(kPorts));
    EXPECT_GE(c["resends_refused_rate"], 1u);
  } else {
    EXPECT_EQ(reflected, static_cast<std::size_t>(kPorts));
    EXPECT_GT(resent, wire::kResendsPerAnswerMax);
  }
}

// A client restarted with a lower seq (its wall clock was stepped back; LEASEHOLD_TEST_SEQ_SEED
// stands in for the clock) is refused as stale_seq once, learns lockd's seq_floor from the
// authenticated answer and continues above it; the old run's datagrams stay refused.
TEST_P(LockdAuthority, RestartBelowTheWindowResyncsWithoutReopeningReplay) {
  start("no-seq-resync");  // a client-side switch: the client keeps its seq after stale_seq
  const wire::WireKey kw = worker_key(W);
  // Ten minutes ahead of the wall clock: inside kSeqAheadMaxNs.
  ::setenv("LEASEHOLD_TEST_SEQ_SEED", std::to_string(wire::realtime_ns() + 600'000'000'000ull).c_str(), 1);
  wire::Sender before(W, wire::seq_seed(), kw);
  ::unsetenv("LEASEHOLD_TEST_SEQ_SEED");
  RawSocket s;
  const std::vector<std::uint8_t> old = seal(before, 5, wire::Stats{});
  s.send(old, lockd_.address());
  ASSERT_FALSE(s.receive(2000).empty());

  // The restart: a seq far below the window.
  ::setenv("LEASEHOLD_TEST_SEQ_SEED", "1000", 1);
  // A retry is answered stale_seq once the old address has been silent a while (replay.hpp).
  AdminClient after(lockd_.address(), kw, {}, 20'000'000'000);  // reads LEASEHOLD_ABLATE like a supervisor
  ::unsetenv("LEASEHOLD_TEST_SEQ_SEED");
  const Answer a = after.acquire("auth/restart", S1, W);
  if (!defended()) {
    EXPECT_EQ(a.as<wire::Grant>(), nullptr);
    EXPECT_NE(a.message().find("stale_seq"), std::string::npos) << a.message();
    return;
  }
  ASSERT_NE(a.as<wire::Grant>(), nullptr) << a.message();
  auto c = counters();
  EXPECT_GE(c["reject_stale_seq"], 1u);  // its retries until the old address had been silent
  // The old run's captured datagram is still refused (never executed again): between two
  // readings only the next reading's own Stats requests (its pages) are accepted.
  const std::uint64_t accepted = c["decode_accepted"];
  const std::uint64_t per_reading = counters()["decode_accepted"] - accepted;
  s.send(old, lockd_.address());
  s.drain(300);
  c = counters();
  EXPECT_EQ(c["decode_accepted"], accepted + 2 * per_reading);
}

// revoke, transfer, reassign, list and show of another worker's name need an admin key: a
// worker's key is refused (and learns nothing); an admin key lockd was given may do them.
TEST_P(LockdAuthority, AdminOperationsNeedAnAdminKey) {
  const fs::path admin_path = dir_.path() / "admin.key";
  ASSERT_EQ(run_lockd_to_exit({"--generate-key", admin_path.string(), "--kind", "admin", "--key-id", "9"}, dir_.path()).code, 0);
  start("no-authz", {"--admin-key-file", admin_path.string()});
  AdminClient w(lockd_.address(), worker_key(W));
  const Answer g = w.acquire("auth/admin", S1, W);
  ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
  const Answer own = w.show("auth/admin");
  EXPECT_NE(own.as<wire::NameInfo>(), nullptr) << own.message();  // its own name: allowed

  AdminClient x(lockd_.address(), worker_key(X));
  const Answer sh = x.show("auth/admin");
  const Answer ls = x.list();
  const Answer rv = x.revoke(name_id_of("auth/admin"));
  if (defended()) {
    for (const Answer* a : {&sh, &ls, &rv}) {
      ASSERT_NE(a->as<wire::Deny>(), nullptr) << a->message();
      EXPECT_EQ(a->as<wire::Deny>()->refusal, Refusal::forbidden);
      EXPECT_TRUE(a->as<wire::Deny>()->holder.is_nil());
    }
    EXPECT_EQ(state_of("auth/admin"), LockPhase::held);
    EXPECT_EQ(counters()["forbidden"], 3u);
  } else {
    EXPECT_NE(sh.as<wire::NameInfo>(), nullptr) << sh.message();
    EXPECT_NE(rv.as<wire::Ok>(), nullptr) << rv.message();
  }
  auto admin = wire::load_key_file(admin_path.string());
  ASSERT_TRUE(admin) << admin.message();
  AdminClient a(lockd_.address(), *admin);
  const Answer listed = a.list();
  ASSERT_NE(listed.as<wire::ListPage>(), nullptr) << listed.message();
  EXPECT_EQ(listed.as<wire::ListPage>()->entries.size(), 1u);
}

// An admin key (an operator's: revoke, transfer, list...) speaking as a worker: with W's
// supervisor silent, the name W's sandbox holds is revoked; an admin-key KillConfirmed claiming
// W would end the lock-delay while W's sandbox may still run, and an admin-key acquire for W
// would grant W's worker a name it never asked for. Every worker message under an admin key is
// refused as forbidden and counted; only W's own key confirms W's kill.
TEST_P(LockdAuthority, AdminKeyCannotSpeakAsAWorker) {
  const fs::path admin_path = dir_.path() / "admin.key";
  ASSERT_EQ(run_lockd_to_exit({"--generate-key", admin_path.string(), "--kind", "admin", "--key-id", "9"}, dir_.path()).code, 0);
  start("admin-as-worker", {"--admin-key-file", admin_path.string(), "--ttl-ms", "60000"});
  auto admin_key = wire::load_key_file(admin_path.string());
  ASSERT_TRUE(admin_key) << admin_key.message();
  AdminClient w(lockd_.address(), worker_key(W));
  const Answer g = w.acquire("auth/killconf", S1, W);
  const auto* grant = g.as<wire::Grant>();
  ASSERT_NE(grant, nullptr) << g.message();
  AdminClient admin(lockd_.address(), *admin_key);
  const Answer rv = admin.revoke(name_id_of("auth/killconf"));
  ASSERT_NE(rv.as<wire::Ok>(), nullptr) << rv.message();

  // The admin key, with the header naming W: a kill confirmation, an acquire, a release, a
  // heartbeat, all for W.
  AdminClient as_w(lockd_.address(), *admin_key, W);
  const Answer kc = as_w.request(wire::KillConfirmed{name_id_of("auth/killconf"), S1, grant->epoch});
  const Answer other = as_w.acquire("auth/granted-to-w", SandboxId{0xA1, 2}, W);
  const Answer rel = as_w.release(name_id_of("auth/granted-to-w"), SandboxId{0xA1, 2}, 1);
  const std::array<wire::HeartbeatEntry, 1> beat{wire::HeartbeatEntry{name_id_of("auth/killconf"), S1, grant->epoch}};
  const Answer hb = as_w.heartbeat(beat);
  AdminClient x(lockd_.address(), worker_key(X));
  const Answer taken = x.acquire("auth/killconf", SandboxId{0xA1, 3}, X);
  if (defended()) {
    for (const Answer* a : {&kc, &other, &rel, &hb}) {
      ASSERT_NE(a->as<wire::Deny>(), nullptr) << a->message();
      EXPECT_EQ(a->as<wire::Deny>()->refusal, Refusal::forbidden);
    }
    ASSERT_NE(taken.as<wire::Deny>(), nullptr) << taken.message();
    EXPECT_EQ(taken.as<wire::Deny>()->refusal, Refusal::lock_delay);  // W's sandbox may still run
    EXPECT_EQ(state_of("auth/granted-to-w"), LockPhase::free);
    auto c = counters();
    EXPECT_EQ(c["forbidden"], 4u);
    EXPECT_EQ(c["refusal_forbidden"], 4u);
    // W's own key confirms the kill; then the name is grantable.
    const Answer own = w.request(wire::KillConfirmed{name_id_of("auth/killconf"), S1, grant->epoch});
    EXPECT_NE(own.as<wire::Ok>(), nullptr) << own.message();
    const Answer after = x.acquire("auth/killconf", SandboxId{0xA1, 3}, X);
    EXPECT_NE(after.as<wire::Grant>(), nullptr) << after.message();
  } else {
    EXPECT_NE(kc.as<wire::Ok>(), nullptr) << "the ablated lockd was expected to accept the admin's confirmation: "
                                          << kc.message();
    ASSERT_NE(other.as<wire::Grant>(), nullptr) << other.message();
    EXPECT_EQ(other.as<wire::Grant>()->worker, W);
    EXPECT_NE(taken.as<wire::Grant>(), nullptr) << "X was expected to take the name while W's sandbox may run: "
                                                << taken.message();
  }
}

// The cluster key used directly is the root secret (it derives every worker key): it may do
// what an admin may and speak for any worker; it still cannot confirm a worker's kill.
TEST_P(LockdAuthority, ClusterKeyIsRootButCannotConfirmAKill) {
  start("admin-as-worker", {"--ttl-ms", "60000"});
  AdminClient root(lockd_.address(), cluster_, W);
  const Answer g = root.acquire("auth/root", S1, W);
  const auto* grant = g.as<wire::Grant>();
  ASSERT_NE(grant, nullptr) << g.message();
  EXPECT_EQ(grant->worker, W);
  const Answer rv = root.revoke(name_id_of("auth/root"));
  ASSERT_NE(rv.as<wire::Ok>(), nullptr) << rv.message();
  const Answer kc = root.request(wire::KillConfirmed{name_id_of("auth/root"), S1, grant->epoch});
  if (defended()) {
    ASSERT_NE(kc.as<wire::Deny>(), nullptr) << kc.message();
    EXPECT_EQ(kc.as<wire::Deny>()->refusal, Refusal::forbidden);
    EXPECT_EQ(counters()["forbidden"], 1u);
  } else {
    EXPECT_NE(kc.as<wire::Ok>(), nullptr) << kc.message();
  }
}

// A transfer leaves the name reserved for the receiving sandbox S2 on worker W. Sandbox ids are
// no secret (a sibling sees them in the shm table), so X names S2 in its own acquire: it got
// the name with worker X, and W's sandbox then believed it held the name until W's heartbeat
// was answered lost. The reservation is for (S2, W): X's acquire is forbidden and counted.
TEST_P(LockdAuthority, ReservationCannotBeTakenByAnotherWorker) {
  start("reservation-unbound", {"--ttl-ms", "60000"});
  const SandboxId S2{0xA1, 2};
  AdminClient w(lockd_.address(), worker_key(W));
  const Answer g = w.acquire("auth/reserved", S1, W);
  const auto* grant = g.as<wire::Grant>();
  ASSERT_NE(grant, nullptr) << g.message();
  AdminClient root(lockd_.address(), cluster_);
  const NameId id = name_id_of("auth/reserved");
  const Answer tb = root.transfer_begin(id, S1, grant->epoch, S2, W);
  ASSERT_NE(tb.as<wire::TransferState>(), nullptr) << tb.message();
  // S1 is dead: W says so (whatever guards the transfer's completion, this lifts it).
  (void)w.request(wire::KillConfirmed{id, S1, grant->epoch});
  const Answer tc = root.transfer_complete(id, grant->epoch + 1);
  ASSERT_NE(tc.as<wire::TransferState>(), nullptr) << tc.message();

  AdminClient x(lockd_.address(), worker_key(X));
  const Answer stolen = x.acquire("auth/reserved", S2, X);
  if (defended()) {
    const auto* d = stolen.as<wire::Deny>();
    ASSERT_NE(d, nullptr) << stolen.message();
    EXPECT_EQ(d->refusal, Refusal::forbidden);
    EXPECT_TRUE(d->holder.is_nil());  // nothing told
    EXPECT_EQ(d->epoch, 0u);
    auto c = counters();
    EXPECT_EQ(c["forbidden"], 1u);
    EXPECT_EQ(c["refusal_forbidden"], 1u);
    // W takes its reservation; X naming the holder now gets no "idempotent" grant either.
    const Answer own = w.acquire("auth/reserved", S2, W);
    ASSERT_NE(own.as<wire::Grant>(), nullptr) << own.message();
    EXPECT_EQ(own.as<wire::Grant>()->epoch, grant->epoch + 1);
    const Answer again = x.acquire("auth/reserved", S2, X);
    ASSERT_NE(again.as<wire::Deny>(), nullptr) << again.message();
    EXPECT_EQ(again.as<wire::Deny>()->refusal, Refusal::forbidden);
    EXPECT_EQ(counters()["forbidden"], 2u);
  } else {
    const auto* taken = stolen.as<wire::Grant>();
    ASSERT_NE(taken, nullptr) << "the ablated lockd was expected to give X the reservation: " << stolen.message();
    EXPECT_EQ(taken->worker, X);
  }
}

// One datagram under W's own key with the highest seq there is: the window's floor (highest
// + 1) overflowed to 0 and every later request of W was refused stale_seq, with a floor the
// sender could not use, until lockd restarted. A seq at or above 2^63 is refused and counted.
TEST_P(LockdAuthority, SeqAtTheTopCannotLockAWorkerOut) {
  start("seq-unbounded,seq-jump");
  const wire::WireKey kw = worker_key(W);
  wire::Sender top(W, wire::kSeqLimit - 1, kw);
  wire::Datagram d;
  ASSERT_TRUE(top.seal(1, wire::Stats{}, d));
  std::vector<std::uint8_t> bytes(d.bytes.begin(), d.bytes.begin() + d.size);
  // The sender makes no seq at the limit; the hand-made datagram carries the largest one.
  EXPECT_EQ(top.seal(2, wire::Stats{}, d).error, wire::EncodeError::seq_exhausted);
  ASSERT_TRUE(wire::restamp(bytes, UINT64_MAX, top.authenticator()));
  RawSocket s;
  s.send(bytes, lockd_.address());
  const std::vector<std::uint8_t> answer = s.receive(2000);
  ASSERT_FALSE(answer.empty());
  AdminClient w(lockd_.address(), kw);
  const Answer a = w.acquire("auth/top", S1, W);
  if (!defended()) {  // accepted; the floor wrapped: W is locked out
    EXPECT_EQ(a.as<wire::Grant>(), nullptr);
    EXPECT_NE(a.message().find("stale_seq"), std::string::npos) << a.message();
    return;
  }
  ASSERT_NE(a.as<wire::Grant>(), nullptr) << a.message();  // W still works
  wire::Authenticator auth(kw);
  const wire::DecodeResult r = wire::decode(answer, &auth);
  ASSERT_TRUE(r) << r.detail;
  const auto* e = std::get_if<wire::Error>(&r.body);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->code, wire::error_code_of(wire::DecodeError::seq_out_of_range));
  EXPECT_NE(e->message.find("2^63"), std::string::npos) << e->message;
  EXPECT_EQ(counters()["reject_seq_out_of_range"], 1u);
}

// One datagram under W's own key with seq 2^63-1 (below kSeqLimit, so not seq_out_of_range)
// moved W's window to the top: every later request of W was stale_seq with a floor of 2^63, which
// no sender may use, until lockd restarted. A seq more than kSeqAheadMaxNs above lockd's wall
// clock is refused seq_jump (answered, counted, not recorded); a jump inside the bound leaves a
// floor that a sender restarted at its wall clock continues from.
TEST_P(LockdAuthority, SeqJumpCannotLockAWorkerOut) {
  start("seq-jump");
  const wire::WireKey kw = worker_key(W);
  wire::Sender top(W, wire::kSeqLimit - 1, kw);
  RawSocket s;
  s.send(seal(top, 1, wire::Stats{}), lockd_.address());
  const std::vector<std::uint8_t> answer = s.receive(2000);
  ASSERT_FALSE(answer.empty());
  wire::Authenticator auth(kw);
  const wire::DecodeResult r = wire::decode(answer, &auth);
  ASSERT_TRUE(r) << r.detail;
  const auto* e = std::get_if<wire::Error>(&r.body);
  AdminClient w(lockd_.address(), kw);
  const Answer a = w.acquire("auth/jump", S1, W);
  if (!defended()) {  // accepted: W has no seq left
    EXPECT_EQ(e, nullptr) << "the ablated lockd was expected to accept seq 2^63-1";
    EXPECT_EQ(a.as<wire::Grant>(), nullptr);
    EXPECT_NE(a.message().find("stale_seq"), std::string::npos) << a.message();
    return;
  }
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->code, wire::error_code_of(wire::DecodeError::seq_jump));
  EXPECT_NE(e->message.find("wall clock"), std::string::npos) << e->message;
  ASSERT_NE(a.as<wire::Grant>(), nullptr) << a.message();  // W still works
  EXPECT_EQ(counters()["reject_seq_jump"], 1u);
  // The largest jump allowed (just under the bound) is taken; a sender that starts at its wall
  // clock, below it, resyncs from the stale_seq answer and is served.
  wire::Sender near(W, wire::realtime_ns() + wire::kSeqAheadMaxNs - 60'000'000'000ull, kw);
  RawSocket s2;
  s2.send(seal(near, 2, wire::Stats{}), lockd_.address());
  const std::vector<std::uint8_t> ok = s2.receive(2000);
  ASSERT_FALSE(ok.empty());
  const wire::DecodeResult okr = wire::decode(ok, &auth);
  ASSERT_TRUE(okr) << okr.detail;
  EXPECT_EQ(std::get_if<wire::Error>(&okr.body), nullptr);
  AdminClient restarted(lockd_.address(), kw, {}, 20'000'000'000);
  const Answer b = restarted.acquire("auth/jump2", SandboxId{0xA1, 2}, W);
  ASSERT_NE(b.as<wire::Grant>(), nullptr) << b.message();
  EXPECT_GE(counters()["reject_stale_seq"], 1u);
}

// A captured heartbeat replayed from many source ports drew an authenticated error answer on
// about every other port (one per 10 ms per sender). An error for a replayed or stale datagram
// goes only to the address the sender's last accepted datagram came from.
TEST_P(LockdAuthority, ReplayedRequestIsNotReflectedToOtherPorts) {
  start("reflection", {"--ttl-ms", std::to_string(kTtlMs)});
  const auto hb = held_by_w("auth/reflect");
  ASSERT_TRUE(hb);
  RawSocket own;
  const std::vector<std::uint8_t> captured = genuine(*hb, own);
  ASSERT_FALSE(HasFailure());

  constexpr int kPorts = 50;
  std::size_t reflected = 0;
  for (int i = 0; i < kPorts; ++i) {
    RawSocket other;
    other.send(captured, lockd_.address());
    reflected += other.drain(defended() ? 50 : 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(12));  // past the per-sender rate bound
  }
  // The genuine address still gets its answer (a retry of its own, replayed: an error there).
  own.send(captured, lockd_.address());
  const bool own_answered = !own.receive(2000).empty();
  if (defended()) {
    EXPECT_EQ(reflected, 0u);
    EXPECT_TRUE(own_answered);
    EXPECT_EQ(counters()["error_answers_refused_source"], static_cast<std::uint64_t>(kPorts));
  } else {
    EXPECT_GT(reflected, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(DefenceOnAndAblated, LockdAuthority, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "defended" : "ablated"; });

}  // namespace
}  // namespace leasehold::lockd
