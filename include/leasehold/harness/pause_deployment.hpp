// leasehold/harness: the deployment a pause-probe measures - lockd, a UDP relay and a supervisor
// started in a temp dir of its own (standalone), or a running supervisor found through its
// control socket, its key file and its lockd (external) - and what the probe prepares beside it:
// the output directory and a stress-ng load. pause/README.md describes both modes.
//
// Errors come back as a Status (or a Result) whose message names the file, the program or the
// address and, where there is one, the fix (DESIGN.md "Errors"); messages name the pause-probe's
// flags, since that is what a user changes. The codes, so that a driver can map them to its exit
// codes in one place:
//   invalid_argument  what the command line points at is wrong (a flag's value, a key file, a
//                     binary that cannot be found, an output directory);
//   timeout           lockd did not start or did not answer with the key;
//   refused           the lockd given is not the one the supervisor uses;
//   not_found         no supervisor can answer (it is stopped);
//   io_error          anything else: a temp dir, a key, the relay, a process that would not start.
#pragma once

#include "leasehold/harness/deployment.hpp"
#include "leasehold/harness/pause_trial.hpp"
#include "leasehold/harness/process.hpp"
#include "leasehold/harness/relay.hpp"
#include "leasehold/lease/result.hpp"
#include "leasehold/pause/model.hpp"
#include "leasehold/wire/address.hpp"
#include "leasehold/wire/auth.hpp"

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace leasehold::harness {

/// How long lockd and the supervisor of a standalone deployment may take to start.
inline constexpr milliseconds kPauseStartTimeout{20'000};
/// External mode: how long lockd may take to answer the probe's signed stats request.
inline constexpr std::uint64_t kLockdCheckTimeoutMs = 1'000;
/// Entries of the output directory's sandbox-logs/ looked at when clearing an earlier run's logs.
inline constexpr std::size_t kLogDirEntriesMax = 100'000;

/// The deployment under test, either started here (standalone) or found through its socket.
/// Stops what it started on destruction, in this order: the supervisor (SIGTERM: it releases
/// its names through the relay) before the relay and lockd, and the temp dir last.
struct PauseDeployment {
  std::optional<TempDir> tmp;                ///< standalone only
  std::unique_ptr<Deployment> run;           ///< standalone: lockd and the supervisor
  std::unique_ptr<UdpRelay> relay;           ///< standalone: between the supervisor and lockd
  std::string socket;                        ///< the supervisor's control socket
  SocketAddress lockd_addr;                  ///< the lockd the probe talks to
  std::optional<wire::WireKey> key;          ///< the cluster key (standalone) or the key file's
  pid_t supervisor_pid = -1;
  std::string shm_path;                      ///< the supervisor's shm table
  pause::Timing timing;                      ///< its timing (its status answer: read_status)
  std::string lockd_text;                    ///< lockd_addr as text, for messages
  std::string status_lockd;                  ///< the lockd address the supervisor itself uses (its status)

  PauseDeployment() = default;
  PauseDeployment(const PauseDeployment&) = delete;
  PauseDeployment& operator=(const PauseDeployment&) = delete;
  ~PauseDeployment();
  /// The standalone temp dir ("" in external mode or before it was made).
  std::string dir() const { return tmp ? tmp->path().string() : std::string(); }
};

/// What start_standalone() runs.
struct StandaloneSpec {
  std::string lockd_bin;       ///< leasehold-lockd; "" when it could not be found
  std::string supervisor_bin;  ///< leasehold-supervisor; "" when it could not be found
  std::string located_from;    ///< the binary next to which they were looked for (for the message)
};

/// ρ as text that reads back to the same double, in its shortest form (std::to_string would
/// print 1e-7 as 0.000000): for the supervisor's command line and for messages.
std::string rho_text(double rho);

/// Starts lockd (ttl d.timing.ttl_ms), a UdpRelay in front of it and a supervisor with
/// d.timing that reaches lockd through the relay, all in a new temp dir d.tmp ("leasehold-pause"
/// prefix) with a cluster key of its own; fills d.run, d.relay, d.key, d.socket, d.shm_path,
/// d.lockd_addr and d.lockd_text. Each start waits up to kPauseStartTimeout; `tick` runs while
/// waiting and may throw (harness::Interrupted) to give up. Errors: invalid_argument "cannot
/// find leasehold-lockd next to SELF nor in $PATH; ..." (a binary of `spec` is ""); timeout (lockd
/// did not print its address in time: its log's tail); io_error (the temp dir, a key, the relay
/// or a start failed). After an error the temp dir is kept and the message ends with
/// "(DIR is kept for inspection)", so the logs it points at still exist.
Status start_standalone(const StandaloneSpec& spec, PauseDeployment& d, const std::function<void()>& tick = {});

/// A probe killed mid-freeze (SIGKILL: no destructor ran) leaves the supervisor frozen in its
/// `leasehold-pause-<pid>` leaf, where it cannot answer status. Finds the process behind control
/// socket `socket` (SO_PEERCRED; only a server of root or of this user) and thaws such a leaf
/// (`warn` says so); a later Freezer recognises the leaf, reuses it and moves the process home.
/// Nothing to do (no server, not frozen) is success: the status request says what is wrong.
/// Errors: not_found when the supervisor is SIGSTOPped (only reported, with the `kill -CONT`
/// to run: its stop may not be ours); io_error when thawing the leaf failed (naming the leaf).
Status recover_left_frozen(const std::string& socket, const std::function<void(const std::string&)>& warn);

/// Timing a driver's flags override in the supervisor's status (to ask "what if the budget
/// were ..."); nullopt: the supervisor's own.
struct StatusOverrides {
  std::optional<double> clock_rate_bound;                 ///< ρ, dimensionless
  std::optional<std::uint64_t> kill_latency_budget_ms;    ///< ms
};

/// Reads the supervisor's `status` answer `answer` (an {"ok":true} one) into `d`: supervisor_pid,
/// shm_path, status_lockd and d.timing (ttl, kill_after, heartbeat interval in ms, the wheel's
/// granularity in ns, ρ and the kill latency budget unless `overrides` has them). Errors:
/// io_error "the supervisor's status answer lacks a field: ..." (a field missing or mistyped).
Status read_status(const nlohmann::json& answer, const StatusOverrides& overrides, PauseDeployment& d);

/// Loads the key file of a running deployment into d.key. Errors: invalid_argument with the
/// loader's message (naming the file) and the fix: the deployment's own key file, or a new one.
Status load_deployment_key(const std::string& path, PauseDeployment& d);

/// External mode, after read_status(): settles the lockd the probe talks to (`lockd`,
/// HOST:PORT) and proves it answers a stats request signed with d.key within
/// kLockdCheckTimeoutMs; fills d.lockd_addr and d.lockd_text. Without lockd's answers every
/// lockd-side observation of a trial (its expiry, the contender's grant) would be missing and a
/// trial would look safe for lack of evidence, hence the errors: invalid_argument (`lockd` is
/// not a numeric HOST:PORT); refused (the supervisor's status names another lockd); timeout
/// (no answer: not running there, or another key).
Status settle_lockd(const std::string& lockd, PauseDeployment& d);

/// The trials' view of `d`: its lockd, key, relay and timing, with the driver's `request` (to the
/// supervisor's control socket) and `sandbox_argv` (TrialTarget). `d` must outlive the target.
TrialTarget trial_target(PauseDeployment& d, ControlRequest request, std::vector<std::string> sandbox_argv);

/// Creates the output directory `out` ("": pause-probe-YYYYmmdd-HHMMSS, local time, in the
/// working directory) with its parents, and OUT/sandbox-logs (mode 1777: an isolated sandbox runs
/// as a uid of the supervisor's range and writes its log there), refuses a path
/// that is not a directory or cannot be written, and removes what an earlier run of the probe
/// left there (sandbox-* logs, at most kLogDirEntriesMax entries looked at; its plots and gnuplot
/// files), so every file in it comes from this run. `out` becomes absolute; `log_dir` is set to
/// OUT/sandbox-logs. Errors: invalid_argument naming the path and why.
Status prepare_out_dir(std::string& out, std::string& log_dir);

/// What start_stress() runs.
struct StressSpec {
  std::string args;                  ///< stress-ng's arguments, split at white space
  std::uint64_t timeout_s = 0;       ///< its --timeout (s); 0: an estimate of the sweep's length
  std::vector<std::uint64_t> plan;   ///< the sweep's pauses (ms), for the estimate
  pause::Timing timing;              ///< the deployment's timing, for the estimate
  std::string log;                   ///< stdout and stderr of stress-ng
};

/// Starts stress-ng in `stress` (bounded by its --timeout; SIGKILLed if this process dies) and
/// returns its command line as text; "" without starting anything when stress-ng is not
/// installed (`warn` says so). Errors: io_error when the spawn failed (its message).
Result<std::string> start_stress(const StressSpec& spec, Process& stress,
                                 const std::function<void(const std::string&)>& warn);

}  // namespace leasehold::harness
