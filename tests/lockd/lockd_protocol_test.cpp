// lockd as a real process on loopback: every transition through the protocol, refusals with
// their reasons, admin list/show/stats, bad datagrams, and preemptible mode.
#include "leasehold/io/clock.hpp"
#include "leasehold/io/loop.hpp"
#include "leasehold/io/probe.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "lockd_process.hpp"

#include <gtest/gtest.h>

#include <poll.h>

#include <atomic>
#include <map>
#include <thread>

#include <sys/socket.h>

#include <random>

namespace leasehold::lockd {
namespace {

using namespace testing;

class LockdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    key_ = make_key(dir_.path());
  }
  void start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--key-file", (dir_.path() / "lockd.key").string(), "--store",
                                  (dir_.path() / "lockd.db").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string err;
    ASSERT_TRUE(lockd_.start(args, dir_.path() / "lockd.log", &err)) << err;
  }
  AdminClient client(WorkerId self = {}) { return AdminClient(lockd_.address(), key_, self); }

  TempDir dir_;
  wire::WireKey key_;
  LockdProcess lockd_;
};

template <class T>
::testing::AssertionResult is(const Answer& a) {
  if (a.as<T>() != nullptr) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "unexpected answer: " << (a.ok() ? "" : a.message())
                                       << (a.as<wire::Deny>() != nullptr
                                               ? std::string(to_string(a.as<wire::Deny>()->refusal))
                                               : std::string());
}

std::string describe(const Answer& a) {
  if (!a.ok()) return a.message();
  if (const auto* d = a.as<wire::Deny>()) return "deny " + std::string(to_string(d->refusal));
  return "answer type " + std::string(wire::to_string(wire::type_of(a.body)));
}

const SandboxId S1{0x51, 1}, S2{0x51, 2}, S3{0x51, 3}, S4{0x51, 4};
const WorkerId W1{0x77, 1}, W2{0x77, 2};

TEST_F(LockdTest, AcquireRefreshReleaseAndRefusals) {
  start();
  AdminClient w1 = client(W1);  // the supervisor of worker W1 (heartbeats are per sender)
  const NameId id = name_id_of("svc/a");

  Answer a = w1.acquire("svc/a", S1, W1);
  const auto* g = a.as<wire::Grant>();
  ASSERT_NE(g, nullptr) << a.message();
  EXPECT_EQ(g->epoch, 1u);
  EXPECT_EQ(g->holder, S1);
  EXPECT_EQ(g->state, LockPhase::held);
  EXPECT_GT(g->ttl_ms, 0u);

  // Refresh: refreshed for the grant; lost{holder, epoch} for an old epoch; unknown for a
  // name lockd does not know.
  std::vector<wire::HeartbeatEntry> hb{{id, S1, 1}, {id, S1, 0}, {name_id_of("svc/nope"), S1, 1}};
  Answer r = w1.heartbeat(hb);
  const auto* ack = r.as<wire::HeartbeatAck>();
  ASSERT_NE(ack, nullptr) << r.message();
  ASSERT_EQ(ack->entries.size(), 3u);
  EXPECT_EQ(ack->entries[0].status, RefreshStatus::refreshed);
  EXPECT_GT(ack->entries[0].ttl_left_ms, 0u);
  EXPECT_EQ(ack->entries[1].status, RefreshStatus::lost);
  EXPECT_EQ(ack->entries[1].holder, S1);
  EXPECT_EQ(ack->entries[1].epoch, 1u);
  EXPECT_EQ(ack->entries[2].status, RefreshStatus::unknown);

  // Another sandbox: refused `held`, with the holder and epoch.
  Answer d = w1.acquire("svc/a", S2, W1);
  const auto* deny = d.as<wire::Deny>();
  ASSERT_NE(deny, nullptr) << d.message();
  EXPECT_EQ(deny->refusal, Refusal::held);
  EXPECT_EQ(deny->holder, S1);
  EXPECT_EQ(deny->epoch, 1u);

  // Release with a stale epoch is refused; with the right one it frees the name.
  const Answer stale_answer = w1.release(id, S1, 7);
  const auto* stale = stale_answer.as<wire::Deny>();
  ASSERT_NE(stale, nullptr);
  EXPECT_EQ(stale->refusal, Refusal::stale_epoch);
  Answer rel = w1.release(id, S1, 1);
  ASSERT_NE(rel.as<wire::Ok>(), nullptr) << rel.message();

  // The next grant takes a higher epoch.
  Answer a2 = w1.acquire("svc/a", S2, W1);
  ASSERT_NE(a2.as<wire::Grant>(), nullptr) << a2.message();
  EXPECT_GT(a2.as<wire::Grant>()->epoch, 1u);

  auto counters = w1.counters();
  ASSERT_TRUE(counters) << counters.message();
  auto value = [&](const char* k) -> std::uint64_t {
    for (const auto& c : *counters)
      if (c.key == k) return c.value;
    return UINT64_MAX;
  };
  EXPECT_EQ(value("refusal_held"), 1u);
  EXPECT_EQ(value("refusal_stale_epoch"), 1u);
  EXPECT_EQ(value("grants"), 2u);
  EXPECT_GE(value("store_commits"), 1u);
  EXPECT_NE(value("store_commit_us_p99"), UINT64_MAX);
  EXPECT_EQ(value("refresh_entries"), 3u);

  // One structured line per ownership change (grant, release, grant), none per refresh. A clean
  // exit on SIGTERM (under TSan, a data race would make it non-zero and show in the log).
  EXPECT_EQ(lockd_.terminate(), 0);
  const std::string log = lockd_.log();
  EXPECT_EQ(log.find("ThreadSanitizer"), std::string::npos) << log;
  EXPECT_EQ(log.find("AddressSanitizer"), std::string::npos) << log;
  EXPECT_NE(log.find("event=grant name=svc/a epoch=1 state=held holder=" + S1.str()), std::string::npos) << log;
  EXPECT_NE(log.find("event=release name=svc/a epoch=1"), std::string::npos) << log;
  EXPECT_EQ(log.find("refresh"), std::string::npos) << log;
}

TEST_F(LockdTest, TransferRevokeReassignShowList) {
  start();
  AdminClient c = client(W1);
  const NameId id = name_id_of("db/primary");
  const Answer g_answer = c.acquire("db/primary", S1, W1);
  const auto* g = g_answer.as<wire::Grant>();
  ASSERT_NE(g, nullptr);
  const Epoch e = g->epoch;

  const Answer tb = c.transfer_begin(id, S1, e, S2, W2);
  const auto* ts = tb.as<wire::TransferState>();
  ASSERT_NE(ts, nullptr) << tb.message();
  EXPECT_EQ(ts->old_epoch, e);
  EXPECT_EQ(ts->new_epoch, e + 1);
  EXPECT_EQ(ts->state, LockPhase::transferring);

  // During a transfer nobody may mutate: S1's refresh is lost, S3's acquire is refused.
  std::vector<wire::HeartbeatEntry> hb{{id, S1, e}};
  const Answer ack_answer = c.heartbeat(hb);
  const auto* ack = ack_answer.as<wire::HeartbeatAck>();
  ASSERT_NE(ack, nullptr);
  EXPECT_EQ(ack->entries[0].status, RefreshStatus::lost);
  const Answer d_answer = c.acquire("db/primary", S3, W1);
  const auto* d = d_answer.as<wire::Deny>();
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->refusal, Refusal::transferring);

  // S1 may still run: the transfer cannot complete until W1 confirms its kill (or S1's lease
  // + lock-delay would have ended), so not even S2 can be granted the name before.
  const Answer early = c.transfer_complete(id, e + 1);
  ASSERT_NE(early.as<wire::Deny>(), nullptr) << early.message();
  EXPECT_EQ(early.as<wire::Deny>()->refusal, Refusal::lock_delay);
  EXPECT_EQ(early.as<wire::Deny>()->state, LockPhase::transferring);
  const Answer guarded_answer = c.show(id);
  const auto* guarded = guarded_answer.as<wire::NameInfo>();
  ASSERT_NE(guarded, nullptr) << guarded_answer.message();
  EXPECT_EQ(guarded->record.state, LockPhase::transferring);
  EXPECT_TRUE(guarded->record.revoke_pending);
  EXPECT_EQ(guarded->record.revoked_epoch, e);
  EXPECT_EQ(guarded->record.worker, W1);
  EXPECT_GT(guarded->record.ttl_left_ms, 0u);
  const Answer too_early = c.transfer_accept(id, S2, W2);
  ASSERT_NE(too_early.as<wire::Deny>(), nullptr) << too_early.message();
  EXPECT_EQ(too_early.as<wire::Deny>()->refusal, Refusal::transferring);
  const Answer wrong = AdminClient(lockd_.address(), wire::derive_worker_key(key_, W2)).request(wire::KillConfirmed{id, S1, e});
  ASSERT_NE(wrong.as<wire::Deny>(), nullptr) << wrong.message();
  EXPECT_EQ(wrong.as<wire::Deny>()->refusal, Refusal::not_holder);
  const Answer killed =  // from W1, S1's worker
      AdminClient(lockd_.address(), wire::derive_worker_key(key_, W1)).request(wire::KillConfirmed{id, S1, e});
  ASSERT_NE(killed.as<wire::Ok>(), nullptr) << killed.message();
  const Answer lifted_xfer = c.show(id);
  ASSERT_NE(lifted_xfer.as<wire::NameInfo>(), nullptr);
  EXPECT_FALSE(lifted_xfer.as<wire::NameInfo>()->record.revoke_pending);
  EXPECT_EQ(lifted_xfer.as<wire::NameInfo>()->record.revoke_ended, wire::RevokeEnd::kill_confirmed);

  const Answer tc = c.transfer_complete(id, e + 1);
  ASSERT_NE(tc.as<wire::TransferState>(), nullptr) << tc.message();
  EXPECT_EQ(tc.as<wire::TransferState>()->state, LockPhase::free);
  const Answer reserved_answer = c.acquire("db/primary", S3, W1);
  const auto* reserved = reserved_answer.as<wire::Deny>();
  ASSERT_NE(reserved, nullptr);
  EXPECT_EQ(reserved->refusal, Refusal::reserved);

  // The reservation is for S2 on W2: S2's id from another worker is forbidden.
  const Answer stolen = c.acquire("db/primary", S2, W1);
  ASSERT_NE(stolen.as<wire::Deny>(), nullptr) << stolen.message();
  EXPECT_EQ(stolen.as<wire::Deny>()->refusal, Refusal::forbidden);
  const Answer acc = c.transfer_accept(id, S2, W2);
  const auto* g2 = acc.as<wire::Grant>();
  ASSERT_NE(g2, nullptr) << acc.message();
  EXPECT_EQ(g2->epoch, e + 1);
  EXPECT_EQ(g2->holder, S2);

  // show: state, holder, worker, epoch, time to expiry.
  const Answer sh = c.show("db/primary");
  const auto* info = sh.as<wire::NameInfo>();
  ASSERT_NE(info, nullptr) << sh.message();
  EXPECT_EQ(info->record.name, "db/primary");
  EXPECT_EQ(info->record.state, LockPhase::held);
  EXPECT_EQ(info->record.holder, S2);
  EXPECT_EQ(info->record.worker, W2);
  EXPECT_EQ(info->record.epoch, e + 1);
  EXPECT_GT(info->record.ttl_left_ms, 0u);

  // Revoke: no cooperation needed, epoch + 1, S2 is fenced out.
  const Answer rv = c.revoke(id);
  ASSERT_NE(rv.as<wire::Ok>(), nullptr) << rv.message();
  EXPECT_EQ(rv.as<wire::Ok>()->epoch, e + 2);
  std::vector<wire::HeartbeatEntry> hb2{{id, S2, e + 1}};
  const Answer ack2_answer = AdminClient(lockd_.address(), key_, W2).heartbeat(hb2);
  const auto* ack2 = ack2_answer.as<wire::HeartbeatAck>();
  ASSERT_NE(ack2, nullptr);
  EXPECT_EQ(ack2->entries[0].status, RefreshStatus::lost);
  EXPECT_EQ(ack2->entries[0].epoch, e + 2);
  // ... but the name is not grantable while S2 may still run: until W2 confirms the kill.
  const Answer pending_answer = c.show(id);
  const auto* pending = pending_answer.as<wire::NameInfo>();
  ASSERT_NE(pending, nullptr) << pending_answer.message();
  EXPECT_TRUE(pending->record.revoke_pending);
  EXPECT_EQ(pending->record.revoked_epoch, e + 1);
  EXPECT_EQ(pending->record.worker, W2);
  EXPECT_GT(pending->record.ttl_left_ms, 0u);
  const Answer delayed = c.acquire("db/primary", S3, W1);
  ASSERT_NE(delayed.as<wire::Deny>(), nullptr) << delayed.message();
  EXPECT_EQ(delayed.as<wire::Deny>()->refusal, Refusal::lock_delay);
  const Answer forged =  // from W1, not S2's worker
      AdminClient(lockd_.address(), wire::derive_worker_key(key_, W1)).request(wire::KillConfirmed{id, S2, e + 1});
  ASSERT_NE(forged.as<wire::Deny>(), nullptr) << forged.message();
  EXPECT_EQ(forged.as<wire::Deny>()->refusal, Refusal::not_holder);
  const Answer confirmed =
      AdminClient(lockd_.address(), wire::derive_worker_key(key_, W2)).request(wire::KillConfirmed{id, S2, e + 1});
  ASSERT_NE(confirmed.as<wire::Ok>(), nullptr) << confirmed.message();
  const Answer lifted = c.show(id);
  ASSERT_NE(lifted.as<wire::NameInfo>(), nullptr);
  EXPECT_FALSE(lifted.as<wire::NameInfo>()->record.revoke_pending);
  EXPECT_EQ(lifted.as<wire::NameInfo>()->record.revoke_ended, wire::RevokeEnd::kill_confirmed);
  // A revoke of the free name burns nothing unless forced.
  const Answer not_held = c.revoke(id);
  ASSERT_NE(not_held.as<wire::Deny>(), nullptr) << not_held.message();
  EXPECT_EQ(not_held.as<wire::Deny>()->refusal, Refusal::not_held);
  EXPECT_EQ(not_held.as<wire::Deny>()->epoch, e + 2);

  // Reassign the free name to S4: only S4 may take it, at the reassigned epoch.
  const Answer ra = c.reassign(id, S4, W1);
  ASSERT_NE(ra.as<wire::Ok>(), nullptr) << ra.message();
  EXPECT_EQ(ra.as<wire::Ok>()->epoch, e + 3);
  const Answer other_answer = c.acquire("db/primary", S3, W1);
  const auto* other = other_answer.as<wire::Deny>();
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->refusal, Refusal::reserved);
  const Answer g4_answer = c.acquire("db/primary", S4, W1);
  const auto* g4 = g4_answer.as<wire::Grant>();
  ASSERT_NE(g4, nullptr);
  EXPECT_EQ(g4->epoch, e + 3);

  // Unknown names: show says unknown_name.
  const Answer unknown_answer = c.show("no/such");
  const auto* unknown = unknown_answer.as<wire::Deny>();
  ASSERT_NE(unknown, nullptr);
  EXPECT_EQ(unknown->refusal, Refusal::unknown_name);

  // list pages through every name exactly once.
  for (int i = 0; i < 150; ++i)
    ASSERT_TRUE(is<wire::Grant>(c.acquire("bulk/" + std::to_string(i), S1, W1)));
  auto all = c.list_all();
  ASSERT_TRUE(all) << all.message();
  EXPECT_EQ(all->size(), 151u);
  std::set<std::string> seen;
  for (const auto& r : *all) seen.insert(r.name);
  EXPECT_EQ(seen.size(), 151u);
  EXPECT_EQ(seen.count("db/primary"), 1u);
  const Answer first_answer = c.list(0, 10);
  const auto* first = first_answer.as<wire::ListPage>();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->entries.size(), 10u);
  EXPECT_NE(first->next_cursor, 0u);
}

TEST_F(LockdTest, CommitAfterAcquiringExpiredIsRefused) {
  {
    // Within the acquiring TTL, commit grants at the epoch allocated by the acquire. (A TTL
    // no loaded machine can outlast between the acquire's answer and the commit.)
    start({"--acquiring-ttl-ms", "300000"});
    AdminClient c = client(W1);
    const Answer ok_answer = c.acquire("job/1", S1, W1, 0, true);
    const auto* ok = ok_answer.as<wire::Grant>();
    ASSERT_NE(ok, nullptr);
    EXPECT_EQ(ok->state, LockPhase::acquiring);
    const Answer cm = c.commit(name_id_of("job/1"), S1, ok->epoch, W1);
    ASSERT_NE(cm.as<wire::Grant>(), nullptr) << cm.message();
    EXPECT_EQ(cm.as<wire::Grant>()->state, LockPhase::held);
    EXPECT_EQ(cm.as<wire::Grant>()->epoch, ok->epoch);
    ASSERT_EQ(lockd_.terminate(), 0);
  }
  // With a 100 ms acquiring TTL, a commit 300 ms after the acquire's answer (so at least that
  // long after lockd set the deadline, however slow the machine) comes too late.
  start({"--acquiring-ttl-ms", "100"});
  AdminClient c = client(W1);
  const Answer g_answer = c.acquire("job/2", S1, W1, 0, true);
  const auto* g = g_answer.as<wire::Grant>();
  ASSERT_NE(g, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const Answer late = c.commit(name_id_of("job/2"), S1, g->epoch, W1);
  const auto* d = late.as<wire::Deny>();
  ASSERT_NE(d, nullptr) << late.message();
  // acquiring_expired if the commit races the expiry tick; once the tick reclaimed the record,
  // not_acquiring / unknown_name. Never a grant.
  EXPECT_TRUE(d->refusal == Refusal::acquiring_expired || d->refusal == Refusal::not_acquiring ||
              d->refusal == Refusal::unknown_name)
      << to_string(d->refusal);
  // The name is not held, and its burned epoch is never granted again.
  const Answer again_answer = c.acquire("job/2", S2, W1);
  const auto* again = again_answer.as<wire::Grant>();
  ASSERT_NE(again, nullptr);
  EXPECT_GT(again->epoch, g->epoch);
  lockd_.terminate();
  EXPECT_NE(lockd_.log().find("event=acquiring_timeout name=job/2"), std::string::npos) << lockd_.log();
}

TEST_F(LockdTest, BadDatagramsAreCountedNeverFatal) {
  start();
  const int fd = open_udp_socket_blocking(*SocketAddress::parse("127.0.0.1:0"));
  ASSERT_GE(fd, 0);
  std::mt19937 rng(1);
  auto send = [&](const std::vector<std::uint8_t>& b) {
    ::sendto(fd, b.data(), b.size(), 0, lockd_.address().sa(), lockd_.address().length);
  };
  send({});                                   // empty
  send(std::vector<std::uint8_t>(10, 0xAB));  // truncated
  std::vector<std::uint8_t> junk(1400);
  for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
  send(junk);  // bad magic
  // Well-formed but signed with another key: bad tag.
  wire::WireKey other;
  other.bytes.assign(32, 0x42);
  wire::Sender forger(W1, 1, other);
  wire::Datagram dg;
  ASSERT_TRUE(forger.seal(1, wire::Revoke{name_id_of("x")}, dg));
  send(std::vector<std::uint8_t>(dg.bytes.begin(), dg.bytes.begin() + dg.size));
  ::close(fd);

  AdminClient c = client(W1);
  ASSERT_TRUE(is<wire::Grant>(c.acquire("still/alive", S1, W1)));
  auto counters = c.counters();
  ASSERT_TRUE(counters) << counters.message();
  auto value = [&](const std::string& k) -> std::uint64_t {
    for (const auto& c2 : *counters)
      if (c2.key == k) return c2.value;
    return 0;
  };
  EXPECT_EQ(value("reject_bad_tag"), 1u);
  EXPECT_EQ(value("reject_bad_magic"), 1u);
  EXPECT_GE(value("reject_truncated"), 1u);  // the empty datagram may not reach user space
  EXPECT_LE(value("reject_truncated"), 2u);
  EXPECT_TRUE(lockd_.running());
}

// A supervisor stand-in for preemptible mode: sends worker heartbeats from its own socket and
// answers lockd's IsRunning questions.
class FakeSupervisor {
 public:
  /// `key`: the cluster key; the stand-in holds the worker key derived from it for `self`.
  FakeSupervisor(const SocketAddress& lockd, const wire::WireKey& key, WorkerId self)
      : lockd_(lockd),
        sender_(self, wire::seq_seed(), wire::derive_worker_key(key, self)),
        auth_(wire::derive_worker_key(key, self)) {
    fd_ = open_udp_socket_blocking(*SocketAddress::parse("127.0.0.1:0"));
  }
  ~FakeSupervisor() { ::close(fd_); }
  void send(std::uint64_t rid, const wire::Body& body) {
    wire::Datagram dg;
    ASSERT_TRUE(sender_.seal(rid, body, dg));
    ::sendto(fd_, dg.bytes.data(), dg.size, 0, lockd_.sa(), lockd_.length);
  }
  /// The next authentic message within `timeout_ms`, or nullopt.
  std::optional<wire::DecodeResult> receive(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return std::nullopt;
    std::uint8_t buf[2048];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return std::nullopt;
    auto d = wire::decode(std::span(buf, static_cast<std::size_t>(n)), &auth_);
    if (!d) return std::nullopt;
    return d;
  }

 private:
  SocketAddress lockd_;
  wire::Sender sender_;
  wire::Authenticator auth_;
  int fd_;
};

// A lease-mode lockd must not ack worker heartbeats: a preemptible supervisor would take the ack
// as "my names are kept by worker liveness" while they expire here by TTL (two holders). Its
// stats report the mode and TTL, which a supervisor checks at start-up.
TEST_F(LockdTest, LeaseModeRefusesWorkerHeartbeatsAndReportsItsMode) {
  start({"--ttl-ms", "4321"});
  FakeSupervisor sup(lockd_.address(), key_, W1);
  sup.send(7, wire::WorkerHeartbeat{W1, {}});
  auto a = sup.receive(2000);
  ASSERT_TRUE(a);
  const auto* e = std::get_if<wire::Error>(&a->body);
  ASSERT_NE(e, nullptr) << wire::to_string(wire::type_of(a->body));
  EXPECT_EQ(e->code, wire::ErrorCode::unsupported);
  EXPECT_NE(e->message.find("lease mode"), std::string::npos) << e->message;
  AdminClient c = client(W1);
  auto counters = c.counters();
  ASSERT_TRUE(counters) << counters.message();
  std::map<std::string, std::uint64_t> v;
  for (const auto& k : *counters) v[k.key] = k.value;
  EXPECT_EQ(v.at("mode_preemptible"), 0u);
  EXPECT_EQ(v.at("ttl_ms"), 4321u);
  EXPECT_EQ(v.at("unexpected_messages"), 1u);
}

// Retries reuse the request id (DESIGN.md "The wire protocol"): the same bytes again, or the
// same request under a new seq, get the first answer again and change nothing.
TEST_F(LockdTest, RetriesGetTheSameAnswerAndGrantOnce) {
  start();
  FakeSupervisor raw(lockd_.address(), key_, W1);
  raw.send(4242, wire::Revoke{name_id_of("retry/none")});  // an unknown name: refused
  auto first = raw.receive(2000);
  ASSERT_TRUE(first);
  ASSERT_NE(std::get_if<wire::Deny>(&first->body), nullptr);

  raw.send(77, wire::Acquire{"retry/a", S1, W1, 0, false});
  auto g1 = raw.receive(2000);
  ASSERT_TRUE(g1);
  const auto* grant1 = std::get_if<wire::Grant>(&g1->body);
  ASSERT_NE(grant1, nullptr);
  // The same request id with a new seq (a retry by a client that re-seals): the cached answer.
  raw.send(77, wire::Acquire{"retry/a", S1, W1, 0, false});
  auto g2 = raw.receive(2000);
  ASSERT_TRUE(g2);
  const auto* grant2 = std::get_if<wire::Grant>(&g2->body);
  ASSERT_NE(grant2, nullptr);
  EXPECT_EQ(*grant2, *grant1);
  EXPECT_EQ(g2->header.request_id, 77u);
  // A release retried after it was answered is not applied twice (a worker's key may release
  // only its own sandboxes' names; revoke needs an admin key).
  raw.send(78, wire::Release{name_id_of("retry/a"), S1, grant1->epoch});
  auto r1 = raw.receive(2000);
  ASSERT_TRUE(r1);
  ASSERT_NE(std::get_if<wire::Ok>(&r1->body), nullptr);
  raw.send(78, wire::Release{name_id_of("retry/a"), S1, grant1->epoch});
  auto r2 = raw.receive(2000);
  ASSERT_TRUE(r2);
  ASSERT_NE(std::get_if<wire::Ok>(&r2->body), nullptr);
  EXPECT_EQ(std::get<wire::Ok>(r2->body).epoch, std::get<wire::Ok>(r1->body).epoch);
  AdminClient c = client(W2);
  // Released once: the next holder gets the next epoch.
  const Answer next = c.acquire("retry/a", S2, W2);
  ASSERT_NE(next.as<wire::Grant>(), nullptr) << next.message();
  EXPECT_EQ(next.as<wire::Grant>()->epoch, grant1->epoch + 1);
}

// An acquire that arrives while lockd is stopped waits in the socket queue; the lease it
// competes with runs out during the stall. Served after the stall, it must find the name free
// (expiry first), not be refused `expired` because the expiry pass had not run yet.
TEST_F(LockdTest, AcquireQueuedBehindAStallMeetsTheExpiryThatFellDue) {
  start({"--ttl-ms", "300"});
  AdminClient c1 = client(W1);
  const Answer first = c1.acquire("stall/a", S1, W1);
  const auto* g1 = first.as<wire::Grant>();
  ASSERT_NE(g1, nullptr) << describe(first);
  ASSERT_EQ(::kill(lockd_.pid(), SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // twice the TTL, lockd stopped
  Answer second;
  std::atomic<bool> sent{false};
  std::thread t([&] {
    AdminClient c2(lockd_.address(), key_, W2, 5'000'000'000);
    sent = true;
    second = c2.acquire("stall/a", S2, W2);
  });
  while (!sent) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the request is queued
  ASSERT_EQ(::kill(lockd_.pid(), SIGCONT), 0);
  t.join();
  const auto* g2 = second.as<wire::Grant>();
  ASSERT_NE(g2, nullptr) << describe(second);
  EXPECT_EQ(g2->holder, S2);
  EXPECT_EQ(g2->epoch, g1->epoch + 1);
  lockd_.terminate();
  const std::string log = lockd_.log();
  const auto expire_at = log.find("event=expire name=stall/a");
  const auto grant_at = log.find("event=grant name=stall/a epoch=" + std::to_string(g1->epoch + 1));
  ASSERT_NE(expire_at, std::string::npos) << log;
  ASSERT_NE(grant_at, std::string::npos) << log;
  EXPECT_LT(expire_at, grant_at) << log;
}

TEST_F(LockdTest, PreemptibleModeLapsedWorkerAndNotRunning) {
  start({"--mode", "preemptible", "--worker-ttl-ms", "300"});
  AdminClient c = client(W2);
  // 1-phase acquire is not available in preemptible mode.
  const Answer wrong_answer = c.acquire("p/a", S1, W1);
  const auto* wrong = wrong_answer.as<wire::Deny>();
  ASSERT_NE(wrong, nullptr);
  EXPECT_EQ(wrong->refusal, Refusal::wrong_mode);

  // Lapsed worker: W1's name becomes preemptible once W1 stops heartbeating.
  const Answer g_answer = c.acquire("p/a", S1, W1, 0, true);
  const auto* g = g_answer.as<wire::Grant>();
  ASSERT_NE(g, nullptr);
  ASSERT_TRUE(is<wire::Grant>(c.commit(name_id_of("p/a"), S1, g->epoch, W1)));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const Answer pre = c.acquire("p/a", S2, W2, 0, true);
  const auto* g2 = pre.as<wire::Grant>();
  ASSERT_NE(g2, nullptr) << pre.message() << " " << describe(pre);
  EXPECT_GT(g2->epoch, g->epoch);

  // Live worker: lockd asks it; "not running" → preempted.
  FakeSupervisor sup(lockd_.address(), key_, W1);
  sup.send(1, wire::WorkerHeartbeat{W1, {}});
  auto wack = sup.receive(2000);
  ASSERT_TRUE(wack);
  ASSERT_NE(std::get_if<wire::WorkerAck>(&wack->body), nullptr);
  const Answer g3_answer = c.acquire("p/b", S3, W1, 0, true);
  const auto* g3 = g3_answer.as<wire::Grant>();
  ASSERT_NE(g3, nullptr);
  ASSERT_TRUE(is<wire::Grant>(c.commit(name_id_of("p/b"), S3, g3->epoch, W1)));
  sup.send(2, wire::WorkerHeartbeat{W1, {}});
  ASSERT_TRUE(sup.receive(2000));
  const Answer held_answer = c.acquire("p/b", S4, W2, 0, true);
  const auto* held = held_answer.as<wire::Deny>();
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->refusal, Refusal::held);
  auto q = sup.receive(2000);
  ASSERT_TRUE(q) << "lockd did not ask the live worker";
  const auto* ask = std::get_if<wire::IsRunning>(&q->body);
  ASSERT_NE(ask, nullptr);
  EXPECT_EQ(ask->name_id, name_id_of("p/b"));
  EXPECT_EQ(ask->sandbox, S3);
  EXPECT_EQ(ask->epoch, g3->epoch);
  sup.send(q->header.request_id, wire::RunningAnswer{ask->name_id, ask->sandbox, ask->epoch, false});
  const wire::Grant* g4 = nullptr;
  Answer retry;
  for (int i = 0; i < 50 && g4 == nullptr; ++i) {
    retry = c.acquire("p/b", S4, W2, 0, true);
    g4 = retry.as<wire::Grant>();
    if (g4 == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(g4, nullptr);
  EXPECT_GT(g4->epoch, g3->epoch);
  lockd_.terminate();
  const std::string log = lockd_.log();
  EXPECT_NE(log.find("event=preempt name=p/a"), std::string::npos) << log;
  EXPECT_NE(log.find("reason=worker_lapsed"), std::string::npos) << log;
  EXPECT_NE(log.find("event=preempt name=p/b"), std::string::npos) << log;
  EXPECT_NE(log.find("reason=not_running"), std::string::npos) << log;
}

}  // namespace
}  // namespace leasehold::lockd
