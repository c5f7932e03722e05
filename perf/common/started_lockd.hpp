// A leasehold-lockd a perf harness starts on a temporary store (perf/lockd, perf/memory): a fresh
// directory with a cluster key, the child started there and its listening address read; stopped
// (SIGTERM, then reaped) and its directory removed when the StartedLockd goes.
#pragma once

#include "leasehold/wire/address.hpp"
#include "leasehold/wire/auth.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

namespace leasehold::perf {

struct StartedLockd {
  std::filesystem::path tmp;  ///< the store's directory (removed at the end)
  std::string key_file;       ///< tmp/key: the cluster key lockd was started with
  pid_t pid = -1;             ///< the child, -1 when none was started
  SocketAddress address;      ///< where it listens
  StartedLockd() = default;
  StartedLockd(const StartedLockd&) = delete;
  StartedLockd& operator=(const StartedLockd&) = delete;
  ~StartedLockd() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
    std::error_code ec;
    if (!tmp.empty()) std::filesystem::remove_all(tmp, ec);
  }
  /// lockd's log so far (its stderr), for an error message.
  std::string log_text() const {
    std::ifstream in(tmp / "lockd.log");
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
};

/// A fresh `<dir>/<prefix>-XXXXXX` holding a new cluster key (`key_file`); nullptr (the reason
/// printed) if either cannot be made.
inline std::unique_ptr<StartedLockd> make_lockd_dir(const std::string& dir, const std::string& prefix) {
  auto l = std::make_unique<StartedLockd>();
  std::string tmpl = dir + "/" + prefix + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::perror(("mkdtemp " + tmpl).c_str());
    return nullptr;
  }
  l->tmp = tmpl;
  l->key_file = (l->tmp / "key").string();
  if (const Status err = wire::generate_key_file(l->key_file); !err.ok()) {
    std::fprintf(stderr, "%s\n", err.message().c_str());
    return nullptr;
  }
  return l;
}

/// Runs `argv` (a lockd listening on 127.0.0.1:0) in `l.tmp`'s stead: stderr to tmp/lockd.log,
/// SIGKILL when this process ends however it ends (PR_SET_PDEATHSIG), `in_child` before the exec;
/// then reads its first stdout line, "listening ADDR", into l.address. false (lockd's log
/// printed) if it does not start.
inline bool spawn_lockd(StartedLockd& l, const std::vector<std::string>& argv,
                        const std::function<void()>& in_child = {}) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int out[2];
  if (::pipe(out) != 0) {
    std::perror("pipe");
    return false;
  }
  l.pid = ::fork();
  if (l.pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(out[1], 1);
    const int log = ::open((l.tmp / "lockd.log").c_str(), O_WRONLY | O_CREAT, 0600);
    ::dup2(log, 2);
    if (in_child) in_child();
    ::execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s\n", args[0]);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string line;
  char c = 0;
  while (line.size() < 256 && ::read(out[0], &c, 1) == 1 && c != '\n') line += c;
  ::close(out[0]);
  const auto a = line.rfind("listening ", 0) == 0 ? SocketAddress::parse(line.substr(10)) : std::nullopt;
  if (!a) {
    std::fprintf(stderr, "%s did not start (its first line: \"%s\"); its log:\n%s", args[0], line.c_str(),
                 l.log_text().c_str());
    return false;
  }
  l.address = *a;
  return true;
}

}  // namespace leasehold::perf
