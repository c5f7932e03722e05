// The heartbeat schedule: valid_until = send time of the last acknowledged refresh + kill_after
// (DESIGN.md "Time"); lost/unknown kill at once; stale answers never extend.
#include "leasehold/supervisor/heartbeat.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace leasehold {
namespace {

constexpr std::uint64_t kMs = 1'000'000;
constexpr std::uint64_t kKillAfter = 600 * kMs;
constexpr std::uint64_t kInterval = 100 * kMs;

NameId nm(std::uint64_t n) { return NameId{1, n}; }
SandboxId sb(std::uint64_t n) { return SandboxId{2, n}; }

TEST(HeartbeatSchedule, GrantStartsTheLeaseAtItsSendTime) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, false);
  ASSERT_TRUE(h.add(nm(1), sb(1), 5, 0, 1000 * kMs));
  const HeartbeatLease* l = h.find(sb(1));
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->valid_until_ns, 1600 * kMs);
  EXPECT_FALSE(h.add(nm(1), sb(1), 5, 0, 1000 * kMs));  // duplicate
}

TEST(HeartbeatSchedule, RoundCarriesEveryLiveLeaseAndCapsTheDeadline) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, false);
  h.add(nm(1), sb(1), 5, 0, 1000 * kMs);  // valid until 1600
  h.add(nm(2), sb(2), 6, 1, 1100 * kMs);  // valid until 1700
  const HeartbeatRound r = h.begin_round(1200 * kMs, 64);
  ASSERT_EQ(r.requests.size(), 1u);
  EXPECT_EQ(r.requests[0].entries.size(), 2u);
  EXPECT_EQ(r.requests[0].send_ns, 1200 * kMs);
  EXPECT_EQ(r.requests[0].deadline_ns, 1600 * kMs);  // the earliest valid_until
  EXPECT_EQ(h.next_round_ns(), 1300 * kMs);
  EXPECT_FALSE(r.worker_liveness);
}

TEST(HeartbeatSchedule, RoundSplitsAtTheDatagramLimit) {
  HeartbeatSchedule h(kKillAfter, kInterval, 200, false);
  for (std::uint64_t i = 0; i < 130; ++i) h.add(nm(i), sb(i), 1, static_cast<std::uint32_t>(i), 0);
  const HeartbeatRound r = h.begin_round(10 * kMs, 64);
  ASSERT_EQ(r.requests.size(), 3u);
  EXPECT_EQ(r.requests[0].entries.size(), 64u);
  EXPECT_EQ(r.requests[1].entries.size(), 64u);
  EXPECT_EQ(r.requests[2].entries.size(), 2u);
}

TEST(HeartbeatSchedule, EachRequestOfARoundHoldsNamesOfOneShard) {
  HeartbeatSchedule h(kKillAfter, kInterval, 64, false);
  h.set_shards(2);
  EXPECT_EQ(h.shards(), 2u);
  // Shards of 2 (tests/lease/shard_test.cpp): "db/primary" 0; "agent-1", "agent-2", "job:42" 1.
  const std::map<std::string, unsigned> shard{{"db/primary", 0}, {"agent-1", 1}, {"agent-2", 1}, {"job:42", 1}};
  std::uint64_t n = 0;
  for (const auto& [name, s] : shard) {
    ++n;
    h.add(name_id_of(name), sb(n), 1, static_cast<std::uint32_t>(n), 1000 * kMs);
  }
  const HeartbeatRound r = h.begin_round(1100 * kMs, 2);  // at most 2 entries a request
  // Shard 1's three names take two requests, shard 0's one name one: three, none mixed.
  ASSERT_EQ(r.requests.size(), 3u);
  std::map<unsigned, std::size_t> entries_of;
  for (const RefreshRequest& q : r.requests) {
    const unsigned first = shard_of(q.entries.at(0).name, 2);
    for (const RefreshEntry& e : q.entries) EXPECT_EQ(shard_of(e.name, 2), first);
    entries_of[first] += q.entries.size();
  }
  EXPECT_EQ(entries_of[0], 1u);
  EXPECT_EQ(entries_of[1], 3u);
  for (const auto& [name, s] : shard) EXPECT_EQ(shard_of_name(name, 2), s) << name;
}

TEST(HeartbeatSchedule, LapsedLeaseIsNotRefreshed) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, false);
  h.add(nm(1), sb(1), 5, 0, 0);  // valid until 600
  const HeartbeatRound r = h.begin_round(600 * kMs, 64);
  EXPECT_TRUE(r.requests.empty());
}

TEST(HeartbeatSchedule, RefreshedExtendsFromTheSendTime) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, false);
  h.add(nm(1), sb(1), 5, 3, 0);
  const HeartbeatAction a =
      h.on_refresh_answer(sb(1), 5, RefreshStatus::refreshed, {}, 0, 100 * kMs, 450 * kMs);
  EXPECT_EQ(a.kind, HeartbeatAction::Kind::extend);
  EXPECT_EQ(a.slot, 3u);
  EXPECT_EQ(a.valid_until_ns, 700 * kMs);  // send 100 + 600, not receive 450 + 600
  EXPECT_EQ(h.find(sb(1))->last_acked_send_ns, 100 * kMs);
}

TEST(HeartbeatSchedule, StaleAnswerDoesNotExtendFromANewerSend) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, false);
  h.add(nm(1), sb(1), 5, 0, 0);
  // The answer to the send at 300 arrives first, then the late answer to the send at 200.
  EXPECT_EQ(h.on_refresh_answer(sb(1), 5, RefreshStatus::refreshed, {}, 0, 300 * kMs, 310 * kMs)
                .valid_until_ns,
            900 * kMs);
  const HeartbeatAction late =
      h.on_refresh_answer(sb(1), 5, RefreshStatus::refreshed, {}, 0, 200 * kMs, 320 * kMs);
  EXPECT_EQ(late.kind, HeartbeatAction::Kind::none);
  EXPECT_EQ(h.find(sb(1))->valid_until_ns, 900 * kMs);
  EXPECT_EQ(h.find(sb(1))->last_acked_send_ns, 300 * kMs);
}

TEST(HeartbeatSchedule, LostKillsAtOnceWithHolderAndEpoch) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, false);
  h.add(nm(1), sb(1), 5, 2, 0);
  const HeartbeatAction a =
      h.on_refresh_answer(sb(1), 5, RefreshStatus::lost, sb(9), 6, 100 * kMs, 150 * kMs);
  EXPECT_EQ(a.kind, HeartbeatAction::Kind::kill);
  EXPECT_EQ(a.cause, RefreshStatus::lost);
  EXPECT_EQ(a.holder, sb(9));
  EXPECT_EQ(a.holder_epoch, 6u);
  EXPECT_EQ(a.slot, 2u);
  EXPECT_FALSE(a.lapsed);
}

TEST(HeartbeatSchedule, UnknownKillsEvenForAnOldSend) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, false);
  h.add(nm(1), sb(1), 5, 0, 0);
  h.on_refresh_answer(sb(1), 5, RefreshStatus::refreshed, {}, 0, 300 * kMs, 310 * kMs);
  const HeartbeatAction a =
      h.on_refresh_answer(sb(1), 5, RefreshStatus::unknown, {}, 0, 100 * kMs, 320 * kMs);
  EXPECT_EQ(a.kind, HeartbeatAction::Kind::kill);
  EXPECT_EQ(a.cause, RefreshStatus::unknown);
}

TEST(HeartbeatSchedule, LapsedLeaseStaysDead) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, false);
  h.add(nm(1), sb(1), 5, 0, 0);  // valid until 600
  // A "refreshed" for a send at 500 arrives at 650: the rt thread already owns the kill.
  const HeartbeatAction a =
      h.on_refresh_answer(sb(1), 5, RefreshStatus::refreshed, {}, 0, 500 * kMs, 650 * kMs);
  EXPECT_EQ(a.kind, HeartbeatAction::Kind::kill);
  EXPECT_TRUE(a.lapsed);
  EXPECT_EQ(h.find(sb(1))->valid_until_ns, 600 * kMs);
}

TEST(HeartbeatSchedule, AnswersForOtherEpochsOrRemovedSandboxesAreIgnored) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, false);
  h.add(nm(1), sb(1), 5, 0, 0);
  EXPECT_EQ(h.on_refresh_answer(sb(1), 4, RefreshStatus::lost, {}, 0, 0, 1).kind,
            HeartbeatAction::Kind::none);
  EXPECT_TRUE(h.remove(sb(1)));
  EXPECT_FALSE(h.remove(sb(1)));
  EXPECT_EQ(h.on_refresh_answer(sb(1), 5, RefreshStatus::lost, {}, 0, 0, 1).kind,
            HeartbeatAction::Kind::none);
}

TEST(HeartbeatSchedule, CapacityIsBounded) {
  HeartbeatSchedule h(kKillAfter, kInterval, 2, false);
  EXPECT_TRUE(h.add(nm(1), sb(1), 1, 0, 0));
  EXPECT_TRUE(h.add(nm(2), sb(2), 1, 1, 0));
  EXPECT_FALSE(h.add(nm(3), sb(3), 1, 2, 0));
  EXPECT_THROW(HeartbeatSchedule(0, kInterval, 1, false), std::invalid_argument);
}

// --- preemptible mode -------------------------------------------------------------------------

TEST(HeartbeatSchedulePreemptible, CreationNeedsLiveness) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, true);
  EXPECT_FALSE(h.may_create_named(0));
  EXPECT_TRUE(h.on_worker_liveness_ack(100 * kMs, 110 * kMs).empty());
  EXPECT_TRUE(h.may_create_named(110 * kMs));
  EXPECT_EQ(h.worker_valid_until_ns(), 700 * kMs);
  EXPECT_FALSE(h.may_create_named(700 * kMs));
}

TEST(HeartbeatSchedulePreemptible, CommittedLeaseFollowsWorkerLiveness) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, true);
  h.start_worker_liveness(100 * kMs);
  h.add(nm(1), sb(1), 5, 4, 150 * kMs);
  ASSERT_TRUE(h.mark_worker_refreshed(sb(1)));
  EXPECT_EQ(h.find(sb(1))->valid_until_ns, 700 * kMs);
  // Worker-refreshed leases leave the per-sandbox round; the round carries liveness.
  const HeartbeatRound r = h.begin_round(200 * kMs, 64);
  EXPECT_TRUE(r.requests.empty());
  EXPECT_TRUE(r.worker_liveness);
  const auto ext = h.on_worker_liveness_ack(200 * kMs, 210 * kMs);
  ASSERT_EQ(ext.size(), 1u);
  EXPECT_EQ(ext[0].kind, HeartbeatAction::Kind::extend);
  EXPECT_EQ(ext[0].slot, 4u);
  EXPECT_EQ(ext[0].valid_until_ns, 800 * kMs);
  // A stale liveness ack extends nothing.
  EXPECT_TRUE(h.on_worker_liveness_ack(150 * kMs, 220 * kMs).empty());
}

TEST(HeartbeatSchedulePreemptible, KillSwitchKillsAllAndBlocksCreation) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, true);
  h.start_worker_liveness(0);  // valid until 600
  h.add(nm(1), sb(1), 5, 0, 10 * kMs);
  h.add(nm(2), sb(2), 7, 1, 10 * kMs);
  h.add(nm(3), sb(3), 9, 2, 10 * kMs);  // not committed yet: its own lease
  h.mark_worker_refreshed(sb(1));
  h.mark_worker_refreshed(sb(2));
  EXPECT_TRUE(h.check_worker_liveness(599 * kMs).empty());
  const auto kills = h.check_worker_liveness(600 * kMs);
  EXPECT_EQ(kills.size(), 2u);
  for (const auto& k : kills) EXPECT_EQ(k.kind, HeartbeatAction::Kind::kill);
  EXPECT_TRUE(h.killswitch_engaged());
  EXPECT_TRUE(h.check_worker_liveness(610 * kMs).empty());  // once
  EXPECT_FALSE(h.may_create_named(611 * kMs));
  // An ack for a beat sent *before* the kill-switch does not re-open creation.
  EXPECT_TRUE(h.on_worker_liveness_ack(550 * kMs, 650 * kMs).empty());
  EXPECT_FALSE(h.may_create_named(651 * kMs));
  EXPECT_TRUE(h.killswitch_engaged());
  // A beat sent after it does; the killed leases stay dead.
  EXPECT_TRUE(h.on_worker_liveness_ack(660 * kMs, 670 * kMs).empty());
  EXPECT_FALSE(h.killswitch_engaged());
  EXPECT_TRUE(h.may_create_named(671 * kMs));
  EXPECT_EQ(h.find(sb(1))->valid_until_ns, 600 * kMs);
}

TEST(HeartbeatSchedulePreemptible, WorkerBeatCarriesCommittedNamesInARotatingWindow) {
  HeartbeatSchedule h(kKillAfter, kInterval, 128, true);
  h.start_worker_liveness(0);
  constexpr std::uint64_t kLeases = 70;
  for (std::uint64_t i = 1; i <= kLeases; ++i) {
    ASSERT_TRUE(h.add(nm(i), sb(i), i, static_cast<std::uint32_t>(i), 0));
    ASSERT_TRUE(h.mark_worker_refreshed(sb(i)));
  }
  // One more whose Commit is still in flight: lockd has it Acquiring, the beat must not ask.
  ASSERT_TRUE(h.add(nm(100), sb(100), 100, 100, 0));
  ASSERT_TRUE(h.mark_worker_refreshed(sb(100)));
  ASSERT_TRUE(h.set_commit_pending(sb(100), true));
  std::map<SandboxId, int> seen;
  for (int round = 0; round < 3; ++round) {  // ceil(70 / 29) = 3 rounds cover every name
    const HeartbeatRound r = h.begin_round(static_cast<std::uint64_t>(10 + round) * kMs, 29);
    EXPECT_LE(r.worker_held.size(), 29u);
    for (const auto& e : r.worker_held) {
      EXPECT_EQ(e.name, h.find(e.sandbox)->name);
      EXPECT_EQ(e.epoch, h.find(e.sandbox)->epoch);
      ++seen[e.sandbox];
    }
  }
  EXPECT_EQ(seen.size(), kLeases);
  // 3 * 29 = 87 entries: all 70, then the window wrapped around to the first 17 again.
  for (const auto& [id, n] : seen) EXPECT_EQ(n, id.lo <= 17 ? 2 : 1) << id.str();
  EXPECT_EQ(seen.count(sb(100)), 0u);
  // Once committed it is carried too; a lapsed lease is not (it is being killed).
  ASSERT_TRUE(h.set_commit_pending(sb(100), false));
  HeartbeatSchedule few(kKillAfter, kInterval, 8, true);
  few.start_worker_liveness(0);
  few.add(nm(1), sb(1), 1, 1, 0);
  few.mark_worker_refreshed(sb(1));
  few.add(nm(2), sb(2), 2, 2, 0);  // per-sandbox lease (not worker-refreshed): its own refresh
  EXPECT_EQ(few.begin_round(10 * kMs, 29).worker_held.size(), 1u);
  EXPECT_TRUE(few.begin_round(700 * kMs, 29).worker_held.empty());  // worker liveness lapsed at 600
}

TEST(HeartbeatSchedulePreemptible, LateAckNoticesTheLapseFirst) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, true);
  h.start_worker_liveness(0);
  h.add(nm(1), sb(1), 5, 0, 10 * kMs);
  h.mark_worker_refreshed(sb(1));
  // The supervisor was frozen: the first thing after resume is an ack for a beat sent at 500.
  const auto out = h.on_worker_liveness_ack(500 * kMs, 900 * kMs);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, HeartbeatAction::Kind::kill);
  EXPECT_TRUE(h.killswitch_engaged());
  EXPECT_FALSE(h.may_create_named(900 * kMs));
}

// --- invariants (LEASEHOLD_ASSERT): fed the violation, the schedule aborts --------------------

// `now` never goes back: a time below an earlier call's could make a lapsed lease look valid.
TEST(HeartbeatScheduleDeathTest, NowGoingBackAborts) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, true);
  h.add(nm(1), sb(1), 5, 0, 0);  // valid until 600
  h.begin_round(300 * kMs, 64);
  h.begin_round(300 * kMs, 64);  // the same time again is fine
  EXPECT_DEATH(h.begin_round(299 * kMs, 64), "LEASEHOLD_ASSERT\\(now_ns >= last_now_ns_\\) failed");
  EXPECT_DEATH(h.on_refresh_answer(sb(1), 5, RefreshStatus::refreshed, {}, 0, 100 * kMs, 200 * kMs),
               "LEASEHOLD_ASSERT\\(now_ns >= last_now_ns_\\) failed");
  EXPECT_DEATH(h.check_worker_liveness(299 * kMs), "LEASEHOLD_ASSERT\\(now_ns >= last_now_ns_\\) failed");
  EXPECT_DEATH(h.on_worker_liveness_ack(100 * kMs, 299 * kMs), "LEASEHOLD_ASSERT\\(now_ns >= last_now_ns_\\) failed");
  EXPECT_DEATH((void)h.may_create_named(299 * kMs), "LEASEHOLD_ASSERT\\(now_ns >= last_now_ns_\\) failed");
  // Later times still work, and the lease was extended by nothing above.
  EXPECT_EQ(h.on_refresh_answer(sb(1), 5, RefreshStatus::refreshed, {}, 0, 300 * kMs, 310 * kMs).valid_until_ns,
            900 * kMs);
}

// An answer that arrives before its request was sent would measure the lease from the future.
TEST(HeartbeatScheduleDeathTest, AnAnswerBeforeItsSendAborts) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, true);
  h.add(nm(1), sb(1), 5, 0, 0);
  EXPECT_DEATH(h.on_refresh_answer(sb(1), 5, RefreshStatus::refreshed, {}, 0, 201 * kMs, 200 * kMs),
               "LEASEHOLD_ASSERT\\(request_send_ns <= now_ns\\) failed");
  EXPECT_DEATH(h.on_worker_liveness_ack(201 * kMs, 200 * kMs), "LEASEHOLD_ASSERT\\(request_send_ns <= now_ns\\) failed");
  EXPECT_EQ(h.on_refresh_answer(sb(1), 5, RefreshStatus::refreshed, {}, 0, 200 * kMs, 200 * kMs).valid_until_ns,
            800 * kMs) << "answered at its send time is fine";
}

// The worker's deadline (every committed name's) never moves back: starting liveness again from
// an earlier send aborts; from a later one it moves forward.
TEST(HeartbeatScheduleDeathTest, MovingTheWorkersDeadlineBackAborts) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, true);
  h.start_worker_liveness(200 * kMs);  // valid until 800
  h.add(nm(1), sb(1), 5, 0, 250 * kMs);
  ASSERT_TRUE(h.mark_worker_refreshed(sb(1)));
  EXPECT_EQ(h.find(sb(1))->valid_until_ns, 800 * kMs);
  EXPECT_DEATH(h.start_worker_liveness(199 * kMs), "LEASEHOLD_ASSERT\\(to_ns >= valid_until_ns\\) failed");
  h.start_worker_liveness(200 * kMs);  // the same deadline again is fine
  h.start_worker_liveness(300 * kMs);
  EXPECT_EQ(h.worker_valid_until_ns(), 900 * kMs);
}

// Only a beat sent after the kill-switch engaged clears it.
TEST(HeartbeatScheduleDeathTest, ClearingTheKillSwitchWithAnOlderBeatAborts) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, true);
  h.start_worker_liveness(0);  // valid until 600
  ASSERT_TRUE(h.check_worker_liveness(600 * kMs).empty());
  ASSERT_TRUE(h.killswitch_engaged());
  EXPECT_DEATH(h.start_worker_liveness(599 * kMs),
               "LEASEHOLD_ASSERT\\(!killswitch_engaged_ \\|\\| send_ns >= killswitch_at_ns_\\) failed");
  h.start_worker_liveness(600 * kMs);
  EXPECT_FALSE(h.killswitch_engaged());
  EXPECT_EQ(h.worker_valid_until_ns(), 1200 * kMs);
}

// A committed lease is handed to worker liveness once: again would give a lease that lapsed with
// the worker the worker's later deadline.
TEST(HeartbeatScheduleDeathTest, HandingALeaseOverTwiceAborts) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, true);
  h.start_worker_liveness(0);
  h.add(nm(1), sb(1), 5, 0, 10 * kMs);
  ASSERT_TRUE(h.mark_worker_refreshed(sb(1)));
  EXPECT_DEATH(h.mark_worker_refreshed(sb(1)), "LEASEHOLD_ASSERT\\(!it->second.worker_refreshed\\) failed");
  EXPECT_FALSE(h.mark_worker_refreshed(sb(2))) << "absent: false, no abort";
}

}  // namespace
}  // namespace leasehold
