// The pause-probe's pieces that run without a deployment: the probe lock (one probe per
// supervisor), the slot monitor on a real child and an in-memory slot, the histogram snapshots,
// the sandbox's environment and its refusals, and the SVG plot on disk. The trials themselves run end to end in
// tests/perf/pause_probe_test.cpp.
#include "leasehold/harness/pause_output.hpp"
#include "leasehold/harness/pause_sandbox.hpp"
#include "leasehold/harness/pause_trial.hpp"
#include "leasehold/harness/process.hpp"
#include "leasehold/shm/layout.hpp"

#include <gtest/gtest.h>

#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

namespace leasehold::harness {
namespace {

using namespace std::chrono_literals;

std::string real_dir(const TempDir& dir) {
  char real[PATH_MAX];
  EXPECT_NE(::realpath(dir.path().c_str(), real), nullptr);
  return real;
}

TEST(HarnessPauseTrial, OneProbeLockPerSupervisorNamingTheHolder) {
  TempDir dir("harness-probe-lock");
  const std::string socket = dir.path().string() + "/supervisor.sock";
  const std::string me = std::to_string(::getpid());
  auto first = ProbeLock::take(4242, socket);
  ASSERT_TRUE(first.ok()) << first.message();
  const std::string path = real_dir(dir) + "/pause-probe-4242.lock";
  EXPECT_EQ((*first)->path(), path);
  EXPECT_EQ(slurp(path), me + "\n");

  const auto second = ProbeLock::take(4242, socket);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.code(), Errc::busy);
  EXPECT_EQ(second.message(), "another pause-probe (pid " + me + ") is already probing the supervisor (pid 4242, " +
                                  socket + "); two probes would freeze it in each other's pauses. Wait for it to "
                                  "finish (lock: " + path + ")");

  // Another supervisor's lock is another file.
  const auto other = ProbeLock::take(4243, socket);
  ASSERT_TRUE(other.ok()) << other.message();
  EXPECT_EQ((*other)->path(), real_dir(dir) + "/pause-probe-4243.lock");

  first = Status{Errc::not_found, "released"};  // the lock goes with the object
  const auto again = ProbeLock::take(4242, socket);
  ASSERT_TRUE(again.ok()) << again.message();
  EXPECT_TRUE(fs::exists(path));  // left in place: unlinking would race the next probe
}

TEST(HarnessPauseTrial, SlotMonitorSeesRefreshesTheRevokedBitAndTheDeath) {
  Process child;
  Spawn spec;
  spec.argv = {"/bin/sleep", "600"};
  ASSERT_TRUE(child.start(spec).ok());
  const int pidfd = pidfd_open(child.pid());
  ASSERT_GE(pidfd, 0);

  shm::Slot slot{};
  slot.check_word.store(7);
  slot.valid_until_ns.store(1'000);
  ObserverPriority normal(0);
  SlotMonitor monitor(pidfd, &slot, normal);
  EXPECT_EQ(monitor.valid_until_ns(), 1'000u);
  const std::int64_t t0 = now_ns();
  // Moved until a change is seen (the monitor's thread reads its first value when it starts).
  std::uint64_t vu = 5'000;
  ASSERT_TRUE(eventually(
      [&] {
        slot.valid_until_ns.store(++vu);
        return monitor.refreshed_after(t0, 1'000) != 0;
      },
      5'000ms, 1ms));
  const std::int64_t seen = monitor.refreshed_after(t0, 1'000);
  EXPECT_GE(seen, t0);
  EXPECT_LE(seen, now_ns());
  EXPECT_EQ(monitor.refreshed_after(t0, vu), 0);               // never above the last value
  EXPECT_EQ(monitor.refreshed_after(now_ns() + 1'000'000, 1'000), 0);  // nothing after that time
  EXPECT_EQ(monitor.revoked_ns(), 0);

  slot.check_word.store(7 | shm::kRevokedBit);
  ASSERT_TRUE(eventually([&] { return monitor.revoked_ns() != 0; }, 5'000ms, 1ms));
  EXPECT_GE(monitor.revoked_ns(), t0);
  EXPECT_EQ(monitor.death_ns(), 0);

  const std::int64_t before_kill = now_ns();
  child.signal(SIGKILL);
  ASSERT_TRUE(eventually([&] { return monitor.death_ns() != 0; }, 5'000ms, 1ms));
  EXPECT_GE(monitor.death_ns(), before_kill);
  EXPECT_FALSE(normal.refused());  // priority 0 asks for nothing
  ::close(pidfd);
}

TEST(HarnessPauseTrial, SnapshotsCopyEveryHistogramField) {
  shm::Histogram h{};
  h.count.store(3);
  h.sum.store(1'500);
  h.max.store(1'000);
  h.buckets[9].store(2);
  h.buckets[10].store(1);
  const pause::HistogramSnapshot s = snapshot_of(h);
  EXPECT_EQ(s.count, 3u);
  EXPECT_EQ(s.sum, 1'500u);
  EXPECT_EQ(s.max, 1'000u);
  EXPECT_EQ(s.buckets[9], 2u);
  EXPECT_EQ(s.buckets[10], 1u);
  EXPECT_EQ(s.buckets[0], 0u);
}

TEST(HarnessPauseTrial, SandboxEnvironmentHasPathAndTheSanitizerOptions) {
  const char* path = std::getenv("PATH");
  const std::string saved = path != nullptr ? path : "";
  ::setenv("TSAN_OPTIONS", "halt_on_error=1", 1);
  ::unsetenv("UBSAN_OPTIONS");
  auto env = sandbox_env();
  EXPECT_EQ(env["TSAN_OPTIONS"], "halt_on_error=1");
  EXPECT_EQ(env.count("UBSAN_OPTIONS"), 0u);
  if (path != nullptr) {
    EXPECT_EQ(env["PATH"], saved);
  }
  ::unsetenv("PATH");
  env = sandbox_env();
  EXPECT_EQ(env["PATH"], "/usr/bin:/bin");
  if (path != nullptr) ::setenv("PATH", saved.c_str(), 1);
  ::unsetenv("TSAN_OPTIONS");
}

TEST(HarnessPauseSandbox, RefusesToRunOutsideANamedSandboxAndSaysWhyInItsLog) {
  TempDir dir("harness-pause-sandbox");
  ::unsetenv("LEASEHOLD_SLOT");
  PauseSandboxOptions o;
  o.log = dir.path().string() + "/sandbox.log";
  const Status st = run_pause_sandbox(o);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Errc::invalid_argument);
  EXPECT_EQ(st.message(), "LEASEHOLD_SHM, LEASEHOLD_SLOT and LEASEHOLD_EPOCH must be set (run it as a named sandbox)");
  EXPECT_EQ(slurp(o.log), "# error: " + st.message() + "\n");

  o.log = dir.path().string() + "/no-such-dir/sandbox.log";
  const Status no_log = run_pause_sandbox(o);
  EXPECT_EQ(no_log.code(), Errc::invalid_argument);
  EXPECT_EQ(no_log.message(), "cannot open " + o.log + ": No such file or directory");
}

TEST(HarnessPausePlot, SvgModeWritesTheSelfDrawnPlot) {
  TempDir dir("harness-pause-plot");
  pause::SweepReport rep;
  rep.timing.ttl_ms = 2000;
  rep.timing.kill_after_ms = 1400;
  rep.timing.heartbeat_interval_ms = 200;
  std::string warned;
  const auto plot = write_plot(rep, dir.path().string(), dir.path().string() + "/pause-probe.csv", "svg",
                               [&](const std::string& w) { warned += w; });
  ASSERT_TRUE(plot.ok()) << plot.message();
  EXPECT_EQ(*plot, dir.path().string() + "/pause-probe.svg");
  EXPECT_EQ(slurp(*plot), pause::svg_plot(rep));
  EXPECT_EQ(warned, "");
  EXPECT_FALSE(fs::exists(dir.path() / "pause-probe.gp"));  // no gnuplot asked for

  const auto nowhere = write_plot(rep, dir.path().string() + "/missing", "x.csv", "svg", [](const std::string&) {});
  ASSERT_FALSE(nowhere.ok());
  EXPECT_EQ(nowhere.message(), "cannot write " + dir.path().string() + "/missing/pause-probe.svg: No such file or directory");
}

// With gnuplot: the PNG is drawn, and the script it ran names no absolute path (it runs in the
// output directory), so the directory can be moved and the script run again there.
TEST(HarnessPausePlot, PngModeRunsAScriptWithoutAbsolutePaths) {
  if (find_program("gnuplot").empty()) GTEST_SKIP() << "gnuplot is not installed";
  TempDir dir("harness-pause-png");
  pause::SweepReport rep;
  rep.timing.ttl_ms = 2000;
  rep.timing.kill_after_ms = 1400;
  rep.timing.heartbeat_interval_ms = 200;
  pause::TrialObservation o;
  o.pause_ms = 100;
  o.freeze_ns = 1'000'000'000;
  o.thaw_ns = o.freeze_ns + 100'000'000;
  rep.observations = {o};
  pause::TrialResult r;
  r.outcome = pause::Outcome::kept;
  rep.results = {r};
  const std::string csv = dir.path().string() + "/pause-probe.csv";
  ASSERT_TRUE(write_file(csv, pause::to_csv(rep)).ok());
  std::string warned;
  const auto plot = write_plot(rep, dir.path().string(), csv, "png", [&](const std::string& w) { warned += w; });
  ASSERT_TRUE(plot.ok()) << plot.message();
  EXPECT_EQ(*plot, dir.path().string() + "/pause-probe.png") << warned;
  const std::string gp = slurp(dir.path() / "pause-probe.gp");
  EXPECT_NE(gp.find("set output 'pause-probe.png'"), std::string::npos) << gp;
  EXPECT_NE(gp.find("'pause-probe.csv' every ::1"), std::string::npos) << gp;
  EXPECT_EQ(gp.find("'/"), std::string::npos) << gp;  // no quoted absolute path
  EXPECT_EQ(gp.find(dir.path().string()), std::string::npos) << gp;
}

}  // namespace
}  // namespace leasehold::harness
