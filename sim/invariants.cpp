#include "leasehold/sim/invariants.hpp"

namespace leasehold::sim {

std::optional<Violation> Invariants::single_holder(std::span<const Passing> passing, std::int64_t now_ns,
                                                   std::span<const std::int64_t> excused_until_ns) {
  // Few sandboxes pass at once (at most one per name when all is well): a quadratic scan is
  // cheaper than any map.
  std::map<NameId, std::int64_t> overlapping;
  for (std::size_t i = 0; i < passing.size(); ++i) {
    for (std::size_t j = i + 1; j < passing.size(); ++j) {
      const Passing& a = passing[i];
      const Passing& b = passing[j];
      if (a.name != b.name || a.sandbox == b.sandbox) continue;
      if (excused(excused_until_ns, a.worker, now_ns) || excused(excused_until_ns, b.worker, now_ns)) {
        overlapping.emplace(a.name, now_ns);
        continue;
      }
      const auto since = overlap_since_.find(a.name);
      const std::string started =
          since == overlap_since_.end() ? "" : " (overlapping since " + std::to_string(since->second) +
                                                   " ns, past the recovery bound)";
      return Violation{"single_holder", now_ns,
                       "name " + a.name.str() + ": sandbox " + a.sandbox.str() + " (worker " +
                           std::to_string(a.worker) + ", epoch " + std::to_string(a.epoch) + ") and " +
                           b.sandbox.str() + " (worker " + std::to_string(b.worker) + ", epoch " +
                           std::to_string(b.epoch) + ") both pass check_deadline" + started};
    }
  }
  for (const auto& [name, at] : overlapping) overlap_since_.emplace(name, at);
  for (auto it = overlap_since_.begin(); it != overlap_since_.end();)
    it = overlapping.count(it->first) != 0 ? std::next(it) : overlap_since_.erase(it);
  return std::nullopt;
}

std::optional<Violation> Invariants::kill_before_expiry(NameId name, Epoch epoch, SandboxId holder,
                                                        const SandboxFate& fate, std::int64_t now_ns,
                                                        bool excused) {
  // The kill must have landed (the process is gone), not only been sent: the safety inequality
  // budgets the kill's latency before lockd's expiry.
  if (!fate.known || !fate.passed || excused) return std::nullopt;
  if (fate.exited && fate.exited_at_ns <= now_ns) return std::nullopt;
  return Violation{"kill_before_expiry", now_ns,
                   "name " + name.str() + ": lockd let the grant of epoch " + std::to_string(epoch) +
                       " go while its sandbox " + holder.str() + " was running and " +
                       (fate.exited ? "dead only at " + std::to_string(fate.exited_at_ns) + " ns"
                        : fate.killed ? "not yet dead (killed at " + std::to_string(fate.killed_at_ns) + " ns)"
                                      : std::string("not killed"))};
}

std::optional<Violation> Invariants::epoch_monotone(NameId name, Epoch epoch, SandboxId holder,
                                                    std::int64_t now_ns) {
  // A grant already sent (a retry answered from lockd's answer cache, an idempotent acquire) is
  // the same grant again: it must name the same holder.
  if (const auto g = grant_of_.find(std::pair{name, epoch}); g != grant_of_.end()) {
    if (g->second == holder) return std::nullopt;
    return Violation{"epoch_monotone", now_ns,
                     "name " + name.str() + ": epoch " + std::to_string(epoch) + " granted to " + holder.str() +
                         " and before to " + g->second.str()};
  }
  auto [it, fresh] = last_grant_.try_emplace(name, Granted{epoch, holder});
  if (!fresh) {
    Granted& last = it->second;
    if (epoch <= last.epoch)
      return Violation{"epoch_monotone", now_ns,
                       "name " + name.str() + ": granted epoch " + std::to_string(epoch) + " to " +
                           holder.str() + " after epoch " + std::to_string(last.epoch) + " to " +
                           last.holder.str()};
    last = Granted{epoch, holder};
  }
  grant_of_.emplace(std::pair{name, epoch}, holder);
  return std::nullopt;
}

std::optional<Violation> Invariants::resource_fenced(const WriteRecord& w) {
  Epoch& highest = highest_[w.name];
  const bool should_accept = w.epoch >= highest;
  if (w.accepted != should_accept)
    return Violation{"resource_fenced", w.at_ns,
                     "name " + w.name.str() + ": the resource " + (w.accepted ? "accepted" : "rejected") +
                         " a write of epoch " + std::to_string(w.epoch) + " from " + w.sandbox.str() +
                         " with the highest epoch seen " + std::to_string(highest)};
  if (!w.accepted) return std::nullopt;
  highest = w.epoch;
  if (w.highest_after != highest)
    return Violation{"resource_fenced", w.at_ns,
                     "name " + w.name.str() + ": after accepting epoch " + std::to_string(w.epoch) +
                         " the resource reports highest " + std::to_string(w.highest_after)};
  const auto g = grant_of_.find(std::pair{w.name, w.epoch});
  if (g == grant_of_.end() || g->second != w.sandbox)
    return Violation{"resource_fenced", w.at_ns,
                     "name " + w.name.str() + ": the resource accepted a write of epoch " +
                         std::to_string(w.epoch) + " from " + w.sandbox.str() + ", but lockd granted " +
                         (g == grant_of_.end() ? std::string("no such epoch") : "it to " + g->second.str())};
  return std::nullopt;
}

std::optional<Violation> Invariants::free_name_acquired(NameId name, std::int64_t first_after_heal_ns,
                                                        std::int64_t heal_ns, std::int64_t bound_ns,
                                                        std::int64_t now_ns) const {
  if (now_ns < heal_ns + bound_ns) return std::nullopt;  // the run ended before the bound
  if (first_after_heal_ns >= 0 && first_after_heal_ns <= heal_ns + bound_ns) return std::nullopt;
  return Violation{"free_name_acquired", now_ns,
                   "name " + name.str() + ": not granted within " + std::to_string(bound_ns / kMs) +
                       " ms after the faults healed at " + std::to_string(heal_ns / kMs) + " ms" +
                       (first_after_heal_ns < 0 ? std::string(" (never)")
                                                : " (first at " + std::to_string(first_after_heal_ns / kMs) + " ms)")};
}

}  // namespace leasehold::sim
