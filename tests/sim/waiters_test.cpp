// Queued runs in the simulated world (SimConfig::queues()): workers queue for the few names they
// all draw from, lockd hands each name to its first waiter when the holder lets it go, and every
// invariant keeps holding.
#include "leasehold/sim/world.hpp"

#include <gtest/gtest.h>

#include <string>

namespace leasehold::sim {
namespace {

SimConfig queueing_run(std::uint64_t seed) {
  SimConfig c;
  c.seed = seed;
  c.queue_share = 1;
  return c;
}

std::string why(const RunResult& r) {
  return r.violation ? "seed " + std::to_string(r.seed) + ": " + r.violation->invariant + ": " + r.violation->detail : "";
}

// Over a few fixed seeds (lease and preemptible mode as drawn, 120 simulated seconds each),
// queued runs wait in lockd's FIFO and are granted there: on the holder's Release, on a revoked
// holder's kill confirmation (the operator's revoke), and at lockd's timers (an expiry, a lapsed
// place ahead, a lock-delay's end); places lapse while their worker is cut off or paused, and
// queued runs give up at their timeout or when their client closes. Every invariant holds.
TEST(SimWaiters, WaitersAreGrantedByEveryHandOverAndTheRunsAreClean) {
  FaultCounts sum;
  for (std::uint64_t s = 1; s <= 6; ++s) {
    const RunResult r = run_seed(queueing_run(s));
    ASSERT_FALSE(r.violation) << why(r);
    EXPECT_EQ(r.counts.queueing_runs, 1u) << "seed " << s;
    EXPECT_GT(r.counts.waiters_granted, 10u) << "seed " << s << ": hardly anybody was granted a name from a FIFO";
    sum += r.counts;
  }
  // At these seeds: 3 preemptible runs, 367 queued runs, 469 places, 243 waiters granted (220 on
  // a Release, 14 on a kill confirmation, 9 at a timer), 52 places lapsed, 276 queued runs
  // granted, 57 given up at their timeout, 21 clients closed.
  EXPECT_GT(sum.preemptible_runs, 0u);
  EXPECT_LT(sum.preemptible_runs, 6u);
  EXPECT_GT(sum.queued_runs, 250u);
  EXPECT_GT(sum.waiters_queued, 300u);
  EXPECT_GT(sum.waiters_granted, 150u);
  EXPECT_GT(sum.waiters_granted_on_release, 120u);
  EXPECT_GT(sum.waiters_granted_on_kill_confirmed, 0u);
  EXPECT_GT(sum.waiters_granted - sum.waiters_granted_on_release - sum.waiters_granted_on_kill_confirmed, 0u);
  EXPECT_GT(sum.waiters_lapsed, 20u);
  EXPECT_GT(sum.queued_runs_granted, sum.waiters_granted);  // some were granted at once
  EXPECT_LE(sum.queued_runs_granted, sum.queued_runs);
  EXPECT_GT(sum.queued_runs_timed_out, 20u);
  EXPECT_GT(sum.queued_clients_closed, 5u);
  // Granted waiters run: their sandboxes write to the fenced resource like any other.
  EXPECT_GT(sum.writes_accepted, 20'000u);
}

// Seed 137 (preemptible, queueing): a Wait for a name held on a worker whose liveness had
// lapsed, with nobody waiting: lockd's serve_queue preempted the holder and granted the name to
// the new waiter at once, emptying the FIFO, and on_wait then read the FIFO it had just erased
// (lockd died on a null dereference). The Wait is now answered with its grant.
TEST(SimWaiters, AWaitGrantedAtOnceByPreemptingALapsedHolderIsAnswered) {
  SimConfig c;
  c.seed = 137;
  ASSERT_TRUE(c.queues());
  ASSERT_TRUE(c.preemptible());
  const RunResult r = run_seed(c);
  EXPECT_FALSE(r.violation) << why(r);
  EXPECT_GT(r.counts.waiters_granted, 0u);
}

// Preemptible mode: a waiter's Wait makes lockd ask the holder's live worker IsRunning. A
// "running" answer changes nothing; lockd used to serve the FIFO on it all the same, which asked
// again at once: an IsRunning per round trip for as long as the holder ran (15,385 questions in
// these two runs then, 1,300 now).
TEST(SimWaiters, ARunningAnswerDoesNotMakeLockdAskAgainAtOnce) {
  FaultCounts sum;
  for (std::uint64_t s = 1; s <= 2; ++s) {
    SimConfig c = queueing_run(s);
    c.preemptible_share = 1;
    const RunResult r = run_seed(c);
    ASSERT_FALSE(r.violation) << why(r);
    sum += r.counts;
  }
  EXPECT_GT(sum.waiters_granted, 30u);
  EXPECT_GT(sum.is_running_asked, 300u);
  EXPECT_LT(sum.is_running_asked, 5'000u);
}

// The seeds that do not queue have no waiters, and a run's choice replays with its seed.
TEST(SimWaiters, OnlyTheSeedsThatQueueHaveWaiters) {
  SimConfig c;
  int queueing = 0;
  for (std::uint64_t s = 1; s <= 200; ++s) {
    c.seed = s;
    queueing += c.queues() ? 1 : 0;
    EXPECT_EQ(c.queues(), c.queues()) << "seed " << s;
  }
  // 30 % of 200 is 60; the binomial's standard deviation is 6.5.
  EXPECT_GT(queueing, 35);
  EXPECT_LT(queueing, 85);
  SimConfig none = queueing_run(3);
  none.duration_ns = 45 * kS;
  none.heal_ns = 15 * kS;
  none.queue_share = 0;
  const RunResult r = run_seed(none);
  ASSERT_FALSE(r.violation) << why(r);
  EXPECT_EQ(r.counts.queueing_runs, 0u);
  EXPECT_EQ(r.counts.queued_runs + r.counts.waiters_queued + r.counts.waiters_granted + r.counts.waiters_lapsed, 0u);
  EXPECT_GT(r.counts.sandboxes_started, 0u);
  none.queue_share = -0.1;
  EXPECT_NE(none.validate().message().find("queue_share"), std::string::npos) << none.validate().message();
}

}  // namespace
}  // namespace leasehold::sim
