// `leasehold pause-probe --standalone` end to end, with a tiny worst-phase sweep: two pauses under
// the pause budget and one well past it (DESIGN.md "Time"). Real processes on loopback: lockd, a
// supervisor (frozen by cgroup v2 freeze, or SIGSTOP where that is unavailable), the probe
// sandbox and the contender.
//
// Timing: ttl 800 ms, kill_after 480 ms → budget = 800 − (480·1.001 + 1 + 50) = 268.5 ms. The
// worst phase starts the freeze 10 ms before valid_until, so lockd's expiry lies ~310 ms into
// the freeze: a 650 ms pause must let the contender in, and recovery must then end the overlap.
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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
  const std::string csv = slurp(j.at("files").at("csv"));
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

// External mode: the probe takes every timing input from a running supervisor's status (here
// a kill-latency budget and a clock-rate bound that differ from the probe's defaults), so its
// budget is the supervisor's own: 800 - (480 * 1.002 + 1 + 40) = 278.04 ms.
TEST_F(PauseProbe, ExternalModeUsesTheRunningSupervisorsTiming) {
  const std::string key = dir_ + "/k", ctl = dir_ + "/ctl", table = dir_ + "/table";
  ASSERT_EQ(std::system((std::string(LEASEHOLD_LOCKD_BINARY) + " --generate-key " + key + " >/dev/null").c_str()), 0);
  // Both services in the background; their pids in files so TearDown-like cleanup can stop them.
  const std::string start =
      "cd " + dir_ + " && (" + LEASEHOLD_LOCKD_BINARY + " --listen 127.0.0.1:0 --key-file " + key +
      " --store lockd.db --ttl-ms 800 >lockd.out 2>lockd.err & echo $! >lockd.pid)";
  ASSERT_EQ(std::system(start.c_str()), 0);
  std::string addr;
  for (int i = 0; i < 200 && addr.empty(); ++i) {
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
  const std::string sup = "cd " + dir_ + " && (" + LEASEHOLD_SUPERVISOR_BINARY + " --lockd " + addr + " --key-file " +
                          key + " --control-socket " + ctl + " --shm " + table +
                          " --ttl-ms 800 --kill-after-ms 480 --heartbeat-interval-ms 120"
                          " --kill-latency-budget-ms 40 --clock-rate-bound 0.002 >sup.out 2>sup.err & echo $! >sup.pid)";
  ASSERT_EQ(std::system(sup.c_str()), 0);
  struct stat st {};
  for (int i = 0; i < 200 && ::stat(ctl.c_str(), &st) != 0; ++i) ::usleep(50'000);
  if (slurp(dir_ + "/sup.err").find("io_uring") != std::string::npos && ::stat(ctl.c_str(), &st) != 0)
    GTEST_SKIP() << "the supervisor cannot run here: " << slurp(dir_ + "/sup.err");
  ASSERT_EQ(::stat(ctl.c_str(), &st), 0) << slurp(dir_ + "/sup.err");

  const std::string out = dir_ + "-out";
  const std::string cmd = std::string(LEASEHOLD_CLI_BINARY) + " pause-probe --supervisor " + ctl + " --lockd " + addr +
                          " --key-file " + key + " --pauses 0,100 --json --quiet --out " + out + " >" + out +
                          ".stdout 2>" + out + ".stderr";
  const int status = std::system(cmd.c_str());
  const std::string o = slurp(out + ".stdout"), e = slurp(out + ".stderr");
  ASSERT_TRUE(WIFEXITED(status)) << e;
  ASSERT_EQ(WEXITSTATUS(status), 0) << "stderr:\n" << e << "\nstdout:\n" << o;
  const nlohmann::json j = nlohmann::json::parse(o);
  EXPECT_EQ(j.at("mode"), "external");
  EXPECT_EQ(j.at("phase"), "random");
  EXPECT_NEAR(j.at("budget").at("configured_ms").get<double>(), 278.04, 0.01) << j.at("budget").dump();
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
  // The running supervisor is left running, thawed, and still answers.
  const std::string still = std::string(LEASEHOLD_CLI_BINARY) + " sandboxes --supervisor " + ctl + " >/dev/null 2>&1";
  EXPECT_EQ(std::system(still.c_str()), 0);
  std::system(("rm -rf " + out + " " + out + ".stdout " + out + ".stderr").c_str());
}

TEST_F(PauseProbe, BadInputIsRefusedWithAReason) {
  const std::string out = dir_ + "-out";
  ProbeRun r = run_probe(out, {"--pauses 10,,20"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("empty pause length"), std::string::npos) << r.err;
  r = run_probe(out, {"--ttl-ms 1000", "--kill-after-ms 990", "--heartbeat-interval-ms 100"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("safety"), std::string::npos) << r.err;
}

}  // namespace
