// Tests of the rt thread and the kill-switch with real child processes: a deadline kills (never
// before deadline - granularity), lazy re-arm extends life, disarm prevents the kill, kill-now,
// the cgroup.kill path, a kill of a child still waiting before its exec, and the SCHED_FIFO
// fallback by injected failure. Only logical orderings of timestamps are asserted, never durations.
#include "leasehold/supervisor/rt_thread.hpp"

#include "leasehold/supervisor/cgroup.hpp"
#include "leasehold/supervisor/kill_switch.hpp"
#include "leasehold/supervisor/spawn.hpp"

#include <gtest/gtest.h>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <optional>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

namespace leasehold {
namespace {

constexpr std::uint64_t kG = 1'000'000;        // 1 ms ticks
constexpr std::uint64_t kMs = 1'000'000;
constexpr int kHangGuardMs = 20'000;          // only guards against a hang; never a latency bound
constexpr std::uint32_t kSlots = 8;

// Stand-in for the shm table and stats: per-slot current deadline, revocation and kill records.
struct Recorder {
  std::array<std::atomic<std::uint64_t>, kSlots> deadline_ns{};
  std::array<std::atomic<std::uint64_t>, kSlots> revoked_ns{};
  std::array<std::atomic<int>, kSlots> kills{};
  std::array<KillRecord, kSlots> record{};  // written before `kills` is incremented (release)
  std::atomic<std::uint64_t> lateness_samples{0};
  std::atomic<std::uint64_t> heartbeats{0};
  std::atomic<std::uint64_t> last_heartbeat_ns{0};
  std::array<std::atomic<int>, kSlots> issued{};
  std::array<KillRecord, kSlots> issued_record{};  // written before `issued` is incremented

  RtHooks hooks() {
    RtHooks h;
    h.context = this;
    h.current_deadline_ns = [](void* c, std::uint32_t slot) -> std::uint64_t {
      return static_cast<Recorder*>(c)->deadline_ns[slot].load(std::memory_order_acquire);
    };
    h.revoke_slot = [](void* c, std::uint32_t slot) {
      static_cast<Recorder*>(c)->revoked_ns[slot].store(KillSwitch::now_ns(), std::memory_order_release);
    };
    h.record_lateness = [](void* c, std::uint64_t) {
      static_cast<Recorder*>(c)->lateness_samples.fetch_add(1, std::memory_order_relaxed);
    };
    h.writer_heartbeat = [](void* c, std::uint64_t now_ns) {
      auto* self = static_cast<Recorder*>(c);
      self->last_heartbeat_ns.store(now_ns, std::memory_order_relaxed);
      self->heartbeats.fetch_add(1, std::memory_order_relaxed);
    };
    h.record_kill_issued = [](void* c, std::uint32_t slot, const KillRecord& r) {
      auto* self = static_cast<Recorder*>(c);
      self->issued_record[slot] = r;
      self->issued[slot].fetch_add(1, std::memory_order_release);
    };
    h.record_kill = [](void* c, std::uint32_t slot, const KillRecord& r) {
      auto* self = static_cast<Recorder*>(c);
      self->record[slot] = r;
      self->kills[slot].fetch_add(1, std::memory_order_release);
    };
    return h;
  }
  bool await_kill(std::uint32_t slot) {
    for (int i = 0; i < kHangGuardMs; ++i) {
      if (kills[slot].load(std::memory_order_acquire) > 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
};

RtConfig test_config() {
  RtConfig c;
  c.slots = kSlots;
  c.granularity_ns = kG;
  c.priority = 10;
  c.lock_memory = false;  // mlockall under sanitizers would try to lock their shadow memory
  return c;
}

std::unique_ptr<RtThread> start_or_fail(const RtConfig& c, Recorder& rec, RtStartStatus& status) {
  auto t = RtThread::start(c, rec.hooks(), status);
  EXPECT_TRUE(t.ok()) << t.message();
  return t ? std::move(t).value() : nullptr;
}

std::optional<SandboxProcess> spawn_sleep(SpawnError& err, int cgroup_dir_fd = -1) {
  SpawnRequest r;
  r.argv = {"sleep", "100"};
  const char* p = std::getenv("PATH");
  r.env = {std::string("PATH=") + (p != nullptr ? p : kDefaultSearchPath)};
  r.cgroup_dir_fd = cgroup_dir_fd;
  return spawn_sandbox(r, err);
}

#define SLEEPER_OR_SKIP(var, ...)                                                   \
  SpawnError var##_err;                                                             \
  auto var = spawn_sleep(var##_err, ##__VA_ARGS__);                                 \
  if (!var && var##_err.errno_value == ENOSYS) GTEST_SKIP() << var##_err.message;   \
  ASSERT_TRUE(var.has_value()) << var##_err.message

// Blocks until the process exits (hang guard only); returns CLOCK_BOOTTIME when seen dead.
std::uint64_t await_death(const SandboxProcess& p) {
  pollfd fd{p.pidfd(), POLLIN, 0};
  EXPECT_EQ(::poll(&fd, 1, kHangGuardMs), 1) << "sandbox was never killed";
  return KillSwitch::now_ns();
}

void expect_killed_by_sigkill(const SandboxProcess& p) {
  siginfo_t info{};
  ASSERT_EQ(reap(p.pidfd(), info, true), 0);
  EXPECT_EQ(info.si_code, CLD_KILLED);
  EXPECT_EQ(info.si_status, SIGKILL);
}

KillTarget signal_target(const SandboxProcess& p) {
  KillTarget t;
  t.pidfd = p.pidfd();
  t.pgid = p.pgid();
  return t;
}

TEST(RtThread, RejectsBadConfigWithAClearError) {
  Recorder rec;
  RtStartStatus status;
  // RtThread::start(c) is refused (invalid_argument) with a message containing `text`.
#define EXPECT_REFUSED(c, text)                                                          \
  do {                                                                                  \
    const auto refused = RtThread::start(c, rec.hooks(), status);                       \
    EXPECT_EQ(refused.code(), Errc::invalid_argument);                                  \
    EXPECT_NE(refused.message().find(text), std::string::npos) << refused.message();    \
  } while (0)
  RtConfig c = test_config();
  c.cpu = 4096;
  EXPECT_REFUSED(c, "CPU 4096 does not exist");
  c = test_config();
  c.priority = 100;
  EXPECT_REFUSED(c, "priority 100 out of range");
  c = test_config();
  c.slots = 0;
  EXPECT_REFUSED(c, "rt slots 0 out of range");
  c = test_config();
  c.command_poll_ns = 0;
  EXPECT_REFUSED(c, "command_poll_ns must be at least 1");
#undef EXPECT_REFUSED
}

TEST(RtThread, KillsAtTheDeadlineNeverBeforeOneGranularityEarly) {
  Recorder rec;
  RtStartStatus status;
  auto rt = start_or_fail(test_config(), rec, status);
  ASSERT_NE(rt, nullptr);
  SLEEPER_OR_SKIP(p);
  const std::uint64_t deadline = KillSwitch::now_ns() + 50 * kMs;
  rec.deadline_ns[0] = deadline;
  const auto s = rt->arm(0, deadline, signal_target(*p));
  ASSERT_TRUE(s) << describe(s.refusal);
  const std::uint64_t seen_dead = await_death(*p);
  ASSERT_TRUE(rec.await_kill(0));
  const KillRecord r = rec.record[0];
  EXPECT_GE(seen_dead + kG, deadline) << "killed more than one granularity before the deadline";
  EXPECT_GE(r.issued_ns + kG, deadline);
  EXPECT_EQ(r.deadline_ns, deadline);
  EXPECT_EQ(r.path, KillPath::signals);
  EXPECT_EQ(r.error, 0);
  EXPECT_LE(rec.revoked_ns[0].load(), r.issued_ns) << "the slot must be revoked before the kill";
  EXPECT_GE(rec.revoked_ns[0].load() + kG, deadline);
  EXPECT_GE(r.confirmed_ns, r.issued_ns);
  EXPECT_TRUE(rt->applied(s.seq));
  EXPECT_EQ(rec.kills[0].load(), 1);
  EXPECT_GT(rec.lateness_samples.load(), 0u);
  const RtCounters counters = rt->counters();
  EXPECT_EQ(counters.kills_issued, 1u);
  EXPECT_EQ(counters.kills_confirmed, 1u);
  // The kill was also reported when issued: deadline -> issued, before death was confirmed.
  ASSERT_EQ(rec.issued[0].load(std::memory_order_acquire), 1);
  EXPECT_EQ(rec.issued_record[0].deadline_ns, deadline);
  EXPECT_EQ(rec.issued_record[0].issued_ns, r.issued_ns);
  EXPECT_EQ(rec.issued_record[0].confirmed_ns, 0u);
  EXPECT_EQ(counters.kill_issue_latency_ns_max, r.issued_ns > deadline ? r.issued_ns - deadline : 0u);
  EXPECT_GT(rec.heartbeats.load(), 0u);
  expect_killed_by_sigkill(*p);
}

TEST(RtThread, LazyRearmExtendsLife) {
  Recorder rec;
  RtStartStatus status;
  auto rt = start_or_fail(test_config(), rec, status);
  ASSERT_NE(rt, nullptr);
  SLEEPER_OR_SKIP(p);
  const std::uint64_t first = KillSwitch::now_ns() + 30 * kMs;
  const std::uint64_t extended = first + 150 * kMs;
  rec.deadline_ns[1] = extended;  // a heartbeat moved it before the first deadline came due
  ASSERT_TRUE(rt->arm(1, first, signal_target(*p)));
  const std::uint64_t seen_dead = await_death(*p);
  ASSERT_TRUE(rec.await_kill(1));
  const KillRecord r = rec.record[1];
  EXPECT_GE(seen_dead + kG, extended) << "killed at the old deadline despite the extension";
  EXPECT_GE(r.issued_ns + kG, extended);
  EXPECT_EQ(r.deadline_ns, extended);
  EXPECT_GE(rt->counters().rearms, 1u);
  expect_killed_by_sigkill(*p);
}

TEST(RtThread, DisarmPreventsTheKill) {
  Recorder rec;
  RtStartStatus status;
  auto rt = start_or_fail(test_config(), rec, status);
  ASSERT_NE(rt, nullptr);
  SLEEPER_OR_SKIP(p);
  const std::uint64_t deadline = KillSwitch::now_ns() + 20 * kMs;
  rec.deadline_ns[2] = deadline;
  ASSERT_TRUE(rt->arm(2, deadline, signal_target(*p)));
  const auto d = rt->disarm(2);
  ASSERT_TRUE(d);
  // Wait until the rt thread has processed every tick up to past the deadline.
  for (int i = 0; i < kHangGuardMs && rt->counters().processed_until_ns <= deadline + kG; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(rt->counters().processed_until_ns, deadline + kG);
  EXPECT_TRUE(rt->applied(d.seq));
  EXPECT_EQ(KillSwitch::pidfd_exited(p->pidfd()), 0) << "a disarmed sandbox must not be killed";
  EXPECT_EQ(rec.kills[2].load(), 0);
  EXPECT_EQ(rec.revoked_ns[2].load(), 0u);
  ASSERT_EQ(KillSwitch::pidfd_signal(p->pidfd(), SIGKILL), 0);
  expect_killed_by_sigkill(*p);
}

TEST(RtThread, KillNowIgnoresTheDeadline) {
  Recorder rec;
  RtStartStatus status;
  auto rt = start_or_fail(test_config(), rec, status);
  ASSERT_NE(rt, nullptr);
  SLEEPER_OR_SKIP(p);
  const std::uint64_t far = KillSwitch::now_ns() + 3600 * 1000 * kMs;
  rec.deadline_ns[3] = far;
  ASSERT_TRUE(rt->arm(3, far, signal_target(*p)));
  const std::uint64_t asked = KillSwitch::now_ns();
  ASSERT_TRUE(rt->kill_now(3));
  await_death(*p);
  ASSERT_TRUE(rec.await_kill(3));
  EXPECT_GE(rec.record[3].deadline_ns, asked);
  EXPECT_LT(rec.record[3].deadline_ns, far);
  expect_killed_by_sigkill(*p);
}

// With nothing armed the thread sleeps a whole command_poll_ns between wake-ups instead of
// waking every tick, and still beats the writer heartbeat each time. The bound holds under any
// load: each sleep ends no earlier than the last wake-up + command_poll_ns.
TEST(RtThread, IdleThreadWakesOncePerCommandPollNotPerTick) {
  Recorder rec;
  RtStartStatus status;
  RtConfig c = test_config();
  c.command_poll_ns = 50 * kMs;  // 50 ticks
  auto rt = start_or_fail(c, rec, status);
  ASSERT_NE(rt, nullptr);
  const std::uint64_t t0 = KillSwitch::now_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  rt->stop();  // counters and the recorder are final from here (no tick between two reads)
  const std::uint64_t ticks = rt->counters().ticks;
  const std::uint64_t elapsed_ns = KillSwitch::now_ns() - t0;
  EXPECT_LE(ticks, elapsed_ns / c.command_poll_ns + 2) << "woke per tick while idle";
  EXPECT_GE(ticks, 1u);
  EXPECT_EQ(rec.heartbeats.load(), ticks);
  EXPECT_GE(rec.last_heartbeat_ns.load(), t0);
}

// Sleeping until the next wheel event, the thread still applies a kill_now within the command
// poll and kills a deadline on time.
TEST(RtThread, SleepsUntilTheNextEventAndStillKillsOnTime) {
  Recorder rec;
  RtStartStatus status;
  RtConfig c = test_config();
  c.command_poll_ns = 1000 * kMs;
  auto rt = start_or_fail(c, rec, status);
  ASSERT_NE(rt, nullptr);
  SLEEPER_OR_SKIP(p);
  const std::uint64_t deadline = KillSwitch::now_ns() + 1500 * kMs;  // beyond one poll
  rec.deadline_ns[4] = deadline;
  ASSERT_TRUE(rt->arm(4, deadline, signal_target(*p)));
  const std::uint64_t seen_dead = await_death(*p);
  ASSERT_TRUE(rec.await_kill(4));
  EXPECT_GE(seen_dead + kG, deadline) << "killed more than one granularity before the deadline";
  EXPECT_EQ(rec.record[4].deadline_ns, deadline);
  // Wake-ups: the polls, the wheel's cascade and the event, then the ticks until death is
  // confirmed; far fewer than the 1500 ticks a per-tick loop makes.
  EXPECT_LE(rt->counters().ticks, 100u);
  expect_killed_by_sigkill(*p);
}

TEST(RtThread, RefusesBadSlotsAndCommandsAfterStop) {
  Recorder rec;
  RtStartStatus status;
  auto rt = start_or_fail(test_config(), rec, status);
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->arm(kSlots, KillSwitch::now_ns(), KillTarget{}).refusal, RtRefusal::bad_slot);
  rt->stop();
  EXPECT_EQ(rt->disarm(0).refusal, RtRefusal::stopped);
  rt->stop();  // idempotent
}

TEST(RtThread, KillsThroughCgroupKillInCgroupMode) {
  const Result<std::string> mountinfo_read = read_small_file("/proc/self/mountinfo");
  ASSERT_TRUE(mountinfo_read.ok()) << mountinfo_read.message();
  const std::string& mountinfo = *mountinfo_read;
  const auto mount = find_cgroup2_mount(mountinfo);
  if (!mount) GTEST_SKIP() << "no cgroup2 mount on this host";
  CgroupConfig cc;
  cc.parent_path = mount->mount_point + "/leasehold-rt-test-" + std::to_string(::getpid());
  const auto tree = CgroupTree::discover(cc);
  if (tree.mode() != KillMode::cgroup_v2_delegated) GTEST_SKIP() << tree.reason();
  {
    auto leaf = tree.create_leaf("sandbox");
    ASSERT_TRUE(leaf.ok()) << leaf.message();
    Recorder rec;
    RtStartStatus status;
    auto rt = start_or_fail(test_config(), rec, status);
    ASSERT_NE(rt, nullptr);
    SLEEPER_OR_SKIP(p, leaf->dir_fd());
    KillTarget t = signal_target(*p);
    t.cgroup_kill_fd = leaf->kill_fd();
    t.cgroup_events_fd = leaf->events_fd();
    const std::uint64_t deadline = KillSwitch::now_ns() + 30 * kMs;
    rec.deadline_ns[4] = deadline;
    ASSERT_TRUE(rt->arm(4, deadline, t));
    const std::uint64_t seen_dead = await_death(*p);
    ASSERT_TRUE(rec.await_kill(4));
    const KillRecord r = rec.record[4];
    EXPECT_EQ(r.path, KillPath::cgroup_kill);
    EXPECT_EQ(r.error, 0);
    EXPECT_GE(seen_dead + kG, deadline);
    EXPECT_GE(r.issued_ns + kG, deadline);
    EXPECT_GE(r.confirmed_ns, r.issued_ns);
    EXPECT_EQ(leaf->populated(), 0);
    const auto d = rt->disarm(4);
    while (!rt->applied(d.seq)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    expect_killed_by_sigkill(*p);
    const Status removed = leaf->remove();
    EXPECT_TRUE(removed.ok()) << removed.message();
  }
  EXPECT_EQ(::rmdir(cc.parent_path.c_str()), 0);
}

// issue 14: armed while the child waits at its gate (prepare_sandbox), the rt thread kills it at
// its deadline before its command's first instruction — through cgroup.kill of its leaf and its
// pidfd where a delegated cgroup exists (else the signals path), confirmed only when the pidfd
// reports the exit and the leaf `populated 0`; the release then finds it dead and the command
// (which would write a marker first thing) never ran.
TEST(RtThread, KillsAPreparedSandboxAtItsGateBeforeItsCommandRuns) {
  std::optional<CgroupTree> tree;
  std::optional<CgroupLeaf> leaf;
  CgroupConfig cc;
  if (const Result<std::string> mountinfo = read_small_file("/proc/self/mountinfo")) {
    if (const auto mount = find_cgroup2_mount(*mountinfo)) {
      cc.parent_path = mount->mount_point + "/leasehold-rt-gate-test-" + std::to_string(::getpid());
      tree = CgroupTree::discover(cc);
      if (tree->mode() == KillMode::cgroup_v2_delegated) {
        if (auto made = tree->create_leaf("sandbox")) leaf = std::move(made).value();
      }
    }
  }
  char dir[] = "/tmp/leasehold-rt-gate-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string marker = std::string(dir) + "/ran";
  SpawnRequest r;
  r.argv = {"sh", "-c", "echo ran > \"$0\"; exec sleep 100", marker};
  const char* path = std::getenv("PATH");
  r.env = {std::string("PATH=") + (path != nullptr ? path : kDefaultSearchPath)};
  r.cgroup_dir_fd = leaf ? leaf->dir_fd() : -1;
  SpawnError err;
  auto prepared = prepare_sandbox(r, err);
  if (!prepared && err.errno_value == ENOSYS) GTEST_SKIP() << err.message;
  ASSERT_TRUE(prepared.has_value()) << err.message;
  const SandboxProcess& p = prepared->process();
  if (leaf) {
    EXPECT_EQ(leaf->populated(), 1) << "the child waits at its gate inside its leaf";
  }
  Recorder rec;
  RtStartStatus status;
  auto rt = start_or_fail(test_config(), rec, status);
  ASSERT_NE(rt, nullptr);
  KillTarget t = signal_target(p);
  if (leaf) {
    t.cgroup_kill_fd = leaf->kill_fd();
    t.cgroup_events_fd = leaf->events_fd();
  }
  const std::uint64_t deadline = KillSwitch::now_ns() + 30 * kMs;
  rec.deadline_ns[2] = deadline;
  ASSERT_TRUE(rt->arm(2, deadline, t));
  await_death(p);
  ASSERT_TRUE(rec.await_kill(2));
  const KillRecord k = rec.record[2];
  EXPECT_EQ(k.error, 0);
  EXPECT_EQ(k.path, leaf ? KillPath::cgroup_kill : KillPath::signals);
  EXPECT_GE(k.issued_ns + kG, deadline);
  EXPECT_GE(k.confirmed_ns, k.issued_ns);
  EXPECT_GT(rec.revoked_ns[2].load(), 0u);
  if (leaf) {
    EXPECT_EQ(leaf->populated(), 0);
  }
  EXPECT_FALSE(release_sandbox(*prepared, err));
  EXPECT_EQ(err.errno_value, ESRCH) << err.message;
  EXPECT_NE(::access(marker.c_str(), F_OK), 0) << "the command ran although it was killed at its gate";
  const auto d = rt->disarm(2);
  while (!rt->applied(d.seq)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  expect_killed_by_sigkill(p);
  ::rmdir(dir);
  if (leaf) {
    const Status removed = leaf->remove();
    EXPECT_TRUE(removed.ok()) << removed.message();
    leaf.reset();
    EXPECT_EQ(::rmdir(cc.parent_path.c_str()), 0);
  } else if (!cc.parent_path.empty()) {
    ::rmdir(cc.parent_path.c_str());  // created by discover() where cgroups are not delegated
  }
}

TEST(RtThread, FallsBackToNormalPriorityWithALoudWarning) {
  Recorder rec;
  RtConfig c = test_config();
  c.priority = 50;
  c.cpu = 0;
  c.lock_memory = true;
  c.system.set_fifo = [](int) { return -EPERM; };
  c.system.lock_memory = [] { return -ENOMEM; };
  c.system.pin_to_cpu = [](int) { return -EINVAL; };
  RtStartStatus status;
  auto rt = start_or_fail(c, rec, status);
  ASSERT_NE(rt, nullptr);
  EXPECT_FALSE(status.fifo);
  EXPECT_EQ(status.fifo_error, -EPERM);
  EXPECT_FALSE(status.memory_locked);
  EXPECT_FALSE(status.pinned);
  const std::string w = status.warnings(c);
  EXPECT_NE(w.find("WARNING: rt thread runs at normal priority: SCHED_FIFO 50 refused (Operation not permitted)"),
            std::string::npos) << w;
  EXPECT_NE(w.find("mlockall failed (Cannot allocate memory)"), std::string::npos) << w;
  EXPECT_NE(w.find("not pinned to CPU 0"), std::string::npos) << w;
  // It still does its job at normal priority.
  SLEEPER_OR_SKIP(p);
  const std::uint64_t deadline = KillSwitch::now_ns() + 20 * kMs;
  rec.deadline_ns[5] = deadline;
  ASSERT_TRUE(rt->arm(5, deadline, signal_target(*p)));
  const std::uint64_t seen_dead = await_death(*p);
  EXPECT_GE(seen_dead + kG, deadline);
  expect_killed_by_sigkill(*p);
}

TEST(RtThread, RealSchedFifoAndPinningOnThisHost) {
  Recorder rec;
  RtConfig c = test_config();
  c.cpu = 0;
  RtStartStatus status;
  auto rt = start_or_fail(c, rec, status);
  ASSERT_NE(rt, nullptr);
  std::printf("rt set-up on this host: fifo=%d (%d) pinned=%d (%d)%s\n", status.fifo, status.fifo_error,
              status.pinned, status.pin_error, status.warnings(c).empty() ? "" : " with warnings");
  EXPECT_TRUE(status.fifo || status.fifo_error != 0);
  EXPECT_TRUE(status.pinned || status.pin_error != 0);
  EXPECT_EQ(status.warnings(c).empty(), status.fifo && status.pinned);
}

TEST(KillSwitch, NothingToKillIsAnError) {
  const KillRecord r = KillSwitch::kill(KillTarget{}, 123);
  EXPECT_EQ(r.path, KillPath::none);
  EXPECT_EQ(r.error, -EBADF);
  EXPECT_EQ(r.deadline_ns, 123u);
  EXPECT_EQ(KillSwitch::confirm_dead(KillTarget{}), -EBADF);
}

TEST(KillSwitch, SignalsPathKillsAndConfirms) {
  SLEEPER_OR_SKIP(p);
  const KillTarget t = signal_target(*p);
  EXPECT_EQ(KillSwitch::confirm_dead(t), 0);
  const KillRecord r = KillSwitch::kill(t, KillSwitch::now_ns());
  EXPECT_EQ(r.path, KillPath::signals);
  EXPECT_EQ(r.error, 0);
  EXPECT_GE(r.issued_ns, r.deadline_ns);
  await_death(*p);
  EXPECT_EQ(KillSwitch::confirm_dead(t), 1);
  expect_killed_by_sigkill(*p);
}

}  // namespace
}  // namespace leasehold
