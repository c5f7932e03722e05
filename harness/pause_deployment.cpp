// leasehold/harness: the pause-probe's deployment, its output directory and its stress load
// (include/leasehold/harness/pause_deployment.hpp).
#include "leasehold/harness/pause_deployment.hpp"

#include "leasehold/harness/freeze.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/supervisor/config.hpp"
#include "leasehold/supervisor/control.hpp"

#include <limits.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <sstream>

namespace leasehold::harness {

namespace {

/// start_standalone() without keeping the temp dir on an error.
Status start_standalone_once(const StandaloneSpec& spec, PauseDeployment& d, const std::function<void()>& tick) {
  try {
    d.tmp.emplace("leasehold-pause");
  } catch (const std::exception& e) {
    return Status{Errc::io_error, e.what()};
  }
  const std::string dir = d.dir();
  if (spec.lockd_bin.empty() || spec.supervisor_bin.empty())
    return Status::invalid(std::string("cannot find ") +
                           (spec.lockd_bin.empty() ? "leasehold-lockd" : "leasehold-supervisor") + " next to " +
                           spec.located_from + " nor in $PATH; pass --lockd-bin / --supervisor-bin");
  d.run = std::make_unique<Deployment>(dir);
  Deployment& run = *d.run;
  if (const Status e = run.make_cluster_key(); !e.ok()) return Status{Errc::io_error, e.message()};
  d.key = run.key();
  // The supervisor holds only its own worker key, derived from the cluster key.
  if (const Status e = run.make_worker_key("worker.key", random_worker_id()); !e.ok())
    return Status{Errc::io_error, e.message()};
  LockdSpec ls;
  ls.bin = spec.lockd_bin;
  ls.ttl_ms = d.timing.ttl_ms;
  ls.ready_timeout = kPauseStartTimeout;
  const Started lockd = run.start_lockd(ls, tick);
  if (!lockd.ok()) return Status{lockd.kind == Started::Kind::not_ready ? Errc::timeout : Errc::io_error, lockd.error};
  d.lockd_text = run.lockd_text();
  d.lockd_addr = run.lockd_address();
  auto relay = UdpRelay::start(d.lockd_addr);
  if (!relay) return Status{Errc::io_error, relay.message()};
  d.relay = std::move(relay).value();
  d.socket = dir + "/supervisor.sock";
  d.shm_path = dir + "/table";
  SupervisorSpec ss;
  ss.bin = spec.supervisor_bin;
  ss.lockd = d.relay->address();
  ss.key_file = dir + "/worker.key";
  ss.control_socket = d.socket;
  ss.shm = d.shm_path;
  ss.log = dir + "/supervisor.log";
  ss.ttl_ms = d.timing.ttl_ms;
  ss.kill_after_ms = d.timing.kill_after_ms;
  ss.heartbeat_interval_ms = d.timing.heartbeat_interval_ms;
  ss.extra_args = {"--kill-latency-budget-ms", std::to_string(d.timing.kill_latency_budget_ms), "--clock-rate-bound",
                   rho_text(d.timing.clock_rate_bound), "--slots", "16", "--on-shutdown", "kill", "--sandbox-log-dir",
                   dir + "/sandbox-logs",
                   // The probe's sandbox is its own trusted program writing logs below the output
                   // directory, which another uid may not reach; the kill path is the same.
                   "--isolation", "off"};
  ss.ready_timeout = kPauseStartTimeout;
  if (const Started sup = run.start_supervisor(ss, nullptr, tick); !sup.ok()) return Status{Errc::io_error, sup.error};
  return {};
}

}  // namespace

PauseDeployment::~PauseDeployment() {
  if (run) run->stop_supervisors();
  relay.reset();
  run.reset();
}

std::string rho_text(double rho) {
  char b[64];
  const auto res = std::to_chars(b, b + sizeof b, rho);
  return std::string(b, res.ec == std::errc() ? res.ptr : b);
}

Status start_standalone(const StandaloneSpec& spec, PauseDeployment& d, const std::function<void()>& tick) {
  const Status st = start_standalone_once(spec, d, tick);
  if (st.ok() || !d.tmp) return st;
  d.tmp->keep();
  return Status{st.code(), st.message() + "\n(" + d.dir() + " is kept for inspection)"};
}

Status recover_left_frozen(const std::string& socket, const std::function<void(const std::string&)>& warn) {
  ucred cred{};
  {
    ControlCallFailure why;
    const ControlConnection conn = control_connect(socket, why);  // only a server of root or ours
    if (!conn || conn.server().pid <= 0) return {};                 // the status request says why
    cred = conn.server();
  }
  const std::string pid = std::to_string(cred.pid);
  if (process_state(cred.pid) == 'T')
    return Status{Errc::not_found, "the supervisor (pid " + pid + ") is stopped (SIGSTOP); resume it with `kill -CONT " +
                                       pid + "` and run the probe again"};
  const auto left = thaw_left_frozen(cred.pid);
  if (!left) return {};
  const std::string& leaf = left->leaf;
  if (!left->thawed)
    return Status{Errc::io_error, "the supervisor (pid " + pid + ") was left frozen in " + leaf +
                                      " by a probe that died, and thawing it failed: " + std::strerror(left->error) +
                                      "; write 0 to " + leaf + "/cgroup.freeze"};
  if (warn) warn("thawed supervisor pid " + pid + ", left frozen in " + leaf + " by a probe that died");
  return {};
}

Status read_status(const nlohmann::json& answer, const StatusOverrides& overrides, PauseDeployment& d) {
  try {
    d.supervisor_pid = answer.at("pid").get<pid_t>();
    d.shm_path = answer.at("shm").get<std::string>();
    d.status_lockd = answer.value("lockd", std::string());
    d.timing.ttl_ms = answer.at("ttl_ms").get<std::uint64_t>();
    d.timing.kill_after_ms = answer.at("kill_after_ms").get<std::uint64_t>();
    d.timing.heartbeat_interval_ms = answer.at("heartbeat_interval_ms").get<std::uint64_t>();
    d.timing.wheel_granularity_ns = answer.at("rt").at("granularity_ns").get<std::uint64_t>();
    // The supervisor reports every input of its pause budget; an override still wins.
    d.timing.clock_rate_bound = overrides.clock_rate_bound ? *overrides.clock_rate_bound
                                                           : answer.at("clock_rate_bound").get<double>();
    d.timing.kill_latency_budget_ms = overrides.kill_latency_budget_ms
                                          ? *overrides.kill_latency_budget_ms
                                          : answer.at("kill_latency_budget_ms").get<std::uint64_t>();
  } catch (const std::exception& e) {
    return Status{Errc::io_error, std::string("the supervisor's status answer lacks a field: ") + e.what()};
  }
  return {};
}

Status load_deployment_key(const std::string& path, PauseDeployment& d) {
  auto kl = wire::load_key_file(path);
  if (kl) {
    d.key = *kl;
    return {};
  }
  std::string msg = kl.message();
  // The loader's own hint names lockd's flag; from here the fix is the deployment's key.
  if (const auto p = msg.find("; create one with `leasehold-lockd --generate-key"); p != std::string::npos) msg.resize(p);
  return Status::invalid(msg + "; pass the key file this deployment's lockd and supervisor use (--key-file or "
                               "$LEASEHOLD_KEY_FILE); a new key is made with `leasehold-lockd --generate-key PATH`");
}

Status settle_lockd(const std::string& lockd, PauseDeployment& d) {
  auto addr = SocketAddress::parse(lockd);
  if (!addr) return Status::invalid("--lockd \"" + lockd + "\" is not HOST:PORT (numeric)");
  if (!d.status_lockd.empty()) {
    const auto theirs = SocketAddress::parse(d.status_lockd);
    if (theirs && theirs->str() != addr->str())
      return Status{Errc::refused, "the supervisor at " + d.socket + " uses lockd at " + theirs->str() + ", not " +
                                       addr->str() + ": the probe must watch the lockd that holds the supervisor's "
                                       "leases (drop --lockd, or pass --lockd " + theirs->str() + ")"};
  }
  d.lockd_addr = *addr;
  d.lockd_text = addr->str();
  lockd::AdminClient probe(d.lockd_addr, *d.key, WorkerId{}, static_cast<std::int64_t>(kLockdCheckTimeoutMs) * 1'000'000);
  const lockd::Answer ans = probe.stats();
  if (!ans.ok())
    return Status{Errc::timeout, "lockd at " + d.lockd_text + " did not answer a stats request signed with the key "
                                 "file within " + std::to_string(kLockdCheckTimeoutMs) + " ms (" + ans.message() +
                                 "): is it running there, and is the key the one lockd was started with? Without "
                                 "lockd's answers no trial can be judged"};
  return {};
}

TrialTarget trial_target(PauseDeployment& d, ControlRequest request, std::vector<std::string> sandbox_argv) {
  TrialTarget t;
  t.request = std::move(request);
  t.lockd = d.lockd_addr;
  t.key = *d.key;
  t.relay = d.relay.get();
  t.timing = d.timing;
  t.sandbox_argv = std::move(sandbox_argv);
  return t;
}

Status prepare_out_dir(std::string& out, std::string& log_dir) {
  namespace fs = std::filesystem;
  if (out.empty()) {
    char stamp[32];
    const time_t now = ::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    out = std::string("pause-probe-") + stamp;
  }
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec)) return Status::invalid("--out " + out + " exists and is not a directory");
  fs::create_directories(out, ec);
  if (ec) return Status::invalid("cannot create the output dir " + out + ": " + ec.message());
  char real[PATH_MAX];
  if (::realpath(out.c_str(), real) != nullptr) out = real;
  if (::access(out.c_str(), W_OK | X_OK) != 0)
    return Status::invalid("cannot write into the output dir " + out + ": " + std::strerror(errno));
  log_dir = out + "/sandbox-logs";
  if (fs::exists(log_dir, ec) && !fs::is_directory(log_dir, ec)) return Status::invalid(log_dir + " exists and is not a directory");
  fs::create_directories(log_dir, ec);
  if (ec) return Status::invalid("cannot create " + log_dir + ": " + ec.message());
  // A root supervisor with isolation runs the probe's sandbox as a uid of its range, which must
  // be able to create its log here: world-writable with the sticky bit, as /tmp.
  fs::permissions(log_dir, fs::perms::all | fs::perms::sticky_bit, fs::perm_options::replace, ec);
  if (ec) return Status::invalid("cannot make " + log_dir + " writable for the sandbox's uid: " + ec.message());
  std::vector<fs::path> stale;
  std::size_t seen = 0;
  for (fs::directory_iterator it(log_dir, ec), end; !ec && it != end && seen < kLogDirEntriesMax; it.increment(ec), ++seen) {
    const std::string name = it->path().filename().string();
    if (name.rfind("sandbox-", 0) == 0 && it->is_regular_file(ec)) stale.push_back(it->path());
  }
  for (const auto& path : stale) fs::remove(path, ec);
  for (const char* old_file : {"pause-probe.png", "pause-probe.svg", "pause-probe.gp", "gnuplot.log"})
    fs::remove(out + "/" + old_file, ec);
  return {};
}

Result<std::string> start_stress(const StressSpec& spec, Process& stress,
                                 const std::function<void(const std::string&)>& warn) {
  const std::string bin = find_program("stress-ng");
  if (bin.empty()) {
    if (warn) warn("--stress: stress-ng is not installed; measuring without load");
    return std::string();
  }
  std::uint64_t est_s = 30;
  for (auto p : spec.plan) est_s += (spec.timing.kill_after_ms + p + spec.timing.ttl_ms + 1500) / 1000 + 1;
  const std::uint64_t secs = spec.timeout_s != 0 ? spec.timeout_s : est_s;
  std::vector<std::string> argv = {bin};
  std::stringstream words(spec.args);
  for (std::string w; words >> w;) argv.push_back(w);
  argv.insert(argv.end(), {"--timeout", std::to_string(secs) + "s", "--quiet"});
  Spawn s;
  s.argv = argv;
  s.stdout_path = spec.log;
  s.stderr_path = spec.log;
  s.label = "stress-ng";
  if (const Status started = stress.start(s); !started.ok()) return Status{Errc::io_error, started.message()};
  std::string text;
  for (const auto& w : argv) text += (text.empty() ? "" : " ") + w;
  return text;
}

}  // namespace leasehold::harness
