// `leasehold demo`: the environment it builds and always tears down - child processes and the
// network between the workers and lockd (namespaces + veth pairs, or loopback + a packet
// filter). Used only by cmd_demo.cpp.
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

/// Runs a command to completion (bounded: killed after `timeout_ms`); returns its exit status
/// (128+signal when killed) and fills `output` with stdout+stderr. The command runs in its own
/// process group, so a Ctrl-C or a terminal hangup meant for the demo does not kill an `ip` or
/// `nft` halfway through the cleanup.
int run_command(const std::vector<std::string>& argv, std::string* output = nullptr,
                std::uint64_t timeout_ms = 10'000);

/// A long-running child (lockd, a supervisor): own process group, stdout+stderr to `log_path`,
/// SIGKILLed if the demo dies (PR_SET_PDEATHSIG), optionally inside a network namespace.
struct Child {
  std::string label;
  pid_t pid = -1;
  std::string log_path;
  bool running() const;
  /// SIGTERM, then SIGKILL after `grace_ms`; reaps it. Idempotent.
  void stop(std::uint64_t grace_ms = 3000);
};
/// Starts `argv`; `netns` (a name under /run/netns) empty = the demo's own namespace.
/// nullopt + error on failure.
std::optional<Child> start_child(const std::string& label, const std::vector<std::string>& argv,
                                 const std::string& log_path, const std::string& netns, std::string& error);
/// Waits until `child`'s log contains `needle` (returns the line) or the child exits or the
/// timeout passes (nullopt + error with the log's tail).
std::optional<std::string> wait_for_line(const Child& child, const std::string& needle,
                                         std::uint64_t timeout_ms, std::string& error);

/// The link between one worker and lockd, and how to cut it.
struct Network {
  enum class Mode { netns, loopback };
  Mode mode = Mode::loopback;
  std::string why;                 ///< why this mode (e.g. why namespaces were not used)
  std::string filter;              ///< loopback: "nft" or "iptables" ("" = none available)
  std::string netns[2];            ///< netns names (netns mode)
  std::string host_if[2];          ///< host-side veth names
  std::string host_ip[2];          ///< lockd's address as worker i sees it
  std::string worker_ip[2];        ///< worker i's address
  std::string tag;                 ///< unique per run: names the namespaces, links, filter table
  std::vector<std::string> filter_rules;  ///< iptables rules added (for removal)
  bool cut[2] = {false, false};

  /// Sets up namespaces and veth pairs if possible (`want`: "auto", "netns", "loopback");
  /// otherwise loopback, and says why. Returns "" or an error.
  std::string setup(const std::string& want, const std::string& tag);
  /// The lockd address worker i uses.
  std::string lockd_address(int i, std::uint16_t port) const;
  /// Cuts worker i off lockd (netns: host-side link down; loopback: drop rules for the
  /// supervisor's UDP port, found from its pid). Returns "" or an error.
  std::string cut_off(int i, pid_t supervisor_pid, std::uint16_t lockd_port);
  std::string reconnect(int i);
  /// Removes everything setup/cut_off created. Idempotent, never throws.
  void teardown();
  /// One line: how the workers are connected and how a cut is made.
  std::string describe() const;
};

}  // namespace leasehold::cli::demo
