#include "leasehold/harness/process.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <stdexcept>

namespace leasehold::harness {
namespace {

using namespace std::chrono_literals;

Spawn sh(const std::string& script, const TempDir& dir) {
  Spawn s;
  s.argv = {"/bin/sh", "-c", script};
  s.stdout_path = dir.path() / "out";
  s.stderr_path = dir.path() / "err";
  return s;
}

// Process::start as an assertion: the failure's message when it does not start.
::testing::AssertionResult started(Process& p, const Spawn& s) {
  const Status st = p.start(s);
  if (st.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << st.message();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

TEST(HarnessFiles, SlurpReadsAWholeFileUpToItsBound) {
  TempDir dir("harness-test");
  write(dir.path() / "f", "abc\ndef\n");
  EXPECT_EQ(slurp(dir.path() / "f"), "abc\ndef\n");
  EXPECT_EQ(slurp(dir.path() / "f", 5), "abc\nd");
  EXPECT_EQ(slurp(dir.path() / "missing"), "");
}

TEST(HarnessFiles, TailLinesKeepsTheLastLines) {
  EXPECT_EQ(tail_lines("a\nb\nc\n", 2), "b\nc\n");
  EXPECT_EQ(tail_lines("a\nb\nc", 2), "b\nc");
  EXPECT_EQ(tail_lines("a\nb\n", 5), "a\nb\n");
  EXPECT_EQ(tail_lines("", 3), "(empty)");
}

TEST(HarnessFiles, TempDirIsPrivateAndRemovedUnlessKept) {
  fs::path kept;
  {
    TempDir dir("harness-test");
    struct stat st {};
    ASSERT_EQ(::stat(dir.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_EQ(dir.path().string().rfind("/tmp/harness-test-", 0), 0u) << dir.path();
    write(dir.path() / "f", "x");
    fs::create_directory(dir.path() / "sub");
    kept = dir.path();
  }
  EXPECT_FALSE(fs::exists(kept));
  {
    TempDir dir("harness-test");
    dir.keep();
    kept = dir.path();
  }
  EXPECT_TRUE(fs::exists(kept));
  fs::remove_all(kept);
  EXPECT_THROW(TempDir("no/such/dir/below/tmp"), std::runtime_error);
}

TEST(HarnessClock, EventuallyPollsUntilTrueOrTheTimeout) {
  int calls = 0;
  EXPECT_TRUE(eventually([&] { return ++calls == 3; }, 5'000ms, 1ms));
  EXPECT_EQ(calls, 3);
  int ticks = 0;
  const std::int64_t t0 = now_ns();
  EXPECT_FALSE(eventually([] { return false; }, 50ms, 5ms, [&] { ++ticks; }));
  const std::int64_t took_ms = (now_ns() - t0) / kNsPerMs;
  EXPECT_GE(took_ms, 50);
  EXPECT_LT(took_ms, 5'000);
  EXPECT_GE(ticks, 2);
  EXPECT_THROW(eventually([] { return false; }, 1'000ms, 1ms, [] { throw std::runtime_error("stop"); }),
               std::runtime_error);
}

TEST(HarnessClock, SleepMsSleepsOnBoottime) {
  const std::int64_t t0 = now_ns();
  sleep_ms(20);
  EXPECT_GE(now_ns() - t0, 20 * kNsPerMs);
  const std::int64_t t1 = now_ns();
  sleep_ms(-5);
  EXPECT_LT(now_ns() - t1, 1'000 * kNsPerMs);
}

TEST(HarnessClock, SleepUntilTicksAtLeastEveryTenMilliseconds) {
  const std::int64_t t0 = now_ns();
  int ticks = 0;
  sleep_until_ns(t0 + 55 * kNsPerMs, [&] { ++ticks; });
  const std::int64_t took = now_ns() - t0;
  EXPECT_GE(took, 55 * kNsPerMs);
  EXPECT_LT(took, 5'000 * kNsPerMs);
  EXPECT_GE(ticks, 6);  // 55 ms in slices of at most 10 ms, plus the first tick
  int past_ticks = 0;
  sleep_until_ns(t0, [&] { ++past_ticks; });  // already past: one tick, no sleep
  EXPECT_EQ(past_ticks, 1);
  EXPECT_THROW(sleep_until_ns(now_ns() + 10'000 * kNsPerMs, [] { throw std::runtime_error("stop"); }),
               std::runtime_error);
}

TEST(HarnessFiles, WriteFileReplacesTheContentOrNamesThePath) {
  TempDir dir("harness-test");
  const fs::path f = dir.path() / "report.csv";
  ASSERT_TRUE(write_file(f, "a much longer first content\n").ok());
  ASSERT_TRUE(write_file(f, "short\n").ok());
  EXPECT_EQ(slurp(f), "short\n");
  const fs::path missing = dir.path() / "no-such-dir" / "x";
  const Status st = write_file(missing, "x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Errc::not_found) << st.message();
  EXPECT_EQ(st.message(), "cannot write " + missing.string() + ": No such file or directory");
}

TEST(HarnessFiles, DirOfIsEverythingBeforeTheLastSlash) {
  EXPECT_EQ(dir_of("/run/leasehold/supervisor.sock"), "/run/leasehold");
  EXPECT_EQ(dir_of("out/pause-probe.csv"), "out");
  EXPECT_EQ(dir_of("pause-probe.csv"), ".");
  EXPECT_EQ(dir_of("/x"), "");
  EXPECT_EQ(dir_of("a/b/"), "a/b");
}

TEST(HarnessProcess, RunsWithItsEnvironmentAndOutputsInFiles) {
  TempDir dir("harness-test");
  Spawn s = sh("echo out=$LH_HARNESS_X; echo err >&2; exit 3", dir);
  s.env = {{"LH_HARNESS_X", "forty two"}};
  Process p;
  ASSERT_TRUE(started(p, s));
  EXPECT_GT(p.pid(), 0);
  EXPECT_EQ(p.wait(10'000ms), 3);
  EXPECT_EQ(p.exit_code(), 3);
  EXPECT_EQ(p.pid(), -1);
  EXPECT_FALSE(p.running());
  EXPECT_EQ(p.out(), "out=forty two\n");
  EXPECT_EQ(p.err(), "err\n");
}

TEST(HarnessProcess, OneFileForBothStreamsAndAppend) {
  TempDir dir("harness-test");
  Spawn s = sh("echo one; echo two >&2", dir);
  s.stderr_path = s.stdout_path;
  Process p;
  ASSERT_TRUE(started(p, s));
  ASSERT_EQ(p.wait(10'000ms), 0);
  EXPECT_EQ(slurp(s.stdout_path), "one\ntwo\n");
  s.append_stdout = true;
  ASSERT_TRUE(started(p, s));
  ASSERT_EQ(p.wait(10'000ms), 0);
  EXPECT_EQ(slurp(s.stdout_path), "one\ntwo\none\ntwo\n");
  s.append_stdout = false;
  ASSERT_TRUE(started(p, s));
  ASSERT_EQ(p.wait(10'000ms), 0);
  EXPECT_EQ(slurp(s.stdout_path), "one\ntwo\n");
}

TEST(HarnessProcess, BadSpecsAndExecFailuresAreNamed) {
  TempDir dir("harness-test");
  Process p;
  const Status empty = p.start(Spawn{});
  EXPECT_EQ(empty.code(), Errc::invalid_argument);
  EXPECT_NE(empty.message().find("empty argv"), std::string::npos) << empty.message();
  Spawn s = sh("true", dir);
  s.netns = "lh-harness-test-no-such-namespace";
  const Status netns = p.start(s);
  EXPECT_EQ(netns.code(), Errc::not_found);
  EXPECT_NE(netns.message().find("/run/netns/lh-harness-test-no-such-namespace"), std::string::npos) << netns.message();
  s = sh("true", dir);
  s.stdout_path = dir.path() / "no" / "such" / "out";
  const Status output = p.start(s);
  EXPECT_EQ(output.code(), Errc::not_found);
  EXPECT_NE(output.message().find("cannot open " + s.stdout_path.string()), std::string::npos) << output.message();
  s = sh("true", dir);
  s.argv = {(dir.path() / "not-a-program").string()};
  ASSERT_TRUE(started(p, s));
  EXPECT_EQ(p.wait(10'000ms), 127);
  EXPECT_NE(p.err().find("cannot execute " + s.argv[0]), std::string::npos) << p.err();
  s.argv = {"sh", "-c", "exit 4"};
  s.search_path = true;
  ASSERT_TRUE(started(p, s));
  EXPECT_EQ(p.wait(10'000ms), 4);
}

TEST(HarnessProcess, WaitTimesOutThenTerminateAndKill) {
  TempDir dir("harness-test");
  Process p;
  ASSERT_TRUE(started(p, sh("exec sleep 30", dir)));
  ASSERT_GE(p.pidfd(), 0);
  EXPECT_EQ(p.wait(30ms), -1);
  EXPECT_TRUE(p.running());
  p.signal(SIGSTOP);
  EXPECT_EQ(p.terminate(10'000ms), 128 + SIGTERM);  // SIGCONT first: a stopped child still ends
  EXPECT_EQ(p.terminate(), 128 + SIGTERM);           // no child: the last code
  // A child that ignores SIGTERM is killed after the grace period.
  ASSERT_TRUE(started(p, sh("trap '' TERM; echo ready; while :; do sleep 1; done", dir)));
  ASSERT_TRUE(wait_for_log_line(dir.path() / "out", "ready", 10'000ms, &p).has_value());
  EXPECT_EQ(p.terminate(100ms), 128 + SIGKILL);
  ASSERT_TRUE(started(p, sh("exec sleep 30", dir)));
  const pid_t pid = p.pid();
  const int pidfd = p.pidfd();
  p.kill9();
  EXPECT_EQ(p.exit_code(), 128 + SIGKILL);
  EXPECT_EQ(::kill(pid, 0), -1);
  EXPECT_EQ(::fcntl(pidfd, F_GETFD), -1) << "the pidfd is closed once the child is reaped";
}

TEST(HarnessProcess, AMovedProcessIsOwnedOnce) {
  TempDir dir("harness-test");
  Process a;
  ASSERT_TRUE(started(a, sh("exec sleep 30", dir)));
  const pid_t pid = a.pid();
  Process b(std::move(a));
  EXPECT_EQ(a.pid(), -1);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(b.pid(), pid);
  Process c;
  c = std::move(b);
  EXPECT_EQ(c.pid(), pid);
  EXPECT_TRUE(c.running());
  c.kill9();
  EXPECT_EQ(c.exit_code(), 128 + SIGKILL);
}

TEST(HarnessProcess, ThePidfdIsReadableOnceTheChildExits) {
  TempDir dir("harness-test");
  Process p;
  ASSERT_TRUE(started(p, sh("sleep 0.05", dir)));
  ASSERT_GE(p.pidfd(), 0);
  pollfd fd{p.pidfd(), POLLIN, 0};
  EXPECT_EQ(::poll(&fd, 1, 10'000), 1);
  EXPECT_EQ(p.wait(1'000ms), 0);
  const int own = pidfd_open(::getpid());
  EXPECT_GE(own, 0);
  ::close(own);
  EXPECT_EQ(pidfd_open(-1), -1);
}

TEST(HarnessWait, WaitsForAWholeLine) {
  TempDir dir("harness-test");
  Process p;
  // The pattern appears first in an unfinished line; only the finished line counts.
  ASSERT_TRUE(started(p, sh("printf 'a=1\\nlistening 127.0.0.1:'; sleep 0.2; printf '4711\\nmore\\n'; exec sleep 30", dir)));
  const auto line = wait_for_log_line(dir.path() / "out", "listening ", 10'000ms, p);
  ASSERT_TRUE(line.ok()) << line.message();
  EXPECT_EQ(*line, "listening 127.0.0.1:4711");
  EXPECT_EQ(wait_for_log_line(dir.path() / "out", "a=", 1'000ms), "a=1");
  EXPECT_EQ(wait_for_log_line(dir.path() / "out", "4711\n", 1'000ms), "listening 127.0.0.1:4711");
  EXPECT_EQ(wait_for_log_line(dir.path() / "out", "a=1\n", 1'000ms), "a=1");
  EXPECT_EQ(wait_for_log_line(dir.path() / "out", "a=", 20ms, nullptr, {}, 1), std::nullopt) << "before `from`";
  const std::int64_t t0 = now_ns();
  const auto never = wait_for_log_line(dir.path() / "out", "never", 50ms, p);
  EXPECT_EQ(never.code(), Errc::timeout);
  EXPECT_GE(now_ns() - t0, 50 * kNsPerMs);
  const std::string& error = never.message();
  EXPECT_NE(error.find("/bin/sh did not print \"never\" within 50 ms"), std::string::npos) << error;
  EXPECT_NE(error.find("more"), std::string::npos) << "the log's tail: " << error;
}

TEST(HarnessWait, AProcessThatExitsEndsTheWait) {
  TempDir dir("harness-test");
  Spawn s = sh("echo started; exit 5", dir);
  s.label = "the worker";
  Process p;
  ASSERT_TRUE(started(p, s));
  const std::int64_t t0 = now_ns();
  const auto ready = wait_for_log_line(dir.path() / "out", "ready", 20'000ms, p);
  EXPECT_EQ(ready.code(), Errc::refused);
  EXPECT_LT(now_ns() - t0, 10'000 * kNsPerMs) << "not the whole timeout";
  const std::string& error = ready.message();
  EXPECT_NE(error.find("the worker exited during start-up (code 5, before printing \"ready\")"), std::string::npos) << error;
  EXPECT_NE(error.find("started"), std::string::npos) << error;
  // A line printed just before the exit is still found.
  ASSERT_TRUE(started(p, sh("echo ready; exit 0", dir)));
  ASSERT_EQ(p.wait(10'000ms), 0);
  EXPECT_EQ(wait_for_log_line(dir.path() / "out", "ready", 1'000ms, &p), "ready");
}

TEST(HarnessCommand, RunCommandReturnsCodeAndOutput) {
  std::string out;
  EXPECT_EQ(run_command({"sh", "-c", "echo a; echo b >&2; exit 2"}, &out), 2);
  EXPECT_EQ(out, "a\nb\n");
  EXPECT_EQ(run_command({"lh-harness-no-such-program"}, &out), 127);
  EXPECT_NE(out.find("cannot run lh-harness-no-such-program"), std::string::npos) << out;
  const std::int64_t t0 = now_ns();
  EXPECT_EQ(run_command({"sleep", "30"}, &out, 100ms), 128 + SIGKILL);
  EXPECT_LT(now_ns() - t0, 10'000 * kNsPerMs);
  EXPECT_EQ(run_command({}, &out), 127);
}

}  // namespace
}  // namespace leasehold::harness
