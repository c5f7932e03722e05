// The pause-probe's deployment pieces that need no running process (harness/pause_deployment.cpp):
// reading the supervisor's status answer, the address and key checks, the output directory, ρ's
// text. The pieces that start or talk to lockd and the supervisor run end to end in
// tests/perf/pause_probe_test.cpp.
#include "leasehold/harness/pause_deployment.hpp"
#include "leasehold/harness/process.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

namespace leasehold::harness {
namespace {

namespace fs = std::filesystem;

nlohmann::json status_answer() {
  return nlohmann::json{{"ok", true},
                        {"pid", 4321},
                        {"shm", "/proc/4321/fd/7"},
                        {"lockd", "127.0.0.1:7000"},
                        {"ttl_ms", 10'000},
                        {"kill_after_ms", 7'000},
                        {"heartbeat_interval_ms", 1'000},
                        {"rt", {{"granularity_ns", 1'000'000}}},
                        {"clock_rate_bound", 0.001},
                        {"kill_latency_budget_ms", 50}};
}

TEST(HarnessPauseDeployment, ReadStatusFillsTheDeploymentAndAnOverrideWins) {
  PauseDeployment d;
  ASSERT_TRUE(read_status(status_answer(), {}, d).ok());
  EXPECT_EQ(d.supervisor_pid, 4321);
  EXPECT_EQ(d.shm_path, "/proc/4321/fd/7");
  EXPECT_EQ(d.status_lockd, "127.0.0.1:7000");
  EXPECT_EQ(d.timing.ttl_ms, 10'000u);
  EXPECT_EQ(d.timing.kill_after_ms, 7'000u);
  EXPECT_EQ(d.timing.heartbeat_interval_ms, 1'000u);
  EXPECT_EQ(d.timing.wheel_granularity_ns, 1'000'000u);
  EXPECT_DOUBLE_EQ(d.timing.clock_rate_bound, 0.001);
  EXPECT_EQ(d.timing.kill_latency_budget_ms, 50u);

  StatusOverrides o;
  o.clock_rate_bound = 0.005;
  o.kill_latency_budget_ms = 80;
  PauseDeployment asked;
  ASSERT_TRUE(read_status(status_answer(), o, asked).ok());
  EXPECT_DOUBLE_EQ(asked.timing.clock_rate_bound, 0.005);
  EXPECT_EQ(asked.timing.kill_latency_budget_ms, 80u);
}

TEST(HarnessPauseDeployment, ReadStatusNamesTheFieldItLacks) {
  nlohmann::json a = status_answer();
  a.erase("kill_after_ms");
  PauseDeployment d;
  const Status s = read_status(a, {}, d);
  EXPECT_EQ(s.code(), Errc::io_error);
  EXPECT_NE(s.message().find("the supervisor's status answer lacks a field"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("kill_after_ms"), std::string::npos) << s.message();

  nlohmann::json mistyped = status_answer();
  mistyped["ttl_ms"] = "ten seconds";
  EXPECT_EQ(read_status(mistyped, {}, d).code(), Errc::io_error);
}

TEST(HarnessPauseDeployment, SettleLockdRefusesABadAddressAndAnotherLockdThanTheSupervisors) {
  PauseDeployment d;
  const Status bad = settle_lockd("lockd.example:7000", d);
  EXPECT_EQ(bad.code(), Errc::invalid_argument);
  EXPECT_NE(bad.message().find("--lockd \"lockd.example:7000\" is not HOST:PORT"), std::string::npos) << bad.message();

  d.status_lockd = "127.0.0.1:7000";
  d.socket = "/run/leasehold/supervisor.sock";
  const Status other = settle_lockd("127.0.0.1:7001", d);
  EXPECT_EQ(other.code(), Errc::refused);
  EXPECT_NE(other.message().find("uses lockd at 127.0.0.1:7000, not 127.0.0.1:7001"), std::string::npos)
      << other.message();
}

TEST(HarnessPauseDeployment, AMissingKeyFileIsNamedWithTheFix) {
  TempDir dir("harness-pause-key");
  const std::string path = (dir.path() / "no-such.key").string();
  PauseDeployment d;
  const Status s = load_deployment_key(path, d);
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("pass the key file this deployment's lockd and supervisor use"), std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find("create one with `leasehold-lockd --generate-key"), std::string::npos)
      << "lockd's own hint is replaced by the deployment's: " << s.message();
  EXPECT_FALSE(d.key.has_value());
}

TEST(HarnessPauseDeployment, PrepareOutDirMakesItAndClearsAnEarlierRunsFiles) {
  TempDir dir("harness-pause-out");
  std::string out = (dir.path() / "a" / "b").string();
  std::string log_dir;
  ASSERT_TRUE(prepare_out_dir(out, log_dir).ok());
  EXPECT_TRUE(fs::path(out).is_absolute());
  EXPECT_EQ(log_dir, out + "/sandbox-logs");
  ASSERT_TRUE(fs::is_directory(log_dir));
  // Writable for the isolated sandbox's uid (a root supervisor's uid range), sticky as /tmp.
  EXPECT_EQ(fs::status(log_dir).permissions(), fs::perms::all | fs::perms::sticky_bit);

  // An earlier run's sandbox log and plot go; a file of the user's stays.
  std::ofstream(log_dir + "/sandbox-1.log") << "old\n";
  std::ofstream(out + "/pause-probe.svg") << "<svg/>\n";
  std::ofstream(out + "/notes.txt") << "mine\n";
  ASSERT_TRUE(prepare_out_dir(out, log_dir).ok());
  EXPECT_FALSE(fs::exists(log_dir + "/sandbox-1.log"));
  EXPECT_FALSE(fs::exists(out + "/pause-probe.svg"));
  EXPECT_TRUE(fs::exists(out + "/notes.txt"));

  std::string file = (dir.path() / "a-file").string();
  std::ofstream(file) << "x\n";
  const Status s = prepare_out_dir(file, log_dir);
  EXPECT_EQ(s.code(), Errc::invalid_argument);
  EXPECT_NE(s.message().find(file), std::string::npos) << s.message();
}

TEST(HarnessPauseDeployment, RhoTextReadsBackToTheSameDouble) {
  EXPECT_EQ(rho_text(1e-7), "1e-07");
  EXPECT_EQ(rho_text(0.001), "0.001");
  for (const double rho : {1e-7, 0.001, 0.0049999999999999992, 1.0 / 3})
    EXPECT_EQ(std::stod(rho_text(rho)), rho) << rho_text(rho);
}

}  // namespace
}  // namespace leasehold::harness
