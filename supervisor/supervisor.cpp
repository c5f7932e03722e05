#include "leasehold/supervisor/supervisor.hpp"

#include "leasehold/wire/auth.hpp"
#include "leasehold/io/address_list.hpp"
#include "leasehold/io/clock.hpp"
#include "leasehold/io/event_log.hpp"
#include "leasehold/io/service_notify.hpp"
#include "leasehold/io/loop.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/control.hpp"
#include "leasehold/supervisor/heartbeat.hpp"
#include "leasehold/supervisor/cgroup.hpp"
#include "leasehold/supervisor/kill_switch.hpp"
#include "leasehold/lease/shard.hpp"
#include "leasehold/metrics/exchange.hpp"
#include "leasehold/supervisor/lockd_link.hpp"
#include "leasehold/supervisor/os_sandbox_host.hpp"
#include "leasehold/supervisor/output_pump.hpp"
#include "leasehold/supervisor/rt_thread_port.hpp"
#include "leasehold/supervisor/sandbox_phase.hpp"
#include "leasehold/supervisor/sandbox_table.hpp"
#include "leasehold/supervisor/spawn.hpp"
#include "leasehold/supervisor/shm_slot_table.hpp"
#include "leasehold/supervisor/status.hpp"
#include "leasehold/supervisor/supervisor_core.hpp"

#include <openssl/crypto.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <signal.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>

namespace leasehold {
namespace {

using nlohmann::json;

constexpr std::int64_t kStartupProbeTimeoutNs = 2'000'000'000;
constexpr std::uint64_t kRtLateLogIntervalNs = 10'000'000'000;  ///< rt_late events: one log line per 10 s
constexpr std::size_t kExitedLogsMax = 256;  ///< gone sandboxes whose output `logs` still shows
constexpr std::int64_t kShutdownKillWaitNs = 5'000'000'000;
/// How often pending disarms are checked (the rt thread applies commands every tick).
constexpr std::int64_t kDisarmPollNs = 1'000'000;

bool sanitized_build() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#else
  return false;
#endif
}

std::uint64_t now_ns() { return static_cast<std::uint64_t>(boottime_ns()); }

// One structured line per event on stderr (io/event_log.hpp: time, ts_boot_ns, level, then the
// fields `[level=L] event=... k=v`). Bounded and non-blocking (io/log_writer.hpp): a full stderr
// drops lines, never answers.
void log_event(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_event(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  daemon_log().emit(boottime_ns(), std::string_view(buf, std::min(static_cast<std::size_t>(n), sizeof buf - 1)));
}

// Whether argv[0] resolves to an executable, with the PATH the sandbox will have.
Status command_resolves(const ControlRequest& req) {
  std::string path = kDefaultSearchPath;
  for (const auto& e : req.env)
    if (e.rfind("PATH=", 0) == 0) path = e.substr(5);
  return resolve_command(req.argv.front(), path).status();
}

// A reloaded key's probe (a Stats request under it) waits this long for lockd's answer ...
constexpr std::int64_t kKeyProbeNs = 2'000'000'000;
// ... and, unanswered, is sent again (and the refusal logged) this often.
constexpr std::int64_t kKeyProbeIntervalNs = 5'000'000'000;

// The directory part of an absolute path ("/" for "/x").
std::string parent_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : slash == 0 ? std::string("/") : path.substr(0, slash);
}

// Ok when `dir` may be covered as a directory of its own in the sandboxes' mount namespaces:
// see check_dedicated_dir (spawn.hpp); for a non-root supervisor also no directory above it may
// be renamable by its uid (check_no_renamable_ancestor), since its sandboxes share it.
Status check_cover_dir(const std::string& dir, mode_t extra_mode) {
  if (Status why = check_dedicated_dir(dir, extra_mode); !why.ok()) return why;
  if (::geteuid() != 0) return check_no_renamable_ancestor(dir);
  return {};
}

// The core's answers to control clients: through the control server while it is open.
class ControlReplies final : public ControlPort {
 public:
  explicit ControlReplies(std::unique_ptr<ControlServer>& server) : server_(server) {}
  void reply(ControlClientId client, const std::string& line) override {
    if (server_) server_->reply(client, line);
  }
  void progress(ControlClientId client, const std::string& line) override {
    if (server_) server_->progress(client, line);
  }
  bool client_gone(ControlClientId client) const override { return !server_ || server_->client_gone(client); }

 private:
  std::unique_ptr<ControlServer>& server_;
};

}  // namespace

struct Supervisor::Impl {
  SupervisorConfig cfg;
  ConfigBudget check;
  WorkerId worker;
  std::string shm_path;
  std::string control_path;
  std::vector<SocketAddress> lockd_addresses;  ///< --lockd, resolved; the link follows the leader among them
  std::optional<wire::WireKey> key;

  std::unique_ptr<EventLoop> loop;
  std::optional<shm::TableWriter> table;
  CgroupTree cgroups;
  bool cgroup_parent_created = false;
  RtConfig rt_config;
  RtStartStatus rt_status;
  std::string rt_text;
  // An rt wake-up later than kill_latency_budget breaks the pause budget's premise: logged at
  // most once per kRtLateLogIntervalNs (check_rt_lateness).
  std::uint64_t rt_late_logged_ns = 0;
  std::uint64_t rt_late_events = 0;
  std::unique_ptr<RtThreadPort> rt;  // the rt thread and the deadlines it re-reads
  TimerId disarm_timer;  // check_disarms while the core has disarms pending
  int dev_null = -1;
  int table_ro_fd = -1;  ///< O_RDONLY descriptor of the shm table, inherited by every sandbox
  std::vector<SweptWorker> stale_workers;  ///< swept at start (their cgroup parents too, once found)
  int worker_lock_fd = -1;  ///< held (flock) for the process's lifetime
  UidRangeLock uid_range_lock;  ///< root with isolation: this host's claim on the sandbox uid range
  std::string worker_lock_path_held;
  std::optional<BwrapConfig> bwrap;
  // Isolation (supervisor/spawn.hpp): the filter every sandbox gets, root's uid range for the
  // sandboxes root starts, and the paths no sandbox sees.
  std::optional<SeccompFilter> seccomp;
  std::uint32_t sandbox_uid_first = 0;
  std::uint32_t sandbox_uid_count = 0;
  std::vector<std::string> hidden_paths;
  bool unsafe_kill = false;  ///< no delegated cgroup and no pid namespace: a kill may miss processes
  /// Ablation (LEASEHOLD_ABLATE=arm-after-exec): spawn lets the command exec, then arms its
  /// deadline — the order before issue 14, which leaves it unwatched while the io thread stalls.
  bool arm_after_exec = false;
  /// Test hook (LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS): the io thread sleeps this long in spawn,
  /// right after the child was created and armed (ablated: created, exec'd, not yet armed); the
  /// host sleeps (OsSandboxHostConfig::test_stall_ms).
  std::uint64_t test_stall_after_spawn_ms = 0;
  std::unique_ptr<ControlServer> control;
  std::unique_ptr<LockdLink> link;
  std::unique_ptr<OsSandboxHost> host;  // every sandbox's process, leaf, pipes, token channel
  std::unique_ptr<ShmSlotTable> slot_table;  // the core's writes to `table`
  std::unique_ptr<ControlReplies> replies;    // the core's answers, through `control`
  // LEASEHOLD_ABLATE=shared-tokens (attack tests only): every grant's token goes to every
  // sandbox's channel, as when every slot's token sat in the table all sandboxes map.
  bool shared_tokens = false;
  /// The sandbox logic: every sandbox, the heartbeat schedule, the creation flows.
  std::unique_ptr<SupervisorCore> core;
  // Sandbox output: one file per sandbox under sandbox_log_dir, never the supervisor's own
  // stdout/stderr (a sandbox could otherwise write lines that read as the supervisor's events).
  struct ExitedLog {
    SandboxId id;
    std::optional<std::string> name;
    uid_t owner = static_cast<uid_t>(-1);
    std::string path;
    int exit_status = -1;  ///< as Sandbox::exit_code (a `wait` after its exit reads it here)
    std::string reason;    ///< why it ended: "exited", or its kill reason
  };
  std::string sandbox_log_dir;
  bool default_log_dir = false;  // sandbox_log_dir is this worker's default one, created or checked
  OutputPump output_pump;  // sandbox pipes -> their log files, each up to --sandbox-log-max-bytes
  std::deque<ExitedLog> exited_logs;  // oldest first; its file is removed when it leaves
  std::unordered_map<int, PollId> control_polls;
  std::unordered_map<int, short> control_poll_events;
  int signal_fd = -1;
  PollId signal_poll;
  TimerId heartbeat_timer;
  TimerId housekeeping_timer;

  std::int64_t shutdown_deadline_ns = 0;
  int exit_code = 0;
  /// systemd's notifications (Type=notify): READY=1 in run(), WATCHDOG=1 from the housekeeping
  /// timer, STOPPING=1 at the shutdown's start. Does nothing outside systemd.
  ServiceNotifier notifier;
  /// SIGHUP, after the key: the main program's re-read of the config file (the log level).
  std::function<void()> reload_hook;

  /// The daemon's own counters (the sandbox logic's are SupervisorCore::Counters).
  struct Counters {
    std::uint64_t orphans_reaped = 0;
    std::uint64_t key_reloads = 0;          ///< SIGHUP: the worker key was loaded again
    std::uint64_t key_reloads_refused = 0;  ///< SIGHUP: it did not load; the old key stays
    std::uint64_t key_not_accepted = 0;     ///< probes of a reloaded key lockd did not answer
  } counters;

  // ---- start-up ----------------------------------------------------------------------------

  Status init(SupervisorConfig config);
  void teardown_partial();
  void remove_cgroup_parent();
  std::string summary() const;
  int run();

  // ---- helpers -----------------------------------------------------------------------------
  const Sandbox* find(const SandboxId& id) const { return core->sandboxes().find(id); }
  bool shutting_down() const { return core != nullptr && core->shutting_down(); }
  void reply(ControlClientId c, const std::string& line) {
    if (control) control->reply(c, line);
  }
  void sync_control_polls();
  void on_control_ready(int fd, int result);

  // ---- control requests --------------------------------------------------------------------
  void on_request(ControlClientId client, ControlRequest req);
  void do_logs(ControlClientId client, const ControlRequest& req);
  /// A gone sandbox's log stays readable through `logs` for the last kExitedLogsMax of them.
  void remember_log(const Sandbox& s);
  bool may_act_on(ControlClientId client, const ControlRequest& req, uid_t owner, const SandboxId& id);
  json list_json(uid_t caller) const;
  /// The isolation of a sandbox in `slot` started by `caller` (its uid: the caller's own unless
  /// root started it; see --sandbox-uids).
  Isolation isolation_for(uid_t caller_uid, gid_t caller_gid, std::uint32_t slot) const;
  std::string isolation_text() const;
  json status_json() const;
  /// Every value of this supervisor for /metrics (the core's, the daemon's, the rt thread's, the
  /// lockd link's, the shm table's counters), in one list; `status` takes its counters from it.
  void metric_samples(std::vector<metrics::Sample>& out) const;
  /// Whether this supervisor works as it should now: not while it shuts down, while the worker
  /// kill-switch is engaged, or when its last lockd call ended unanswered after lockd's last
  /// answer. `why`: "serving" or the reason.
  bool healthy(std::string* why) const;
  /// /metrics and /healthz: built on the io thread when the HTTP thread asks (serve_metrics).
  metrics::Snapshot metrics_snapshot() const;
  void serve_metrics(metrics::SnapshotExchange& exchange);

  /// Logs (rate-limited) an rt wake-up later than kill_latency_budget_ms: the safety margin the
  /// pause budget relies on was eaten by the host (DESIGN.md "Time").
  void check_rt_lateness();
  /// Takes the per-worker lock (worker_lock_path); "" or why another supervisor has it.
  std::string lock_worker();
  void close_worker_lock();
  /// At exit: this run's sandbox log files that stayed empty, then the default log directory if
  /// nothing is left in it (a file with output stays for whoever reads it). Stops the output pump.
  void remove_empty_logs();
  /// At start, in this worker's default log directory: the log files an earlier supervisor left
  /// (it was killed before its own remove_empty_logs): empty ones are removed, the others kept
  /// for `logs` by sandbox id as the newest gone ones are (the last kExitedLogsMax of them).
  void adopt_old_logs();
  // ---- lifecycle ---------------------------------------------------------------------------
  void on_rt_events();
  /// Runs the core's check_disarms every kDisarmPollNs while it has disarms pending.
  void schedule_disarm_check();
  void reap_orphans();
  void on_signal();
  void begin_shutdown(const char* why);
  /// SIGHUP: loads --key-file again and signs with it from now on (LockdLink::rekey).
  void reload_key();
  void probe_pending_key();
  void on_key_probe(std::uint16_t key_id, const Status& accepted);
  std::int64_t next_key_probe_ns = 0;  ///< when the pending key (lockd lacks it) is tried again
  void maybe_finish_shutdown();

};

// =============================================================================================
// start-up

Status Supervisor::Impl::init(SupervisorConfig config) {
  // SIGTERM/SIGINT/SIGCHLD are read from a signalfd on the io thread: block them before any
  // thread starts, so every thread inherits the mask and none takes them asynchronously.
  {
    sigset_t blocked;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGCHLD);
    sigaddset(&blocked, SIGHUP);  // reload the worker key
    ::pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  }
  cfg = std::move(config);
  const Result<ConfigBudget> checked = check_config(cfg);
  if (!checked) return checked.status();
  check = *checked;
  // The worker id comes with this worker's key: lockd checks every tag with the key derived
  // for the id a datagram claims, so a supervisor can speak only as the worker of its key.
  {
    wire::KeyLoad kl = wire::load_key_file(cfg.key_file);
    if (!kl) return kl.status();
    if (kl->kind != wire::KeyKind::worker)
      return Status{Errc::invalid_argument, "--key-file " + cfg.key_file + " holds a " + std::string(wire::to_string(kl->kind)) +
             " key; a supervisor holds only its worker key (make it with: leasehold-lockd "
             "--derive-worker-key --worker-id ID --key-file CLUSTER_KEY --out WORKER_KEY)"};
    if (cfg.worker_id && *cfg.worker_id != kl->worker)
      return Status{Errc::invalid_argument, "--worker-id " + cfg.worker_id->str() + " is not the worker of key file " + cfg.key_file +
             " (" + kl->worker.str() + ")"};
    key = std::move(kl).value();
  }
  worker = key->worker;
  // One live supervisor per worker id: a second one would sweep the first one's cgroup leaves
  // (killing its sandboxes), share its replay window at lockd and remove its cgroup parent.
  if (std::string err = lock_worker(); !err.empty()) return Status{Errc::busy, err};
  // Supervisors that died without removing their worker lock (a random worker id is never
  // started again): their lock files and what is named after them. Held locks are not touched.
  {
    const std::string lock = worker_lock_path(worker);
    stale_workers = sweep_stale_workers(lock.substr(0, lock.rfind('/')), "/dev/shm", worker);
    for (const SweptWorker& w : stale_workers) {
      std::string removed;
      for (const std::string& r : w.removed) removed += (removed.empty() ? "" : ",") + r;
      log_event("level=warn event=stale_worker_swept worker=%s removed=%s", w.worker.str().c_str(),
                logfmt_value(removed.empty() ? "none" : removed).c_str());
    }
  }
  shm_path = cfg.shm_path.empty() ? default_shm_path(worker) : cfg.shm_path;
  sandbox_log_dir = cfg.sandbox_log_dir.empty() ? runtime_dir() + "/sandbox-logs-" + worker.str() : cfg.sandbox_log_dir;
  {
    // Only the supervisor writes here (each sandbox gets its own file as an open descriptor).
    if (::mkdir(sandbox_log_dir.c_str(), 0700) != 0 && errno != EEXIST)
      return Status{Errc::io_error, "--sandbox-log-dir " + sandbox_log_dir + ": cannot create it: " + std::strerror(errno)};
    struct stat st{};
    if (::lstat(sandbox_log_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
        (st.st_mode & 022) != 0)
      return Status{Errc::permission_denied, "--sandbox-log-dir " + sandbox_log_dir + " must be a directory of uid " + std::to_string(::geteuid()) +
             " that neither group nor others may write"};
    default_log_dir = cfg.sandbox_log_dir.empty();  // the worker lock makes it this process's alone
  }
  if (default_log_dir) adopt_old_logs();  // a --sandbox-log-dir may be shared: it is the operator's
  if (Status started = output_pump.start(); !started.ok()) return started;
  control_path = cfg.control_socket_path.empty() ? default_control_socket_path() : cfg.control_socket_path;
  // Host names are resolved once, here ("localhost:PORT" is 127.0.0.1: IPv4 first).
  Result<std::vector<SocketAddress>> lockds = resolve_address_list(cfg.lockd_address);
  if (!lockds) return Status{lockds.code(), "--lockd " + lockds.message()};
  lockd_addresses = std::move(lockds).value();
  std::optional<gid_t> gid;
  if (!cfg.group.empty()) {
    const Result<gid_t> resolved = resolve_group(cfg.group);
    if (!resolved) return Status{Errc::invalid_argument, "--group: " + resolved.message()};
    gid = *resolved;
  }

  // io_uring first: without it nothing else is worth setting up.
  LoopConfig lc;
  lc.sends_in_flight_max = 1024;
  lc.timers_max = 8192;
  lc.polls_max = std::max<unsigned>(256, cfg.slots + 2 * kControlClientsMax + 8);
  lc.recv_buffer_count = 1024;
  ProbeResult probe;
  loop = EventLoop::create(lc, &probe);
  if (!loop) return Status{Errc::unsupported, "io_uring is not usable: " + probe.message};

  // The shm table (refuses while a live writer owns it).
  shm::TableOptions to;
  to.location = shm_path;
  to.slot_count = cfg.slots;
  to.liveness_timeout_ns = std::min<std::uint64_t>(1000, cfg.kill_after_ms) * 1'000'000ull;
  // A memfd table keeps the read bits only (0440) and is sealed; a --shm path or shm name is a
  // 0640 file. Either way sandboxes map the inherited read-only descriptor.
  to.mode = 0640;
  if (gid) to.group = static_cast<long>(*gid);
  // Ablation for the attack tests only (never a flag): a memfd table without its seals.
  if (ablated("unsealed-table")) to.seal = false;
  shared_tokens = ablated("shared-tokens");
  // Ablation: the old start order, the command exec'd before its deadline is armed.
  arm_after_exec = ablated("arm-after-exec");
  // Test hook: the io thread stalls this long right after creating a sandbox's child (see spawn).
  if (const char* t = std::getenv("LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS"); t != nullptr && *t != '\0') {
    char* end = nullptr;
    errno = 0;
    const unsigned long long ms = std::strtoull(t, &end, 10);
    if (errno != 0 || *end != '\0' || *t < '0' || *t > '9' || ms > 600'000)
      return Status{Errc::invalid_argument, std::string("LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS=\"") + t + "\" is not a number of ms in 0..600000"};
    test_stall_after_spawn_ms = ms;
  }
  try {
    if (cfg.isolation && ::geteuid() != 0 && !shm::parse_location(shm_path).is_memfd)
      return Status{Errc::permission_denied, "--shm " + shm_path + ": a non-root supervisor's isolated sandboxes run as its own uid, so they could "
             "reopen a file-backed table for writing and truncate it (every sandbox of the worker would die with "
             "the supervisor); leave --shm unset (a sealed memfd) or use --shm memfd:NAME"};
    table.emplace(shm::TableWriter::create(to));
  } catch (const shm::TableError& e) {
    return Status{Errc::io_error, std::string("shm table: ") + e.what()};
  }
  shm_path = table->reader_location();  // what readers outside open (a memfd: /proc/<pid>/fd/<N>)

  // cgroup v2 leaves under a per-worker parent, so one worker's leaves are easy to find (and
  // to check for leaks) and removing the parent at shutdown removes nothing of anyone else's.
  CgroupConfig cc;
  {
    std::optional<Cgroup2Mount> m;
    std::optional<std::string> path;
    if (const auto mountinfo = read_small_file(cc.mountinfo_path)) m = find_cgroup2_mount(*mountinfo);
    if (const auto own = read_small_file(cc.proc_self_cgroup_path)) path = own_cgroup2_path(*own);
    if (m && path) {
      std::string rel = *path;
      if (m->root != "/" && rel.rfind(m->root, 0) == 0) rel = rel.substr(m->root.size());
      cc.parent_path = m->mount_point + (rel == "/" ? "" : rel) + "/leasehold-" + worker.str();
      struct stat st{};
      cgroup_parent_created = ::stat(cc.parent_path.c_str(), &st) != 0;
    }
  }
  cc.use_cgroup = !cfg.no_cgroup;
  cc.pids_max = cfg.sandbox_pids_max;
  cgroups = CgroupTree::discover(cc);
  if (cgroups.mode() != KillMode::cgroup_v2_delegated) cgroup_parent_created = false;
  // The cgroup parents of the swept workers, beside ours: removed when empty (their leaves
  // first). One whose sandboxes still run stays, and says so: nobody watches their leases.
  if (cgroups.mode() == KillMode::cgroup_v2_delegated && !cgroups.parent_path().empty()) {
    const std::string base = cgroups.parent_path().substr(0, cgroups.parent_path().rfind('/'));
    for (const SweptWorker& w : stale_workers) {
      const std::string parent = base + "/leasehold-" + w.worker.str();
      if (DIR* d = ::opendir(parent.c_str())) {
        while (const dirent* e = ::readdir(d))
          if (e->d_type == DT_DIR && e->d_name[0] != '.') ::rmdir((parent + "/" + e->d_name).c_str());
        ::closedir(d);
        if (::rmdir(parent.c_str()) == 0)
          log_event("level=warn event=stale_worker_swept worker=%s removed=%s", w.worker.str().c_str(), parent.c_str());
        else
          log_event("level=warn event=stale_worker_cgroup_kept worker=%s path=%s error=\"%s\"", w.worker.str().c_str(),
                    parent.c_str(), std::strerror(errno));
      }
    }
  }
  // Leaves of an earlier supervisor of this worker (crashed, or stopped with --on-shutdown
  // keep): their sandboxes' leases are watched by nobody now, so they do not run on.
  for (const auto& l : cgroups.sweep_leaves())
    log_event("level=warn event=stale_leaf_swept path=%s had_processes=%d result=%s", l.path.c_str(), l.had_processes ? 1 : 0,
              l.error == 0 ? "removed" : std::strerror(-l.error));

  if (cfg.bwrap) {
    bwrap.emplace();
    bwrap->args = default_bwrap_args();
    // The sandbox must see the shm table (read-only is enough) and keep the supervisor's stdio.
    // A memfd table reaches it as the inherited descriptor alone.
    if (!table->location().is_memfd) bwrap->args.insert(bwrap->args.end(), {"--ro-bind", shm_path, shm_path});
    if (const Status why = probe_bwrap(*bwrap); !why.ok()) return Status{Errc::unsupported, "--bwrap: " + why.message()};
  }
  if (cfg.isolation) {
    if (cfg.bwrap)
      return Status{Errc::invalid_argument, "--bwrap and the isolated spawn are exclusive: add --isolation off to wrap sandboxes in bubblewrap"};
    auto built = build_seccomp_filter();
    if (!built) return Status{Errc::unsupported, "sandbox isolation: " + built.message()};
    seccomp = std::move(built).value();
    if (::geteuid() == 0) {
      std::string range_source;  // where a default range came from, for a refusal
      sandbox_uid_first = cfg.sandbox_uid_first;
      sandbox_uid_count = cfg.sandbox_uid_count;
      if (sandbox_uid_first == 0) {
        const Result<std::string> subuid = read_small_file("/etc/subuid");
        const auto range = subuid ? root_subuid_range(*subuid) : std::nullopt;
        sandbox_uid_first = range ? range->first : kDefaultSandboxUidFirst;
        sandbox_uid_count = range ? range->second : kDefaultSandboxUidCount;
        range_source = range ? "root's range in /etc/subuid"
                             : "built in, as /etc/subuid has no range for root";
      }
      // No account's uid or group's gid: a sandbox would own that account's files and processes.
      if (const Status why = check_uid_range_accounts(sandbox_uid_first, sandbox_uid_count);
          !why.ok() && !ablated("uid-range-accounts"))
        return Status{Errc::invalid_argument, cfg.sandbox_uid_first != 0 ? "--uid-range: " + why.message()
                                          : "the default sandbox uid range (" + range_source + "): " + why.message()};
      if (sandbox_uid_count < cfg.slots)
        return Status{Errc::invalid_argument, "--uid-range " + std::to_string(sandbox_uid_first) + ":" + std::to_string(sandbox_uid_count) +
               " holds fewer uids than --slots " + std::to_string(cfg.slots) + " (one per slot)"};
      // No other live supervisor on this host may run sandboxes as these uids.
      if (const Status why = uid_range_lock.claim(runtime_dir() + "/uid-ranges", sandbox_uid_first, sandbox_uid_count,
                                                  "pid " + std::to_string(::getpid()) + ", worker " + worker.str());
          !why.ok())
        return Status{why.code(), "--uid-range: " + why.message()};
    }
    // What no sandbox may see: the key, the control socket, the host cgroup tree. The key by
    // its directory: a rotation renames a new key over the file, which detaches a cover on the
    // file itself in the sandbox's namespace (Linux 3.18+); a non-root supervisor's sandbox shares
    // its uid, so then it reads the new key. Covered, the directory hides every rename inside it.
    char real[PATH_MAX];
    const std::string key_path = ::realpath(cfg.key_file.c_str(), real) != nullptr ? std::string(real) : cfg.key_file;
    if (ablated("key-dir-cover")) {  // tests only: the file alone, as before
      hidden_paths.push_back(key_path);
    } else if (const Status why = check_cover_dir(parent_dir(key_path), 0); why.ok()) {
      hidden_paths.push_back(parent_dir(key_path));
    } else if (::geteuid() != 0) {
      return Status{Errc::permission_denied, "--key-file " + cfg.key_file + ": " + why.message() +
             ". A sandbox of a non-root supervisor runs as its uid: only a cover over the key's directory hides the "
             "key after a rotation renames a new key into place; fix: keep the key alone in a directory of its own "
             "(mkdir -m 700 DIR, owned by uid " + std::to_string(::geteuid()) +
             ", in a path this user cannot rename) and pass --key-file DIR/NAME"};
    } else {
      hidden_paths.push_back(key_path);  // root: DAC guards the 0600 key from the sandboxes' uids
    }
    hidden_paths.push_back("/sys/fs/cgroup");
    if (!cgroups.mount_point().empty()) hidden_paths.push_back(cgroups.mount_point());
    if (const Status why = probe_isolation(isolation_for(0, 0, 0), "true"); !why.ok())
      return Status{Errc::unsupported, "sandbox isolation is not available here: " + why.message() +
             "; fix: allow user namespaces (sysctl user.max_user_namespaces > 0; on Debian/Ubuntu also "
             "kernel.unprivileged_userns_clone=1 or an AppArmor profile), or start with --isolation off "
             "(sandboxes can then escape the kill-switch)"};
  }
  unsafe_kill = !cfg.isolation && cgroups.mode() != KillMode::cgroup_v2_delegated;
  dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const Result<int> table_ro = table->reopen_read_only();
  if (!table_ro.ok()) return table_ro.status();
  table_ro_fd = *table_ro;

  rt_config.slots = cfg.slots;
  rt_config.granularity_ns = cfg.wheel_granularity_ns;
  rt_config.command_poll_ns = cfg.rt_command_poll_ns;
  rt_config.priority = cfg.rt_priority;
  rt_config.cpu = cfg.rt_cpu;
  if (rt_config.cpu < 0) {
    const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    rt_config.cpu = cpus > 1 ? static_cast<int>(cpus - 1) : -1;
  }
  rt_config.lock_memory = !sanitized_build();
  auto rt_started = RtThreadPort::start(rt_config, *table, *loop, rt_status);
  if (!rt_started) return Status{rt_started.code(), "rt thread: " + rt_started.message()};
  rt = std::move(rt_started).value();
  rt_text = rt_status.fifo ? "SCHED_FIFO priority " + std::to_string(rt_config.priority) : "SCHED_OTHER";
  if (rt_status.pinned) rt_text += ", pinned to CPU " + std::to_string(rt_config.cpu);
  rt_text += rt_status.memory_locked ? ", memory locked" : (sanitized_build() ? ", mlockall skipped (sanitizer build)" : "");
  rt_text += ", tick " + std::to_string(cfg.wheel_granularity_ns / 1000) + " us, command poll " +
             std::to_string(rt_config.command_poll_ns / 1000) + " us";
  if (std::string w = rt_status.warnings(rt_config); !w.empty()) {
    while (!w.empty() && w.back() == '\n') w.pop_back();
    for (std::size_t at = 0; at <= w.size();) {
      const std::size_t eol = std::min(w.find('\n', at), w.size());
      log_event("level=warn event=rt_thread_warning note=\"%s\"", w.substr(at, eol - at).c_str());
      at = eol + 1;
    }
    rt_text += " (" + w + ")";
  }
  OsSandboxHostConfig hc;
  hc.loop = loop.get();
  hc.cgroups = &cgroups;
  hc.output = &output_pump;
  hc.log_dir = sandbox_log_dir;
  hc.log_max_bytes = cfg.sandbox_log_max_bytes;
  hc.table_ro_fd = table_ro_fd;
  hc.shm_path = shm_path;
  hc.stdin_fd = dev_null;
  hc.bwrap = bwrap ? &*bwrap : nullptr;
  if (cfg.isolation)
    hc.isolation = [this](uid_t u, gid_t g, std::uint32_t slot) { return isolation_for(u, g, slot); };
  hc.exec_at_once = arm_after_exec;
  hc.test_stall_ms = test_stall_after_spawn_ms;
  hc.log = [](const std::string& event) { log_event("%s", event.c_str()); };
  host = std::make_unique<OsSandboxHost>(std::move(hc), [this](const SandboxId& id) { core->on_exit(id, now_ns()); });

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGHUP);
  signal_fd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd < 0) return Status{Errc::io_error, std::string("signalfd: ") + std::strerror(errno)};
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::signal(SIGPIPE, SIG_IGN);

  control = std::make_unique<ControlServer>(
      ControlAccess{::geteuid(), gid},
      [this](ControlClientId c, ControlRequest r) { on_request(c, std::move(r)); });
  control->set_close_handler([this](ControlClientId c) {
    if (core) core->on_client_closed(c);
  });
  if (Status opened = control->open(control_path); !opened.ok()) return opened;
  if (cfg.isolation) {
    hidden_paths.push_back(control_path);
    // And its directory, where it is one of its own: a non-root supervisor's sandbox (its uid)
    // could otherwise move that directory, or one above it, aside and listen in its place.
    if (ablated("socket-dir-cover")) {  // tests only: the socket (and runtime directory) alone, as before
    } else if (const Status why = check_cover_dir(parent_dir(control_path), gid ? 0050 : 0); why.ok()) {
      hidden_paths.push_back(parent_dir(control_path));
    } else if (::geteuid() != 0) {
      return Status{Errc::permission_denied, "control socket " + control_path + ": " + why.message() +
             ". A sandbox of a non-root supervisor runs as its uid and could put its own socket there; fix: use a "
             "socket directory of this user's alone, mode 0700, in a path it cannot rename (the default "
             "$XDG_RUNTIME_DIR/leasehold with XDG_RUNTIME_DIR=/run/user/" + std::to_string(::geteuid()) + ")"};
    }
    // The runtime directory (worker locks, the default control socket): a sandbox of a non-root
    // supervisor runs as the same uid and could otherwise rename it and listen in its place.
    // Covered, it is a mount point in the sandbox's namespace, which rename(2) refuses.
    const std::string lock = worker_lock_path(worker);
    hidden_paths.push_back(lock.substr(0, lock.rfind('/')));
    hidden_paths.push_back(sandbox_log_dir);  // other sandboxes' output
  }

  // The retry gap check_config's failover condition counts with.
  const RetryPolicy retry = lockd_retry_policy(cfg);
  auto opened = LockdLink::open(*loop, lockd_addresses, worker, *key, retry);
  // The key now lives only in the link's OpenSSL contexts: wipe our copy.
  OPENSSL_cleanse(key->bytes.data(), key->bytes.size());
  key.reset();
  if (!opened) return opened.status();
  link = std::move(opened).value();
  slot_table = std::make_unique<ShmSlotTable>(*table);
  replies = std::make_unique<ControlReplies>(control);
  {
    SupervisorCoreConfig sc;
    sc.worker = worker;
    sc.mode = cfg.mode;
    sc.ttl_ms = cfg.ttl_ms;
    sc.kill_after_ms = cfg.kill_after_ms;
    sc.heartbeat_interval_ms = cfg.heartbeat_interval_ms;
    sc.slots = cfg.slots;
    sc.rt_command_poll_ns = cfg.rt_command_poll_ns;
    sc.synthetic = cfg.synthetic;
    sc.isolation = cfg.isolation;
    sc.unsafe_kill = unsafe_kill;
    sc.allow_unsafe_kill = cfg.allow_unsafe_kill;
    sc.operator_uid = ::geteuid();
    sc.cgroup_reason = cgroups.reason();
    sc.on_shutdown = cfg.on_shutdown;
    sc.stop_grace_ms = cfg.stop_grace_ms;
    sc.shared_tokens = shared_tokens;
    SupervisorCoreHooks hooks;
    hooks.log = [](const std::string& line) { log_event("%s", line.c_str()); };
    hooks.new_sandbox_id = [] { return random_sandbox_id(); };
    hooks.command_resolves = [](const ControlRequest& req) { return command_resolves(req); };
    hooks.gone = [this](const Sandbox& s) { remember_log(s); };
    hooks.recently_gone = [this](const SandboxId& id) -> std::optional<GoneSandbox> {
      for (auto it = exited_logs.rbegin(); it != exited_logs.rend(); ++it)
        if (it->id == id) return GoneSandbox{it->id, it->name, it->owner, it->exit_status, it->reason};
      return std::nullopt;
    };
    hooks.disarm_pending = [this] { schedule_disarm_check(); };
    hooks.shutdown_progress = [this] { maybe_finish_shutdown(); };
    core = std::make_unique<SupervisorCore>(std::move(sc), std::move(hooks), *host, *link, *rt, *replies, *slot_table);
  }
  link->set_is_running_handler([this](const wire::IsRunning& q) { return core->is_running(q); });
  link->set_revoked_handler([this](const wire::Revoked& q) { return core->on_revoked(q, now_ns()); });
  link->set_late_answer_handler([this](const wire::Body& b) { core->on_late_answer(b, now_ns()); });
  link->set_unconfigured_leader_handler([this](const std::string& hint, const SocketAddress& from) {
    log_event("level=warn event=leader_not_configured leader=%s answered_by=%s lockd=%s error=\"lockd names a leader this "
              "supervisor was not given (--lockd): its names' heartbeats cannot reach it, and their sandboxes "
              "are killed when their kill-switch is due unless a configured lockd leads again\"",
              hint.c_str(), from.str().c_str(), address_list_text(link->lockds()).c_str());
  });

  loop->set_wake_handler([this] { on_rt_events(); });
  // lockd must answer now; a supervisor that cannot reach it would only refuse every create.
  // Its stats carry its mode and TTL: a preemptible supervisor on a lease-mode lockd would keep
  // sandboxes whose names expire there (two holders), and a lockd TTL below ours would let the
  // kill-switch fire after lockd's expiry (DESIGN.md "Time").
  // Whether lockd answered at all: a disagreement it answered with (its TTL, its mode) is a
  // misconfiguration, not an unreachable lockd, and is reported as one.
  bool unanswered = false;
  auto ask = [&](const wire::Body& req, auto&& on_answer) -> std::string {
    bool answered = false;
    std::string problem;
    link->call(req, boottime_ns() + kStartupProbeTimeoutNs, [&](LockdReply r) {
      answered = true;
      unanswered = !r.ok();
      if (!r.ok()) problem = r.problem;
      else if (std::holds_alternative<wire::Error>(*r.body)) problem = "lockd answered " + describe_answer(*r.body);
      else problem = on_answer(*r.body, r.first_send_ns);
    });
    while (!answered) loop->run_once(100'000'000);
    return problem;
  };
  std::string problem = ask(wire::Stats{}, [&](const wire::Body& b, std::int64_t) -> std::string {
    const auto* st = std::get_if<wire::StatsAnswer>(&b);
    if (st == nullptr) return "lockd answered stats with " + describe_answer(b);
    std::optional<std::uint64_t> preemptible, ttl;
    std::uint64_t failover_bound = 0;  // 0: a lockd of its own (SQLite), or one that does not say
    std::uint64_t shards = 1;          // a cluster's shard count (lease/shard.hpp); 1 unless it says
    for (const auto& c : st->counters) {
      if (c.key == "mode_preemptible") preemptible = c.value;
      if (c.key == "ttl_ms") ttl = c.value;
      if (c.key == "failover_bound_ms") failover_bound = c.value;
      if (c.key == "shards") shards = c.value;
    }
    if (shards < 1 || shards > kShardsMax)
      return "lockd's cluster reports " + std::to_string(shards) + " shards, outside 1.." + std::to_string(kShardsMax);
    if (!preemptible || !ttl) return "lockd's stats do not report its mode and TTL (an older lockd?)";
    const bool want = cfg.mode == SupervisorMode::preemptible;
    if ((*preemptible != 0) != want)
      return std::string("lockd runs in ") + (*preemptible ? "preemptible" : "lease") + " mode, this supervisor in " +
             std::string(to_string(cfg.mode)) + " mode; start both with the same --mode";
    if (!want && *ttl < cfg.ttl_ms)
      return "lockd's lease TTL is " + std::to_string(*ttl) + " ms, below --ttl-ms " + std::to_string(cfg.ttl_ms) +
             ": the kill-switch could fire after lockd's expiry; give both the same --ttl-ms";
    // The start-up check of a failover (config.hpp) used --lockd-failover-ms: the cluster's own
    // bound must not be longer, or a failover outlasts the kill-switch.
    if (lockd_addresses.size() > 1 && failover_bound > cfg.lockd_failover_ms)
      return "lockd's cluster fails over within " + std::to_string(failover_bound) + " ms, above --lockd-failover-ms " +
             std::to_string(cfg.lockd_failover_ms) + ": a failover could outlast the kill-switch; give "
             "--lockd-failover-ms " + std::to_string(failover_bound) + " (and a --kill-after-ms that leaves room for it)";
    core->set_lockd_ttl_ms(*ttl);
    // Each shard's names go to that shard's leader: one target, and one heartbeat batch, per shard.
    link->set_shards(static_cast<unsigned>(shards));
    core->heartbeat().set_shards(static_cast<unsigned>(shards));
    return {};
  });
  if (problem.empty() && cfg.mode == SupervisorMode::preemptible)
    problem = ask(wire::WorkerHeartbeat{worker, {}}, [&](const wire::Body& b, std::int64_t sent_ns) -> std::string {
      const auto* w = std::get_if<wire::WorkerAck>(&b);
      if (w == nullptr) return "lockd answered a worker heartbeat with " + describe_answer(b);
      if (w->liveness_ttl_ms < cfg.ttl_ms)
        return "lockd's worker-liveness TTL is " + std::to_string(w->liveness_ttl_ms) + " ms, below --ttl-ms " +
               std::to_string(cfg.ttl_ms) + ": the kill-switch would fire after lockd may preempt; make them equal";
      core->heartbeat().start_worker_liveness(static_cast<std::uint64_t>(sent_ns));  // lockd's clock starts later
      ++core->counters().worker_beats_acked;
      return {};
    });
  // Unanswered after lockd's key-rejected notice (unauthenticated, from a configured lockd
  // address): most likely a worker key lockd does not accept, not a lockd that is down.
  const LockdLinkStats& ls = link->stats();
  if (!problem.empty() && unanswered && ls.key_rejected_notices > 0)
    return Status{Errc::permission_denied,
                  "lockd at " + address_list_text(lockd_addresses) + " rejected this worker's key (key id " +
                      std::to_string(ls.last_key_rejected.key_id) + ", " +
                      std::string(wire::to_string(ls.last_key_rejected.reason)) +
                      "; an unauthenticated notice): check that the worker key was derived for worker " +
                      worker.str() + " from a cluster key lockd has loaded (" + problem + ")"};
  if (!problem.empty())
    return Status{Errc::refused, "lockd at " + address_list_text(lockd_addresses) +
                                     (unanswered ? " is unreachable: " : " answered, but this supervisor cannot work with it: ") +
                                     problem};

  signal_poll = loop->add_poll(signal_fd, POLLIN, PollMode::multishot, [this](int) { on_signal(); });
  const std::int64_t interval_ns = static_cast<std::int64_t>(cfg.heartbeat_interval_ms) * 1'000'000;
  heartbeat_timer = loop->add_periodic(interval_ns, boottime_ns() + interval_ns,
                                       [this] { core->on_heartbeat_tick(now_ns()); });
  housekeeping_timer = loop->add_periodic(100'000'000, boottime_ns() + 100'000'000, [this] {
    notifier.watchdog(boottime_ns());  // the io loop turns: tell systemd's watchdog
    check_rt_lateness();
    control->tick(now_ns() / 1'000'000);
    sync_control_polls();
    reap_orphans();
    probe_pending_key();
    core->check_stops(now_ns());  // grace periods end within 100 ms of their deadline
    if (shutting_down()) maybe_finish_shutdown();
  });
  sync_control_polls();
  return {};
}

void Supervisor::Impl::teardown_partial() {
  if (control) control->close_all();
  if (rt) rt->stop();
  if (table) {
    table->close(now_ns());
    table->remove();
  }
  remove_cgroup_parent();
  if (signal_fd >= 0) ::close(signal_fd);
  signal_fd = -1;
  if (dev_null >= 0) ::close(dev_null);
  dev_null = -1;
  if (table_ro_fd >= 0) ::close(table_ro_fd);
  table_ro_fd = -1;
  remove_empty_logs();
  close_worker_lock();
  uid_range_lock.release();
}

void Supervisor::Impl::remove_empty_logs() {
  output_pump.stop();  // every byte a sandbox wrote is in its file now
  std::vector<std::string> paths;
  for (const ExitedLog& e : exited_logs) paths.push_back(e.path);
  if (core)
    for (const auto& [id, s] : core->sandboxes())
      if (!s.log_path.empty()) paths.push_back(s.log_path);
  for (const std::string& p : paths) {
    struct stat st{};
    if (::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0) ::unlink(p.c_str());
  }
  // Only the default directory (one per worker id, under the worker lock): a --sandbox-log-dir
  // is the operator's. rmdir fails (ENOTEMPTY) where output is kept.
  if (default_log_dir) ::rmdir(sandbox_log_dir.c_str());
  default_log_dir = false;
}

void Supervisor::Impl::adopt_old_logs() {
  // Under the worker lock no sandbox of this worker runs or writes here: every file is a gone
  // sandbox's.
  DIR* dir = ::opendir(sandbox_log_dir.c_str());
  if (dir == nullptr) return;
  struct Old {
    std::int64_t mtime_ns;
    SandboxId id;
    std::string path;
  };
  std::vector<Old> kept;
  std::size_t removed = 0;
  while (const dirent* e = ::readdir(dir)) {
    const std::string file = e->d_name;
    if (file.size() <= 4 || file.compare(file.size() - 4, 4, ".log") != 0) continue;
    const auto id = SandboxId::parse(file.substr(0, file.size() - 4));
    if (!id) continue;
    const std::string path = sandbox_log_dir + "/" + file;
    struct stat st{};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (st.st_size == 0) {
      if (::unlink(path.c_str()) == 0) ++removed;
      continue;
    }
    kept.push_back({static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec, *id, path});
  }
  ::closedir(dir);
  std::sort(kept.begin(), kept.end(), [](const Old& a, const Old& b) { return a.mtime_ns < b.mtime_ns; });
  for (const Old& o : kept) {  // oldest first, as remember_log keeps them (the oldest leave first)
    exited_logs.push_back({o.id, std::nullopt, ::geteuid(), o.path, -1,
                           "unknown: it ran under an earlier supervisor process"});
    while (exited_logs.size() > kExitedLogsMax) {
      ::unlink(exited_logs.front().path.c_str());
      exited_logs.pop_front();
    }
  }
  if (removed != 0 || !kept.empty())
    log_event("event=old_sandbox_logs dir=%s removed_empty=%zu kept=%zu", sandbox_log_dir.c_str(), removed,
              exited_logs.size());
}

void Supervisor::Impl::close_worker_lock() {
  // Unlink while still holding the lock, then unlock: a supervisor that opened the old file
  // meanwhile sees its inode is gone and opens again (lock_worker), so no lock files pile up.
  if (worker_lock_fd < 0) return;
  if (!worker_lock_path_held.empty()) ::unlink(worker_lock_path_held.c_str());
  ::close(worker_lock_fd);
  worker_lock_fd = -1;
  worker_lock_path_held.clear();
}

void Supervisor::Impl::remove_cgroup_parent() {
  if (cgroups.mode() == KillMode::cgroup_v2_delegated && !cgroups.parent_path().empty())
    ::rmdir(cgroups.parent_path().c_str());  // fails (EBUSY) only if a kept sandbox still lives there
}

std::string Supervisor::Impl::summary() const {
  char budget[64];
  std::snprintf(budget, sizeof budget, "%.3f ms", static_cast<double>(check.pause_budget_ns) / 1e6);
  std::string s;
  s += "leasehold-supervisor " + worker.str() + " (pid " + std::to_string(::getpid()) + ")\n";
  s += "  worker id        " + worker.str() + "\n";
  s += "  mode             " + std::string(to_string(cfg.mode)) + "\n";
  // The leaders are learned from lockd's answers after this is written: not named here.
  s += "  lockd            " + address_list_text(lockd_addresses) +
       (lockd_addresses.size() > 1
            ? std::string(link->shards() > 1 ? " (" + std::to_string(link->shards()) +
                                                   " shards; each shard's leader followed)"
                                             : " (the leader followed)")
            : std::string()) +
       "\n";
  s += "  shm table        " + shm_path + " (" + std::to_string(cfg.slots) + " slots)\n";
  s += "  control socket   " + control_path + "\n";
  s += "  cgroup           " + cgroups.reason() + "\n";
  s += "  isolation        " + isolation_text() + "\n";
  if (unsafe_kill)
    s += std::string("  kill             UNSAFE: no delegated cgroup v2 and no pid namespace (isolation off): a "
                     "sandbox's descendants can outlive its kill; named sandboxes ") +
         (cfg.allow_unsafe_kill ? "allowed by --allow-unsafe-kill\n" : "are refused\n");
  s += "  rt thread        " + rt_text + "\n";
  s += "  ttl              " + std::to_string(cfg.ttl_ms) + " ms, kill after " +
       std::to_string(cfg.kill_after_ms) + " ms, heartbeat every " +
       std::to_string(cfg.heartbeat_interval_ms) + " ms (" + std::to_string(check.refresh_attempts) +
       " attempts)\n";
  s += "  pause budget     " + std::string(budget) +
       " (a supervisor pause longer than this can break mutual exclusion)\n";
  if (lockd_addresses.size() > 1) {
    char margin[160];
    std::snprintf(margin, sizeof margin, "%.3f ms (kill after %llu ms - heartbeat %llu ms - (failover %llu ms + retry gap %.3f ms))",
                  static_cast<double>(check.failover_margin_ns) / 1e6, static_cast<unsigned long long>(cfg.kill_after_ms),
                  static_cast<unsigned long long>(cfg.heartbeat_interval_ms),
                  static_cast<unsigned long long>(cfg.lockd_failover_ms), static_cast<double>(check.retry_gap_ns) / 1e6);
    s += "  failover margin  " + std::string(margin) + ": a new lockd leader is reached before the kill-switch fires\n";
  }
  return s;
}

// =============================================================================================
// control socket plumbing

void Supervisor::Impl::sync_control_polls() {
  if (!control) return;
  std::unordered_map<int, short> want;
  for (const auto& w : control->watch_fds()) want[w.fd] = w.events;
  // Cancel polls for fds that are gone or whose interest changed.
  for (auto it = control_polls.begin(); it != control_polls.end();) {
    auto w = want.find(it->first);
    if (w == want.end() || control_poll_events[it->first] != w->second) {
      loop->cancel_poll(it->second);
      control_poll_events.erase(it->first);
      it = control_polls.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [fd, ev] : want) {
    if (control_polls.contains(fd) || ev == 0) continue;
    const int f = fd;
    PollId id = loop->add_poll(fd, static_cast<std::uint32_t>(ev), PollMode::oneshot,
                               [this, f](int result) { on_control_ready(f, result); });
    if (id.valid()) {
      control_polls[fd] = id;
      control_poll_events[fd] = ev;
    }
  }
}

void Supervisor::Impl::on_control_ready(int fd, int result) {
  control_polls.erase(fd);
  control_poll_events.erase(fd);
  short revents = result < 0 ? static_cast<short>(POLLERR) : static_cast<short>(result);
  control->on_ready(fd, revents, now_ns() / 1'000'000);
  sync_control_polls();
}

// =============================================================================================
// control requests

void Supervisor::Impl::on_request(ControlClientId client, ControlRequest req) {
  switch (req.op) {
    case ControlOp::list:
      reply(client, control_ok(req.id, {{"sandboxes", list_json(req.caller_uid)}}));
      return;
    case ControlOp::status:
      reply(client, control_ok(req.id, status_json()));
      return;
    case ControlOp::logs:
      do_logs(client, req);
      return;
    default:  // the sandboxes' own: run, name, expect-commit, release, kill
      core->on_request(client, std::move(req), now_ns());
      return;
  }
}

void Supervisor::Impl::check_rt_lateness() {
  const std::uint64_t late = rt->take_lateness_max_ns();
  const std::uint64_t budget_ns = cfg.kill_latency_budget_ms * 1'000'000;
  if (late <= budget_ns) return;
  ++rt_late_events;
  const std::uint64_t now = now_ns();
  if (rt_late_logged_ns != 0 && now - rt_late_logged_ns < kRtLateLogIntervalNs) return;
  rt_late_logged_ns = now;
  log_event("level=warn event=rt_late lateness_ms=%.3f kill_latency_budget_ms=%" PRIu64
            " note=\"the rt thread woke later than the kill-latency budget the pause budget assumes; "
            "isolate its CPU or raise --kill-latency-budget-ms\"",
            static_cast<double>(late) / 1e6, cfg.kill_latency_budget_ms);
}

std::string Supervisor::Impl::lock_worker() {
  const std::string path = worker_lock_path(worker);
  const std::string dir = path.substr(0, path.rfind('/'));
  // Non-root: the control socket server requires this directory to be ours with mode 0700.
  if (::mkdir(dir.c_str(), ::geteuid() == 0 ? 0755 : 0700) != 0 && errno != EEXIST)
    return "cannot create " + dir + " for the worker lock: " + std::strerror(errno);
  // The holder unlinks the file before it unlocks (close_worker_lock), so a lock taken on an
  // inode that is no longer at `path` was a departing holder's: open again.
  // Another supervisor's start-up sweep (sweep_stale_workers) holds a stale lock for a moment
  // before it unlinks it: a lock found held is tried again for up to half a second before its
  // holder is called live.
  int busy_waits = 50;
  for (int attempt = 0; attempt < 8; ++attempt) {
    // 0600: flock needs only a read-only descriptor, so a file others may open lets anyone
    // hold the lock and keep this worker's supervisor from restarting (the restart is what
    // stops a crashed supervisor's leftover sandboxes).
    worker_lock_fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (worker_lock_fd < 0) return "cannot open the worker lock " + path + ": " + std::strerror(errno);
    (void)::fchmod(worker_lock_fd, 0600);  // one left by an older version may be 0644
    if (::flock(worker_lock_fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      if (e == EWOULDBLOCK && busy_waits-- > 0) {
        ::close(worker_lock_fd);
        worker_lock_fd = -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        --attempt;  // a wait, not an attempt on a replaced file
        continue;
      }
      char pid[32] = {};
      [[maybe_unused]] const ssize_t n = ::pread(worker_lock_fd, pid, sizeof pid - 1, 0);
      ::close(worker_lock_fd);
      worker_lock_fd = -1;
      if (e == EWOULDBLOCK)
        return "worker " + worker.str() + " already has a live supervisor (pid " +
               std::string(pid, std::strcspn(pid, "\n")) + ", lock " + path +
               "); stop it first (a worker runs one supervisor; another worker needs its own key)";
      return "cannot lock " + path + ": " + std::strerror(e);
    }
    struct stat held {}, named {};
    if (::fstat(worker_lock_fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev) {
      worker_lock_path_held = path;
      const std::string me = std::to_string(::getpid()) + "\n";
      const bool wrote = ::ftruncate(worker_lock_fd, 0) == 0 &&
                         ::pwrite(worker_lock_fd, me.data(), me.size(), 0) == static_cast<ssize_t>(me.size());
      (void)wrote;  // the pid is only for the message above; the lock is what counts
      return {};
    }
    ::close(worker_lock_fd);
    worker_lock_fd = -1;
  }
  return "cannot take the worker lock " + path + ": it keeps being replaced";
}

Isolation Supervisor::Impl::isolation_for(uid_t caller_uid, gid_t caller_gid, std::uint32_t slot) const {
  Isolation iso;
  iso.hide = hidden_paths;
  iso.seccomp = seccomp ? &*seccomp : nullptr;
  iso.nproc_max = cfg.sandbox_nproc_max;
  if (::geteuid() != 0) {  // a non-root supervisor can map only itself
    iso.uid = ::geteuid();
    iso.gid = ::getegid();
  } else if (caller_uid != 0 && caller_uid != static_cast<uid_t>(-1)) {  // never more than the caller
    iso.uid = caller_uid;
    iso.gid = caller_gid != 0 && caller_gid != static_cast<gid_t>(-1) ? caller_gid : caller_uid;
  } else {  // root's sandboxes: one uid per slot from the range
    iso.uid = iso.gid = sandbox_uid_first + slot % std::max<std::uint32_t>(sandbox_uid_count, 1);
  }
  return iso;
}

std::string Supervisor::Impl::isolation_text() const {
  if (!cfg.isolation)
    return "off (legacy spawn: sandboxes run as uid " + std::to_string(::geteuid()) +
           " in the supervisor's namespaces and can escape the kill-switch)";
  std::string t = "on: user, pid, mount, ipc, uts and cgroup namespaces, no capabilities, no_new_privs, seccomp (" +
                  std::to_string(seccomp ? seccomp->denied.size() : 0) + " calls denied), at most " +
                  std::to_string(cfg.sandbox_nproc_max) + " processes; uid ";
  if (::geteuid() != 0) return t + std::to_string(::geteuid()) + " (this supervisor's own)";
  return t + "of a non-root caller, else " + std::to_string(sandbox_uid_first) + "+slot (of " +
         std::to_string(sandbox_uid_first) + ":" + std::to_string(sandbox_uid_count) + ")";
}

bool Supervisor::Impl::may_act_on(ControlClientId client, const ControlRequest& req, uid_t owner, const SandboxId& id) {
  if (req.caller_uid == 0 || req.caller_uid == owner) return true;
  reply(client, control_error(req.id, ControlError::forbidden,
                              "sandbox " + id.str() + " belongs to uid " + std::to_string(owner) + "; uid " +
                                  std::to_string(req.caller_uid) + " may act only on its own sandboxes (root on all)"));
  return false;
}

void Supervisor::Impl::remember_log(const Sandbox& s) {
  if (s.log_path.empty()) return;
  exited_logs.push_back({s.id, s.name ? s.name : s.pending_name, s.owner, s.log_path, s.exit_code,
                         s.kill_reason.empty() ? std::string("exited") : s.kill_reason});
  while (exited_logs.size() > kExitedLogsMax) {
    ::unlink(exited_logs.front().path.c_str());
    exited_logs.pop_front();
  }
}

void Supervisor::Impl::do_logs(ControlClientId client, const ControlRequest& req) {
  // A live sandbox (by id, or the holder of a name), else one of the last ones gone.
  const Sandbox* live = nullptr;
  if (req.sandbox) {
    live = find(*req.sandbox);
  } else if (const SandboxId* holder = core->sandboxes().holder_of(*req.name)) {
    live = find(*holder);
  }
  const ExitedLog* gone = nullptr;
  if (live == nullptr || live->log_path.empty()) {
    live = nullptr;
    for (auto it = exited_logs.rbegin(); it != exited_logs.rend() && gone == nullptr; ++it)
      if (req.sandbox ? it->id == *req.sandbox : it->name == req.name) gone = &*it;
  }
  if (live == nullptr && gone == nullptr) {
    reply(client, control_error(req.id, ControlError::not_found,
                                (req.sandbox ? "no sandbox " + req.sandbox->str() : "no sandbox named \"" + *req.name + "\"") +
                                    " with output on this supervisor (the last " + std::to_string(kExitedLogsMax) +
                                    " gone ones are kept)"));
    return;
  }
  const SandboxId id = live ? live->id : gone->id;
  const std::string path = live ? live->log_path : gone->path;
  if (!may_act_on(client, req, live ? live->owner : gone->owner, id)) return;
  const std::uint64_t want = req.bytes == 0 ? kControlLogBytesMax : req.bytes;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat st{};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    reply(client, control_error(req.id, ControlError::internal, "cannot read " + path + ": " + std::strerror(e)));
    return;
  }
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t from = size > want ? size - want : 0;
  std::string out(static_cast<std::size_t>(size - from), '\0');
  const ssize_t n = ::pread(fd, out.data(), out.size(), static_cast<off_t>(from));
  ::close(fd);
  out.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  reply(client, control_ok(req.id, {{"sandbox", id.str()}, {"log", path}, {"output", out}, {"bytes", size},
                                    {"truncated", from > 0}, {"running", live != nullptr}}));
}

json Supervisor::Impl::list_json(uid_t caller) const { return sandbox_list_json(*core, caller, now_ns()); }

void Supervisor::Impl::metric_samples(std::vector<metrics::Sample>& out) const {
  using metrics::Kind;
  const std::uint64_t now = now_ns();
  core_metric_samples(*core, now, out);
  auto gauge = [&](std::string_view name, std::uint64_t v, std::string_view help, std::uint64_t scale = 1) {
    out.push_back(metrics::Sample{name, Kind::gauge, v, {}, help, false, scale});
  };
  auto counter = [&](std::string_view name, std::uint64_t v, std::string_view help) {
    out.push_back(metrics::Sample{name, Kind::counter, v, {}, help});
  };
  const RtCounters rc = rt->counters();
  const LockdLinkStats& ls = link->stats();
  std::string why;
  gauge("healthy", healthy(&why) ? 1 : 0, "1 while /healthz answers 200");
  gauge("shutting_down", shutting_down() ? 1 : 0, "1 while the supervisor shuts down");
  gauge("slots", cfg.slots, "slots of the shm table (--slots)");
  gauge("ttl_ms", cfg.ttl_ms, "lockd's lease TTL this supervisor is configured with");
  gauge("kill_after_ms", cfg.kill_after_ms, "the kill-switch fires this long after the last acknowledged heartbeat");
  gauge("heartbeat_interval_ms", cfg.heartbeat_interval_ms, "heartbeat interval");
  gauge("kill_latency_budget_ms", cfg.kill_latency_budget_ms, "the rt thread's kill latency budget");
  gauge("pause_budget_seconds", static_cast<std::uint64_t>(std::max<std::int64_t>(check.pause_budget_ns, 0)),
        "the longest stall of this host the timing rule tolerates", 1'000'000'000);
  gauge("lockd_shards", link->shards(), "shards of the lockd cluster");
  gauge("rt_sched_fifo", rt_status.fifo ? 1 : 0, "1 when the rt thread runs SCHED_FIFO");
  gauge("rt_kill_issue_latency_seconds_max", rc.kill_issue_latency_ns_max,
        "the longest time from a deadline to its kill being issued", 1'000'000'000);
  counter("rt_ticks", rc.ticks, "rt thread wake-ups");
  counter("rt_rearms", rc.rearms, "deadlines re-armed on the rt thread");
  counter("rt_kills_issued", rc.kills_issued, "kills issued by the rt thread");
  counter("rt_kills_confirmed", rc.kills_confirmed, "kills confirmed (the sandbox is dead)");
  counter("rt_late_over_budget", rt_late_events, "rt wake-ups later than the kill latency budget");
  counter("rt_kill_records_dropped", rt->kill_events_dropped(), "kill records the io thread did not get (queue full)");
  counter("orphans_reaped", counters.orphans_reaped, "re-parented descendants reaped");
  counter("key_reloads", counters.key_reloads, "worker key loaded again on SIGHUP");
  counter("key_reloads_refused", counters.key_reloads_refused, "worker key reloads refused (the old key stays)");
  counter("key_not_accepted", counters.key_not_accepted, "probes of a reloaded key lockd did not answer");
  counter("sandbox_output_discarded_bytes", output_pump.discarded_bytes(), "sandbox output past --sandbox-log-max-bytes");
  counter("log_lines_dropped", daemon_log().dropped(), "log lines dropped: stderr was not read");
  counter("control_bad_requests", control->bad_requests(), "malformed control requests");
  counter("control_unauthorized", control->rejected_unauthorized(), "control connections refused");
  counter("lockd_calls_answered", ls.calls_answered, "lockd calls that got an authentic answer");
  counter("lockd_calls_unanswered", ls.calls_unanswered, "lockd calls that ended with no answer");
  counter("lockd_answers_bad", ls.answers_bad, "lockd answers that failed to decode");
  counter("lockd_answers_forged", ls.answers_forged, "answers to an outstanding call that failed authentication");
  counter("lockd_retries", link->client_stats().retries, "lockd requests resent");
  counter("lockd_not_leader_answers", ls.not_leader_answers, "not_leader answers (redirects)");
  counter("lockd_not_leader_waits", ls.not_leader_waits, "redirects resent after a backoff");
  counter("lockd_leader_switches", ls.leader_switches, "moves to another lockd address");
  counter("lockd_unconfigured_leader_hints", ls.unconfigured_leader_hints, "leader hints naming an address not configured");
  counter("lockd_late_answers", ls.late_answers, "answers after their call gave up");
  counter("lockd_seq_resyncs", ls.seq_resyncs, "stale_seq answers that moved the seq");
  counter("lockd_revocations_pushed", ls.revocations_pushed, "revocations pushed by lockd");
  counter("lockd_key_rejected_notices", ls.key_rejected_notices,
          "lockd's unauthenticated notices that it dropped a datagram of ours for its key");
  counter("is_running_answered", ls.is_running_answered, "IsRunning questions answered");
  counter("is_running_rejected", ls.is_running_rejected, "IsRunning questions rejected");
  const shm::Stats& st = table->statistics();
  counter("shm_kills", st.counters.kills.load(std::memory_order_relaxed), "kills recorded in the shm table");
  counter("shm_heartbeat_failures", st.counters.heartbeat_failures.load(std::memory_order_relaxed),
          "heartbeat failures recorded in the shm table");
  counter("shm_revokes", st.counters.revokes.load(std::memory_order_relaxed), "slot revocations");
  counter("shm_publishes", st.counters.publishes.load(std::memory_order_relaxed), "epochs published");
  counter("shm_claims_refused_full", st.counters.claims_refused_full.load(std::memory_order_relaxed),
          "slot claims refused: the table was full");
}

bool Supervisor::Impl::healthy(std::string* why) const {
  const LockdLinkStats& ls = link->stats();
  std::string text;
  if (shutting_down()) text = "shutting down";
  else if (core->heartbeat().killswitch_engaged())
    text = "the worker kill-switch is engaged: lockd did not acknowledge the worker's heartbeats in time";
  else if (ls.last_unanswered_ns > ls.last_answer_ns)
    text = "no lockd contact: the last call to lockd (" + link->lockd().str() + ") ended unanswered, " +
           std::to_string(ls.calls_unanswered) + " unanswered so far";
  // A key-rejected notice since the last authentic answer: the likely cause, stated as a claim
  // nobody authenticated (anyone on the path can send one).
  if (!text.empty() && ls.last_unanswered_ns > ls.last_answer_ns && ls.last_key_rejected_ns > ls.last_answer_ns)
    text += "; lockd says it rejected our key (key id " + std::to_string(ls.last_key_rejected.key_id) + ", " +
            std::string(wire::to_string(ls.last_key_rejected.reason)) +
            ", an unauthenticated notice): check the worker key was derived for this worker from lockd's cluster key";
  if (why != nullptr) *why = text.empty() ? "serving" : text;
  return text.empty();
}

metrics::Snapshot Supervisor::Impl::metrics_snapshot() const {
  static_assert(shm::kHistogramBuckets == metrics::kLog2Buckets, "the exposition's buckets are the shm table's");
  metrics::Snapshot snap;
  metric_samples(snap.samples);
  snap.healthy = healthy(&snap.health);
  const shm::Stats& st = table->statistics();
  auto histogram = [&](std::string_view name, std::string_view help, const shm::Histogram& h) {
    metrics::HistogramSample hs;
    hs.name = name;
    hs.help = help;
    hs.scale = 1'000'000'000;  // recorded in ns, exported in seconds
    hs.sum = h.sum.load(std::memory_order_relaxed);
    for (std::size_t b = 0; b < metrics::kLog2Buckets; ++b) hs.buckets[b] = h.buckets[b].load(std::memory_order_relaxed);
    snap.histograms.push_back(hs);
  };
  histogram("rt_lateness_seconds", "rt thread wake-up lateness", st.rt_lateness_ns);
  histogram("heartbeat_rtt_seconds", "heartbeat round-trip time to lockd", st.heartbeat_rtt_ns);
  histogram("kill_latency_seconds", "kill deadline to the sandbox's death confirmed", st.kill_latency_ns);
  return snap;
}

void Supervisor::Impl::serve_metrics(metrics::SnapshotExchange& exchange) {
  loop->add_poll(exchange.wake_fd(), POLLIN, PollMode::multishot, [this, &exchange](int) {
    if (exchange.take_request()) exchange.publish(metrics_snapshot());
  });
}

json Supervisor::Impl::status_json() const {
  const RtCounters rc = rt->counters();
  json j = core_status_json(*core, now_ns());
  j.update({
      {"worker", worker.str()},
      {"key_id", link->key_id()},
      {"pending_key_id", link->pending_key_id()},
      {"pid", ::getpid()},
      {"mode", std::string(to_string(cfg.mode))},
      {"lockd", link->lockd().str()},  // the lockd the link talks to now (the leader, as far as it knows)
      {"lockd_shards", link->shards()},
      {"lockd_leaders", [this] {  // per shard, the lockd the link sends that shard's names to
         json a = json::array();
         for (unsigned k = 0; k < link->shards(); ++k) a.push_back(link->lockd(k).str());
         return a;
       }()},
      {"lockd_addresses", [this] {
         json a = json::array();
         for (const SocketAddress& l : lockd_addresses) a.push_back(l.str());
         return a;
       }()},
      {"lockd_failover_ms", cfg.lockd_failover_ms},
      {"failover_margin_ms", static_cast<double>(check.failover_margin_ns) / 1e6},
      {"shm", shm_path},
      {"control_socket", control_path},
      {"cgroup", std::string(describe(cgroups.mode()))},
      {"cgroup_reason", cgroups.reason()},
      {"cgroup_parent", cgroups.mode() == KillMode::cgroup_v2_delegated ? cgroups.parent_path() : std::string()},
      {"rt", {{"sched_fifo", rt_status.fifo}, {"priority", rt_status.fifo ? rt_config.priority : 0},
              {"cpu", rt_status.pinned ? rt_config.cpu : -1}, {"memory_locked", rt_status.memory_locked},
              {"text", rt_text}, {"ticks", rc.ticks}, {"rearms", rc.rearms}, {"kills_issued", rc.kills_issued},
              {"kills_confirmed", rc.kills_confirmed}, {"kill_issue_latency_ns_max", rc.kill_issue_latency_ns_max},
              {"granularity_ns", cfg.wheel_granularity_ns}, {"command_poll_ns", rt_config.command_poll_ns}}},
      {"ttl_ms", cfg.ttl_ms},
      {"kill_after_ms", cfg.kill_after_ms},
      {"heartbeat_interval_ms", cfg.heartbeat_interval_ms},
      {"kill_latency_budget_ms", cfg.kill_latency_budget_ms},
      {"clock_rate_bound", cfg.clock_rate_bound},
      {"pause_budget_ms", static_cast<double>(check.pause_budget_ns) / 1e6},
      {"slots", cfg.slots},
      {"shutting_down", shutting_down()},
      {"synthetic", cfg.synthetic},
      {"isolation", cfg.isolation},
      {"isolation_text", isolation_text()},
      {"unsafe_kill", unsafe_kill},
      {"allow_unsafe_kill", cfg.allow_unsafe_kill},
  });
  std::vector<metrics::Sample> samples;
  metric_samples(samples);
  for (const metrics::Sample& m : samples)
    if (m.kind == metrics::Kind::counter) j["counters"][std::string(m.name)] = m.value;
  std::string why;
  j["healthy"] = healthy(&why);
  j["health"] = why;
  const LockdLinkStats& ls = link->stats();
  j["lockd_last_answer_ms_ago"] = ls.last_answer_ns == 0 ? json(nullptr)
                                                         : json((static_cast<std::int64_t>(now_ns()) - ls.last_answer_ns) / 1'000'000);
  // The shm histograms in brief: how many, their mean and their largest (ms).
  const shm::Stats& st = table->statistics();
  auto brief = [](const shm::Histogram& h) {
    const std::uint64_t n = h.count.load(std::memory_order_relaxed);
    const std::uint64_t sum = h.sum.load(std::memory_order_relaxed);
    return json{{"count", n},
                {"mean_ms", n == 0 ? 0.0 : static_cast<double>(sum) / static_cast<double>(n) / 1e6},
                {"max_ms", static_cast<double>(h.max.load(std::memory_order_relaxed)) / 1e6}};
  };
  j["heartbeat_rtt"] = brief(st.heartbeat_rtt_ns);
  j["rt_lateness"] = brief(st.rt_lateness_ns);
  j["kill_latency"] = brief(st.kill_latency_ns);
  return j;
}

// =============================================================================================
// lifecycle

void Supervisor::Impl::on_rt_events() {
  RtKillEvent e;
  while (rt->pop_kill(e)) core->on_rt_kill(e, now_ns());
}

void Supervisor::Impl::schedule_disarm_check() {
  if (disarm_timer.valid()) return;
  disarm_timer = loop->add_timer_after(kDisarmPollNs, [this] {
    disarm_timer = TimerId{};
    core->check_disarms(now_ns());
  });
}

void Supervisor::Impl::reap_orphans() {
  // Re-parented descendants (we are a child subreaper). A sandbox's first process is reaped in
  // finish_exit, after the rt thread let go of it: peek first, and stop at a sandbox.
  for (int i = 0; i < 1024; ++i) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    for (const auto& [id, s] : core->sandboxes()) {
      if (s.pid == info.si_pid) {
        if (s.phase != SandboxPhase::exited) core->on_exit(SandboxId(id), now_ns());
        return;  // its reap waits for the disarm; orphans behind it wait one tick more
      }
    }
    siginfo_t gone{};
    ::waitid(P_PID, static_cast<id_t>(info.si_pid), &gone, WEXITED | WNOHANG);
    ++counters.orphans_reaped;
  }
}

void Supervisor::Impl::on_signal() {
  signalfd_siginfo si{};
  while (::read(signal_fd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    if (si.ssi_signo == SIGCHLD) {
      reap_orphans();
    } else if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
      begin_shutdown(si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
    } else if (si.ssi_signo == SIGHUP) {
      reload_key();
      if (reload_hook) reload_hook();
    }
  }
}

void Supervisor::Impl::reload_key() {
  // A key rotation: --key-file again, with the same checks as at start. Leases, sandboxes and
  // the seq continue; a key that does not load changes nothing.
  // The new key is used only once lockd answers a request signed with it (LockdLink::try_key):
  // until then every datagram stays under the current key, so a key lockd lacks kills nothing.
  wire::KeyLoad kl = wire::load_key_file(cfg.key_file);
  Status err = kl.status();
  const std::uint16_t id = kl ? kl->key_id : 0;
  if (kl && ablated("unprobed-key-reload"))  // tests only: switch at once, as before
    err = link->rekey(*kl);
  else if (kl)
    err = link->try_key(*kl, boottime_ns() + kKeyProbeNs, [this, id](const Status& accepted) { on_key_probe(id, accepted); });
  if (kl) OPENSSL_cleanse(kl->bytes.data(), kl->bytes.size());
  if (!err.ok()) {
    ++counters.key_reloads_refused;
    log_event("level=warn event=key_reload_refused key_file=%s error=\"%s\"", cfg.key_file.c_str(), err.message().c_str());
    return;
  }
  if (link->pending_key_id() == 0 && link->key_id() == id) {  // the same key id: in use at once
    ++counters.key_reloads;
    log_event("event=key_reloaded key_file=%s key_id=%u", cfg.key_file.c_str(), static_cast<unsigned>(id));
  }
}

void Supervisor::Impl::on_key_probe(std::uint16_t key_id, const Status& accepted) {
  if (accepted.ok()) {
    ++counters.key_reloads;
    log_event("event=key_reloaded key_file=%s key_id=%u", cfg.key_file.c_str(), static_cast<unsigned>(key_id));
    return;
  }
  ++counters.key_not_accepted;
  next_key_probe_ns = boottime_ns() + kKeyProbeIntervalNs;
  log_event("level=warn event=key_not_accepted key_file=%s key_id=%u in_use_key_id=%u error=\"lockd does not know key id %u "
            "(%s): still signing with key id %u; load the new cluster key into lockd (its key directory, then "
            "SIGHUP), tried again every %lld s\"",
            cfg.key_file.c_str(), static_cast<unsigned>(key_id), static_cast<unsigned>(link->key_id()),
            static_cast<unsigned>(key_id), accepted.message().c_str(), static_cast<unsigned>(link->key_id()),
            static_cast<long long>(kKeyProbeIntervalNs / 1'000'000'000));
}

void Supervisor::Impl::probe_pending_key() {
  if (link->pending_key_id() == 0 || boottime_ns() < next_key_probe_ns || shutting_down()) return;
  const std::uint16_t id = link->pending_key_id();
  next_key_probe_ns = INT64_MAX;  // until this probe ends
  if (!link->try_pending_key(boottime_ns() + kKeyProbeNs, [this, id](const Status& accepted) { on_key_probe(id, accepted); }))
    next_key_probe_ns = boottime_ns() + kKeyProbeIntervalNs;
}

void Supervisor::Impl::begin_shutdown(const char* why) {
  if (shutting_down()) return;
  // The sandboxes' grace period (SIGTERM, then cgroup.kill), then the wait for the kills.
  shutdown_deadline_ns = boottime_ns() + kShutdownKillWaitNs + static_cast<std::int64_t>(cfg.stop_grace_ms) * 1'000'000;
  notifier.stopping(std::string("stopping on ") + why + ": " + std::to_string(core->sandboxes().size()) +
                    " sandbox(es), policy " + std::string(to_string(cfg.on_shutdown)));
  core->begin_shutdown(why, now_ns());
  maybe_finish_shutdown();
}

void Supervisor::Impl::maybe_finish_shutdown() {
  const bool done = core->quiescent();
  if (!done && boottime_ns() < shutdown_deadline_ns) return;
  bool busy = false;
  for (const auto& [id, s] : core->sandboxes())
    if (!never_started(s.phase)) busy = true;
  if (busy) log_event("level=warn event=shutdown_timeout sandboxes=%zu", core->sandboxes().size());
  loop->stop();
}

int Supervisor::Impl::run() {
  notifier.ready("worker " + worker.str() + ", lockd " + address_list_text(lockd_addresses) + ", " +
                 std::to_string(cfg.slots) + " slots, control socket " + control_path);
  log_event("event=serving worker=%s lockd=%s config=%s log_level=%s watchdog_ms=%lld", worker.str().c_str(),
            address_list_text(lockd_addresses).c_str(), logfmt_value(cfg.config_file).c_str(),
            std::string(to_string(daemon_log().level())).c_str(),
            static_cast<long long>(notifier.watchdog_interval_ns() / 1'000'000));
  int rc = loop->run();
  if (rc < 0) {
    log_event("level=error event=loop_failed error=\"%s\"", std::strerror(-rc));
    exit_code = 1;
  }
  // Finish: close the table (every check fails from now on), stop the rt thread, clean up.
  if (heartbeat_timer.valid()) loop->cancel_timer(heartbeat_timer);
  if (housekeeping_timer.valid()) loop->cancel_timer(housekeeping_timer);
  table->close(now_ns());
  rt->stop();
  host->stop_all(now_ns());  // left after a shutdown timeout: kill and reap what we can
  remove_empty_logs();
  control->close_all();
  table->remove();
  remove_cgroup_parent();
  log_event("event=stopped");
  close_worker_lock();
  return exit_code;
}

// =============================================================================================

Supervisor::Supervisor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Supervisor::~Supervisor() = default;

Result<std::unique_ptr<Supervisor>> Supervisor::create(SupervisorConfig config) {
  auto impl = std::make_unique<Impl>();
  if (Status failed = impl->init(std::move(config)); !failed.ok()) {
    impl->teardown_partial();
    return failed;
  }
  return std::unique_ptr<Supervisor>(new Supervisor(std::move(impl)));
}

int Supervisor::run() { return impl_->run(); }
void Supervisor::set_reload_hook(std::function<void()> hook) { impl_->reload_hook = std::move(hook); }
void Supervisor::serve_metrics(metrics::SnapshotExchange& exchange) { impl_->serve_metrics(exchange); }
std::string Supervisor::summary() const { return impl_->summary(); }

}  // namespace leasehold
