#include "leasehold/supervisor/supervisor.hpp"

#include "leasehold/wire/auth.hpp"
#include "leasehold/io/clock.hpp"
#include "leasehold/io/log_writer.hpp"
#include "leasehold/io/loop.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/control.hpp"
#include "leasehold/supervisor/heartbeat.hpp"
#include "leasehold/supervisor/cgroup.hpp"
#include "leasehold/supervisor/kill_switch.hpp"
#include "leasehold/supervisor/lockd_link.hpp"
#include "leasehold/supervisor/os_sandbox_host.hpp"
#include "leasehold/supervisor/output_pump.hpp"
#include "leasehold/supervisor/rt_thread_port.hpp"
#include "leasehold/supervisor/sandbox_phase.hpp"
#include "leasehold/supervisor/sandbox_table.hpp"
#include "leasehold/supervisor/spawn.hpp"

#include <openssl/crypto.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <unordered_map>

namespace leasehold {
namespace {

using nlohmann::json;

constexpr std::int64_t kAcquireTimeoutNs = 3'000'000'000;    ///< lockd round trip for acquire/commit
constexpr std::int64_t kReleaseTimeoutNs = 2'000'000'000;
constexpr std::int64_t kStartupProbeTimeoutNs = 2'000'000'000;
constexpr std::uint64_t kRtLateLogIntervalNs = 10'000'000'000;  ///< rt_late events: one log line per 10 s
constexpr std::size_t kExitedLogsMax = 256;  ///< gone sandboxes whose output `logs` still shows
constexpr std::int64_t kShutdownKillWaitNs = 5'000'000'000;
constexpr int kExecVerdictTimeoutMs = 5'000;
constexpr std::size_t kPendingCommitsMax = 4096;
/// Deadline of an armed sandbox that has no lease (unnamed): never due.
constexpr std::uint64_t kNoDeadlineNs = std::uint64_t{1} << 62;
/// How often pending disarms are checked (the rt thread applies commands every tick).
constexpr std::int64_t kDisarmPollNs = 1'000'000;

bool sanitized_build() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#else
  return false;
#endif
}

std::uint64_t now_ns() { return static_cast<std::uint64_t>(now_boottime_ns()); }

// One structured line per event on stderr: "leasehold-supervisor: t=<boottime ns> event=... k=v".
void log_event(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_event(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  // Bounded and non-blocking (io/log_writer.hpp): a full stderr drops lines, never answers.
  char line[2200];
  const int n = std::snprintf(line, sizeof line, "leasehold-supervisor: t=%" PRIu64 " %s\n", now_ns(), buf);
  if (n > 0) stderr_log().write(std::string_view(line, std::min(static_cast<std::size_t>(n), sizeof line - 1)));
}

// Whether argv[0] resolves to an executable, with the PATH the sandbox will have.
bool command_resolves(const ControlRequest& req, std::string& error) {
  std::string path = kDefaultSearchPath;
  for (const auto& e : req.env)
    if (e.rfind("PATH=", 0) == 0) path = e.substr(5);
  return resolve_command(req.argv.front(), path, error).has_value();
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

// Why `dir` may not be covered as a directory of its own in the sandboxes' mount namespaces
// ("" when it may): see dedicated_dir_problem (spawn.hpp); for a non-root supervisor also no
// directory above it may be renamable by its uid (renamable_ancestor), since its sandboxes share it.
std::string cover_dir_problem(const std::string& dir, mode_t extra_mode) {
  std::string why = dedicated_dir_problem(dir, extra_mode);
  if (why.empty() && ::geteuid() != 0) why = renamable_ancestor(dir);
  return why;
}

}  // namespace

struct Supervisor::Impl {
  struct PendingCommit {
    ControlClientId client;
    ControlRequest request;
  };

  SupervisorConfig cfg;
  ConfigBudget check;
  WorkerId worker;
  std::string shm_path;
  std::uint64_t lockd_ttl_ms = 0;  ///< lockd's lease TTL (its maximum), from its stats at start-up
  std::string control_path;
  SocketAddress lockd_address;
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
  std::vector<SandboxId> disarming;
  TimerId disarm_timer;
  int dev_null = -1;
  int table_ro_fd = -1;  ///< O_RDONLY descriptor of the shm table, inherited by every sandbox
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
  std::unique_ptr<HeartbeatSchedule> hb;

  SandboxTable sandboxes;  // by id, by slot and by name
  std::unique_ptr<OsSandboxHost> host;  // every sandbox's process, leaf, pipes, token channel
  // LEASEHOLD_ABLATE=shared-tokens (attack tests only): every grant's token goes to every
  // sandbox's channel, as when every slot's token sat in the table all sandboxes map.
  bool shared_tokens = false;
  /// Publishes a grant: its signed token in the sandbox's own channel first (a sandbox that sees
  /// epoch E in the table finds E's token), then {name, epoch, valid_until} in the table.
  shm::TableErrc publish_grant(Sandbox& s, NameId name_id, const std::string& name, Epoch epoch,
                               std::uint64_t valid_until, const wire::GrantTokenBytes& token) {
    const std::span<const std::uint8_t> bytes(token.data(), token.size());
    if (const shm::TableErrc e = host->publish_token(s.id, epoch, bytes); e != shm::TableErrc::ok) return e;
    if (shared_tokens)
      for (auto& [other_id, o] : sandboxes)
        if (&o != &s) host->publish_token(other_id, epoch, bytes);
    return table->publish(s.slot, name_id, name, epoch, valid_until);
  }
  // Sandbox output: one file per sandbox under sandbox_log_dir, never the supervisor's own
  // stdout/stderr (a sandbox could otherwise write lines that read as the supervisor's events).
  struct ExitedLog {
    SandboxId id;
    std::optional<std::string> name;
    uid_t owner = static_cast<uid_t>(-1);
    std::string path;
  };
  std::string sandbox_log_dir;
  bool default_log_dir = false;  // sandbox_log_dir is this worker's default one, created or checked
  OutputPump output_pump;  // sandbox pipes -> their log files, each up to --sandbox-log-max-bytes
  std::deque<ExitedLog> exited_logs;  // oldest first; its file is removed when it leaves
  std::deque<PendingCommit> pending_commits;
  std::unordered_map<int, PollId> control_polls;
  std::unordered_map<int, short> control_poll_events;
  int signal_fd = -1;
  PollId signal_poll;
  TimerId heartbeat_timer;
  TimerId housekeeping_timer;

  bool shutting_down = false;
  std::int64_t shutdown_deadline_ns = 0;
  std::size_t releases_in_flight = 0;
  int exit_code = 0;

  struct Counters {
    std::uint64_t heartbeat_datagrams = 0;
    std::uint64_t heartbeat_failures = 0;
    std::uint64_t refreshed = 0;
    std::uint64_t lost = 0;
    std::uint64_t unknown = 0;
    std::uint64_t kills_deadline = 0;
    std::uint64_t kills_request = 0;
    std::uint64_t worker_killswitch = 0;
    std::uint64_t spawned = 0;
    std::uint64_t spawn_failures = 0;
    std::uint64_t exited = 0;
    std::uint64_t acquire_refused = 0;
    std::uint64_t creates_refused_killswitch = 0;
    std::uint64_t names_released = 0;
    std::uint64_t late_grants_released = 0;
    std::uint64_t orphans_reaped = 0;
    std::uint64_t key_reloads = 0;          ///< SIGHUP: the worker key was loaded again
    std::uint64_t key_reloads_refused = 0;  ///< SIGHUP: it did not load; the old key stays
    std::uint64_t key_not_accepted = 0;     ///< probes of a reloaded key lockd did not answer
    std::uint64_t worker_beats_acked = 0;
  } counters;

  // ---- start-up ----------------------------------------------------------------------------

  std::string init(SupervisorConfig config);
  void teardown_partial();
  void remove_cgroup_parent();
  std::string summary() const;
  int run();

  // ---- helpers -----------------------------------------------------------------------------
  Sandbox* find(const SandboxId& id) { return sandboxes.find(id); }
  void reply(ControlClientId c, const std::string& line) {
    if (control) control->reply(c, line);
  }
  void sync_control_polls();
  void on_control_ready(int fd, int result);

  // ---- control requests --------------------------------------------------------------------
  void on_request(ControlClientId client, ControlRequest req);
  void do_run(ControlClientId client, ControlRequest req);
  void do_name(ControlClientId client, ControlRequest req);
  void do_expect_commit(ControlClientId client, ControlRequest req);
  void do_release(ControlClientId client, const ControlRequest& req);
  void do_kill(ControlClientId client, const ControlRequest& req);
  void do_logs(ControlClientId client, const ControlRequest& req);
  /// A gone sandbox's log stays readable through `logs` for the last kExitedLogsMax of them.
  void remember_log(const Sandbox& s);
  bool may_act_on(ControlClientId client, const ControlRequest& req, uid_t owner, const SandboxId& id);
  json list_json(uid_t caller) const;
  /// The isolation of a sandbox in `slot` started by `caller` (its uid: the caller's own unless
  /// root started it; see --sandbox-uids).
  Isolation isolation_for(uid_t caller_uid, gid_t caller_gid, std::uint32_t slot) const;
  std::string isolation_text() const;
  /// Owner or root may act on a sandbox; otherwise answers `forbidden` and returns false.
  bool may_act_on(ControlClientId client, const ControlRequest& req, const Sandbox& s);
  /// A named creation where no kill is unescapable (and no --allow-unsafe-kill): answers
  /// `refused`, naming the cause and the fix, and returns true.
  bool refuse_unsafe_kill(ControlClientId client, const ControlRequest& req);
  json status_json() const;

  bool gate_named_creation(ControlClientId client, const json& id);
  /// Logs (rate-limited) an rt wake-up later than kill_latency_budget_ms: the safety margin the
  /// pause budget relies on was eaten by the host (DESIGN.md "Time").
  void check_rt_lateness();
  /// Takes the per-worker lock (worker_lock_path); "" or why another supervisor has it.
  std::string lock_worker();
  void close_worker_lock();
  /// At exit: this run's sandbox log files that stayed empty, then the default log directory if
  /// nothing is left in it (a file with output stays for whoever reads it). Stops the output pump.
  void remove_empty_logs();
  /// Why a requested lease TTL cannot be served ("" if absent or fine).
  std::string ttl_refusal(const std::optional<std::uint64_t>& ttl_ms) const;
  void acquire_name(const SandboxId& sb, ControlClientId client, ControlRequest req);
  void on_granted(const SandboxId& sb, ControlClientId client, ControlRequest req,
                  const wire::Grant& g, std::int64_t send_ns);
  void commit_now(const PendingCommit& pc);
  /// Preemptible mode, after the 2-phase acquire (or for an expect-commit): checks the
  /// kill-switch, starts the sandbox with its epoch unpublished (or, naming a running one, keeps
  /// it), then sends Commit. `acquire_send_ns`: the send of the request that was answered.
  void on_acquiring(const SandboxId& sb, ControlClientId client, ControlRequest req, Epoch epoch,
                    std::int64_t acquire_send_ns);
  void send_commit(const SandboxId& sb, ControlClientId client, ControlRequest req, Epoch epoch);
  /// Commit acknowledged (Held on this worker): publishes the epoch, answers the client.
  void on_committed(const SandboxId& sb, ControlClientId client, const ControlRequest& req, const wire::Grant& g);
  /// A Commit that failed (refused, unanswered): gives the name back and stops a sandbox that
  /// was started for it; a running sandbox that was being named stays, unnamed.
  void commit_failed(const SandboxId& sb, ControlClientId client, const ControlRequest& req, Epoch epoch,
                     ControlError code, const std::string& message, json extra = json::object());
  void spawn(Sandbox& s, ControlClientId client, const ControlRequest& req);
  /// A create or a naming failed: answers `client` with the error. A sandbox still being created
  /// is forgotten (slot freed); a running sandbox that was being named stays, unnamed.
  /// A grant (epoch) for `req.name` that cannot be used: gives it back to lockd and answers
  /// `client` with the error, as abandon() does for a create; a running sandbox being named
  /// stays, unnamed.
  void give_back_name(Sandbox& s, ControlClientId client, const ControlRequest& req, Epoch epoch,
                      ControlError code, const std::string& message);
  void abandon(const SandboxId& sb, ControlClientId client, const json& id, ControlError code,
               const std::string& message, json extra = json::object());
  void on_late_answer(const wire::Body& answer);
  void release_to_lockd(const NameId& name_id, const std::string& name, const SandboxId& sb,
                        Epoch epoch, std::function<void(bool, std::string)> done);

  // ---- lifecycle ---------------------------------------------------------------------------
  void kill_sandbox(Sandbox& s, const std::string& reason);
  void on_pidfd(const SandboxId& id);
  void on_rt_events();
  void finish_exit(const SandboxId& id);
  void check_disarms();
  void reap_orphans();
  void on_signal();
  void begin_shutdown(const char* why);
  /// SIGHUP: loads --key-file again and signs with it from now on (LockdLink::rekey).
  void reload_key();
  void probe_pending_key();
  void on_key_probe(std::uint16_t key_id, bool accepted, const std::string& why);
  std::int64_t next_key_probe_ns = 0;  ///< when the pending key (lockd lacks it) is tried again
  void maybe_finish_shutdown();

  // ---- heartbeat ---------------------------------------------------------------------------
  void on_heartbeat_tick();
  void apply(const HeartbeatAction& a);
  void send_worker_beat(std::uint64_t deadline_ns, std::vector<RefreshEntry> held);
  bool is_running(const wire::IsRunning& q);
  /// lockd pushed a revocation: kill the sandbox of that grant (the existing kill path: the
  /// rt thread revokes the shm slot, then kills); true if one runs or is being placed here.
  bool on_revoked(const wire::Revoked& q);
  /// Tells lockd the sandbox of the revoked grant {name_id, epoch} is dead (lifts its lock-delay).
  void confirm_kill_to_lockd(const NameId& name_id, const std::string& name, const SandboxId& sb, Epoch epoch);
};

// =============================================================================================
// start-up

std::string Supervisor::Impl::init(SupervisorConfig config) {
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
  if (!checked) return checked.message();
  check = *checked;
  // The worker id comes with this worker's key: lockd checks every tag with the key derived
  // for the id a datagram claims, so a supervisor can speak only as the worker of its key.
  {
    wire::KeyLoad kl = wire::load_key_file(cfg.key_file);
    if (!kl) return kl.message();
    if (kl->kind != wire::KeyKind::worker)
      return "--key-file " + cfg.key_file + " holds a " + std::string(wire::to_string(kl->kind)) +
             " key; a supervisor holds only its worker key (make it with: leasehold-lockd "
             "--derive-worker-key --worker-id ID --key-file CLUSTER_KEY --out WORKER_KEY)";
    if (cfg.worker_id && *cfg.worker_id != kl->worker)
      return "--worker-id " + cfg.worker_id->str() + " is not the worker of key file " + cfg.key_file +
             " (" + kl->worker.str() + ")";
    key = std::move(kl).value();
  }
  worker = key->worker;
  // One live supervisor per worker id: a second one would sweep the first one's cgroup leaves
  // (killing its sandboxes), share its replay window at lockd and remove its cgroup parent.
  if (std::string err = lock_worker(); !err.empty()) return err;
  shm_path = cfg.shm_path.empty() ? default_shm_path(worker) : cfg.shm_path;
  sandbox_log_dir = cfg.sandbox_log_dir.empty() ? runtime_dir() + "/sandbox-logs-" + worker.str() : cfg.sandbox_log_dir;
  {
    // Only the supervisor writes here (each sandbox gets its own file as an open descriptor).
    if (::mkdir(sandbox_log_dir.c_str(), 0700) != 0 && errno != EEXIST)
      return "--sandbox-log-dir " + sandbox_log_dir + ": cannot create it: " + std::strerror(errno);
    struct stat st{};
    if (::lstat(sandbox_log_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
        (st.st_mode & 022) != 0)
      return "--sandbox-log-dir " + sandbox_log_dir + " must be a directory of uid " + std::to_string(::geteuid()) +
             " that neither group nor others may write";
    default_log_dir = cfg.sandbox_log_dir.empty();  // the worker lock makes it this process's alone
  }
  if (std::string err = output_pump.start(); !err.empty()) return "sandbox output: " + err;
  control_path = cfg.control_socket_path.empty() ? default_control_socket_path() : cfg.control_socket_path;
  auto addr = SocketAddress::parse(cfg.lockd_address);
  if (!addr) {
    // Accept "localhost:PORT" as a convenience for 127.0.0.1.
    if (cfg.lockd_address.rfind("localhost:", 0) == 0)
      addr = SocketAddress::parse("127.0.0.1:" + cfg.lockd_address.substr(10));
    if (!addr) return "--lockd \"" + cfg.lockd_address + "\" is not a numeric HOST:PORT (e.g. 127.0.0.1:7400)";
  }
  lockd_address = *addr;
  std::optional<gid_t> gid;
  if (!cfg.group.empty()) {
    std::string err;
    gid = resolve_group(cfg.group, err);
    if (!gid) return "--group: " + err;
  }

  // io_uring first: without it nothing else is worth setting up.
  LoopConfig lc;
  lc.sends_in_flight_max = 1024;
  lc.timers_max = 8192;
  lc.polls_max = std::max<unsigned>(256, cfg.slots + 2 * kControlClientsMax + 8);
  lc.recv_buffer_count = 1024;
  ProbeResult probe;
  loop = EventLoop::create(lc, &probe);
  if (!loop) return "io_uring is not usable: " + probe.message;

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
      return std::string("LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS=\"") + t + "\" is not a number of ms in 0..600000";
    test_stall_after_spawn_ms = ms;
  }
  try {
    if (cfg.isolation && ::geteuid() != 0 && !shm::parse_location(shm_path).is_memfd)
      return "--shm " + shm_path + ": a non-root supervisor's isolated sandboxes run as its own uid, so they could "
             "reopen a file-backed table for writing and truncate it (every sandbox of the worker would die with "
             "the supervisor); leave --shm unset (a sealed memfd) or use --shm memfd:NAME";
    table.emplace(shm::TableWriter::create(to));
  } catch (const shm::TableError& e) {
    return std::string("shm table: ") + e.what();
  }
  shm_path = table->reader_location();  // what readers outside open (a memfd: /proc/<pid>/fd/<N>)

  // cgroup v2 leaves under a per-worker parent, so one worker's leaves are easy to find (and
  // to check for leaks) and removing the parent at shutdown removes nothing of anyone else's.
  CgroupConfig cc;
  {
    std::string mountinfo, own;
    std::optional<Cgroup2Mount> m;
    std::optional<std::string> path;
    if (read_small_file(cc.mountinfo_path, mountinfo) == 0) m = find_cgroup2_mount(mountinfo);
    if (read_small_file(cc.proc_self_cgroup_path, own) == 0) path = own_cgroup2_path(own);
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
  // Leaves of an earlier supervisor of this worker (crashed, or stopped with --on-shutdown
  // keep): their sandboxes' leases are watched by nobody now, so they do not run on.
  for (const auto& l : cgroups.sweep_leaves())
    log_event("event=stale_leaf_swept path=%s had_processes=%d result=%s", l.path.c_str(), l.had_processes ? 1 : 0,
              l.error == 0 ? "removed" : std::strerror(-l.error));

  if (cfg.bwrap) {
    bwrap.emplace();
    bwrap->args = default_bwrap_args();
    // The sandbox must see the shm table (read-only is enough) and keep the supervisor's stdio.
    // A memfd table reaches it as the inherited descriptor alone.
    if (!table->location().is_memfd) bwrap->args.insert(bwrap->args.end(), {"--ro-bind", shm_path, shm_path});
    if (std::string why = probe_bwrap(*bwrap); !why.empty()) return "--bwrap: " + why;
  }
  if (cfg.isolation) {
    if (cfg.bwrap)
      return "--bwrap and the isolated spawn are exclusive: add --isolation off to wrap sandboxes in bubblewrap";
    std::string err;
    seccomp = build_seccomp_filter(err);
    if (!seccomp) return "sandbox isolation: " + err;
    if (::geteuid() == 0) {
      std::string range_source;  // where a default range came from, for a refusal
      sandbox_uid_first = cfg.sandbox_uid_first;
      sandbox_uid_count = cfg.sandbox_uid_count;
      if (sandbox_uid_first == 0) {
        std::string subuid;
        const auto range = read_small_file("/etc/subuid", subuid) == 0 ? root_subuid_range(subuid) : std::nullopt;
        sandbox_uid_first = range ? range->first : kDefaultSandboxUidFirst;
        sandbox_uid_count = range ? range->second : kDefaultSandboxUidCount;
        range_source = range ? "root's range in /etc/subuid"
                             : "built in, as /etc/subuid has no range for root";
      }
      // No account's uid or group's gid: a sandbox would own that account's files and processes.
      if (std::string why = uid_range_account_conflict(sandbox_uid_first, sandbox_uid_count);
          !why.empty() && !ablated("uid-range-accounts"))
        return cfg.sandbox_uid_first != 0 ? "--uid-range: " + why
                                          : "the default sandbox uid range (" + range_source + "): " + why;
      if (sandbox_uid_count < cfg.slots)
        return "--uid-range " + std::to_string(sandbox_uid_first) + ":" + std::to_string(sandbox_uid_count) +
               " holds fewer uids than --slots " + std::to_string(cfg.slots) + " (one per slot)";
      // No other live supervisor on this host may run sandboxes as these uids.
      if (const Status why = uid_range_lock.claim(runtime_dir() + "/uid-ranges", sandbox_uid_first, sandbox_uid_count,
                                                  "pid " + std::to_string(::getpid()) + ", worker " + worker.str());
          !why.ok())
        return "--uid-range: " + why.message();
    }
    // What no sandbox may see: the key, the control socket, the host cgroup tree. The key by
    // its directory: a rotation renames a new key over the file, which detaches a cover on the
    // file itself in the sandbox's namespace (Linux 3.18+); a non-root supervisor's sandbox shares
    // its uid, so then it reads the new key. Covered, the directory hides every rename inside it.
    char real[PATH_MAX];
    const std::string key_path = ::realpath(cfg.key_file.c_str(), real) != nullptr ? std::string(real) : cfg.key_file;
    if (ablated("key-dir-cover")) {  // tests only: the file alone, as before
      hidden_paths.push_back(key_path);
    } else if (std::string why = cover_dir_problem(parent_dir(key_path), 0); why.empty()) {
      hidden_paths.push_back(parent_dir(key_path));
    } else if (::geteuid() != 0) {
      return "--key-file " + cfg.key_file + ": " + why +
             ". A sandbox of a non-root supervisor runs as its uid: only a cover over the key's directory hides the "
             "key after a rotation renames a new key into place; fix: keep the key alone in a directory of its own "
             "(mkdir -m 700 DIR, owned by uid " + std::to_string(::geteuid()) +
             ", in a path this user cannot rename) and pass --key-file DIR/NAME";
    } else {
      hidden_paths.push_back(key_path);  // root: DAC guards the 0600 key from the sandboxes' uids
    }
    hidden_paths.push_back("/sys/fs/cgroup");
    if (!cgroups.mount_point().empty()) hidden_paths.push_back(cgroups.mount_point());
    if (std::string why = probe_isolation(isolation_for(0, 0, 0), "true"); !why.empty())
      return "sandbox isolation is not available here: " + why +
             "; fix: allow user namespaces (sysctl user.max_user_namespaces > 0; on Debian/Ubuntu also "
             "kernel.unprivileged_userns_clone=1 or an AppArmor profile), or start with --isolation off "
             "(sandboxes can then escape the kill-switch)";
  }
  unsafe_kill = !cfg.isolation && cgroups.mode() != KillMode::cgroup_v2_delegated;
  dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  table_ro_fd = table->reopen_read_only();
  if (table_ro_fd < 0) return "shm table: cannot open " + shm_path + " read-only: " + std::strerror(-table_ro_fd);

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
  if (!rt_started) return "rt thread: " + rt_started.message();
  rt = std::move(rt_started).value();
  rt_text = rt_status.fifo ? "SCHED_FIFO priority " + std::to_string(rt_config.priority) : "SCHED_OTHER";
  if (rt_status.pinned) rt_text += ", pinned to CPU " + std::to_string(rt_config.cpu);
  rt_text += rt_status.memory_locked ? ", memory locked" : (sanitized_build() ? ", mlockall skipped (sanitizer build)" : "");
  rt_text += ", tick " + std::to_string(cfg.wheel_granularity_ns / 1000) + " us, command poll " +
             std::to_string(rt_config.command_poll_ns / 1000) + " us";
  if (std::string w = rt_status.warnings(rt_config); !w.empty()) {
    std::fputs(w.c_str(), stderr);
    while (!w.empty() && w.back() == '\n') w.pop_back();
    rt_text += " (" + w + ")";
  }
  sandboxes = SandboxTable(cfg.slots);
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
  hc.die_with_supervisor = cfg.on_shutdown == ShutdownPolicy::kill;
  hc.exec_at_once = arm_after_exec;
  hc.test_stall_ms = test_stall_after_spawn_ms;
  hc.log = [](const std::string& event) { log_event("%s", event.c_str()); };
  host = std::make_unique<OsSandboxHost>(std::move(hc), [this](const SandboxId& id) { on_pidfd(id); });
  hb = std::make_unique<HeartbeatSchedule>(cfg.kill_after_ms * 1'000'000ull,
                                           cfg.heartbeat_interval_ms * 1'000'000ull, cfg.slots,
                                           cfg.mode == SupervisorMode::preemptible);

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGHUP);
  signal_fd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd < 0) return std::string("signalfd: ") + std::strerror(errno);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::signal(SIGPIPE, SIG_IGN);

  control = std::make_unique<ControlServer>(
      ControlAccess{::geteuid(), gid},
      [this](ControlClientId c, ControlRequest r) { on_request(c, std::move(r)); });
  if (std::string err = control->open(control_path); !err.empty()) return err;
  if (cfg.isolation) {
    hidden_paths.push_back(control_path);
    // And its directory, where it is one of its own: a non-root supervisor's sandbox (its uid)
    // could otherwise move that directory, or one above it, aside and listen in its place.
    if (ablated("socket-dir-cover")) {  // tests only: the socket (and runtime directory) alone, as before
    } else if (std::string why = cover_dir_problem(parent_dir(control_path), gid ? 0050 : 0); why.empty()) {
      hidden_paths.push_back(parent_dir(control_path));
    } else if (::geteuid() != 0) {
      return "control socket " + control_path + ": " + why +
             ". A sandbox of a non-root supervisor runs as its uid and could put its own socket there; fix: use a "
             "socket directory of this user's alone, mode 0700, in a path it cannot rename (the default "
             "$XDG_RUNTIME_DIR/leasehold with XDG_RUNTIME_DIR=/run/user/" + std::to_string(::geteuid()) + ")";
    }
    // The runtime directory (worker locks, the default control socket): a sandbox of a non-root
    // supervisor runs as the same uid and could otherwise rename it and listen in its place.
    // Covered, it is a mount point in the sandbox's namespace, which rename(2) refuses.
    const std::string lock = worker_lock_path(worker);
    hidden_paths.push_back(lock.substr(0, lock.rfind('/')));
    hidden_paths.push_back(sandbox_log_dir);  // other sandboxes' output
  }

  RetryPolicy retry;
  retry.first_backoff_ns = std::max<std::int64_t>(
      5'000'000, static_cast<std::int64_t>(cfg.heartbeat_interval_ms) * 1'000'000 / 4);
  retry.backoff_max_ns = static_cast<std::int64_t>(cfg.heartbeat_interval_ms) * 1'000'000;
  auto opened = LockdLink::open(*loop, lockd_address, worker, *key, retry);
  // The key now lives only in the link's OpenSSL contexts: wipe our copy.
  OPENSSL_cleanse(key->bytes.data(), key->bytes.size());
  key.reset();
  if (!opened) return opened.message();
  link = std::move(opened).value();
  link->set_is_running_handler([this](const wire::IsRunning& q) { return is_running(q); });
  link->set_revoked_handler([this](const wire::Revoked& q) { return on_revoked(q); });
  link->set_late_answer_handler([this](const wire::Body& b) { on_late_answer(b); });

  loop->set_wake_handler([this] { on_rt_events(); });
  // lockd must answer now; a supervisor that cannot reach it would only refuse every create.
  // Its stats carry its mode and TTL: a preemptible supervisor on a lease-mode lockd would keep
  // sandboxes whose names expire there (two holders), and a lockd TTL below ours would let the
  // kill-switch fire after lockd's expiry (DESIGN.md "Time").
  auto ask = [&](const wire::Body& req, auto&& on_answer) -> std::string {
    bool answered = false;
    std::string problem;
    link->call(req, now_boottime_ns() + kStartupProbeTimeoutNs, [&](LockdReply r) {
      answered = true;
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
    for (const auto& c : st->counters) {
      if (c.key == "mode_preemptible") preemptible = c.value;
      if (c.key == "ttl_ms") ttl = c.value;
    }
    if (!preemptible || !ttl) return "lockd's stats do not report its mode and TTL (an older lockd?)";
    const bool want = cfg.mode == SupervisorMode::preemptible;
    if ((*preemptible != 0) != want)
      return std::string("lockd runs in ") + (*preemptible ? "preemptible" : "lease") + " mode, this supervisor in " +
             std::string(to_string(cfg.mode)) + " mode; start both with the same --mode";
    if (!want && *ttl < cfg.ttl_ms)
      return "lockd's lease TTL is " + std::to_string(*ttl) + " ms, below --ttl-ms " + std::to_string(cfg.ttl_ms) +
             ": the kill-switch could fire after lockd's expiry; give both the same --ttl-ms";
    lockd_ttl_ms = *ttl;
    return {};
  });
  if (problem.empty() && cfg.mode == SupervisorMode::preemptible)
    problem = ask(wire::WorkerHeartbeat{worker, {}}, [&](const wire::Body& b, std::int64_t sent_ns) -> std::string {
      const auto* w = std::get_if<wire::WorkerAck>(&b);
      if (w == nullptr) return "lockd answered a worker heartbeat with " + describe_answer(b);
      if (w->liveness_ttl_ms < cfg.ttl_ms)
        return "lockd's worker-liveness TTL is " + std::to_string(w->liveness_ttl_ms) + " ms, below --ttl-ms " +
               std::to_string(cfg.ttl_ms) + ": the kill-switch would fire after lockd may preempt; make them equal";
      hb->start_worker_liveness(static_cast<std::uint64_t>(sent_ns));  // lockd's clock starts later
      ++counters.worker_beats_acked;
      return {};
    });
  if (!problem.empty())
    return "lockd at " + lockd_address.str() + " is unreachable or refused us: " + problem;

  signal_poll = loop->add_poll(signal_fd, POLLIN, PollMode::multishot, [this](int) { on_signal(); });
  const std::int64_t interval_ns = static_cast<std::int64_t>(cfg.heartbeat_interval_ms) * 1'000'000;
  heartbeat_timer = loop->add_periodic(interval_ns, now_boottime_ns() + interval_ns,
                                       [this] { on_heartbeat_tick(); });
  housekeeping_timer = loop->add_periodic(100'000'000, now_boottime_ns() + 100'000'000, [this] {
    check_rt_lateness();
    control->tick(now_ns() / 1'000'000);
    sync_control_polls();
    reap_orphans();
    probe_pending_key();
    if (shutting_down) maybe_finish_shutdown();
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
  for (const auto& [id, s] : sandboxes)
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
  s += "  lockd            " + lockd_address.str() + "\n";
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
    case ControlOp::release:
      do_release(client, req);
      return;
    case ControlOp::kill:
      do_kill(client, req);
      return;
    case ControlOp::logs:
      do_logs(client, req);
      return;
    default:
      break;
  }
  if (shutting_down) {
    reply(client, control_error(req.id, ControlError::shutting_down, "the supervisor is shutting down; no new sandboxes"));
    return;
  }
  switch (req.op) {
    case ControlOp::run: do_run(client, std::move(req)); return;
    case ControlOp::name: do_name(client, std::move(req)); return;
    case ControlOp::expect_commit: do_expect_commit(client, std::move(req)); return;
    default: return;
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
  log_event("event=rt_late lateness_ms=%.3f kill_latency_budget_ms=%" PRIu64
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
  for (int attempt = 0; attempt < 8; ++attempt) {
    // 0600: flock needs only a read-only descriptor, so a file others may open lets anyone
    // hold the lock and keep this worker's supervisor from restarting (the restart is what
    // stops a crashed supervisor's leftover sandboxes).
    worker_lock_fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (worker_lock_fd < 0) return "cannot open the worker lock " + path + ": " + std::strerror(errno);
    (void)::fchmod(worker_lock_fd, 0600);  // one left by an older version may be 0644
    if (::flock(worker_lock_fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
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

std::string Supervisor::Impl::ttl_refusal(const std::optional<std::uint64_t>& ttl_ms) const {
  // Below our --ttl-ms the kill-switch would fire after lockd's expiry; above lockd's TTL lockd
  // would clamp the grant (and on_granted would give it back).
  if (!ttl_ms || (*ttl_ms >= cfg.ttl_ms && *ttl_ms <= lockd_ttl_ms)) return {};
  return "ttl_ms " + std::to_string(*ttl_ms) + " must be in [" + std::to_string(cfg.ttl_ms) + ", " +
         std::to_string(lockd_ttl_ms) + "]: at least this supervisor's --ttl-ms (the kill-switch is timed for it), " +
         "at most lockd's --ttl-ms (the longest lease it grants)";
}

bool Supervisor::Impl::gate_named_creation(ControlClientId client, const json& id) {
  if (cfg.mode != SupervisorMode::preemptible) return true;
  const std::uint64_t now = now_ns();
  for (const auto& a : hb->check_worker_liveness(now)) apply(a);
  if (hb->may_create_named(now)) return true;
  ++counters.creates_refused_killswitch;
  reply(client, control_error(id, ControlError::killswitch,
                              "worker liveness lapsed and the worker-wide kill-switch fired; named "
                              "sandboxes are refused until a worker heartbeat succeeds"));
  return false;
}

void Supervisor::Impl::do_run(ControlClientId client, ControlRequest req) {
  std::string err;
  if (!cfg.synthetic && !command_resolves(req, err)) {
    ++counters.spawn_failures;
    reply(client, control_error(req.id, ControlError::exec_failed, err));
    return;
  }
  if (req.name) {
    if (std::string why = ttl_refusal(req.ttl_ms); !why.empty()) {
      reply(client, control_error(req.id, ControlError::bad_request, why));
      return;
    }
    if (const SandboxId* holder = sandboxes.holder_of(*req.name)) {
      const Sandbox* s = find(*holder);
      reply(client, control_error(req.id, ControlError::held, "\"" + *req.name + "\" is held on this worker",
                                  {{"holder", holder->str()}, {"epoch", s ? s->epoch : 0}}));
      return;
    }
    if (refuse_unsafe_kill(client, req)) return;
    if (!gate_named_creation(client, req.id)) return;
  }
  const SandboxId id = random_sandbox_id();
  const shm::ClaimResult claim = table->claim(id, now_ns());
  if (claim.error != shm::TableErrc::ok) {
    reply(client, control_error(req.id, ControlError::table_full, table->claim_refusal().empty()
                                                          ? std::string(shm::to_string(claim.error))
                                                          : table->claim_refusal()));
    return;
  }
  Sandbox s;
  s.id = id;
  s.slot = claim.slot;
  s.synthetic = cfg.synthetic;
  s.owner = req.caller_uid;
  Sandbox& added = sandboxes.add(std::move(s));
  if (!req.name) {
    spawn(added, client, req);
    return;
  }
  sandboxes.bind_name(*req.name, id);
  acquire_name(id, client, std::move(req));
}

void Supervisor::Impl::acquire_name(const SandboxId& sb, ControlClientId client, ControlRequest req) {
  wire::Acquire a;
  a.name = *req.name;
  a.sandbox = sb;
  a.worker = worker;
  a.ttl_ms = static_cast<std::uint32_t>(req.ttl_ms.value_or(cfg.ttl_ms));
  a.two_phase = cfg.mode == SupervisorMode::preemptible;
  if (Sandbox* s = find(sb); s != nullptr && s->phase == SandboxPhase::reserved)
    advance(s->phase, SandboxPhase::acquiring);  // a run; naming a running sandbox keeps its phase
  link->call(a, now_boottime_ns() + kAcquireTimeoutNs, [this, sb, client, req](LockdReply r) mutable {
    if (!r.ok()) {
      abandon(sb, client, req.id, ControlError::unreachable, "acquire \"" + *req.name + "\": " + r.problem);
      return;
    }
    if (const auto* d = std::get_if<wire::Deny>(&*r.body)) {
      ++counters.acquire_refused;
      const ControlError code = d->refusal == Refusal::held || d->refusal == Refusal::acquiring ? ControlError::held : ControlError::refused;
      abandon(sb, client, req.id, code, "\"" + *req.name + "\" " + describe_answer(*r.body),
              {{"holder", d->holder.str()}, {"epoch", d->epoch}, {"reason", std::string(to_string(d->refusal))},
               {"worker", d->worker.str()}});
      return;
    }
    const auto* g = std::get_if<wire::Grant>(&*r.body);
    if (g == nullptr) {
      abandon(sb, client, req.id, ControlError::refused, "acquire \"" + *req.name + "\": " + describe_answer(*r.body));
      return;
    }
    if (cfg.mode == SupervisorMode::preemptible) {
      // The 2-phase acquire reserved the name (Acquiring: lockd preempts nothing in this state).
      // The sandbox starts before the Commit, so that whenever lockd has the name Held on this
      // worker, IsRunning finds the sandbox running (DESIGN.md "creation flows", preemptible.pml).
      if (g->state != LockPhase::acquiring || g->epoch == 0) {
        abandon(sb, client, req.id, ControlError::refused,
                "2-phase acquire \"" + *req.name + "\" answered with " + describe_answer(*r.body));
        return;
      }
      on_acquiring(sb, client, std::move(req), g->epoch, r.first_send_ns);
      return;
    }
    on_granted(sb, client, std::move(req), *g, r.first_send_ns);
  });
}

void Supervisor::Impl::on_granted(const SandboxId& sb, ControlClientId client, ControlRequest req,
                                  const wire::Grant& g, std::int64_t send_ns) {
  Sandbox* s = find(sb);
  const std::string name = *req.name;
  const NameId name_id = name_id_of(name);
  if (s == nullptr) {  // gone meanwhile (shutdown, killed before naming): give the name back
    release_to_lockd(name_id, name, sb, g.epoch, [](bool, std::string) {});
    reply(client, control_error(req.id, ControlError::internal, "the sandbox went away while acquiring"));
    return;
  }
  auto give_back = [&](ControlError code, const std::string& msg) {
    give_back_name(*s, client, req, g.epoch, code, msg);
  };
  const std::uint64_t now = now_ns();
  // The lease is measured from `lease_send_ns`: the send time of the request lockd answered,
  // moved earlier by whatever the grant's time left falls short of --ttl-ms (see below).
  std::uint64_t lease_send_ns = lease_measured_from_ns(static_cast<std::uint64_t>(send_ns), now);
  std::uint64_t valid_until = lease_send_ns + cfg.kill_after_ms * 1'000'000ull;
  if (cfg.mode == SupervisorMode::lease) {
    // lockd answered no earlier than `send_ns`, with `g.ttl_ms` left, so its expiry is at least
    // send_ns + g.ttl_ms. A fresh grant has the full TTL; an idempotent answer to a retry (the
    // first answer was lost, lockd restarted meanwhile) has less. Either way the kill-switch
    // keeps the margin the start-up check proved for --ttl-ms (ttl - kill_after) if the lease
    // counts from send_ns - shortfall, shortfall = --ttl-ms - g.ttl_ms: lockd's expiry is then
    // >= (send_ns - shortfall) + --ttl-ms, exactly a full grant's bound for that send time.
    const std::uint64_t ttl_ns = cfg.ttl_ms * 1'000'000ull;
    const std::uint64_t left_ns = std::uint64_t{g.ttl_ms} * 1'000'000ull;
    const std::uint64_t shortfall_ns = left_ns < ttl_ns ? ttl_ns - left_ns : 0;
    if (shortfall_ns > 0) {
      if (shortfall_ns >= valid_until || valid_until - shortfall_ns <= now) {
        give_back(ControlError::unreachable,
                  "lockd's grant of \"" + name + "\" arrived " +
                      std::to_string((now - static_cast<std::uint64_t>(send_ns)) / 1'000'000) +
                      " ms after the request was first sent with " + std::to_string(g.ttl_ms) +
                      " ms of its lease left (an answer to a retry: lockd restarted or lost its first answer); "
                      "counted from that send, the kill-switch could not fire before lockd's expiry, so the "
                      "name was given back; retry");
        return;
      }
      lease_send_ns = lease_measured_from_ns(static_cast<std::uint64_t>(send_ns), now) - shortfall_ns;
      valid_until = lease_send_ns + cfg.kill_after_ms * 1'000'000ull;
      log_event("event=short_grant name=%s sandbox=%s epoch=%" PRIu64 " ttl_left_ms=%u ttl_ms=%" PRIu64
                " valid_until_ns=%" PRIu64,
                name.c_str(), sb.str().c_str(), g.epoch, g.ttl_ms, cfg.ttl_ms, valid_until);
    }
  }
  if (now >= valid_until) {
    give_back(ControlError::unreachable, "the grant of \"" + name + "\" arrived after its lease would already have lapsed");
    return;
  }
  if (!hb->add(name_id, sb, g.epoch, s->slot, lease_send_ns)) {
    give_back(ControlError::internal, "heartbeat schedule refused the lease");
    return;
  }
  s->name_id = name_id;
  s->epoch = g.epoch;
  s->token = g.token;
  s->valid_until_ns = valid_until;
  if (before_spawn(s->phase)) {
    s->name = name;
    spawn(*s, client, req);
    return;
  }
  // Naming a running unnamed sandbox.
  if (!runs_unkilled(s->phase)) {
    hb->remove(sb);
    give_back(ControlError::not_found, "the sandbox stopped while its name was being acquired");
    return;
  }
  const shm::TableErrc pe = publish_grant(*s, name_id, name, g.epoch, valid_until, s->token);
  if (pe != shm::TableErrc::ok) {
    hb->remove(sb);
    give_back(ControlError::internal, "publishing the slot failed: " + std::string(shm::to_string(pe)));
    return;
  }
  s->name = name;
  if (!rt->arm(s->slot, valid_until, host->kill_target(sb))) {
    // The rt thread cannot take it: an unwatched named sandbox must not run.
    kill_sandbox(*s, "rt command queue full while naming");
  }
  log_event("event=named sandbox=%s slot=%u name=%s epoch=%" PRIu64, sb.str().c_str(), s->slot,
            name.c_str(), g.epoch);
  reply(client, control_ok(req.id, {{"sandbox", sb.str()}, {"slot", s->slot}, {"name", name},
                                    {"epoch", g.epoch}, {"pid", s->pid},
                                    {"valid_until_ms", static_cast<std::int64_t>(valid_until - now) / 1'000'000}}));
}

void Supervisor::Impl::give_back_name(Sandbox& s, ControlClientId client, const ControlRequest& req, Epoch epoch,
                                      ControlError code, const std::string& message) {
  const std::string name = *req.name;
  release_to_lockd(name_id_of(name), name, s.id, epoch, [](bool, std::string) {});
  if (before_spawn(s.phase)) {
    abandon(s.id, client, req.id, code, message);
    return;
  }
  // Naming a running sandbox failed: it stays unnamed.
  sandboxes.unbind_name(name, s.id);
  reply(client, control_error(req.id, code, message));
}

void Supervisor::Impl::abandon(const SandboxId& sb, ControlClientId client, const json& id,
                               ControlError code, const std::string& message, json extra) {
  Sandbox* s = find(sb);
  const bool forget = s != nullptr && before_spawn(s->phase);
  // The name it was getting; a running sandbox keeps a name it already has.
  if (s != nullptr && !forget) sandboxes.unbind_names_except(sb, s->name);
  if (forget) {
    host->forget(sb);  // a token channel opened for it
    table->free(s->slot, now_ns());
    sandboxes.erase(sb);  // its slot and names with it
  }
  reply(client, control_error(id, code, message, std::move(extra)));
  if (shutting_down) maybe_finish_shutdown();
}

void Supervisor::Impl::on_late_answer(const wire::Body& answer) {
  // lockd granted (or committed) after the call gave up, e.g. it was paused with the request in
  // its socket queue. Unless a sandbox here holds exactly this grant or is still acquiring that
  // name, nobody will heartbeat it: give it back now rather than leave the name held (and a
  // create refused) for a whole TTL.
  const auto* g = std::get_if<wire::Grant>(&answer);
  if (g == nullptr) return;
  if (const Sandbox* s = find(g->holder); s != nullptr) {
    if (s->name && s->name_id == g->name_id) return;
    for (const auto& [name, holder] : sandboxes.names())
      if (holder == g->holder && name_id_of(name) == g->name_id) return;
  }
  ++counters.late_grants_released;
  log_event("event=late_grant name_id=%s sandbox=%s epoch=%" PRIu64 " action=release", g->name_id.str().c_str(),
            g->holder.str().c_str(), g->epoch);
  release_to_lockd(g->name_id, g->name_id.str(), g->holder, g->epoch, [](bool, std::string) {});
}

void Supervisor::Impl::spawn(Sandbox& s, ControlClientId client, const ControlRequest& req) {
  const SandboxId id = s.id;
  const std::uint64_t now = now_ns();
  auto fail = [&](const PortError& e) {
    ++counters.spawn_failures;
    rt->set_deadline(s.slot, 0);
    if (s.name || s.pending_name) {  // its lease, or the Acquiring record its Commit was for
      hb->remove(id);
      release_to_lockd(s.name_id, s.name ? *s.name : *s.pending_name, id, s.epoch, [](bool, std::string) {});
    }
    log_event("event=spawn_failed sandbox=%s name=%s error=\"%s\"", id.str().c_str(),
              s.name ? s.name->c_str() : "-", e.message.c_str());
    abandon(id, client, req.id, e.code, e.message);
  };

  // Publish first: from here on the sandbox's own checks see its lease (and its end). A sandbox
  // whose Commit is still to be sent starts unpublished (its checks say "not valid") but under
  // the worker's kill deadline; on_committed publishes it.
  // Its own token channel first: the publish below writes its grant's token into it.
  if (!s.synthetic)
    if (auto e = host->open_tokens(id)) return fail(*e);
  if (s.name) {
    const shm::TableErrc pe = publish_grant(s, s.name_id, *s.name, s.epoch, s.valid_until_ns, s.token);
    if (pe != shm::TableErrc::ok)
      return fail({ControlError::internal, "publishing the slot failed: " + std::string(shm::to_string(pe))});
  }
  const bool watched = s.name || s.pending_name;
  const std::uint64_t deadline_ns = watched ? s.valid_until_ns : kNoDeadlineNs;

  if (s.synthetic) {
    // Performance mode: a lease without a process. The rt thread still arms and "kills" it
    // (the revoke happens; there is nothing to signal).
    if (!rt->arm(s.slot, deadline_ns, KillTarget{}))
      return fail({ControlError::busy, "the rt thread's command queue is full; retry"});
    s.armed = true;
    advance(s.phase, s.pending_name ? SandboxPhase::committing : SandboxPhase::running);
    s.started_ns = now;
    ++counters.spawned;
    if (s.pending_name) return send_commit(id, client, req, s.epoch);
    json ok = {{"sandbox", id.str()}, {"slot", s.slot}, {"epoch", s.epoch}, {"pid", -1}, {"synthetic", true}};
    if (s.name) ok["name"] = *s.name;
    reply(client, control_ok(req.id, ok));
    return;
  }

  SandboxSpec spec;
  spec.id = id;
  spec.slot = s.slot;
  spec.epoch = s.epoch;
  spec.name = s.name;
  spec.argv = req.argv;
  spec.env = req.env;
  spec.cwd = req.cwd;  // "/" unless the request names one
  spec.caller_uid = req.caller_uid;
  spec.caller_gid = req.caller_gid;
  HostedSandbox hosted;
  // The child stops at its gate, right before its exec: its deadline is armed before the
  // command's first instruction. Ablated (arm-after-exec), it execs at once and is armed afterwards.
  if (auto e = host->create(spec, hosted)) return fail(*e);
  s.log_path = hosted.log_path;
  s.cgroup_path = hosted.cgroup_path;
  advance(s.phase, SandboxPhase::gated);
  s.pid = hosted.pid;
  s.uid = hosted.uid;
  s.started_ns = now;
  // Armed while the child cannot exec yet (it sets itself up, then waits at its gate; its pidfd,
  // process group and leaf are the kill target already): from here the rt thread kills it at its
  // deadline whatever the io thread does, and before its command's first instruction if that
  // deadline comes first. A named sandbox whose deadline already passed is due at the next tick.
  std::optional<PortError> start_error;
  s.armed = static_cast<bool>(rt->arm(s.slot, deadline_ns, host->kill_target(id)));
  if (!s.armed) start_error = PortError{ControlError::busy, "the rt thread's command queue is full; the sandbox was stopped"};
  // Let go to exec unless its deadline passed meanwhile (a stalled io thread, a slow set-up):
  // then the rt thread kills it (or has), and it must not exec now.
  if (!start_error) start_error = host->release(id, watched ? s.valid_until_ns : 0);
  if (start_error) {
    // It does not run its command: the gate closes (the child exits without exec) and, unarmed,
    // it is killed from here. Its exit (the host's exit event) disarms, reaps, frees the slot,
    // removes the leaf, gives back the name and answers the client with the error.
    host->abandon(id);
    if (!s.armed) host->kill(id, now_ns());
    advance(s.phase, SandboxPhase::aborted);
    ++counters.spawn_failures;
    log_event("event=spawn_failed sandbox=%s name=%s error=\"%s\"", id.str().c_str(),
              s.name ? s.name->c_str() : s.pending_name.value_or("-").c_str(), start_error->message.c_str());
    s.waiter_error = start_error->code;
    s.waiter_message = start_error->message;
    s.waiters.emplace_back(client, req.id);
    return;  // answered when it is gone
  }
  advance(s.phase, s.pending_name ? SandboxPhase::committing : SandboxPhase::running);
  ++counters.spawned;
  log_event("event=started sandbox=%s slot=%u pid=%d name=%s epoch=%" PRIu64 " valid_until_ns=%" PRIu64 "%s",
            id.str().c_str(), s.slot, s.pid, s.name ? s.name->c_str() : s.pending_name.value_or("-").c_str(),
            s.epoch, s.valid_until_ns, s.pending_name ? " commit=pending" : "");
  if (s.pending_name) return send_commit(id, client, req, s.epoch);
  json ok = {{"sandbox", id.str()}, {"slot", s.slot}, {"epoch", s.epoch}, {"pid", s.pid}};
  if (s.name) {
    ok["name"] = *s.name;
    ok["valid_until_ms"] = (static_cast<std::int64_t>(s.valid_until_ns) - static_cast<std::int64_t>(now_ns())) / 1'000'000;
  }
  if (!s.cgroup_path.empty()) ok["cgroup"] = s.cgroup_path;
  ok["uid"] = s.uid;
  ok["log"] = s.log_path;
  ok["isolation"] = cfg.isolation;
  if (unsafe_kill) ok["unsafe_kill"] = true;
  reply(client, control_ok(req.id, ok));
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

bool Supervisor::Impl::refuse_unsafe_kill(ControlClientId client, const ControlRequest& req) {
  if (!unsafe_kill || cfg.allow_unsafe_kill) return false;
  reply(client, control_error(req.id, ControlError::refused,
                              "no unescapable kill on this worker: no delegated cgroup v2 (" + cgroups.reason() +
                                  ") and no pid namespace (isolation off), so a named sandbox's descendants could "
                                  "outlive its kill-switch and hold \"" + req.name.value_or("") +
                                  "\" twice; fix: start the supervisor with isolation on (the default) or with a "
                                  "delegated cgroup v2 subtree; --allow-unsafe-kill overrides"));
  return true;
}

bool Supervisor::Impl::may_act_on(ControlClientId client, const ControlRequest& req, const Sandbox& s) {
  return may_act_on(client, req, s.owner, s.id);
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
  exited_logs.push_back({s.id, s.name ? s.name : s.pending_name, s.owner, s.log_path});
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
  } else if (const SandboxId* holder = sandboxes.holder_of(*req.name)) {
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

void Supervisor::Impl::do_name(ControlClientId client, ControlRequest req) {
  Sandbox* s = find(*req.sandbox);
  if (s == nullptr || !runs_unkilled(s->phase)) {
    reply(client, control_error(req.id, ControlError::not_found, "no running sandbox " + req.sandbox->str()));
    return;
  }
  if (!may_act_on(client, req, *s)) return;
  if (s->name || s->epoch != 0) {
    // A well-formed request this sandbox's state refuses (a usage error would be "bad_request").
    reply(client, control_error(req.id, ControlError::refused, "sandbox " + req.sandbox->str() + " already has the name \"" +
                                                       s->name.value_or(s->pending_name.value_or("?")) + "\""));
    return;
  }
  if (std::string why = ttl_refusal(req.ttl_ms); !why.empty()) {
    reply(client, control_error(req.id, ControlError::bad_request, why));
    return;
  }
  if (const SandboxId* holder = sandboxes.holder_of(*req.name)) {
    const Sandbox* h = find(*holder);
    reply(client, control_error(req.id, ControlError::held, "\"" + *req.name + "\" is held on this worker",
                                {{"holder", holder->str()}, {"epoch", h ? h->epoch : 0}}));
    return;
  }
  if (!gate_named_creation(client, req.id)) return;
  sandboxes.bind_name(*req.name, s->id);
  acquire_name(s->id, client, std::move(req));
}

void Supervisor::Impl::do_expect_commit(ControlClientId client, ControlRequest req) {
  if (find(*req.sandbox) != nullptr) {
    reply(client, control_error(req.id, ControlError::refused, "sandbox " + req.sandbox->str() + " already exists here"));
    return;
  }
  if (const SandboxId* holder = sandboxes.holder_of(*req.name)) {
    reply(client, control_error(req.id, ControlError::held, "\"" + *req.name + "\" is held on this worker",
                                {{"holder", holder->str()}}));
    return;
  }
  std::string err;
  if (!cfg.synthetic && !command_resolves(req, err)) {
    reply(client, control_error(req.id, ControlError::exec_failed, err));
    return;
  }
  if (pending_commits.size() >= kPendingCommitsMax) {
    reply(client, control_error(req.id, ControlError::busy, "too many commits waiting for the next heartbeat"));
    return;
  }
  if (refuse_unsafe_kill(client, req)) return;
  if (!gate_named_creation(client, req.id)) return;
  const shm::ClaimResult claim = table->claim(*req.sandbox, now_ns());
  if (claim.error != shm::TableErrc::ok) {
    reply(client, control_error(req.id, ControlError::table_full, table->claim_refusal()));
    return;
  }
  Sandbox s;
  s.id = *req.sandbox;
  s.slot = claim.slot;
  s.synthetic = cfg.synthetic;
  s.owner = req.caller_uid;
  const SandboxId id = s.id;
  sandboxes.add(std::move(s));
  sandboxes.bind_name(*req.name, id);
  // Committed by this worker's next heartbeat tick (DESIGN.md "creation flows", 2-phase).
  pending_commits.push_back(PendingCommit{client, std::move(req)});
}

void Supervisor::Impl::commit_now(const PendingCommit& pc) {
  ControlRequest req = pc.request;
  const SandboxId sb = *req.sandbox;
  if (find(sb) == nullptr) return;
  const ControlClientId client = pc.client;
  if (cfg.mode == SupervisorMode::preemptible) {
    // The control plane's 2-phase acquire left the name Acquiring for this sandbox: start it
    // (unpublished), then commit it to this worker, as for a run.
    on_acquiring(sb, client, req, req.epoch, now_boottime_ns());
    return;
  }
  // Lease mode: the committed lease has a TTL from the commit on; it is heartbeated and the
  // sandbox starts once it is granted, as for an acquire.
  wire::Commit c;
  c.name_id = name_id_of(*req.name);
  c.sandbox = sb;
  c.epoch = req.epoch;
  c.worker = worker;
  advance(find(sb)->phase, SandboxPhase::acquiring);
  link->call(c, now_boottime_ns() + kAcquireTimeoutNs, [this, sb, client, req](LockdReply r) mutable {
    if (!r.ok()) {
      abandon(sb, client, req.id, ControlError::unreachable, "commit \"" + *req.name + "\": " + r.problem);
      return;
    }
    if (const auto* d = std::get_if<wire::Deny>(&*r.body)) {
      abandon(sb, client, req.id, ControlError::refused, "commit \"" + *req.name + "\" " + describe_answer(*r.body),
              {{"holder", d->holder.str()}, {"epoch", d->epoch}, {"reason", std::string(to_string(d->refusal))}});
      return;
    }
    const auto* g = std::get_if<wire::Grant>(&*r.body);
    if (g == nullptr || g->state != LockPhase::held || g->epoch != req.epoch) {
      abandon(sb, client, req.id, ControlError::refused, "commit \"" + *req.name + "\": " + describe_answer(*r.body));
      return;
    }
    req.ttl_ms = std::nullopt;
    on_granted(sb, client, std::move(req), *g, r.first_send_ns);
  });
}

void Supervisor::Impl::on_acquiring(const SandboxId& sb, ControlClientId client, ControlRequest req, Epoch epoch,
                                    std::int64_t acquire_send_ns) {
  Sandbox* s = find(sb);
  const std::string name = *req.name;
  const NameId name_id = name_id_of(name);
  if (s == nullptr) {  // gone meanwhile: abort the acquisition
    release_to_lockd(name_id, name, sb, epoch, [](bool, std::string) {});
    reply(client, control_error(req.id, ControlError::internal, "the sandbox went away while acquiring"));
    return;
  }
  auto give_back = [&](ControlError code, const std::string& msg) {
    give_back_name(*s, client, req, epoch, code, msg);  // also aborts the Acquiring record
  };
  // Kill-switch synchronisation: checked here, right before the sandbox starts, on the io
  // thread that also engages the kill-switch, so the two cannot interleave.
  const std::uint64_t now = now_ns();
  for (const auto& a : hb->check_worker_liveness(now)) apply(a);
  if (!hb->may_create_named(now)) {
    ++counters.creates_refused_killswitch;
    give_back(ControlError::killswitch, "worker liveness lapsed while acquiring \"" + name +
                                "\"; named sandboxes are refused until a worker heartbeat succeeds");
    return;
  }
  const std::uint64_t valid_until = hb->worker_valid_until_ns();
  if (now >= valid_until) {
    give_back(ControlError::unreachable, "the grant of \"" + name + "\" arrived after worker liveness would already have lapsed");
    return;
  }
  if (!before_spawn(s->phase) && !runs_unkilled(s->phase)) {
    give_back(ControlError::not_found, "the sandbox stopped while its name was being acquired");
    return;
  }
  if (!hb->add(name_id, sb, epoch, s->slot, lease_measured_from_ns(static_cast<std::uint64_t>(acquire_send_ns), now))) {
    give_back(ControlError::internal, "heartbeat schedule refused the lease");
    return;
  }
  // Kept by worker liveness from now on (the worker-wide kill-switch covers it), but not carried
  // by worker beats until lockd has it Held on this worker.
  hb->mark_worker_refreshed(sb);
  hb->set_commit_pending(sb, true);
  s->name_id = name_id;
  s->epoch = epoch;
  s->valid_until_ns = valid_until;
  s->pending_name = name;
  if (before_spawn(s->phase)) {
#if LEASEHOLD_SIM_ABLATE_COMMIT_BEFORE_SPAWN
    // Simulator ablation, bug class "commit before spawn" (the order a review found in the code
    // earlier): the Commit goes out straight after the Acquiring grant and the sandbox starts
    // only on the Held answer, so lockd has the name Held here while IsRunning says "not running"
    // and may preempt it; the sandbox then starts anyway (two holders). on_committed spawns.
    send_commit(sb, client, std::move(req), epoch);
    return;
#endif
    spawn(*s, client, req);  // sends the Commit once the sandbox runs
    return;
  }
  advance(s->phase, SandboxPhase::committing);  // naming a running sandbox
  send_commit(sb, client, std::move(req), epoch);
}

void Supervisor::Impl::send_commit(const SandboxId& sb, ControlClientId client, ControlRequest req, Epoch epoch) {
  wire::Commit c;
  c.name_id = name_id_of(*req.name);
  c.sandbox = sb;
  c.epoch = epoch;
  c.worker = worker;
  link->call(c, now_boottime_ns() + kAcquireTimeoutNs, [this, sb, client, req, epoch](LockdReply r) {
    if (!r.ok()) {
      commit_failed(sb, client, req, epoch, ControlError::unreachable, "commit \"" + *req.name + "\": " + r.problem);
      return;
    }
    if (const auto* d = std::get_if<wire::Deny>(&*r.body)) {
      commit_failed(sb, client, req, epoch, ControlError::refused, "commit \"" + *req.name + "\" " + describe_answer(*r.body),
                    {{"holder", d->holder.str()}, {"epoch", d->epoch}, {"reason", std::string(to_string(d->refusal))}});
      return;
    }
    const auto* g = std::get_if<wire::Grant>(&*r.body);
    if (g == nullptr || g->state != LockPhase::held || g->epoch != epoch || g->holder != sb) {
      commit_failed(sb, client, req, epoch, ControlError::refused, "commit \"" + *req.name + "\": " + describe_answer(*r.body));
      return;
    }
    on_committed(sb, client, req, *g);
  });
}

void Supervisor::Impl::commit_failed(const SandboxId& sb, ControlClientId client, const ControlRequest& req,
                                     Epoch epoch, ControlError code, const std::string& message, json extra) {
  const std::string name = *req.name;
  Sandbox* s = find(sb);
  // Abort the Acquiring record, or give back a commit whose answer never came.
  release_to_lockd(name_id_of(name), name, sb, epoch, [](bool, std::string) {});
  if (s == nullptr || !s->pending_name || s->epoch != epoch) {
    reply(client, control_error(req.id, code, message, std::move(extra)));
    return;
  }
  hb->remove(sb);
  s->pending_name.reset();
#if LEASEHOLD_SIM_ABLATE_COMMIT_BEFORE_SPAWN
  if (before_spawn(s->phase)) {  // the ablated order: nothing was started for it
    abandon(sb, client, req.id, code, message, std::move(extra));
    return;
  }
#endif
  if (s->phase == SandboxPhase::committing) advance(s->phase, SandboxPhase::running);
  sandboxes.unbind_name(name, sb);
  if (req.op == ControlOp::name) {  // it ran before and runs on, unnamed
    s->name_id = NameId{};
    s->epoch = 0;
    s->token.clear();
    host->clear_tokens(sb);
    reply(client, control_error(req.id, code, message, std::move(extra)));
    return;
  }
  // Started for this name: it never saw its epoch published; stop it, answer when it is gone.
  s->waiter_error = code;
  s->waiter_message = message;
  s->waiters.emplace_back(client, req.id);
  kill_sandbox(*s, "commit failed: " + message);
}

void Supervisor::Impl::on_committed(const SandboxId& sb, ControlClientId client, const ControlRequest& req,
                                    const wire::Grant& g) {
  const std::string name = *req.name;
  const NameId name_id = name_id_of(name);
  Sandbox* s = find(sb);
  if (s == nullptr || !s->pending_name || s->epoch != g.epoch) {
    // It exited (or was killed) meanwhile; its exit gave back the pending name, and this
    // release covers the commit that landed after that.
    release_to_lockd(name_id, name, sb, g.epoch, [](bool, std::string) {});
    reply(client, control_error(req.id, ControlError::not_found, "the sandbox stopped before its commit of \"" + name +
                                                         "\" was acknowledged"));
    return;
  }
  s->pending_name.reset();
  s->token = g.token;
  hb->set_commit_pending(sb, false);
  if (kill_asked_or_gone(s->phase)) {
    // Being killed (kill-switch, shutdown): it never runs with this name.
    hb->remove(sb);
    release_to_lockd(name_id, name, sb, g.epoch, [](bool, std::string) {});
    sandboxes.unbind_name(name, sb);
    if (req.op == ControlOp::name) reply(client, control_error(req.id, ControlError::not_found, "the sandbox stopped while being named"));
    else s->waiters.emplace_back(client, req.id);
    return;
  }
#if LEASEHOLD_SIM_ABLATE_COMMIT_BEFORE_SPAWN
  if (before_spawn(s->phase)) {  // the ablated order: start it only now that lockd has it Held
    const HeartbeatLease* held = hb->find(sb);
    s->name = name;
    s->valid_until_ns = held != nullptr ? held->valid_until_ns : 0;
    spawn(*s, client, req);  // publishes the grant, arms, releases, answers
    return;
  }
#endif
  advance(s->phase, SandboxPhase::running);
  const HeartbeatLease* l = hb->find(sb);
  const std::uint64_t valid_until = l != nullptr ? l->valid_until_ns : 0;
  const std::uint64_t now = now_ns();
  const shm::TableErrc pe = l == nullptr || valid_until <= now
                                ? shm::TableErrc::revoked
                                : publish_grant(*s, name_id, name, g.epoch, valid_until, s->token);
  if (pe != shm::TableErrc::ok) {
    commit_failed(sb, client, req, g.epoch, ControlError::internal,
                  "publishing \"" + name + "\" failed: " + std::string(shm::to_string(pe)));
    return;
  }
  s->name = name;
  s->valid_until_ns = valid_until;
  if (req.op != ControlOp::name) rt->set_deadline(s->slot, valid_until);  // armed at its start
  else if (!rt->arm(s->slot, valid_until, host->kill_target(sb)))
    kill_sandbox(*s, "rt command queue full while naming");  // an unwatched named sandbox must not run
  log_event("event=committed sandbox=%s slot=%u name=%s epoch=%" PRIu64 " valid_until_ns=%" PRIu64, sb.str().c_str(),
            s->slot, name.c_str(), g.epoch, valid_until);
  json ok = {{"sandbox", sb.str()}, {"slot", s->slot}, {"name", name}, {"epoch", g.epoch}, {"pid", s->pid},
             {"valid_until_ms", static_cast<std::int64_t>(valid_until - now) / 1'000'000}};
  if (s->synthetic) ok["synthetic"] = true;
  if (!s->cgroup_path.empty()) ok["cgroup"] = s->cgroup_path;
  reply(client, control_ok(req.id, ok));
}

void Supervisor::Impl::do_release(ControlClientId client, const ControlRequest& req) {
  const SandboxId* holder = sandboxes.holder_of(*req.name);
  Sandbox* s = holder == nullptr ? nullptr : find(*holder);
  if (s == nullptr || !s->name) {
    reply(client, control_error(req.id, ControlError::not_found, "no sandbox on this worker holds \"" + *req.name + "\""));
    return;
  }
  if (!may_act_on(client, req, *s)) return;
  s->waiters.emplace_back(client, req.id);
  kill_sandbox(*s, "released");
}

void Supervisor::Impl::do_kill(ControlClientId client, const ControlRequest& req) {
  Sandbox* s = find(*req.sandbox);
  if (s == nullptr || never_started(s->phase)) {
    reply(client, control_error(req.id, ControlError::not_found, "no running sandbox " + req.sandbox->str()));
    return;
  }
  if (!may_act_on(client, req, *s)) return;
  s->waiters.emplace_back(client, req.id);
  kill_sandbox(*s, "killed on request");
}

json Supervisor::Impl::list_json(uid_t caller) const {
  json arr = json::array();
  const std::uint64_t now = now_ns();
  for (const auto& [id, s] : sandboxes) {
    if (caller != 0 && caller != s.owner) continue;  // a caller sees its own sandboxes only (root: all)
    json j = {{"sandbox", id.str()}, {"slot", s.slot}, {"pid", s.pid}, {"state", phase_row(s.phase).list_state},
              {"epoch", s.epoch}};
    j["name"] = s.name ? json(*s.name) : json(nullptr);
    if (s.pending_name) j["committing"] = *s.pending_name;
    if (s.name) {
      const HeartbeatLease* l = hb->find(id);
      const std::uint64_t vu = l ? l->valid_until_ns : s.valid_until_ns;
      j["valid_until_ms"] = (static_cast<std::int64_t>(vu) - static_cast<std::int64_t>(now)) / 1'000'000;
    }
    if (!s.kill_reason.empty()) j["kill_reason"] = s.kill_reason;
    if (s.synthetic) j["synthetic"] = true;
    j["owner"] = s.owner;
    if (s.uid != static_cast<uid_t>(-1)) j["uid"] = s.uid;
    if (!s.log_path.empty()) j["log"] = s.log_path;
    if (unsafe_kill) j["unsafe_kill"] = true;
    arr.push_back(std::move(j));
  }
  return arr;
}

json Supervisor::Impl::status_json() const {
  const RtCounters rc = rt->counters();
  const std::uint64_t now = now_ns();
  std::size_t named = 0;
  for (const auto& [id, s] : sandboxes) named += s.name ? 1 : 0;
  json j = {
      {"worker", worker.str()},
      {"key_id", link->key_id()},
      {"pending_key_id", link->pending_key_id()},
      {"pid", ::getpid()},
      {"mode", std::string(to_string(cfg.mode))},
      {"lockd", lockd_address.str()},
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
      {"sandboxes", sandboxes.size()},
      {"named", named},
      {"shutting_down", shutting_down},
      {"synthetic", cfg.synthetic},
      {"isolation", cfg.isolation},
      {"isolation_text", isolation_text()},
      {"unsafe_kill", unsafe_kill},
      {"allow_unsafe_kill", cfg.allow_unsafe_kill},
      {"may_create_named", hb->may_create_named(now)},
      {"killswitch_engaged", hb->killswitch_engaged()},
      {"counters",
       {{"heartbeat_datagrams", counters.heartbeat_datagrams},
        {"heartbeat_failures", counters.heartbeat_failures},
        {"refreshed", counters.refreshed},
        {"lost", counters.lost},
        {"unknown", counters.unknown},
        {"kills_deadline", counters.kills_deadline},
        {"kills_request", counters.kills_request},
        {"worker_killswitch", counters.worker_killswitch},
        {"spawned", counters.spawned},
        {"spawn_failures", counters.spawn_failures},
        {"exited", counters.exited},
        {"acquire_refused", counters.acquire_refused},
        {"creates_refused_killswitch", counters.creates_refused_killswitch},
        {"names_released", counters.names_released},
        {"late_grants_released", counters.late_grants_released},
        {"rt_late_over_budget", rt_late_events},
        {"rt_kill_records_dropped", rt->kill_events_dropped()},
        {"orphans_reaped", counters.orphans_reaped},
        {"key_reloads", counters.key_reloads},
        {"key_reloads_refused", counters.key_reloads_refused},
        {"key_not_accepted", counters.key_not_accepted},
        {"sandbox_output_discarded_bytes", output_pump.discarded_bytes()},
        {"log_lines_dropped", stderr_log().dropped()},
        {"worker_beats_acked", counters.worker_beats_acked},
        {"control_bad_requests", control->bad_requests()},
        {"control_unauthorized", control->rejected_unauthorized()},
        {"lockd_answers_bad", link->stats().answers_bad},
        {"lockd_retries", link->client_stats().retries},
        {"is_running_answered", link->stats().is_running_answered}}}};
  if (cfg.mode == SupervisorMode::preemptible)
    j["worker_valid_until_ms"] =
        (static_cast<std::int64_t>(hb->worker_valid_until_ns()) - static_cast<std::int64_t>(now)) / 1'000'000;
  return j;
}

void Supervisor::Impl::release_to_lockd(const NameId& name_id, const std::string& name,
                                        const SandboxId& sb, Epoch epoch,
                                        std::function<void(bool, std::string)> done) {
  wire::Release rel;
  rel.name_id = name_id;
  rel.sandbox = sb;
  rel.epoch = epoch;
  ++releases_in_flight;
  link->call(rel, now_boottime_ns() + kReleaseTimeoutNs, [this, name, sb, epoch, done](LockdReply r) {
    --releases_in_flight;
    bool ok = false;
    std::string text;
    if (!r.ok()) {
      text = r.problem;
    } else {
      ok = std::holds_alternative<wire::Ok>(*r.body);
      text = describe_answer(*r.body);
    }
    if (ok) ++counters.names_released;
    log_event("event=released name=%s sandbox=%s epoch=%" PRIu64 " result=\"%s\"", name.c_str(),
              sb.str().c_str(), epoch, text.c_str());
    done(ok, text);
    if (shutting_down) maybe_finish_shutdown();
  });
}

// =============================================================================================
// lifecycle

void Supervisor::Impl::kill_sandbox(Sandbox& s, const std::string& reason) {
  if (kill_asked_or_gone(s.phase)) return;
  advance(s.phase, s.phase == SandboxPhase::aborted ? SandboxPhase::aborting : SandboxPhase::killing);
  if (s.kill_reason.empty()) s.kill_reason = reason;
  if (s.armed && !s.rt_killed && rt->kill_now(s.slot)) return;
  // Not (or no longer) armed, or the queue is full: kill from here.
  host->kill(s.id, now_ns());
  if (s.synthetic) on_pidfd(s.id);
}

void Supervisor::Impl::on_pidfd(const SandboxId& id) {
  Sandbox* s = find(id);
  if (s == nullptr || s->phase == SandboxPhase::exited) return;
  advance(s->phase, SandboxPhase::exited);
  ++counters.exited;
  hb->remove(id);
  rt->set_deadline(s->slot, 0);
  // The first process stays unreaped (its pid and process group cannot be reused) until the rt
  // thread has applied the disarm (kill_switch.hpp); finish_exit reaps it.
  if (s->armed) {
    const RtSubmitted d = rt->disarm(s->slot);
    if (d) {
      s->disarm_seq = d.seq;
      disarming.push_back(id);
      if (!disarm_timer.valid())
        disarm_timer = loop->add_timer_after(kDisarmPollNs, [this] {
          disarm_timer = TimerId{};
          check_disarms();
        });
      return;
    }
    // Queue full or stopped: the rt thread may still hold the target; wait for it to stop.
    log_event("event=disarm_refused sandbox=%s", id.str().c_str());
  }
  finish_exit(id);
}

void Supervisor::Impl::check_disarms() {
  for (std::size_t i = 0; i < disarming.size();) {
    Sandbox* s = find(disarming[i]);
    if (s == nullptr || rt->applied(s->disarm_seq)) {
      const SandboxId id = disarming[i];
      disarming[i] = disarming.back();
      disarming.pop_back();
      if (s != nullptr) finish_exit(id);
      continue;
    }
    ++i;
  }
  if (!disarming.empty() && !disarm_timer.valid())
    disarm_timer = loop->add_timer_after(kDisarmPollNs, [this] {
      disarm_timer = TimerId{};
      check_disarms();
    });
}

void Supervisor::Impl::finish_exit(const SandboxId& id) {
  Sandbox* s = find(id);
  if (s == nullptr) return;
  // Reaped (its pid and process group may be reused from now on), its leaf removed.
  const ReapedSandbox reaped = host->reap(id);
  s->exit_code = reaped.exit_code;
  log_event("event=exited sandbox=%s slot=%u pid=%d name=%s epoch=%" PRIu64 " status=%d reason=\"%s\"",
            id.str().c_str(), s->slot, s->pid, s->name ? s->name->c_str() : "-", s->epoch, s->exit_code,
            s->kill_reason.empty() ? "exited" : s->kill_reason.c_str());
  table->free(s->slot, now_ns());
  // Dead means the pidfd reported the exit *and* the leaf is empty: while a process of it
  // still runs, the name is not given back (lockd expires it after its TTL; nothing refreshes it).
  const bool leave_to_expire = (s->name || s->pending_name) && reaped.still_populated;
  if (leave_to_expire)
    log_event("event=leaf_still_populated sandbox=%s name=%s epoch=%" PRIu64 " action=name_left_to_expire",
              id.str().c_str(), s->name ? s->name->c_str() : s->pending_name->c_str(), s->epoch);
  auto answer_waiters = [this](std::vector<std::pair<ControlClientId, json>> waiters,
                               std::optional<ControlError> err, std::string msg, json fields) {
    for (auto& [c, rid] : waiters) {
      if (err) reply(c, control_error(rid, *err, msg, fields));
      else reply(c, control_ok(rid, fields));
    }
  };
  json fields = {{"sandbox", id.str()}, {"exit_status", s->exit_code}};
  if (s->name) fields["name"] = *s->name;
  auto waiters = std::move(s->waiters);
  auto err = s->waiter_error;
  auto msg = s->waiter_message;
  remember_log(*s);  // each branch below erases it, with its slot and names
  if ((s->name || s->pending_name) && leave_to_expire) {
    fields["released"] = false;
    fields["release"] = "not released: a process of the sandbox still runs in its cgroup leaf; lockd expires the name";
    sandboxes.erase(id);
    answer_waiters(std::move(waiters), err, msg, fields);
  } else if (s->name && s->revoked) {  // dead (pidfd and an empty leaf): lockd may lift the revoke
    const std::string name = *s->name;
    confirm_kill_to_lockd(s->name_id, name, id, s->epoch);
    sandboxes.erase(id);
    fields["released"] = false;
    fields["release"] = "revoked by lockd; kill confirmed to lockd";
    answer_waiters(std::move(waiters), err, msg, fields);
  } else if (s->name || s->pending_name) {
    const std::string name = s->name ? *s->name : *s->pending_name;
    const NameId nid = s->name_id;
    const Epoch epoch = s->epoch;
    sandboxes.erase(id);
    release_to_lockd(nid, name, id, epoch,
                     [answer_waiters, waiters = std::move(waiters), err, msg, fields](bool ok, std::string text) mutable {
                       fields["released"] = ok;
                       fields["release"] = text;
                       answer_waiters(std::move(waiters), err, msg, fields);
                     });
  } else {
    sandboxes.erase(id);
    answer_waiters(std::move(waiters), err, msg, fields);
  }
  if (shutting_down) maybe_finish_shutdown();
}

void Supervisor::Impl::on_rt_events() {
  RtKillEvent e;
  while (rt->pop_kill(e)) {
    Sandbox* s = sandboxes.at_slot(e.slot);
    const SandboxId id = s != nullptr ? s->id : SandboxId{};
    if (s == nullptr || e.record.error == -ECANCELED) {
      // A kill the rt thread gave up on because its sandbox was disarmed (it exited first).
      log_event("event=kill_record slot=%u error=%d", e.slot, e.record.error);
      continue;
    }
    // A kill request sets kill_reason first (kill_sandbox); a deadline kill's reason is set here.
    const bool requested = !s->kill_reason.empty();
    if (requested) ++counters.kills_request;
    else ++counters.kills_deadline;
    if (s != nullptr) {
      s->rt_killed = true;
      if (s->kill_reason.empty()) s->kill_reason = "kill-switch: lease not refreshed in time";
    }
    const KillRecord& r = e.record;
    log_event("event=killed sandbox=%s slot=%u cause=%s deadline_ns=%" PRIu64 " issued_ns=%" PRIu64
              " confirmed_ns=%" PRIu64 " path=%s error=%d name=%s epoch=%" PRIu64 " reason=\"%s\"",
              id.str().c_str(), e.slot, requested ? "request" : "deadline", r.deadline_ns, r.issued_ns,
              r.confirmed_ns,
              r.path == KillPath::cgroup_kill ? "cgroup.kill" : r.path == KillPath::signals ? "signals" : "none",
              r.error, s && s->name ? s->name->c_str() : "-", s ? s->epoch : 0, s ? s->kill_reason.c_str() : "");
    if (s != nullptr && s->synthetic) on_pidfd(id);  // nothing to wait for
  }
}

void Supervisor::Impl::reap_orphans() {
  // Re-parented descendants (we are a child subreaper). A sandbox's first process is reaped in
  // finish_exit, after the rt thread let go of it: peek first, and stop at a sandbox.
  for (int i = 0; i < 1024; ++i) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    for (auto& [id, s] : sandboxes) {
      if (s.pid == info.si_pid) {
        if (s.phase != SandboxPhase::exited) on_pidfd(id);
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
    }
  }
}

void Supervisor::Impl::reload_key() {
  // A key rotation: --key-file again, with the same checks as at start. Leases, sandboxes and
  // the seq continue; a key that does not load changes nothing.
  // The new key is used only once lockd answers a request signed with it (LockdLink::try_key):
  // until then every datagram stays under the current key, so a key lockd lacks kills nothing.
  wire::KeyLoad kl = wire::load_key_file(cfg.key_file);
  std::string err = kl ? std::string() : kl.message();
  const std::uint16_t id = kl ? kl->key_id : 0;
  if (kl && ablated("unprobed-key-reload"))  // tests only: switch at once, as before
    err = link->rekey(*kl);
  else if (kl)
    err = link->try_key(*kl, now_boottime_ns() + kKeyProbeNs,
                        [this, id](bool accepted, std::string why) { on_key_probe(id, accepted, why); });
  if (kl) OPENSSL_cleanse(kl->bytes.data(), kl->bytes.size());
  if (!err.empty()) {
    ++counters.key_reloads_refused;
    log_event("event=key_reload_refused key_file=%s error=\"%s\"", cfg.key_file.c_str(), err.c_str());
    return;
  }
  if (link->pending_key_id() == 0 && link->key_id() == id) {  // the same key id: in use at once
    ++counters.key_reloads;
    log_event("event=key_reloaded key_file=%s key_id=%u", cfg.key_file.c_str(), static_cast<unsigned>(id));
  }
}

void Supervisor::Impl::on_key_probe(std::uint16_t key_id, bool accepted, const std::string& why) {
  if (accepted) {
    ++counters.key_reloads;
    log_event("event=key_reloaded key_file=%s key_id=%u", cfg.key_file.c_str(), static_cast<unsigned>(key_id));
    return;
  }
  ++counters.key_not_accepted;
  next_key_probe_ns = now_boottime_ns() + kKeyProbeIntervalNs;
  log_event("event=key_not_accepted key_file=%s key_id=%u in_use_key_id=%u error=\"lockd does not know key id %u "
            "(%s): still signing with key id %u; load the new cluster key into lockd (its key directory, then "
            "SIGHUP), tried again every %lld s\"",
            cfg.key_file.c_str(), static_cast<unsigned>(key_id), static_cast<unsigned>(link->key_id()),
            static_cast<unsigned>(key_id), why.c_str(), static_cast<unsigned>(link->key_id()),
            static_cast<long long>(kKeyProbeIntervalNs / 1'000'000'000));
}

void Supervisor::Impl::probe_pending_key() {
  if (link->pending_key_id() == 0 || now_boottime_ns() < next_key_probe_ns || shutting_down) return;
  const std::uint16_t id = link->pending_key_id();
  next_key_probe_ns = INT64_MAX;  // until this probe ends
  if (!link->try_pending_key(now_boottime_ns() + kKeyProbeNs,
                             [this, id](bool accepted, std::string why) { on_key_probe(id, accepted, why); }))
    next_key_probe_ns = now_boottime_ns() + kKeyProbeIntervalNs;
}

void Supervisor::Impl::begin_shutdown(const char* why) {
  if (shutting_down) return;
  shutting_down = true;
  shutdown_deadline_ns = now_boottime_ns() + kShutdownKillWaitNs;
  log_event("event=shutdown signal=%s policy=%s sandboxes=%zu", why, std::string(to_string(cfg.on_shutdown)).c_str(),
            sandboxes.size());
  // Commits not yet sent will not be: answer them.
  while (!pending_commits.empty()) {
    PendingCommit pc = std::move(pending_commits.front());
    pending_commits.pop_front();
    abandon(*pc.request.sandbox, pc.client, pc.request.id, ControlError::shutting_down, "the supervisor is shutting down");
  }
  std::vector<SandboxId> ids;
  for (auto& [id, s] : sandboxes) ids.push_back(id);
  if (cfg.on_shutdown == ShutdownPolicy::kill) {
    for (const auto& id : ids)
      if (Sandbox* s = find(id); s && !never_started(s->phase)) kill_sandbox(*s, "shutdown");
  } else {
    // keep: processes go on, unnamed. Stop the rt thread first (it must let go of their fds
    // and pids), revoke every slot so their checks refuse, release their names.
    rt->stop();
    for (const auto& id : ids) {
      Sandbox* s = find(id);
      if (s == nullptr || never_started(s->phase)) continue;
      hb->remove(id);
      table->revoke(s->slot);
      if (s->name) release_to_lockd(s->name_id, *s->name, id, s->epoch, [](bool, std::string) {});
      for (auto& [c, rid] : s->waiters) reply(c, control_error(rid, ControlError::shutting_down, "the supervisor is shutting down"));
      log_event("event=kept sandbox=%s pid=%d cgroup=%s", id.str().c_str(), s->pid,
                s->cgroup_path.empty() ? "-" : s->cgroup_path.c_str());
      host->forget(id);  // closes the pidfd and the leaf's fds; a populated leaf stays
      sandboxes.erase(id);
    }
  }
  maybe_finish_shutdown();
}

void Supervisor::Impl::maybe_finish_shutdown() {
  bool busy = false;
  for (const auto& [id, s] : sandboxes)
    if (!never_started(s.phase)) busy = true;
  if ((busy || releases_in_flight > 0) && now_boottime_ns() < shutdown_deadline_ns) return;
  if (busy) log_event("event=shutdown_timeout sandboxes=%zu", sandboxes.size());
  loop->stop();
}

// =============================================================================================
// heartbeat

void Supervisor::Impl::apply(const HeartbeatAction& a) {
  switch (a.kind) {
    case HeartbeatAction::Kind::none:
      return;
    case HeartbeatAction::Kind::extend: {
      // shm first (the sandbox's own check), then the rt thread's deadline (lazy re-arm: no
      // message needed, it re-reads this when the old deadline comes due).
      Sandbox* s = find(a.sandbox);
      // A sandbox whose Commit is in flight has no published epoch to extend, only its deadline.
      if ((s != nullptr && s->pending_name) || table->extend(a.slot, a.valid_until_ns) == shm::TableErrc::ok)
        rt->set_deadline(a.slot, a.valid_until_ns);
      if (s != nullptr) s->valid_until_ns = a.valid_until_ns;
      return;
    }
    case HeartbeatAction::Kind::kill: {
      Sandbox* s = find(a.sandbox);
      if (s == nullptr) return;
      std::string why = a.lapsed ? "lease lapsed before lockd's answer arrived"
                                 : std::string("heartbeat answer ") + std::string(to_string(a.cause));
      if (a.cause == RefreshStatus::lost && !a.holder.is_nil())
        why += " (held by " + a.holder.str() + " at epoch " + std::to_string(a.holder_epoch) + ")";
      if (!kill_asked(s->phase)) log_event("event=recovery sandbox=%s name=%s reason=\"%s\"", a.sandbox.str().c_str(),
                                   s->name ? s->name->c_str() : "-", why.c_str());
      // lockd no longer knows the grant as ours (revoked, or held by another): once dead, say so
      // (a revoke's lock-delay waits for it) rather than release a name that is not ours.
      if (!a.lapsed && a.cause != RefreshStatus::refreshed) s->revoked = true;
      kill_sandbox(*s, why);
      hb->remove(a.sandbox);
      return;
    }
  }
}

void Supervisor::Impl::on_heartbeat_tick() {
  const std::uint64_t now = now_ns();
  // 2-phase commits ride on this tick.
  while (!pending_commits.empty()) {
    PendingCommit pc = std::move(pending_commits.front());
    pending_commits.pop_front();
    commit_now(pc);
  }
  if (cfg.mode == SupervisorMode::preemptible) {
    auto kills = hb->check_worker_liveness(now);
    if (!kills.empty()) {
      ++counters.worker_killswitch;
      log_event("event=worker_killswitch sandboxes=%zu", kills.size());
    }
    for (const auto& a : kills) apply(a);
  }
  HeartbeatRound round = hb->begin_round(now, wire::kHeartbeatEntriesMax);
  for (auto& req : round.requests) {
    wire::Heartbeat h;
    h.ttl_cap_ms = 0;
    for (const auto& e : req.entries) h.entries.push_back(wire::HeartbeatEntry{e.name, e.sandbox, e.epoch});
    ++counters.heartbeat_datagrams;
    auto entries = std::make_shared<std::vector<RefreshEntry>>(std::move(req.entries));
    link->call(h, static_cast<std::int64_t>(req.deadline_ns), [this, entries](LockdReply r) {
      const std::uint64_t at = now_ns();
      if (!r.ok()) {
        ++counters.heartbeat_failures;
        table->record_heartbeat_failure();
        return;
      }
      const auto* ack = std::get_if<wire::HeartbeatAck>(&*r.body);
      if (ack == nullptr || ack->entries.size() != entries->size()) {
        ++counters.heartbeat_failures;
        table->record_heartbeat_failure();
        log_event("event=heartbeat_bad_answer answer=\"%s\"", describe_answer(*r.body).c_str());
        return;
      }
      table->record_heartbeat_rtt_ns(at - static_cast<std::uint64_t>(r.first_send_ns));
      for (std::size_t i = 0; i < entries->size(); ++i) {
        const auto& e = (*entries)[i];
        const auto& a = ack->entries[i];
        if (a.name_id != e.name) continue;  // not an answer about this entry
        const RefreshStatus res = a.status;
        if (res == RefreshStatus::refreshed && cfg.mode == SupervisorMode::lease &&
            std::uint64_t{a.ttl_left_ms} + 1 < cfg.ttl_ms) {
          // lockd refreshes for less than --ttl-ms: the safety condition does not hold for this
          // lease. Do not extend it; stop the sandbox.
          if (Sandbox* s = find(e.sandbox)) {
            log_event("event=ttl_mismatch sandbox=%s ttl_left_ms=%u ttl_ms=%" PRIu64, e.sandbox.str().c_str(),
                      a.ttl_left_ms, cfg.ttl_ms);
            kill_sandbox(*s, "lockd refreshed for " + std::to_string(a.ttl_left_ms) + " ms, below --ttl-ms " +
                                 std::to_string(cfg.ttl_ms));
            hb->remove(e.sandbox);
          }
          continue;
        }
        if (res == RefreshStatus::refreshed) ++counters.refreshed;
        else if (res == RefreshStatus::lost) ++counters.lost;
        else ++counters.unknown;
        apply(hb->on_refresh_answer(e.sandbox, e.epoch, res, a.holder, a.epoch,
                                    static_cast<std::uint64_t>(r.first_send_ns), at));
      }
    });
  }
  if (round.worker_liveness) send_worker_beat(round.worker_liveness_deadline_ns, std::move(round.worker_held));
}

void Supervisor::Impl::send_worker_beat(std::uint64_t deadline_ns, std::vector<RefreshEntry> held) {
  ++counters.heartbeat_datagrams;
  wire::WorkerHeartbeat beat{worker, {}};
  for (const auto& e : held) beat.held.push_back(wire::HeartbeatEntry{e.name, e.sandbox, e.epoch});
  link->call(beat, static_cast<std::int64_t>(deadline_ns),
             [this, held = std::move(held)](LockdReply r) {
               const std::uint64_t at = now_ns();
               if (!r.ok()) {
                 ++counters.heartbeat_failures;
                 table->record_heartbeat_failure();
                 return;
               }
               const auto* w = std::get_if<wire::WorkerAck>(&*r.body);
               if (w == nullptr) {
                 ++counters.heartbeat_failures;
                 log_event("event=worker_beat_bad_answer answer=\"%s\"", describe_answer(*r.body).c_str());
                 return;
               }
               // Names lockd no longer has as ours (revoked, preempted, transferred away): kill
               // at once, whatever the liveness part of the answer says (mutex violation recovery).
               for (const auto& a : w->not_held) {
                 const auto e = std::find_if(held.begin(), held.end(), [&](const RefreshEntry& x) { return x.name == a.name_id; });
                 if (e == held.end()) continue;  // not a name this beat carried
                 const RefreshStatus res = a.status;
                 if (res == RefreshStatus::refreshed) continue;
                 ++(res == RefreshStatus::lost ? counters.lost : counters.unknown);
                 apply(hb->on_refresh_answer(e->sandbox, e->epoch, res, a.holder, a.epoch,
                                             static_cast<std::uint64_t>(r.first_send_ns), at));
               }
               if (w->liveness_ttl_ms < cfg.ttl_ms) {
                 ++counters.heartbeat_failures;
                 log_event("event=worker_ttl_too_short liveness_ttl_ms=%u ttl_ms=%" PRIu64, w->liveness_ttl_ms, cfg.ttl_ms);
                 return;  // not counted as liveness: the kill-switch will fire in time
               }
               ++counters.worker_beats_acked;
               table->record_heartbeat_rtt_ns(at - static_cast<std::uint64_t>(r.first_send_ns));
               const bool was_engaged = hb->killswitch_engaged();
               for (const auto& a : hb->on_worker_liveness_ack(static_cast<std::uint64_t>(r.first_send_ns), at)) apply(a);
               if (was_engaged && !hb->killswitch_engaged()) log_event("event=worker_live_again");
             });
}

bool Supervisor::Impl::is_running(const wire::IsRunning& q) {
  const Sandbox* s = find(q.sandbox);
  // Conservative: a sandbox still alive (even while being killed) counts as running, so lockd
  // never preempts a name whose holder could still act. That includes a sandbox whose Commit
  // is in flight: it was started before the Commit was sent, and name_id / epoch are those of
  // its acquiring grant. A sandbox not yet started (acquire in flight) has no epoch: "no".
  return s != nullptr && answers_running(s->phase) && s->name_id == q.name_id && s->epoch == q.epoch;
}

bool Supervisor::Impl::on_revoked(const wire::Revoked& q) {
  for (auto& [id, s] : sandboxes) {
    if (s.phase == SandboxPhase::exited || !s.name || s.name_id != q.name_id || s.epoch != q.epoch) continue;
    if (!s.revoked)
      log_event("event=revoked sandbox=%s name=%s epoch=%" PRIu64 " new_epoch=%" PRIu64 " action=kill",
                id.str().c_str(), s.name->c_str(), q.epoch, q.new_epoch);
    s.revoked = true;
    hb->remove(id);
    kill_sandbox(s, "revoked by lockd (epoch " + std::to_string(q.epoch) + " -> " + std::to_string(q.new_epoch) + ")");
    return true;  // the confirmation follows its exit (finish_exit)
  }
  // Being placed (its grant may still arrive): its next heartbeat answer is `lost`, so it is
  // killed then; lockd's bound covers it, no confirmation is sent for it.
  for (const auto& [name, holder] : sandboxes.names())
    if (name_id_of(name) == q.name_id) return true;
  // Nothing of that grant runs here (it exited, or a restart stopped it): confirm at once.
  confirm_kill_to_lockd(q.name_id, q.name_id.str(), SandboxId{}, q.epoch);
  return false;
}

void Supervisor::Impl::confirm_kill_to_lockd(const NameId& name_id, const std::string& name, const SandboxId& sb,
                                             Epoch epoch) {
  ++releases_in_flight;  // shutdown waits for it like for a release
  link->call(wire::KillConfirmed{name_id, sb, epoch},
             now_boottime_ns() + static_cast<std::int64_t>(std::max<std::uint64_t>(lockd_ttl_ms, cfg.ttl_ms)) * 1'000'000,
             [this, name, sb, epoch](LockdReply r) {
               --releases_in_flight;
               const std::string text = r.ok() ? describe_answer(*r.body) : r.problem;
               log_event("event=kill_confirmed name=%s sandbox=%s epoch=%" PRIu64 " result=\"%s\"", name.c_str(),
                         sb.str().c_str(), epoch, text.c_str());
               if (shutting_down) maybe_finish_shutdown();
             });
}

int Supervisor::Impl::run() {
  int rc = loop->run();
  if (rc < 0) {
    log_event("event=loop_failed error=\"%s\"", std::strerror(-rc));
    exit_code = 1;
  }
  // Finish: close the table (every check fails from now on), stop the rt thread, clean up.
  if (heartbeat_timer.valid()) loop->cancel_timer(heartbeat_timer);
  if (housekeeping_timer.valid()) loop->cancel_timer(housekeeping_timer);
  table->close(now_ns());
  rt->stop();
  host->stop_all(now_ns());  // left after a shutdown timeout: kill and reap what we can
  remove_empty_logs();
  sandboxes.clear();
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

std::unique_ptr<Supervisor> Supervisor::create(SupervisorConfig config, std::string& error) {
  auto impl = std::make_unique<Impl>();
  error = impl->init(std::move(config));
  if (!error.empty()) {
    impl->teardown_partial();
    return nullptr;
  }
  return std::unique_ptr<Supervisor>(new Supervisor(std::move(impl)));
}

int Supervisor::run() { return impl_->run(); }
std::string Supervisor::summary() const { return impl_->summary(); }

}  // namespace leasehold
