// Tests of RtCore (supervisor/rt_core.hpp), the rt thread's logic without its thread: driven by a
// scripted clock (every step's now_ns is chosen here) and a recording kill path, so exact times
// of every kill decision are asserted: the deadline kill, lazy re-arm, kill-now, disarm, death
// confirmation and its timeout, the pending-kill bound, lateness and the wake-up schedule.
#include "leasehold/supervisor/rt_core.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <deque>
#include <optional>
#include <vector>

namespace leasehold {
namespace {

constexpr std::uint64_t kG = 1'000'000;         // 1 ms ticks
constexpr std::uint64_t kPoll = 5'000'000;      // command poll
constexpr std::uint64_t kT0 = 7'000'000'000'000;  // an arbitrary CLOCK_BOOTTIME reading (tick-aligned)
constexpr std::uint32_t kSlots = 300;

// The kill path: records every kill; a target's pidfd is its identity; death is scripted.
struct RecordingKillPath final : RtKillPath {
  struct Kill {
    int pidfd;
    std::uint64_t deadline_ns;
    std::uint64_t issued_ns;
  };
  std::vector<Kill> kills;
  std::vector<int> dead;              // pidfds that confirm_dead reports dead
  std::vector<int> cannot_tell;       // pidfds whose check fails (-EBADF)
  std::vector<int> undeliverable;     // pidfds whose kill delivers nothing (-ESRCH... -EPERM)
  std::uint64_t* clock = nullptr;     // the scripted clock: issued_ns = *clock
  KillRecord kill(const KillTarget& t, std::uint64_t deadline_ns) noexcept override {
    KillRecord r;
    r.deadline_ns = deadline_ns;
    r.issued_ns = *clock;
    r.path = KillPath::signals;
    for (int u : undeliverable)
      if (u == t.pidfd) {
        r.path = KillPath::none;
        r.error = -EPERM;
      }
    kills.push_back({t.pidfd, deadline_ns, r.issued_ns});
    return r;
  }
  int confirm_dead(const KillTarget& t) noexcept override {
    for (int d : cannot_tell)
      if (d == t.pidfd) return -EBADF;
    for (int d : dead)
      if (d == t.pidfd) return 1;
    return 0;
  }
};

struct Hooks {
  std::vector<std::uint64_t> deadline = std::vector<std::uint64_t>(kSlots, 0);  // lazy re-arm source
  std::vector<std::uint32_t> revoked;
  std::vector<std::uint64_t> lateness;
  std::vector<std::uint64_t> beats;
  struct Report {
    std::uint32_t slot;
    KillRecord record;
  };
  std::vector<Report> reports;
  RtHooks hooks() {
    RtHooks h;
    h.context = this;
    h.current_deadline_ns = [](void* c, std::uint32_t slot) { return static_cast<Hooks*>(c)->deadline[slot]; };
    h.revoke_slot = [](void* c, std::uint32_t slot) { static_cast<Hooks*>(c)->revoked.push_back(slot); };
    h.record_lateness = [](void* c, std::uint64_t ns) { static_cast<Hooks*>(c)->lateness.push_back(ns); };
    h.writer_heartbeat = [](void* c, std::uint64_t ns) { static_cast<Hooks*>(c)->beats.push_back(ns); };
    h.record_kill = [](void* c, std::uint32_t slot, const KillRecord& r) {
      static_cast<Hooks*>(c)->reports.push_back({slot, r});
    };
    return h;
  }
};

struct Queue final : RtCommandSource {
  std::deque<RtCommand> q;
  std::uint64_t seq = 0;
  bool pop(RtCommand& out) noexcept override {
    if (q.empty()) return false;
    out = q.front();
    q.pop_front();
    return true;
  }
  void arm(std::uint32_t slot, std::uint64_t deadline_ns, int pidfd) {
    RtCommand c;
    c.seq = ++seq;
    c.op = RtOp::arm;
    c.slot = slot;
    c.deadline_ns = deadline_ns;
    c.target.pidfd = pidfd;
    q.push_back(c);
  }
  void op(RtOp o, std::uint32_t slot) {
    RtCommand c;
    c.seq = ++seq;
    c.op = o;
    c.slot = slot;
    q.push_back(c);
  }
};

class RtCoreTest : public ::testing::Test {
 protected:
  std::uint64_t now = kT0;
  RecordingKillPath kill;
  Hooks hooks;
  Queue queue;
  std::optional<RtCore> core;
  void SetUp() override {
    kill.clock = &now;
    core.emplace(kSlots, kG, kPoll, hooks.hooks(), kill, now);
  }
  void step_at(std::uint64_t t, std::uint64_t woke_for = 0) {
    now = t;
    core->step(t, woke_for == 0 ? t : woke_for, queue);
  }
};

TEST_F(RtCoreTest, ArmedSlotIsKilledAtItsDeadlineTickNotBefore) {
  const std::uint64_t d = kT0 + 10 * kG;
  hooks.deadline[3] = d;
  queue.arm(3, d, 33);
  step_at(kT0 + kG);
  EXPECT_EQ(core->applied_seq(), 1u);
  step_at(d - 1);  // the tick before the deadline's
  EXPECT_TRUE(kill.kills.empty());
  EXPECT_TRUE(hooks.revoked.empty());
  step_at(d + kG);  // the tick after the deadline's has started: due
  ASSERT_EQ(kill.kills.size(), 1u);
  EXPECT_EQ(kill.kills[0].pidfd, 33);
  EXPECT_EQ(kill.kills[0].deadline_ns, d);
  EXPECT_EQ(kill.kills[0].issued_ns, d + kG);
  ASSERT_EQ(hooks.revoked.size(), 1u);  // revoked in shm before the kill
  EXPECT_EQ(hooks.revoked[0], 3u);
  EXPECT_TRUE(hooks.reports.empty());  // death not yet seen: pending
  EXPECT_EQ(core->pending_kills(), 1u);
  kill.dead.push_back(33);
  core->confirm_pending(d + 2 * kG);
  ASSERT_EQ(hooks.reports.size(), 1u);
  EXPECT_EQ(hooks.reports[0].slot, 3u);
  EXPECT_EQ(hooks.reports[0].record.confirmed_ns, d + 2 * kG);
  EXPECT_EQ(hooks.reports[0].record.error, 0);
  const RtCounters c = core->counters();
  EXPECT_EQ(c.kills_issued, 1u);
  EXPECT_EQ(c.kills_confirmed, 1u);
  EXPECT_EQ(c.kill_issue_latency_ns_max, kG);
  EXPECT_FALSE(core->armed(3));
}

TEST_F(RtCoreTest, LazyRearmFollowsTheExtendedDeadline) {
  const std::uint64_t d1 = kT0 + 10 * kG, d2 = kT0 + 50 * kG;
  hooks.deadline[1] = d1;
  queue.arm(1, d1, 11);
  step_at(kT0 + kG);
  hooks.deadline[1] = d2;  // a heartbeat extended it without telling the rt core
  step_at(d1 + kG);
  EXPECT_TRUE(kill.kills.empty());
  EXPECT_EQ(core->counters().rearms, 1u);
  step_at(d2 - 1);
  EXPECT_TRUE(kill.kills.empty());
  step_at(d2 + kG);
  ASSERT_EQ(kill.kills.size(), 1u);
  EXPECT_EQ(kill.kills[0].deadline_ns, d2);
}

TEST_F(RtCoreTest, ExtensionAlreadyDueKillsAtTheLaterDeadline) {
  const std::uint64_t d1 = kT0 + 10 * kG, d2 = kT0 + 12 * kG;
  hooks.deadline[1] = d1;
  queue.arm(1, d1, 11);
  step_at(kT0 + kG);
  hooks.deadline[1] = d2;
  step_at(kT0 + 20 * kG);  // a late wake-up: both deadlines are past
  ASSERT_EQ(kill.kills.size(), 1u);
  EXPECT_EQ(kill.kills[0].deadline_ns, d2);
  EXPECT_EQ(core->counters().rearms, 0u);
}

TEST_F(RtCoreTest, KillNowKillsAnArmedSlotAtOnceAndIgnoresAnUnarmedOne) {
  hooks.deadline[2] = kT0 + 1000 * kG;
  queue.arm(2, kT0 + 1000 * kG, 22);
  queue.op(RtOp::kill_now, 5);  // never armed: nothing to kill
  step_at(kT0 + kG);
  EXPECT_TRUE(kill.kills.empty());
  queue.op(RtOp::kill_now, 2);
  kill.dead.push_back(22);
  step_at(kT0 + 3 * kG);
  ASSERT_EQ(kill.kills.size(), 1u);
  EXPECT_EQ(kill.kills[0].pidfd, 22);
  EXPECT_EQ(kill.kills[0].deadline_ns, kT0 + 3 * kG);  // the request time
  ASSERT_EQ(hooks.reports.size(), 1u);                  // dead at once: reported in the same step
  EXPECT_EQ(hooks.reports[0].record.confirmed_ns, kT0 + 3 * kG);
  EXPECT_EQ(core->applied_seq(), 3u);
  step_at(kT0 + 2000 * kG);  // the old deadline does not fire again
  EXPECT_EQ(kill.kills.size(), 1u);
}

TEST_F(RtCoreTest, DisarmPreventsTheKillAndCancelsAPendingOne) {
  hooks.deadline[4] = kT0 + 10 * kG;
  queue.arm(4, kT0 + 10 * kG, 44);
  step_at(kT0 + kG);
  queue.op(RtOp::disarm, 4);
  step_at(kT0 + 5 * kG);
  step_at(kT0 + 30 * kG);
  EXPECT_TRUE(kill.kills.empty());

  hooks.deadline[6] = kT0 + 40 * kG;
  queue.arm(6, kT0 + 40 * kG, 66);
  step_at(kT0 + 31 * kG);
  step_at(kT0 + 41 * kG);  // killed, death not seen
  ASSERT_EQ(kill.kills.size(), 1u);
  queue.op(RtOp::disarm, 6);
  step_at(kT0 + 42 * kG);
  ASSERT_EQ(hooks.reports.size(), 1u);
  EXPECT_EQ(hooks.reports[0].record.error, -ECANCELED);
  EXPECT_EQ(hooks.reports[0].record.confirmed_ns, 0u);
  EXPECT_EQ(core->pending_kills(), 0u);
}

TEST_F(RtCoreTest, UnconfirmedDeathTimesOutAndFailuresAreReportedOnce) {
  hooks.deadline[7] = kT0 + 10 * kG;
  queue.arm(7, kT0 + 10 * kG, 77);
  hooks.deadline[8] = kT0 + 10 * kG;
  queue.arm(8, kT0 + 10 * kG, 88);
  hooks.deadline[9] = kT0 + 10 * kG;
  queue.arm(9, kT0 + 10 * kG, 99);
  kill.undeliverable.push_back(99);
  step_at(kT0 + kG);
  step_at(kT0 + 11 * kG);
  ASSERT_EQ(kill.kills.size(), 3u);
  ASSERT_EQ(hooks.reports.size(), 1u);  // nothing delivered to 99: reported at once
  EXPECT_EQ(hooks.reports[0].slot, 9u);
  EXPECT_EQ(hooks.reports[0].record.error, -EPERM);
  kill.cannot_tell.push_back(88);
  step_at(kT0 + 12 * kG);
  ASSERT_EQ(hooks.reports.size(), 2u);
  EXPECT_EQ(hooks.reports[1].slot, 8u);
  EXPECT_EQ(hooks.reports[1].record.error, -EBADF);
  const std::uint64_t issued = kT0 + 11 * kG;
  step_at(issued + kRtKillConfirmTimeoutNs);  // not yet past the timeout
  EXPECT_EQ(hooks.reports.size(), 2u);
  step_at(issued + kRtKillConfirmTimeoutNs + kG);
  ASSERT_EQ(hooks.reports.size(), 3u);
  EXPECT_EQ(hooks.reports[2].slot, 7u);
  EXPECT_EQ(hooks.reports[2].record.error, -ETIMEDOUT);
  EXPECT_EQ(core->pending_kills(), 0u);
}

TEST_F(RtCoreTest, MorePendingKillsThanTheBoundAreReportedNoSpace) {
  for (std::uint32_t s = 0; s < kRtPendingKillsMax + 2; ++s) {
    hooks.deadline[s] = kT0 + 10 * kG;
    queue.arm(s, kT0 + 10 * kG, static_cast<int>(1000 + s));
  }
  step_at(kT0 + kG);
  step_at(kT0 + 11 * kG);
  EXPECT_EQ(kill.kills.size(), kRtPendingKillsMax + 2);
  EXPECT_EQ(core->pending_kills(), kRtPendingKillsMax);
  ASSERT_EQ(hooks.reports.size(), 2u);
  EXPECT_EQ(hooks.reports[0].record.error, -ENOSPC);
  EXPECT_EQ(hooks.reports[1].record.error, -ENOSPC);
  core->finish_all(kT0 + 12 * kG);  // leaving: every pending kill reported, none lost
  EXPECT_EQ(hooks.reports.size(), kRtPendingKillsMax + 2);
  EXPECT_EQ(core->pending_kills(), 0u);
}

TEST_F(RtCoreTest, EveryStepBeatsTheWriterAndRecordsItsLateness) {
  step_at(kT0 + 5 * kG, kT0 + 5 * kG - 300);
  step_at(kT0 + 6 * kG, kT0 + 6 * kG);
  ASSERT_EQ(hooks.beats.size(), 2u);
  EXPECT_EQ(hooks.beats[0], kT0 + 5 * kG);
  EXPECT_EQ(hooks.beats[1], kT0 + 6 * kG);
  ASSERT_EQ(hooks.lateness.size(), 2u);
  EXPECT_EQ(hooks.lateness[0], 300u);
  EXPECT_EQ(hooks.lateness[1], 0u);
  EXPECT_EQ(core->counters().ticks, 2u);
}

TEST_F(RtCoreTest, WakesAtTheNextEventOrCommandPollWhicheverIsFirst) {
  step_at(kT0);
  const std::uint64_t next_tick = core->counters().processed_until_ns;
  EXPECT_GT(next_tick, kT0);
  EXPECT_LE(next_tick, kT0 + kG);
  // Idle: the command poll bounds the sleep.
  EXPECT_EQ(core->next_wake_ns(kT0, false), kT0 + kPoll);
  // Commands queued: the next tick.
  EXPECT_EQ(core->next_wake_ns(kT0, true), next_tick);
  // A deadline sooner than the poll: its tick.
  hooks.deadline[0] = kT0 + 2 * kG;
  queue.arm(0, kT0 + 2 * kG, 1);
  step_at(kT0);
  const std::uint64_t w = core->next_wake_ns(kT0, false);
  EXPECT_GT(w, kT0 + 2 * kG - 1);
  EXPECT_LE(w, kT0 + 3 * kG);
  // A pending kill: every tick (its timeout is checked each wake-up).
  step_at(w);
  ASSERT_EQ(core->pending_kills(), 1u);
  EXPECT_EQ(core->next_wake_ns(w, false), core->counters().processed_until_ns);
}

// The core's end of "CLOCK_BOOTTIME never goes backwards": every entry point (step, apply,
// confirm_pending, finish_all) aborts on a reading below the last one, or below the
// construction time; the same instant again is fine.
using RtCoreDeathTest = RtCoreTest;

TEST_F(RtCoreDeathTest, AClockThatGoesBackwardsAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr const char* kBackwards = "rt_core\\.cpp:[0-9]+: LEASEHOLD_ASSERT\\(now_ns >= last_now_ns_\\) failed";
  EXPECT_DEATH(core->step(kT0 - 1, kT0 - 1, queue), kBackwards);
  hooks.deadline[3] = kT0 + 10 * kG;
  queue.arm(3, kT0 + 10 * kG, 33);
  step_at(kT0 + 11 * kG);  // armed and killed at once (the deadline passed): a pending kill
  ASSERT_EQ(core->pending_kills(), 1u);
  step_at(kT0 + 11 * kG);  // the same instant again
  const std::uint64_t before = kT0 + 11 * kG - 1;
  EXPECT_DEATH(core->step(before, before, queue), kBackwards);
  EXPECT_DEATH(core->confirm_pending(before), kBackwards);
  EXPECT_DEATH(core->finish_all(before), kBackwards);
  RtCommand disarm;
  disarm.op = RtOp::disarm;
  disarm.slot = 3;
  EXPECT_DEATH(core->apply(disarm, before), kBackwards);
  // The parent's core is untouched: the kill is still pending and finishes at a later time.
  EXPECT_TRUE(hooks.reports.empty());
  core->finish_all(kT0 + 12 * kG);
  ASSERT_EQ(hooks.reports.size(), 1u);
  EXPECT_EQ(hooks.reports[0].record.error, -ECANCELED);
}

// A command for a slot the core does not have aborts (the producer refuses one: reaching the
// core, it would arm or kill through memory that is no slot).
TEST_F(RtCoreDeathTest, ASlotOutOfRangeAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  queue.arm(kSlots, kT0 + 10 * kG, 1);
  EXPECT_DEATH(step_at(kT0 + kG), "LEASEHOLD_ASSERT\\(c.slot < slots_.size\\(\\)\\) failed");
  RtCommand kill_now;
  kill_now.op = RtOp::kill_now;
  kill_now.slot = kSlots + 7;
  EXPECT_DEATH(core->apply(kill_now, kT0 + kG), "LEASEHOLD_ASSERT\\(c.slot < slots_.size\\(\\)\\) failed");
  kill_now.slot = kSlots - 1;  // the last slot is one (unarmed: nothing to kill)
  core->apply(kill_now, kT0 + kG);
  EXPECT_TRUE(kill.kills.empty());
  EXPECT_EQ(core->applied_seq(), 0u);
}

// Commands are applied in seq order with none skipped: applied_seq() is what the io thread
// trusts before it closes a disarmed sandbox's pidfd and leaf, so a gap or a repeat aborts.
TEST_F(RtCoreDeathTest, ACommandOutOfSeqOrderAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  queue.arm(1, kT0 + 100 * kG, 11);
  step_at(kT0 + kG);
  ASSERT_EQ(core->applied_seq(), 1u);
  queue.seq = 2;  // seq 2 never reaches the core
  queue.op(RtOp::disarm, 1);
  EXPECT_DEATH(step_at(kT0 + 2 * kG), "LEASEHOLD_ASSERT\\(c.seq == applied \\+ 1\\) failed");
  queue.q.clear();
  queue.seq = 0;  // seq 1 again
  queue.op(RtOp::disarm, 1);
  EXPECT_DEATH(step_at(kT0 + 2 * kG), "LEASEHOLD_ASSERT\\(c.seq == applied \\+ 1\\) failed");
  queue.q.clear();
  queue.seq = 1;
  queue.op(RtOp::disarm, 1);  // seq 2: in order
  step_at(kT0 + 2 * kG);
  EXPECT_EQ(core->applied_seq(), 2u);
  EXPECT_FALSE(core->armed(1));
}

}  // namespace
}  // namespace leasehold
