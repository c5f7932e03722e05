// leasehold/sim: the simulated disk behind lockd's durability port (lockd/durability.hpp), and
// the guarded store of a leader of lockd on (simulated) etcd.
//
// One batch at a time (StoreThread's group commit): a batch submitted at t becomes durable at
// t + latency, when the world calls complete(); then its per-change verdicts are ready for
// LockService's next poll. A lockd crash before that loses the batch (crash()); what was durable
// survives into the next incarnation: open() gives the next LockService what NameStore::load
// would (the latest row of every name, the epoch high-water mark, the lived / seen marks) and
// counts the open as an incarnation. A batch can also fail (fail(): SQLite's commit failed and
// rolled back, e.g. a full or read-only disk): nothing of it is written and each of its changes
// gets a `failed` verdict, which stops lockd (LockService::failed()) as in production.
#pragma once

#include "leasehold/lockd/durability.hpp"
#include "leasehold/lockd/service.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

namespace leasehold::sim {

/// What a store made durable (the SQLite file, or a shard's keys in etcd): the latest row of
/// every name, the epoch high-water mark, the lived / seen marks and replay floors. open() gives
/// a new incarnation what NameStore::load (or EtcdStore::load) would, and counts the open.
class DurableTable {
 public:
  void apply(const lockd::DurableBatch& b);
  /// stored_epoch_monotone: the first write that put a name's row at a lower epoch than it had
  /// (a stale writer overwrote newer state: a deposed leader's write that no guard stopped),
  /// described; "" while none did. Epochs only grow, so no correct store ever does.
  const std::string& regression() const noexcept { return regression_; }
  lockd::RestoredTable open();
  std::uint64_t opens() const noexcept { return opens_; }

 private:
  std::map<NameId, lockd::StoredName> rows_;
  Epoch epoch_high_water_ = 0;
  std::map<std::uint64_t, std::int64_t> lived_;
  std::unordered_map<WorkerId, std::uint64_t> seen_;
  std::unordered_map<WorkerId, std::uint64_t> replay_floor_;
  std::uint64_t opens_ = 0;
  std::string regression_;
};

class SimDisk final : public lockd::DurabilityPort {
 public:
  /// A store of `table`. With a `guard` (lockd on etcd: "the election key is still this
  /// leader's"), a batch is written only if the guard holds when it completes, and rejected
  /// otherwise, as EtcdStore's guarded transaction.
  explicit SimDisk(DurableTable& table, std::function<bool()> guard = {})
      : table_(table), guard_(std::move(guard)) {}
  /// Called when a batch was taken (the world schedules its completion).
  void on_submit(std::function<void()> fn) { on_submit_ = std::move(fn); }

  bool submit(lockd::DurableBatch&& b) override;
  void poll(std::vector<lockd::DurabilityVerdict>& out) override;

  bool busy() const noexcept { return in_flight_.has_value(); }
  /// The in-flight batch reached the store: durable (its verdicts are ready), or rejected by
  /// the guard. Returns false when the guard rejected it.
  bool complete();
  /// The in-flight batch failed: nothing more of it is written; its verdicts (failed) are ready.
  void fail();
  /// lockd on etcd: the batch reached etcd (written if the guard holds) but its answer was lost;
  /// it stays in flight, for the retry's verdict (complete(), whose guarded write is the same
  /// puts again) or fail() at the commit deadline - `failed` then means "maybe written".
  void write_unanswered();
  /// lockd crashed: the batch not yet durable is lost (and verdicts nobody polled). Returns
  /// whether there was a batch in flight.
  bool crash();
  /// What the next incarnation loads; counts one store open.
  lockd::RestoredTable open() { return table_.open(); }
  std::uint64_t opens() const noexcept { return table_.opens(); }

 private:
  DurableTable& table_;
  std::function<bool()> guard_;
  std::function<void()> on_submit_;
  std::optional<lockd::DurableBatch> in_flight_;
  std::vector<lockd::DurabilityVerdict> ready_;
};

}  // namespace leasehold::sim
