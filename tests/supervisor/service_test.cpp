// leasehold-supervisor as a service (README "Running as a service"): systemd's notifications
// (READY=1, WATCHDOG=1 pings, STOPPING=1), SIGHUP reloading the log level from the config file
// without stopping, and a config file's errors.
#include "daemon_process.hpp"

#include "leasehold/io/probe.hpp"
#include "tests/common/notify_socket.hpp"

#include <gtest/gtest.h>

#include <fstream>

namespace leasehold {
namespace {

using namespace supervisor_testing;
using testing_common::NotifySocket;
using std::chrono::milliseconds;

const std::vector<std::string> kSupTiming = {"--ttl-ms", "1000", "--kill-after-ms", "600", "--heartbeat-interval-ms",
                                             "100", "--kill-latency-budget-ms", "50", "--slots", "16"};

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class SupervisorService : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    key_ = make_key(dir_.path());
    std::string err;
    ASSERT_TRUE(lockd_.start(dir_.path(), key_, {"--ttl-ms", "1000"}, &err)) << err;
  }
  TempDir dir_;
  std::string key_;
  Lockd lockd_;
};

TEST_F(SupervisorService, TellsSystemdReadyWatchdogAndStopping) {
  NotifySocket notify(dir_.path() / "notify");
  ASSERT_TRUE(notify.ok());
  Supervisor sup;
  sup.child.env = {{"NOTIFY_SOCKET", notify.path()}, {"WATCHDOG_USEC", "400000"}};
  std::string err;
  ASSERT_TRUE(sup.start(dir_.path(), lockd_.address, key_, kSupTiming, &err)) << err;
  const auto ready = notify.wait_for("READY=1", milliseconds(20'000));
  ASSERT_TRUE(ready) << sup.log_text();
  EXPECT_NE(ready->find("STATUS=worker " + sup.worker + ", lockd " + lockd_.address), std::string::npos) << *ready;
  // Pings come from the io loop's housekeeping while it turns: two of them.
  ASSERT_TRUE(notify.wait_for("WATCHDOG=1", milliseconds(20'000))) << sup.log_text();
  ASSERT_TRUE(notify.wait_for("WATCHDOG=1", milliseconds(20'000))) << sup.log_text();
  const auto serving = sup.events("serving");
  ASSERT_EQ(serving.size(), 1u) << sup.log_text();
  EXPECT_EQ(serving[0].at("watchdog_ms"), "400");
  EXPECT_EQ(serving[0].at("worker"), sup.worker);
  sup.child.signal(SIGTERM);
  const auto stopping = notify.wait_for("STOPPING=1", milliseconds(20'000));
  ASSERT_TRUE(stopping) << sup.log_text();
  EXPECT_NE(stopping->find("STATUS=stopping on SIGTERM"), std::string::npos) << *stopping;
  ASSERT_GE(sup.child.wait(20'000), 0);
  EXPECT_EQ(sup.events("stopped").size(), 1u) << sup.log_text();
}

TEST_F(SupervisorService, SighupReloadsTheLogLevelFromTheConfigFileAndKeepsRunning) {
  const fs::path config = dir_.path() / "supervisor.toml";
  write_text(config, "log-level = \"warn\"\nheartbeat-interval-ms = 100\n");
  Supervisor sup;
  std::string err;
  std::vector<std::string> args = kSupTiming;
  args.insert(args.end(), {"--config", config.string()});
  ASSERT_TRUE(sup.start(dir_.path(), lockd_.address, key_, args, &err)) << err;
  // At warn, the reload's own line (info) is not written: the first SIGHUP leaves no line.
  sup.child.signal(SIGHUP);
  write_text(config, "log-level = \"info\"\nheartbeat-interval-ms = 100\n");
  // Wait for the second reload's line, which at info is written.
  bool second = false;
  for (int i = 0; i < 200 && !second; ++i) {
    if (i % 20 == 0) sup.child.signal(SIGHUP);
    second = !sup.events("reloaded").empty();
    if (!second) sleep_ms(50);
  }
  ASSERT_TRUE(second) << sup.log_text();
  const auto reloaded = sup.events("reloaded");
  EXPECT_EQ(reloaded.front().at("log_level"), "info");
  EXPECT_EQ(reloaded.front().at("log_level_before"), "warn");
  const std::string log = sup.log_text();
  EXPECT_EQ(log.find("event=serving"), std::string::npos) << "info at start, below warn:\n" << log;
  EXPECT_EQ(count_of(log, "event=reloaded log_level=info log_level_before=warn"), 1u) << log;
  EXPECT_EQ(count_of(log, "event=reloaded log_level=warn"), 0u) << "a reload at warn is below warn:\n" << log;
  // Still serving: the control socket answers, and the process runs.
  const json st = sup.call({{"v", 1}, {"op", "status"}});
  EXPECT_EQ(st["ok"], true) << st.dump();
  EXPECT_FALSE(sup.child.exited());
  // A file that no longer parses changes nothing, and says why.
  write_text(config, "log-level = \"debug\"\nheartbeat-interval = 100\n");
  sup.child.signal(SIGHUP);
  ASSERT_TRUE(eventually([&] { return !sup.events("config_reload_refused").empty(); }, 20'000)) << sup.log_text();
  const std::string after = sup.log_text();
  EXPECT_NE(after.find("the log level stays info: config file " + config.string() + ": unknown key \\\"heartbeat-interval\\\""),  // escaped: one logfmt value
            std::string::npos)
      << after;
  EXPECT_FALSE(sup.child.exited());
}

TEST_F(SupervisorService, ConfigFileErrorsNameTheFileAndTheKey) {
  const fs::path config = dir_.path() / "supervisor.toml";
  write_text(config, "lockd = \"" + lockd_.address + "\"\nslots = \"many\"\n");
  Child c;
  c.start(LEASEHOLD_SUPERVISOR_BINARY, {"--config", config.string(), "--key-file", key_}, dir_.path() / "bad.out",
          dir_.path() / "bad.err");
  EXPECT_EQ(c.wait(20'000), 2);
  EXPECT_EQ(c.err().rfind("leasehold-supervisor: config file " + config.string() + ": key \"slots\": ", 0), 0u)
      << c.err();
}

}  // namespace
}  // namespace leasehold
