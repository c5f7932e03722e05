// leasehold/harness: the trials of `leasehold pause-probe` on a real deployment - run a named
// sandbox, freeze its supervisor for a pause, thaw, and observe what happened (the sandbox's
// death, lockd's expiry, a contender's grant, the slot, the supervisor's shm stats) as a
// pause::TrialObservation that leasehold/pause/model.hpp judges. pause/README.md "One trial"
// describes the steps.
//
// The pieces: the observer threads (SlotMonitor, Contender) at an ObserverPriority, shm stats
// snapshots and the clean lateness/RTT windows, one probe per supervisor (ProbeLock), and the
// TrialRunner with its sweep.
//
// Times are CLOCK_BOOTTIME nanoseconds (harness::now_ns()) unless a name says `_ms`. Errors come
// back as a Status (or a Result) whose message names the file, the request or the step
// (DESIGN.md "Errors"); a trial that cannot be run records why in TrialObservation::error. The
// `tick` of TrialSettings may throw harness::Interrupted (process.hpp) to end a trial or a sweep.
#pragma once

#include "leasehold/harness/freeze.hpp"
#include "leasehold/harness/process.hpp"
#include "leasehold/harness/relay.hpp"
#include "leasehold/lease/result.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/pause/model.hpp"
#include "leasehold/pause/report.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/wire/address.hpp"
#include "leasehold/wire/auth.hpp"

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace leasehold::harness {

/// valid_until changes a SlotMonitor records per trial (one per heartbeat).
inline constexpr std::size_t kValidUntilChangesMax = 100'000;
/// How long a trial waits for its sandbox's death after the kill request at its end (ms).
inline constexpr std::uint64_t kDeathWaitMs = 5'000;
/// After the sandbox's death, how long a trial looks for the contender's grant (ms).
inline constexpr std::uint64_t kGrantWaitAfterDeathMs = 500;
/// Worst phase: a trial whose sandbox was killed before the freeze took hold is run again this
/// many times at most, each time with the freeze started earlier.
inline constexpr std::uint32_t kPauseMissedRetriesMax = 2;

/// Observer threads timestamp events (a death, a grant, the freeze); under load a thread of
/// normal priority wakes late and reports them late. They run SCHED_FIFO at `priority` when
/// permitted (below the supervisor's rt thread; 0 = normal priority). Thread-safe.
class ObserverPriority {
 public:
  explicit ObserverPriority(int priority = 10) noexcept : priority_(priority) {}
  int priority() const noexcept { return priority_; }
  /// SCHED_FIFO | SCHED_RESET_ON_FORK for the calling thread (children it forks start at normal
  /// priority); a refusal is remembered (refused()), not an error.
  void raise() noexcept;
  /// True once the kernel refused SCHED_FIFO to an observer thread.
  bool refused() const noexcept { return refused_.load(); }

 private:
  int priority_;
  std::atomic<bool> refused_{false};
};

/// Watches a sandbox (its pidfd) and its shm slot (the revoked bit, valid_until changes) from a
/// thread of its own, polling every millisecond, from construction to destruction.
class SlotMonitor {
 public:
  /// `pidfd` < 0: the death is not watched. `slot` must outlive the monitor.
  SlotMonitor(int pidfd, const shm::Slot* slot, ObserverPriority& priority);
  ~SlotMonitor();
  SlotMonitor(const SlotMonitor&) = delete;
  SlotMonitor& operator=(const SlotMonitor&) = delete;

  /// When the pidfd was seen readable (ns; 0 while the sandbox runs).
  std::int64_t death_ns() const noexcept { return death_ns_.load(std::memory_order_acquire); }
  /// When the slot's revoked bit was first seen set (ns; 0 if never).
  std::int64_t revoked_ns() const noexcept { return revoked_ns_.load(std::memory_order_acquire); }
  /// The slot's valid_until now (ns).
  std::uint64_t valid_until_ns() const noexcept;
  /// The first time at or after `after_ns` at which valid_until moved above `above_ns` (0 if never).
  std::int64_t refreshed_after(std::int64_t after_ns, std::uint64_t above_ns);

 private:
  void loop();
  int pidfd_;
  const shm::Slot* slot_;
  ObserverPriority& priority_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> death_ns_{0}, revoked_ns_{0};
  std::mutex mu_;
  std::vector<std::pair<std::int64_t, std::uint64_t>> changes_;  ///< (seen at ns, valid_until ns)
  std::thread thread_;
};

/// Another holder of a name: from start() on, tries to acquire it every `interval_ns` from a
/// worker id of its own, until it is granted or stopped; a grant is kept until release().
class Contender {
 public:
  Contender(const SocketAddress& lockd, const wire::WireKey& key, std::string name, std::int64_t interval_ns,
            ObserverPriority& priority);
  ~Contender();
  Contender(const Contender&) = delete;
  Contender& operator=(const Contender&) = delete;

  void start();
  /// Stops trying (joins the thread); idempotent.
  void stop();
  bool granted() const noexcept { return grant_recv_ns_.load(std::memory_order_acquire) != 0; }
  /// The successful acquire: sent and answered (ns; 0 without a grant).
  std::int64_t grant_send_ns() const noexcept { return grant_send_ns_.load(); }
  std::int64_t grant_recv_ns() const noexcept { return grant_recv_ns_.load(); }
  /// The last attempt lockd answered with a Deny: sent (ns; 0 if none).
  std::int64_t last_deny_send_ns() const noexcept { return last_deny_send_ns_.load(); }
  std::uint64_t attempts() const noexcept { return attempts_.load(); }
  /// Releases the grant, if any (call after stop()).
  void release();

 private:
  void loop();
  lockd::AdminClient client_;
  std::string name_;
  std::int64_t interval_ns_;
  ObserverPriority& priority_;
  SandboxId sandbox_;
  NameId name_id_;
  Epoch epoch_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> grant_send_ns_{0}, grant_recv_ns_{0}, last_deny_send_ns_{0};
  std::atomic<std::uint64_t> attempts_{0};
  std::thread thread_;
};

/// A copy of one shm histogram (relaxed loads: a sample may straddle the copy).
pause::HistogramSnapshot snapshot_of(const shm::Histogram& h);

/// The supervisor's shm stats a trial compares before and after.
struct StatsSnapshot {
  pause::HistogramSnapshot lateness;  ///< rt thread lateness (ns)
  pause::HistogramSnapshot rtt;       ///< heartbeat round trip (ns)
  pause::HistogramSnapshot kill;      ///< kill latency: confirmed - deadline (ns)
  std::uint64_t kills = 0;            ///< kills counted
};
StatsSnapshot snap_stats(const shm::TableReader& table);

/// Two probes freezing one supervisor would nest their cgroup leaves, time each other's pauses
/// and leave the supervisor in the wrong cgroup. A probe therefore holds an exclusive flock on
/// `pause-probe-<supervisor pid>.lock` in the control socket's directory (resolved; where that is
/// not writable, in /run/leasehold) for its whole run; the file holds the owner's pid. It is left
/// in place: unlinking a lock file races with the next probe opening it.
class ProbeLock {
 public:
  /// Takes the lock of the supervisor `supervisor_pid` whose control socket is `socket`.
  /// Errors: busy "another pause-probe (pid P) is already probing the supervisor ... (lock:
  /// PATH)"; the errno's Errc "cannot create the probe's lock file PATH: REASON" or "flock PATH:
  /// REASON".
  static Result<std::unique_ptr<ProbeLock>> take(pid_t supervisor_pid, const std::string& socket);
  ~ProbeLock();
  ProbeLock(const ProbeLock&) = delete;
  ProbeLock& operator=(const ProbeLock&) = delete;
  /// The lock file.
  const std::string& path() const noexcept { return path_; }

 private:
  ProbeLock() = default;
  int fd_ = -1;
  std::string path_;
};

/// One control request to the supervisor (`req` without "v"), answered within `timeout`: the
/// answer (an {"ok": false} one included), or why there is none.
using ControlRequest = std::function<Result<nlohmann::json>(const nlohmann::json& req, milliseconds timeout)>;

/// The deployment under test, as the trials see it.
struct TrialTarget {
  ControlRequest request;               ///< to the supervisor's control socket
  SocketAddress lockd;                  ///< the lockd that holds the supervisor's leases
  wire::WireKey key;                    ///< signs the contender's and the expiry reader's requests
  UdpRelay* relay = nullptr;            ///< between the supervisor and lockd (worst phase); may be null
  pause::Timing timing;                 ///< the supervisor's
  /// The probe sandbox's command before its own flags (`leasehold pause-probe-sandbox`); a trial
  /// adds --log PATH --lifetime-ms MS.
  std::vector<std::string> sandbox_argv;
};

/// How the trials are run.
struct TrialSettings {
  pause::Phase phase = pause::Phase::random;
  std::string tag;                       ///< in the sandbox names: pause-probe.<tag>.<index>
  std::string log_dir;                   ///< the sandboxes' logs: sandbox-<index>-<pause>ms.log
  std::uint64_t seed = 0;                ///< the random phase (0: from the clock)
  std::uint64_t contend_interval_ms = 2; ///< the contender's attempts
  std::uint64_t guard_ms = 10;           ///< worst phase: freeze this long before valid_until
  /// Called while waiting (at least every 10 ms); may throw harness::Interrupted.
  std::function<void()> tick;
};

/// The supervisor's status counters a trial compares before and after.
struct StatusCounters {
  std::uint64_t kills_deadline = 0, lost = 0, unknown = 0;
};

/// The environment of the probe sandbox: PATH (default /usr/bin:/bin) and the sanitizer options
/// that are set here.
std::map<std::string, std::string> sandbox_env();

/// Runs trials against one deployment, and keeps the clean windows of the rt lateness and the
/// heartbeat RTT between them: the lateness window closes at each freeze, the RTT window already
/// at the cut/freeze decision (dropped refreshes would count their retries), and both reopen
/// after each trial's recovery. Not thread-safe.
class TrialRunner {
 public:
  /// `freezer`, `table` and `priority` must outlive the runner. The clean windows open now.
  TrialRunner(TrialTarget target, TrialSettings settings, Freezer& freezer, const shm::TableReader& table,
              ObserverPriority& priority);

  /// One trial of a `pause_ms` pause; `index` names its sandbox and log. The sandbox's log, when
  /// it could be read, goes to `log` (`have_log` true). Failures land in the observation's
  /// error; only the tick's harness::Interrupted leaves it (after the supervisor was thawed, the
  /// sandbox killed and the contender's grant released).
  pause::TrialObservation run(std::size_t index, std::uint64_t pause_ms, pause::SandboxLog& log, bool& have_log);

  /// A named sandbox that runs `ms` without any pause, so the clean windows have samples (under
  /// load, when there is load). Errors: the run request's failure or refusal.
  Status baseline(std::uint64_t ms);

  /// Every pause of `plan` (one trial each), classified and added to `rep` (observations,
  /// results, measured kill latency); a worst-phase trial killed before its freeze took hold is
  /// run again with the freeze started earlier (kPauseMissedRetriesMax). `progress` gets the
  /// progress text ("[i/n] pause P ms (under the budget) ... kept, ...\n"). A harness::Interrupted
  /// from the tick ends the sweep: true (the trials so far are in `rep`).
  bool sweep(const std::vector<std::uint64_t>& plan, std::int64_t budget_ns, pause::SweepReport& rep,
             const std::function<void(const std::string&)>& progress);

  /// Closes the clean windows now (at the end of a sweep).
  void close_windows();
  /// The clean rt lateness and heartbeat RTT samples so far (ns).
  const pause::HistogramSnapshot& clean_lateness() const noexcept { return clean_lateness_; }
  const pause::HistogramSnapshot& clean_rtt() const noexcept { return clean_rtt_; }
  /// After close_windows(): the clean samples into rep.measured (pause::finish_measured) and the
  /// sweep's verdict from its observations (pause::sweep_verdict with the target's timing; an
  /// interrupted one when `interrupted`, `planned` trials having been planned).
  void judge(pause::SweepReport& rep, bool interrupted, std::size_t planned) const;

 private:
  friend class Trial;
  std::optional<StatusCounters> status_counters();
  void close_lateness_window(const StatsSnapshot& now);
  void close_rtt_window(const StatsSnapshot& now);

  TrialTarget target_;
  TrialSettings settings_;
  Freezer& freezer_;
  const shm::TableReader& table_;
  ObserverPriority& priority_;
  std::mt19937_64 rng_;
  std::uint64_t guard_ms_;  ///< this trial's; the sweep moves it earlier after a missed pause
  pause::HistogramSnapshot clean_lateness_, clean_rtt_;
  std::optional<StatsSnapshot> lateness_from_, rtt_from_;
};

}  // namespace leasehold::harness
