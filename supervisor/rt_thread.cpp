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

struct RtThread::Impl final : RtCommandSource {
  Impl(const RtConfig& c, const RtHooks& h, std::uint64_t now_ns)
      : config(c), core(c.slots, c.granularity_ns, c.command_poll_ns, h, kill_path, now_ns) {
    pollfds.resize(kRtPendingKillsMax);
  }

  RtConfig config;
  KillSwitchPath kill_path;
  RtCore core;
  std::vector<pollfd> pollfds;
  boost::lockfree::spsc_queue<RtCommand, boost::lockfree::capacity<kRtCommandQueueCapacity>> queue;

  std::atomic<bool> stop{false};
  std::atomic<bool> ready{false};
  RtStartStatus status;

  bool pop(RtCommand& out) noexcept override { return queue.pop(out); }

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

  // Sleeps until `tick_ns`; while kills are pending, waits in ppoll on their fds instead, so a
  // death is confirmed when it happens rather than at the next tick. Returns the clock at wake-up.
  std::uint64_t wait_for(std::uint64_t tick_ns) {
    std::uint32_t waits = 0;
    for (;;) {
      std::uint64_t now = KillSwitch::now_ns();
      if (now >= tick_ns) return now;
      const std::size_t n = core.pending_kills();
      if (n == 0 || waits >= kRtWaitsPerTickMax) {
        const timespec ts = to_timespec(tick_ns);
        while (::clock_nanosleep(CLOCK_BOOTTIME, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
        }
        continue;
      }
      ++waits;
      for (std::size_t i = 0; i < n; ++i) {
        const KillTarget& t = core.pending_target(i);
        pollfds[i] = t.cgroup_events_fd >= 0 ? pollfd{t.cgroup_events_fd, POLLPRI, 0}
                                             : pollfd{t.pidfd, POLLIN, 0};
      }
      const timespec rel = to_timespec(tick_ns - now);
      ::ppoll(pollfds.data(), n, &rel, nullptr);
      core.confirm_pending(KillSwitch::now_ns());
    }
  }

  void run() {
    std::uint64_t last_wake_ns = KillSwitch::now_ns();
    for (;;) {
      const std::uint64_t wake_ns = core.next_wake_ns(last_wake_ns, queue.read_available() != 0);
      const std::uint64_t now = wait_for(wake_ns);  // the one clock read of this wake-up
      last_wake_ns = now;
      // Stopping: commands still queued are not applied (the io thread let go of their sandboxes).
      if (stop.load(std::memory_order_acquire)) break;
      core.step(now, wake_ns, *this);
    }
    // Leaving: report kills still unconfirmed, so none is lost from the stats.
    core.finish_all(KillSwitch::now_ns());
  }
};

Result<std::unique_ptr<RtThread>> RtThread::start(const RtConfig& config, const RtHooks& hooks,
                                                  RtStartStatus& status) {
  if (config.slots == 0 || config.slots > kRtSlotsMax)
    return Status::invalid("rt slots " + std::to_string(config.slots) + " out of range 1.." +
                           std::to_string(kRtSlotsMax));
  if (config.granularity_ns == 0)
    return Status::invalid("rt granularity_ns must be at least 1");
  if (config.command_poll_ns == 0)
    return Status::invalid("rt command_poll_ns must be at least 1");
  if (config.priority < 0 || config.priority > 99)
    return Status::invalid("SCHED_FIFO priority " + std::to_string(config.priority) +
                           " out of range 1..99 (0 = normal priority)");
  if (config.cpu >= 0) {
    const long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
    if (config.cpu >= cpus || config.cpu >= CPU_SETSIZE)
      return Status::invalid("CPU " + std::to_string(config.cpu) + " does not exist (this host has CPUs 0.." +
                             std::to_string(cpus - 1) + ")");
  }
  std::unique_ptr<RtThread> t(new RtThread());
  t->impl_ = std::make_unique<Impl>(config, hooks, KillSwitch::now_ns());
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

RtSubmitted RtThread::submit(RtOp op, std::uint32_t slot, std::uint64_t deadline_ns,
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
  return submit(RtOp::arm, slot, deadline_ns, target);
}
RtSubmitted RtThread::disarm(std::uint32_t slot) noexcept { return submit(RtOp::disarm, slot, 0, KillTarget{}); }
RtSubmitted RtThread::kill_now(std::uint32_t slot) noexcept { return submit(RtOp::kill_now, slot, 0, KillTarget{}); }

bool RtThread::applied(std::uint64_t seq) const noexcept {
  return impl_->core.applied_seq() >= seq;
}

RtCounters RtThread::counters() const noexcept { return impl_->core.counters(); }

}  // namespace leasehold
