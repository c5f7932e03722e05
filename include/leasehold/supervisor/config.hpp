// leasehold/supervisor: the supervisor's configuration, its command line, and the start-up
// safety check of DESIGN.md "Time".
//
// The kill-switch is only safe if the supervisor kills a sandbox before lockd can expire its
// lease and hand the name to someone else. With ρ the clock-rate bound between the two hosts:
//
//   kill_after·(1+ρ) + wheel_granularity + kill_latency_budget  <  ttl·(1−ρ)
//
// `ttl − left side` is the pause budget: a supervisor pause longer than it can break mutual
// exclusion, after which recovery (the first heartbeat answer, `lost`/`unknown`) kills the
// sandbox (EventualMutualExclusion). `check_config` refuses a configuration that breaks the
// condition, with the numbers in the message.
//
// With several lockd addresses (a replicated lockd) a second condition: when the leader is lost,
// the supervisor must reach the new one before its kill-switch fires. The last acknowledged
// refresh was sent at most one heartbeat interval before the loss, a new leader serves within
// the failover bound, and a call in flight tries again within the longest retry gap, so
//
//   failover + longest retry gap  <  kill_after − heartbeat_interval
//
// (the retry gap: backoff_max·(1 + jitter) of lockd_retry_policy; a not_leader backoff is no
// longer). `kill_after − heartbeat_interval − (failover + gap)` is the failover margin.
#pragma once

#include "leasehold/io/client.hpp"
#include "leasehold/io/daemon_options.hpp"
#include "leasehold/lease/result.hpp"
#include "leasehold/lease/timing.hpp"
#include "leasehold/lease/types.hpp"


#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <string_view>
#include <utility>

namespace CLI {
class App;
}

namespace leasehold {

/// Lock mode of the supervisor; must match lockd's --mode (DESIGN.md "Lock states").
enum class SupervisorMode : std::uint8_t {
  lease = 0,        ///< every named sandbox is refreshed by the batched heartbeat
  preemptible = 1,  ///< after commit, the worker-liveness heartbeat replaces per-sandbox refreshes
};

/// What a clean shutdown (SIGTERM/SIGINT) does with running sandboxes.
enum class ShutdownPolicy : std::uint8_t {
  kill = 0,  ///< kill every sandbox, release its name, then exit
  keep = 1,  ///< leave processes running; their slots are revoked and names released
};

/// Bounds (TigerBeetle style: every quantity has a named limit).
inline constexpr std::uint32_t kSlotsMax = 1u << 20;           ///< --slots upper bound
inline constexpr std::uint64_t kTtlMsMax = 24ull * 3600 * 1000;  ///< one day
inline constexpr std::uint32_t kMinRefreshAttempts = 3;       ///< refreshes within kill_after
inline constexpr double kClockRateBoundMax = 0.1;              ///< ρ above 10 % is not a clock
/// Default tick of the rt thread's deadline wheel (--wheel-granularity-us): a term of the safety
/// condition. The rt thread sleeps until the wheel's next event, so the tick is not its idle cost.
inline constexpr std::uint64_t kDefaultWheelGranularityNs = 1'000'000;
/// Default longest sleep of the rt thread (--rt-command-poll-us): how late a kill-now is applied,
/// and the idle cost (one wake-up per period). At most the wheel tick: a wake-up every tick.
inline constexpr std::uint64_t kDefaultRtCommandPollNs = 5'000'000;

/// Default --lockd-failover-ms: a lockd leadership lease plus an election.
inline constexpr std::uint64_t kDefaultLockdFailoverMs = 3'000;

/// The supervisor's configuration. All durations are milliseconds unless the suffix says so.
/// --stop-grace-ms default: long enough for a process to flush and close what it writes, short
/// enough not to hold up a name's next holder (a release answers, and frees the name, only
/// once the sandbox is gone).
inline constexpr std::uint64_t kDefaultStopGraceMs = 2'000;
/// Its maximum: a shutdown waits up to 5 s + the grace, and the systemd unit's TimeoutStopSec
/// (30 s) must cover that before SIGKILL reaches the supervisor.
inline constexpr std::uint64_t kStopGraceMsMax = 20'000;

struct SupervisorConfig {
  /// lockd's address "host:port" (UDP), or several comma-separated ones (a replicated lockd,
  /// whose leader the supervisor follows; entries as io/address_list.hpp reads them); required
  std::string lockd_address;
  /// With several lockd addresses: the longest time from the loss of a leader to a new one
  /// serving (the leadership lease plus an election); a term of the failover condition above.
  std::uint64_t lockd_failover_ms = kDefaultLockdFailoverMs;
  std::string key_file;             ///< HMAC key file (mode 0600); required
  std::optional<WorkerId> worker_id;  ///< nullopt → a random UUIDv4 per start
  std::string shm_path;             ///< empty → default_shm_path(worker)
  std::string control_socket_path;  ///< empty → default_control_socket_path()
  /// ADDR:PORT of the HTTP endpoint (/metrics, /healthz; conventionally port 9741); empty: none.
  /// Served by leasehold-supervisor's main (metrics/http_endpoint.hpp), not by Supervisor.
  std::string metrics_listen;
  /// --metrics-allow: CIDR[,CIDR...] of the peers the HTTP endpoint admits; empty: every peer.
  std::string metrics_allow;
  /// The config file that was read (io/daemon_options.hpp config_file_read), or "none": named in
  /// the start line (event=serving config=...). Set by leasehold-supervisor's main, not a flag.
  std::string config_file = "none";
  /// Each sandbox's stdout and stderr go to <dir>/<sandbox id>.log (0600), never to the
  /// supervisor's own; empty → <runtime_dir>/sandbox-logs-<worker id>. Read with `leasehold logs`.
  std::string sandbox_log_dir;
  /// At most this many bytes of a sandbox's output reach its log file (one line then says the
  /// rest was discarded); a sandbox cannot fill the log directory's filesystem.
  std::uint64_t sandbox_log_max_bytes = 8u << 20;
  std::string group;                ///< group allowed on the control socket besides root; "" = root only
  std::uint64_t ttl_ms = 10'000;    ///< lockd's lease TTL (preemptible: the worker-liveness TTL)
  std::uint64_t heartbeat_interval_ms = 1'000;
  std::uint64_t kill_after_ms = 7'000;
  double clock_rate_bound = 1e-3;   ///< ρ
  std::uint64_t kill_latency_budget_ms = 50;
  std::uint64_t wheel_granularity_ns = kDefaultWheelGranularityNs;
  std::uint64_t rt_command_poll_ns = kDefaultRtCommandPollNs;
  int rt_priority = 50;             ///< SCHED_FIFO priority 1..99
  int rt_cpu = -1;                  ///< CPU to pin the rt thread to; -1 = last online CPU
  SupervisorMode mode = SupervisorMode::lease;
  ShutdownPolicy on_shutdown = ShutdownPolicy::kill;
  /// --stop-grace-ms: SIGTERM, then this long before cgroup.kill on release, kill on request and
  /// shutdown (0: at once). At most kStopGraceMsMax.
  std::uint64_t stop_grace_ms = kDefaultStopGraceMs;
  bool bwrap = false;               ///< wrap every sandbox in bubblewrap (needs isolation off)
  /// Isolated spawn (supervisor/spawn.hpp "Isolation"); false is the legacy spawn, where a
  /// sandbox runs as the supervisor's uid in its namespaces.
  bool isolation = true;
  /// Root supervisor: host uids (and gids) for sandboxes root starts, one per slot:
  /// first + slot. Must hold at least `slots` ids and not include 0.
  /// --uid-range (alias --sandbox-uids). Two live root supervisors on one host with overlapping
  /// ranges are refused (UidRangeLock).
  std::uint32_t sandbox_uid_first = 0;   ///< 0: root's range in /etc/subuid, else kDefaultSandboxUidFirst
  std::uint32_t sandbox_uid_count = 0;   ///< 0: with the range above
  std::uint64_t sandbox_nproc_max = 1024;  ///< RLIMIT_NPROC of a sandbox's user namespace (processes)
  /// pids.max of a sandbox's cgroup leaf (processes and threads), where the pids controller is
  /// delegated; where it is not, RLIMIT_NPROC above is the bound (isolated sandboxes).
  std::uint64_t sandbox_pids_max = 1024;
  /// Run named sandboxes although no kill reaches all their processes for sure (no delegated
  /// cgroup v2 and no pid namespace); every status line then says so.
  bool allow_unsafe_kill = false;
  bool no_cgroup = false;  ///< never use cgroup v2 leaves (the process-group kill), even where delegated
  std::uint32_t slots = 1024;       ///< shm table slots = sandboxes at once
  bool synthetic = false;           ///< perf only: leases without processes (see --synthetic)
  /// --log-format, --log-level (io/daemon_options.hpp); the level is re-read on SIGHUP.
  LogOptions log;
};

/// Sandbox uids of a root supervisor without /etc/subuid range for root (and --sandbox-uids).
inline constexpr std::uint32_t kDefaultSandboxUidFirst = 100000;
inline constexpr std::uint32_t kDefaultSandboxUidCount = 65536;

/// Root's subordinate uid range from the text of /etc/subuid ("root:FIRST:COUNT" or
/// "0:FIRST:COUNT"); nullopt if none.
std::optional<std::pair<std::uint32_t, std::uint32_t>> root_subuid_range(std::string_view etc_subuid);

/// True when LEASEHOLD_ABLATE (comma-separated; the attack tests' switch, never a flag) names
/// `ablation`: one defence is switched off to show the attack it stops. The supervisor's and
/// its clients': unsealed-table (the shm memfd unsealed), arm-after-exec (a new sandbox's
/// deadline armed only after its exec), uid-range-accounts (a --uid-range over existing accounts
/// accepted), unchecked-control-server (a control client sends its request to a server of any uid),
/// control-uid-cap (no per-uid bound on control connections and no reserve for root).
bool ablated(std::string_view ablation);

/// Ok when the sandbox uid range [first, first + count) may be used. Errors: exists when it holds
/// uid 0, or the uid of an account or the gid of a group of this host (getpwent/getgrent, so NSS
/// sources count: a sandbox runs as uid and gid first + slot, and would own that account's files
/// and processes); the message names the first account found and suggests a subordinate range.
Status check_uid_range_accounts(std::uint32_t first, std::uint32_t count);

/// A root supervisor's claim on its sandbox uid range, held for its lifetime so that two live
/// supervisors on one host never run sandboxes as the same uid (one could then signal, ptrace or
/// read the files of the other's sandboxes). Each holder has a file `range-FIRST-COUNT` in `dir`
/// (root: <runtime_dir>/uid-ranges), flock'ed while it lives (the kernel drops the lock when the
/// process dies, even by SIGKILL); the directory's `.lock` serializes the check-and-claim.
class UidRangeLock {
 public:
  UidRangeLock() = default;
  UidRangeLock(UidRangeLock&& o) noexcept;
  UidRangeLock& operator=(UidRangeLock&& o) noexcept;
  UidRangeLock(const UidRangeLock&) = delete;
  UidRangeLock& operator=(const UidRangeLock&) = delete;
  ~UidRangeLock();  ///< unlinks the file, then drops the lock

  /// Claims [first, first + count) for this process. `holder` is written into the file for the
  /// refusal another claimant gets (e.g. "pid 42, worker W"). Files whose holder died are removed.
  /// Ok, or why not: refused (the range overlaps a live holder's, naming both ranges and the
  /// holder), permission_denied (the directory is not this uid's or others may write it),
  /// or the errno of the directory or lock file that cannot be used.
  Status claim(const std::string& dir, std::uint32_t first, std::uint32_t count, const std::string& holder);
  bool held() const noexcept { return fd_ >= 0; }
  const std::string& path() const noexcept { return path_; }
  void release() noexcept;

 private:
  int fd_ = -1;
  std::string path_;
};

/// What the start-up checks proved about a usable configuration.
struct ConfigBudget {
  std::int64_t pause_budget_ns = 0;  ///< timing::check_safety: ttl − (kill_after·(1+ρ) + granularity + kill budget), ns
  std::uint32_t refresh_attempts = 0;  ///< floor(kill_after / heartbeat_interval)
  std::uint32_t lockd_addresses = 0;   ///< distinct --lockd entries
  /// The longest gap between two attempts of a call to lockd (lockd_retry_policy), ns.
  std::int64_t retry_gap_ns = 0;
  /// Several lockd addresses: (kill_after − heartbeat_interval) − (failover + retry gap), ns,
  /// > 0; 0 with one address (no failover to survive).
  std::int64_t failover_margin_ns = 0;
};

/// How the supervisor's calls to lockd retry (LockdLink): the first retry a quarter heartbeat
/// interval after the send (at least 5 ms), the gap doubling up to one heartbeat interval,
/// 20 % jitter. A not_leader answer without a usable leader waits as long before the next try.
RetryPolicy lockd_retry_policy(const SupervisorConfig& config);

/// Checks a configuration: field ranges, the --lockd list's syntax (no name lookup), the
/// safety condition of DESIGN.md "Time", that the heartbeat interval leaves at least
/// kMinRefreshAttempts refreshes within kill_after, and with several lockd addresses the
/// failover condition (top of this file).
/// The budget, or invalid_argument naming the flag(s) with the numbers (an unsafe timing
/// gives both sides of the inequality and which flags to change). Pure; never throws.
Result<ConfigBudget> check_config(const SupervisorConfig& config);

/// Default control socket: /run/leasehold/supervisor.sock for root; otherwise
/// <runtime_dir>/supervisor.sock, in a directory the control socket server requires to be this
/// user's with mode 0700 (0750 with --group). $LEASEHOLD_CONTROL_SOCKET (or $LEASEHOLD_SUPERVISOR, the `leasehold`
/// CLI's variable) overrides it.
std::string default_control_socket_path();

/// Default shm table location: memfd:leasehold-<worker id> (a sealed memfd, gone with its
/// process; older versions made /dev/shm/leasehold-<worker id>, which sweep_stale_workers removes).
std::string default_shm_path(const WorkerId& worker);

/// The per-user runtime directory: /run/leasehold for root, else $XDG_RUNTIME_DIR/leasehold,
/// else $HOME/.leasehold (not /tmp, where another user could create it first), else
/// /tmp/leasehold-<uid> without a HOME.
std::string runtime_dir();

/// The lock one live supervisor per worker id holds (flock, released by the kernel when the
/// process dies, even by SIGKILL): <runtime_dir>/worker-<id>.lock.
std::string worker_lock_path(const WorkerId& worker);

/// What sweep_stale_workers removed for one worker whose supervisor is gone.
struct SweptWorker {
  WorkerId worker;
  std::vector<std::string> removed;  ///< the paths removed, the lock file last
};

/// At a supervisor's start: the worker locks in `lock_dir` (worker-<id>.lock) that no process
/// holds, other than `self`'s, are of supervisors that died (a worker id that was random is never
/// started again, so nobody else would remove them). For each such worker, removes what is named
/// after it: `shm_dir`/leasehold-<id> (a file-backed table: an older version's default, or
/// --shm leasehold-<id>; only one of this uid's), `lock_dir`/sandbox-logs-<id> when it is empty,
/// and the lock file itself. A lock that is held is never touched. Race-free against a
/// supervisor of that worker starting at the same moment: the lock is taken (flock) before
/// anything is removed and the file unlinked before it is let go, and a starter re-checks
/// after its flock that the inode it locked is still the one at the path (lock_worker).
std::vector<SweptWorker> sweep_stale_workers(const std::string& lock_dir, const std::string& shm_dir,
                                             const WorkerId& self);

/// Adds the supervisor's flags (units in --help) to `app`, writing into `config`.
/// `--worker-id` is validated as a UUID by CLI11.
void add_supervisor_flags(CLI::App& app, SupervisorConfig& config);

std::string_view to_string(SupervisorMode m) noexcept;
std::string_view to_string(ShutdownPolicy p) noexcept;

/// A random UUIDv4 (from the kernel's getrandom).
WorkerId random_worker_id();
SandboxId random_sandbox_id();

}  // namespace leasehold
