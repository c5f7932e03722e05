// The operator's view of running daemons: /metrics (parsed by the Prometheus client library's
// own text parser, tests/tools/prometheus_parse.py) and /healthz of a live lockd and a live
// supervisor on loopback, and `leasehold health` / `leasehold status` with their exit codes and
// JSON, all against values the test caused.
#include "leasehold/lockd/admin_client.hpp"
#include "tests/supervisor/daemon_process.hpp"
#include "tools/command.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#ifndef LEASEHOLD_CLI_BINARY
#error "LEASEHOLD_CLI_BINARY must name the leasehold executable"
#endif
#ifndef LEASEHOLD_PYTHON3
#error "LEASEHOLD_PYTHON3 must name a python3 interpreter"
#endif
#ifndef LEASEHOLD_SOURCE_DIR
#error "LEASEHOLD_SOURCE_DIR must name the source tree"
#endif

namespace leasehold::supervisor_testing {
namespace {

/// One HTTP/1.0 GET on loopback: status, Content-Type and body ("" and status 0 when nothing
/// answers).
struct HttpReply {
  int status = 0;
  std::string content_type;
  std::string body;
};
HttpReply http_get(const std::string& address, const std::string& path) {
  HttpReply r;
  const auto addr = SocketAddress::parse(address);
  if (!addr) return r;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(addr->port());
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return r;
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + address + "\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string all;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) all.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  const std::size_t head_end = all.find("\r\n\r\n");
  if (all.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos) return r;
  r.status = std::stoi(all.substr(9, 3));
  const std::string head = all.substr(0, head_end);
  if (const std::size_t ct = head.find("Content-Type: "); ct != std::string::npos)
    r.content_type = head.substr(ct + 14, head.find("\r\n", ct) - ct - 14);
  r.body = all.substr(head_end + 4);
  return r;
}

/// The ADDR:PORT a daemon printed as "metrics http://ADDR:PORT/metrics".
std::string metrics_address(const std::string& stdout_text) {
  const std::string tag = "metrics http://";
  const std::size_t at = stdout_text.find(tag);
  if (at == std::string::npos) return {};
  const std::size_t from = at + tag.size();
  return stdout_text.substr(from, stdout_text.find("/metrics\n", from) - from);
}

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

class Observability : public ::testing::Test {
 protected:
  void SetUp() override {
    key_ = make_key(dir_.path());
    std::string error;
    ASSERT_TRUE(lockd_.start(dir_.path(), key_, {"--metrics-listen", "127.0.0.1:0"}, &error)) << error;
    lockd_metrics_ = metrics_address(lockd_.child.out());
    ASSERT_FALSE(lockd_metrics_.empty()) << lockd_.child.out();
  }

  /// `leasehold args...`, stdout and stderr apart, bounded by 60 s.
  CliResult cli(const std::vector<std::string>& args) {
    harness::Spawn s;
    s.argv = {LEASEHOLD_CLI_BINARY};
    s.argv.insert(s.argv.end(), args.begin(), args.end());
    s.stdout_path = dir_.path() / "cli.out";
    s.stderr_path = dir_.path() / "cli.err";
    s.label = "leasehold";
    harness::Process p;
    CliResult r;
    if (const Status started = p.start(s); !started.ok()) {
      ADD_FAILURE() << started.message();
      return r;
    }
    if (p.wait(std::chrono::seconds(60)) < 0) p.kill9();
    r.code = p.exit_code().value_or(-1);
    r.out = p.out();
    r.err = slurp(s.stderr_path);
    return r;
  }

  /// The families of a /metrics as prometheus_client parses them; skips the test when python3
  /// or the module is missing.
  json scrape(const std::string& address) {
    const fs::path out = dir_.path() / "scrape.json";
    harness::Spawn s;
    s.argv = {LEASEHOLD_PYTHON3, std::string(LEASEHOLD_SOURCE_DIR) + "/tests/tools/prometheus_parse.py",
              "http://" + address + "/metrics"};
    s.stdout_path = out;
    s.stderr_path = dir_.path() / "scrape.err";
    s.label = "prometheus_parse.py";
    harness::Process p;
    if (const Status started = p.start(s); !started.ok()) {
      skip_reason_ = LEASEHOLD_PYTHON3 + std::string(" cannot be run: ") + started.message();
      return nullptr;
    }
    if (p.wait(std::chrono::seconds(60)) < 0) p.kill9();
    const int code = p.exit_code().value_or(-1);
    if (code == 77) {
      skip_reason_ = slurp(out);
      return nullptr;
    }
    if (code == 127 || code == 126) {
      skip_reason_ = std::string(LEASEHOLD_PYTHON3) + " is not installed";
      return nullptr;
    }
    EXPECT_EQ(code, 0) << slurp(out) << slurp(dir_.path() / "scrape.err");
    return json::parse(slurp(out), nullptr, false);
  }

  /// The value of sample `sample` with exactly `labels` in family `family`; NaN if absent.
  static double value(const json& fams, const std::string& family, const std::string& sample,
                      const json& labels = json::object()) {
    if (!fams.contains(family)) return std::numeric_limits<double>::quiet_NaN();
    for (const auto& s : fams[family]["samples"])
      if (s[0] == sample && s[1] == labels) return s[2].get<double>();
    return std::numeric_limits<double>::quiet_NaN();
  }

  /// A histogram family: its buckets cumulative in `le` order, the +Inf bucket equal to
  /// _count, and 65 buckets (the shm table's log2 buckets). Returns _count.
  static double check_histogram(const json& fams, const std::string& family) {
    EXPECT_TRUE(fams.contains(family)) << family;
    if (!fams.contains(family)) return 0;
    EXPECT_EQ(fams[family]["type"], "histogram");
    std::vector<std::pair<double, double>> buckets;  // le, cumulative count
    double count = -1;
    for (const auto& s : fams[family]["samples"]) {
      if (s[0] == family + "_bucket") {
        const std::string le = s[1]["le"];
        buckets.emplace_back(le == "+Inf" ? std::numeric_limits<double>::infinity() : std::stod(le), s[2].get<double>());
      } else if (s[0] == family + "_count") {
        count = s[2].get<double>();
      }
    }
    EXPECT_EQ(buckets.size(), 65u) << family;
    EXPECT_TRUE(std::is_sorted(buckets.begin(), buckets.end(), [](auto& a, auto& b) { return a.first < b.first; }));
    for (std::size_t i = 1; i < buckets.size(); ++i)
      EXPECT_LE(buckets[i - 1].second, buckets[i].second) << family << " bucket le=" << buckets[i].first;
    EXPECT_FALSE(buckets.empty());
    if (!buckets.empty()) {
      EXPECT_TRUE(std::isinf(buckets.back().first));
      EXPECT_EQ(buckets.back().second, count) << family << ": the +Inf bucket is _count";
    }
    return count;
  }

  TempDir dir_;
  std::string key_;
  Lockd lockd_;
  std::string lockd_metrics_;
  std::string skip_reason_;
};

#define SKIP_IF_NO_PARSER(fams) \
  if ((fams).is_null() && !skip_reason_.empty()) GTEST_SKIP() << skip_reason_

TEST_F(Observability, LockdMetricsParseAndCountWhatHappened) {
  lockd::AdminClient client(lockd_.socket_address(), load_key(key_));
  const WorkerId worker{0x77, 1};
  constexpr int kAcquires = 3;
  for (int i = 0; i < kAcquires; ++i) {
    const lockd::Answer a = client.acquire("obs/" + std::to_string(i), SandboxId{0x51, std::uint64_t(i + 1)}, worker);
    ASSERT_NE(a.as<wire::Grant>(), nullptr) << a.message();
  }
  const lockd::Answer refused = client.acquire("obs/0", SandboxId{0x51, 99}, worker);
  ASSERT_NE(refused.as<wire::Deny>(), nullptr) << refused.message();

  const json fams = scrape(lockd_metrics_);
  SKIP_IF_NO_PARSER(fams);
  ASSERT_TRUE(fams.is_object());
  EXPECT_EQ(fams["leasehold_lockd_grants"]["type"], "counter");
  EXPECT_EQ(value(fams, "leasehold_lockd_grants", "leasehold_lockd_grants_total"), kAcquires);
  EXPECT_EQ(fams["leasehold_lockd_held"]["type"], "gauge");
  EXPECT_EQ(value(fams, "leasehold_lockd_held", "leasehold_lockd_held"), kAcquires);
  EXPECT_EQ(value(fams, "leasehold_lockd_names", "leasehold_lockd_names"), kAcquires);
  EXPECT_EQ(value(fams, "leasehold_lockd_ttl_ms", "leasehold_lockd_ttl_ms"), 10000);
  // Reasons are one family with a label, every reason listed, zero or not.
  EXPECT_EQ(value(fams, "leasehold_lockd_refusal", "leasehold_lockd_refusal_total", {{"reason", "held"}}), 1);
  EXPECT_EQ(value(fams, "leasehold_lockd_refusal", "leasehold_lockd_refusal_total", {{"reason", "lock_delay"}}), 0);
  EXPECT_EQ(value(fams, "leasehold_lockd_reject", "leasehold_lockd_reject_total", {{"reason", "bad_tag"}}), 0);
  EXPECT_EQ(fams.count("leasehold_lockd_refusal_held"), 0u) << "a reason is a label, not a name";
  for (const auto& [name, f] : fams.items()) {
    EXPECT_NE(f["type"], "unknown") << name;
    EXPECT_FALSE(f["help"].get<std::string>().empty()) << name;
  }
  // More than what fits the Stats datagram: every counter.
  EXPECT_TRUE(fams.contains("leasehold_lockd_heartbeats"));
  EXPECT_TRUE(fams.contains("leasehold_lockd_answers_unsigned"));

  const HttpReply m = http_get(lockd_metrics_, "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_EQ(m.content_type, "text/plain; version=0.0.4; charset=utf-8");
  const HttpReply h = http_get(lockd_metrics_, "/healthz");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body, "serving\n");
  EXPECT_EQ(http_get(lockd_metrics_, "/nothing").status, 404);
}

TEST_F(Observability, HealthSaysWhetherLockdServes) {
  lockd::AdminClient client(lockd_.socket_address(), load_key(key_));
  for (int i = 0; i < 2; ++i) {
    const lockd::Answer a = client.acquire("health/" + std::to_string(i), SandboxId{0x52, std::uint64_t(i + 1)}, WorkerId{0x77, 1});
    ASSERT_NE(a.as<wire::Grant>(), nullptr) << a.message();
  }
  const CliResult ok = cli({"health", "--lockd", lockd_.address, "--key-file", key_, "--json"});
  ASSERT_EQ(ok.code, cli::kOk) << ok.out << ok.err;
  const json j = json::parse(ok.out);
  EXPECT_EQ(j["healthy"], true);
  EXPECT_TRUE(j["reasons"].empty());
  ASSERT_EQ(j["lockd"].size(), 1u);
  const json& l = j["lockd"][0];
  EXPECT_EQ(l["address"], lockd_.address);
  EXPECT_EQ(l["role"], "standalone");
  EXPECT_EQ(l["serving"], true);
  EXPECT_EQ(l["names"], 2);
  EXPECT_EQ(l["held"], 2);
  EXPECT_EQ(l["grants"], 2);
  EXPECT_GE(l["store"]["commits"].get<std::uint64_t>(), 1u);  // two grants, one or two batches
  EXPECT_TRUE(l["store"]["commit_us_p99"].is_number());
  EXPECT_TRUE(l["refreshes_per_s"].is_number());
  ASSERT_TRUE(l["version"].is_string()) << l.dump();  // lockd's, e.g. "0.1.0"
  const std::string version = l["version"].get<std::string>();
  EXPECT_EQ(std::count(version.begin(), version.end(), '.'), 2) << version;

  const CliResult text = cli({"health", "--lockd", lockd_.address, "--key-file", key_});
  EXPECT_EQ(text.code, cli::kOk);
  EXPECT_EQ(text.out.rfind("healthy\nlockd " + lockd_.address + " (" + version + "): standalone, serving; 2 names, 2 held;",
                           0),
            0u)
      << text.out;

  // A port nobody serves: unreachable. In a list with a lockd that serves: unhealthy, named.
  const int dead_port = [] {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    socklen_t n = sizeof sa;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &n);
    ::close(fd);  // free again: nothing answers there
    return ntohs(sa.sin_port);
  }();
  const std::string dead = "127.0.0.1:" + std::to_string(dead_port);
  const CliResult none = cli({"health", "--lockd", dead, "--key-file", key_, "--timeout-ms", "300"});
  EXPECT_EQ(none.code, cli::kUnreachable) << none.out << none.err;
  const CliResult half = cli({"health", "--lockd", lockd_.address + "," + dead, "--key-file", key_, "--timeout-ms",
                              "300", "--json"});
  EXPECT_EQ(half.code, cli::kFailure) << half.out << half.err;
  const json hj = json::parse(half.out);
  EXPECT_EQ(hj["healthy"], false);
  ASSERT_EQ(hj["lockd"].size(), 2u);
  EXPECT_EQ(hj["lockd"][0]["serving"], true);
  EXPECT_EQ(hj["lockd"][1]["answered"], false);
  ASSERT_EQ(hj["reasons"].size(), 1u);
  EXPECT_EQ(hj["reasons"][0].get<std::string>().rfind(dead + " does not answer", 0), 0u) << hj["reasons"];
}

TEST_F(Observability, SupervisorMetricsStatusAndHealth) {
  Supervisor sup;
  std::string error;
  ASSERT_TRUE(sup.start(dir_.path(), lockd_.address, key_,
                        {"--metrics-listen", "127.0.0.1:0", "--heartbeat-interval-ms", "100", "--isolation", "off"},
                        &error))
      << error;
  const std::string sup_metrics = metrics_address(sup.child.out());
  ASSERT_FALSE(sup_metrics.empty()) << sup.child.out();
  const json run = sup.call({{"v", 1}, {"op", "run"}, {"name", "obs/sandbox"}, {"argv", {"/bin/sleep", "60"}},
                             {"env", {{"PATH", "/usr/bin:/bin"}}}});
  ASSERT_EQ(run["ok"], true) << run.dump();
  // Until a heartbeat round trip was measured (bounded: the test fails if it never comes).
  json st;
  for (int i = 0; i < 400; ++i) {
    st = sup.call({{"v", 1}, {"op", "status"}});
    if (st.value("heartbeat_rtt", json::object()).value("count", 0) >= 1) break;
    sleep_ms(50);
  }
  ASSERT_GE(st["heartbeat_rtt"]["count"].get<int>(), 1) << st.dump();

  const CliResult status = cli({"status", "--supervisor", sup.socket.string(), "--json"});
  ASSERT_EQ(status.code, cli::kOk) << status.out << status.err;
  const json sj = json::parse(status.out);
  EXPECT_EQ(sj["healthy"], true);
  EXPECT_EQ(sj["health"], "serving");
  EXPECT_EQ(sj.count("ok"), 0u) << "the control socket's envelope stays out";
  EXPECT_EQ(sj["sandboxes"], 1);
  EXPECT_EQ(sj["named"], 1);
  EXPECT_EQ(sj["counters"]["spawned"], 1);
  EXPECT_EQ(sj["counters"]["kills_deadline"], 0);
  EXPECT_GE(sj["heartbeat_rtt"]["count"].get<int>(), 1);
  EXPECT_GT(sj["heartbeat_rtt"]["max_ms"].get<double>(), 0.0);
  EXPECT_TRUE(sj["pause_budget_ms"].is_number());
  const CliResult text = cli({"status", "--supervisor", sup.socket.string()});
  EXPECT_EQ(text.code, cli::kOk);
  EXPECT_NE(text.out.find(": healthy (serving)\n  sandboxes    1 (1 named) of "), std::string::npos) << text.out;

  // /metrics as prometheus_client reads it (without it, the rest still runs; the test then
  // says it skipped the scrape).
  const json fams = scrape(sup_metrics);
  if (!fams.is_null() || skip_reason_.empty()) {
    ASSERT_TRUE(fams.is_object());
    EXPECT_EQ(value(fams, "leasehold_supervisor_spawned", "leasehold_supervisor_spawned_total"), 1);
    EXPECT_EQ(value(fams, "leasehold_supervisor_named", "leasehold_supervisor_named"), 1);
    EXPECT_EQ(value(fams, "leasehold_supervisor_healthy", "leasehold_supervisor_healthy"), 1);
    EXPECT_GE(value(fams, "leasehold_supervisor_lockd_calls_answered", "leasehold_supervisor_lockd_calls_answered_total"), 2);
    EXPECT_GE(check_histogram(fams, "leasehold_supervisor_heartbeat_rtt_seconds"), 1);
    EXPECT_GE(check_histogram(fams, "leasehold_supervisor_rt_lateness_seconds"), 1);
    check_histogram(fams, "leasehold_supervisor_kill_latency_seconds");
    for (const auto& [name, f] : fams.items()) EXPECT_NE(f["type"], "unknown") << name;
    // lockd counted the supervisor's grant.
    const json lf = scrape(lockd_metrics_);
    EXPECT_EQ(value(lf, "leasehold_lockd_grants", "leasehold_lockd_grants_total"), 1);
    EXPECT_GE(value(lf, "leasehold_lockd_heartbeats", "leasehold_lockd_heartbeats_total"), 1);
  }

  // lockd stopped: the heartbeats go unanswered, the supervisor says it has no lockd contact.
  lockd_.child.signal(SIGSTOP);
  CliResult down;
  for (int i = 0; i < 400; ++i) {
    down = cli({"status", "--supervisor", sup.socket.string(), "--json"});
    if (down.code != cli::kOk) break;
    sleep_ms(50);
  }
  EXPECT_EQ(down.code, cli::kFailure) << down.out << down.err;
  const json dj = json::parse(down.out, nullptr, false);
  EXPECT_EQ(dj["healthy"], false);
  EXPECT_EQ(dj["health"].get<std::string>().rfind("no lockd contact: the last call to lockd (" + lockd_.address, 0), 0u)
      << dj["health"];
  const HttpReply h = http_get(sup_metrics, "/healthz");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.body.rfind("no lockd contact", 0), 0u) << h.body;
  // lockd back: the next answered heartbeat makes it healthy again.
  lockd_.child.signal(SIGCONT);
  CliResult up;
  for (int i = 0; i < 400; ++i) {
    up = cli({"status", "--supervisor", sup.socket.string()});
    if (up.code == cli::kOk) break;
    sleep_ms(50);
  }
  EXPECT_EQ(up.code, cli::kOk) << up.out << up.err;
  EXPECT_EQ(http_get(sup_metrics, "/healthz").status, 200);
  if (!skip_reason_.empty()) GTEST_SKIP() << "the /metrics parse was skipped: " << skip_reason_;
}

}  // namespace
}  // namespace leasehold::supervisor_testing
