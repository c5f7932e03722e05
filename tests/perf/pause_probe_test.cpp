// `leasehold pause-probe --standalone` end to end, with a tiny worst-phase sweep: two pauses under
// the pause budget and one well past it (DESIGN.md "Time"). Real processes on loopback: lockd, a
// supervisor (frozen by cgroup v2 freeze, or SIGSTOP where that is unavailable), the probe
// sandbox and the contender.
//
// Timing: ttl 800 ms, kill_after 480 ms → budget = 800 − (480·1.001 + 1 + 50) = 268.5 ms. The
// worst phase starts the freeze 10 ms before valid_until, so lockd's expiry lies ~310 ms into
// the freeze: a 650 ms pause must let the contender in, and recovery must then end the overlap.
#include "leasehold/harness/process.hpp"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct ProbeRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

using leasehold::harness::slurp;
using namespace std::chrono_literals;

ProbeRun run_probe(const std::string& dir, const std::vector<std::string>& extra) {
  std::string cmd = std::string(LEASEHOLD_CLI_BINARY) + " pause-probe --standalone --lockd-bin " +
                    LEASEHOLD_LOCKD_BINARY + " --supervisor-bin " + LEASEHOLD_SUPERVISOR_BINARY + " --out " + dir;
  for (const auto& e : extra) cmd += " " + e;
  cmd += " >" + dir + ".stdout 2>" + dir + ".stderr";
  ProbeRun r;
  const int status = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(dir + ".stdout");
  r.err = slurp(dir + ".stderr");
  return r;
}

// Runs a shell command line with stdout/stderr captured in <base>.stdout / <base>.stderr.
ProbeRun run_shell(const std::string& cmd, const std::string& base) {
  const int status = std::system((cmd + " >" + base + ".stdout 2>" + base + ".stderr").c_str());
  ProbeRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".stdout");
  r.err = slurp(base + ".stderr");
  return r;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::stringstream ss(s);
  while (std::getline(ss, cur, sep)) out.push_back(cur);
  return out;
}

class PauseProbe : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pause-probe-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::system(("rm -rf " + dir_ + " " + dir_ + "-out " + dir_ + "-out.stdout " + dir_ + "-out.stderr").c_str());
  }
  std::string dir_;
};

TEST_F(PauseProbe, StandaloneSweepAgreesWithTheSafetyCondition) {
  const std::string out = dir_ + "-out";
  const ProbeRun r = run_probe(out, {"--ttl-ms 800", "--kill-after-ms 480", "--heartbeat-interval-ms 120",
                                "--kill-latency-budget-ms 50", "--pauses 0,100,650", "--phase worst", "--json",
                                "--quiet"});
  if (r.exit_code != 0 && (r.err.find("io_uring") != std::string::npos))
    GTEST_SKIP() << "the supervisor cannot run here (io_uring unavailable): " << r.err;
  ASSERT_EQ(r.exit_code, 0) << "stderr:\n" << r.err << "\nstdout:\n" << r.out;

  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("mode"), "standalone");
  EXPECT_EQ(j.at("phase"), "worst");
  EXPECT_NEAR(j.at("budget").at("configured_ms").get<double>(), 268.52, 0.01);
  const auto& v = j.at("verdict");
  EXPECT_TRUE(v.at("ok").get<bool>()) << v.dump();
  EXPECT_EQ(v.at("trials"), 3);
  EXPECT_EQ(v.at("errors"), 0) << j.at("trials").dump(2);
  EXPECT_EQ(v.at("violations_under_budget"), 0);
  EXPECT_EQ(v.at("side_effects_accepted"), 0);

  const auto& trials = j.at("trials");
  ASSERT_EQ(trials.size(), 3u);
  for (int i = 0; i < 2; ++i) {  // under the budget: no violation; a kill, if any, before expiry
    const auto& t = trials[i];
    SCOPED_TRACE(t.dump());
    EXPECT_TRUE(t.at("pause_ms").is_number_integer());
    EXPECT_EQ(t.at("pause_ms").get<int>(), i == 0 ? 0 : 100);
    EXPECT_EQ(t.at("under_budget"), true);
    EXPECT_EQ(t.at("violation"), false);
    EXPECT_TRUE(t.at("window_ms").is_null());
    const std::string outcome = t.at("outcome");
    EXPECT_TRUE(outcome == "kept" || outcome == "killed-before-expiry") << outcome;
    if (t.at("killed") == true) {
      EXPECT_EQ(t.at("killed_before_expiry"), true);
      EXPECT_GT(t.at("margin_ms").get<double>(), 0.0);
    } else {
      EXPECT_EQ(t.at("killed"), false);
      EXPECT_TRUE(t.at("killed_before_expiry").is_null());
    }
    EXPECT_EQ(t.at("side_effects_refused"), true);
  }
  {  // well past the budget: the contender got in, and recovery killed the sandbox after the thaw
    const auto& t = trials[2];
    SCOPED_TRACE(t.dump());
    EXPECT_EQ(t.at("under_budget"), false);
    EXPECT_EQ(t.at("violation"), true);
    EXPECT_EQ(t.at("outcome"), "violation");
    EXPECT_EQ(t.at("outcome_code"), 2);
    EXPECT_EQ(t.at("killed"), true);
    EXPECT_GT(t.at("window_ms").get<double>(), 0.0);
    ASSERT_TRUE(t.at("recovery_ms").is_number()) << t.at("recovery_ms");
    EXPECT_GE(t.at("recovery_ms").get<double>(), 0.0);
    const auto& ns = t.at("ns");
    EXPECT_GT(ns.at("death").get<std::int64_t>(), ns.at("thaw").get<std::int64_t>());
    EXPECT_LT(ns.at("grant_recv").get<std::int64_t>(), ns.at("thaw").get<std::int64_t>());
    // The sandbox's own check_deadline refused from valid_until on, while the supervisor was frozen.
    EXPECT_EQ(t.at("side_effects_refused"), true);
    ASSERT_TRUE(t.at("refusal_lag_ms").is_number()) << t.at("refusal_lag_ms");
    EXPECT_LT(ns.at("valid_until").get<std::int64_t>(), ns.at("grant_send").get<std::int64_t>());
  }

  // The CSV: header and one row per pause.
  const std::string csv = slurp(j.at("files").at("csv").get<std::string>());
  const auto lines = split(csv, '\n');
  ASSERT_EQ(lines.size(), 4u) << csv;
  EXPECT_EQ(lines[0].rfind("pause_ms,phase,outcome,outcome_code,under_budget,killed,killed_by,", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("0,worst,", 0), 0u);
  EXPECT_EQ(lines[2].rfind("100,worst,", 0), 0u);
  EXPECT_EQ(lines[3].rfind("650,worst,violation,", 0), 0u);

  // The plot: PNG through gnuplot, or the SVG fallback; not empty.
  const std::string plot = j.at("files").at("plot");
  struct stat st {};
  ASSERT_EQ(::stat(plot.c_str(), &st), 0) << plot;
  EXPECT_GT(st.st_size, 1000);
}

// A bound for a hung run (a probe, a file awaited), not a timing the test relies on.
constexpr auto kHungRunBound = 120'000ms;

// Runs `sh -c cmd` as a child of the test (killed with the test); wait_child() gives its exit code.
leasehold::harness::Process spawn_child(const std::string& cmd) {
  leasehold::harness::Process p;
  leasehold::harness::Spawn s;
  s.argv = {"/bin/sh", "-c", cmd};
  s.own_process_group = false;  // the probe's own signals reach only it (`exec`)
  const leasehold::Status started = p.start(s);
  EXPECT_TRUE(started.ok()) << started.message();
  return p;
}
int wait_child(leasehold::harness::Process& p) { return p.wait(kHungRunBound); }
// Polls `path` until it contains `needle`.
bool wait_for_text(const std::string& path, const std::string& needle) {
  return leasehold::harness::eventually([&] { return slurp(path).find(needle) != std::string::npos; }, kHungRunBound,
                                        50ms);
}
// The cgroup v2 line of /proc/PID/cgroup ("0::/...").
std::string cgroup_of(const std::string& pid) {
  for (const auto& line : split(slurp("/proc/" + pid + "/cgroup"), '\n'))
    if (line.rfind("0::", 0) == 0) return line;
  return "";
}

// External mode against one running lockd + supervisor: the probe takes every timing input
// from the supervisor's status (here a kill-latency budget and a clock-rate bound that differ
// from the probe's defaults, so the budget is 4000 - (2400 * 1.002 + 1 + 40) = 1554.2 ms; a TTL
// that long, so that a loaded machine does not make a trial's grant arrive too late to judge) and its
// lockd address; it refuses a lockd that is not the supervisor's or does not answer with the
// key, and a second probe of the same supervisor; it leaves the supervisor thawed, in its own
// cgroup; a reused --out holds only the new run's files; Ctrl-C ends the run INTERRUPTED.
TEST_F(PauseProbe, ExternalMode) {
  const std::string key = dir_ + "/k", other_key = dir_ + "/k2", ctl = dir_ + "/ctl", table = dir_ + "/table";
  ASSERT_EQ(std::system((std::string(LEASEHOLD_LOCKD_BINARY) + " --generate-key " + key + " >/dev/null").c_str()), 0);
  ASSERT_EQ(std::system((std::string(LEASEHOLD_LOCKD_BINARY) + " --generate-key " + other_key + " >/dev/null").c_str()), 0);
  // The supervisor holds only its worker key, derived from the cluster key as an operator does.
  const std::string worker_key = dir_ + "/worker.key";
  ASSERT_EQ(std::system((std::string(LEASEHOLD_LOCKD_BINARY) +
                         " --derive-worker-key --worker-id 6e719db0-0000-4000-8000-000000000001 --key-file " + key +
                         " --out " + worker_key + " >/dev/null").c_str()),
            0);
  // Both services in the background; their pids in files so TearDown-like cleanup can stop them.
  const std::string start =
      "cd " + dir_ + " && (" + LEASEHOLD_LOCKD_BINARY + " --no-config --listen 127.0.0.1:0 --key-file " + key +
      " --store lockd.db --ttl-ms 4000 >lockd.out 2>lockd.err & echo $! >lockd.pid)";
  ASSERT_EQ(std::system(start.c_str()), 0);
  std::string addr;
  for (int i = 0; i < 2400 && addr.empty(); ++i) {  // up to 120 s: only a bound for a hung start
    const std::string o = slurp(dir_ + "/lockd.out");
    if (const auto p = o.find("listening "); p != std::string::npos && o.find('\n', p) != std::string::npos)
      addr = o.substr(p + 10, o.find('\n', p) - p - 10);
    else
      ::usleep(50'000);
  }
  struct Stop {
    std::string dir;
    ~Stop() {
      std::system(("for f in " + dir + "/sup.pid " + dir + "/lockd.pid; do [ -f $f ] && kill $(cat $f) 2>/dev/null; "
                   "done; sleep 0.3").c_str());
    }
  } stop{dir_};
  ASSERT_FALSE(addr.empty()) << slurp(dir_ + "/lockd.err");
 const std::string sup = "cd " + dir_ + " && (" + LEASEHOLD_SUPERVISOR_BINARY + " --no-config --lockd " + addr + " --key-file " +
                          worker_key + " --control-socket " + ctl + " --shm " + table +
                          " --ttl-ms 4000 --kill-after-ms 2400 --heartbeat-interval-ms 600"
                          " --kill-latency-budget-ms 40 --clock-rate-bound 0.002 --isolation off >sup.out 2>sup.err & echo $! >sup.pid)";
  ASSERT_EQ(std::system(sup.c_str()), 0);
  struct stat st {};
  for (int i = 0; i < 2400 && ::stat(ctl.c_str(), &st) != 0; ++i) ::usleep(50'000);
  if (slurp(dir_ + "/sup.err").find("io_uring") != std::string::npos && ::stat(ctl.c_str(), &st) != 0)
    GTEST_SKIP() << "the supervisor cannot run here: " << slurp(dir_ + "/sup.err");
  ASSERT_EQ(::stat(ctl.c_str(), &st), 0) << slurp(dir_ + "/sup.err");
  std::string sup_pid = slurp(dir_ + "/sup.pid");
  while (!sup_pid.empty() && sup_pid.back() == '\n') sup_pid.pop_back();
  const std::string cgroup_before = cgroup_of(sup_pid);

  const std::string out = dir_ + "-out";
  // Without --lockd the probe uses the supervisor's own (its status), not $LEASEHOLD_LOCKD.
  const std::string probe = "env -u LEASEHOLD_LOCKD " + std::string(LEASEHOLD_CLI_BINARY) + " pause-probe --supervisor " +
                            ctl + " --key-file ";
  {  // a lockd that is not the supervisor's: refused at start-up, nothing run
    const ProbeRun r = run_shell(probe + key + " --lockd 127.0.0.1:9 --pauses 3000 --quiet --out " + out, out);
    EXPECT_EQ(r.exit_code, 5) << r.err;
    EXPECT_NE(r.err.find("uses lockd at " + addr + ", not 127.0.0.1:9"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
  {  // the right lockd, the wrong key: lockd drops every request, so nothing could be judged
    const ProbeRun r = run_shell(probe + other_key + " --lockd " + addr + " --pauses 3000 --quiet --out " + out, out);
    EXPECT_EQ(r.exit_code, 5) << r.err;
    EXPECT_NE(r.err.find("did not answer a stats request signed with the key file"), std::string::npos) << r.err;
  }

  // A probe holds pause-probe-<supervisor pid>.lock beside the control socket for its whole run
  // (harness/pause_trial.hpp, ProbeLock): while the test holds it, as another probe would,
  // a probe is refused and names the holder's pid. (Holding it here, rather than racing a
  // second probe against a running one, keeps the check independent of how fast either runs.)
  char real_dir[PATH_MAX];
  ASSERT_NE(::realpath(dir_.c_str(), real_dir), nullptr);
  const std::string probe_lock = std::string(real_dir) + "/pause-probe-" + sup_pid + ".lock";
  {
    const int fd = ::open(probe_lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << probe_lock << ": " << std::strerror(errno);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0) << std::strerror(errno);
    const std::string me = std::to_string(::getpid()) + "\n";
    ASSERT_EQ(::pwrite(fd, me.data(), me.size(), 0), static_cast<ssize_t>(me.size()));
    const ProbeRun r = run_shell(probe + key + " --pauses 0 --quiet --out " + out, out);
    ::close(fd);
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("another pause-probe (pid " + std::to_string(::getpid())), std::string::npos) << r.err;
  }

  // Probe A runs.
  const std::string out_a = dir_ + "-outa";
  auto a = spawn_child(probe + key + " --pauses 0,100 --json --out " + out_a + " >" + out_a + ".stdout 2>" +
                              out_a + ".stderr");
  ASSERT_GT(a.pid(), 0);
  const int a_code = wait_child(a);
  const std::string ao = slurp(out_a + ".stdout"), ae = slurp(out_a + ".stderr");
  ASSERT_NE(ae.find("[1/2] pause"), std::string::npos) << ae;
  ASSERT_EQ(a_code, 0) << "stderr:\n" << ae << "\nstdout:\n" << ao;
  nlohmann::json j = nlohmann::json::parse(ao);
  EXPECT_EQ(j.at("mode"), "external");
  EXPECT_EQ(j.at("phase"), "random");
  EXPECT_NEAR(j.at("budget").at("configured_ms").get<double>(), 1554.2, 0.01) << j.at("budget").dump();
  const auto& v = j.at("verdict");
  EXPECT_EQ(v.at("trials"), 2);
  EXPECT_EQ(v.at("errors"), 0) << j.at("trials").dump(2);
  EXPECT_EQ(v.at("violations_under_budget"), 0);
  EXPECT_EQ(v.at("side_effects_accepted"), 0);
  for (const auto& t : j.at("trials")) {
    SCOPED_TRACE(t.dump());
    EXPECT_EQ(t.at("under_budget"), true);
    EXPECT_EQ(t.at("violation"), false);
  }
  // The supervisor is back in the cgroup it started in, and the probe's leaf is gone.
  EXPECT_EQ(cgroup_of(sup_pid), cgroup_before);
  EXPECT_EQ(cgroup_before.find("leasehold-pause"), std::string::npos) << cgroup_before;

  {  // --out reused: only this run's files
    const ProbeRun r = run_shell(probe + key + " --pauses 0 --json --quiet --out " + out_a, out_a);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("verdict").at("trials"), 1);
    EXPECT_EQ(j.at("verdict").at("errors"), 0) << j.at("trials").dump(2);
    EXPECT_EQ(split(slurp(out_a + "/pause-probe.csv"), '\n').size(), 2u);
    EXPECT_TRUE(::stat((out_a + "/sandbox-logs/sandbox-0-0ms.log").c_str(), &st) == 0);
    EXPECT_FALSE(::stat((out_a + "/sandbox-logs/sandbox-3-100ms.log").c_str(), &st) == 0);  // run A's second trial
  }

  {  // Ctrl-C during a trial: cleaned up, the verdict says INTERRUPTED, exit 1. (A pause no
     // loaded machine can outlast before the SIGINT lands: the trial must still be running.)
    auto c = spawn_child("exec " + probe + key + " --pauses 600000 --json --out " + out + " >" + out +
                                ".stdout 2>" + out + ".stderr");
    ASSERT_GT(c.pid(), 0);
    const bool c_started = wait_for_text(out + ".stderr", "[1/1] pause");
    {  // the running probe holds its lock, with its pid in it
      const int fd = ::open(probe_lock.c_str(), O_RDWR | O_CLOEXEC);
      EXPECT_GE(fd, 0) << probe_lock << ": " << std::strerror(errno);
      if (fd >= 0) {
        const int rc = ::flock(fd, LOCK_EX | LOCK_NB);
        const int err = errno;
        ::close(fd);
        EXPECT_NE(rc, 0);
        EXPECT_EQ(err, EWOULDBLOCK) << std::strerror(err);
      }
      const std::string owner = slurp(probe_lock);
      EXPECT_EQ(owner.substr(0, owner.find('\n')), std::to_string(c.pid()));
    }
    c.signal(SIGINT);
    EXPECT_EQ(wait_child(c), 1);
    ASSERT_TRUE(c_started) << slurp(out + ".stderr");
    j = nlohmann::json::parse(slurp(out + ".stdout"));
    EXPECT_EQ(j.at("interrupted"), true);
    EXPECT_EQ(j.at("verdict").at("ok"), false);
    EXPECT_EQ(j.at("verdict").at("line").get<std::string>().rfind("INTERRUPTED after 0 of 1 trial(s)", 0), 0u)
        << j.at("verdict").dump();
    EXPECT_EQ(cgroup_of(sup_pid), cgroup_before);
    // No trial finished, so there was no point to draw: the plot is an SVG, and no empty PNG.
    const std::string plot = j.at("files").at("plot");
    ASSERT_EQ(::stat(plot.c_str(), &st), 0) << plot;
    EXPECT_GT(st.st_size, 0);
    EXPECT_NE(::stat((out + "/pause-probe.png").c_str(), &st) == 0 && st.st_size == 0, true);
  }
  {  // A probe SIGKILLed mid-freeze leaves the supervisor frozen in its leaf: the next probe thaws it
    std::string mount;
    for (const auto& line : split(slurp("/proc/self/mounts"), '\n')) {
      const auto f = split(line, ' ');
      if (f.size() > 2 && f[2] == "cgroup2") mount = f[1];
    }
    std::string rel = cgroup_before.substr(3);
    if (rel == "/") rel.clear();
    const std::string leaf = mount + rel + "/leasehold-pause-" + sup_pid;
    if (mount.empty()) std::printf("skipped the left-frozen case: no cgroup2 mount\n");
    if (!mount.empty()) {
      ASSERT_EQ(::mkdir(leaf.c_str(), 0755), 0) << leaf << ": " << std::strerror(errno);
      std::ofstream(leaf + "/cgroup.procs") << sup_pid;
      std::ofstream(leaf + "/cgroup.freeze") << "1";
      const bool frozen = wait_for_text(leaf + "/cgroup.events", "frozen 1");
      const ProbeRun r = run_shell(probe + key + " --pauses 0 --json --quiet --out " + out, out);
      EXPECT_TRUE(frozen);
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_NE(r.err.find("thawed supervisor pid " + sup_pid + ", left frozen in " + leaf), std::string::npos) << r.err;
      EXPECT_EQ(cgroup_of(sup_pid), cgroup_before);
      EXPECT_NE(::stat(leaf.c_str(), &st), 0) << "the leaf is removed";
      ::rmdir(leaf.c_str());
    }
  }
  // The running supervisor is left running, thawed, and still answers.
  const std::string still = std::string(LEASEHOLD_CLI_BINARY) + " sandboxes --supervisor " + ctl + " >/dev/null 2>&1";
  EXPECT_EQ(std::system(still.c_str()), 0);
  std::system(("rm -rf " + out + " " + out + ".stdout " + out + ".stderr " + out_a + " " + out_a + ".stdout " + out_a +
               ".stderr").c_str());
}

// Every one of these is refused before anything starts: exit 2, a message naming the problem,
// and no output directory content (nothing ran).
TEST_F(PauseProbe, BadInputIsRefusedWithAReason) {
  const std::string out = dir_ + "-out";
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--pauses 10,,20"}, "empty pause length"},
      {{"--pauses ''"}, "--pauses: empty pause length"},
      {{"--ttl-ms 1000", "--kill-after-ms 990", "--heartbeat-interval-ms 100"}, "unsafe timing"},
      {{"--clock-rate-bound -1"}, "--clock-rate-bound -1 is out of range 0..0.1"},
      {{"--clock-rate-bound nan"}, "--clock-rate-bound nan is out of range"},
      {{"--guard-ms 5000"}, "--guard-ms 5000 must be below kill_after (1400 ms)"},
      {{"--ttl-ms 1000", "--heartbeat-interval-ms 400"}, "refresh attempt"},
      {{"--supervisor /nonexistent.sock"}, "--standalone starts its own lockd and supervisor"},
  };
  for (const auto& c : cases) {
    const ProbeRun r = run_probe(out, c.args);
    SCOPED_TRACE(c.args.front());
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("starting lockd"), std::string::npos) << r.err;
  }

  // --out is a regular file: refused at once.
  const std::string file = dir_ + "/a-file";
  std::ofstream(file) << "x";
  ProbeRun r = run_probe(file, {"--pauses 0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--out " + file + " exists and is not a directory"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(file), "x");

  // External mode: standalone-only flags, and a key file that does not exist.
  const std::string cli = std::string(LEASEHOLD_CLI_BINARY) + " pause-probe --supervisor " + dir_ + "/no.sock --key-file ";
  r = run_shell(cli + dir_ + "/no-key --ttl-ms 900 --guard-ms 5 --out " + out, out);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--ttl-ms, --guard-ms: standalone only"), std::string::npos) << r.err;
  r = run_shell(cli + dir_ + "/no-key --out " + out, out);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("key file " + dir_ + "/no-key: cannot open"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("`leasehold-lockd --generate-key PATH`"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("create one with `leasehold-lockd --generate-key"), std::string::npos) << r.err;
}

}  // namespace
