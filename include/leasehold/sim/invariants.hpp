// leasehold/sim: the invariants the simulator checks at every step, each a named function.
//
// They read facts the world records (who passes the shm check now, which grant lockd let go and
// what became of its sandbox, every grant lockd sent, every decision of the fenced resource, the
// table a restarted lockd rebuilt) and return the first violation, or nothing. They keep only
// the history they need, so a test can feed each one a hand-made violating history.
//
// The properties are those of specs/ (specs/README.md) stated on the C++ run:
//   single_holder       MutualExclusion: no two sandboxes pass check_deadline for one name at
//                       the same simulated instant. (EventualMutualExclusion - an overlap after
//                       a pause past the budget must end within the recovery bound - is what
//                       `excused_until_ns` expresses; the world passes no excuse: its pauses
//                       freeze a supervisor but not the worker's clock, so they cannot extend a
//                       sandbox's valid_until, and only a late kill is excused.)
//   kill_before_expiry  SweepBeforeExpiry: lockd never lets an acknowledged grant go (TTL
//                       expiry, a preemption, or any other way) while its sandbox still runs:
//                       every kill-switch kill has landed (the process is gone) before
//                       lockd's expiry of that grant.
//   current_grant       every sandbox passing check_deadline holds lockd's current Held record
//                       of its name at its epoch (while lockd is up): the sharp form of
//                       SweepBeforeExpiry, which needs no second holder to fire. A Held record lockd never answered (a preemptible Commit whose
//                       batch a crash lost) is not a grant: its sandbox runs unpublished and is
//                       stopped when the Commit fails.
//   epoch_monotone      epochs strictly increase per name across grants and lockd restarts; a
//                       repeated grant of one epoch is only the idempotent answer to the holder.
//                       2-phase grants (Acquiring) count: a restart drops an Acquiring record,
//                       but its epoch stays burned, so no other sandbox is told it.
//   resource_fenced     the resource accepts exactly the writes with epoch >= the highest it has
//                       seen (recomputed here), so writes of two epochs never interleave, and an
//                       accepted write's epoch was granted to the sandbox that wrote.
//   no_lost_grant       a grant lockd acknowledged and that was still current when it crashed is
//                       in the table the next incarnation rebuilt (same holder and epoch).
//   epoch_durable       an epoch lockd told a client in a grant (a 2-phase one too: a waiter's
//                       grant from its FIFO, a control plane's acquire) was durable first: the
//                       table a restarted lockd (a new leader) rebuilt knows the name at that
//                       epoch or above, so it never tells the same epoch to another sandbox.
//   free_name_acquired  liveness: after the faults heal, every name is granted again within a
//                       bound.
#pragma once

#include "leasehold/lease/types.hpp"
#include "leasehold/sim/world.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>

namespace leasehold::sim {

/// A sandbox whose check_deadline passes at the instant being checked.
struct Passing {
  NameId name;
  SandboxId sandbox;
  Epoch epoch = 0;
  std::uint32_t worker = 0;
};

/// What became of a sandbox, as the world saw it (true simulated time).
struct SandboxFate {
  bool known = false;   ///< the world ever started it
  bool exited = false;  ///< its process is gone (exited by itself, or died after a kill)
  std::int64_t exited_at_ns = 0;
  bool killed = false;  ///< the kill-switch (or a lost / unknown answer) killed it
  std::int64_t killed_at_ns = 0;
  /// Its check_deadline passed at some step: it could act on the resource. A preemptible
  /// sandbox stopped before its epoch was published never could.
  bool passed = false;
};

/// One decision of the fenced resource.
struct WriteRecord {
  std::int64_t at_ns = 0;
  NameId name;
  Epoch epoch = 0;
  SandboxId sandbox;
  bool accepted = false;
  Epoch highest_after = 0;  ///< the resource's highest epoch for the name after the write
};

/// A name as a restarted lockd rebuilt it.
struct RestoredName {
  bool held = false;
  SandboxId owner;
  Epoch epoch = 0;
};

class Invariants {
 public:
  /// `passing`: every sandbox passing check_deadline at now_ns. `excused_until_ns[w]`: an
  /// over-budget pause was injected on worker w's supervisor, and this is the recovery bound
  /// after it. An overlap is tolerated only while one of its two sandboxes is on a worker still
  /// excused; one that is still there after that is a violation.
  std::optional<Violation> single_holder(std::span<const Passing> passing, std::int64_t now_ns,
                                         std::span<const std::int64_t> excused_until_ns = {});

  /// lockd let the grant (name, epoch, holder) go at now_ns (true time): when it left lockd's
  /// table or, if earlier, its lease's expiry deadline; `fate` is its sandbox's, which must
  /// have exited by then if it ever passed its check.
  /// `excused`: an over-budget pause hit the holder's supervisor or lockd during the grant.
  std::optional<Violation> kill_before_expiry(NameId name, Epoch epoch, SandboxId holder,
                                              const SandboxFate& fate, std::int64_t now_ns,
                                              bool excused = false);

  /// `passing` pass check_deadline at now_ns; `held(name)` is lockd's record (lockd is up).
  /// A mismatch is tolerated only for a sandbox on a worker still excused (single_holder).
  template <class Lookup>
  std::optional<Violation> current_grant(std::span<const Passing> passing, Lookup held, std::int64_t now_ns,
                                         std::span<const std::int64_t> excused_until_ns = {}) const {
    for (const Passing& p : passing) {
      if (excused(excused_until_ns, p.worker, now_ns)) continue;
      const RestoredName r = held(p.name);
      if (r.held && r.owner == p.sandbox && r.epoch == p.epoch) continue;
      return Violation{"current_grant", now_ns,
                       "name " + p.name.str() + ": sandbox " + p.sandbox.str() + " (worker " +
                           std::to_string(p.worker) + ") passes check_deadline at epoch " +
                           std::to_string(p.epoch) + " but lockd has " +
                           (r.held ? "it held by " + r.owner.str() + " at epoch " + std::to_string(r.epoch)
                                   : std::string("it not held"))};
    }
    return std::nullopt;
  }

  /// True while worker `w` is excused (see single_holder).
  static bool excused(std::span<const std::int64_t> excused_until_ns, std::uint32_t w, std::int64_t now_ns) noexcept {
    return w < excused_until_ns.size() && now_ns < excused_until_ns[w];
  }

  /// lockd sent a grant of `name` at `epoch` to `holder`.
  std::optional<Violation> epoch_monotone(NameId name, Epoch epoch, SandboxId holder,
                                          std::int64_t now_ns);

  /// The resource decided on a write. Uses the grants seen by epoch_monotone.
  std::optional<Violation> resource_fenced(const WriteRecord& w);

  /// lockd restarted at now_ns. `current`: the grants it had acknowledged that were still
  /// current when it crashed; `restored(name)`: the rebuilt table's record.
  struct AckedGrant {
    NameId name;
    Epoch epoch = 0;
    SandboxId holder;
  };
  template <class Lookup>
  std::optional<Violation> no_lost_grant(std::span<const AckedGrant> current, Lookup restored,
                                         std::int64_t now_ns) {
    for (const AckedGrant& g : current) {
      const RestoredName r = restored(g.name);
      if (r.held && r.owner == g.holder && r.epoch == g.epoch) continue;
      return Violation{"no_lost_grant", now_ns,
                       "name " + g.name.str() + ": the grant of epoch " + std::to_string(g.epoch) +
                           " to " + g.holder.str() + " was acknowledged and current at the crash, " +
                           "but the restarted lockd has " +
                           (r.held ? "it held by " + r.owner.str() + " at epoch " + std::to_string(r.epoch)
                                   : "it not held (epoch " + std::to_string(r.epoch) + ")")};
    }
    return std::nullopt;
  }

  /// lockd restarted (or a new leader took over) at now_ns. `told`: per name, the highest epoch
  /// lockd told a client in a grant before; `epoch(name)`: the rebuilt table's epoch for the
  /// name (for a name it does not know, its epoch high-water: the next grant is above it).
  template <class Lookup>
  std::optional<Violation> epoch_durable(const std::map<NameId, Epoch>& told, Lookup epoch, std::int64_t now_ns) const {
    for (const auto& [name, e] : told) {
      const Epoch kept = epoch(name);
      if (kept >= e) continue;
      return Violation{"epoch_durable", now_ns,
                       "name " + name.str() + ": epoch " + std::to_string(e) + " was told to a client, but the " +
                           "rebuilt table has the name at epoch " + std::to_string(kept) +
                           " (the epoch can be granted again)"};
    }
    return std::nullopt;
  }

  /// At the end of a run (now_ns): `name` was last granted at `last_grant_ns` (-1: never) and
  /// first granted after heal_ns at `first_after_heal_ns` (-1: not since).
  std::optional<Violation> free_name_acquired(NameId name, std::int64_t first_after_heal_ns,
                                              std::int64_t heal_ns, std::int64_t bound_ns,
                                              std::int64_t now_ns) const;

 private:
  struct Granted {
    Epoch epoch = 0;
    SandboxId holder;
  };
  std::map<NameId, Granted> last_grant_;
  std::map<std::pair<NameId, Epoch>, SandboxId> grant_of_;
  std::map<NameId, Epoch> highest_;            ///< the resource's highest, recomputed
  std::map<NameId, std::int64_t> overlap_since_;
};

}  // namespace leasehold::sim
