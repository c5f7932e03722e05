// leasehold/supervisor: the rt thread — owner of the deadline wheel and of the kill-switch.
//
// DESIGN.md "The supervisor" and issue 6: SCHED_FIFO (configurable priority), mlockall, pinned to
// a configurable CPU. It sleeps with clock_nanosleep(CLOCK_BOOTTIME, TIMER_ABSTIME) to the wheel's
// next event (the tick of the earliest deadline), but never longer than `command_poll_ns`, so
// commands from the io thread (kill_now above all) are applied promptly; each wake-up it beats the
// shm writer heartbeat, records its wake-up lateness, applies commands, and advances the wheel.
// An idle wheel therefore costs 1/command_poll_ns wake-ups per second, not one per tick. When a deadline comes due it re-reads the slot's current deadline (lazy
// re-arm: heartbeats move deadlines in shm without telling this thread) and either re-arms, or
// (1) revokes the slot in shm, (2) kills via KillSwitch, (3) confirms death (waiting in ppoll on the
// pidfds / cgroup.events of pending kills instead of a plain sleep, so the confirmation time is
// precise), recording deadline → issued → confirmed.
//
// Nothing on this path allocates, logs or shares a lock with the io thread. Commands arrive through
// a bounded wait-free single-producer/single-consumer queue (boost::lockfree::spsc_queue). The
// shm table and stats are not known here: they are injected as plain function pointers (`RtHooks`).
// The logic of each wake-up is RtCore's (rt_core.hpp: wheel, commands, kill decisions, death
// confirmation); this class is the thread around it: it reads CLOCK_BOOTTIME once per wake-up,
// calls RtCore::step, and sleeps; it kills through KillSwitchPath.
//
// Threads: `arm`, `disarm`, `kill_now`, `applied`, `counters` are for ONE producer thread (the io
// thread); everything else runs on the rt thread. The first process of a sandbox must not be
// reaped, nor its fds closed, until its disarm was applied (see kill_switch.hpp).
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/supervisor/rt_core.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace leasehold {

/// Slots the rt thread can track (slot indices 0..slots-1; the shm table's slot count).
inline constexpr std::uint32_t kRtSlotsMax = 1u << 20;
/// Commands in flight from the io thread; a full queue is refused, never waited on.
inline constexpr std::uint32_t kRtCommandQueueCapacity = 4096;
/// ppoll wake-ups per tick while kills are pending (bounds a misbehaving fd).
inline constexpr std::uint32_t kRtWaitsPerTickMax = 64;
/// Default longest sleep between wake-ups: the bound on how late a queued command (kill_now,
/// disarm, stop) is applied, and the shm writer heartbeat period when the wheel is idle.
inline constexpr std::uint64_t kRtCommandPollNs = 5'000'000;

/// The system calls set-up makes, replaceable so tests can inject failures. Each acts on the
/// calling thread and returns 0 or -errno.
struct RtSystem {
  int (*set_fifo)(int priority) = nullptr;  ///< SCHED_FIFO | SCHED_RESET_ON_FORK
  int (*lock_memory)() = nullptr;           ///< mlockall(MCL_CURRENT | MCL_FUTURE)
  int (*pin_to_cpu)(int cpu) = nullptr;     ///< sched_setaffinity to one CPU
  static RtSystem real() noexcept;
};

struct RtConfig {
  std::uint32_t slots = 1024;                 ///< 1..kRtSlotsMax
  std::uint64_t granularity_ns = 1'000'000;   ///< the wheel's tick (enters the safety condition)
  /// Longest sleep between wake-ups (>= 1; values below granularity_ns wake every tick). A
  /// command waits at most this long; a deadline armed less than this far ahead can fire up to
  /// this late (the supervisor arms at >= kill_after ahead; kill_now is the prompt path).
  std::uint64_t command_poll_ns = kRtCommandPollNs;
  int priority = 50;                          ///< SCHED_FIFO priority 1..99; 0 = do not ask
  int cpu = -1;                               ///< CPU to pin to; -1 = no pinning
  bool lock_memory = true;                    ///< mlockall
  RtSystem system = RtSystem::real();
};

/// What set-up achieved. The rt thread never logs: the daemon prints `warnings()`.
struct RtStartStatus {
  bool fifo = false;
  int fifo_error = 0;  ///< -errno when SCHED_FIFO was asked for and refused
  bool memory_locked = false;
  int lock_error = 0;
  bool pinned = false;
  int pin_error = 0;
  /// Empty when everything asked for is in place; otherwise one loud line per shortfall, e.g.
  /// "WARNING: rt thread runs at normal priority: SCHED_FIFO 50 refused (Operation not permitted);
  /// kill deadlines can be late under load".
  std::string warnings(const RtConfig& config) const;
};

/// Why a command was not queued.
enum class RtRefusal : std::uint8_t { none = 0, queue_full, bad_slot, stopped };
const char* describe(RtRefusal refusal) noexcept;

struct RtSubmitted {
  std::uint64_t seq = 0;  ///< pass to applied(); 0 when refused
  RtRefusal refusal = RtRefusal::none;
  explicit operator bool() const noexcept { return refusal == RtRefusal::none; }
};

class RtThread {
 public:
  /// Validates `config` (slots, granularity, priority range, the CPU exists), builds the wheel,
  /// starts the thread and waits for its set-up: the running thread (`status` says what
  /// set-up achieved), or invalid_argument naming the bad parameter.
  static Result<std::unique_ptr<RtThread>> start(const RtConfig& config, const RtHooks& hooks,
                                                 RtStartStatus& status);
  ~RtThread();  ///< stop() + join
  RtThread(const RtThread&) = delete;
  RtThread& operator=(const RtThread&) = delete;

  /// Stops the loop (within one command_poll_ns) and joins. Idempotent; producer thread only.
  void stop() noexcept;

  /// Arms (or re-arms) `slot` to be killed at `deadline_ns` unless extended (lazy re-arm).
  RtSubmitted arm(std::uint32_t slot, std::uint64_t deadline_ns, const KillTarget& target) noexcept;
  /// Disarms `slot`: no kill will be issued for it after this is applied.
  RtSubmitted disarm(std::uint32_t slot) noexcept;
  /// Kills an armed slot at once, ignoring its deadline (mutex-violation recovery, DESIGN.md).
  /// No effect on a slot that is not armed (arm it first: the kill needs its KillTarget).
  RtSubmitted kill_now(std::uint32_t slot) noexcept;
  /// True once the command with this seq (and every earlier one) has been applied.
  bool applied(std::uint64_t seq) const noexcept;

  RtCounters counters() const noexcept;
  std::uint64_t granularity_ns() const noexcept { return granularity_ns_; }

 private:
  struct Impl;
  RtThread() = default;
  RtSubmitted submit(RtOp op, std::uint32_t slot, std::uint64_t deadline_ns,
                     const KillTarget& target) noexcept;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::uint64_t next_seq_ = 1;  // producer-owned
  std::uint32_t slots_ = 0;
  std::uint64_t granularity_ns_ = 0;
  bool stopped_ = false;
};

}  // namespace leasehold
