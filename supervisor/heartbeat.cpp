#include "leasehold/supervisor/heartbeat.hpp"

#include "leasehold/lease/assert.hpp"
#include "leasehold/lease/timing.hpp"

#include <algorithm>
#include <stdexcept>

namespace leasehold {

std::uint64_t lease_measured_from_ns(std::uint64_t request_send_ns, std::uint64_t answer_ns) noexcept {
#if LEASEHOLD_SIM_ABLATE_KILL_FROM_ANSWER
  // Simulator ablation only (leasehold-sim-kill-from-answer, sim/CMakeLists.txt, and
  // leasehold_supervisor_ablate_kill_from_answer, supervisor/daemon.cmake; no other build defines
  // it), bug class "kill-switch measured from the answer instead of the send":
  // lockd may have received the request (and started its TTL) up to a whole round trip before
  // the answer arrives, so a kill-switch timed from the arrival can fire after lockd's expiry.
  (void)request_send_ns;
  return answer_ns;
#else
  (void)answer_ns;
  return request_send_ns;
#endif
}

HeartbeatSchedule::HeartbeatSchedule(std::uint64_t kill_after_ns, std::uint64_t interval_ns,
                                     std::uint32_t leases_max, bool preemptible)
    : kill_after_ns_(kill_after_ns),
      interval_ns_(interval_ns),
      leases_max_(leases_max),
      preemptible_(preemptible) {
  if (kill_after_ns == 0 || interval_ns == 0 || leases_max == 0)
    throw std::invalid_argument("HeartbeatSchedule: kill_after, interval and leases_max must be > 0");
  leases_.reserve(leases_max);
}

void HeartbeatSchedule::observe_now(std::uint64_t now_ns) noexcept {
  // The boot clock never goes backwards: a `now` below an earlier one could make a lapsed lease
  // look valid again, or extend one whose deadline already passed.
  LEASEHOLD_ASSERT(now_ns >= last_now_ns_);
  last_now_ns_ = now_ns;
}

void HeartbeatSchedule::move_forward(std::uint64_t& valid_until_ns, std::uint64_t to_ns) noexcept {
  // valid_until never decreases for one grant: it is published (shm table, rt thread) as soon
  // as it moves, and lockd's expiry of the grant never moves back either.
  LEASEHOLD_ASSERT(to_ns >= valid_until_ns);
  valid_until_ns = to_ns;
}

bool HeartbeatSchedule::add(const NameId& name, const SandboxId& sandbox, Epoch epoch,
                            std::uint32_t slot, std::uint64_t grant_send_ns) {
  if (leases_.size() >= leases_max_ || leases_.contains(sandbox)) return false;
  HeartbeatLease l;
  l.name = name;
  l.sandbox = sandbox;
  l.epoch = epoch;
  l.slot = slot;
  l.last_acked_send_ns = grant_send_ns;
  l.valid_until_ns = timing::kill_deadline_ns(grant_send_ns, kill_after_ns_);
  leases_.emplace(sandbox, l);
  return true;
}

bool HeartbeatSchedule::mark_worker_refreshed(const SandboxId& sandbox) {
  auto it = leases_.find(sandbox);
  if (it == leases_.end()) return false;
  // Once per grant: a second hand-over would give a lease that lapsed with the worker's liveness
  // the worker's later deadline.
  LEASEHOLD_ASSERT(!it->second.worker_refreshed);
  it->second.worker_refreshed = true;
  // After commit lockd no longer expires the lease on its own TTL; it is preemptible only when
  // worker liveness lapses. So its validity is the worker's from now on: the one place a lease's
  // valid_until is replaced rather than moved forward, before the grant's deadline is published.
  it->second.valid_until_ns = worker_valid_until_ns_;
  it->second.last_acked_send_ns = worker_last_acked_send_ns_;
  return true;
}

bool HeartbeatSchedule::set_commit_pending(const SandboxId& sandbox, bool pending) {
  auto it = leases_.find(sandbox);
  if (it == leases_.end()) return false;
  it->second.commit_pending = pending;
  return true;
}

bool HeartbeatSchedule::remove(const SandboxId& sandbox) { return leases_.erase(sandbox) == 1; }

const HeartbeatLease* HeartbeatSchedule::find(const SandboxId& sandbox) const {
  auto it = leases_.find(sandbox);
  return it == leases_.end() ? nullptr : &it->second;
}

void HeartbeatSchedule::set_shards(unsigned shards) {
  if (shards >= 1 && shards <= kShardsMax) shards_ = shards;
}

HeartbeatRound HeartbeatSchedule::begin_round(std::uint64_t now_ns,
                                              std::size_t entries_per_request) {
  if (entries_per_request == 0)
    throw std::invalid_argument("HeartbeatSchedule::begin_round: entries_per_request must be > 0");
  observe_now(now_ns);
  HeartbeatRound round;
  // One request per shard at a time: lockd answers a batch only at its shard's leader.
  std::vector<RefreshRequest> current(shards_);
  for (RefreshRequest& r : current) {
    r.send_ns = now_ns;
    r.deadline_ns = UINT64_MAX;
  }
  for (const auto& [id, l] : leases_) {
    if (l.worker_refreshed) continue;        // carried by worker liveness
    if (l.valid_until_ns <= now_ns) continue;  // lapsed: being killed, nothing to refresh
    RefreshRequest& r = current[shard_of(l.name, shards_)];
    r.entries.push_back(RefreshEntry{l.name, l.sandbox, l.epoch});
    r.deadline_ns = std::min(r.deadline_ns, l.valid_until_ns);
    if (r.entries.size() == entries_per_request) {
      round.requests.push_back(std::move(r));
      r = RefreshRequest{};
      r.send_ns = now_ns;
      r.deadline_ns = UINT64_MAX;
    }
  }
  for (RefreshRequest& r : current)
    if (!r.entries.empty()) round.requests.push_back(std::move(r));
  if (preemptible_) {
    std::vector<const HeartbeatLease*> held;
    for (const auto& [id, l] : leases_)
      if (l.worker_refreshed && !l.commit_pending && l.valid_until_ns > now_ns) held.push_back(&l);
    std::sort(held.begin(), held.end(),
              [](const HeartbeatLease* a, const HeartbeatLease* b) { return a->sandbox < b->sandbox; });
    std::size_t first = 0;
    if (held.size() > entries_per_request) {
      const auto it = std::upper_bound(held.begin(), held.end(), worker_window_after_,
                                       [](const SandboxId& id, const HeartbeatLease* l) { return id < l->sandbox; });
      first = static_cast<std::size_t>(it - held.begin()) % held.size();
    }
    for (std::size_t k = 0; k < std::min(held.size(), entries_per_request); ++k) {
      const HeartbeatLease& l = *held[(first + k) % held.size()];
      round.worker_held.push_back(RefreshEntry{l.name, l.sandbox, l.epoch});
      worker_window_after_ = l.sandbox;
    }
    round.worker_liveness = true;
    // Before liveness is established, or after a lapse, a beat is still worth one interval.
    round.worker_liveness_deadline_ns =
        worker_valid_until_ns_ > now_ns && !killswitch_engaged_ ? worker_valid_until_ns_
                                                                : now_ns + interval_ns_;
  }
  next_round_ns_ = now_ns + interval_ns_;
  return round;
}

HeartbeatAction HeartbeatSchedule::kill_action(const HeartbeatLease& l, RefreshStatus cause,
                                               bool lapsed) const {
  HeartbeatAction a;
  a.kind = HeartbeatAction::Kind::kill;
  a.sandbox = l.sandbox;
  a.slot = l.slot;
  a.valid_until_ns = l.valid_until_ns;
  a.cause = cause;
  a.lapsed = lapsed;
  return a;
}

HeartbeatAction HeartbeatSchedule::on_refresh_answer(const SandboxId& sandbox, Epoch epoch,
                                                     RefreshStatus result,
                                                     const SandboxId& holder, Epoch holder_epoch,
                                                     std::uint64_t request_send_ns,
                                                     std::uint64_t now_ns) {
  observe_now(now_ns);
  // An answer cannot arrive before its request left: a send time after now would measure the
  // lease from the future, past lockd's expiry.
  LEASEHOLD_ASSERT(request_send_ns <= now_ns);
  auto it = leases_.find(sandbox);
  if (it == leases_.end()) return {};  // already removed (exited / released)
  HeartbeatLease& l = it->second;
  if (epoch != l.epoch) return {};     // an answer about another generation of this sandbox
  if (result != RefreshStatus::refreshed) {
    HeartbeatAction a = kill_action(l, result, false);
    a.holder = holder;
    a.holder_epoch = holder_epoch;
    return a;
  }
  if (now_ns >= l.valid_until_ns) return kill_action(l, result, true);  // lapsed: stays dead
  if (l.worker_refreshed) return {};  // per-sandbox answers no longer move it
  const std::uint64_t from_ns = lease_measured_from_ns(request_send_ns, now_ns);
  const std::uint64_t candidate = timing::kill_deadline_ns(from_ns, kill_after_ns_);
  if (candidate <= l.valid_until_ns) return {};  // stale: an answer to an older send
  l.last_acked_send_ns = from_ns;
  move_forward(l.valid_until_ns, candidate);
  HeartbeatAction a;
  a.kind = HeartbeatAction::Kind::extend;
  a.sandbox = l.sandbox;
  a.slot = l.slot;
  a.valid_until_ns = candidate;
  return a;
}

void HeartbeatSchedule::start_worker_liveness(std::uint64_t send_ns) {
  // Only a beat sent after the kill-switch engaged may clear it.
  LEASEHOLD_ASSERT(!killswitch_engaged_ || send_ns >= killswitch_at_ns_);
  const std::uint64_t valid_until = timing::kill_deadline_ns(send_ns, kill_after_ns_);
  if (worker_live_) move_forward(worker_valid_until_ns_, valid_until);
  else worker_valid_until_ns_ = valid_until;
  worker_live_ = true;
  worker_last_acked_send_ns_ = send_ns;
  killswitch_engaged_ = false;
}

std::vector<HeartbeatAction> HeartbeatSchedule::check_worker_liveness(std::uint64_t now_ns) {
  observe_now(now_ns);
  std::vector<HeartbeatAction> out;
  if (!preemptible_ || !worker_live_ || killswitch_engaged_) return out;
  if (now_ns < worker_valid_until_ns_) return out;
  killswitch_engaged_ = true;
  killswitch_at_ns_ = now_ns;
  for (const auto& [id, l] : leases_)
    if (l.worker_refreshed) out.push_back(kill_action(l, RefreshStatus::refreshed, true));
  return out;
}

std::vector<HeartbeatAction> HeartbeatSchedule::on_worker_liveness_ack(std::uint64_t request_send_ns,
                                                                       std::uint64_t now_ns) {
  observe_now(now_ns);
  LEASEHOLD_ASSERT(request_send_ns <= now_ns);  // as on_refresh_answer
  std::vector<HeartbeatAction> out;
  if (!preemptible_) return out;
  const std::uint64_t from_ns = lease_measured_from_ns(request_send_ns, now_ns);
  if (!worker_live_) {
    start_worker_liveness(from_ns);
  } else {
    // A lapse not yet noticed is noticed now, before the answer could hide it.
    std::vector<HeartbeatAction> kills = check_worker_liveness(now_ns);
    out.insert(out.end(), kills.begin(), kills.end());
    if (killswitch_engaged_) {
      // Only a beat sent after the kill-switch fired proves lockd sees us again.
      if (request_send_ns < killswitch_at_ns_) return out;
      killswitch_engaged_ = false;
      worker_last_acked_send_ns_ = from_ns;
      // The lapsed deadline is at or before the kill-switch, this send after it.
      move_forward(worker_valid_until_ns_, timing::kill_deadline_ns(from_ns, kill_after_ns_));
    } else {
      const std::uint64_t candidate = timing::kill_deadline_ns(from_ns, kill_after_ns_);
      if (candidate <= worker_valid_until_ns_) return out;  // stale
      worker_last_acked_send_ns_ = from_ns;
      move_forward(worker_valid_until_ns_, candidate);
    }
  }
  if (worker_valid_until_ns_ <= now_ns) return out;  // acknowledged, but too late to matter
  for (auto& [id, l] : leases_) {
    if (!l.worker_refreshed || l.valid_until_ns <= now_ns) continue;  // lapsed stays dead
    if (l.valid_until_ns >= worker_valid_until_ns_) continue;
    move_forward(l.valid_until_ns, worker_valid_until_ns_);
    l.last_acked_send_ns = worker_last_acked_send_ns_;
    HeartbeatAction a;
    a.kind = HeartbeatAction::Kind::extend;
    a.sandbox = l.sandbox;
    a.slot = l.slot;
    a.valid_until_ns = l.valid_until_ns;
    out.push_back(a);
  }
  return out;
}

bool HeartbeatSchedule::may_create_named(std::uint64_t now_ns) const noexcept {
  LEASEHOLD_ASSERT(now_ns >= last_now_ns_);  // as observe_now
  if (!preemptible_) return true;
  return worker_live_ && !killswitch_engaged_ && now_ns < worker_valid_until_ns_;
}

std::vector<HeartbeatLease> HeartbeatSchedule::leases() const {
  std::vector<HeartbeatLease> out;
  out.reserve(leases_.size());
  for (const auto& [id, l] : leases_) out.push_back(l);
  return out;
}

}  // namespace leasehold
