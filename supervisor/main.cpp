// leasehold-supervisor: one per worker (DESIGN.md "The supervisor"; supervisor/supervisor.hpp).
//
// Exit codes: 0 clean shutdown; 1 runtime failure; 2 bad command line or refused configuration
// (unsafe timing, unreadable key, io_uring unavailable, shm table owned by a live writer,
// lockd unreachable at start-up or running in the other lock mode or with a shorter TTL).
#include "leasehold/supervisor/config.hpp"
#include "leasehold/supervisor/supervisor.hpp"

#include <CLI/CLI.hpp>

#include <sys/prctl.h>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  using namespace leasehold;
  CLI::App app{
      "leasehold-supervisor: runs sandboxes under named leases from leasehold-lockd, heartbeats\n"
      "them, and kills a sandbox before its lease can expire (DESIGN.md \"The supervisor\").\n"
      "--lockd takes one address or a replicated lockd's list A,B,C; the supervisor follows the leader.\n"
      "Safety condition checked at start-up:\n"
      "  kill_after*(1+rho) + wheel_granularity + kill_latency_budget < ttl*(1-rho)\n"
      "and with several --lockd addresses (a new leader reached before the kill-switch fires):\n"
      "  lockd_failover + 1.2*heartbeat_interval < kill_after - heartbeat_interval"};
  app.footer(
      "Exit codes: 0 clean shutdown; 1 runtime failure; 2 usage or refused configuration (unsafe timing,\n"
      "unreadable key, io_uring unavailable, live shm table, lockd unreachable or in another --mode at start-up).");
  // The key (and the shm table's writable mapping) are the supervisor's alone: no core dump,
  // no ptrace and no /proc/<pid>/{mem,environ,fd,root} for processes of the same uid; the
  // kernel then owns /proc/<pid> by root. Sandboxes get back a dumpable state at execve.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  SupervisorConfig config;
  app.set_version_flag("--version", "leasehold-supervisor " LEASEHOLD_VERSION);
  add_supervisor_flags(app, config);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  std::unique_ptr<Supervisor> sup;
  std::string error;
  try {
    auto created = Supervisor::create(config);
    if (created) sup = std::move(created).value();
    else error = created.message();
  } catch (const std::exception& e) {
    error = std::string("internal error during start-up: ") + e.what();
  }
  if (!sup) {
    std::fprintf(stderr, "leasehold-supervisor: %s\n", error.c_str());
    return 2;
  }
  std::fputs(sup->summary().c_str(), stdout);
  std::fputs("ready\n", stdout);
  std::fflush(stdout);
  return sup->run();
}
