// Runs the real leasehold-lockd binary for the process-level tests: start on an ephemeral
// loopback port (read back from its "listening ADDR:PORT" line), SIGKILL, SIGTERM, restart.
#pragma once

#include "leasehold/wire/auth.hpp"
#include "leasehold/io/udp.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#ifndef LEASEHOLD_LOCKD_BINARY
#error "LEASEHOLD_LOCKD_BINARY must name the leasehold-lockd executable"
#endif

namespace leasehold::lockd::testing {

namespace fs = std::filesystem;

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/lockd-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

/// A key file (0600) in `dir`, and the key.
inline wire::WireKey make_key(const fs::path& dir) {
  const fs::path p = dir / "lockd.key";
  if (!fs::exists(p)) {
    const std::string err = wire::generate_key_file(p.string());
    if (!err.empty()) throw std::runtime_error(err);
  }
  auto k = wire::load_key_file(p.string());
  if (!k) throw std::runtime_error(k.error);
  return *k.key;
}

struct ExitResult {
  int code = -1;  ///< exit status, or 128 + signal
  std::string err;  ///< stderr
  std::string out;  ///< stdout
};

/// Runs lockd with `args` to completion (bounded by `timeout`); for start-up refusals.
inline ExitResult run_lockd_to_exit(const std::vector<std::string>& args, const fs::path& dir,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const fs::path out = dir / "run.out", err = dir / "run.err";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> argv{const_cast<char*>(LEASEHOLD_LOCKD_BINARY)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ExitResult r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.err = slurp(err);
  r.out = slurp(out);
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
  /// `stderr_fd` >= 0: lockd's stderr is that fd instead of `log_path`.
  bool start(const std::vector<std::string>& args, const fs::path& log_path, std::string* error,
             int stderr_fd = -1) {
    int out_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) return false;
    log_path_ = log_path;
    pid_ = ::fork();
    if (pid_ == 0) {
      const int e = stderr_fd >= 0 ? stderr_fd : ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      ::dup2(out_pipe[1], 1);
      ::dup2(e, 2);
      std::vector<std::string> all = args;
      bool has_listen = false;
      for (const auto& a : args) has_listen |= a == "--listen";
      if (!has_listen) {
        all.push_back("--listen");
        all.push_back("127.0.0.1:0");
      }
      std::vector<char*> argv{const_cast<char*>(LEASEHOLD_LOCKD_BINARY)};
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out_pipe[1]);
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_pipe[0], POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(out_pipe[0], buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<std::size_t>(n));
    }
    ::close(out_pipe[0]);
    const std::string prefix = "listening ";
    if (line.rfind(prefix, 0) != 0) {
      kill9();
      if (error != nullptr) *error = "lockd did not start: stdout \"" + line + "\", stderr: " + slurp(log_path);
      return false;
    }
    const auto addr = SocketAddress::parse(line.substr(prefix.size(), line.find('\n') - prefix.size()));
    if (!addr) {
      kill9();
      if (error != nullptr) *error = "cannot parse " + line;
      return false;
    }
    address_ = *addr;
    return true;
  }

  /// SIGKILL and reap (no-op if not running).
  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  /// SIGTERM and reap; returns the exit status (or 128 + signal).
  int terminate() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  bool running() const {
    if (pid_ <= 0) return false;
    return ::waitpid(pid_, nullptr, WNOHANG) == 0;
  }
  pid_t pid() const { return pid_; }
  const SocketAddress& address() const { return address_; }
  std::string log() const { return slurp(log_path_); }

 private:
  pid_t pid_ = -1;
  SocketAddress address_;
  fs::path log_path_;
};

}  // namespace leasehold::lockd::testing
