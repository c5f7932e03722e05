// Runs the real leasehold-lockd binary for the process-level tests: start on an ephemeral
// loopback port (read back from its "listening ADDR:PORT" line), SIGKILL, SIGTERM, restart.
// The processes, files and waits are the harness library's (include/leasehold/harness/).
#pragma once

#include "leasehold/harness/process.hpp"
#include "leasehold/io/udp.hpp"
#include "leasehold/wire/auth.hpp"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#ifndef LEASEHOLD_LOCKD_BINARY
#error "LEASEHOLD_LOCKD_BINARY must name the leasehold-lockd executable"
#endif

namespace leasehold::lockd::testing {

namespace fs = std::filesystem;
using harness::slurp;

/// A private /tmp/lockd-test-XXXXXX, removed with the test.
class TempDir : public harness::TempDir {
 public:
  TempDir() : harness::TempDir("lockd-test") {}
};

/// A key file (0600) in `dir`, and the key.
inline wire::WireKey make_key(const fs::path& dir) {
  const fs::path p = dir / "lockd.key";
  if (!fs::exists(p)) {
    const Status err = wire::generate_key_file(p.string());
    if (!err.ok()) throw std::runtime_error(err.message());
  }
  auto k = wire::load_key_file(p.string());
  if (!k) throw std::runtime_error(k.message());
  return *k;
}

/// lockd's process as the tests run it: in the test's process group (a test's child, as any).
inline harness::Spawn lockd_spawn(std::vector<std::string> args) {
  harness::Spawn s;
  s.argv = {LEASEHOLD_LOCKD_BINARY};
  // The test's flags alone, never a config file of the host (/etc/leasehold/lockd.toml), unless
  // the test names one.
  if (std::find(args.begin(), args.end(), "--config") == args.end() &&
      std::find(args.begin(), args.end(), "--no-config") == args.end())
    s.argv.push_back("--no-config");
  s.argv.insert(s.argv.end(), args.begin(), args.end());
  s.label = "lockd";
  s.own_process_group = false;
  s.die_with_parent = false;
  return s;
}

struct ExitResult {
  int code = -1;  ///< exit status, or 128 + signal
  std::string err;  ///< stderr
  std::string out;  ///< stdout
};

/// Runs lockd with `args` to completion (bounded by `timeout`: then SIGKILLed, code 137); for
/// start-up refusals.
inline ExitResult run_lockd_to_exit(const std::vector<std::string>& args, const fs::path& dir,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  harness::Spawn s = lockd_spawn(args);
  s.stdout_path = dir / "run.out";
  s.stderr_path = dir / "run.err";
  harness::Process p;
  ExitResult r;
  if (const Status started = p.start(s); !started.ok()) throw std::runtime_error(started.message());
  if (p.wait(timeout) < 0) p.kill9();
  r.code = p.exit_code().value_or(-1);
  r.err = p.err();
  r.out = p.out();
  return r;
}

/// A running lockd.
class LockdProcess {
 public:
  LockdProcess() = default;
  LockdProcess(const LockdProcess&) = delete;
  LockdProcess& operator=(const LockdProcess&) = delete;
  ~LockdProcess() { kill9(); }

  /// Starts lockd with `args` (plus --listen 127.0.0.1:0 unless args name --listen) and waits
  /// for its "listening" line. On failure returns false and fills *error with its stderr.
  /// Its stderr is appended to `log_path` (kept across restarts), its stdout goes to
  /// `log_path`.stdout; `stderr_fd` >= 0: lockd's stderr is that fd instead of `log_path`.
  /// `env`: NAME, value pairs set in lockd's environment (NOTIFY_SOCKET, WATCHDOG_USEC).
  bool start(const std::vector<std::string>& args, const fs::path& log_path, std::string* error,
             int stderr_fd = -1, const std::vector<std::pair<std::string, std::string>>& env = {}) {
    std::vector<std::string> all = args;
    bool has_listen = false;
    for (const auto& a : args) has_listen |= a == "--listen";
    if (!has_listen) all.insert(all.end(), {"--listen", "127.0.0.1:0"});
    harness::Spawn s = lockd_spawn(all);
    log_path_ = log_path;
    s.stdout_path = log_path.string() + ".stdout";
    s.stderr_path = log_path;
    s.append_stderr = true;
    s.stderr_fd = stderr_fd;
    s.env = env;
    if (const Status started = proc_.start(s); !started.ok()) {
      if (error != nullptr) *error = started.message();
      return false;
    }
    const std::string prefix = "listening ";
    const auto line = harness::wait_for_log_line(s.stdout_path, prefix, std::chrono::seconds(20), &proc_);
    if (!line || line->rfind(prefix, 0) != 0) {
      const std::string out = proc_.out();
      kill9();
      if (error != nullptr) *error = "lockd did not start: stdout \"" + out + "\", stderr: " + slurp(log_path);
      return false;
    }
    const auto addr = SocketAddress::parse(line->substr(prefix.size()));
    if (!addr) {
      kill9();
      if (error != nullptr) *error = "cannot parse " + *line;
      return false;
    }
    address_ = *addr;
    return true;
  }

  /// SIGKILL and reap (no-op if not running).
  void kill9() { proc_.kill9(); }

  /// SIGTERM and reap; returns the exit status (or 128 + signal); -1 when not running.
  int terminate() {
    if (proc_.pid() <= 0) return -1;
    proc_.signal(SIGTERM);
    if (proc_.wait(std::chrono::seconds(60)) < 0) proc_.kill9();
    return proc_.exit_code().value_or(-1);
  }

  /// Sends `sig` (SIGHUP: a reload).
  void signal(int sig) { proc_.signal(sig); }
  bool running() const { return proc_.running(); }
  pid_t pid() const { return proc_.pid(); }
  const SocketAddress& address() const { return address_; }
  std::string log() const { return slurp(log_path_); }

 private:
  mutable harness::Process proc_;
  SocketAddress address_;
  fs::path log_path_;
};

}  // namespace leasehold::lockd::testing
