// leasehold-supervisor: one per worker (DESIGN.md "The supervisor"; supervisor/supervisor.hpp).
//
// Exit codes: 0 clean shutdown; 1 runtime failure; 2 bad command line or refused configuration
// (unsafe timing, unreadable key, io_uring unavailable, shm table owned by a live writer,
// lockd unreachable at start-up or running in the other lock mode or with a shorter TTL, or a
// bad config file).
// Signals: SIGTERM/SIGINT shut down (supervisor.hpp); SIGHUP reloads the worker key and the log
// level (the config file and the flags read again; nothing else changes without a restart).
#include "leasehold/io/daemon_options.hpp"
#include "leasehold/io/event_log.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/metrics/exchange.hpp"
#include "leasehold/metrics/http_endpoint.hpp"
#include "leasehold/supervisor/config.hpp"
#include "leasehold/supervisor/supervisor.hpp"

#include <CLI/CLI.hpp>

#include <signal.h>
#include <sys/prctl.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

namespace {

constexpr const char* kDescription =
    "leasehold-supervisor: runs sandboxes under named leases from leasehold-lockd, heartbeats\n"
    "them, and kills a sandbox before its lease can expire (DESIGN.md \"The supervisor\").\n"
    "--lockd takes one address or a replicated lockd's list A,B,C; the supervisor follows the leader.\n"
    "Safety condition checked at start-up:\n"
    "  kill_after*(1+rho) + wheel_granularity + kill_latency_budget < ttl*(1-rho)\n"
    "and with several --lockd addresses (a new leader reached before the kill-switch fires):\n"
    "  lockd_failover + 1.2*heartbeat_interval < kill_after - heartbeat_interval\n"
    "Logs one line per event on stderr (logfmt or JSON: time, ts_boot_ns, level, event, ...) and tells\n"
    "systemd (Type=notify) when it serves. Flags may also come from a TOML config file (--config,\n"
    "default /etc/leasehold/supervisor.toml, read whenever it exists, also by a supervisor started by\n"
    "hand; --no-config reads none): flag-name = value lines; the command line overrides it. The start\n"
    "line (event=serving) names the file read: config=PATH or config=none.";
constexpr const char* kFooter =
    "Exit codes: 0 clean shutdown; 1 runtime failure; 2 usage, bad config file or refused configuration\n"
    "(unsafe timing, unreadable key, io_uring unavailable, live shm table, lockd unreachable or in another\n"
    "--mode at start-up).\n"
    "Signals: SIGTERM/SIGINT shut down; SIGHUP reloads the worker key and the log level.";

}  // namespace

int main(int argc, char** argv) {
  using namespace leasehold;
  CLI::App app{kDescription};
  app.footer(kFooter);
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
    if (const std::string why = config_file_error(app, e, argc, argv); !why.empty()) {
      std::fprintf(stderr, "leasehold-supervisor: %s\n", why.c_str());
      return 2;
    }
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  config.config_file = config_file_read(app);
  daemon_log().set_format(config.log.format);
  daemon_log().set_level(config.log.level);
  // The HTTP endpoint (--metrics-listen) first: a busy port is refused before anything is set
  // up. Its threads must not take the signals the io thread reads from its signalfd, so they
  // are blocked here, before the threads start (Supervisor::create blocks the same set).
  std::unique_ptr<metrics::SnapshotExchange> exchange;
  std::unique_ptr<metrics::HttpEndpoint> http;
  if (!config.metrics_listen.empty()) {
    sigset_t blocked;
    sigemptyset(&blocked);
    for (const int sig : {SIGTERM, SIGINT, SIGCHLD, SIGHUP}) sigaddset(&blocked, sig);
    ::pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
    exchange = std::make_unique<metrics::SnapshotExchange>();
    metrics::HttpLimits limits;
    limits.allow = config.metrics_allow;
    auto started = metrics::HttpEndpoint::serve(config.metrics_listen, *exchange, "leasehold_supervisor_",
                                                "the supervisor", limits);
    if (!started) {
      std::fprintf(stderr, "leasehold-supervisor: %s\n", started.message().c_str());
      return 2;
    }
    http = std::move(started).value();
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
  // SIGHUP: the log level from the config file and the flags, read again (the key is the
  // supervisor's own reload). A file that no longer parses changes nothing.
  sup->set_reload_hook([argc, argv] {
    CLI::App again{kDescription};
    SupervisorConfig fresh;
    add_supervisor_flags(again, fresh);
    try {
      again.parse(argc, argv);
      const LogLevel before = daemon_log().level();
      daemon_log().set_level(fresh.log.level);
      daemon_log().emit(boottime_ns(), "event=reloaded log_level=" + std::string(to_string(fresh.log.level)) +
                                           " log_level_before=" + std::string(to_string(before)));
    } catch (const CLI::ParseError& e) {
      std::string why = config_file_error(again, e, argc, argv);
      if (why.empty()) why = e.what();
      daemon_log().emit(boottime_ns(), "level=warn event=config_reload_refused error=" +
                                           quoted_value("the log level stays " +
                                                        std::string(to_string(daemon_log().level())) + ": " + why));
    }
  });
  if (exchange) {
    sup->serve_metrics(*exchange);
    std::printf("metrics http://%s/metrics\n", http->address().c_str());
  }
  std::fputs(sup->summary().c_str(), stdout);
  std::fputs("ready\n", stdout);
  std::fflush(stdout);
  const int rc = sup->run();
  http.reset();  // no scrape waits for the stopped loop
  return rc;
}
