// leasehold/supervisor: the rt thread's logic without the thread — the deadline wheel, the arm /
// disarm / kill-now commands, the kill decisions (lazy re-arm or kill), death confirmation and
// the lateness accounting, as one class driven by its caller's clock.
//
// RtCore reads no clock, makes no system call and starts no thread: every input carries its
// time (`now_ns`, CLOCK_BOOTTIME domain), commands come from an RtCommandSource, and kills go
// through an RtKillPath port. Production: RtThread (rt_thread.hpp) reads CLOCK_BOOTTIME once per
// wake-up, calls step(), sleeps (clock_nanosleep / ppoll on the pending kills' fds) until
// next_wake_ns(), and kills through KillSwitchPath (cgroup.kill + pidfd). A simulator or a test
// drives the same class with a scripted clock and a recording kill path.
//
// One wake-up (step):
//   1. writer heartbeat (hooks.writer_heartbeat(now)), lateness (hooks.record_lateness(now - woke_for)),
//   2. up to kRtCommandsPerTickMax commands applied in order (arm, disarm, kill_now),
//   3. the wheel advanced to `now`: each due slot re-reads its current deadline
//      (hooks.current_deadline_ns, the lazy re-arm); a later one not yet due re-arms, otherwise
//      (1) hooks.revoke_slot, (2) RtKillPath::kill, (3) death checked at once, else kept pending,
//   4. pending kills checked: confirmed dead, failed (-errno), or timed out after
//      kRtKillConfirmTimeoutNs (-ETIMEDOUT); each kill is reported once (hooks.record_kill).
// Bounds: at most `slots` armed slots, kRtPendingKillsMax kills awaiting death (beyond: -ENOSPC),
// kRtCommandsPerTickMax commands per step. Nothing allocates after construction.
// Invariants (LEASEHOLD_ASSERT, every build): the `now_ns` of step, apply, confirm_pending and
// finish_all never goes below the previous call's (nor the constructor's); a command's slot is
// < slots; step takes commands in seq order 1, 2, ... with none skipped.
#pragma once

#include "leasehold/supervisor/deadline_wheel.hpp"
#include "leasehold/supervisor/kill_switch.hpp"

#include <atomic>
#include <cstdint>
#include <vector>

namespace leasehold {

/// Commands applied per step, so a burst cannot delay the wheel by more than this many.
inline constexpr std::uint32_t kRtCommandsPerTickMax = 1024;
/// Kills whose death is awaited at once; beyond that they are reported unconfirmed (-ENOSPC).
inline constexpr std::uint32_t kRtPendingKillsMax = 256;
/// How long death is awaited before the kill is reported unconfirmed (-ETIMEDOUT).
inline constexpr std::uint64_t kRtKillConfirmTimeoutNs = 5'000'000'000;

/// Hooks into the shm table and stats (written elsewhere). All optional; all called from step()
/// (the rt thread in production), so they must not block, allocate or log.
struct RtHooks {
  void* context = nullptr;
  /// Lazy re-arm: the slot's current deadline (CLOCK_BOOTTIME ns). A later deadline than the
  /// one that fired re-arms; an equal or earlier one (or 0) lets the kill proceed. Null: the
  /// deadline given to arm() is final.
  std::uint64_t (*current_deadline_ns)(void* context, std::uint32_t slot) = nullptr;
  /// Step (1): revoke the slot in shm so the sandbox's own checks refuse from now on.
  void (*revoke_slot)(void* context, std::uint32_t slot) = nullptr;
  /// Each wake-up's lateness (ns after the time it slept to).
  void (*record_lateness)(void* context, std::uint64_t lateness_ns) = nullptr;
  /// Writer liveness (DESIGN.md "The shared-memory epoch table": readers treat a stale writer as
  /// all invalid): called at every wake-up with the wake-up time (CLOCK_BOOTTIME ns), so at least
  /// every RtConfig::command_poll_ns while the thread runs. A stuck rt thread stops beating.
  void (*writer_heartbeat)(void* context, std::uint64_t now_ns) = nullptr;
  /// Each kill when it has been issued (step 2 done: record.issued_ns set, confirmed_ns 0),
  /// before death is awaited; record_kill follows once for the same kill.
  void (*record_kill_issued)(void* context, std::uint32_t slot, const KillRecord& record) = nullptr;
  /// Each kill, once: when death was confirmed, or with confirmed_ns == 0 and an error
  /// (-ETIMEDOUT, -ECANCELED if disarmed first, -ENOSPC if too many were pending).
  void (*record_kill)(void* context, std::uint32_t slot, const KillRecord& record) = nullptr;
};

/// The rt thread's kill path (the port RtCore kills through). Must not block, allocate or log.
class RtKillPath {
 public:
  virtual ~RtKillPath() = default;
  /// Delivers the kill of `target`, whose deadline (or kill-now request time) was `deadline_ns`;
  /// the record has issued_ns set (path none and an error when nothing could be delivered).
  virtual KillRecord kill(const KillTarget& target, std::uint64_t deadline_ns) noexcept = 0;
  /// Non-blocking death check: 1 dead, 0 still alive, -errno if it cannot tell.
  virtual int confirm_dead(const KillTarget& target) noexcept = 0;
};

/// Production kill path: KillSwitch (cgroup.kill, else pidfd_send_signal + kill(-pgid)).
class KillSwitchPath final : public RtKillPath {
 public:
  KillRecord kill(const KillTarget& target, std::uint64_t deadline_ns) noexcept override {
    return KillSwitch::kill(target, deadline_ns);
  }
  int confirm_dead(const KillTarget& target) noexcept override { return KillSwitch::confirm_dead(target); }
};

enum class RtOp : std::uint8_t { arm = 1, disarm, kill_now };

/// One command for the rt core (queued by the io thread in production).
struct RtCommand {
  std::uint64_t seq = 0;          ///< 1, 2, ...: applied_seq() reaches it once applied
  std::uint64_t deadline_ns = 0;  ///< arm: the deadline
  KillTarget target;              ///< arm: what to kill
  std::uint32_t slot = 0;         ///< < slots (the caller checks; RtCore aborts otherwise)
  RtOp op = RtOp::arm;
};

/// Where step() takes its commands from (production: the wait-free queue from the io thread).
class RtCommandSource {
 public:
  virtual ~RtCommandSource() = default;
  /// The next command, or false if none is queued. Must not block.
  virtual bool pop(RtCommand& out) noexcept = 0;
};

/// Counters for status displays (relaxed atomics; the shm stats are the real record).
struct RtCounters {
  std::uint64_t ticks = 0;  ///< wake-ups (one per wheel event or command poll, not per tick)
  std::uint64_t rearms = 0;
  std::uint64_t kills_issued = 0;
  std::uint64_t kills_confirmed = 0;
  std::uint64_t kill_issue_latency_ns_max = 0;  ///< max over issued kills of issued_ns - deadline_ns
  std::uint64_t processed_until_ns = 0;  ///< every deadline below this has been handled
};

class RtCore {
 public:
  /// `slots` 1..kRtSlotsMax, `granularity_ns` and `command_poll_ns` >= 1 (RtThread::start checks
  /// them); `now_ns` is the wheel's start. `kill` must outlive the core.
  RtCore(std::uint32_t slots, std::uint64_t granularity_ns, std::uint64_t command_poll_ns, const RtHooks& hooks,
         RtKillPath& kill, std::uint64_t now_ns);
  RtCore(const RtCore&) = delete;
  RtCore& operator=(const RtCore&) = delete;

  /// One wake-up at `now_ns` that slept to `woke_for_ns` (see the header comment for the order).
  void step(std::uint64_t now_ns, std::uint64_t woke_for_ns, RtCommandSource& commands) noexcept;
  /// When to wake next (CLOCK_BOOTTIME ns): the wheel's next event (never before its next tick),
  /// no later than command_poll_ns after `last_wake_ns`, and at the next tick while commands are
  /// queued or kills await confirmation (their timeouts are checked each wake-up).
  std::uint64_t next_wake_ns(std::uint64_t last_wake_ns, bool commands_queued) const noexcept;
  /// Checks the pending kills at `now_ns` (also between wake-ups, when one of their fds fired).
  void confirm_pending(std::uint64_t now_ns) noexcept;
  /// Leaving: reports every kill still unconfirmed (-ECANCELED unless death is seen now).
  void finish_all(std::uint64_t now_ns) noexcept;
  /// Applies one command at `now_ns` (step applies the queued ones).
  void apply(const RtCommand& c, std::uint64_t now_ns) noexcept;

  /// Kills awaiting death, and the i-th one's target (for the caller's ppoll on its fds).
  std::size_t pending_kills() const noexcept { return pending_.size(); }
  const KillTarget& pending_target(std::size_t i) const noexcept { return slots_[pending_[i]].target; }
  /// Every command up to this seq has been applied.
  std::uint64_t applied_seq() const noexcept { return applied_seq_.load(std::memory_order_acquire); }
  /// Readable from any thread.
  RtCounters counters() const noexcept;
  bool armed(std::uint32_t slot) const noexcept { return slots_[slot].armed; }

 private:
  struct SlotState {
    TimerHandle handle;
    KillTarget target;
    std::uint64_t deadline_ns = 0;
    KillRecord record;
    bool armed = false;
    bool kill_pending = false;
  };
  void report(std::uint32_t slot, const KillRecord& rec) noexcept;
  void drop_pending(std::size_t index) noexcept;
  void finish_pending(std::uint32_t slot, int error, std::uint64_t now_ns) noexcept;
  void kill_slot(std::uint32_t slot, std::uint64_t deadline_ns, std::uint64_t now_ns) noexcept;
  void clock(std::uint64_t now_ns) noexcept;  // asserts now_ns never goes backwards

  std::uint64_t command_poll_ns_;
  RtHooks hooks_;
  RtKillPath& kill_;
  DeadlineWheel wheel_;
  std::vector<SlotState> slots_;
  std::vector<std::uint32_t> pending_;  // slots with a kill awaiting confirmation (<= kRtPendingKillsMax)
  std::atomic<std::uint64_t> applied_seq_{0};
  std::atomic<std::uint64_t> ticks_{0}, rearms_{0}, kills_issued_{0}, kills_confirmed_{0};
  std::atomic<std::uint64_t> kill_issue_latency_ns_max_{0};  // written by step() only
  std::atomic<std::uint64_t> processed_until_ns_{0};
  std::uint64_t last_now_ns_;  // the latest now_ns of any entry point (CLOCK_BOOTTIME)
};

}  // namespace leasehold
