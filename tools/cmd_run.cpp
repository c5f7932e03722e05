// `leasehold run`, `leasehold name`, `leasehold release`, `leasehold sandboxes`: the creation
// flows of DESIGN.md "The supervisor", through the local supervisor's control socket.
//
//   leasehold run --name orders -- /usr/bin/my-agent --flag   acquire "orders", then start it
//   leasehold run -- /usr/bin/worker                          an unnamed sandbox
//   leasehold run --wait --name orders -- /usr/bin/job        stay until it exits; its exit code
//   leasehold name SANDBOX orders                             name a running unnamed sandbox
//   leasehold release orders                                  stop the holder, release the name
//   leasehold sandboxes                                       what runs on this worker
//   leasehold logs orders                                     the output of the sandbox named orders
#include "tools/cmd_common.hpp"

#include "leasehold/supervisor/control.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

namespace leasehold::cli {
namespace {

/// A supervisor's refusal: the message on stderr; with --json also the error object on stdout
/// (report), whose "reason", "holder" and "epoch" tell a caller parsing JSON who holds the name.
int refused(const char* command, const nlohmann::json& ans, std::string_view what) {
  return report(command, supervisor_failure(ans, what));
}

/// Prints a sandbox answer (run / name) as text or JSON (output_json: without the control
/// socket's envelope); returns kOk.
int print_started(const nlohmann::json& a, bool json) {
  if (json) {
    std::printf("%s\n", output_json(a).dump().c_str());
    return kOk;
  }
  const std::string name = a.contains("name") && a["name"].is_string() ? a["name"].get<std::string>() : "-";
  std::printf("sandbox %s\n", a.value("sandbox", std::string("?")).c_str());
  Table fields;
  fields.indent(2).min_width(0, 6);  // as wide as "cgroup", present or not
  fields.add({"name", name});
  if (a.contains("epoch")) fields.add({"epoch", std::to_string(a.value("epoch", 0ull))});
  if (a.contains("slot")) fields.add({"slot", std::to_string(a.value("slot", -1))});
  if (a.contains("pid")) fields.add({"pid", std::to_string(a.value("pid", -1))});
  // valid_until_ms is when the kill-switch fires unless a heartbeat moves it (kill-after), not
  // lockd's lease expiry, which is later.
  if (a.contains("valid_until_ms"))
    fields.add({"kill-switch", "in " + std::to_string(a.value("valid_until_ms", 0ll)) +
                                   " ms unless heartbeats refresh the lease (ttl_left_ms)"});
  if (a.contains("cgroup")) fields.add({"cgroup", a.value("cgroup", std::string())});
  std::fputs(fields.str().c_str(), stdout);
  return kOk;
}

// ---- run --wait ------------------------------------------------------------------------------

/// SIGINT or SIGTERM received while `run --wait` is attached (0: none).
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

/// Catches SIGINT and SIGTERM (no SA_RESTART: a blocking poll returns EINTR) from before the
/// run request on, so a signal never leaves the sandbox running without this process.
void catch_stop_signals() {
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

/// Sends `request` on a connection of its own and reads its one answer, however long it takes
/// (`wait`: until the sandbox is gone; a queued `run`: until it runs). No deadline; returns early
/// (nullopt, failure unset) when a stop signal arrives, closing the connection (a queued run
/// then leaves lockd's FIFO). `op` and `gone` word the failures.
std::optional<nlohmann::json> call_until_answered(SupervisorFlags sup, const nlohmann::json& request,
                                                  const std::string& op, const std::string& gone, Failure& failure) {
  resolve(sup);
  ControlCallFailure why;
  const ControlConnection conn = control_connect(sup.socket, why);
  if (!conn) {
    failure = {kNoSupervisor, why.message};
    return std::nullopt;
  }
  const std::string line = request.dump() + "\n";
  for (std::size_t sent = 0; sent < line.size();) {
    const ssize_t n = ::send(conn.fd(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) {
      if (g_stop_signal != 0) return std::nullopt;
      continue;
    }
    if (n <= 0) {
      failure = {kNoSupervisor, "the supervisor at " + sup.socket + " closed the connection while `" + op + "` was sent"};
      return std::nullopt;
    }
    sent += static_cast<std::size_t>(n);
  }
  std::string in;
  for (;;) {
    if (const auto nl = in.find('\n'); nl != std::string::npos) {
      nlohmann::json j = nlohmann::json::parse(in.substr(0, nl), nullptr, false);
      in.erase(0, nl + 1);
      if (!j.is_discarded() && is_control_progress(j)) {  // a queued run's place in lockd's FIFO
        const std::string holder = j.value("holder", std::string());
        std::fprintf(stderr, "leasehold run: waiting for \"%s\": %u of %u in line (%s%s, epoch %llu)\n",
                     j.value("name", std::string("?")).c_str(), j.value("position", 0u), j.value("waiters", 0u),
                     j.value("state", std::string("?")).c_str(),
                     holder.empty() || holder == SandboxId{}.str() ? "" : (" by sandbox " + holder).c_str(),
                     static_cast<unsigned long long>(j.value("epoch", 0ull)));
        continue;
      }
      if (j.is_discarded() || !j.is_object() || !j.contains("ok")) {
        failure = {kInternal, "the supervisor at " + sup.socket + " answered `" + op + "` with something that is not a control answer"};
        return std::nullopt;
      }
      return j;
    }
    if (g_stop_signal != 0) return std::nullopt;
    pollfd p{conn.fd(), POLLIN, 0};
    const int rc = ::poll(&p, 1, -1);
    if (rc <= 0) continue;  // EINTR: the signal is checked above
    char buf[65536];
    const ssize_t n = ::recv(conn.fd(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failure = {kNoSupervisor, "the supervisor at " + sup.socket + " closed the connection " + gone};
      return std::nullopt;
    }
    in.append(buf, static_cast<std::size_t>(n));
    if (in.size() > kControlAnswerBytesMax) {
      failure = {kInternal, "the supervisor's answer to `" + op + "` is longer than " + std::to_string(kControlAnswerBytesMax) + " bytes"};
      return std::nullopt;
    }
  }
}

/// Sends `wait` for `sandbox` and reads its answer, which comes when the sandbox is gone.
std::optional<nlohmann::json> wait_for_exit(SupervisorFlags sup, const std::string& sandbox, Failure& failure) {
  return call_until_answered(sup, {{"v", 1}, {"op", "wait"}, {"sandbox", sandbox}}, "wait",
                             "before the sandbox exited (did it stop or restart?); `leasehold logs " + sandbox +
                                 "` may still show its output",
                             failure);
}

/// The ended sandbox: with --json one line (the answer without its envelope), else, when the
/// supervisor ended it, why on stderr. Returns its shell exit code.
int print_ended(const nlohmann::json& ans, bool json) {
  const int code = ans.value("exit_code", 1);
  const std::string reason = ans.value("reason", std::string("exited"));
  if (json) std::printf("%s\n", output_json(ans).dump().c_str());
  if (reason != "exited")
    std::fprintf(stderr, "leasehold run: sandbox %s ended: %s (exit status %d)\n",
                 ans.value("sandbox", std::string("?")).c_str(), reason.c_str(), ans.value("exit_status", -1));
  std::fflush(stdout);
  return code;
}

/// Stops a sandbox `run --wait` started and can no longer stay attached to (release a named
/// one, kill an unnamed one) and waits for that answer. `why` heads the stderr line. Returns 0,
/// or the exit code of a failure to stop it (reported).
int stop_started(const SupervisorFlags& sup, const nlohmann::json& started, bool json, const std::string& why) {
  const std::string sandbox = started.value("sandbox", std::string());
  const bool named = started.contains("name") && started["name"].is_string();
  const nlohmann::json req = named ? nlohmann::json{{"v", 1}, {"op", "release"}, {"name", started["name"]}}
                                   : nlohmann::json{{"v", 1}, {"op", "kill"}, {"sandbox", sandbox}};
  const std::string how = named ? "releasing \"" + started["name"].get<std::string>() + "\"" : std::string("kill");
  std::fprintf(stderr, "leasehold run: %s: stopping sandbox %s (%s)\n", why.c_str(), sandbox.c_str(), how.c_str());
  SupervisorFlags stop = sup;
  stop.timeout_ms = std::max<std::uint64_t>(sup.timeout_ms, 60'000);  // answered once it is gone (grace included)
  Failure f;
  auto stopped = supervisor_call(stop, req, f);
  if (!stopped) return report("run", f);
  // not_found: it ended meanwhile (its exit code is lost, as a shell's would be to a signal).
  if (!stopped->value("ok", false) && stopped->value("error", std::string()) != "not_found")
    return refused("run", *stopped, "stop sandbox " + sandbox);
  if (stopped->value("ok", false) && json) std::printf("%s\n", output_json(*stopped).dump().c_str());
  std::fflush(stdout);
  return 0;
}

/// `run --wait` after the sandbox started: wait for its exit and return its exit code; on SIGINT
/// or SIGTERM stop it (release a named one, kill an unnamed one), wait for that, return 128+signal.
/// A wait the supervisor refuses (too many waits) or cannot answer stops the sandbox too: the
/// caller was promised the command's exit code, so nothing it started is left running unwatched.
int stay_attached(const SupervisorFlags& sup, const nlohmann::json& started, bool json) {
  const std::string sandbox = started.value("sandbox", std::string());
  Failure f;
  auto ans = g_stop_signal == 0 ? wait_for_exit(sup, sandbox, f) : std::nullopt;
  if (ans && ans->value("ok", false)) return print_ended(*ans, json);
  if (ans || f.failed()) {
    const int code = ans ? refused("run", *ans, "wait for sandbox " + sandbox) : report("run", f);
    const int stop = stop_started(sup, started, json, "cannot stay attached");
    return stop != 0 ? stop : code;
  }
  const int sig = g_stop_signal;
  const int stop = stop_started(sup, started, json, sig == SIGINT ? "interrupted" : "terminated");
  return stop != 0 ? stop : 128 + sig;
}

/// Sends a run/name request to the supervisor and prints the started sandbox, or reports why not.
int start(const char* command, const SupervisorFlags& sup, const nlohmann::json& req, const std::string& what, bool json) {
  Failure f;
  auto ans = supervisor_call(sup, req, f);
  if (!ans) return report(command, f);
  if (!ans->value("ok", false)) return refused(command, *ans, what);
  return print_started(*ans, json);
}

struct RunArgs {
  SupervisorFlags sup;
  std::string name;
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string cwd;
  std::uint64_t ttl_ms = 0;
  bool json = false;
  bool wait = false;
  std::optional<std::uint64_t> wait_timeout_ms;
};

const Command kRun([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<RunArgs>();
  auto* sub = app.add_subcommand(
      "run", "Start a sandbox through the local supervisor; with --name, acquire the name first "
             "(nothing starts if it is held: the holder and epoch are printed; with --wait, wait for it in turn)");
  add_supervisor_flags(sub, a->sup);
  auto* name_opt = sub->add_option("--name", a->name, "the name to hold (1..128 bytes of [A-Za-z0-9._:/-])");
  // One value per --env (repeat the flag for more): a list option would take every word up to
  // the next option and then swallow the `--` that starts the command.
  sub->add_option("--env", a->env, "KEY=VALUE for the sandbox's environment (one per --env, repeatable; PATH is passed on)")
      ->allow_extra_args(false);
  sub->add_option("--cwd", a->cwd, "working directory of the sandbox (default /)");
  sub->add_option("--ttl-ms", a->ttl_ms, "lease TTL to ask lockd for, milliseconds (default: the supervisor's)");
  sub->add_flag("--json", a->json,
                "print the answer as JSON; with --wait also the ended sandbox, one JSON object per line (sandbox, "
                "exit_status, exit_code, reason, name, released)");
  sub->add_flag("--wait", a->wait,
                "stay attached: wait for the command to exit, and return its exit code (128+N when killed by signal "
                "N; the reason on stderr when the supervisor ended it). SIGINT/SIGTERM stop the sandbox (release "
                "its name, or kill it), then exit 130/143. With --name, a held name is waited for in lockd's FIFO "
                "of waiters (first come, first served; each holder at a new epoch) instead of refused");
  auto* wait_timeout = sub->add_option("--wait-timeout-ms", a->wait_timeout_ms,
                                       "with --wait --name: give up waiting for the name after this long (error timeout, exit 1; "
                                       "nothing started); default: no limit")
                           ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{86'400'000}));
  sub->add_option("command", a->argv, "the command and its arguments, after --")->required();
  sub->callback([a, exit_code, name_opt, wait_timeout] {
    Failure f;
    if (wait_timeout->count() > 0 && (!a->wait || name_opt->count() == 0)) {
      *exit_code = report("run", {kUsage, "--wait-timeout-ms needs --wait and --name (it bounds the wait for a held name)"});
      return;
    }
    // A --name that is given must be valid, also when it is empty: `--name ""` is not `run`
    // without a name.
    const bool named = name_opt->count() > 0;
    if (named && !check_new_name(a->name, f)) {
      *exit_code = report("run", f);
      return;
    }
    nlohmann::json req = {{"v", 1}, {"op", "run"}, {"argv", a->argv}};
    if (named) req["name"] = a->name;
    nlohmann::json env = nlohmann::json::object();
    if (const char* path = std::getenv("PATH")) env["PATH"] = path;
    for (const auto& e : a->env) {
      const auto eq = e.find('=');
      if (eq == std::string::npos || eq == 0) {
        *exit_code = report("run", {kUsage, "--env \"" + e + "\" is not KEY=VALUE"});
        return;
      }
      env[e.substr(0, eq)] = e.substr(eq + 1);
    }
    req["env"] = env;
    if (!a->cwd.empty()) req["cwd"] = a->cwd;
    if (a->ttl_ms != 0) req["ttl_ms"] = a->ttl_ms;
    const std::string what = named ? "run \"" + a->name + "\"" : "run";
    if (!a->wait) {
      auto started = supervisor_call(a->sup, req, f);
      if (!started) {
        *exit_code = report("run", f);
        return;
      }
      if (!started->value("ok", false)) {
        *exit_code = refused("run", *started, what);
        if (started->value("error", std::string()) == "held" && !a->json)
          std::fprintf(stderr, "leasehold run: `run --wait --name %s` waits for it in turn\n", a->name.c_str());
        return;
      }
      *exit_code = print_started(*started, a->json);
      return;
    }
    req["attach"] = true;  // refused before anything starts if its exit could not be waited for
    catch_stop_signals();
    std::optional<nlohmann::json> ans;
    if (named) {
      // Queued behind the name's holder and earlier waiters: answered once it runs.
      req["queue"] = true;
      if (a->wait_timeout_ms) req["queue_timeout_ms"] = *a->wait_timeout_ms;
      ans = call_until_answered(a->sup, req, "run", "while \"" + a->name + "\" was waited for (did it stop or restart?)", f);
      if (!ans && !f.failed()) {  // a stop signal while queued: closing the connection left the FIFO
        std::fprintf(stderr, "leasehold run: %s while waiting for \"%s\": left the queue, nothing started\n",
                     g_stop_signal == SIGINT ? "interrupted" : "terminated", a->name.c_str());
        *exit_code = 128 + g_stop_signal;
        return;
      }
    } else {
      ans = supervisor_call(a->sup, req, f);
    }
    if (!ans) {
      *exit_code = report("run", f);
      return;
    }
    if (!ans->value("ok", false)) {
      *exit_code = refused("run", *ans, what);
      return;
    }
    print_started(*ans, a->json);
    std::fflush(stdout);
    *exit_code = stay_attached(a->sup, *ans, a->json);
  });
});

struct NameArgs {
  SupervisorFlags sup;
  std::string sandbox;
  std::string name;
  std::uint64_t ttl_ms = 0;
  bool json = false;
};

const Command kName([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<NameArgs>();
  auto* sub = app.add_subcommand("name", "Give a name to a running unnamed sandbox on this worker");
  add_supervisor_flags(sub, a->sup);
  sub->add_option("sandbox", a->sandbox, "the sandbox id (UUID), as printed by `run`")->required();
  sub->add_option("name", a->name, "the name to acquire for it")->required();
  sub->add_option("--ttl-ms", a->ttl_ms, "lease TTL to ask lockd for, milliseconds");
  sub->add_flag("--json", a->json, "print the answer as JSON");
  sub->callback([a, exit_code] {
    Failure f;
    const auto sb = parse_sandbox(a->sandbox, f);
    if (!sb || !check_new_name(a->name, f)) {
      *exit_code = report("name", f);
      return;
    }
    nlohmann::json req = {{"v", 1}, {"op", "name"}, {"sandbox", sb->str()}, {"name", a->name}};
    if (a->ttl_ms != 0) req["ttl_ms"] = a->ttl_ms;
    *exit_code = start("name", a->sup, req, "name \"" + a->name + "\"", a->json);
  });
});

struct ReleaseArgs {
  SupervisorFlags sup;
  std::string name;
  std::optional<std::uint64_t> grace_ms;
  bool json = false;
};

const Command kRelease([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ReleaseArgs>();
  auto* sub = app.add_subcommand(
      "release", "Stop the sandbox holding a name on this worker and release the name to lockd");
  add_supervisor_flags(sub, a->sup);
  sub->add_option("name", a->name, "the name")->required();
  sub->add_option("--grace-ms", a->grace_ms,
                  "how long the sandbox may take to exit after SIGTERM before it is killed (default and at most the "
                  "supervisor's --stop-grace-ms; 0: kill at once)");
  sub->add_flag("--json", a->json, "print the answer as JSON");
  sub->callback([a, exit_code] {
    Failure f;
    if (!check_name(a->name, f)) {
      *exit_code = report("release", f);
      return;
    }
    nlohmann::json req = {{"v", 1}, {"op", "release"}, {"name", a->name}};
    if (a->grace_ms) req["grace_ms"] = *a->grace_ms;
    // Answered once the sandbox is gone: its grace period (at most 20 s) comes on top.
    SupervisorFlags sup = a->sup;
    sup.timeout_ms += a->grace_ms.value_or(20'000);
    auto ans = supervisor_call(sup, req, f);
    if (!ans) {
      *exit_code = report("release", f);
      return;
    }
    if (!ans->value("ok", false)) {
      *exit_code = refused("release", *ans, "release \"" + a->name + "\"");
      return;
    }
    if (a->json) std::printf("%s\n", output_json(*ans).dump().c_str());
    else std::printf("released \"%s\"\n", a->name.c_str());
    *exit_code = kOk;
  });
});

struct LogsArgs {
  SupervisorFlags sup;
  std::string target;
  std::uint64_t bytes = 0;
  bool json = false;
};

// `leasehold logs SANDBOX|NAME`: a sandbox's stdout and stderr, which the supervisor keeps in a
// file per sandbox (its owner and root may read it; also for the last sandboxes gone).
const Command kLogs([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<LogsArgs>();
  auto* sub = app.add_subcommand("logs", "Print a sandbox's output (stdout and stderr), by sandbox id or name");
  add_supervisor_flags(sub, a->sup);
  sub->add_option("target", a->target, "sandbox id (UUID) or name")->required();
  sub->add_option("--bytes", a->bytes, "print at most the last this many bytes (default and at most 1 MiB)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 20));
  sub->add_flag("--json", a->json, "print the answer as JSON (output, log path, truncated, running)");
  sub->callback([a, exit_code] {
    Failure f;
    nlohmann::json req = {{"v", 1}, {"op", "logs"}};
    if (auto id = SandboxId::parse(a->target)) {
      req["sandbox"] = id->str();
    } else {
      if (!check_name(a->target, f)) {
        *exit_code = report("logs", f);
        return;
      }
      req["name"] = a->target;
    }
    if (a->bytes != 0) req["bytes"] = a->bytes;
    auto ans = supervisor_call(a->sup, req, f);
    if (!ans) {
      *exit_code = report("logs", f);
      return;
    }
    if (!ans->value("ok", false)) {
      *exit_code = refused("logs", *ans, "logs of " + a->target);
      return;
    }
    if (a->json) {
      std::printf("%s\n", output_json(*ans).dump().c_str());
    } else {
      const std::string out = ans->value("output", std::string());
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
    *exit_code = kOk;
  });
});

struct ListArgs {
  SupervisorFlags sup;
  bool json = false;
};

const Command kSandboxes([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ListArgs>();
  auto* sub = app.add_subcommand("sandboxes", "List the sandboxes of the local supervisor");
  add_supervisor_flags(sub, a->sup);
  sub->add_flag("--json", a->json, "print the list as JSON");
  sub->callback([a, exit_code] {
    Failure f;
    auto ans = supervisor_call(a->sup, {{"v", 1}, {"op", "list"}}, f);
    if (!ans) {
      *exit_code = report("sandboxes", f);
      return;
    }
    if (!ans->value("ok", false)) {
      *exit_code = report("sandboxes", supervisor_failure(*ans, "list"));
      return;
    }
    const nlohmann::json list = ans->value("sandboxes", nlohmann::json::array());
    if (a->json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& s : list) out.push_back(output_json(s));
      std::printf("%s\n", out.dump().c_str());
      *exit_code = kOk;
      return;
    }
    std::vector<std::vector<std::string>> rows;
    for (const auto& s : list) {
      const bool queued = s.value("state", std::string()) == "queued";  // waiting in lockd's FIFO
      rows.push_back({s.value("sandbox", std::string("?")),
                      s.contains("name") && s["name"].is_string() ? s["name"].get<std::string>()
                      : queued ? s.value("queued_for", std::string("-"))
                               : "-",
                      std::to_string(s.value("epoch", 0ull)), std::to_string(s.value("slot", -1)),
                      std::to_string(s.value("pid", -1)),
                      queued ? "queued " + std::to_string(s.value("queue_position", 0)) + "/" +
                                   std::to_string(s.value("queue_waiters", 0))
                             : s.value("state", std::string("?")),
                      s.contains("valid_until_ms") ? std::to_string(s.value("valid_until_ms", 0ll)) + " ms" : "-"});
    }
    std::fputs(format_table({"SANDBOX", "NAME", "EPOCH", "SLOT", "PID", "STATE", "TTL_LEFT"}, rows).c_str(),
               stdout);
    *exit_code = kOk;
  });
});

struct StatusArgs {
  SupervisorFlags sup;
  bool json = false;
};

/// The status answer as text: health, sandboxes, timing and pause budget, heartbeat RTT, kills,
/// rt lateness.
std::string status_text(const nlohmann::json& st) {
  auto num = [&](const nlohmann::json& j, const char* key) { return j.contains(key) ? j[key].dump() : std::string("?"); };
  auto ms = [](const nlohmann::json& v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3f ms", v.is_number() ? v.get<double>() : 0.0);
    return std::string(b);
  };
  const nlohmann::json& c = st.contains("counters") ? st["counters"] : nlohmann::json::object();
  const nlohmann::json hb = st.value("heartbeat_rtt", nlohmann::json::object());
  const nlohmann::json late = st.value("rt_lateness", nlohmann::json::object());
  const nlohmann::json kill = st.value("kill_latency", nlohmann::json::object());
  std::string t;
  t += "supervisor " + st.value("worker", std::string("?")) + " (pid " + num(st, "pid") + "), mode " +
       st.value("mode", std::string("?")) + ", lockd " + st.value("lockd", std::string("?")) + ": " +
       (st.value("healthy", false) ? "healthy" : "unhealthy") + " (" + st.value("health", std::string("?")) + ")\n";
  t += "  sandboxes    " + num(st, "sandboxes") + " (" + num(st, "named") + " named) of " + num(st, "slots") + " slots\n";
  t += "  pause budget " + ms(st.value("pause_budget_ms", nlohmann::json(0.0))) + " (ttl " + num(st, "ttl_ms") +
       " ms, kill after " + num(st, "kill_after_ms") + " ms, heartbeat every " + num(st, "heartbeat_interval_ms") + " ms)\n";
  t += "  heartbeats   " + num(c, "heartbeat_datagrams") + " sent, " + num(c, "heartbeat_failures") + " unanswered; rtt " +
       num(hb, "count") + " measured, mean " + ms(hb.value("mean_ms", nlohmann::json(0.0))) + ", max " +
       ms(hb.value("max_ms", nlohmann::json(0.0))) + "; last lockd answer " +
       (st.contains("lockd_last_answer_ms_ago") && st["lockd_last_answer_ms_ago"].is_number()
            ? st["lockd_last_answer_ms_ago"].dump() + " ms ago"
            : std::string("never")) + "\n";
  t += "  kills        " + num(c, "kills_deadline") + " by the kill-switch, " + num(c, "kills_request") +
       " on request, " + num(c, "worker_killswitch") + " worker kill-switch; kill latency max " +
       ms(kill.value("max_ms", nlohmann::json(0.0))) + "\n";
  t += "  rt thread    lateness max " + ms(late.value("max_ms", nlohmann::json(0.0))) + " over " + num(late, "count") +
       " wake-ups, " + num(c, "rt_late_over_budget") + " over the " + num(st, "kill_latency_budget_ms") + " ms budget\n";
  return t;
}

const Command kStatus([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<StatusArgs>();
  auto* sub = app.add_subcommand(
      "status",
      "Show the local supervisor: health, sandboxes, pause budget, heartbeat RTT, kills, rt lateness. Exit 0 when "
      "it is healthy, 1 when not (shutting down, kill-switch engaged, no lockd contact), 7 when no supervisor answers");
  add_supervisor_flags(sub, a->sup);
  sub->add_flag("--json", a->json,
                "print the supervisor's status object (\"healthy\", \"health\", \"sandboxes\", \"named\", "
                "\"pause_budget_ms\", \"heartbeat_rtt\": {\"count\", \"mean_ms\", \"max_ms\"}, \"rt_lateness\", "
                "\"kill_latency\", \"counters\": {...}, the configuration, ...)");
  sub->callback([a, exit_code] {
    Failure f;
    auto ans = supervisor_call(a->sup, {{"v", 1}, {"op", "status"}}, f);
    if (!ans) {
      *exit_code = report("status", f);
      return;
    }
    if (!ans->value("ok", false)) {
      *exit_code = report("status", supervisor_failure(*ans, "status"));
      return;
    }
    nlohmann::json st = *ans;
    for (const char* envelope : {"ok", "id", "v"}) st.erase(envelope);
    *exit_code = st.value("healthy", false) ? kOk : kFailure;
    if (a->json) std::printf("%s\n", st.dump(2).c_str());
    else std::fputs(status_text(st).c_str(), stdout);
  });
});

}  // namespace
}  // namespace leasehold::cli
