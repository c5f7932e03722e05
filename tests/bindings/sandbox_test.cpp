// The Python and Go bindings (bindings/) inside a real sandbox: a real leasehold-lockd and a real
// leasehold-supervisor (isolated sandboxes: another uid, their own namespaces), and `leasehold
// run` starting a probe that checks its own lease through the binding and writes what it saw
// (tests/bindings/sandbox_probe.py, tests/bindings/goprobe). The library, its -dev files and the
// Python module are installed (`cmake --install`) into a prefix the sandbox's uid can read; the
// Go probe is built there with cgo against that install, through pkg-config, as a runtime author
// builds it.
//   * Named at start: the probe sees its lease valid at the epoch lockd granted (lockd's log), not
//     at epoch + 1, and the token of that grant verifies with lockd's public key.
//   * Started unnamed (LEASEHOLD_EPOCH=0) and named afterwards: current_epoch() answers nothing
//     until the test names it, then the epoch lockd granted for that name.
// Root only (the supervisor runs root's sandboxes as uids of its range); skipped without io_uring,
// without user namespaces (the supervisor refuses isolation) and, for Go, without go.
#include "tests/supervisor/daemon_process.hpp"

#include "leasehold/io/probe.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#ifndef LEASEHOLD_CLI_BINARY
#error "LEASEHOLD_CLI_BINARY must name the leasehold executable"
#endif

namespace leasehold {
namespace {

using namespace supervisor_testing;
using std::chrono::milliseconds;

// Longer than the supervisor tests' timing: an instrumented interpreter starting in a sandbox
// must not be mistaken for a lapse. Pause budget 3000 - (1800 * 1.001 + 1 + 50) ms, about 1.1 s.
const std::vector<std::string> kLockdTiming = {"--ttl-ms", "3000"};
const std::vector<std::string> kSupTiming = {"--ttl-ms", "3000", "--kill-after-ms", "1800",
                                             "--heartbeat-interval-ms", "200", "--kill-latency-budget-ms", "50",
                                             "--slots", "16"};
constexpr milliseconds kCliWait{60'000};      // a CLI call (bounds a hang, asserts nothing)
constexpr milliseconds kGoBuildWait{600'000}; // a cold Go cache compiles the runtime
constexpr int kReportWaitMs = 120'000;        // the probe's report (its own polling ends at 60 s)

using Report = std::map<std::string, std::string>;

/// key=value lines.
Report parse_report(const std::string& text) {
  Report r;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) r[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return r;
}

/// A field of the report, or "(none)".
std::string field(const Report& r, const std::string& key) {
  const auto it = r.find(key);
  return it == r.end() ? "(none)" : it->second;
}

std::string show(const Report& r) {
  std::string s;
  for (const auto& [k, v] : r) s += "  " + k + "=" + v + "\n";
  return s;
}

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

/// The first file named `name` below `root`, or "".
fs::path find_below(const fs::path& root, const std::string& name) {
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.path().filename() == name) return e.path();
  return {};
}

class BindingInSandbox : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0)
      GTEST_SKIP() << "needs root: the supervisor runs root's isolated sandboxes as uids of its range";
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    go_ = GetParam() == "go";
    if (go_ && (go_program_ = harness::find_program("go")).empty())
      GTEST_SKIP() << "go is not installed (scripts/setup.sh installs golang-go)";
    key_ = make_key(dir_.path());
    // What the sandbox runs, where its uid can read it (the test directory is 0711, its
    // sandbox/ directory 1777).
    prefix_ = dir_.sandbox_dir() / "prefix";
    for (const char* component : {"leasehold-check", "leasehold-check-dev", "python3-leasehold-check"})
      ASSERT_EQ(run_logged({LEASEHOLD_CMAKE_COMMAND, "--install", LEASEHOLD_BUILD_DIR, "--prefix", prefix_.string(),
                            "--component", component},
                           {}, "install-" + std::string(component), kCliWait),
                0);
    library_ = find_below(prefix_, "libleasehold-check.so.1");
    python_dir_ = find_below(prefix_, "leasehold_check.py").parent_path();
    ASSERT_FALSE(library_.empty() || python_dir_.empty()) << "the install lacks the library or the module";
    bin_ = dir_.sandbox_dir() / "bin";
    fs::create_directory(bin_);
    ::chmod(bin_.c_str(), 0755);
    if (go_) {
      build_go_probe();
    } else {
      fs::copy_file(fs::path(LEASEHOLD_SOURCE_DIR) / "tests/bindings/sandbox_probe.py", bin_ / "sandbox_probe.py");
    }
    std::string err;
    ASSERT_TRUE(lockd_.start(dir_.path(), key_, kLockdTiming, &err)) << err;
    // lockd made its signing key beside its store; a resource holds the public half.
    const fs::path pub = dir_.path() / "lockd.db.signing.key.pub";
    ASSERT_TRUE(fs::exists(pub)) << lockd_.log_text();
    fs::copy_file(pub, bin_ / "lockd.pub");
    ::chmod((bin_ / "lockd.pub").c_str(), 0644);
    if (!sup_.start(dir_.path(), lockd_.address, key_, kSupTiming, &err)) {
      if (err.find("isolation is not available") != std::string::npos) GTEST_SKIP() << err;
      FAIL() << err;
    }
  }

  /// Runs argv with `env` over this process's, stdout and stderr in <dir>/<tag>.log: its exit code.
  int run_logged(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env,
                 const std::string& tag, milliseconds wait) {
    harness::Spawn s;
    s.argv = argv;
    s.env = env;
    s.stdout_path = s.stderr_path = dir_.path() / (tag + ".log");
    harness::Process p;
    if (const Status started = p.start(s); !started.ok()) {
      ADD_FAILURE() << started.message();
      return -1;
    }
    const int code = p.wait(wait);
    if (code != 0) ADD_FAILURE() << tag << " exited " << code << ":\n" << p.out();
    return code;
  }

  /// goprobe, built with cgo (and this build's C compiler) against the installed library through
  /// pkg-config alone, offline.
  void build_go_probe() {
    const fs::path pc = find_below(prefix_, "leasehold-check.pc").parent_path();
    const std::string cache = LEASEHOLD_GO_CACHE_DIR;
    const std::vector<std::pair<std::string, std::string>> env = {
        {"PKG_CONFIG_PATH", pc.string()}, {"GOTOOLCHAIN", "local"}, {"GOPROXY", "off"}, {"GOFLAGS", "-mod=readonly"},
        {"GO111MODULE", "on"}, {"CGO_ENABLED", "1"}, {"GOCACHE", cache + "/build"}, {"GOPATH", cache + "/path"},
        {"CGO_LDFLAGS", "-Wl,-rpath," + library_.parent_path().string()}, {"CC", LEASEHOLD_C_COMPILER}};
    const std::string src = std::string(LEASEHOLD_SOURCE_DIR) + "/tests/bindings/goprobe";
    const std::string build = "cd '" + src + "' && exec '" + go_program_ + "' build -o '" + (bin_ / "goprobe").string() + "' .";
    ASSERT_EQ(run_logged({"/bin/sh", "-c", build}, env, "go-build", kGoBuildWait), 0);
  }

  /// `leasehold ARGS... --supervisor SOCKET`.
  CliResult cli(std::vector<std::string> args) {
    args.insert(args.begin(), LEASEHOLD_CLI_BINARY);
    args.insert(args.begin() + 2, {"--supervisor", sup_.socket.string()});
    harness::Spawn s;
    s.argv = args;
    s.stdout_path = dir_.path() / "cli.out";
    s.stderr_path = dir_.path() / "cli.err";
    harness::Process p;
    CliResult r;
    if (const Status started = p.start(s); !started.ok()) {
      r.err = started.message();
      return r;
    }
    r.code = p.wait(kCliWait);
    r.out = p.out();
    r.err = p.err();
    return r;
  }

  /// `leasehold run [--name NAME] -- PROBE OUT PUBLIC_KEY VERIFY_NAME` with what the binding needs
  /// in the sandbox's environment.
  CliResult run_probe(const std::string& name, const fs::path& out, const std::string& verify_name) {
    std::vector<std::string> args = {"run", "--json"};
    if (!name.empty()) args.insert(args.end(), {"--name", name});
    std::vector<std::string> env = {"PATH=/usr/bin:/bin", "LEASEHOLD_CHECK_LIBRARY=" + library_.string(),
                                    "PYTHONPATH=" + python_dir_.string()};
    if (const std::string preload = LEASEHOLD_BINDINGS_PRELOAD; !preload.empty())
      env.insert(env.end(), {"LD_PRELOAD=" + preload, "ASAN_OPTIONS=detect_leaks=0"});
    for (const auto& e : env) args.insert(args.end(), {"--env", e});
    args.push_back("--");
    if (go_) args.push_back((bin_ / "goprobe").string());
    else args.insert(args.end(), {"/usr/bin/python3", (bin_ / "sandbox_probe.py").string()});
    args.insert(args.end(), {out.string(), (bin_ / "lockd.pub").string(), verify_name});
    return cli(args);
  }

  /// The sandbox's output, as `leasehold logs` prints it (for failure messages).
  std::string sandbox_log(const std::string& sandbox) {
    const CliResult r = cli({"logs", sandbox});
    return "leasehold logs " + sandbox + " (exit " + std::to_string(r.code) + "):\n" + r.out + r.err;
  }

  /// The probe's report once it wrote it whole (empty if it did not in time).
  Report wait_report(const fs::path& out) {
    eventually([&] { return fs::exists(out); }, kReportWaitMs);
    return parse_report(slurp(out));
  }

  /// lockd's grant of `name`: (holder, epoch), once in its log.
  std::pair<std::string, std::string> grant_of(const std::string& name) {
    std::pair<std::string, std::string> g;
    eventually([&] {
      for (auto& e : lockd_events(lockd_.log_text(), "grant"))
        if (e["name"] == name) g = {e["holder"], e["epoch"]};
      return !g.second.empty();
    });
    return g;
  }

  void expect_valid_at(const Report& r, std::uint64_t epoch) {
    EXPECT_EQ(r.count("error"), 0u) << show(r);
    EXPECT_NE(field(r, "uid"), "0") << "not an isolated sandbox's uid:\n" << show(r);
    EXPECT_EQ(field(r, "version"), LEASEHOLD_CHECK_VERSION) << show(r);
    EXPECT_EQ(field(r, "epoch"), std::to_string(epoch)) << show(r);
    EXPECT_EQ(field(r, "check"), "1") << show(r);
    EXPECT_EQ(field(r, "check_deadline"), "1") << show(r);
    EXPECT_EQ(field(r, "check_next"), "0") << "valid at epoch + 1:\n" << show(r);
    EXPECT_EQ(field(r, "writer_alive"), "1") << show(r);
    EXPECT_EQ(field(r, "token_bytes"), "140") << show(r);
    EXPECT_EQ(field(r, "verify"), "ok") << show(r);
    EXPECT_EQ(field(r, "verify_next"), "-17") << "its token verified for epoch + 1 (want LEASEHOLD_E_TOKEN_WRONG_EPOCH):\n"
                                          << show(r);
  }

  bool go_ = false;
  std::string go_program_;  ///< the go found on PATH or in the system directories
  TempDir dir_;
  std::string key_;
  fs::path prefix_, library_, python_dir_, bin_;
  Lockd lockd_;
  Supervisor sup_;
};

TEST_P(BindingInSandbox, ANamedSandboxSeesItsLeaseValidAtTheEpochLockdGranted) {
  const std::string name = GetParam() + "-named";
  const fs::path out = dir_.sandbox_dir() / (name + ".report");
  const CliResult run = run_probe(name, out, name);
  ASSERT_EQ(run.code, 0) << run.out << run.err;
  const json answer = json::parse(run.out);
  const std::string sandbox = answer.at("sandbox");
  const std::uint64_t epoch = answer.at("epoch");
  ASSERT_GE(epoch, 1u) << run.out;
  const auto [holder, granted] = grant_of(name);
  ASSERT_EQ(holder, sandbox) << lockd_.log_text();
  ASSERT_EQ(granted, std::to_string(epoch)) << lockd_.log_text();

  const Report r = wait_report(out);
  ASSERT_EQ(r.count("done"), 1u) << "no report from the probe\n" << sandbox_log(sandbox);
  EXPECT_EQ(field(r, "sandbox"), sandbox) << show(r);
  EXPECT_EQ(field(r, "name_env"), name) << show(r);
  EXPECT_EQ(field(r, "env_epoch"), std::to_string(epoch)) << show(r);
  EXPECT_EQ(r.count("first_answer"), 0u) << "a named sandbox needs no current_epoch():\n" << show(r);
  expect_valid_at(r, epoch);
  if (HasFailure()) ADD_FAILURE() << sandbox_log(sandbox);
}

TEST_P(BindingInSandbox, ASandboxNamedAfterItStartedLearnsTheEpochLockdGranted) {
  const std::string name = GetParam() + "-later";
  const fs::path out = dir_.sandbox_dir() / (name + ".report");
  const CliResult run = run_probe("", out, name);
  ASSERT_EQ(run.code, 0) << run.out << run.err;
  const json answer = json::parse(run.out);
  const std::string sandbox = answer.at("sandbox");
  EXPECT_EQ(answer.value("epoch", std::uint64_t{0}), 0u) << run.out;
  // Named only once the probe has asked and been told "not named".
  fs::path waiting = out;
  waiting += ".waiting";
  ASSERT_TRUE(eventually([&] { return fs::exists(waiting) || fs::exists(out); }, kReportWaitMs))
      << sandbox_log(sandbox);
  ASSERT_TRUE(fs::exists(waiting)) << show(parse_report(slurp(out))) << sandbox_log(sandbox);

  const CliResult named = cli({"name", "--json", sandbox, name});
  ASSERT_EQ(named.code, 0) << named.out << named.err;
  const std::uint64_t epoch = json::parse(named.out).at("epoch");
  ASSERT_GE(epoch, 1u) << named.out;
  const auto [holder, granted] = grant_of(name);
  ASSERT_EQ(holder, sandbox) << lockd_.log_text();
  ASSERT_EQ(granted, std::to_string(epoch)) << lockd_.log_text();

  const Report r = wait_report(out);
  ASSERT_EQ(r.count("done"), 1u) << "no report from the probe\n" << sandbox_log(sandbox);
  EXPECT_EQ(field(r, "sandbox"), sandbox) << show(r);
  EXPECT_EQ(field(r, "env_epoch"), "0") << show(r);
  EXPECT_EQ(field(r, "name_env"), "-") << show(r);
  EXPECT_EQ(field(r, "first_answer"), "none") << "current_epoch() answered before the sandbox was named:\n" << show(r);
  expect_valid_at(r, epoch);
  if (HasFailure()) ADD_FAILURE() << sandbox_log(sandbox);
}

INSTANTIATE_TEST_SUITE_P(Runtimes, BindingInSandbox, ::testing::Values("python", "go"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace leasehold
