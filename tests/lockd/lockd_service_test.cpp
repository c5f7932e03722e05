// leasehold-lockd as a service (README "Running as a service"): systemd's notifications
// (READY=1, WATCHDOG=1 pings, STOPPING=1), SIGHUP reloading the log level from the config file
// without stopping, a config file's errors, and the JSON log format.
#include "leasehold/io/probe.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "lockd_process.hpp"
#include "tests/common/notify_socket.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

namespace leasehold::lockd {
namespace {

using namespace testing;
using testing_common::NotifySocket;
using std::chrono::milliseconds;

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

TEST(LockdService, TellsSystemdReadyWatchdogAndStopping) {
  if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
  TempDir dir;
  make_key(dir.path());
  NotifySocket notify(dir.path() / "notify");
  ASSERT_TRUE(notify.ok()) << std::strerror(errno);
  LockdProcess lockd;
  std::string err;
  ASSERT_TRUE(lockd.start({"--key-file", (dir.path() / "lockd.key").string(), "--store", (dir.path() / "l.db").string()},
                          dir.path() / "lockd.log", &err, -1,
                          {{"NOTIFY_SOCKET", notify.path()}, {"WATCHDOG_USEC", "200000"}}))
      << err;
  const auto ready = notify.wait_for("READY=1", milliseconds(20'000));
  ASSERT_TRUE(ready) << lockd.log();
  EXPECT_NE(ready->find("STATUS=serving on " + lockd.address().str()), std::string::npos) << *ready;
  // Pings come from the main loop while it turns: two of them, the second one after READY.
  ASSERT_TRUE(notify.wait_for("WATCHDOG=1", milliseconds(20'000))) << lockd.log();
  ASSERT_TRUE(notify.wait_for("WATCHDOG=1", milliseconds(20'000))) << lockd.log();
  EXPECT_NE(lockd.log().find("event=serving listen=" + lockd.address().str() + " "), std::string::npos) << lockd.log();
  EXPECT_NE(lockd.log().find(" watchdog_ms=200\n"), std::string::npos) << lockd.log();
  lockd.signal(SIGTERM);
  const auto stopping = notify.wait_for("STOPPING=1", milliseconds(20'000));
  ASSERT_TRUE(stopping) << lockd.log();
  EXPECT_NE(stopping->find("STATUS=stopping"), std::string::npos) << *stopping;
  EXPECT_EQ(lockd.terminate(), 0);
}

TEST(LockdService, NoWatchdogPingsUnlessSystemdAsks) {
  if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
  TempDir dir;
  make_key(dir.path());
  NotifySocket notify(dir.path() / "notify");
  ASSERT_TRUE(notify.ok());
  LockdProcess lockd;
  std::string err;
  ASSERT_TRUE(lockd.start({"--key-file", (dir.path() / "lockd.key").string(), "--store", (dir.path() / "l.db").string()},
                          dir.path() / "lockd.log", &err, -1, {{"NOTIFY_SOCKET", notify.path()}}))
      << err;
  ASSERT_TRUE(notify.wait_for("READY=1", milliseconds(20'000))) << lockd.log();
  lockd.signal(SIGTERM);
  ASSERT_TRUE(notify.wait_for("STOPPING=1", milliseconds(20'000))) << lockd.log();
  EXPECT_EQ(notify.count("WATCHDOG=1"), 0u);
  EXPECT_EQ(lockd.terminate(), 0);
}

// A key rotation by the config file: a key file added to its key-file list is taken on SIGHUP,
// not only the files named at start read again.
TEST(LockdService, SighupTakesTheKeyFilesTheConfigFileNamesNow) {
  if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
  TempDir dir;
  const wire::WireKey first = make_key(dir.path());
  const fs::path second_path = dir.path() / "cluster-2.key";
  ASSERT_TRUE(wire::generate_key_file(second_path.string(), wire::KeyKind::cluster, 2).ok());
  const auto second = wire::load_key_file(second_path.string());
  ASSERT_TRUE(second) << second.message();
  const fs::path config = dir.path() / "lockd.toml";
  const std::string store = "store = \"" + (dir.path() / "l.db").string() + "\"\n";
  const std::string first_file = "\"" + (dir.path() / "lockd.key").string() + "\"";
  write_text(config, store + "key-file = [" + first_file + "]\n");
  LockdProcess lockd;
  std::string err;
  ASSERT_TRUE(lockd.start({"--config", config.string()}, dir.path() / "lockd.log", &err)) << err;
  const WorkerId w{0x78, 1};
  AdminClient old_key(lockd.address(), first, w);
  const Answer a = old_key.acquire("rotated/a", SandboxId{0x52, 1}, w);
  ASSERT_NE(a.as<wire::Grant>(), nullptr) << a.message();
  {  // Not yet one of lockd's keys: its datagrams go unanswered.
    AdminClient new_key(lockd.address(), *second, w, 500'000'000);
    const Answer unanswered = new_key.acquire("rotated/b", SandboxId{0x52, 2}, w);
    EXPECT_EQ(unanswered.as<wire::Grant>(), nullptr) << unanswered.message();
  }
  write_text(config, store + "key-file = [" + first_file + ", \"" + second_path.string() + "\"]\n");
  lockd.signal(SIGHUP);
  ASSERT_TRUE(harness::wait_for_log_line(dir.path() / "lockd.log", "event=reloaded ", milliseconds(20'000)))
      << lockd.log();
  EXPECT_NE(lockd.log().find(" keys=reloaded"), std::string::npos) << lockd.log();
  AdminClient new_key(lockd.address(), *second, w);
  const Answer g = new_key.acquire("rotated/b", SandboxId{0x52, 2}, w);
  EXPECT_NE(g.as<wire::Grant>(), nullptr) << g.message();
  const Answer c = old_key.acquire("rotated/c", SandboxId{0x52, 3}, w);  // both keys now
  EXPECT_NE(c.as<wire::Grant>(), nullptr) << c.message();
  EXPECT_EQ(lockd.terminate(), 0);
}

TEST(LockdService, SighupReloadsTheLogLevelFromTheConfigFileAndKeepsServing) {
  if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
  TempDir dir;
  const wire::WireKey key = make_key(dir.path());
  const fs::path config = dir.path() / "lockd.toml";
  const std::string common = "key-file = [\"" + (dir.path() / "lockd.key").string() + "\"]\nstore = \"" +
                             (dir.path() / "l.db").string() + "\"\n";
  write_text(config, "# started quiet\n" + common + "log-level = \"warn\"\n");
  LockdProcess lockd;
  std::string err;
  ASSERT_TRUE(lockd.start({"--config", config.string()}, dir.path() / "lockd.log", &err)) << err;
  const WorkerId w{0x77, 1};
  AdminClient client(lockd.address(), key, w);
  const Answer quiet = client.acquire("before", SandboxId{0x51, 1}, w);
  ASSERT_NE(quiet.as<wire::Grant>(), nullptr) << quiet.message();

  write_text(config, common + "log-level = \"info\"\n");
  lockd.signal(SIGHUP);
  ASSERT_TRUE(harness::wait_for_log_line(dir.path() / "lockd.log", "event=reloaded log_level=info log_level_before=warn",
                                         milliseconds(20'000)))
      << lockd.log();
  const Answer loud = client.acquire("after", SandboxId{0x51, 2}, w);
  ASSERT_NE(loud.as<wire::Grant>(), nullptr) << loud.message();
  ASSERT_TRUE(harness::wait_for_log_line(dir.path() / "lockd.log", "event=grant name=after ", milliseconds(20'000)))
      << lockd.log();
  // Lines reach the file in order: the first grant, had it been logged, would be above.
  EXPECT_EQ(lockd.log().find("name=before "), std::string::npos) << lockd.log();
  EXPECT_TRUE(lockd.running());

  // A file that no longer parses changes nothing, and says why.
  write_text(config, common + "log-level = \"info\"\nlog-levle = \"debug\"\n");
  lockd.signal(SIGHUP);
  const auto refused = harness::wait_for_log_line(dir.path() / "lockd.log", "event=config_reload_refused",
                                                  milliseconds(20'000));
  ASSERT_TRUE(refused) << lockd.log();
  EXPECT_NE(refused->find("level=warn "), std::string::npos) << *refused;
  EXPECT_NE(refused->find("the log level stays info: config file " + config.string() + ": unknown key \\\"log-levle\\\""),  // escaped: one logfmt value
            std::string::npos)
      << *refused;
  EXPECT_TRUE(lockd.running());
  EXPECT_TRUE(client.counters().ok());
  EXPECT_EQ(lockd.terminate(), 0);
}

TEST(LockdService, ConfigFileErrorsNameTheFileAndTheKey) {
  TempDir dir;
  make_key(dir.path());
  const fs::path config = dir.path() / "lockd.toml";
  write_text(config, "ttl-ms = 5000\nttl_ms = 5000\n");
  ExitResult r = run_lockd_to_exit({"--config", config.string()}, dir.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "leasehold-lockd: config file " + config.string() +
                       ": unknown key \"ttl_ms\" (keys are the long flag names without --, see --help)\n");
  write_text(config, "ttl-ms = \"ten seconds\"\n");
  r = run_lockd_to_exit({"--config", config.string()}, dir.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("leasehold-lockd: config file " + config.string() + ": key \"ttl-ms\": ", 0), 0u) << r.err;
  r = run_lockd_to_exit({"--config", (dir.path() / "absent.toml").string()}, dir.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("config file " + (dir.path() / "absent.toml").string() + ": cannot read it"), std::string::npos)
      << r.err;
  // A one-shot action is no setting of a service.
  write_text(config, "generate-key = \"" + (dir.path() / "k").string() + "\"\n");
  r = run_lockd_to_exit({"--config", config.string()}, dir.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("not allowed in a configuration file"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.path() / "k"));
}

TEST(LockdService, JsonLogLinesAreObjectsWithTimeStampLevelAndEvent) {
  if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
  TempDir dir;
  const wire::WireKey key = make_key(dir.path());
  LockdProcess lockd;
  std::string err;
  ASSERT_TRUE(lockd.start({"--key-file", (dir.path() / "lockd.key").string(), "--store", (dir.path() / "l.db").string(),
                           "--log-format", "json"},
                          dir.path() / "lockd.log", &err))
      << err;
  const WorkerId w{0x77, 1};
  AdminClient client(lockd.address(), key, w);
  const Answer granted = client.acquire("json/1", SandboxId{0x51, 1}, w);
  ASSERT_NE(granted.as<wire::Grant>(), nullptr) << granted.message();
  ASSERT_TRUE(harness::wait_for_log_line(dir.path() / "lockd.log", "\"name\":\"json/1\"", milliseconds(20'000)))
      << lockd.log();
  EXPECT_EQ(lockd.terminate(), 0);
  std::istringstream in(lockd.log());
  std::size_t lines = 0;
  bool grant = false;
  for (std::string line; std::getline(in, line); ++lines) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    EXPECT_TRUE(j["time"].is_string() && j["time"].get<std::string>().size() == 24) << line;
    EXPECT_TRUE(j["ts_boot_ns"].is_number_integer()) << line;
    EXPECT_TRUE(j["level"] == "info" || j["level"] == "warn") << line;
    EXPECT_TRUE(j["event"].is_string()) << line;
    grant |= j["event"] == "grant" && j["name"] == "json/1" && j["epoch"] == "1";
  }
  EXPECT_GE(lines, 4u);  // restore, signing key, serving, grant, stopped
  EXPECT_TRUE(grant) << lockd.log();
}

// One log in time order: the key reload's own line (keys_reloaded, written by the service) comes
// before the reload's summary (reloaded), and ts_boot_ns never goes back from one line to the
// next (the start's buffered lines too).
TEST(LockdService, LogLinesAreInTimeOrderAcrossAStartAndASighup) {
  if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
  TempDir dir;
  make_key(dir.path());
  LockdProcess lockd;
  std::string err;
  ASSERT_TRUE(lockd.start({"--no-config", "--key-file", (dir.path() / "lockd.key").string(), "--store",
                           (dir.path() / "l.db").string()},
                          dir.path() / "lockd.log", &err))
      << err;
  lockd.signal(SIGHUP);
  ASSERT_TRUE(harness::wait_for_log_line(dir.path() / "lockd.log", "event=reloaded ", milliseconds(20'000)))
      << lockd.log();
  EXPECT_EQ(lockd.terminate(), 0);
  std::istringstream in(lockd.log());
  std::vector<std::string> events;
  long long last_ts = 0;
  for (std::string line; std::getline(in, line);) {
    const std::size_t ts = line.find(" ts_boot_ns=");
    const std::size_t ev = line.find(" event=");
    ASSERT_NE(ts, std::string::npos) << line;
    ASSERT_NE(ev, std::string::npos) << line;
    const long long t = std::stoll(line.substr(ts + 12));
    EXPECT_GE(t, last_ts) << "out of time order: " << line << "\n" << lockd.log();
    last_ts = t;
    events.push_back(line.substr(ev + 7, line.find(' ', ev + 7) - (ev + 7)));
  }
  auto at = [&](const std::string& e) {
    return static_cast<std::size_t>(std::find(events.begin(), events.end(), e) - events.begin());
  };
  ASSERT_LT(at("keys_reloaded"), events.size()) << lockd.log();
  ASSERT_LT(at("reloaded"), events.size()) << lockd.log();
  EXPECT_LT(at("keys_reloaded"), at("reloaded")) << lockd.log();
}

// The HTTP endpoint is bound before the store is created: a busy metrics port refuses the start
// as a busy --listen port does (exit 1, naming it) and leaves no store file or signing key; an
// empty --metrics-listen is a bad command line (exit 2), not "off".
TEST(LockdService, ABusyMetricsPortLeavesNoStoreBehind) {
  TempDir dir;
  make_key(dir.path());
  const int busy = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(busy, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(busy, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(::listen(busy, 4), 0);
  socklen_t len = sizeof sa;
  ASSERT_EQ(::getsockname(busy, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  const std::string port = std::to_string(ntohs(sa.sin_port));
  const fs::path store = dir.path() / "fresh.db";
  ExitResult r = run_lockd_to_exit({"--no-config", "--key-file", (dir.path() / "lockd.key").string(), "--store",
                                    store.string(), "--metrics-listen", "127.0.0.1:" + port},
                                   dir.path());
  ::close(busy);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err, "leasehold-lockd: --metrics-listen 127.0.0.1:" + port +
                       ": cannot bind (in use, or not an address of this host)\n");
  for (const char* suffix : {"", "-wal", "-shm", "-journal", ".signing.key", ".signing.key.pub"})
    EXPECT_FALSE(fs::exists(store.string() + suffix)) << store.string() + suffix << " left behind";
  r = run_lockd_to_exit({"--no-config", "--key-file", (dir.path() / "lockd.key").string(), "--store", store.string(),
                         "--metrics-listen", ""},
                        dir.path());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--metrics-listen: empty: give ADDR:PORT, or leave it out for no HTTP endpoint"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(store));
}

// A hand-run lockd says which config file it read: the one given, or none.
TEST(LockdService, TheStartLineNamesTheConfigFileRead) {
  if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
  TempDir dir;
  make_key(dir.path());
  const fs::path config = dir.path() / "lockd.toml";
  write_text(config, "store = \"" + (dir.path() / "l.db").string() + "\"\n");
  for (const bool given : {true, false}) {
    LockdProcess lockd;
    std::string err;
    std::vector<std::string> args{"--key-file", (dir.path() / "lockd.key").string()};
    if (given) args.insert(args.end(), {"--config", config.string()});
    else args.insert(args.end(), {"--no-config", "--store", (dir.path() / "l.db").string()});
    const fs::path log = dir.path() / (given ? "given.log" : "none.log");
    ASSERT_TRUE(lockd.start(args, log, &err)) << err;
    const auto serving = harness::wait_for_log_line(log, "event=serving ", milliseconds(20'000));
    ASSERT_TRUE(serving) << lockd.log();
    EXPECT_NE(serving->find(" config=" + (given ? config.string() : std::string("none")) + " "), std::string::npos)
        << *serving;
    EXPECT_EQ(lockd.terminate(), 0);
  }
}

}  // namespace
}  // namespace leasehold::lockd
