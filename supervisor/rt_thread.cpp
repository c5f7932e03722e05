// leasehold/supervisor: the rt thread (see rt_thread.hpp).
#include "leasehold/supervisor/rt_thread.hpp"

#include <boost/lockfree/spsc_queue.hpp>

#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace leasehold {
namespace {

// Stack the rt loop may touch (it calls into the kernel and the hooks, never deep recursion).
constexpr std::size_t kRtStackPrefaultBytes = 64 * 1024;

enum Op : std::uint8_t { kArm = 1, kDisarm, kKillNow };

struct RtCommand {
  std::uint64_t seq = 0;
  std::uint64_t deadline_ns = 0;
  KillTarget target;
  std::uint32_t slot = 0;
  std::uint8_t op = 0;
};

int real_set_fifo(int priority) {
  sched_param p{};
  p.sched_priority = priority;
  // SCHED_RESET_ON_FORK: a process started from this thread must not inherit SCHED_FIFO.
  return ::sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &p) == 0 ? 0 : -errno;
}

int real_lock_memory() { return ::mlockall(MCL_CURRENT | MCL_FUTURE) == 0 ? 0 : -errno; }

int real_pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return ::sched_setaffinity(0, sizeof set, &set) == 0 ? 0 : -errno;
}

timespec to_timespec(std::uint64_t ns) {
  return timespec{static_cast<time_t>(ns / 1'000'000'000ull), static_cast<long>(ns % 1'000'000'000ull)};
}

}  // namespace

RtSystem RtSystem::real() noexcept { return RtSystem{real_set_fifo, real_lock_memory, real_pin_to_cpu}; }

const char* describe(RtRefusal refusal) noexcept {
  switch (refusal) {
    case RtRefusal::none: return "ok";
    case RtRefusal::queue_full: return "rt command queue full: retry after the rt thread drains it";
    case RtRefusal::bad_slot: return "slot index out of range";
    case RtRefusal::stopped: return "rt thread stopped";
  }
  return "unknown";
}

std::string RtStartStatus::warnings(const RtConfig& config) const {
  std::string out;
  if (config.priority > 0 && !fifo) {
    out += "WARNING: rt thread runs at normal priority: SCHED_FIFO " + std::to_string(config.priority) +
           " refused (" + std::strerror(-fifo_error) + "); kill deadlines can be late under load\n";
  }
  if (config.lock_memory && !memory_locked) {
    out += std::string("WARNING: mlockall failed (") + std::strerror(-lock_error) +
           "); a page fault can delay the kill-switch\n";
  }
  if (config.cpu >= 0 && !pinned) {
    out += "WARNING: rt thread not pinned to CPU " + std::to_string(config.cpu) + " (" +
           std::strerror(-pin_error) + ")\n";
  }
  return out;
}

struct SlotState {
  TimerHandle handle;
  KillTarget target;
  std::uint64_t deadline_ns = 0;
  KillRecord record;
  bool armed = false;
  bool kill_pending = false;
};

struct RtThread::Impl {
  Impl(const RtConfig& c, const RtHooks& h)
      : config(c), hooks(h), wheel(c.slots, c.granularity_ns, KillSwitch::now_ns()), slots(c.slots) {
    pending.reserve(kRtPendingKillsMax);
    pollfds.resize(kRtPendingKillsMax);
  }

  RtConfig config;
  RtHooks hooks;
  DeadlineWheel wheel;
  std::vector<SlotState> slots;
  std::vector<std::uint32_t> pending;  // slots with a kill awaiting confirmation (<= kRtPendingKillsMax)
  std::vector<pollfd> pollfds;
  boost::lockfree::spsc_queue<RtCommand, boost::lockfree::capacity<kRtCommandQueueCapacity>> queue;

  std::atomic<bool> stop{false};
  std::atomic<bool> ready{false};
  RtStartStatus status;
  std::atomic<std::uint64_t> applied_seq{0};
  std::atomic<std::uint64_t> ticks{0}, rearms{0}, kills_issued{0}, kills_confirmed{0};
  std::atomic<std::uint64_t> kill_issue_latency_ns_max{0};  // written by the rt thread only
  std::atomic<std::uint64_t> processed_until_ns{0};

  void set_up() {
    if (config.cpu >= 0) {
      status.pin_error = config.system.pin_to_cpu ? config.system.pin_to_cpu(config.cpu) : -ENOSYS;
      status.pinned = status.pin_error == 0;
    }
    if (config.priority > 0) {
      status.fifo_error = config.system.set_fifo ? config.system.set_fifo(config.priority) : -ENOSYS;
      status.fifo = status.fifo_error == 0;
    }
    if (config.lock_memory) {
      status.lock_error = config.system.lock_memory ? config.system.lock_memory() : -ENOSYS;
      status.memory_locked = status.lock_error == 0;
      if (status.memory_locked) prefault_stack();
    }
  }

  // With MCL_FUTURE the stack pages are locked once touched: touch the depth the loop may use
  // now, so the first deadline does not page-fault.
  static void prefault_stack() {
    volatile unsigned char stack[kRtStackPrefaultBytes];
    for (std::size_t i = 0; i < sizeof stack; i += 4096) stack[i] = 0;
  }

  void report(std::uint32_t slot, const KillRecord& rec) {
    if (rec.confirmed_ns != 0) kills_confirmed.fetch_add(1, std::memory_order_relaxed);
    if (hooks.record_kill) hooks.record_kill(hooks.context, slot, rec);
  }

  void drop_pending(std::size_t index) {
    slots[pending[index]].kill_pending = false;
    pending[index] = pending.back();
    pending.pop_back();
  }

  // Finishes a pending kill of `slot` (if any) without waiting: reported with `error` unless
  // death can be confirmed right now.
  void finish_pending(std::uint32_t slot, int error, std::uint64_t now) {
    for (std::size_t i = 0; i < pending.size(); ++i) {
      if (pending[i] != slot) continue;
      SlotState& s = slots[slot];
      if (KillSwitch::confirm_dead(s.target) == 1) {
        s.record.confirmed_ns = now;
      } else {
        s.record.error = error;
      }
      report(slot, s.record);
      drop_pending(i);
      return;
    }
  }

  void kill_slot(std::uint32_t slot, std::uint64_t deadline_ns) {
    SlotState& s = slots[slot];
    if (hooks.revoke_slot) hooks.revoke_slot(hooks.context, slot);
    s.record = KillSwitch::kill(s.target, deadline_ns);
    s.armed = false;
    s.handle = TimerHandle{};
    kills_issued.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t issue_latency_ns = s.record.issued_ns > deadline_ns ? s.record.issued_ns - deadline_ns : 0;
    if (issue_latency_ns > kill_issue_latency_ns_max.load(std::memory_order_relaxed))
      kill_issue_latency_ns_max.store(issue_latency_ns, std::memory_order_relaxed);
    if (hooks.record_kill_issued) hooks.record_kill_issued(hooks.context, slot, s.record);
    if (s.record.path == KillPath::none) {
      report(slot, s.record);  // nothing delivered: the error says why
      return;
    }
    if (KillSwitch::confirm_dead(s.target) == 1) {
      s.record.confirmed_ns = KillSwitch::now_ns();
      report(slot, s.record);
      return;
    }
    if (pending.size() >= kRtPendingKillsMax) {
      s.record.error = -ENOSPC;
      report(slot, s.record);
      return;
    }
    s.kill_pending = true;
    pending.push_back(slot);
  }

  void confirm_pending(std::uint64_t now) {
    for (std::size_t i = 0; i < pending.size();) {
      SlotState& s = slots[pending[i]];
      const int dead = KillSwitch::confirm_dead(s.target);
      if (dead == 1) {
        s.record.confirmed_ns = now;
      } else if (dead < 0) {
        s.record.error = dead;
      } else if (now - s.record.issued_ns > kRtKillConfirmTimeoutNs) {
        s.record.error = -ETIMEDOUT;
      } else {
        ++i;
        continue;
      }
      report(pending[i], s.record);
      drop_pending(i);
    }
  }

  void apply(const RtCommand& c, std::uint64_t now) {
    SlotState& s = slots[c.slot];
    switch (c.op) {
      case kArm:
        if (s.kill_pending) finish_pending(c.slot, -ECANCELED, now);
        s.target = c.target;
        s.deadline_ns = c.deadline_ns;
        if (s.armed && wheel.reschedule(s.handle, c.deadline_ns) == WheelError::none) break;
        {
          const auto r = wheel.schedule(c.deadline_ns, c.slot);
          // The wheel has one node per slot, so it cannot be full; stay safe if it were.
          if (!r) {
            kill_slot(c.slot, c.deadline_ns);
            break;
          }
          s.handle = r.handle;
          s.armed = true;
        }
        break;
      case kDisarm:
        if (s.armed) wheel.cancel(s.handle);
        s.armed = false;
        s.handle = TimerHandle{};
        if (s.kill_pending) finish_pending(c.slot, -ECANCELED, now);
        s.target = KillTarget{};
        break;
      case kKillNow:
        if (s.armed) {
          wheel.cancel(s.handle);
          kill_slot(c.slot, now);
        }
        break;
      default:
        break;
    }
  }

  // Sleeps until `tick_ns`; while kills are pending, waits in ppoll on their fds instead, so a
  // death is confirmed when it happens rather than at the next tick.
  std::uint64_t wait_for(std::uint64_t tick_ns) {
    std::uint32_t waits = 0;
    for (;;) {
      std::uint64_t now = KillSwitch::now_ns();
      if (now >= tick_ns) return now;
      if (pending.empty() || waits >= kRtWaitsPerTickMax) {
        const timespec ts = to_timespec(tick_ns);
        while (::clock_nanosleep(CLOCK_BOOTTIME, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
        }
        continue;
      }
      ++waits;
      const std::size_t n = pending.size();
      for (std::size_t i = 0; i < n; ++i) {
        const KillTarget& t = slots[pending[i]].target;
        pollfds[i] = t.cgroup_events_fd >= 0 ? pollfd{t.cgroup_events_fd, POLLPRI, 0}
                                             : pollfd{t.pidfd, POLLIN, 0};
      }
      const timespec rel = to_timespec(tick_ns - now);
      ::ppoll(pollfds.data(), n, &rel, nullptr);
      confirm_pending(KillSwitch::now_ns());
    }
  }

  // When to wake next: the wheel's next event (never before its next tick), but no later than
  // command_poll_ns after the last wake-up, and at the next tick while commands are queued or
  // kills await confirmation (their timeouts are checked each wake-up).
  std::uint64_t wake_at(std::uint64_t last_wake_ns) const noexcept {
    const std::uint64_t tick_ns = wheel.next_tick_ns();
    if (!pending.empty() || queue.read_available() != 0) return tick_ns;
    const std::uint64_t poll_ns = last_wake_ns + config.command_poll_ns;
    return std::max(tick_ns, std::min(wheel.next_event_ns(), poll_ns));
  }

  void run() {
    std::uint64_t last_wake_ns = KillSwitch::now_ns();
    for (;;) {
      const std::uint64_t wake_ns = wake_at(last_wake_ns);
      const std::uint64_t now = wait_for(wake_ns);
      last_wake_ns = now;
      if (hooks.writer_heartbeat) hooks.writer_heartbeat(hooks.context, now);
      if (hooks.record_lateness) hooks.record_lateness(hooks.context, now - wake_ns);
      ticks.fetch_add(1, std::memory_order_relaxed);
      if (stop.load(std::memory_order_acquire)) break;

      RtCommand c;
      for (std::uint32_t i = 0; i < kRtCommandsPerTickMax && queue.pop(c); ++i) {
        apply(c, now);
        applied_seq.store(c.seq, std::memory_order_release);
      }
      wheel.advance(now, [&](const DueTimer& due) -> Rearm {
        const auto slot = static_cast<std::uint32_t>(due.payload);
        SlotState& s = slots[slot];
        if (!s.armed || s.handle != due.handle) return Rearm::none();
        std::uint64_t deadline = due.deadline_ns;
        if (hooks.current_deadline_ns) {
          const std::uint64_t current = hooks.current_deadline_ns(hooks.context, slot);
          if (current > deadline && !wheel.due_by(current, now)) {
            s.deadline_ns = current;
            rearms.fetch_add(1, std::memory_order_relaxed);
            return Rearm::at(current);
          }
          if (current > deadline) deadline = current;
        }
        kill_slot(slot, deadline);
        return Rearm::none();
      });
      confirm_pending(KillSwitch::now_ns());
      processed_until_ns.store(wheel.next_tick_ns(), std::memory_order_release);
    }
    // Leaving: report kills still unconfirmed, so none is lost from the stats.
    const std::uint64_t now = KillSwitch::now_ns();
    while (!pending.empty()) {
      const std::uint32_t slot = pending.back();
      finish_pending(slot, -ECANCELED, now);
    }
  }
};

std::unique_ptr<RtThread> RtThread::start(const RtConfig& config, const RtHooks& hooks,
                                          RtStartStatus& status, std::string& error) {
  if (config.slots == 0 || config.slots > kRtSlotsMax) {
    error = "rt slots " + std::to_string(config.slots) + " out of range 1.." + std::to_string(kRtSlotsMax);
    return nullptr;
  }
  if (config.granularity_ns == 0) {
    error = "rt granularity_ns must be at least 1";
    return nullptr;
  }
  if (config.command_poll_ns == 0) {
    error = "rt command_poll_ns must be at least 1";
    return nullptr;
  }
  if (config.priority < 0 || config.priority > 99) {
    error = "SCHED_FIFO priority " + std::to_string(config.priority) + " out of range 1..99 (0 = normal priority)";
    return nullptr;
  }
  if (config.cpu >= 0) {
    const long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
    if (config.cpu >= cpus || config.cpu >= CPU_SETSIZE) {
      error = "CPU " + std::to_string(config.cpu) + " does not exist (this host has CPUs 0.." +
              std::to_string(cpus - 1) + ")";
      return nullptr;
    }
  }
  std::unique_ptr<RtThread> t(new RtThread());
  t->impl_ = std::make_unique<Impl>(config, hooks);
  t->slots_ = config.slots;
  t->granularity_ns_ = config.granularity_ns;
  Impl* impl = t->impl_.get();
  t->thread_ = std::thread([impl] {
    impl->set_up();
    impl->ready.store(true, std::memory_order_release);
    impl->ready.notify_one();
    impl->run();
  });
  impl->ready.wait(false, std::memory_order_acquire);
  status = impl->status;
  return t;
}

RtThread::~RtThread() { stop(); }

void RtThread::stop() noexcept {
  if (stopped_) return;
  stopped_ = true;
  impl_->stop.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

RtSubmitted RtThread::submit(std::uint8_t op, std::uint32_t slot, std::uint64_t deadline_ns,
                             const KillTarget& target) noexcept {
  if (stopped_) return {0, RtRefusal::stopped};
  if (slot >= slots_) return {0, RtRefusal::bad_slot};
  RtCommand c;
  c.seq = next_seq_;
  c.deadline_ns = deadline_ns;
  c.target = target;
  c.slot = slot;
  c.op = op;
  if (!impl_->queue.push(c)) return {0, RtRefusal::queue_full};
  ++next_seq_;
  return {c.seq, RtRefusal::none};
}

RtSubmitted RtThread::arm(std::uint32_t slot, std::uint64_t deadline_ns, const KillTarget& target) noexcept {
  return submit(kArm, slot, deadline_ns, target);
}
RtSubmitted RtThread::disarm(std::uint32_t slot) noexcept { return submit(kDisarm, slot, 0, KillTarget{}); }
RtSubmitted RtThread::kill_now(std::uint32_t slot) noexcept { return submit(kKillNow, slot, 0, KillTarget{}); }

bool RtThread::applied(std::uint64_t seq) const noexcept {
  return impl_->applied_seq.load(std::memory_order_acquire) >= seq;
}

RtCounters RtThread::counters() const noexcept {
  RtCounters c;
  c.ticks = impl_->ticks.load(std::memory_order_relaxed);
  c.rearms = impl_->rearms.load(std::memory_order_relaxed);
  c.kills_issued = impl_->kills_issued.load(std::memory_order_relaxed);
  c.kills_confirmed = impl_->kills_confirmed.load(std::memory_order_relaxed);
  c.kill_issue_latency_ns_max = impl_->kill_issue_latency_ns_max.load(std::memory_order_relaxed);
  c.processed_until_ns = impl_->processed_until_ns.load(std::memory_order_acquire);
  return c;
}

}  // namespace leasehold
