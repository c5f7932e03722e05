// The FIFO of waiters (wire::Wait) in LockService, driven as a core (service_core_fakes.hpp):
// order, new epochs, durability before the pushed grant, lapsed and departed waiters, the
// hand-over on release, expiry, lock-delay and a confirmed revoke, and the bounds.
#include "service_core_fakes.hpp"

#include <gtest/gtest.h>

namespace leasehold::lockd {
namespace {

using test::CoreRig;
using test::sandbox;

constexpr std::int64_t kT0 = 1'000'000'000'000;
constexpr std::int64_t kMs = 1'000'000;

/// Another party speaking to the rig's lockd: a worker with its derived key, or root with the
/// cluster key.
struct Peer {
  Peer(WorkerId who, wire::WireKey with, std::uint16_t port)
      : id(who), key(std::move(with)), client(who, 1, key), auth(key), address(SocketAddress::loopback_v4(port)) {}
  static Peer worker(WorkerId id, std::uint16_t port) {
    return Peer(id, wire::derive_worker_key(test::cluster_key(), id), port);
  }
  std::uint64_t send(CoreRig& rig, const wire::Body& body, std::int64_t now_ns) {
    wire::Datagram dg;
    const std::uint64_t rid = next_rid++;
    EXPECT_TRUE(client.seal(rid, body, dg));
    const auto v = dg.view();
    rig.service->on_datagram(std::vector<std::uint8_t>(v.begin(), v.end()), address, now_ns);
    return rid;
  }
  std::uint64_t wait(CoreRig& rig, const std::string& name, SandboxId sb, std::int64_t now_ns, std::uint32_t ttl_ms = 0) {
    return send(rig, wire::Wait{name, sb, id, ttl_ms}, now_ns);
  }
  /// The answers lockd sent to this peer since the last call, with their request ids.
  std::vector<std::pair<std::uint64_t, wire::Body>> answers(CoreRig& rig) {
    std::vector<std::pair<std::uint64_t, wire::Body>> out;
    for (; seen < rig.net.sent.size(); ++seen) {
      if (!(rig.net.sent[seen].to == address)) continue;
      wire::DecodeResult r = wire::decode(rig.net.sent[seen].bytes, &auth);
      EXPECT_TRUE(r) << r.detail;
      if (r) out.emplace_back(r.header.request_id, r.body);
    }
    return out;
  }
  /// Acquires `name` for `sb` (lease mode, 1-phase) and returns the grant, made durable.
  wire::Grant hold(CoreRig& rig, const std::string& name, SandboxId sb, std::int64_t now_ns, std::uint32_t ttl_ms = 0);
  /// Joins the FIFO of `name` with `sb`; the Queued answer is read and dropped.
  void queue(CoreRig& rig, const std::string& name, SandboxId sb, std::int64_t now_ns, std::uint32_t ttl_ms = 0) {
    wait(rig, name, sb, now_ns, ttl_ms);
    rig.settle(now_ns);
    (void)answers(rig);
  }
  /// The one answer since the last call (a test failure otherwise).
  wire::Body answer(CoreRig& rig) {
    auto a = answers(rig);
    EXPECT_EQ(a.size(), 1u);
    return a.empty() ? wire::Body{wire::Error{}} : a.back().second;
  }

  WorkerId id;
  wire::WireKey key;
  wire::Sender client;
  wire::Authenticator auth;
  SocketAddress address;
  std::uint64_t next_rid = 1;
  std::size_t seen = 0;
};

const wire::Grant& as_grant(const wire::Body& b) {
  static const wire::Grant none{};
  const auto* g = std::get_if<wire::Grant>(&b);
  EXPECT_NE(g, nullptr) << "not a grant: " << wire::to_string(wire::type_of(b));
  return g != nullptr ? *g : none;
}
wire::Grant Peer::hold(CoreRig& rig, const std::string& name, SandboxId sb, std::int64_t now_ns, std::uint32_t ttl_ms) {
  send(rig, wire::Acquire{name, sb, id, ttl_ms, false}, now_ns);
  rig.settle(now_ns);
  return as_grant(answer(rig));
}

const wire::Queued& as_queued(const wire::Body& b) {
  static const wire::Queued none{};
  const auto* q = std::get_if<wire::Queued>(&b);
  EXPECT_NE(q, nullptr) << "not queued: " << wire::to_string(wire::type_of(b));
  return q != nullptr ? *q : none;
}

// A holds; B and C wait and are told their places; each release hands the name to the next
// waiter at a new epoch, pushed as the answer to its latest Wait, and only once durable.
TEST(Waiters, AreServedInOrderEachAtANewEpochOnceDurable) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002),
       c = Peer::worker(WorkerId{0xc, 1}, 41003);
  const wire::Grant ga = a.hold(rig, "res", sandbox(1), kT0, 0);
  ASSERT_EQ(ga.epoch, 1u);

  b.wait(rig, "res", sandbox(2), kT0 + kMs);
  rig.settle(kT0 + kMs);
  const wire::Queued qb = as_queued(b.answer(rig));
  EXPECT_EQ(qb.position, 1u);
  EXPECT_EQ(qb.waiters, 1u);
  EXPECT_EQ(qb.holder, sandbox(1));
  EXPECT_EQ(qb.state, LockPhase::held);
  c.wait(rig, "res", sandbox(3), kT0 + 2 * kMs);
  rig.settle(kT0 + 2 * kMs);
  EXPECT_EQ(as_queued(c.answer(rig)).position, 2u);
  // B asks again (its heartbeat of the place): still first, under its new request id.
  const std::uint64_t b_latest = b.wait(rig, "res", sandbox(2), kT0 + 3 * kMs);
  rig.settle(kT0 + 3 * kMs);
  EXPECT_EQ(as_queued(b.answer(rig)).position, 1u);

  // A releases: B is granted (2-phase, epoch 2); the push waits for the grant's batch.
  a.send(rig, wire::Release{ga.name_id, sandbox(1), 1}, kT0 + 4 * kMs);
  EXPECT_TRUE(b.answers(rig).empty());
  rig.service->tick(kT0 + 4 * kMs);
  EXPECT_TRUE(b.answers(rig).empty()) << "pushed before the grant was durable";
  rig.settle(kT0 + 4 * kMs);
  auto pushed = b.answers(rig);
  ASSERT_EQ(pushed.size(), 1u);
  EXPECT_EQ(pushed[0].first, b_latest);
  const wire::Grant gb = as_grant(pushed[0].second);
  EXPECT_EQ(gb.epoch, 2u);
  EXPECT_EQ(gb.holder, sandbox(2));
  EXPECT_EQ(gb.worker, b.id);
  EXPECT_EQ(gb.state, LockPhase::acquiring);
  EXPECT_TRUE(c.answers(rig).empty());

  // B commits, runs, releases: C is granted at epoch 3.
  b.send(rig, wire::Commit{gb.name_id, sandbox(2), gb.epoch, b.id}, kT0 + 5 * kMs);
  rig.settle(kT0 + 5 * kMs);
  EXPECT_EQ(as_grant(b.answer(rig)).state, LockPhase::held);
  b.send(rig, wire::Release{gb.name_id, sandbox(2), gb.epoch}, kT0 + 6 * kMs);
  rig.settle(kT0 + 6 * kMs);
  const wire::Grant gc = as_grant(c.answer(rig));
  EXPECT_EQ(gc.epoch, 3u);
  EXPECT_EQ(gc.holder, sandbox(3));
  const ServiceCounters& n = rig.service->counters();
  EXPECT_EQ(n.waits_queued, 2u);
  EXPECT_EQ(n.waiters_granted, 2u);
}

// A waiter whose worker stops re-sending its Wait lapses and is never granted; the next one is.
TEST(Waiters, AWaiterThatStopsAskingIsSkipped) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002),
       c = Peer::worker(WorkerId{0xc, 1}, 41003);
  const wire::Grant ga = a.hold(rig, "res", sandbox(1), kT0, 0);
  b.wait(rig, "res", sandbox(2), kT0, 100);     // its place is kept 100 ms
  c.wait(rig, "res", sandbox(3), kT0, 10'000);
  rig.settle(kT0);
  (void)b.answers(rig);
  (void)c.answers(rig);
  rig.settle(kT0 + 200 * kMs);  // B's worker went silent
  a.send(rig, wire::Release{ga.name_id, sandbox(1), 1}, kT0 + 200 * kMs);
  rig.settle(kT0 + 200 * kMs);
  EXPECT_TRUE(b.answers(rig).empty());
  EXPECT_EQ(as_grant(c.answer(rig)).holder, sandbox(3));
  EXPECT_EQ(rig.service->counters().waiters_lapsed, 1u);
  EXPECT_EQ(rig.service->table().state(ga.name_id).owner, sandbox(3));
}

// An expired lease hands the name over at the tick that expires it; with a lock-delay, only
// once the lock-delay ends (the table does not report that end: the FIFO's wake-up does).
TEST(Waiters, AnExpiryHandsOverAfterTheLockDelay) {
  LockdConfig cfg;
  cfg.lock_delay_ms = 500;
  CoreRig rig(kT0, {}, 1, cfg);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002);
  const wire::Grant ga = a.hold(rig, "res", sandbox(1), kT0, 1'000);
  b.queue(rig, "res", sandbox(2), kT0, 60'000);
  rig.settle(kT0 + 1'100 * kMs);  // expired, in its lock-delay until 1,500 ms
  EXPECT_TRUE(b.answers(rig).empty());
  EXPECT_EQ(rig.service->table().state(ga.name_id).phase, LockPhase::free);
  EXPECT_LE(rig.service->tick(kT0 + 1'100 * kMs), kT0 + 1'500 * kMs) << "no wake-up at the lock-delay's end";
  rig.settle(kT0 + 1'501 * kMs);
  const wire::Grant gb = as_grant(b.answer(rig));
  EXPECT_EQ(gb.epoch, 2u);
  EXPECT_EQ(gb.holder, sandbox(2));
}

// With waiters queued, a plain acquire (or a Wait from a newcomer) never takes the name first.
TEST(Waiters, NobodyJumpsTheQueue) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002),
       d = Peer::worker(WorkerId{0xd, 1}, 41004);
  const wire::Grant ga = a.hold(rig, "res", sandbox(1), kT0, 0);
  b.queue(rig, "res", sandbox(2), kT0);
  a.send(rig, wire::Release{ga.name_id, sandbox(1), 1}, kT0 + kMs);
  d.send(rig, wire::Acquire{"res", sandbox(4), d.id, 0, false}, kT0 + kMs);
  rig.settle(kT0 + kMs);
  const wire::Body to_d = d.answer(rig);
  const auto* refused = std::get_if<wire::Deny>(&to_d);
  ASSERT_NE(refused, nullptr);
  EXPECT_EQ(refused->refusal, Refusal::acquiring);
  EXPECT_EQ(refused->holder, sandbox(2));
  EXPECT_EQ(as_grant(b.answer(rig)).holder, sandbox(2));
}

// The pushed grant may be lost: the waiter's next Wait is answered with the same grant.
TEST(Waiters, ALostPushIsAnsweredByTheNextWait) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002);
  const wire::Grant ga = a.hold(rig, "res", sandbox(1), kT0, 0);
  b.queue(rig, "res", sandbox(2), kT0);
  a.send(rig, wire::Release{ga.name_id, sandbox(1), 1}, kT0 + kMs);
  rig.settle(kT0 + kMs);
  const wire::Grant pushed = as_grant(b.answer(rig));  // say it was lost on the way
  b.wait(rig, "res", sandbox(2), kT0 + 2 * kMs);
  rig.settle(kT0 + 2 * kMs);
  EXPECT_EQ(as_grant(b.answer(rig)).epoch, pushed.epoch);
  EXPECT_EQ(rig.service->counters().grants, 2u);  // A's and B's: nothing granted twice
}

// A waiter leaves with a Release of epoch 0; only its own worker can take it out, or take its
// place by naming its sandbox.
TEST(Waiters, OnlyTheWaitersWorkerCanMoveIt) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002),
       c = Peer::worker(WorkerId{0xc, 1}, 41003);
  const wire::Grant ga = a.hold(rig, "res", sandbox(1), kT0, 0);
  b.queue(rig, "res", sandbox(2), kT0);
  c.wait(rig, "res", sandbox(2), kT0 + kMs);  // B's sandbox id, from C's worker
  c.send(rig, wire::Release{ga.name_id, sandbox(2), 0}, kT0 + kMs);
  rig.settle(kT0 + kMs);
  auto got = c.answers(rig);
  ASSERT_EQ(got.size(), 2u);
  for (auto& [rid, body] : got) {
    const auto* d = std::get_if<wire::Deny>(&body);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->refusal, Refusal::forbidden);
  }
  EXPECT_EQ(rig.service->counters().waits_queued, 1u);
  // B leaves: the release of A's grant then hands the name to nobody.
  // (Below, once more with B granted: C cannot give B's grant back either.)
  b.send(rig, wire::Release{ga.name_id, sandbox(2), 0}, kT0 + 2 * kMs);
  rig.settle(kT0 + 2 * kMs);
  EXPECT_TRUE(std::holds_alternative<wire::Ok>(b.answer(rig)));
  a.send(rig, wire::Release{ga.name_id, sandbox(1), 1}, kT0 + 3 * kMs);
  rig.settle(kT0 + 3 * kMs);
  EXPECT_TRUE(b.answers(rig).empty());
  EXPECT_EQ(rig.service->table().state(ga.name_id).phase, LockPhase::free);
  EXPECT_EQ(rig.service->counters().waiters_left, 1u);

  // B waits again and is granted (Acquiring, bound to B): C's leave for B's sandbox is refused.
  (void)a.answers(rig);
  a.send(rig, wire::Acquire{"res", sandbox(5), a.id, 0, false}, kT0 + 4 * kMs);
  rig.settle(kT0 + 4 * kMs);
  const wire::Grant again = as_grant(a.answer(rig));
  b.queue(rig, "res", sandbox(6), kT0 + 5 * kMs);
  a.send(rig, wire::Release{again.name_id, sandbox(5), again.epoch}, kT0 + 6 * kMs);
  rig.settle(kT0 + 6 * kMs);
  EXPECT_EQ(as_grant(b.answer(rig)).state, LockPhase::acquiring);
  c.send(rig, wire::Release{again.name_id, sandbox(6), 0}, kT0 + 7 * kMs);
  rig.settle(kT0 + 7 * kMs);
  const wire::Body foreign = c.answer(rig);
  const auto* d = std::get_if<wire::Deny>(&foreign);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->refusal, Refusal::forbidden);
  EXPECT_EQ(rig.service->table().state(again.name_id).owner, sandbox(6));
}

// A revoked name goes to the first waiter only once the revoked holder's kill is confirmed.
TEST(Waiters, ARevokeHandsOverOnceTheKillIsConfirmed) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002);
  wire::WireKey root_key = test::cluster_key();  // the cluster key itself (wire/auth.hpp)
  root_key.key_id |= wire::kAdminKeyIdBit;
  Peer root(WorkerId{0x1d, 1}, root_key, 41009);
  const wire::Grant ga = a.hold(rig, "res", sandbox(1), kT0, 10'000);
  b.queue(rig, "res", sandbox(2), kT0);
  root.send(rig, wire::Revoke{ga.name_id, ga.epoch, false}, kT0 + kMs);
  rig.settle(kT0 + kMs);
  EXPECT_TRUE(std::holds_alternative<wire::Ok>(root.answer(rig)));
  EXPECT_TRUE(b.answers(rig).empty()) << "granted while the revoked holder may still run";
  a.send(rig, wire::KillConfirmed{ga.name_id, sandbox(1), ga.epoch}, kT0 + 2 * kMs);
  rig.settle(kT0 + 2 * kMs);
  const wire::Grant gb = as_grant(b.answer(rig));
  EXPECT_EQ(gb.epoch, 2u);  // the revoke's fresh epoch
  EXPECT_EQ(gb.holder, sandbox(2));
}

// At the per-name bound a Wait is refused, naming it; a place that lapsed is made room of.
TEST(Waiters, AFullQueueRefusesWithItsBound) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002);
  a.send(rig, wire::Acquire{"res", sandbox(1), a.id, 60'000, false}, kT0);
  rig.settle(kT0);
  (void)a.answers(rig);
  for (std::uint64_t i = 0; i < kWaitersPerNameMax; ++i) b.wait(rig, "res", sandbox(100 + i), kT0, i == 0 ? 50 : 0);
  rig.settle(kT0);
  (void)b.answers(rig);
  b.wait(rig, "res", sandbox(99), kT0 + kMs);
  rig.settle(kT0 + kMs);
  const wire::Body full = b.answer(rig);
  const auto* e = std::get_if<wire::Error>(&full);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->code, wire::ErrorCode::overloaded);
  EXPECT_NE(e->message.find("queue for res is full (1024 waiters)"), std::string::npos) << e->message;
  // The first place lapses after 50 ms: a Wait then gets in, last.
  b.wait(rig, "res", sandbox(99), kT0 + 60 * kMs);
  rig.settle(kT0 + 60 * kMs);
  EXPECT_EQ(as_queued(b.answer(rig)).position, kWaitersPerNameMax);
  EXPECT_EQ(rig.service->counters().waits_refused_full, 1u);
}

// One worker's key cannot take every place: past kWaitersPerWorkerMax its Waits are refused,
// naming the bound, and another worker still gets in.
TEST(Waiters, OneWorkerCannotTakeEveryPlace) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002),
       c = Peer::worker(WorkerId{0xc, 1}, 41003);
  const std::size_t names = kWaitersPerWorkerMax / kWaitersPerNameMax + 1;
  for (std::size_t n = 0; n < names; ++n)
    a.send(rig, wire::Acquire{"res" + std::to_string(n), sandbox(1 + n), a.id, 60'000, false}, kT0);
  rig.settle(kT0);
  (void)a.answers(rig);
  std::uint64_t sb = 1000;
  for (std::size_t i = 0; i < kWaitersPerWorkerMax; ++i) b.wait(rig, "res" + std::to_string(i / kWaitersPerNameMax), sandbox(sb++), kT0);
  rig.settle(kT0);
  (void)b.answers(rig);
  b.wait(rig, "res" + std::to_string(names - 1), sandbox(sb++), kT0 + kMs);
  rig.settle(kT0 + kMs);
  const wire::Body refused = b.answer(rig);
  const auto* e = std::get_if<wire::Error>(&refused);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->code, wire::ErrorCode::overloaded);
  EXPECT_NE(e->message.find("has 4096 waiters, its bound"), std::string::npos) << e->message;
  c.wait(rig, "res" + std::to_string(names - 1), sandbox(sb++), kT0 + kMs);
  rig.settle(kT0 + kMs);
  EXPECT_EQ(as_queued(c.answer(rig)).position, 1u);
}

// Places that lapsed but were not dropped yet (they never reached their FIFO's head) do not
// count against the worker's bound: a Wait at the bound drops them first.
TEST(Waiters, LapsedPlacesDoNotCountAgainstTheWorkersBound) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002),
       c = Peer::worker(WorkerId{0xc, 1}, 41003);
  const std::size_t names = kWaitersPerWorkerMax / kWaitersPerNameMax + 1;  // room behind C in each line
  for (std::size_t n = 0; n < names + 1; ++n)
    a.send(rig, wire::Acquire{"res" + std::to_string(n), sandbox(1 + n), a.id, 60'000, false}, kT0);
  rig.settle(kT0);
  (void)a.answers(rig);
  // C waits first in every line (kept 60 s); behind it, B takes its whole bound, kept 100 ms.
  std::uint64_t sb = 1000;
  for (std::size_t n = 0; n < names; ++n) c.wait(rig, "res" + std::to_string(n), sandbox(sb++), kT0, 60'000);
  for (std::size_t i = 0; i < kWaitersPerWorkerMax; ++i)
    b.wait(rig, "res" + std::to_string(i % names), sandbox(sb++), kT0, 100);
  rig.settle(kT0);
  (void)b.answers(rig);
  (void)c.answers(rig);
  // 200 ms later every one of B's places has lapsed, none at a head: a new Wait is placed.
  b.wait(rig, "res" + std::to_string(names), sandbox(sb++), kT0 + 200 * kMs, 10'000);
  rig.settle(kT0 + 200 * kMs);
  EXPECT_EQ(as_queued(b.answer(rig)).position, 1u);
  EXPECT_EQ(rig.service->counters().waiters_lapsed, kWaitersPerWorkerMax);
}

// A heartbeat entry at epoch 0 renews a waiter's place as a Wait would, answered `queued` with
// the time it is now kept; only from the waiter's own worker, never for a lapsed place, and a
// waiter already granted (its push lost) is answered `lost`, so its supervisor sends a Wait.
TEST(Waiters, AHeartbeatEntryAtEpochZeroRenewsAPlaceOfItsOwnWorkerOnly) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002),
       c = Peer::worker(WorkerId{0xc, 1}, 41003);
  const wire::Grant ga = a.hold(rig, "res", sandbox(1), kT0, 0);
  b.queue(rig, "res", sandbox(2), kT0, 100);  // kept 100 ms without a renewal
  c.queue(rig, "res", sandbox(3), kT0, 100);
  auto beat = [&](Peer& p, SandboxId sb, std::int64_t at) {
    wire::Heartbeat h;
    h.entries.push_back(wire::HeartbeatEntry{ga.name_id, sb, 0});
    p.send(rig, h, at);
    rig.settle(at);
    const wire::Body got = p.answer(rig);
    const auto* ack = std::get_if<wire::HeartbeatAck>(&got);
    EXPECT_NE(ack, nullptr);
    return ack != nullptr && ack->entries.size() == 1 ? ack->entries[0] : wire::HeartbeatAckEntry{};
  };
  // B renews within its 100 ms, twice, past the first 100 ms; C never does.
  for (const std::int64_t at : {kT0 + 80 * kMs, kT0 + 160 * kMs}) {
    const wire::HeartbeatAckEntry e = beat(b, sandbox(2), at);
    EXPECT_EQ(e.status, RefreshStatus::queued);
    EXPECT_EQ(e.holder, sandbox(1));
    EXPECT_EQ(e.epoch, ga.epoch);
    EXPECT_EQ(e.ttl_left_ms, rig.cfg.ttl_ms) << "renewed by lockd's TTL, as a lease";
  }
  // Worker A's key names B's waiter: not renewed, and told nothing of the place.
  EXPECT_EQ(beat(a, sandbox(2), kT0 + 170 * kMs).status, RefreshStatus::lost);
  // C's place lapsed at +100 ms: a renewal does not revive it.
  EXPECT_EQ(beat(c, sandbox(3), kT0 + 180 * kMs).status, RefreshStatus::lost);
  EXPECT_EQ(rig.service->counters().waiter_renewals, 4u);
  // A releases at +190 ms: B, kept by its heartbeats, is granted; C's place is gone.
  a.send(rig, wire::Release{ga.name_id, sandbox(1), ga.epoch}, kT0 + 190 * kMs);
  rig.settle(kT0 + 190 * kMs);
  const wire::Grant gb = as_grant(b.answer(rig));
  EXPECT_EQ(gb.holder, sandbox(2));
  EXPECT_EQ(gb.epoch, ga.epoch + 1);
  EXPECT_TRUE(c.answers(rig).empty());
  // Granted, B is no longer in line: its next renewal is `lost` with itself as the holder.
  const wire::HeartbeatAckEntry after = beat(b, sandbox(2), kT0 + 195 * kMs);
  EXPECT_EQ(after.status, RefreshStatus::lost);
  EXPECT_EQ(after.holder, sandbox(2));
  EXPECT_EQ(after.epoch, gb.epoch);
}

// A Wait from a sandbox whose place lapsed (not yet dropped: it was not at the head) joins at
// the back, not where it stood.
TEST(Waiters, AWaitAfterALapsedPlaceJoinsAtTheBack) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002),
       c = Peer::worker(WorkerId{0xc, 1}, 41003), d = Peer::worker(WorkerId{0xd, 1}, 41004);
  a.hold(rig, "res", sandbox(1), kT0, 0);
  b.queue(rig, "res", sandbox(2), kT0, 10'000);
  c.queue(rig, "res", sandbox(3), kT0, 100);
  d.queue(rig, "res", sandbox(4), kT0, 10'000);
  c.wait(rig, "res", sandbox(3), kT0 + 200 * kMs, 100);
  rig.settle(kT0 + 200 * kMs);
  const wire::Queued q = as_queued(c.answer(rig));
  EXPECT_EQ(q.position, 3u);
  EXPECT_EQ(q.waiters, 3u);
  EXPECT_EQ(rig.service->counters().waiters_lapsed, 1u);
}

// Show with waiters_from lists the FIFO in order (paged from an index), List with `waiters`
// counts it per name; without them the answers are as before (no waiter section).
TEST(Waiters, ShowAndListReportTheFifo) {
  CoreRig rig(kT0);
  Peer a = Peer::worker(WorkerId{0xa, 1}, 41001), b = Peer::worker(WorkerId{0xb, 1}, 41002),
       c = Peer::worker(WorkerId{0xc, 1}, 41003);
  wire::WireKey root_key = test::cluster_key();
  root_key.key_id |= wire::kAdminKeyIdBit;
  Peer root(WorkerId{0x1d, 1}, root_key, 41009);
  const wire::Grant ga = a.hold(rig, "res", sandbox(1), kT0, 0);
  a.hold(rig, "other", sandbox(5), kT0, 0);
  b.queue(rig, "res", sandbox(2), kT0, 500);
  c.queue(rig, "res", sandbox(3), kT0 + 100 * kMs, 500);

  root.send(rig, wire::Show{"res", NameId{}, 0}, kT0 + 200 * kMs);
  rig.settle(kT0 + 200 * kMs);
  const wire::Body shown = root.answer(rig);
  const auto* info = std::get_if<wire::NameInfo>(&shown);
  ASSERT_NE(info, nullptr);
  EXPECT_TRUE(info->with_waiters);
  EXPECT_EQ(info->record.holder, sandbox(1));
  EXPECT_EQ(info->record.waiters, 2u);
  ASSERT_EQ(info->waiters.size(), 2u);
  EXPECT_EQ(info->waiters[0], (wire::WaiterRecord{sandbox(2), b.id, 300}));
  EXPECT_EQ(info->waiters[1], (wire::WaiterRecord{sandbox(3), c.id, 400}));

  root.send(rig, wire::Show{"res", NameId{}, 1}, kT0 + 200 * kMs);
  rig.settle(kT0 + 200 * kMs);
  const wire::Body paged = root.answer(rig);
  const auto* page = std::get_if<wire::NameInfo>(&paged);
  ASSERT_NE(page, nullptr);
  EXPECT_EQ(page->waiters_from, 1u);
  ASSERT_EQ(page->waiters.size(), 1u);
  EXPECT_EQ(page->waiters[0].sandbox, sandbox(3));

  root.send(rig, wire::Show{"res", NameId{}, std::nullopt}, kT0 + 200 * kMs);
  rig.settle(kT0 + 200 * kMs);
  const wire::Body unasked = root.answer(rig);
  const auto* plain = std::get_if<wire::NameInfo>(&unasked);
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(plain->with_waiters);
  EXPECT_EQ(plain->record.waiters, 0u);
  EXPECT_TRUE(plain->waiters.empty());

  for (const bool counted : {true, false}) {
    root.send(rig, wire::List{0, 0, counted}, kT0 + 200 * kMs);
    rig.settle(kT0 + 200 * kMs);
    const wire::Body listed = root.answer(rig);
    const auto* list = std::get_if<wire::ListPage>(&listed);
    ASSERT_NE(list, nullptr);
    EXPECT_EQ(list->with_waiters, counted);
    ASSERT_EQ(list->entries.size(), 2u);
    for (const wire::NameRecord& r : list->entries)
      EXPECT_EQ(r.waiters, counted && r.name_id == ga.name_id ? 2u : 0u) << r.name;
  }
}

}  // namespace
}  // namespace leasehold::lockd
