// The supervisor's simulator ablations (supervisor/daemon.cmake), each in a scripted scenario:
// built once against leasehold_supervisor (the defence: the scenario stays safe) and once against
// the ablated library (LEASEHOLD_TEST_ABLATED: the same scenario breaks the safety condition),
// so a switch that stopped reintroducing its bug fails here, as does a defence that stopped working.
#include "leasehold/supervisor/heartbeat.hpp"

#include <gtest/gtest.h>

#ifndef LEASEHOLD_TEST_ABLATED
#define LEASEHOLD_TEST_ABLATED 0
#endif

namespace leasehold {
namespace {

constexpr std::uint64_t kMs = 1'000'000;
constexpr std::uint64_t kTtl = 1000 * kMs;       // lockd's lease TTL
constexpr std::uint64_t kKillAfter = 600 * kMs;  // the kill-switch's; margin 400 ms
constexpr std::uint64_t kInterval = 100 * kMs;
constexpr bool kAblated = LEASEHOLD_TEST_ABLATED != 0;
// One suite name per build, so ctest names the defended and the ablated run apart.
#if LEASEHOLD_TEST_ABLATED
#define LEASEHOLD_ABLATION_SUITE SimAblationAblated
#else
#define LEASEHOLD_ABLATION_SUITE SimAblationDefended
#endif

// Deadline from the answer: a refresh sent at 100 ms, received by lockd at once (its expiry
// 100 + ttl = 1100 ms), whose answer is delayed 450 ms (more than the 400 ms margin). Counted
// from the send the kill-switch fires at 700 ms, before lockd's expiry; counted from the answer
// at 1150 ms, after lockd may have granted the name to another worker (two holders).
TEST(LEASEHOLD_ABLATION_SUITE, DeadlineFromAnswerLetsTheKillSwitchFireAfterLockdsExpiry) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, false);
  const NameId name{1, 1};
  const SandboxId sandbox{2, 1};
  ASSERT_TRUE(h.add(name, sandbox, 5, 0, 0));
  const std::uint64_t send = 100 * kMs, lockd_received = send, answer = 550 * kMs;
  const HeartbeatAction a = h.on_refresh_answer(sandbox, 5, RefreshStatus::refreshed, {}, 0, send, answer);
  ASSERT_EQ(a.kind, HeartbeatAction::Kind::extend);
  const std::uint64_t lockd_expiry = lockd_received + kTtl;
  EXPECT_EQ(a.valid_until_ns, kAblated ? answer + kKillAfter : send + kKillAfter);
  EXPECT_EQ(a.valid_until_ns > lockd_expiry, kAblated) << "kill-switch at " << a.valid_until_ns / kMs
                                                        << " ms, lockd's expiry at " << lockd_expiry / kMs << " ms";
}

// The same for worker liveness (preemptible mode): lockd's liveness TTL counts from its receipt
// of the beat; the committed lease's kill-switch follows the worker's valid_until.
TEST(LEASEHOLD_ABLATION_SUITE, DeadlineFromAnswerOutlivesWorkerLiveness) {
  HeartbeatSchedule h(kKillAfter, kInterval, 8, true);
  h.start_worker_liveness(0);
  const NameId name{1, 1};
  const SandboxId sandbox{2, 1};
  ASSERT_TRUE(h.add(name, sandbox, 5, 0, 0));
  ASSERT_TRUE(h.mark_worker_refreshed(sandbox));
  const std::uint64_t send = 100 * kMs, answer = 550 * kMs;
  const auto extended = h.on_worker_liveness_ack(send, answer);
  ASSERT_EQ(extended.size(), 1u);
  const std::uint64_t lockd_liveness_expiry = send + kTtl;
  EXPECT_EQ(h.worker_valid_until_ns() > lockd_liveness_expiry, kAblated);
  EXPECT_EQ(extended[0].valid_until_ns > lockd_liveness_expiry, kAblated);
}

}  // namespace
}  // namespace leasehold
