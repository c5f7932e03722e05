// The `leasehold` CLI's answers to bad input, run as a real process: every subcommand that
// takes a name, a sandbox id, a lockd address or a supervisor socket gets a clear message and
// a distinct exit code (tools/command.hpp) for each of: malformed name, unknown name, lockd
// unreachable, no supervisor running.
#include "leasehold/harness/process.hpp"
#include "leasehold/io/udp.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/token.hpp"
#include "leasehold/resource/fenced_store.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/control_error.hpp"
#include "tools/command.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef LEASEHOLD_CLI_BINARY
#error "LEASEHOLD_CLI_BINARY must name the leasehold executable"
#endif
#ifndef LEASEHOLD_LOCKD_BINARY
#error "LEASEHOLD_LOCKD_BINARY must name the leasehold-lockd executable"
#endif

namespace leasehold::cli {
namespace {

namespace fs = std::filesystem;

using harness::slurp;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

constexpr const char* kSandbox = "0f8fad5b-d9cb-469f-a165-70867728950e";

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/leasehold-cli-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    key_ = (dir_ / "key").string();
    ASSERT_EQ(wire::generate_key_file(key_).message(), "");
    no_socket_ = (dir_ / "no-supervisor.sock").string();
  }
  void TearDown() override {
    if (lockd_pid_ > 0) {
      ::kill(lockd_pid_, SIGTERM);
      int st = 0;
      ::waitpid(lockd_pid_, &st, 0);
    }
    fs::remove_all(dir_);
  }

  /// Starts `leasehold args...` with a clean LEASEHOLD_* environment, stdout/stderr to
  /// cli.out/cli.err; `in_child` runs in the child before exec (false: exit kChildSetupFailed).
  pid_t spawn_cli(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                  const std::function<bool()>& in_child = {}) {
    const fs::path out = dir_ / "cli.out", err = dir_ / "cli.err";
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(o, 1);
      ::dup2(e, 2);
      for (const char* v : {"LEASEHOLD_LOCKD", "LEASEHOLD_KEY_FILE", "LEASEHOLD_SUPERVISOR", "LEASEHOLD_SHM",
                            "LEASEHOLD_SLOT", "LEASEHOLD_EPOCH", "LEASEHOLD_CONTROL_SOCKET"})
        ::unsetenv(v);
      for (const auto& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
      if (in_child && !in_child()) ::_exit(kChildSetupFailed);
      std::vector<char*> argv{const_cast<char*>(LEASEHOLD_CLI_BINARY)};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return pid;
  }
  static constexpr int kChildSetupFailed = 99;

  /// Runs `leasehold args...` (see spawn_cli); bounded by 60 s.
  Result cli(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
             const std::function<bool()>& in_child = {}) {
    return wait_cli(spawn_cli(args, env, in_child));
  }

  /// Waits for a spawned CLI (killed after 60 s) and collects its exit code and output.
  Result wait_cli(pid_t pid) {
    const fs::path out = dir_ / "cli.out", err = dir_ / "cli.err";
    Result r;
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        ADD_FAILURE() << "leasehold did not exit within 60 s";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  /// Starts leasehold-lockd on an ephemeral loopback port; returns "127.0.0.1:PORT".
  std::string start_lockd(const std::vector<std::string>& extra = {}) {
    const fs::path out = dir_ / "lockd.out";
    lockd_pid_ = ::fork();
    if (lockd_pid_ == 0) {
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(o, 1);
      ::dup2(o, 2);
      const std::string store = (dir_ / "lockd.db").string();
      std::vector<const char*> argv{LEASEHOLD_LOCKD_BINARY, "--no-config", "--listen", "127.0.0.1:0", "--store", store.c_str(),
                                    "--key-file", key_.c_str()};
      for (const auto& a : extra) argv.push_back(a.c_str());
      argv.push_back(nullptr);
      ::execv(LEASEHOLD_LOCKD_BINARY, const_cast<char* const*>(argv.data()));
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string text = slurp(out);
      if (const auto p = text.find("listening "); p != std::string::npos && text.find('\n', p) != std::string::npos) {
        const std::string line = text.substr(p, text.find('\n', p) - p);
        return "127.0.0.1:" + line.substr(line.rfind(':') + 1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "lockd did not start: " << slurp(out);
    return "";
  }

  std::vector<std::string> lockd_flags(const std::string& addr) {
    return {"--lockd", addr, "--key-file", key_, "--timeout-ms", "400"};
  }
  /// For requests that change the table: their answer waits for the store's fsync, which a
  /// loaded machine can make slow.
  std::vector<std::string> patient_lockd_flags(const std::string& addr) {
    return {"--lockd", addr, "--key-file", key_, "--timeout-ms", "10000"};
  }
  std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  /// `name` held at lockd by kSandbox (2-phase, committed straight at lockd for a worker id);
  /// its epoch, or 0 after a test failure.
  std::uint64_t held_at_lockd(const std::string& name, const std::vector<std::string>& lf) {
    const Result acq = cli(with({"acquire", name, "--sandbox", kSandbox, "--json"}, lf));
    EXPECT_EQ(acq.code, kOk) << acq.err;
    if (acq.code != kOk) return 0;
    const auto e = nlohmann::json::parse(acq.out)["epoch"].get<std::uint64_t>();
    const Result com = cli(with({"commit", name, "--sandbox", kSandbox, "--epoch", std::to_string(e), "--worker",
                                 "6a1e0c4e-5a55-4d3e-9a5b-1b2c3d4e5f60"},
                                lf));
    EXPECT_EQ(com.code, kOk) << com.err;
    return com.code == kOk ? e : 0;
  }

  fs::path dir_;
  std::string key_;
  std::string no_socket_;
  pid_t lockd_pid_ = -1;
};

#define EXPECT_ANSWER(r, exit_code, phrase)                                            \
  do {                                                                                 \
    EXPECT_EQ((r).code, (exit_code)) << "stderr: " << (r).err << "\nstdout: " << (r).out; \
    EXPECT_NE((r).err.find(phrase), std::string::npos) << "stderr: " << (r).err;      \
  } while (0)

// Nothing answers on this port: the discard port on loopback, closed on any test machine.
constexpr const char* kSilentLockd = "127.0.0.1:9";

TEST_F(CliTest, ExitCodesAreDistinct) {
  const int codes[] = {kOk, kFailure, kUsage, kRefused, kNotFound, kUnreachable, kTableError, kNoSupervisor, kInternal};
  for (std::size_t i = 0; i < std::size(codes); ++i)
    for (std::size_t j = i + 1; j < std::size(codes); ++j) EXPECT_NE(codes[i], codes[j]);
  const Result help = cli({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("7 no supervisor answering"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("5 lockd unreachable"), std::string::npos);
  EXPECT_NE(help.out.find("4 not found"), std::string::npos);
}

// The first word: a misspelt command is named with the closest one; `help` prints the help (of a
// command too); `--version` and `version --json` print the version.
TEST_F(CliTest, UnknownCommandHelpAndVersion) {
  const Result typo = cli({"nmes"});
  EXPECT_EQ(typo.code, kUsage) << typo.err;
  EXPECT_NE(typo.err.find("unknown command \"nmes\"; did you mean \"names\"?"), std::string::npos) << typo.err;
  EXPECT_EQ(typo.err.find("A subcommand is required"), std::string::npos) << typo.err;
  const Result far = cli({"frobnicate"});
  EXPECT_EQ(far.code, kUsage);
  EXPECT_NE(far.err.find("unknown command \"frobnicate\""), std::string::npos) << far.err;
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;
  const Result help = cli({"help"});
  EXPECT_EQ(help.code, kOk) << help.err;
  EXPECT_NE(help.out.find("Usage: leasehold"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("5 lockd unreachable"), std::string::npos) << help.out;
  const Result help_names = cli({"help", "names"});
  EXPECT_EQ(help_names.code, kOk) << help_names.err;
  EXPECT_NE(help_names.out.find("List lockd's names"), std::string::npos) << help_names.out;
  const Result help_typo = cli({"help", "nmes"});
  EXPECT_EQ(help_typo.code, kUsage);
  EXPECT_NE(help_typo.err.find("did you mean \"names\"?"), std::string::npos) << help_typo.err;
  const Result version = cli({"--version"});
  EXPECT_EQ(version.code, kOk) << version.err;
  EXPECT_EQ(version.out.rfind("leasehold 0.1.0 (wire ", 0), 0u) << version.out;
  const Result json = cli({"version", "--json"});
  ASSERT_EQ(json.code, kOk) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["version"], "0.1.0");
  EXPECT_EQ(j["wire_version"], wire::kVersion);
  EXPECT_EQ(j["shm_layout"], std::to_string(shm::kLayoutMajor) + "." + std::to_string(shm::kLayoutMinor));
  const Result plain = cli({"version"});
  EXPECT_EQ(plain.out, version.out);
}

TEST_F(CliTest, MalformedNameIsAUsageErrorEverywhere) {
  const std::string bad = "orders db!";
  const auto lf = lockd_flags(kSilentLockd);
  for (const auto& args : std::vector<std::vector<std::string>>{
           with({"show", bad}, lf),
           with({"acquire", bad}, lf),
           with({"revoke", bad}, lf),
           with({"transfer", bad, "--to", kSandbox}, lf),
           {"run", "--supervisor", no_socket_, "--name", bad, "--", "/bin/true"},
           {"name", "--supervisor", no_socket_, kSandbox, bad},
           {"release", "--supervisor", no_socket_, bad},
           {"commit", "--supervisor", no_socket_, bad, "--sandbox", kSandbox, "--epoch", "3", "--", "/bin/true"},
       }) {
    const Result r = cli(args);
    SCOPED_TRACE(args[0]);
    EXPECT_ANSWER(r, kUsage, "malformed name \"orders db!\"");
    EXPECT_NE(r.err.find("' '"), std::string::npos) << "names the bad byte: " << r.err;
  }
  const Result toolong = cli(with({"show", std::string(200, 'a')}, lf));
  EXPECT_ANSWER(toolong, kUsage, "malformed name");
}

TEST_F(CliTest, LockdUnreachableNamesTheAddress) {
  const auto lf = lockd_flags(kSilentLockd);
  for (const auto& args : std::vector<std::vector<std::string>>{
           with({"show", "orders"}, lf),
           with({"names"}, lf),
           with({"acquire", "orders"}, lf),
           with({"revoke", "orders"}, lf),
           with({"transfer", "orders", "--to", kSandbox}, lf),
       }) {
    const Result r = cli(args);
    SCOPED_TRACE(args[0]);
    EXPECT_ANSWER(r, kUnreachable, "nothing listens at 127.0.0.1:9: ICMP port unreachable");
  }
  // The environment supplies the address and the key file.
  const Result env = cli({"show", "orders", "--timeout-ms", "300"},
                         {"LEASEHOLD_LOCKD=127.0.0.1:9", "LEASEHOLD_KEY_FILE=" + key_});
  EXPECT_ANSWER(env, kUnreachable, "nothing listens at 127.0.0.1:9");
}

// The "no answer" hint names the key as its file does ("leasehold-key kind=cluster key-id=1"),
// never by the wire key id a cluster key used directly carries (1 | 0x8000 = 32769).
TEST_F(CliTest, NoAnswerNamesTheKeyAsItsFileDoes) {
  // A bound socket that never answers: silence (not "nothing listens").
  const int silent_fd = open_udp_socket_blocking(SocketAddress::loopback_v4(0));
  ASSERT_GE(silent_fd, 0);
  const std::string silent = local_address(silent_fd)->str();
  const Result cluster = cli(with({"show", "orders"}, lockd_flags(silent)));
  EXPECT_ANSWER(cluster, kUnreachable, "lockd at " + silent + " is unreachable");
  EXPECT_ANSWER(cluster, kUnreachable, "(cluster key 1)");
  EXPECT_EQ(cluster.err.find("32769"), std::string::npos) << cluster.err;
  EXPECT_EQ(cluster.err.find("key id"), std::string::npos) << cluster.err;
  const std::string admin = (dir_ / "admin.key").string();
  ASSERT_EQ(wire::generate_key_file(admin, wire::KeyKind::admin, 7).message(), "");
  const Result a = cli({"names", "--lockd", silent, "--admin-key-file", admin, "--timeout-ms", "300"});
  EXPECT_ANSWER(a, kUnreachable, "(admin key 7)");
  EXPECT_EQ(a.err.find("key id"), std::string::npos) << a.err;
  ::close(silent_fd);
}

// A key lockd does not accept is not "lockd down": lockd answers it with a key-rejected notice,
// and the CLI, having no authentic answer at the deadline, says lockd rejected the key, naming
// the address, the key id, the reason and the file, with the permission class (refused, 3).
TEST_F(CliTest, AWrongKeyIsARejectedKeyNotAnUnreachableLockd) {
  const std::string addr = start_lockd();
  ASSERT_FALSE(addr.empty());
  // Another cluster key with lockd's key id: the tag does not verify (bad_mac).
  const std::string other = (dir_ / "other.key").string();
  ASSERT_EQ(wire::generate_key_file(other).message(), "");
  const Result bad = cli({"show", "orders", "--lockd", addr, "--key-file", other, "--timeout-ms", "400"});
  EXPECT_ANSWER(bad, kRefused, "lockd at " + addr + " rejected our key (key id 1, bad_mac): check the key file " + other);
  EXPECT_EQ(bad.err.find("unreachable"), std::string::npos) << bad.err;
  // A key id lockd has no key for (unknown_key), as JSON too. The notices are rate-limited to one
  // a second, so this request may get none at first: a later one (retries go on) does.
  const std::string stranger = (dir_ / "stranger.key").string();
  ASSERT_EQ(wire::generate_key_file(stranger, wire::KeyKind::admin, 9).message(), "");
  const Result unknown = cli({"names", "--json", "--lockd", addr, "--admin-key-file", stranger, "--timeout-ms", "2500"});
  EXPECT_ANSWER(unknown, kRefused, "rejected our key (key id 9, unknown_key)");
  const auto j = nlohmann::json::parse(unknown.out);
  EXPECT_EQ(j["error"], "refused");
  EXPECT_EQ(j["reason"], "key_rejected");
  EXPECT_EQ(j["key_id"], 9);
  EXPECT_EQ(j["key_reject_reason"], "unknown_key");
  EXPECT_EQ(j["lockd"], addr);
  // lockd's right key still works.
  const Result good = cli(with({"names"}, lockd_flags(addr)));
  EXPECT_EQ(good.code, kOk) << good.err;
}

TEST_F(CliTest, BadLockdAddressOrKeyFileIsAUsageError) {
  const Result addr = cli({"names", "--lockd", "localhost", "--key-file", key_});
  EXPECT_ANSWER(addr, kUsage, "malformed lockd address \"localhost\"");
  // A list names its bad entry; a host name that does not resolve is not found (.invalid never
  // resolves, RFC 6761).
  const Result entry = cli({"names", "--lockd", "127.0.0.1:9,lockd-2", "--key-file", key_});
  EXPECT_ANSWER(entry, kUsage, "malformed lockd address \"lockd-2\" (entry 2 of 2): expected HOST:PORT");
  const Result mixed = cli({"names", "--lockd", "127.0.0.1:9,[::1]:9", "--key-file", key_});
  EXPECT_ANSWER(mixed, kUsage, "give addresses of one family");
  const Result unknown = cli({"names", "--lockd", "127.0.0.1:9,lockd.invalid:7400", "--key-file", key_});
  EXPECT_ANSWER(unknown, kNotFound, "cannot resolve host \"lockd.invalid\"");
  const Result key = cli({"show", "orders", "--lockd", kSilentLockd, "--key-file", (dir_ / "missing.key").string()});
  EXPECT_ANSWER(key, kUsage, "missing.key");
  // The fix names the program that has the flag: the CLI has no --generate-key.
  EXPECT_NE(key.err.find("create one with `leasehold-lockd --generate-key " + (dir_ / "missing.key").string() + "`"),
            std::string::npos) << key.err;
  EXPECT_EQ(key.err.find("create one with --generate-key"), std::string::npos) << key.err;
  ::chmod(key_.c_str(), 0644);
  const Result loose = cli(with({"show", "orders"}, lockd_flags(kSilentLockd)));
  EXPECT_ANSWER(loose, kUsage, "chmod 600");
}

// A replicated lockd's list: an address that does not answer is left (after its share of the
// timeout) for the next, in the flag and in the environment; a host name works as well.
TEST_F(CliTest, ALockdListPassesOverAnAddressThatDoesNotAnswer) {
  const std::string addr = start_lockd();
  ASSERT_FALSE(addr.empty());
  const std::string list = std::string(kSilentLockd) + "," + addr;
  const Result flag = cli({"names", "--lockd", list, "--key-file", key_, "--timeout-ms", "4000"});
  EXPECT_EQ(flag.code, kOk) << flag.err;
  const Result env = cli({"names", "--timeout-ms", "4000"}, {"LEASEHOLD_LOCKD=" + list, "LEASEHOLD_KEY_FILE=" + key_});
  EXPECT_EQ(env.code, kOk) << env.err;
  const Result name = cli({"names", "--lockd", "localhost:" + addr.substr(addr.rfind(':') + 1), "--key-file", key_});
  EXPECT_EQ(name.code, kOk) << name.err;
  // None of them answers: unreachable, naming the list.
  const Result none = cli({"names", "--lockd", "127.0.0.1:9,127.0.0.1:7", "--key-file", key_, "--timeout-ms", "400"});
  EXPECT_ANSWER(none, kUnreachable, "nothing listens at 127.0.0.1:9,127.0.0.1:7");
}

TEST_F(CliTest, NoSupervisorRunningNamesTheSocket) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"run", "--supervisor", no_socket_, "--name", "orders", "--", "/bin/true"},
           {"run", "--supervisor", no_socket_, "--", "/bin/true"},
           {"name", "--supervisor", no_socket_, kSandbox, "orders"},
           {"release", "--supervisor", no_socket_, "orders"},
           {"sandboxes", "--supervisor", no_socket_},
           {"commit", "--supervisor", no_socket_, "orders", "--sandbox", kSandbox, "--epoch", "3", "--", "/bin/true"},
       }) {
    const Result r = cli(args);
    SCOPED_TRACE(args[0]);
    EXPECT_ANSWER(r, kNoSupervisor, "no supervisor is running at " + no_socket_);
  }
  const Result env = cli({"sandboxes"}, {"LEASEHOLD_SUPERVISOR=" + no_socket_});
  EXPECT_ANSWER(env, kNoSupervisor, "no supervisor is running at " + no_socket_);
}

TEST_F(CliTest, MalformedSandboxOrEpochIsAUsageError) {
  const Result name = cli({"name", "--supervisor", no_socket_, "not-a-uuid", "orders"});
  EXPECT_ANSWER(name, kUsage, "malformed sandbox id \"not-a-uuid\"");
  const Result transfer = cli(with({"transfer", "orders", "--to", "xyz"}, lockd_flags(kSilentLockd)));
  EXPECT_ANSWER(transfer, kUsage, "malformed sandbox id \"xyz\"");
  const Result epoch = cli({"commit", "--supervisor", no_socket_, "orders", "--sandbox", kSandbox, "--epoch", "0",
                            "--", "/bin/true"});
  EXPECT_ANSWER(epoch, kUsage, "--epoch 0");
}

// A worker key asking about another worker's name is refused forbidden; lockd tells nothing of
// the name, and the CLI prints no state or epoch it was not told (it used to print "state free,
// epoch 0" for a held name).
TEST_F(CliTest, ForbiddenIsPrintedWithoutMadeUpState) {
  const std::string addr = start_lockd();
  ASSERT_FALSE(addr.empty());
  ASSERT_NE(held_at_lockd("orders", patient_lockd_flags(addr)), 0u);
  const std::string worker_key = (dir_ / "other-worker.key").string();
  auto cluster = wire::load_key_file(key_);
  ASSERT_TRUE(cluster) << cluster.message();
  ASSERT_EQ(wire::write_key_file(worker_key, wire::derive_worker_key(*cluster, WorkerId{0x77, 0x77})).message(), "");
  for (const auto& op : std::vector<std::vector<std::string>>{{"show", "orders"}, {"revoke", "orders"}}) {
    const Result r = cli(with(op, {"--lockd", addr, "--key-file", worker_key, "--timeout-ms", "10000"}));
    SCOPED_TRACE(op[0]);
    EXPECT_ANSWER(r, kRefused, "\"orders\" refused by lockd: forbidden: this key may not");
    EXPECT_EQ(r.err.find("state "), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("epoch"), std::string::npos) << r.err;
  }
}

TEST_F(CliTest, UnknownNameIsNotFoundAndKnownNamesAreListed) {
  const std::string addr = start_lockd();
  ASSERT_FALSE(addr.empty());
  const auto lf = lockd_flags(addr);
  for (const auto& args : std::vector<std::vector<std::string>>{
           with({"show", "no-such-name"}, lf),
           with({"transfer", "no-such-name", "--to", kSandbox}, lf),
       }) {
    const Result r = cli(args);
    SCOPED_TRACE(args[0]);
    EXPECT_ANSWER(r, kNotFound, "unknown name \"no-such-name\"");
  }
  // A 2-phase acquire makes the name known; a second one is refused with the holder.
  const Result first = cli(with({"acquire", "orders", "--sandbox", kSandbox, "--json"}, lf));
  ASSERT_EQ(first.code, kOk) << first.err;
  EXPECT_NE(first.out.find("\"state\":\"acquiring\""), std::string::npos) << first.out;
  const Result second = cli(with({"acquire", "orders", "--sandbox", "11111111-2222-4333-8444-555555555555"}, lf));
  EXPECT_ANSWER(second, kRefused, "refused by lockd: acquiring");
  EXPECT_NE(second.err.find(std::string("holder ") + kSandbox), std::string::npos) << second.err;
  const Result shown = cli(with({"show", "orders", "--json"}, lf));
  ASSERT_EQ(shown.code, kOk) << shown.err;
  EXPECT_NE(shown.out.find("\"state\":\"acquiring\""), std::string::npos) << shown.out;
  const Result names = cli(with({"names"}, lf));
  ASSERT_EQ(names.code, kOk) << names.err;
  EXPECT_NE(names.out.find("orders"), std::string::npos);
  EXPECT_NE(names.out.find("1 name(s)"), std::string::npos) << names.out;
  // Transfer needs a held name.
  const Result t = cli(with({"transfer", "orders", "--to", kSandbox}, lf));
  EXPECT_ANSWER(t, kRefused, "not held");
  // Revoke frees it at epoch + 1, and announces the epoch to a fenced store.
  const std::string db = (dir_ / "fence.db").string();
  const Result rv = cli(with({"revoke", "orders", "--fence-db", db, "--json"}, lf));
  ASSERT_EQ(rv.code, kOk) << rv.err;
  EXPECT_NE(rv.out.find("\"epoch\":2"), std::string::npos) << rv.out;
  const Result audit = cli({"audit", "--db", db, "--json"});
  ASSERT_EQ(audit.code, kOk) << audit.err;
  EXPECT_NE(audit.out.find("\"fences\":1"), std::string::npos) << audit.out;
}

// `names --state/--worker/--prefix` keep the names that match all given filters; a bad filter is
// a usage error naming it; a worker key's listing is refused (exit 3), not an internal error.
TEST_F(CliTest, NamesFiltersAndAWorkerKeysListing) {
  const std::string addr = start_lockd();
  ASSERT_FALSE(addr.empty());
  const auto lf = patient_lockd_flags(addr);
  ASSERT_NE(held_at_lockd("orders", lf), 0u);  // held on worker 6a1e0c4e-...
  ASSERT_EQ(cli(with({"acquire", "orders-eu", "--sandbox", kSandbox}, lf)).code, kOk);  // acquiring
  ASSERT_EQ(cli(with({"acquire", "billing", "--sandbox", kSandbox}, lf)).code, kOk);
  auto listed = [&](const std::vector<std::string>& filters) {
    const Result r = cli(with(with({"names", "--json"}, filters), lf));
    EXPECT_EQ(r.code, kOk) << r.err;
    std::vector<std::string> names;
    for (const auto& e : nlohmann::json::parse(r.out)) names.push_back(e["name"]);
    return names;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(listed({}), (V{"billing", "orders", "orders-eu"}));
  EXPECT_EQ(listed({"--prefix", "orders"}), (V{"orders", "orders-eu"}));
  EXPECT_EQ(listed({"--state", "held"}), (V{"orders"}));
  EXPECT_EQ(listed({"--state", "acquiring", "--prefix", "orders"}), (V{"orders-eu"}));
  EXPECT_EQ(listed({"--worker", "6a1e0c4e-5a55-4d3e-9a5b-1b2c3d4e5f60"}), (V{"orders"}));
  EXPECT_EQ(listed({"--prefix", "nothing"}), V{});
  const Result text = cli(with({"names", "--state", "held"}, lf));
  EXPECT_NE(text.out.find("1 name(s)"), std::string::npos) << text.out;
  EXPECT_ANSWER(cli(with({"names", "--state", "taken"}, lf)), kUsage,
                "--state \"taken\" is not a state; the states are free, acquiring, held, transferring");
  EXPECT_ANSWER(cli(with({"names", "--worker", "w1"}, lf)), kUsage, "--worker \"w1\" is not a worker id");
  const std::string worker_key = (dir_ / "worker.key").string();
  auto cluster = wire::load_key_file(key_);
  ASSERT_TRUE(cluster) << cluster.message();
  ASSERT_EQ(wire::write_key_file(worker_key, wire::derive_worker_key(*cluster, WorkerId{0x77, 0x77})).message(), "");
  const Result forbidden = cli({"names", "--lockd", addr, "--key-file", worker_key, "--timeout-ms", "10000"});
  EXPECT_ANSWER(forbidden, kRefused, "list names refused by lockd: forbidden");
}

// A lockd whose port is busy exits 1 naming it, and leaves no store file it created (nor a
// signing key); a store that was there stays.
TEST_F(CliTest, LockdOnABusyPortLeavesNoStoreBehind) {
  const std::string addr = start_lockd();
  ASSERT_FALSE(addr.empty());
  auto second = [&](const std::string& store) {
    const fs::path out = dir_ / "lockd2.out";
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(o, 1);
      ::dup2(o, 2);
      ::execl(LEASEHOLD_LOCKD_BINARY, LEASEHOLD_LOCKD_BINARY, "--no-config", "--listen", addr.c_str(), "--store", store.c_str(),
              "--key-file", key_.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    return std::pair{WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(out)};
  };
  const fs::path fresh = dir_ / "fresh.db";
  const auto [code, err] = second(fresh.string());
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("Address already in use"), std::string::npos) << err;
  for (const char* suffix : {"", "-wal", "-shm", "-journal", ".signing.key", ".signing.key.pub"})
    EXPECT_FALSE(fs::exists(fresh.string() + suffix)) << fresh.string() + suffix << " left behind";
  // An existing store is kept as it was.
  const fs::path kept = dir_ / "lockd.db";
  ASSERT_TRUE(fs::exists(kept));
  const auto size = fs::file_size(kept);
  EXPECT_EQ(second(kept.string()).first, 1);
  EXPECT_TRUE(fs::exists(kept));
  EXPECT_EQ(fs::file_size(kept), size);
}

#ifdef LEASEHOLD_SUPERVISOR_BINARY
// A supervisor whose --ttl-ms is above lockd's: lockd answered, so the start-up refusal says the
// two disagree (exit 2) and names both TTLs; it is not reported as lockd unreachable.
TEST_F(CliTest, SupervisorTtlAboveLockdsIsAMisconfigurationNotUnreachable) {
  const std::string addr = start_lockd({"--ttl-ms", "5000"});
  ASSERT_FALSE(addr.empty());
  auto cluster = wire::load_key_file(key_);
  ASSERT_TRUE(cluster) << cluster.message();
  const std::string worker_key = (dir_ / "worker.key").string();
  ASSERT_EQ(wire::write_key_file(worker_key, wire::derive_worker_key(*cluster, WorkerId{0x51, 0x52})).message(), "");
  auto supervisor = [&](const std::string& lockd) {
    const fs::path out = dir_ / "supervisor.out";
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(o, 1);
      ::dup2(o, 2);
      const std::string sock = (dir_ / "sup.sock").string(), shm = (dir_ / "sup.shm").string();
      ::execl(LEASEHOLD_SUPERVISOR_BINARY, LEASEHOLD_SUPERVISOR_BINARY, "--no-config", "--lockd", lockd.c_str(), "--key-file",
              worker_key.c_str(), "--ttl-ms", "10000", "--control-socket", sock.c_str(), "--shm", shm.c_str(),
              "--slots", "4", "--isolation", "off", "--no-cgroup", "--allow-unsafe-kill", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    return std::pair{WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(out)};
  };
  const auto [code, err] = supervisor(addr);
  EXPECT_EQ(code, 2) << err;
  EXPECT_NE(err.find("lockd at " + addr + " answered, but this supervisor cannot work with it: lockd's lease TTL is "
                     "5000 ms, below --ttl-ms 10000"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("unreachable"), std::string::npos) << err;
  // Nobody there: that one is unreachable.
  const auto [silent_code, silent_err] = supervisor(kSilentLockd);
  EXPECT_EQ(silent_code, 2) << silent_err;
  EXPECT_NE(silent_err.find(std::string("lockd at ") + kSilentLockd + " is unreachable"), std::string::npos) << silent_err;
}
#endif

TEST_F(CliTest, CheckWithoutATableOrArguments) {
  const Result none = cli({"check"});
  EXPECT_ANSWER(none, kUsage, "LEASEHOLD_SHM");
  const Result missing = cli({"check", "--shm", (dir_ / "no-table").string(), "--slot", "0", "--epoch", "1"});
  EXPECT_EQ(missing.code, kTableError) << missing.err;
  EXPECT_NE(missing.err.find("no-table"), std::string::npos) << missing.err;
  const Result env = cli({"check"}, {"LEASEHOLD_SHM=" + (dir_ / "no-table").string(), "LEASEHOLD_SLOT=0",
                                     "LEASEHOLD_EPOCH=1"});
  EXPECT_EQ(env.code, kTableError) << env.err;
}

// A live table: the runtime's view follows publish, the deadline and revoke.
// A control socket whose "supervisor" answers every request line with `answer` (or, if empty,
// reads and never answers), on a thread, for the exit codes of the supervisor's answers.
class FakeSupervisor {
 public:
  /// `answer_first`: answer and close at once, without reading the request (as the supervisor
  /// refuses a connection when busy).
  /// The answer for each request line ("": stay silent on that connection).
  using Answerer = std::function<std::string(const nlohmann::json& request)>;
  FakeSupervisor(const std::string& path, Answerer answerer) : FakeSupervisor(path, std::string(" ")) {
    std::lock_guard<std::mutex> lock(mu_);
    answerer_ = std::move(answerer);
  }
  FakeSupervisor(const std::string& path, std::string answer, bool answer_first = false)
      : path_(path), answer_(std::move(answer)), answer_first_(answer_first) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 4), 0);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[4096];
        std::string in;
        while (!answer_first_ && in.find('\n') == std::string::npos) {
          const ssize_t n = ::recv(c, buf, sizeof buf, 0);
          if (n <= 0) break;
          in.append(buf, static_cast<std::size_t>(n));
        }
        std::string reply = answer_;
        {
          std::lock_guard<std::mutex> lock(mu_);
          requests_.push_back(in.substr(0, in.find('\n')));
          if (answerer_) reply = answerer_(nlohmann::json::parse(requests_.back(), nullptr, false));
        }
        if (!reply.empty()) {
          const std::string line = reply + "\n";
          [[maybe_unused]] const ssize_t n = ::send(c, line.data(), line.size(), MSG_NOSIGNAL);
          ::close(c);
        } else {
          held_.push_back(c);  // silent: keep it open, never answer
        }
      }
    });
  }
  ~FakeSupervisor() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
    for (int c : held_) ::close(c);
    ::unlink(path_.c_str());
  }
  /// The request lines received so far (without the newline), in order.
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> requests_;  // guarded by mu_
  std::string path_;
  std::string answer_;
  Answerer answerer_;  // guarded by mu_ (set before the first connection)
  bool answer_first_ = false;
  int fd_ = -1;
  std::thread thread_;
  std::vector<int> held_;
};

// The name "-" (or any beginning with '-') is refused: listings print "-" for none, and on a
// command line it reads as an option. Refused before anything is sent.
TEST_F(CliTest, ANameBeginningWithADashIsRefused) {
  const std::string sock = (dir_ / "fake-dash.sock").string();
  FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", true}, {"sandbox", kSandbox}}).dump());
  for (const std::string name : {"-", "-x"}) {
    SCOPED_TRACE(name);
    const Result run = cli({"run", "--supervisor", sock, "--name=" + name, "--", "/bin/true"});
    EXPECT_ANSWER(run, kUsage, "malformed name \"" + name + "\": name begins with '-'");
    const Result acq = cli(with(with({"acquire", "--sandbox", kSandbox}, lockd_flags(kSilentLockd)), {"--", name}));
    EXPECT_ANSWER(acq, kUsage, "begins with '-'");
  }
  EXPECT_TRUE(f.requests().empty());
  const Result ok = cli({"run", "--supervisor", sock, "--name", "x-", "--", "/bin/true"});
  EXPECT_EQ(ok.code, kOk) << ok.err;
  // A name stored before the rule can still be managed: release (like show, revoke, logs)
  // checks only that the name is well-formed.
  const std::size_t before = f.requests().size();
  const Result release = cli({"release", "--supervisor", sock, "--", "-x"});
  EXPECT_EQ(release.code, kOk) << release.out << release.err;
  EXPECT_EQ(f.requests().size(), before + 1);
}

// --json output speaks one convention: a duration left is "ttl_left_ms" (never "valid_until_ms"
// or "valid_for_ms"), a supervisor's answer comes without the control socket's envelope, and
// every command prints its failure as one JSON object on stdout as well.
TEST_F(CliTest, JsonOutputHasOneConventionAndErrorsAreJsonToo) {
  const std::string sock = (dir_ / "fake-json.sock").string();
  {
    FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"id", 3}, {"ok", true}, {"sandbox", kSandbox}, {"name", "orders"},
                                           {"epoch", 7}, {"slot", 2}, {"pid", 42}, {"valid_until_ms", 6970}})
                               .dump());
    const Result r = cli({"run", "--json", "--supervisor", sock, "--name", "orders", "--", "/bin/true"});
    ASSERT_EQ(r.code, kOk) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j, nlohmann::json({{"sandbox", kSandbox}, {"name", "orders"}, {"epoch", 7}, {"slot", 2}, {"pid", 42},
                                 {"ttl_left_ms", 6970}}))
        << r.out;
    const Result text = cli({"run", "--supervisor", sock, "--name", "orders", "--", "/bin/true"});
    EXPECT_NE(text.out.find("kill-switch  in 6970 ms unless heartbeats refresh the lease"), std::string::npos) << text.out;
  }
  {
    FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", true},
                                           {"sandboxes", {{{"sandbox", kSandbox}, {"valid_until_ms", 500}, {"state", "running"}}}}})
                               .dump());
    const Result r = cli({"sandboxes", "--json", "--supervisor", sock});
    ASSERT_EQ(r.code, kOk) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j.size(), 1u) << r.out;
    EXPECT_EQ(j[0]["ttl_left_ms"], 500) << r.out;
    EXPECT_FALSE(j[0].contains("valid_until_ms")) << r.out;
    const Result text = cli({"sandboxes", "--supervisor", sock});
    EXPECT_NE(text.out.find("TTL_LEFT"), std::string::npos) << text.out;
  }
  // Failures, each one JSON object on stdout with the exit code's word and the message.
  const std::vector<std::pair<std::vector<std::string>, int>> failing = {
      {{"sandboxes", "--json", "--supervisor", no_socket_}, kNoSupervisor},
      {with({"names", "--json"}, lockd_flags(kSilentLockd)), kUnreachable},
      {with({"show", "bad name!", "--json"}, lockd_flags(kSilentLockd)), kUsage},
      {{"check", "--json", "--shm", (dir_ / "no-table").string(), "--slot", "0", "--epoch", "1"}, kTableError},
      {{"dump", "--json", "--shm", (dir_ / "no-table").string()}, kTableError},
      {{"audit", "--json", "--db", (dir_ / "no.db").string()}, kNotFound},
      {{"names", "--json", "--no-such-flag"}, kUsage},
  };
  for (const auto& [args, code] : failing) {
    SCOPED_TRACE(args[0]);
    const Result r = cli(args);
    EXPECT_EQ(r.code, code) << r.err;
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << "stdout: " << r.out;
    EXPECT_EQ(j["exit_code"], code) << r.out;
    EXPECT_TRUE(j["error"].is_string()) << r.out;
    EXPECT_FALSE(j["message"].get<std::string>().empty()) << r.out;
    EXPECT_NE(r.err.find(j["message"].get<std::string>()), std::string::npos) << "the same message on stderr: " << r.err;
  }
  const Result unreachable = cli(with({"names", "--json"}, lockd_flags(kSilentLockd)));
  EXPECT_EQ(nlohmann::json::parse(unreachable.out)["error"], "unreachable");
}

TEST_F(CliTest, SupervisorRefusalsAndSilenceHaveTheirExitCodes) {
  const std::string sock = (dir_ / "fake.sock").string();
  for (const char* code : {"table_full", "busy", "held"}) {
    FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", false}, {"error", code}, {"message", "no room"}}).dump());
    const Result r = cli({"run", "--supervisor", sock, "--", "/bin/true"});
    EXPECT_ANSWER(r, kRefused, "no room");
    EXPECT_EQ(r.out, "");
  }
  {  // --json: the refusal, holder and epoch included, on stdout for a caller that parses JSON
    FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", false}, {"error", "held"}, {"message", "held elsewhere"},
                                           {"holder", kSandbox}, {"epoch", 41}})
                               .dump());
    const Result r = cli({"run", "--json", "--supervisor", sock, "--name", "orders", "--", "/bin/true"});
    EXPECT_ANSWER(r, kRefused, "held elsewhere");
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["error"], "refused");
    EXPECT_EQ(j["exit_code"], kRefused);
    EXPECT_EQ(j["reason"], "held");
    EXPECT_EQ(j["holder"], kSandbox);
    EXPECT_EQ(j["epoch"], 41);
    EXPECT_NE(j["message"].get<std::string>().find("held elsewhere"), std::string::npos) << r.out;
    EXPECT_FALSE(j.contains("ok")) << "no control-socket envelope: " << r.out;
  }
  {  // refused before the request is read: the answer still reaches the caller (exit 3, not 7)
    FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", false}, {"error", "busy"}, {"message", "too many"}}).dump(),
                     true);
    for (int i = 0; i < 10; ++i) {
      const Result r = cli({"sandboxes", "--supervisor", sock});
      EXPECT_ANSWER(r, kRefused, "too many");
    }
  }
  FakeSupervisor silent(sock, "");
  const Result r = cli({"sandboxes", "--supervisor", sock, "--timeout-ms", "300"});
  EXPECT_ANSWER(r, kNoSupervisor, "did not answer within 300 ms");
}

// Every code the supervisor can send (control_error() takes a ControlError, so these are all of
// them) ends in the exit code the README documents for it; the table is written out here, not
// derived from kControlErrors, so a row moved to another class there fails here.
TEST_F(CliTest, EveryControlErrorHasItsDocumentedExitCode) {
  const std::pair<ControlError, int> documented[] = {
      {ControlError::bad_json, kUsage},          {ControlError::bad_version, kFailure},
      {ControlError::bad_request, kUsage},       {ControlError::unknown_op, kFailure},
      {ControlError::too_long, kUsage},          {ControlError::unauthorized, kRefused},
      {ControlError::busy, kRefused},            {ControlError::idle, kFailure},
      {ControlError::timeout, kFailure},         {ControlError::shutting_down, kRefused},
      {ControlError::held, kRefused},            {ControlError::refused, kRefused},
      {ControlError::killswitch, kRefused},      {ControlError::table_full, kRefused},
      {ControlError::forbidden, kRefused},       {ControlError::not_found, kNotFound},
      {ControlError::exec_failed, kNotFound},    {ControlError::unreachable, kUnreachable},
      {ControlError::internal, kFailure},
  };
  static_assert(std::size(documented) == kControlErrors.size(), "one documented exit code per ControlError");
  const std::string sock = (dir_ / "fake-codes.sock").string();
  for (std::size_t i = 0; i < std::size(documented); ++i) {
    const auto [error, exit_code] = documented[i];
    ASSERT_EQ(static_cast<std::size_t>(error), i) << "the table lists each ControlError once, in order";
    const std::string code(to_string(error));
    SCOPED_TRACE(code);
    FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", false}, {"error", code}, {"message", "said " + code}}).dump());
    const Result r = cli({"sandboxes", "--supervisor", sock});
    EXPECT_ANSWER(r, exit_code, "said " + code);
  }
}

// A code from a newer supervisor that this build does not know is a failure (exit 1), and the
// caller sees the code's text rather than a guess at what it means.
TEST_F(CliTest, UnknownControlErrorIsAFailureNamingTheCode) {
  const std::string sock = (dir_ / "fake-unknown.sock").string();
  ASSERT_FALSE(control_error_of("lease_moved_to_mars"));
  FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", false}, {"error", "lease_moved_to_mars"},
                                         {"message", "try the other planet"}})
                             .dump());
  const Result r = cli({"sandboxes", "--supervisor", sock});
  EXPECT_ANSWER(r, kFailure, "try the other planet");
  EXPECT_NE(r.err.find("\"lease_moved_to_mars\""), std::string::npos) << r.err;
}

// An ownership refusal ("forbidden": another caller's sandbox) is a refusal, exit 3 as the README
// says; so is "unauthorized" (this user may not use the socket at all) and a connect(2) that the
// socket's mode refuses: a supervisor runs there (exit 7 would say none does).
TEST_F(CliTest, ForbiddenSandboxAndAnUnauthorizedCallerAreRefusals) {
  const std::string sock = (dir_ / "fake-owner.sock").string();
  {
    FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", false}, {"error", "forbidden"},
                                           {"message", "sandbox X belongs to uid 0"}})
                               .dump());
    for (const auto& args : std::vector<std::vector<std::string>>{{"release", "--supervisor", sock, "orders"},
                                                                   {"logs", "--supervisor", sock, "orders"},
                                                                   {"name", "--supervisor", sock, kSandbox, "orders"}}) {
      SCOPED_TRACE(args[0]);
      const Result r = cli(args);
      EXPECT_ANSWER(r, kRefused, "belongs to uid 0");
    }
  }
  FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", false}, {"error", "unauthorized"},
                                         {"message", "uid 65534 may not use this control socket"}})
                             .dump(),
                   true);
  const Result r = cli({"sandboxes", "--supervisor", sock});
  EXPECT_ANSWER(r, kRefused, "may not use this control socket");
  // EACCES from connect(2): the CLI as uid 65534, the socket in a directory only root may search.
  if (::geteuid() == 0) {
    const auto as_nobody = [] { return ::setgroups(0, nullptr) == 0 && ::setgid(65534) == 0 && ::setuid(65534) == 0; };
    const Result denied = cli({"sandboxes", "--supervisor", sock}, {}, as_nobody);
    EXPECT_ANSWER(denied, kRefused, "permission denied: not allowed to connect to the supervisor at " + sock);
    const Result none = cli({"sandboxes", "--supervisor", (dir_ / "nobody-here.sock").string()}, {}, as_nobody);
    EXPECT_NE(none.code, kNoSupervisor) << "a path it may not search is not 'no supervisor': " << none.err;
  }
}

// `run --env K=V -- CMD...`: one value per --env (repeatable), and everything after `--` is the
// command, its options included (a list option used to swallow the `--`, and `-c` of
// `sh -c` was then "not expected").
TEST_F(CliTest, RunEnvTakesOneValueAndTheCommandIsEverythingAfterTheSeparator) {
  const std::string sock = (dir_ / "fake-run.sock").string();
  FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", true}, {"sandbox", kSandbox}, {"pid", 42}}).dump());
  const Result one = cli({"run", "--supervisor", sock, "--env", "K=V", "--", "sh", "-c", "echo hi"});
  EXPECT_EQ(one.code, kOk) << one.err;
  const Result two = cli({"run", "--supervisor", sock, "--env", "A=1", "--env", "B=x=y", "--name", "orders", "--",
                          "/usr/bin/env", "--env", "C=3", "-i"});
  EXPECT_EQ(two.code, kOk) << two.err;
  const Result bad = cli({"run", "--supervisor", sock, "--env", "novalue", "--", "true"});
  EXPECT_ANSWER(bad, kUsage, "--env \"novalue\" is not KEY=VALUE");
  const auto req = f.requests();
  ASSERT_EQ(req.size(), 2u);
  const auto a = nlohmann::json::parse(req[0]);
  EXPECT_EQ(a["argv"], nlohmann::json({"sh", "-c", "echo hi"})) << req[0];
  EXPECT_EQ(a["env"]["K"], "V") << req[0];
  const auto b = nlohmann::json::parse(req[1]);
  EXPECT_EQ(b["argv"], nlohmann::json({"/usr/bin/env", "--env", "C=3", "-i"})) << req[1];
  EXPECT_EQ(b["env"]["A"], "1") << req[1];
  EXPECT_EQ(b["env"]["B"], "x=y") << req[1];
  EXPECT_FALSE(b["env"].contains("C")) << req[1];
  EXPECT_EQ(b["name"], "orders") << req[1];
}

// A control socket served by another uid (65534) in a directory anyone may write: what the
// fake server receives from root's CLI. With the server check ablated
// (LEASEHOLD_ABLATE=unchecked-control-server) it receives the command line and the environment;
// with it on, nothing, and every command names the socket, the server's uid and the one expected.
class ForeignServer {
 public:
  explicit ForeignServer(const std::string& path) {
    int ready[2];
    if (::pipe(ready) != 0 || ::pipe(got_) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      ::close(got_[0]);
      if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
      const int lfd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
      if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 16) != 0) ::_exit(11);
      ::chmod(path.c_str(), 0777);
      [[maybe_unused]] ssize_t w = ::write(ready[1], "r", 1);
      for (;;) {  // until SIGKILL: copy each request line to the parent
        const int c = ::accept(lfd, nullptr, nullptr);
        if (c < 0) continue;
        char buf[4096];
        for (ssize_t n; (n = ::recv(c, buf, sizeof buf, 0)) > 0;) {
          w = ::write(got_[1], buf, static_cast<std::size_t>(n));
          if (std::memchr(buf, '\n', static_cast<std::size_t>(n)) != nullptr) break;
        }
        ::close(c);
      }
    }
    ::close(ready[1]);
    ::close(got_[1]);
    char r = 0;
    ok_ = ::read(ready[0], &r, 1) == 1;
    ::close(ready[0]);
  }
  ~ForeignServer() { stop(); }
  bool ok() const { return ok_; }
  /// Stops the server; everything it received.
  std::string stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
      char buf[4096];
      for (ssize_t n; (n = ::read(got_[0], buf, sizeof buf)) > 0;) received_.append(buf, static_cast<std::size_t>(n));
      ::close(got_[0]);
    }
    return received_;
  }

 private:
  pid_t pid_ = -1;
  int got_[2] = {-1, -1};
  bool ok_ = false;
  std::string received_;
};

TEST_F(CliTest, NothingIsSentToAControlSocketOfAnotherUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a server as another uid";
  const fs::path open_dir = dir_ / "anyone";
  ASSERT_TRUE(fs::create_directory(open_dir));
  ::chmod(dir_.c_str(), 0755);
  ::chmod(open_dir.c_str(), 0777);
  const std::string sock = (open_dir / "sup.sock").string();
  const std::vector<std::vector<std::string>> commands = {
      {"run", "--supervisor", sock, "--env", "SECRET=hunter2", "--", "/bin/true"},
      {"release", "--supervisor", sock, "orders"},
      {"sandboxes", "--supervisor", sock},
      {"logs", "--supervisor", sock, "orders"},
      {"name", "--supervisor", sock, kSandbox, "orders"}};
  for (const bool defended : {false, true}) {
    SCOPED_TRACE(defended ? "defended" : "ablated");
    ForeignServer server(sock);
    ASSERT_TRUE(server.ok());
    const std::vector<std::string> env =
        defended ? std::vector<std::string>{} : std::vector<std::string>{"LEASEHOLD_ABLATE=unchecked-control-server"};
    for (const auto& args : commands) {
      SCOPED_TRACE(args[0]);
      const Result r = cli(args, env);
      EXPECT_EQ(r.code, kNoSupervisor) << r.err;
      if (defended) {
        EXPECT_NE(r.err.find("the control socket " + sock + " is served by uid 65534"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("expected root (uid 0)"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("refusing to send"), std::string::npos) << r.err;
      }
    }
    const std::string got = server.stop();
    ::unlink(sock.c_str());
    if (defended) {
      EXPECT_EQ(got, "") << "the foreign server received a request";
    } else {  // the attack: every command reached it, the environment with the first
      EXPECT_NE(got.find("\"SECRET\":\"hunter2\""), std::string::npos) << got;
      EXPECT_NE(got.find("\"argv\":[\"/bin/true\"]"), std::string::npos) << got;
      EXPECT_EQ(std::count(got.begin(), got.end(), '\n'), static_cast<long>(commands.size())) << got;
    }
  }
}

TEST_F(CliTest, LogsPrintsTheSandboxOutputAndAsksByIdOrName) {
  const std::string sock = (dir_ / "fake-logs.sock").string();
  {
    FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", true}, {"sandbox", kSandbox}, {"output", "line 1\nline 2\n"},
                                           {"truncated", false}, {"running", true}})
                               .dump());
    const Result by_name = cli({"logs", "--supervisor", sock, "orders"});
    EXPECT_EQ(by_name.code, kOk) << by_name.err;
    EXPECT_EQ(by_name.out, "line 1\nline 2\n");
    const Result by_id = cli({"logs", "--supervisor", sock, "--json", kSandbox});
    EXPECT_EQ(by_id.code, kOk) << by_id.err;
    EXPECT_EQ(nlohmann::json::parse(by_id.out)["output"], "line 1\nline 2\n");
  }
  {
    FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", false}, {"error", "not_found"}, {"message", "no sandbox named"}}).dump());
    const Result r = cli({"logs", "--supervisor", sock, "orders"});
    EXPECT_ANSWER(r, kNotFound, "no sandbox named");
  }
  const Result bad = cli({"logs", "--supervisor", sock, "bad name!"});
  EXPECT_EQ(bad.code, kUsage) << bad.err;
}

TEST_F(CliTest, TransferChecksTheReceiverBeforeAnythingMoves) {
  // A held name (2-phase, committed straight at lockd); a receiving supervisor that does not
  // run the --to sandbox: refused before begin, and the holder keeps the name at its epoch.
  const std::string addr = start_lockd();
  const auto lf = lockd_flags(addr);
  const std::uint64_t held = held_at_lockd("moved", lf);
  ASSERT_NE(held, 0u);
  const auto epoch = std::to_string(held);
  const std::string sock = (dir_ / "receiver.sock").string();
  FakeSupervisor receiver(sock, nlohmann::json({{"v", 1},
                                                {"ok", true},
                                                {"worker", "6a1e0c4e-5a55-4d3e-9a5b-1b2c3d4e5f60"},
                                                {"sandboxes", nlohmann::json::array()}})
                                    .dump());
  const std::string other = "1b4e28ba-2fa1-41d2-883f-0016d3cca427";
  const Result r = cli(with({"transfer", "moved", "--to", other, "--to-supervisor", sock}, lf));
  EXPECT_ANSWER(r, kNotFound, "no running unnamed sandbox " + other);
  const Result self = cli(with({"transfer", "moved", "--to", kSandbox}, lf));
  EXPECT_ANSWER(self, kRefused, "already holds it");
  const Result shown = cli(with({"show", "moved", "--json"}, lf));
  ASSERT_EQ(shown.code, kOk) << shown.err;
  const auto j = nlohmann::json::parse(shown.out);
  EXPECT_EQ(j["state"], "held");
  EXPECT_EQ(std::to_string(j["epoch"].get<std::uint64_t>()), epoch) << "nothing moved";
}

TEST_F(CliTest, StatsPrintsEachLockdsCountersAndNamesOneThatDoesNotAnswer) {
  const std::string addr = start_lockd();
  const auto lf = patient_lockd_flags(addr);
  ASSERT_EQ(cli(with({"acquire", "counted", "--sandbox", kSandbox}, lf)).code, kOk);
  const Result text = cli(with({"stats"}, lf));
  ASSERT_EQ(text.code, kOk) << text.err;
  EXPECT_NE(text.out.find("lockd " + addr + "\n"), std::string::npos) << text.out;
  const Result json = cli(with({"stats", "--json"}, lf));
  ASSERT_EQ(json.code, kOk) << json.err;
  const auto doc = nlohmann::json::parse(json.out);
  ASSERT_EQ(doc["lockd"].size(), 1u) << json.out;
  EXPECT_EQ(doc["lockd"][0]["address"], addr);
  const auto& counters = doc["lockd"][0]["counters"];
  // Real values: the one acquire above, and the text form says the same.
  ASSERT_TRUE(counters.contains("grants")) << json.out;
  EXPECT_GE(counters["grants"].get<std::uint64_t>(), 1u);
  EXPECT_NE(text.out.find("  grants " + std::to_string(counters["grants"].get<std::uint64_t>()) + "\n"),
            std::string::npos)
      << text.out;
  // A second address that nobody answers: the first lockd's counters still print, the silent one
  // is named, and the exit code is lockd unreachable.
  const Result both = cli({"stats", "--json", "--lockd", addr + "," + kSilentLockd, "--key-file", key_,
                           "--timeout-ms", "300"});
  EXPECT_EQ(both.code, kUnreachable) << both.err;
  const auto two = nlohmann::json::parse(both.out);
  ASSERT_EQ(two["lockd"].size(), 2u) << both.out;
  EXPECT_TRUE(two["lockd"][0].contains("counters")) << both.out;
  EXPECT_EQ(two["lockd"][1]["address"], kSilentLockd);
  EXPECT_NE(both.err.find(kSilentLockd), std::string::npos) << both.err;
}

TEST_F(CliTest, RevokeOfAFreeNameIsNotHeldUnlessForced) {
  const std::string addr = start_lockd();
  const auto lf = patient_lockd_flags(addr);
  const Result acq = cli(with({"acquire", "idle", "--sandbox", kSandbox, "--json"}, lf));
  ASSERT_EQ(acq.code, kOk) << acq.err;
  const auto e = nlohmann::json::parse(acq.out)["epoch"].get<std::uint64_t>();
  const Result first = cli(with({"revoke", "idle", "--json"}, lf));  // Acquiring -> Free, e + 1
  ASSERT_EQ(first.code, kOk) << first.err;
  EXPECT_EQ(nlohmann::json::parse(first.out)["epoch"], e + 1);
  for (int i = 0; i < 2; ++i) {  // again and again: "not held", and no epoch is burned
    const Result again = cli(with({"revoke", "idle"}, lf));
    EXPECT_ANSWER(again, kNotFound, "not held");
    const Result shown = cli(with({"show", "idle", "--json"}, lf));
    ASSERT_EQ(shown.code, kOk) << shown.err;
    EXPECT_EQ(nlohmann::json::parse(shown.out)["epoch"], e + 1);
  }
  const Result forced = cli(with({"revoke", "idle", "--force", "--json"}, lf));
  ASSERT_EQ(forced.code, kOk) << forced.err;
  EXPECT_EQ(nlohmann::json::parse(forced.out)["epoch"], e + 2);
  EXPECT_ANSWER(cli(with({"revoke", "never-seen"}, lf)), kNotFound, "unknown name");
}

TEST_F(CliTest, RevokeFenceDbAnnouncesTheNewEpochBeforeTheRevoke) {
  const std::string addr = start_lockd();
  const auto lf = patient_lockd_flags(addr);
  const std::uint64_t e = held_at_lockd("fenced", lf);
  ASSERT_NE(e, 0u);
  // A resource that cannot be told: nothing is revoked (the old holder would otherwise write
  // with an epoch the resource does not yet know to be stale).
  const std::string bad = (dir_ / "not-a-store.db").string();
  std::ofstream(bad) << "this is not a SQLite database, and it is not empty\n";
  const Result refused = cli(with({"revoke", "fenced", "--fence-db", bad}, lf));
  EXPECT_EQ(refused.code, kUsage) << refused.err;
  const Result still = cli(with({"show", "fenced", "--json"}, lf));
  ASSERT_EQ(still.code, kOk) << still.err;
  EXPECT_EQ(nlohmann::json::parse(still.out)["state"], "held") << "revoked although the resource was not told";
  EXPECT_EQ(nlohmann::json::parse(still.out)["epoch"], e);
  // A fenced store: it knows the new epoch by the time lockd applied it.
  const std::string db = (dir_ / "resource.db").string();
  const Result ok = cli(with({"revoke", "fenced", "--fence-db", db, "--json"}, lf));
  ASSERT_EQ(ok.code, kOk) << ok.err;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["epoch"], e + 1);
  auto store_opened = resource::FencedStore::open(db);
  ASSERT_TRUE(store_opened.ok()) << store_opened.message();
  auto store = std::move(store_opened).value();
  EXPECT_EQ(store->highest("fenced"), e + 1);
}

TEST_F(CliTest, TransferReservationLapsesAfterItsTtl) {
  // A transfer to a sandbox that never comes: the reservation lapses and anyone may acquire,
  // at the transfer's (fresh) epoch.
  // A TTL long enough for the CLI calls below on a loaded machine (under ASan each takes a
  // fraction of a second): the transfer must find the lease still held.
  const std::string addr = start_lockd({"--reservation-ttl-ms", "6000", "--ttl-ms", "4000"});
  const auto lf = patient_lockd_flags(addr);
  const std::uint64_t e = held_at_lockd("moved", lf);
  ASSERT_NE(e, 0u);
  const std::string nobody = "1b4e28ba-2fa1-41d2-883f-0016d3cca427";
  // The reservation names the worker that may take it: the CLI needs to know which.
  const Result unbound = cli(with({"transfer", "moved", "--to", nobody, "--wait-ms", "0"}, lf));
  EXPECT_ANSWER(unbound, kUsage, "give --to-supervisor SOCKET or --to-worker UUID");
  // No supervisor runs the holder, so none confirms its kill: lockd refuses to complete the
  // transfer (lock_delay) until the old lease would have ended, and the name stays transferring.
  const Result early = cli(with({"transfer", "moved", "--to", nobody, "--to-worker", "6a1e0c4e-5a55-4d3e-9a5b-1b2c3d4e5f60",
                                 "--wait-ms", "0"},
                                lf));
  EXPECT_EQ(early.code, kFailure) << early.out << early.err;
  EXPECT_NE(early.err.find("refused lock_delay"), std::string::npos) << early.err;
  EXPECT_NE(early.err.find("stays transferring"), std::string::npos) << early.err;
  EXPECT_EQ(nlohmann::json::parse(cli(with({"show", "moved", "--json"}, lf)).out)["state"], "transferring");
  // The same command again resumes it and waits for the guard's bound (the lease's end).
  const Result t = cli(with({"transfer", "moved", "--to", nobody, "--json"}, lf));
  ASSERT_EQ(t.code, kOk) << t.err;
  EXPECT_EQ(nlohmann::json::parse(t.out)["ended_by"], "lease_expired") << t.out;
  const Result text = cli(with({"show", "moved"}, lf));
  EXPECT_NE(text.out.find("lapses in "), std::string::npos) << text.out;
  const Result shown = cli(with({"show", "moved", "--json"}, lf));
  ASSERT_EQ(shown.code, kOk) << shown.err;
  const auto j = nlohmann::json::parse(shown.out);
  EXPECT_EQ(j["reserved_for"], nobody);
  ASSERT_TRUE(j["reservation_left_ms"].is_number()) << shown.out;
  EXPECT_LE(j["reservation_left_ms"].get<std::uint64_t>(), 6000u);
  // Wait for the lapse (an event lockd reports), not for a fixed time.
  nlohmann::json after;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    after = nlohmann::json::parse(cli(with({"show", "moved", "--json"}, lf)).out);
  } while (!after["reserved_for"].is_null() && std::chrono::steady_clock::now() < deadline);
  ASSERT_TRUE(after["reserved_for"].is_null()) << "the reservation never lapsed: " << after.dump();
  EXPECT_EQ(after["state"], "free");
  EXPECT_EQ(after["epoch"], e + 1);
  const Result taken = cli(with({"acquire", "moved", "--json"}, lf));
  ASSERT_EQ(taken.code, kOk) << taken.err;
  EXPECT_EQ(nlohmann::json::parse(taken.out)["epoch"], e + 1) << "the fresh epoch is granted, once";
}

// `check` shows the signed token the supervisor published with the epoch (hex in --json), and
// none for another epoch or a slot without one.
TEST_F(CliTest, CheckPrintsTheSignedToken) {
  shm::TableOptions o;
  o.location = (dir_ / "token-table").string();
  o.slot_count = 4;
  shm::TableWriter w = shm::TableWriter::create(o);
  const SandboxId sb = *SandboxId::parse(kSandbox);
  const std::uint64_t now = boottime_ns();
  w.heartbeat(now);
  std::atomic<bool> stop{false};
  std::thread beats([&] {  // the writer's liveness, as the supervisor's rt thread keeps it
    while (!stop.load()) {
      w.heartbeat(boottime_ns());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  struct Join {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Join() {
      stop.store(true);
      t.join();
    }
  } join{stop, beats};
  const auto signer = token::TokenSigner::generate().value();
  ASSERT_NE(signer, nullptr);
  token::GrantToken t;
  t.name = name_id_of("orders");
  t.epoch = 9;
  t.holder = sb;
  t.worker = WorkerId{1, 2};
  ASSERT_TRUE(signer->sign(t));
  const token::TokenBytes bytes = token::encode(t);
  const leasehold::Result<shm::ClaimedSlot> claimed = w.claim(sb, now);
  ASSERT_TRUE(claimed.ok()) << claimed.message();
  const shm::ClaimedSlot c = *claimed;
  // The sandbox's own token channel, inherited (not close-on-exec) as LEASEHOLD_TOKENS.
  auto channel = shm::TokenChannel::create("cli-test-tokens");
  ASSERT_EQ(channel.publish(9, bytes), shm::TableErrc::ok);
  ASSERT_EQ(w.publish(c.slot, t.name, "orders", 9, now + 60'000'000'000), shm::TableErrc::ok);
  const leasehold::Result<int> reopened = channel.reopen_read_only();
  ASSERT_TRUE(reopened.ok()) << reopened.message();
  const int ro = *reopened;
  const int inherited = ::fcntl(ro, F_DUPFD, 10);
  ::close(ro);
  ASSERT_GE(inherited, 0);
  struct CloseFd {
    int fd;
    ~CloseFd() { ::close(fd); }
  } close_inherited{inherited};
  const std::vector<std::string> env{"LEASEHOLD_SHM=" + o.location, "LEASEHOLD_SLOT=" + std::to_string(c.slot),
                                     "LEASEHOLD_EPOCH=9", "LEASEHOLD_TOKENS=" + std::to_string(inherited)};
  const Result text = cli({"check"}, env);
  EXPECT_EQ(text.code, kOk) << text.err;
  EXPECT_NE(text.out.find("token: " + token::to_hex(bytes) + " (signed by lockd key " +
                          token::key_id_text(signer->key_id())),
            std::string::npos)
      << text.out;
  const Result json = cli({"check", "--json"}, env);
  ASSERT_EQ(json.code, kOk) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["token"], token::to_hex(bytes));
  EXPECT_EQ(j["token_key_id"], token::key_id_text(signer->key_id()));
  // What check prints is what a resource verifies.
  const auto raw = token::from_hex(j["token"].get<std::string>());
  ASSERT_TRUE(raw.has_value());
  token::TokenVerifier v;
  ASSERT_EQ(v.add_public_key(signer->public_key()).message(), "");
  EXPECT_TRUE(v.verify(*raw, t.name, 9, sb).ok());
  // A new epoch without a token replaces it: nothing stale is shown.
  channel.clear();
  ASSERT_EQ(w.publish(c.slot, t.name, "orders", 10, now + 60'000'000'000), shm::TableErrc::ok);
  const Result next = cli({"check", "--epoch", "10", "--json"}, env);
  EXPECT_TRUE(nlohmann::json::parse(next.out)["token"].is_null()) << next.out;
  // Another sandbox's slot at the epoch of this sandbox's token: not shown as that slot's.
  const SandboxId other{0x0b, 0x0c};
  const leasehold::Result<shm::ClaimedSlot> claimed2 = w.claim(other, now);
  ASSERT_TRUE(claimed2.ok()) << claimed2.message();
  const shm::ClaimedSlot c2 = *claimed2;
  ASSERT_EQ(channel.publish(9, bytes), shm::TableErrc::ok);
  ASSERT_EQ(w.publish(c2.slot, name_id_of("else"), "else", 9, now + 60'000'000'000), shm::TableErrc::ok);
  const Result sibling = cli({"check", "--slot", std::to_string(c2.slot), "--epoch", "9", "--json"}, env);
  EXPECT_TRUE(nlohmann::json::parse(sibling.out)["token"].is_null()) << sibling.out;
}

TEST_F(CliTest, CheckFollowsTheSlot) {
  shm::TableOptions o;
  o.location = (dir_ / "table").string();
  o.slot_count = 8;
  shm::TableWriter w = shm::TableWriter::create(o);
  const SandboxId sb = *SandboxId::parse(kSandbox);
  const std::uint64_t now = boottime_ns();
  w.heartbeat(now);
  // The writer's liveness, as the supervisor's rt thread keeps it (one store per beat).
  std::atomic<bool> stop{false};
  std::thread beats([&] {
    while (!stop.load()) {
      w.heartbeat(boottime_ns());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const leasehold::Result<shm::ClaimedSlot> claimed = w.claim(sb, now);
  ASSERT_TRUE(claimed.ok()) << claimed.message();
  const shm::ClaimedSlot c = *claimed;
  ASSERT_EQ(w.publish(c.slot, name_id_of("orders"), "orders", 7, now + 60'000'000'000), shm::TableErrc::ok);
  const std::string slot = std::to_string(c.slot);
  const std::vector<std::string> env{"LEASEHOLD_SHM=" + o.location, "LEASEHOLD_SLOT=" + slot, "LEASEHOLD_EPOCH=7"};

  const Result valid = cli({"check"}, env);
  EXPECT_EQ(valid.code, kOk) << valid.err;
  EXPECT_NE(valid.out.find("valid: slot " + slot + " epoch 7"), std::string::npos) << valid.out;
  const Result by_sandbox = cli({"check", "--shm", o.location, "--sandbox", kSandbox, "--epoch", "7", "--json"});
  EXPECT_EQ(by_sandbox.code, kOk) << by_sandbox.err;
  EXPECT_NE(by_sandbox.out.find("\"valid\":true"), std::string::npos) << by_sandbox.out;

  const Result other_epoch = cli({"check", "--epoch", "6"}, env);
  EXPECT_EQ(other_epoch.code, kFailure);
  EXPECT_NE(other_epoch.out.find("holds epoch 7, not 6"), std::string::npos) << other_epoch.out;
  const Result bad_slot = cli({"check", "--slot", "99"}, env);
  EXPECT_ANSWER(bad_slot, kNotFound, "out of range");
  const Result bad_epoch = cli({"check", "--epoch", "seven"}, env);
  EXPECT_ANSWER(bad_epoch, kUsage, "malformed epoch");

  ASSERT_TRUE(w.revoke(c.slot));
  const Result revoked = cli({"check"}, env);
  EXPECT_EQ(revoked.code, kFailure);
  EXPECT_NE(revoked.out.find("revoked"), std::string::npos) << revoked.out;
  // After the kill-switch the sandbox is gone and its slot freed: said as such, not as "epoch 0".
  ASSERT_EQ(w.free(c.slot, boottime_ns()), shm::TableErrc::ok);
  const Result gone = cli({"check"}, env);
  EXPECT_EQ(gone.code, kFailure);
  EXPECT_NE(gone.out.find("the slot's sandbox is gone (slot cooling)"), std::string::npos) << gone.out;
  const Result gone_json = cli({"check", "--json"}, env);
  EXPECT_EQ(gone_json.code, kFailure);
  EXPECT_TRUE(nlohmann::json::parse(gone_json.out)["ttl_left_ms"].is_null()) << gone_json.out;
  stop.store(true);
  beats.join();
  w.remove();
}

// A live table for `dump` and `top`: slot 0 "agent-1" (7 bytes, longer than a slot's prefix), slot 1
// "ab", at a location whose name JSON must escape; its heartbeat kept until stop().
class LiveTable {
 public:
  LiveTable(const std::string& location, std::uint64_t liveness_timeout_ns = 1'000'000'000) {
    shm::TableOptions o;
    o.location = location;
    o.slot_count = 8;
    o.liveness_timeout_ns = liveness_timeout_ns;
    w_.emplace(shm::TableWriter::create(o));
    const std::uint64_t now = boottime_ns();
    w_->heartbeat(now);
    for (const auto& [sandbox, name] : {std::pair{kSandbox, "agent-1"}, std::pair{kOtherSandbox, "ab"}}) {
      const auto claimed = w_->claim(*SandboxId::parse(sandbox), now);
      EXPECT_TRUE(claimed.ok()) << claimed.message();
      EXPECT_EQ(w_->publish(claimed->slot, name_id_of(name), name, 7, now + 600'000'000'000), shm::TableErrc::ok);
    }
    beats_ = std::thread([this] {
      while (!stop_.load()) {
        w_->heartbeat(boottime_ns());
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  ~LiveTable() {
    stop();
    w_->remove();
  }
  void stop() {
    stop_.store(true);
    if (beats_.joinable()) beats_.join();
  }
  shm::TableWriter& writer() { return *w_; }
  static constexpr const char* kOtherSandbox = "11111111-2222-4333-8444-555555555555";

 private:
  std::optional<shm::TableWriter> w_;
  std::atomic<bool> stop_{false};
  std::thread beats_;
};

// A slot keeps 6 bytes of its name: `dump` prints the full name from the table's supervisor (only
// one whose name id is the slot's), else the prefix with its length; JSON from nlohmann, exact.
TEST_F(CliTest, DumpPrintsFullNamesAndExactJson) {
  const std::string loc = (dir_ / "ta\"b\\le\tx").string();
  LiveTable t(loc);
  const std::string sock = (dir_ / "fake-list.sock").string();
  {
    FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", true},
                                           {"sandboxes", {{{"sandbox", kSandbox}, {"name", "agent-1"}},
                                                          {{"sandbox", LiveTable::kOtherSandbox}, {"name", "ab"}}}}})
                               .dump());
    const Result r = cli({"dump", "--shm", loc, "--supervisor", sock});
    EXPECT_EQ(r.code, kOk) << r.err;
    EXPECT_NE(r.out.find("agent-1\n"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("agent-..."), std::string::npos) << r.out;
    const Result j = cli({"dump", "--json", "--shm", loc, "--supervisor", sock});
    ASSERT_EQ(j.code, kOk) << j.err;
    const auto d = nlohmann::json::parse(j.out);
    EXPECT_EQ(d["location"], loc) << j.out;
    ASSERT_EQ(d["slots"].size(), 2u) << j.out;
    EXPECT_EQ(d["slots"][0]["name"], "agent-1");
    EXPECT_EQ(d["slots"][0]["name_bytes"], 7);
    EXPECT_EQ(d["slots"][1]["name"], "ab");
    EXPECT_GT(d["slots"][0]["ttl_left_ms"].get<std::int64_t>(), 500'000);
  }
  {  // a supervisor that names another name for the sandbox is not believed
    FakeSupervisor f(sock, nlohmann::json({{"v", 1}, {"ok", true}, {"sandboxes", {{{"sandbox", kSandbox}, {"name", "agent-2"}}}}}).dump());
    const Result r = cli({"dump", "--shm", loc, "--supervisor", sock});
    EXPECT_EQ(r.out.find("agent-2"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("agent-... (7 B)"), std::string::npos) << r.out;
  }
  const Result alone = cli({"dump", "--shm", loc, "--supervisor", no_socket_});
  EXPECT_EQ(alone.code, kOk) << alone.err;
  EXPECT_NE(alone.out.find("agent-... (7 B)"), std::string::npos) << alone.out;
  EXPECT_NE(alone.out.find("ab\n"), std::string::npos) << "a short name is whole: " << alone.out;
  EXPECT_NE(alone.out.find("names cut to their first 6 bytes"), std::string::npos) << alone.out;
  const auto d = nlohmann::json::parse(cli({"dump", "--json", "--shm", loc, "--supervisor", no_socket_}).out);
  EXPECT_TRUE(d["slots"][0]["name"].is_null());
  EXPECT_EQ(d["slots"][0]["name_prefix"], "agent-");
}

// `top` and `dump --watch` clear the screen only on a terminal that can; into a pipe or file, and
// with NO_COLOR or TERM=dumb, they print refreshes one after another without control codes.
TEST_F(CliTest, WatchWritesNoControlCodesUnlessToATerminal) {
  const std::string loc = (dir_ / "table").string();
  LiveTable t(loc);
  const std::vector<std::string> top{"top", "--shm", loc, "--interval", "0.05", "--count", "2", "--supervisor", no_socket_};
  const Result piped = cli(top, {"TERM=xterm"});
  EXPECT_EQ(piped.code, kOk) << piped.err;
  EXPECT_EQ(piped.out.find('\x1b'), std::string::npos) << piped.out;
  EXPECT_EQ(std::count(piped.out.begin(), piped.out.end(), '\n') > 10, true);
  std::size_t headers = 0;
  for (std::size_t p = 0; (p = piped.out.find("shm table '", p)) != std::string::npos; ++p) ++headers;
  EXPECT_EQ(headers, 2u) << piped.out;
  const Result dump = cli({"dump", "--shm", loc, "--watch", "0.05", "--count", "2", "--supervisor", no_socket_});
  EXPECT_EQ(dump.out.find('\x1b'), std::string::npos) << dump.out;
  // On a terminal (a pty): escapes with TERM=xterm (so this test can see them), none with
  // NO_COLOR or TERM=dumb.
  auto on_tty = [&](const std::vector<std::string>& env) {
    const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
    EXPECT_GE(master, 0);
    EXPECT_EQ(::grantpt(master), 0);
    EXPECT_EQ(::unlockpt(master), 0);
    const std::string slave = ::ptsname(master);
    std::string got;
    std::thread reader([&] {
      char buf[4096];
      for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
    });
    const Result r = cli(top, env, [&] {
      const int fd = ::open(slave.c_str(), O_RDWR | O_NOCTTY);
      return fd >= 0 && ::dup2(fd, 1) == 1;
    });
    EXPECT_EQ(r.code, kOk) << r.err;
    ::close(master);  // the child is gone: read() ends with EIO
    reader.join();
    return got;
  };
  EXPECT_NE(on_tty({"TERM=xterm"}).find("\x1b[2J"), std::string::npos);
  EXPECT_EQ(on_tty({"TERM=xterm", "NO_COLOR=1"}).find('\x1b'), std::string::npos);
  EXPECT_EQ(on_tty({"TERM=dumb"}).find('\x1b'), std::string::npos);
  // `top`'s own flag is named in its error, not `dump --watch`'s.
  const Result zero = cli({"top", "--shm", loc, "--interval", "0"});
  EXPECT_ANSWER(zero, kUsage, "leasehold top: --interval 0.000 s is below 0.05 s");
  EXPECT_EQ(zero.err.find("--watch"), std::string::npos) << zero.err;
}

// The same dead writer: `check` exits 6 as `dump` does (it used to exit 1), closed or silent.
TEST_F(CliTest, CheckAndDumpAgreeOnADeadWriter) {
  const std::string loc = (dir_ / "table").string();
  LiveTable t(loc, 100'000'000);
  const std::vector<std::string> check{"check", "--shm", loc, "--slot", "0", "--epoch", "7"};
  const Result alive = cli(check);
  EXPECT_EQ(alive.code, kOk) << alive.err << alive.out;
  t.stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const Result dead = cli(check);
  EXPECT_EQ(dead.code, kTableError) << dead.out;
  EXPECT_NE(dead.out.find("heartbeat is stale"), std::string::npos) << dead.out;
  const Result dump = cli({"dump", "--shm", loc, "--supervisor", no_socket_});
  EXPECT_EQ(dump.code, kTableError) << dump.err;
  EXPECT_EQ(cli(with(check, {"--json"})).code, kTableError);
  t.writer().close(boottime_ns());
  const Result closed = cli(check);
  EXPECT_EQ(closed.code, kTableError) << closed.out;
  EXPECT_NE(closed.out.find("closed the table"), std::string::npos) << closed.out;
  EXPECT_EQ(cli({"dump", "--shm", loc, "--supervisor", no_socket_}).code, kTableError);
}

// A fenced store another connection keeps locked is said to be locked (exit 3), not "not a SQLite
// database"; once it lets go the same audit passes.
TEST_F(CliTest, AuditOfALockedStoreSaysLocked) {
  if (std::system("python3 -c 'import sqlite3' 2>/dev/null") != 0) GTEST_SKIP() << "needs python3's sqlite3";
  const std::string db = (dir_ / "locked.db").string();
  {
    auto store = resource::FencedStore::open(db);
    ASSERT_TRUE(store) << store.message();
    ASSERT_TRUE((*store)->write({"orders", 1, *SandboxId::parse(kSandbox)}, "x").accepted());
  }
  const std::string script = "import sqlite3,sys,time\n"
                             "c=sqlite3.connect(sys.argv[1],isolation_level=None)\n"
                             "c.execute('INSERT INTO fence(name,epoch) VALUES(\"logged\",1)')\n"
                             "c.execute('PRAGMA locking_mode=EXCLUSIVE')\n"
                             "c.execute('BEGIN EXCLUSIVE')\n"
                             "c.execute('INSERT INTO fence(name,epoch) VALUES(\"held\",1)')\n"
                             "print('locked',flush=True)\n"
                             "time.sleep(float(sys.argv[2]))\n";
  std::ofstream(dir_ / "lock.py") << script;
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const std::string py = (dir_ / "lock.py").string();
  const pid_t holder = ::fork();
  if (holder == 0) {
    ::dup2(out[1], 1);
    ::execlp("python3", "python3", py.c_str(), db.c_str(), "30", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  std::string line;  // "locked\n", however the pipe delivers it
  for (char c = 0; line.size() < 16 && c != '\n';) {
    if (::read(out[0], &c, 1) != 1) break;
    line += c;
  }
  ASSERT_EQ(line, "locked\n");
  const Result r = cli({"audit", "--db", db});
  EXPECT_ANSWER(r, kRefused, "locked by another connection");
  EXPECT_EQ(r.err.find("not a SQLite database"), std::string::npos) << r.err;
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  ::close(out[0]);
  const Result after = cli({"audit", "--db", db});
  EXPECT_EQ(after.code, kOk) << after.err;
}

TEST_F(CliTest, AuditOfAMissingOrForeignDatabase) {
  {
    std::ofstream(dir_ / "junk.db") << "not a database at all, only text that fills the first page";
  }
  const Result junk = cli({"audit", "--db", (dir_ / "junk.db").string()});
  EXPECT_ANSWER(junk, kUsage, "not a SQLite database");
  EXPECT_NE(junk.err.find("not a fenced store"), std::string::npos) << junk.err;
  const Result missing = cli({"audit", "--db", (dir_ / "missing.db").string()});
  EXPECT_ANSWER(missing, kNotFound, "no fenced store at");
}

// An empty file is not a fenced store, and auditing it must not turn it into one.
TEST_F(CliTest, AuditOfAnEmptyFileIsNotAFencedStoreAndStaysEmpty) {
  const fs::path empty = dir_ / "empty.db";
  { std::ofstream(empty.string()); }
  const Result r = cli({"audit", "--db", empty.string()});
  EXPECT_ANSWER(r, kUsage, "not a fenced store: the file is empty");
  EXPECT_EQ(fs::file_size(empty), 0u);
  EXPECT_FALSE(fs::exists(empty.string() + "-wal"));
  EXPECT_FALSE(fs::exists(empty.string() + "-shm"));
}

/// A fenced store at `path` with writes at epochs 1 and 2 and one stale write; closed.
void make_store(const std::string& path) {
  auto s_opened = resource::FencedStore::open(path);
  ASSERT_TRUE(s_opened.ok()) << s_opened.message();
  auto s = std::move(s_opened).value();
  const SandboxId a = *SandboxId::parse(kSandbox);
  const SandboxId b = *SandboxId::parse("11111111-2222-4333-8444-555555555555");
  ASSERT_TRUE(s->write({"orders", 1, a}, "one").accepted());
  ASSERT_TRUE(s->write({"orders", 2, b}, "two").accepted());
  ASSERT_EQ(s->write({"orders", 1, a}, "late").verdict, resource::Verdict::stale);
}

TEST_F(CliTest, AuditChangesNothing) {
  const std::string db = (dir_ / "evidence.db").string();
  make_store(db);
  const std::string before = slurp(db);
  const auto mtime = fs::last_write_time(db);
  const Result r = cli({"audit", "--db", db, "--json"});
  ASSERT_EQ(r.code, kOk) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["accepted"], 2);
  EXPECT_EQ(j["rejected"], 1);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(slurp(db), before);
  EXPECT_EQ(fs::last_write_time(db), mtime);
  EXPECT_FALSE(fs::exists(db + "-wal"));
  EXPECT_FALSE(fs::exists(db + "-shm"));
}

// Evidence on a read-only mount (root bypasses file modes, so a bind mount is the real test).
TEST_F(CliTest, AuditWorksOnAReadOnlyMount) {
  const fs::path ro = dir_ / "ro";
  fs::create_directory(ro);
  make_store((ro / "evidence.db").string());
  const std::string dir = ro.string();
  auto read_only_mount = [dir] {
    return ::unshare(CLONE_NEWNS) == 0 && ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
           ::mount(dir.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) == 0 &&
           ::mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0;
  };
  const Result r = cli({"audit", "--db", (ro / "evidence.db").string()}, {}, read_only_mount);
  if (r.code == kChildSetupFailed) GTEST_SKIP() << "cannot make a read-only bind mount here (needs root)";
  EXPECT_EQ(r.code, kOk) << r.err;
  EXPECT_NE(r.out.find("2 accepted, 1 rejected"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unverified: no overlapping or backwards epochs"), std::string::npos) << r.out;
}

TEST_F(CliTest, AuditOfAnUnknownOrMalformedName) {
  const std::string db = (dir_ / "r.db").string();
  make_store(db);
  const Result unknown = cli({"audit", "--db", db, "--name", "nope"});
  EXPECT_ANSWER(unknown, kNotFound, "unknown name \"nope\"");
  EXPECT_NE(unknown.err.find("names in it: orders"), std::string::npos) << unknown.err;
  EXPECT_EQ(unknown.out, "") << "no table for an unknown name";
  const Result bad = cli({"audit", "--db", db, "--name", "bad name!"});
  EXPECT_ANSWER(bad, kUsage, "malformed name \"bad name!\"");
  const Result empty = cli({"audit", "--db", db, "--name", ""});
  EXPECT_ANSWER(empty, kUsage, "name is empty");
  const Result known = cli({"audit", "--db", db, "--name", "orders"});
  EXPECT_EQ(known.code, kOk) << known.err;
  EXPECT_NE(known.out.find("2 accepted, 1 rejected"), std::string::npos) << known.out;
}

TEST_F(CliTest, RunWithAnEmptyNameIsAUsageError) {
  const Result r = cli({"run", "--supervisor", no_socket_, "--name", "", "--", "/bin/true"});
  EXPECT_ANSWER(r, kUsage, "name is empty");
  const Result show = cli(with({"show", ""}, lockd_flags(kSilentLockd)));
  EXPECT_ANSWER(show, kUsage, "name is empty");
}

// Every command that talks to an unreachable lockd says how many attempts it made.
TEST_F(CliTest, UnreachableLockdCountsTheAttempts) {
  const std::vector<std::string> lf{"--lockd", kSilentLockd, "--key-file", key_, "--timeout-ms", "1000"};
  const std::regex attempts(R"(within 1000 ms \((\d+) attempts\))");
  for (const auto& args : {with({"names"}, lf), with({"show", "orders"}, lf)}) {
    SCOPED_TRACE(args[0]);
    const Result r = cli(args);
    EXPECT_EQ(r.code, kUnreachable) << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.err, m, attempts)) << r.err;
    // A 1 s deadline with a first retry after 20 ms: lockd was asked more than once.
    EXPECT_GE(std::stoi(m[1].str()), 2) << r.err;
  }
}

TEST_F(CliTest, DemoUsageErrorsStartNothing) {
  for (const auto& [args, phrase] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"demo", "--network", "bogus"}, "--network must be auto, netns or loopback (got \"bogus\")"},
           {{"demo", "--name", "bad_name!"}, "malformed name \"bad_name!\""},
           {{"demo", "--lockd-bin", (dir_ / "nope").string()}, "not an executable file"},
       }) {
    SCOPED_TRACE(args[1]);
    const Result r = cli(args);
    EXPECT_ANSWER(r, kUsage, phrase);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.find("cleaned up"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("checks"), std::string::npos) << r.err;
  }
}

/// The numbered items of the README's "What the demo shows", each on one line with the
/// Markdown emphasis removed.
std::vector<std::string> readme_demo_steps() {
  std::ifstream in(std::string(LEASEHOLD_SOURCE_DIR) + "/README.md");
  std::vector<std::string> items;
  bool in_section = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## What the demo shows";
    if (!in_section) continue;
    std::smatch m;
    if (std::regex_match(line, m, std::regex(R"([0-9]+\. (.*))")))
      items.push_back(m[1].str());
    else if (!items.empty() && line.rfind("   ", 0) == 0)
      items.back() += " " + line.substr(line.find_first_not_of(' '));
    else if (!items.empty())
      break;  // the list ended
  }
  for (auto& item : items)
    for (std::size_t p; (p = item.find("**")) != std::string::npos;) item.erase(p, 2);
  return items;
}

TEST_F(CliTest, DemoStepsAreTheReadmeList) {
  const Result r = cli({"demo", "--list-steps", "--json"});
  ASSERT_EQ(r.code, kOk) << r.err;
  const auto steps = nlohmann::json::parse(r.out);
  ASSERT_GE(steps.size(), 3u) << r.out;
  EXPECT_EQ(steps.front()["step"], "set-up");
  EXPECT_EQ(steps.back()["step"], "end");
  std::vector<std::string> numbered;
  for (const auto& s : steps)
    if (std::isdigit(static_cast<unsigned char>(s["step"].get<std::string>()[0]))) {
      EXPECT_EQ(s["step"], std::to_string(numbered.size() + 1));
      EXPECT_TRUE(s["checks"].get<bool>()) << s["title"] << ": a numbered step checks what it shows";
      numbered.push_back(s["title"].get<std::string>());
    }
  const std::vector<std::string> readme = readme_demo_steps();
  ASSERT_EQ(readme.size(), numbered.size()) << "README lists " << readme.size() << " steps, the demo runs "
                                            << numbered.size();
  for (std::size_t i = 0; i < readme.size(); ++i)
    EXPECT_EQ(readme[i].substr(0, numbered[i].size()), numbered[i]) << "README step " << i + 1 << ": " << readme[i];
  // The plain listing is the same table.
  const Result plain = cli({"demo", "--list-steps"});
  ASSERT_EQ(plain.code, kOk) << plain.err;
  for (const auto& s : steps) EXPECT_NE(plain.out.find(s["title"].get<std::string>()), std::string::npos) << plain.out;
}

TEST_F(CliTest, DemoStepsRefuseTheOptionsOfARun) {
  // --list-steps runs nothing: an option of a run next to it is a usage error, not ignored.
  for (const auto& [args, flag] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"demo", "--list-steps", "--fast"}, "--fast"},
           {{"demo", "--list-steps", "--keep"}, "--keep"},
           {{"demo", "--list-steps", "--json", "--network", "bogus"}, "--network"},
           {{"demo", "--network", "loopback", "--list-steps"}, "--network"},
           {{"demo", "--list-steps", "--name", "orders"}, "--name"},
           {{"demo", "--list-steps", "--lockd-bin", "/bin/true"}, "--lockd-bin"},
           {{"demo", "--list-steps", "--supervisor-bin", "/bin/true"}, "--supervisor-bin"},
           {{"demo", "--list-steps", "--old-holder-releases-first"}, "--old-holder-releases-first"},
       }) {
    SCOPED_TRACE(args[2]);
    const Result r = cli(args);
    EXPECT_EQ(r.code, kUsage) << r.out << r.err;
    if (std::find(args.begin(), args.end(), "--json") == args.end()) {
      EXPECT_EQ(r.out, "");  // no table
    } else {  // with --json the failure itself is JSON, and nothing else is printed
      const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
      ASSERT_TRUE(j.is_object()) << r.out;
      EXPECT_EQ(j.value("error", ""), "usage") << r.out;
      EXPECT_EQ(j.value("exit_code", 0), kUsage) << r.out;
      EXPECT_NE(j.value("message", "").find("--list-steps excludes " + flag), std::string::npos) << r.out;
    }
    EXPECT_NE(r.err.find("--list-steps excludes " + flag), std::string::npos) << r.err;
  }
}

#ifdef LEASEHOLD_DEMO_RUNS
/// The demo, interrupted by a signal once worker 1 is cut off (namespaces, a downed link or a
/// filter table, the temp dir, three processes and an agent all exist then): it must exit
/// 128+signal, leave nothing behind, and say in its JSON which steps never ran. SIGHUP is a
/// closed terminal or ssh session.
class DemoInterruptTest : public CliTest, public ::testing::WithParamInterface<int> {};

TEST_P(DemoInterruptTest, CleansUpAndExits128PlusTheSignal) {
  const int sig = GetParam();
  const pid_t pid = spawn_cli({"demo", "--fast", "--json"});
  const fs::path err = dir_ / "cli.err";
  std::string narrative;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    narrative = slurp(err);
    if (narrative.find(" cut off (") != std::string::npos || narrative.find("NOT RUN") != std::string::npos ||
        narrative.find("FAILED") != std::string::npos)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (narrative.find("NOT RUN") != std::string::npos) {
    wait_cli(pid);
    GTEST_SKIP() << "the demo cannot run here: " << narrative;
  }
  ASSERT_NE(narrative.find(" cut off ("), std::string::npos) << narrative;
  ASSERT_EQ(::kill(pid, sig), 0);
  const Result r = wait_cli(pid);
  EXPECT_EQ(r.code, 128 + sig) << r.err;
  const std::string sig_name = std::string("SIG") + sigabbrev_np(sig);
  EXPECT_NE(r.err.find("interrupted by " + sig_name), std::string::npos) << r.err;

  // Nothing is left: temp dir, namespaces, veth pairs, filter table.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(SQLite store (/tmp/leasehold-demo\.[A-Za-z0-9]+)/lockd\.db)")))
      << r.err;
  EXPECT_FALSE(fs::exists(m[1].str())) << m[1].str();
  const std::string tag = std::to_string(pid);
  for (const char* w : {"-w1", "-w2"}) EXPECT_FALSE(fs::exists("/run/netns/lhdemo-" + tag + w));
  for (const char* h : {"h1", "h2"}) EXPECT_FALSE(fs::exists("/sys/class/net/lhd" + tag.substr(0, 8) + h));
  if (::access("/usr/sbin/nft", X_OK) == 0) {
    const std::string cmd = "/usr/sbin/nft list table inet lhdemo_" + tag + " >/dev/null 2>&1";
    EXPECT_NE(std::system(cmd.c_str()), 0) << "nft table lhdemo_" << tag << " is still there";
  }

  // The summary: steps that never ran are null, not 0.
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["interrupted"], true);
  EXPECT_EQ(j["signal"], sig_name);
  EXPECT_EQ(j["exit_code"], 128 + sig);
  EXPECT_EQ(j["passed"], false);
  EXPECT_EQ(j["epochs"][0], 1);
  EXPECT_TRUE(j["epochs"][1].is_null());
  EXPECT_TRUE(j["epochs"][2].is_null());
  EXPECT_TRUE(j["audit"].is_null());
  EXPECT_TRUE(j["kill_margin_ms"].is_null()) << "the kill-switch step had not finished";
  // Per step: set-up and step 1 finished with their checks held; step 2 began and did not
  // finish; the rest never began.
  const auto& steps = j["steps"];
  ASSERT_EQ(steps.size(), 7u) << steps.dump();
  for (int i : {0, 1}) {
    EXPECT_EQ(steps[i]["ran"], true) << steps[i].dump();
    EXPECT_EQ(steps[i]["ok"], true) << steps[i].dump();
    EXPECT_GT(steps[i]["took_ms"].get<double>(), 0.0) << steps[i].dump();
  }
  EXPECT_EQ(steps[2]["step"], "2");
  EXPECT_EQ(steps[2]["ran"], true);
  EXPECT_TRUE(steps[2]["ok"].is_null()) << steps[2].dump();
  EXPECT_TRUE(steps[2]["took_ms"].is_null()) << steps[2].dump();
  for (std::size_t i = 3; i < steps.size(); ++i) EXPECT_EQ(steps[i]["ran"], false) << steps[i].dump();
}

// Step 5 fences the resource before it begins the transfer at lockd, so the old holder may be
// rejected, stop and have its name released before the begin arrives (a loaded machine widens
// that window). The demo then reserves the name for the receiver at epoch + 1 (Reassign) and
// every check still holds. The flag makes that order certain.
TEST_F(CliTest, DemoSaysWhenLockdCannotStart) {
  // A lockd that exits at once, and a program that is not lockd: said as such, not as an
  // internal exception, and everything is cleaned up.
  const fs::path fake = dir_ / "fake-lockd";
  std::ofstream(fake) << "#!/bin/sh\necho listening 1.2.3.4:abc\nsleep 5\n";
  fs::permissions(fake, fs::perms::owner_all);
  for (const auto& [bin, phrase] : std::vector<std::pair<std::string, std::string>>{
           {"/bin/false", "leasehold-lockd exited during start-up"},
           {fake.string(), "printed \"listening 1.2.3.4:abc\", not 'listening ADDR:PORT'"}}) {
    SCOPED_TRACE(bin);
    const Result r = cli({"demo", "--fast", "--lockd-bin", bin});
    if (r.code == 77) GTEST_SKIP() << "the demo cannot run here: " << r.err;
    const std::string all = r.out + r.err;  // the narrative is on stdout without --json
    EXPECT_EQ(r.code, kFailure) << all;
    EXPECT_NE(all.find(phrase), std::string::npos) << all;
    EXPECT_EQ(all.find("unexpected error"), std::string::npos) << all;
    EXPECT_NE(all.find("cleaned up: lockd"), std::string::npos) << all;
  }
}

TEST_F(CliTest, DemoWhenTheOldHolderReleasesBeforeTheTransferBegins) {
  const Result r = cli({"demo", "--fast", "--json", "--old-holder-releases-first"});
  if (r.code == 77) GTEST_SKIP() << "the demo cannot run here: " << r.err;
  ASSERT_EQ(r.code, kOk) << r.err;
  EXPECT_NE(r.err.find("transfer begin: lockd answered unknown_name"), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["passed"], true);
  EXPECT_EQ(j["epochs"], nlohmann::json::array({1, 2, 3}));
  bool reassigned = false;
  for (const auto& c : j["checks"]) {
    EXPECT_EQ(c["ok"], true) << c["what"];
    reassigned = reassigned || c["what"].get<std::string>().find("by a reassign") != std::string::npos;
  }
  EXPECT_TRUE(reassigned) << r.out;
  EXPECT_EQ(j["audit"]["violations"].size(), 0u);
  ASSERT_EQ(j["steps"].size(), 7u);
  for (const auto& s : j["steps"]) {
    EXPECT_EQ(s["ran"], true) << s.dump();
    EXPECT_EQ(s["ok"], true) << s.dump();
    EXPECT_TRUE(s["took_ms"].is_number()) << s.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Signals, DemoInterruptTest, ::testing::Values(SIGHUP, SIGINT, SIGTERM),
                         [](const ::testing::TestParamInfo<int>& i) { return std::string(sigabbrev_np(i.param)); });
#endif

// ---- run --wait, against a supervisor that answers each op as the real one does ------------

namespace {
std::string run_answer(bool named) {
  nlohmann::json a = {{"v", 1}, {"id", nullptr}, {"ok", true}, {"sandbox", kSandbox}, {"slot", 3}, {"pid", 4321},
                      {"epoch", named ? 7 : 0}};
  if (named) {
    a["name"] = "orders";
    a["valid_until_ms"] = 6995;
  }
  return a.dump();
}
std::string ended_answer(int exit_status, const std::string& reason) {
  return nlohmann::json({{"v", 1}, {"id", nullptr}, {"ok", true}, {"sandbox", kSandbox}, {"exit_status", exit_status},
                         {"exit_code", exit_status >= 0 ? exit_status : 128 - exit_status}, {"reason", reason}})
      .dump();
}
}  // namespace

TEST_F(CliTest, RunWaitExitsWithTheCommandsExitCode) {
  const std::string sock = (dir_ / "fake-wait.sock").string();
  FakeSupervisor f(sock, [](const nlohmann::json& req) {
    return req["op"] == "run" ? run_answer(true) : ended_answer(3, "exited");
  });
  const Result r = cli({"run", "--supervisor", sock, "--wait", "--name", "orders", "--", "/bin/job"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.out.find(std::string("sandbox ") + kSandbox), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kill-switch  in 6995 ms unless heartbeats refresh the lease"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "") << "an exit of its own is not explained";
  const auto reqs = f.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(reqs[0])["op"], "run");
  const auto wait = nlohmann::json::parse(reqs[1]);
  EXPECT_EQ(wait["op"], "wait");
  EXPECT_EQ(wait["sandbox"], kSandbox);
}

TEST_F(CliTest, RunWaitJsonPrintsTheStartedThenTheEndedObjectAndWhyTheSupervisorEndedIt) {
  const std::string sock = (dir_ / "fake-wait-json.sock").string();
  FakeSupervisor f(sock, [](const nlohmann::json& req) {
    return req["op"] == "run" ? run_answer(true) : ended_answer(-9, "kill-switch: lease not refreshed in time");
  });
  const Result r = cli({"run", "--supervisor", sock, "--wait", "--json", "--name", "orders", "--", "/bin/job"});
  EXPECT_EQ(r.code, 128 + 9) << r.err;
  const auto nl = r.out.find('\n');
  ASSERT_NE(nl, std::string::npos) << r.out;
  const auto started = nlohmann::json::parse(r.out.substr(0, nl));
  const auto ended = nlohmann::json::parse(r.out.substr(nl + 1));
  EXPECT_EQ(started["sandbox"], kSandbox);
  EXPECT_EQ(started["ttl_left_ms"], 6995);  // the name `sandboxes --json` uses
  EXPECT_FALSE(started.contains("ok"));
  EXPECT_EQ(ended["exit_status"], -9);
  EXPECT_EQ(ended["exit_code"], 137);
  EXPECT_EQ(ended["reason"], "kill-switch: lease not refreshed in time");
  EXPECT_NE(r.err.find("ended: kill-switch: lease not refreshed in time (exit status -9)"), std::string::npos) << r.err;
}

TEST_F(CliTest, RunWaitOfAnUnknownSandboxIsNotFound) {
  const std::string sock = (dir_ / "fake-wait-nf.sock").string();
  FakeSupervisor f(sock, [](const nlohmann::json& req) {
    return req["op"] == "run" ? run_answer(false)
                              : std::string(R"({"v":1,"id":null,"ok":false,"error":"not_found","message":"no sandbox here"})");
  });
  const Result r = cli({"run", "--supervisor", sock, "--wait", "--", "/bin/job"});
  EXPECT_ANSWER(r, kNotFound, "no sandbox here");
}

// A wait the supervisor refuses (its bound on waits is reached): the sandbox `run --wait` started
// is released, not left running with its name held while the caller is told it was refused.
TEST_F(CliTest, RunWaitRefusedStopsTheSandboxItStarted) {
  const std::string sock = (dir_ / "fake-wait-busy.sock").string();
  FakeSupervisor f(sock, [](const nlohmann::json& req) -> std::string {
    if (req["op"] == "run") return run_answer(true);
    if (req["op"] == "wait")
      return R"j({"v":1,"id":null,"ok":false,"error":"busy","message":"too many waits: 32 connections wait already (at most 32)"})j";
    return ended_answer(-15, "released (exited after SIGTERM)");
  });
  const Result r = cli({"run", "--supervisor", sock, "--wait", "--name", "orders", "--", "/bin/job"});
  EXPECT_NE(r.code, kOk) << r.err;
  EXPECT_NE(r.err.find("too many waits"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cannot stay attached: stopping sandbox"), std::string::npos) << r.err;
  const auto reqs = f.requests();
  ASSERT_EQ(reqs.size(), 3u);
  const auto stop = nlohmann::json::parse(reqs[2]);
  EXPECT_EQ(stop["op"], "release");
  EXPECT_EQ(stop["name"], "orders");
}

// SIGINT or SIGTERM while attached: the sandbox is stopped (a named one released, an unnamed one
// killed), that answer awaited, and the exit code is the shell's for the signal.
TEST_F(CliTest, RunWaitInterruptedStopsTheSandboxAndExitsWithTheSignalsCode) {
  for (const bool named : {true, false}) {
    const int sig = named ? SIGTERM : SIGINT;
    const std::string sock = (dir_ / (named ? "fake-wait-term.sock" : "fake-wait-int.sock")).string();
    FakeSupervisor f(sock, [named](const nlohmann::json& req) -> std::string {
      if (req["op"] == "run") return run_answer(named);
      if (req["op"] == "wait") return "";  // still running
      return ended_answer(-9, named ? "released" : "killed on request");
    });
    std::vector<std::string> args = {"run", "--supervisor", sock, "--wait"};
    if (named) args.insert(args.end(), {"--name", "orders"});
    args.insert(args.end(), {"--", "/bin/job"});
    const pid_t pid = spawn_cli(args);
    // Once it waits (its wait request arrived), interrupt it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (f.requests().size() < 2 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(f.requests().size(), 2u);
    ::kill(pid, sig);
    const Result r = wait_cli(pid);
    EXPECT_EQ(r.code, 128 + sig) << r.err;
    EXPECT_NE(r.err.find("stopping sandbox"), std::string::npos) << r.err;
    const auto reqs = f.requests();
    ASSERT_EQ(reqs.size(), 3u);
    const auto stop = nlohmann::json::parse(reqs[2]);
    if (named) {
      EXPECT_EQ(stop["op"], "release");
      EXPECT_EQ(stop["name"], "orders");
    } else {
      EXPECT_EQ(stop["op"], "kill");
      EXPECT_EQ(stop["sandbox"], kSandbox);
    }
  }
}

// `run --wait --name` waits for a held name in lockd's FIFO: the run asks the supervisor to queue
// (with --wait-timeout-ms, for at most that long), and a timeout is reported as the supervisor
// words it, with nothing started and no wait sent.
TEST_F(CliTest, RunWaitOfANameQueuesForItAndAQueueTimeoutIsReported) {
  const std::string sock = (dir_ / "fake-queue.sock").string();
  FakeSupervisor f(sock, [](const nlohmann::json& req) -> std::string {
    if (req["op"] == "run")  // its place first (a progress line), then the answer
      return R"j({"v":1,"id":null,"progress":"queued","name":"orders","position":2,"waiters":2,"state":"held","holder":"0f8fad5b-d9cb-469f-a165-70867728950e","epoch":7})j"
             "\n"
             R"j({"v":1,"id":null,"ok":false,"error":"timeout","message":"waited 250 ms for \"orders\" (at position 2 of 2); gave up"})j";
    return ended_answer(0, "exited");
  });
  const Result r = cli({"run", "--supervisor", sock, "--wait", "--wait-timeout-ms", "250", "--name", "orders", "--", "/bin/job"});
  EXPECT_ANSWER(r, kFailure, "at position 2 of 2");
  EXPECT_NE(r.err.find("waiting for \"orders\": 2 of 2 in line (held by sandbox 0f8fad5b-d9cb-469f-a165-70867728950e, epoch 7)"),
            std::string::npos) << r.err;
  const auto reqs = f.requests();
  ASSERT_EQ(reqs.size(), 1u);
  const auto run = nlohmann::json::parse(reqs[0]);
  EXPECT_EQ(run["queue"], true);
  EXPECT_EQ(run["queue_timeout_ms"], 250);
  // Without --wait (or --name) the bound means nothing: refused before anything is sent.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"run", "--supervisor", sock, "--wait-timeout-ms", "250", "--name", "orders", "--", "/bin/job"},
        std::vector<std::string>{"run", "--supervisor", sock, "--wait", "--wait-timeout-ms", "250", "--", "/bin/job"}}) {
    const Result u = cli(args);
    EXPECT_ANSWER(u, kUsage, "--wait-timeout-ms needs --wait and --name");
  }
  EXPECT_EQ(f.requests().size(), 1u);
}

// SIGINT while the run waits its turn: the CLI closes its connection (the supervisor then leaves
// lockd's FIFO) and exits 130 without sending anything else: nothing started to stop.
TEST_F(CliTest, RunWaitInterruptedWhileQueuedLeavesWithTheSignalsCode) {
  const std::string sock = (dir_ / "fake-queue-int.sock").string();
  FakeSupervisor f(sock, [](const nlohmann::json&) -> std::string { return ""; });  // still waiting
  const pid_t pid = spawn_cli({"run", "--supervisor", sock, "--wait", "--name", "orders", "--", "/bin/job"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (f.requests().empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(f.requests().size(), 1u);
  ::kill(pid, SIGINT);
  const Result r = wait_cli(pid);
  EXPECT_EQ(r.code, 128 + SIGINT) << r.err;
  EXPECT_NE(r.err.find("interrupted while waiting for \"orders\": left the queue, nothing started"), std::string::npos) << r.err;
  EXPECT_EQ(f.requests().size(), 1u);
}

// `stats` pages through lockd's Stats answers: every counter, past what one datagram holds (the
// list's last entry, store_commit_us_max, included), each once; and lockd's version. `health`
// shows the version, the refresh rate and the store's commit latency.
TEST_F(CliTest, StatsShowsEveryCounterAndTheVersion) {
  const std::string addr = start_lockd();
  ASSERT_FALSE(addr.empty());
  const Result r = cli({"stats", "--json", "--lockd", addr, "--key-file", key_});
  ASSERT_EQ(r.code, kOk) << r.err;
  const auto c = nlohmann::json::parse(r.out)["lockd"][0]["counters"];
  for (const char* key : {"version_major", "version_minor", "version_patch", "wire_version", "refreshes_per_s",
                          "key_rejected_notices", "refresh_refreshed", "answers_unsigned", "store_commit_us_max"})
    EXPECT_TRUE(c.contains(key)) << key << " in " << r.out;
  EXPECT_EQ(c["wire_version"], 4);
  const Result text = cli({"stats", "--lockd", addr, "--key-file", key_});
  ASSERT_EQ(text.code, kOk) << text.err;
  EXPECT_EQ(static_cast<std::size_t>(std::count(text.out.begin(), text.out.end(), '\n')), c.size() + 1) << text.out;
  const Result h = cli({"health", "--json", "--lockd", addr, "--key-file", key_});
  ASSERT_EQ(h.code, kOk) << h.err;
  const auto hl = nlohmann::json::parse(h.out)["lockd"][0];
  EXPECT_EQ(hl["version"], std::to_string(c["version_major"].get<int>()) + "." +
                               std::to_string(c["version_minor"].get<int>()) + "." +
                               std::to_string(c["version_patch"].get<int>()));
  EXPECT_TRUE(hl["refreshes_per_s"].is_number());
  EXPECT_TRUE(hl["store"]["commit_us_p99"].is_number());
}

// `watch` streams ownership changes: the current state first, then acquire, release and
// re-acquire at epoch + 1 as lines, in order, with their epochs; SIGINT ends it with 0.
TEST_F(CliTest, WatchStreamsAcquireReleaseAndReacquireInOrder) {
  const std::string addr = start_lockd();
  ASSERT_FALSE(addr.empty());
  const wire::KeyLoad key = wire::load_key_file(key_);
  ASSERT_TRUE(key) << key.message();
  lockd::AdminClient admin(*SocketAddress::parse(addr), *key, {}, 10'000'000'000);
  const SandboxId sb = *SandboxId::parse(kSandbox);
  const WorkerId worker = *WorkerId::parse("6a1e0c4e-5a55-4d3e-9a5b-1b2c3d4e5f60");
  const lockd::Answer before = admin.acquire("watch/before", sb, worker);
  ASSERT_NE(before.as<wire::Grant>(), nullptr) << before.message();
  const Epoch before_epoch = before.as<wire::Grant>()->epoch;
  const pid_t pid = spawn_cli({"watch", "--prefix", "watch/", "--json", "--interval-ms", "20", "--lockd", addr,
                               "--key-file", key_, "--timeout-ms", "5000"});
  auto lines = [&](const std::string& text) {
    std::vector<nlohmann::json> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) out.push_back(nlohmann::json::parse(l, nullptr, false));
    return out;
  };
  // Waits (bounded) until a line has this event, name and epoch.
  auto wait_for = [&](const std::string& event, const std::string& name, Epoch epoch) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      for (const auto& j : lines(slurp(dir_ / "cli.out")))
        if (j.is_object() && j["event"] == event && j["name"] == name && j["epoch"] == epoch) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  ASSERT_TRUE(wait_for("current", "watch/before", before_epoch)) << slurp(dir_ / "cli.out") << slurp(dir_ / "cli.err");
  const lockd::Answer g1 = admin.acquire("watch/w", sb, worker);
  ASSERT_NE(g1.as<wire::Grant>(), nullptr) << g1.message();
  const Epoch e1 = g1.as<wire::Grant>()->epoch;
  ASSERT_TRUE(wait_for("acquired", "watch/w", e1)) << slurp(dir_ / "cli.out");
  const lockd::Answer rel = admin.release(name_id_of("watch/w"), sb, e1);
  ASSERT_NE(rel.as<wire::Ok>(), nullptr) << rel.message();
  ASSERT_TRUE(wait_for("released", "watch/w", e1)) << slurp(dir_ / "cli.out");
  const lockd::Answer g2 = admin.acquire("watch/w", sb, worker);
  ASSERT_NE(g2.as<wire::Grant>(), nullptr) << g2.message();
  const Epoch e2 = g2.as<wire::Grant>()->epoch;
  EXPECT_EQ(e2, e1 + 1);
  ASSERT_TRUE(wait_for("acquired", "watch/w", e2)) << slurp(dir_ / "cli.out");
  ::kill(pid, SIGINT);
  const Result r = wait_cli(pid);
  EXPECT_EQ(r.code, kOk) << r.err;
  // Exactly these lines, in this order, each with its wall-clock time.
  std::vector<std::string> seen;
  for (const auto& j : lines(r.out)) {
    ASSERT_TRUE(j.is_object()) << r.out;
    seen.push_back(j["event"].get<std::string>() + " " + j["name"].get<std::string>() + " " +
                   std::to_string(j["epoch"].get<Epoch>()));
    EXPECT_TRUE(j["time"].is_string());
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"current watch/before " + std::to_string(before_epoch),
                                            "acquired watch/w " + std::to_string(e1),
                                            "released watch/w " + std::to_string(e1),
                                            "acquired watch/w " + std::to_string(e2)}))
      << r.out;
}

// `names` counts each name's waiters, `show` lists them in order (text and JSON), and `watch`
// reports the line moving and the hand-over to its first waiter.
TEST_F(CliTest, NamesShowAndWatchListWaiters) {
  const std::string addr = start_lockd();
  ASSERT_FALSE(addr.empty());
  const auto lf = lockd_flags(addr);
  const wire::KeyLoad key = wire::load_key_file(key_);
  ASSERT_TRUE(key) << key.message();
  lockd::AdminClient admin(*SocketAddress::parse(addr), *key, {}, 10'000'000'000);
  const SandboxId holder = *SandboxId::parse(kSandbox);
  const SandboxId first{0x1f, 1}, second{0x2f, 2}, third{0x3f, 3};
  const WorkerId w1{0xa1, 1}, w2{0xa2, 2};
  const lockd::Answer held = admin.acquire("line/res", holder, w1);
  ASSERT_NE(held.as<wire::Grant>(), nullptr) << held.message();
  const Epoch e1 = held.as<wire::Grant>()->epoch;
  auto wait = [&](SandboxId sb, WorkerId w) {
    const lockd::Answer q = admin.request(wire::Wait{"line/res", sb, w, 60'000});
    EXPECT_NE(q.as<wire::Queued>(), nullptr) << q.message();
  };
  wait(first, w1);
  wait(second, w2);

  const Result names = cli(with({"names", "--json"}, lf));
  ASSERT_EQ(names.code, kOk) << names.err;
  const auto listed = nlohmann::json::parse(names.out, nullptr, false);
  ASSERT_TRUE(listed.is_array() && listed.size() == 1u) << names.out;
  EXPECT_EQ(listed[0]["waiters"], 2);
  const Result table = cli(with({"names"}, lf));
  ASSERT_EQ(table.code, kOk) << table.err;
  EXPECT_NE(table.out.find("WAITERS"), std::string::npos) << table.out;

  const Result shown = cli(with({"show", "line/res", "--json"}, lf));
  ASSERT_EQ(shown.code, kOk) << shown.err;
  const auto j = nlohmann::json::parse(shown.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << shown.out;
  EXPECT_EQ(j["waiters"], 2);
  ASSERT_EQ(j["queue"].size(), 2u) << shown.out;
  EXPECT_EQ(j["queue"][0]["position"], 1);
  EXPECT_EQ(j["queue"][0]["sandbox"], first.str());
  EXPECT_EQ(j["queue"][0]["worker"], w1.str());
  EXPECT_EQ(j["queue"][1]["position"], 2);
  EXPECT_EQ(j["queue"][1]["sandbox"], second.str());
  EXPECT_GT(j["queue"][1]["ttl_left_ms"].get<std::uint32_t>(), 0u);
  const Result text = cli(with({"show", "line/res"}, lf));
  ASSERT_EQ(text.code, kOk) << text.err;
  EXPECT_NE(text.out.find("\nqueue "), std::string::npos) << text.out;
  const auto one = text.out.find("1. sandbox " + first.str() + " on worker " + w1.str());
  const auto two = text.out.find("2. sandbox " + second.str() + " on worker " + w2.str());
  EXPECT_NE(one, std::string::npos) << text.out;
  EXPECT_NE(two, std::string::npos) << text.out;
  EXPECT_LT(one, two) << text.out;

  // `watch` (its own output file: nothing else writes it meanwhile).
  const pid_t pid = spawn_cli({"watch", "line/res", "--json", "--interval-ms", "20", "--lockd", addr, "--key-file",
                               key_, "--timeout-ms", "5000"});
  auto events = [&] {
    std::vector<nlohmann::json> out;
    std::istringstream in(slurp(dir_ / "cli.out"));
    for (std::string l; std::getline(in, l);)
      if (const auto e = nlohmann::json::parse(l, nullptr, false); e.is_object()) out.push_back(e);
    return out;
  };
  auto wait_for = [&](const std::string& event, std::uint32_t waiters) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      for (const auto& e : events())
        if (e["event"] == event && e["waiters"] == waiters) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  ASSERT_TRUE(wait_for("current", 2)) << slurp(dir_ / "cli.out") << slurp(dir_ / "cli.err");
  wait(third, w2);
  ASSERT_TRUE(wait_for("queue", 3)) << slurp(dir_ / "cli.out");
  // The holder lets go: the first waiter has the name at the next epoch, two left in line.
  const lockd::Answer rel = admin.release(name_id_of("line/res"), holder, e1);
  ASSERT_NE(rel.as<wire::Ok>(), nullptr) << rel.message();
  ASSERT_TRUE(wait_for("handed_over", 2)) << slurp(dir_ / "cli.out");
  ::kill(pid, SIGINT);
  const Result r = wait_cli(pid);
  EXPECT_EQ(r.code, kOk) << r.err;
  const auto all = events();
  const auto h = std::find_if(all.begin(), all.end(), [](const auto& e) { return e["event"] == "handed_over"; });
  ASSERT_NE(h, all.end());
  EXPECT_EQ((*h)["holder"], first.str());
  EXPECT_EQ((*h)["epoch"], e1 + 1);
  EXPECT_EQ((*h)["prev_holder"], holder.str());
}

// Bad input to watch is a usage error naming the problem.
TEST_F(CliTest, WatchRefusesBadInput) {
  const Result both = cli({"watch", "jobs/a", "--prefix", "jobs/", "--lockd", kSilentLockd, "--key-file", key_});
  EXPECT_EQ(both.code, kUsage) << both.err;
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
  const Result fast = cli({"watch", "--interval-ms", "1", "--lockd", kSilentLockd, "--key-file", key_});
  EXPECT_EQ(fast.code, kUsage) << fast.err;
  EXPECT_NE(fast.err.find("--interval-ms"), std::string::npos) << fast.err;
  const Result bad = cli({"watch", "bad name!", "--lockd", kSilentLockd, "--key-file", key_});
  EXPECT_ANSWER(bad, kUsage, "malformed name \"bad name!\"");
}

}  // namespace
}  // namespace leasehold::cli
