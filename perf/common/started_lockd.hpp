// A leasehold-lockd a perf harness started on a temporary store (perf/lockd, perf/memory): the
// child is stopped (SIGTERM, then reaped) and its directory removed when this goes.
#pragma once

#include "leasehold/wire/address.hpp"

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <filesystem>
#include <system_error>

namespace leasehold::perf {

struct StartedLockd {
  std::filesystem::path tmp;  ///< the store's directory (removed at the end)
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
};

}  // namespace leasehold::perf
