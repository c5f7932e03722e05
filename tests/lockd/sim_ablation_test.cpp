// The simulator's lockd-side ablations (lockd/CMakeLists.txt, leasehold_lockd_sim_ablate_*):
// each scenario is compiled three times, against the production core (leasehold_lockd) and
// against each ablated build. The scenario shows the bug in the build that reintroduces it and
// not in the others, so an ablation switch that stops reintroducing its bug fails here.
#include "service_core_fakes.hpp"

#include <gtest/gtest.h>

#include <optional>

#ifndef LEASEHOLD_SIM_ABLATE_REFRESH_OWNER
#define LEASEHOLD_SIM_ABLATE_REFRESH_OWNER 0
#endif
#ifndef LEASEHOLD_SIM_ABLATE_ACQUIRING_EXPIRY
#define LEASEHOLD_SIM_ABLATE_ACQUIRING_EXPIRY 0
#endif
#ifndef LEASEHOLD_SIM_ABLATE_PREEMPT_LIVE_WORKER
#define LEASEHOLD_SIM_ABLATE_PREEMPT_LIVE_WORKER 0
#endif
#ifndef LEASEHOLD_SIM_ABLATE_ANSWER_BEFORE_DURABLE
#define LEASEHOLD_SIM_ABLATE_ANSWER_BEFORE_DURABLE 0
#endif

namespace leasehold::lockd {
namespace {

constexpr std::int64_t kT0 = 1'000'000'000'000;
constexpr std::int64_t kMs = kNsPerMs;

TEST(SimAblation, TheLinkedLeaseTableIsTheAblatedOne) {
  const std::string_view want = LEASEHOLD_SIM_ABLATE_REFRESH_OWNER         ? "refresh_owner"
                                : LEASEHOLD_SIM_ABLATE_ACQUIRING_EXPIRY     ? "acquiring_expiry"
                                : LEASEHOLD_SIM_ABLATE_PREEMPT_LIVE_WORKER ? "preempt_live_worker"
                                : LEASEHOLD_SIM_ABLATE_ANSWER_BEFORE_DURABLE ? "answer_before_durable"
                                                                              : "";
  EXPECT_EQ(LeaseTable::sim_ablation(), want);
}

// Refresh without the owner check: a heartbeat for another sandbox's lease (another epoch)
// extends it, so a name whose holder is dead stays held as long as anybody refreshes it.
TEST(SimAblation, RefreshForAnotherSandboxesLeaseExtendsItOnlyWhenAblated) {
  test::CoreRig rig(kT0);
  const SandboxId holder = test::sandbox(1);
  rig.deliver(rig.acquire("jobs/a", holder, 1'000), kT0);  // a 1 s lease
  rig.settle(kT0);
  ASSERT_EQ(rig.net.sent.size(), 1u);
  const Epoch epoch = std::get<wire::Grant>(rig.decode(rig.net.sent[0].bytes)).epoch;

  // 900 ms later a heartbeat names the lease with another sandbox and another epoch.
  wire::Heartbeat hb;
  hb.entries.push_back(wire::HeartbeatEntry{name_id_of("jobs/a"), test::sandbox(2), epoch + 7});
  rig.deliver(rig.seal(hb), kT0 + 900 * kMs);
  rig.settle(kT0 + 900 * kMs);
  ASSERT_EQ(rig.net.sent.size(), 2u);
  const auto ack = std::get<wire::HeartbeatAck>(rig.decode(rig.net.sent[1].bytes));
  ASSERT_EQ(ack.entries.size(), 1u);

  // At 1.5 s the holder's own lease has run out (it never refreshed).
  const std::int64_t later = kT0 + 1'500 * kMs;
  rig.service->tick(later);
  const LockState s = rig.service->table().state(name_id_of("jobs/a"));
  if (LEASEHOLD_SIM_ABLATE_REFRESH_OWNER) {
    EXPECT_EQ(ack.entries[0].status, RefreshStatus::refreshed);
    EXPECT_EQ(s.phase, LockPhase::held);  // kept alive by a stranger's refresh
    EXPECT_EQ(s.owner, holder);
  } else {
    EXPECT_EQ(ack.entries[0].status, RefreshStatus::lost);
    EXPECT_EQ(ack.entries[0].holder, holder);
    EXPECT_NE(s.phase, LockPhase::held);  // expired at 1 s
    EXPECT_EQ(rig.service->counters().expiries, 1u);
  }
}

// Expiry without the acquiring check: the lease's TTL runs from the 2-phase acquire, while the
// sandbox is still being scheduled. A holder that committed at 4 s with a 10 s TTL has its
// kill-switch measured from 4 s; the ablated lockd expires the name at 10 s and grants it to a
// second sandbox while the first may still run.
TEST(SimAblation, LeaseCountsFromTheCommitUnlessAblated) {
  LeaseConfig c;
  c.default_ttl_ns = 10'000 * kMs;
  c.max_ttl_ns = 10'000 * kMs;
  c.acquiring_ttl_ns = 5'000 * kMs;
  LeaseTable t(c);
  const WorkerId w{0x77, 1};
  const Outcome a = t.acquire_2pc("jobs/a", test::sandbox(1), kT0, w);
  ASSERT_EQ(a.refusal, Refusal::none);
  const Outcome held = t.commit(a.name, test::sandbox(1), a.token.epoch, w, kT0 + 4'000 * kMs);
  ASSERT_EQ(held.refusal, Refusal::none);
  std::vector<Expiry> expired;
  t.advance(kT0 + 11'000 * kMs, expired);
  const Outcome second = t.acquire("jobs/a", test::sandbox(2), WorkerId{0x77, 2}, kT0 + 11'000 * kMs);
  if (LEASEHOLD_SIM_ABLATE_ACQUIRING_EXPIRY) {
    EXPECT_EQ(held.state.expiry_ns, kT0 + 10'000 * kMs);
    ASSERT_EQ(expired.size(), 1u);
    EXPECT_EQ(second.refusal, Refusal::none);  // two holders: the first's kill-switch is at ~14 s
    EXPECT_EQ(second.token.epoch, a.token.epoch + 1);
  } else {
    EXPECT_EQ(held.state.expiry_ns, kT0 + 14'000 * kMs);
    EXPECT_TRUE(expired.empty());
    EXPECT_EQ(second.refusal, Refusal::held);
  }
}

// Preemptible mode, liveness ignored: worker A holds "jobs/a" (committed) and beats; worker B's
// 2-phase acquire must be refused `held` while lockd asks A whether the sandbox runs. The ablated
// lockd preempts A's live name at once and gives B an Acquiring grant of the next epoch.
TEST(SimAblation, ALiveWorkersNameIsPreemptedWithoutAskingOnlyWhenAblated) {
  LockdConfig c;
  c.mode = LockMode::preemptible;
  test::CoreRig rig(kT0, {}, 1, c);
  const SandboxId a_sb = test::sandbox(1);
  rig.deliver(rig.seal(wire::WorkerHeartbeat{rig.worker, {}}), kT0);
  rig.deliver(rig.acquire("jobs/a", a_sb, 0, true), kT0);
  rig.settle(kT0);
  ASSERT_EQ(rig.net.sent.size(), 2u);
  // The beat's answer and the grant, in either order (answer-before-durable sends the grant first).
  const auto first = rig.decode(rig.net.sent[0].bytes);
  const auto acquiring = std::get<wire::Grant>(std::holds_alternative<wire::Grant>(first)
                                                   ? first
                                                   : rig.decode(rig.net.sent[1].bytes));
  ASSERT_EQ(acquiring.state, LockPhase::acquiring);
  rig.deliver(rig.seal(wire::Commit{acquiring.name_id, a_sb, acquiring.epoch, rig.worker}), kT0 + 10 * kMs);
  rig.settle(kT0 + 10 * kMs);
  ASSERT_EQ(rig.net.sent.size(), 3u);
  ASSERT_EQ(std::get<wire::Grant>(rig.decode(rig.net.sent[2].bytes)).state, LockPhase::held);

  // Worker B, 100 ms later: A beat at kT0 and is live for the liveness TTL.
  const WorkerId b{0x78, 2};
  const wire::WireKey b_key = wire::derive_worker_key(test::cluster_key(), b);
  wire::Sender b_client(b, 1, b_key);
  const wire::Authenticator b_auth(b_key);
  wire::Datagram dg;
  ASSERT_TRUE(b_client.seal(1, wire::Acquire{"jobs/a", test::sandbox(2), b, 0, true}, dg));
  const auto bytes = dg.view();
  const std::int64_t t = kT0 + 100 * kMs;
  rig.service->on_datagram(std::vector<std::uint8_t>(bytes.begin(), bytes.end()), SocketAddress::loopback_v4(40002), t);
  rig.settle(t);
  ASSERT_GE(rig.net.sent.size(), 4u);
  std::optional<wire::Body> to_b;
  bool asked_a = false;
  for (std::size_t i = 3; i < rig.net.sent.size(); ++i) {
    if (rig.net.sent[i].to == SocketAddress::loopback_v4(40002)) {
      wire::DecodeResult r = wire::decode(rig.net.sent[i].bytes, &b_auth);
      ASSERT_TRUE(r) << r.detail;
      to_b = r.body;
    } else if (rig.net.sent[i].to == rig.worker_address) {
      asked_a = std::holds_alternative<wire::IsRunning>(rig.decode(rig.net.sent[i].bytes));
    }
  }
  ASSERT_TRUE(to_b.has_value());
  const LockState s = rig.service->table().state(acquiring.name_id);
  if (LEASEHOLD_SIM_ABLATE_PREEMPT_LIVE_WORKER) {
    const auto* g = std::get_if<wire::Grant>(&*to_b);
    ASSERT_NE(g, nullptr) << "the ablated lockd should have preempted A's live name";
    EXPECT_EQ(g->epoch, acquiring.epoch + 1);
    EXPECT_FALSE(asked_a);
    EXPECT_EQ(s.owner, test::sandbox(2));
  } else {
    const auto* d = std::get_if<wire::Deny>(&*to_b);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->refusal, Refusal::held);
    EXPECT_TRUE(asked_a);
    EXPECT_EQ(s.phase, LockPhase::held);
    EXPECT_EQ(s.owner, a_sb);
  }
}

// A grant is answered only once its change is durable. The ablated lockd answers at once; its
// batch then fails (a full disk), lockd stops, and the restarted lockd, loading what is durable,
// has the name free: the worker holds a grant nobody remembers, and a second acquire gets the
// name at the same epoch.
TEST(SimAblation, AGrantIsAnsweredOnlyOnceDurableUnlessAblated) {
  test::CoreRig rig(kT0);
  rig.deliver(rig.acquire("jobs/a", test::sandbox(1), 1'000), kT0);
  rig.service->tick(kT0);  // the change is submitted, not yet durable
  ASSERT_EQ(rig.disk.submitted.size(), 1u);
  const std::size_t answered = rig.net.sent.size();
  rig.disk.verdict(0, DurabilityVerdict::Kind::failed, "disk full");
  rig.service->tick(kT0 + kMs);
  EXPECT_TRUE(rig.service->failed());
  EXPECT_EQ(rig.net.sent.size(), answered) << "nothing is answered after the store failed";

  test::CoreRig restarted(kT0 + 2 * kMs, rig.disk.apply_durable(), 2);
  const LockState s = restarted.service->table().state(name_id_of("jobs/a"));
  EXPECT_EQ(s.phase, LockPhase::free) << "the failed batch is not in the store";
  if (LEASEHOLD_SIM_ABLATE_ANSWER_BEFORE_DURABLE) {
    ASSERT_EQ(answered, 1u) << "the ablated lockd answers before durability";
    const wire::Body body = rig.decode(rig.net.sent[0].bytes);
    const auto* g = std::get_if<wire::Grant>(&body);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->state, LockPhase::held);  // a grant the restarted lockd does not know
  } else {
    EXPECT_EQ(answered, 0u) << "no answer before the change is durable";
  }
}

}  // namespace
}  // namespace leasehold::lockd
