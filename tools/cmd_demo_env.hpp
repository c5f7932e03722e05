// `leasehold demo`: stopping on a signal. The processes and the network it builds (and always
// tears down) are the harness library's (include/leasehold/harness/). Used only by cmd_demo.cpp.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace leasehold::cli::demo {

/// The first of SIGINT/SIGTERM/SIGHUP received (0: none); every wait loop of the demo checks
/// it and unwinds to the cleanup. SIGHUP is a closed terminal or ssh session: it must clean up
/// like the others.
extern std::atomic<int> g_interrupted;
struct Interrupted {
  int signal = 0;
};
/// Throws Interrupted when the demo was asked to stop.
void check_interrupted();
/// "SIGINT", "SIGTERM", "SIGHUP", else "signal N".
std::string signal_name(int signal);
/// Installs the SIGINT/SIGTERM/SIGHUP handlers, and one for SIGPIPE that does nothing (a
/// closed output pipe must not kill the demo before its cleanup; writes then fail with EPIPE).
/// The destructor restores the previous dispositions.
struct SignalGuard {
  SignalGuard();
  ~SignalGuard();
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;
};

}  // namespace leasehold::cli::demo
