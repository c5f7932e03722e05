// leasehold/supervisor: the rt thread's logic (see rt_core.hpp).
#include "leasehold/supervisor/rt_core.hpp"

#include "leasehold/lease/assert.hpp"

#include <algorithm>
#include <cerrno>

namespace leasehold {

RtCore::RtCore(std::uint32_t slots, std::uint64_t granularity_ns, std::uint64_t command_poll_ns,
               const RtHooks& hooks, RtKillPath& kill, std::uint64_t now_ns)
    : command_poll_ns_(command_poll_ns), hooks_(hooks), kill_(kill), wheel_(slots, granularity_ns, now_ns),
      slots_(slots), last_now_ns_(now_ns) {
  pending_.reserve(kRtPendingKillsMax);
}

// Every entry point passes its now_ns here first. CLOCK_BOOTTIME never goes backwards: a reading
// earlier than the last would stamp a kill before a deadline already handled and time out a
// pending kill's confirmation from the wrong start (and the wheel would abort one step later).
void RtCore::clock(std::uint64_t now_ns) noexcept {
  LEASEHOLD_ASSERT(now_ns >= last_now_ns_);
  last_now_ns_ = now_ns;
}

void RtCore::report(std::uint32_t slot, const KillRecord& rec) noexcept {
  if (rec.confirmed_ns != 0) kills_confirmed_.fetch_add(1, std::memory_order_relaxed);
  if (hooks_.record_kill) hooks_.record_kill(hooks_.context, slot, rec);
}

void RtCore::drop_pending(std::size_t index) noexcept {
  slots_[pending_[index]].kill_pending = false;
  pending_[index] = pending_.back();
  pending_.pop_back();
}

// Finishes a pending kill of `slot` (if any) without waiting: reported with `error` unless
// death can be confirmed right now.
void RtCore::finish_pending(std::uint32_t slot, int error, std::uint64_t now_ns) noexcept {
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i] != slot) continue;
    SlotState& s = slots_[slot];
    if (kill_.confirm_dead(s.target) == 1) {
      s.record.confirmed_ns = std::max(now_ns, s.record.issued_ns);
    } else {
      s.record.error = error;
    }
    report(slot, s.record);
    drop_pending(i);
    return;
  }
}

void RtCore::kill_slot(std::uint32_t slot, std::uint64_t deadline_ns, std::uint64_t now_ns) noexcept {
  SlotState& s = slots_[slot];
  if (hooks_.revoke_slot) hooks_.revoke_slot(hooks_.context, slot);
  s.record = kill_.kill(s.target, deadline_ns);
  s.armed = false;
  s.handle = TimerHandle{};
  kills_issued_.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t issue_latency_ns = s.record.issued_ns > deadline_ns ? s.record.issued_ns - deadline_ns : 0;
  if (issue_latency_ns > kill_issue_latency_ns_max_.load(std::memory_order_relaxed))
    kill_issue_latency_ns_max_.store(issue_latency_ns, std::memory_order_relaxed);
  if (hooks_.record_kill_issued) hooks_.record_kill_issued(hooks_.context, slot, s.record);
  if (s.record.path == KillPath::none) {
    report(slot, s.record);  // nothing delivered: the error says why
    return;
  }
  if (kill_.confirm_dead(s.target) == 1) {
    s.record.confirmed_ns = std::max(now_ns, s.record.issued_ns);  // never before the kill was issued
    report(slot, s.record);
    return;
  }
  if (pending_.size() >= kRtPendingKillsMax) {
    s.record.error = -ENOSPC;
    report(slot, s.record);
    return;
  }
  s.kill_pending = true;
  pending_.push_back(slot);
}

void RtCore::confirm_pending(std::uint64_t now_ns) noexcept {
  clock(now_ns);
  for (std::size_t i = 0; i < pending_.size();) {
    SlotState& s = slots_[pending_[i]];
    const int dead = kill_.confirm_dead(s.target);
    if (dead == 1) {
      s.record.confirmed_ns = std::max(now_ns, s.record.issued_ns);
    } else if (dead < 0) {
      s.record.error = dead;
    } else if (now_ns > s.record.issued_ns && now_ns - s.record.issued_ns > kRtKillConfirmTimeoutNs) {
      s.record.error = -ETIMEDOUT;
    } else {
      ++i;
      continue;
    }
    report(pending_[i], s.record);
    drop_pending(i);
  }
}

void RtCore::apply(const RtCommand& c, std::uint64_t now_ns) noexcept {
  clock(now_ns);
  // The producer refuses a slot out of range (RtThread::submit): one here would arm, disarm or
  // kill through memory that is not a slot.
  LEASEHOLD_ASSERT(c.slot < slots_.size());
  SlotState& s = slots_[c.slot];
  switch (c.op) {
    case RtOp::arm:
      if (s.kill_pending) finish_pending(c.slot, -ECANCELED, now_ns);
      s.target = c.target;
      s.deadline_ns = c.deadline_ns;
      if (s.armed && wheel_.reschedule(s.handle, c.deadline_ns) == WheelError::none) break;
      {
        const auto r = wheel_.schedule(c.deadline_ns, c.slot);
        // The wheel has one node per slot, so it cannot be full; stay safe if it were.
        if (!r) {
          kill_slot(c.slot, c.deadline_ns, now_ns);
          break;
        }
        s.handle = r.handle;
        s.armed = true;
      }
      break;
    case RtOp::disarm:
      if (s.armed) wheel_.cancel(s.handle);
      s.armed = false;
      s.handle = TimerHandle{};
      if (s.kill_pending) finish_pending(c.slot, -ECANCELED, now_ns);
      s.target = KillTarget{};
      break;
    case RtOp::kill_now:
      if (s.armed) {
        wheel_.cancel(s.handle);
        kill_slot(c.slot, now_ns, now_ns);
      }
      break;
  }
}

void RtCore::step(std::uint64_t now_ns, std::uint64_t woke_for_ns, RtCommandSource& commands) noexcept {
  clock(now_ns);
  if (hooks_.writer_heartbeat) hooks_.writer_heartbeat(hooks_.context, now_ns);
  if (hooks_.record_lateness) hooks_.record_lateness(hooks_.context, now_ns > woke_for_ns ? now_ns - woke_for_ns : 0);
  ticks_.fetch_add(1, std::memory_order_relaxed);

  RtCommand c;
  for (std::uint32_t i = 0; i < kRtCommandsPerTickMax && commands.pop(c); ++i) {
    // Commands arrive in their seq order, none skipped: applied_seq() says every command up to
    // it was applied, and the io thread closes a sandbox's kill target (its pidfd, its leaf)
    // once its disarm's seq is; a skipped or reordered seq would let it close one still in use.
    const std::uint64_t applied = applied_seq_.load(std::memory_order_relaxed);
    LEASEHOLD_ASSERT(c.seq == applied + 1);
    apply(c, now_ns);
    applied_seq_.store(c.seq, std::memory_order_release);
  }
  wheel_.advance(now_ns, [&](const DueTimer& due) -> Rearm {
    const auto slot = static_cast<std::uint32_t>(due.payload);
    SlotState& s = slots_[slot];
    if (!s.armed || s.handle != due.handle) return Rearm::none();
    std::uint64_t deadline = due.deadline_ns;
    if (hooks_.current_deadline_ns) {
      const std::uint64_t current = hooks_.current_deadline_ns(hooks_.context, slot);
      if (current > deadline && !wheel_.due_by(current, now_ns)) {
        s.deadline_ns = current;
        rearms_.fetch_add(1, std::memory_order_relaxed);
        return Rearm::at(current);
      }
      if (current > deadline) deadline = current;
    }
    kill_slot(slot, deadline, now_ns);
    return Rearm::none();
  });
  confirm_pending(now_ns);
  processed_until_ns_.store(wheel_.next_tick_ns(), std::memory_order_release);
}

std::uint64_t RtCore::next_wake_ns(std::uint64_t last_wake_ns, bool commands_queued) const noexcept {
  const std::uint64_t tick_ns = wheel_.next_tick_ns();
  if (!pending_.empty() || commands_queued) return tick_ns;
  const std::uint64_t poll_ns = last_wake_ns + command_poll_ns_;
  return std::max(tick_ns, std::min(wheel_.next_event_ns(), poll_ns));
}

void RtCore::finish_all(std::uint64_t now_ns) noexcept {
  clock(now_ns);
  while (!pending_.empty()) finish_pending(pending_.back(), -ECANCELED, now_ns);
}

RtCounters RtCore::counters() const noexcept {
  RtCounters c;
  c.ticks = ticks_.load(std::memory_order_relaxed);
  c.rearms = rearms_.load(std::memory_order_relaxed);
  c.kills_issued = kills_issued_.load(std::memory_order_relaxed);
  c.kills_confirmed = kills_confirmed_.load(std::memory_order_relaxed);
  c.kill_issue_latency_ns_max = kill_issue_latency_ns_max_.load(std::memory_order_relaxed);
  c.processed_until_ns = processed_until_ns_.load(std::memory_order_acquire);
  return c;
}

}  // namespace leasehold
