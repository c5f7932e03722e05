#include "leasehold/supervisor/rt_thread_port.hpp"

namespace leasehold {

RtThreadPort::RtThreadPort(std::uint32_t slots, shm::TableWriter& table, EventLoop& loop)
    : table_(table),
      loop_(loop),
      deadlines_(new std::atomic<std::uint64_t>[slots]),
      kill_events_(static_cast<std::size_t>(slots) * 2 + 64) {
  for (std::uint32_t i = 0; i < slots; ++i) deadlines_[i].store(0, std::memory_order_relaxed);
}

RtThreadPort::~RtThreadPort() { stop(); }

Result<std::unique_ptr<RtThreadPort>> RtThreadPort::start(const RtConfig& config, shm::TableWriter& table,
                                                          EventLoop& loop, RtStartStatus& status) {
  std::unique_ptr<RtThreadPort> port(new RtThreadPort(config.slots, table, loop));
  RtHooks hooks;
  hooks.context = port.get();
  hooks.current_deadline_ns = [](void* c, std::uint32_t slot) {
    return static_cast<RtThreadPort*>(c)->deadlines_[slot].load(std::memory_order_acquire);
  };
  hooks.revoke_slot = [](void* c, std::uint32_t slot) { static_cast<RtThreadPort*>(c)->table_.revoke(slot); };
  hooks.record_lateness = [](void* c, std::uint64_t lateness_ns) {
    RtThreadPort* self = static_cast<RtThreadPort*>(c);
    self->table_.record_rt_lateness_ns(lateness_ns);
    std::uint64_t seen = self->lateness_max_ns_.load(std::memory_order_relaxed);
    while (lateness_ns > seen &&
           !self->lateness_max_ns_.compare_exchange_weak(seen, lateness_ns, std::memory_order_relaxed)) {
    }
  };
  // Writer liveness from the thread that kills: a stuck rt thread makes readers refuse.
  hooks.writer_heartbeat = [](void* c, std::uint64_t now_ns) { static_cast<RtThreadPort*>(c)->table_.heartbeat(now_ns); };
  hooks.record_kill = [](void* c, std::uint32_t slot, const KillRecord& rec) {
    RtThreadPort* self = static_cast<RtThreadPort*>(c);
    if (rec.confirmed_ns != 0)
      self->table_.record_kill(rec.confirmed_ns > rec.deadline_ns ? rec.confirmed_ns - rec.deadline_ns : 0);
    if (!self->kill_events_.push(RtKillEvent{slot, rec})) {
      self->kill_events_dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    self->loop_.wake();
  };
  auto rt = RtThread::start(config, hooks, status);
  if (!rt) return rt.status();
  port->rt_ = std::move(rt).value();
  return port;
}

RtSubmitted RtThreadPort::arm(std::uint32_t slot, std::uint64_t valid_until_ns, const KillTarget& target) {
  set_deadline(slot, valid_until_ns);
  return rt_->arm(slot, valid_until_ns, target);
}

void RtThreadPort::set_deadline(std::uint32_t slot, std::uint64_t valid_until_ns) {
  deadlines_[slot].store(valid_until_ns, std::memory_order_release);
}

RtSubmitted RtThreadPort::disarm(std::uint32_t slot) { return rt_->disarm(slot); }
RtSubmitted RtThreadPort::kill_now(std::uint32_t slot) { return rt_->kill_now(slot); }
bool RtThreadPort::applied(std::uint64_t seq) const { return rt_->applied(seq); }
void RtThreadPort::stop() {
  if (rt_) rt_->stop();
}

bool RtThreadPort::pop_kill(RtKillEvent& event) { return kill_events_.pop(event); }
std::uint64_t RtThreadPort::take_lateness_max_ns() { return lateness_max_ns_.exchange(0, std::memory_order_relaxed); }
RtCounters RtThreadPort::counters() const { return rt_->counters(); }
std::uint64_t RtThreadPort::kill_events_dropped() const {
  return kill_events_dropped_.load(std::memory_order_relaxed);
}

}  // namespace leasehold
