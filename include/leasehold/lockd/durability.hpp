// leasehold/lockd: the durability port, through which LockService makes ownership changes
// durable before any answer that depends on them goes out (DESIGN.md "lockd").
//
// The service numbers every ownership change and every restart mark (service.hpp) with a change
// sequence number, cuts the changes of a loop turn into a batch covering the seqs
// [first_seq, last_seq] and submits it; later, poll() hands back one verdict per seq of every
// submitted batch, in seq order:
//   durable   the change is on stable storage: a crash cannot undo it;
//   rejected  the store refused it (a replicated store: a transaction guarded on a leadership
//             revision that has moved on, i.e. this lockd was deposed for that shard);
//   failed    the store could not write it (disk full, I/O error, connection lost); unknown
//             whether it will be visible after a restart.
// Production: StoreThread (SQLite; a batch is all durable or all failed). The simulator: its
// simulated disk (latency, crashes losing what is not durable).
//
// The contract for a store that can refuse (issue 18, the etcd store): the service treats
// `rejected` like `failed` — it stops serving (LockService::failed(), lockd exits 1) and sends
// no answer that depended on any change from the first non-durable seq on, because the table in
// memory has moved past what the store holds and cannot be rolled back change by change (a
// grant undone would need its sandbox killed, an epoch undone would be reissued). Recovery is a
// restart from the store (for etcd: a new leader loads the shard). A sharded store reports
// `rejected` for the seqs of the shard it lost; the service still stops as a whole until it
// serves per shard (then: stop serving that shard only, which this contract leaves room for).
// Seqs after a non-durable one are never reported durable by a correct store: durability is a
// prefix.
#pragma once

#include "leasehold/lease/types.hpp"
#include "leasehold/lockd/store.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace leasehold::lockd {

/// One submission: the changes of seqs [first_seq, last_seq] (first_seq <= last_seq) and the
/// restart marks written with them. Seqs of marks or of a lived checkpoint carry no entry in
/// `changes`, so changes.size() <= last_seq - first_seq + 1. At most kStoreBatchChangesMax changes.
struct DurableBatch {
  std::uint64_t first_seq = 0;
  std::uint64_t last_seq = 0;
  std::vector<StoredName> changes;
  StoreMarks marks;
  /// The table's epoch high-water mark when the batch was cut (stored with it).
  Epoch epoch_high_water = 0;
};

/// The fate of one seq of a submitted batch.
struct DurabilityVerdict {
  enum class Kind : std::uint8_t { durable, rejected, failed };
  std::uint64_t seq = 0;
  Kind kind = Kind::durable;
  std::string why;  ///< empty for durable; names the store and the cause otherwise
};

/// What a store reports about itself (stats answers). All zero for a store that keeps none.
struct StoreStats {
  std::uint64_t commits = 0;
  std::uint64_t changes = 0;
  std::uint64_t batch_changes_max = 0;
  std::uint64_t commit_ns_p50 = 0;  ///< over the last kCommitSamplesMax commits
  std::uint64_t commit_ns_p99 = 0;
  std::uint64_t commit_ns_max = 0;
  std::uint64_t compactions = 0;
  std::uint64_t compact_ns_max = 0;
  std::uint64_t log_rows = 0;  ///< change-log rows not yet compacted
};

class DurabilityPort {
 public:
  virtual ~DurabilityPort() = default;
  /// Takes `b` (first_seq must be the previous batch's last_seq + 1, or any value >= 1 for the
  /// first). false: busy (batches in flight at the port's bound) or failed; then nothing is
  /// taken (`b` is unchanged) and the caller resubmits later. Never blocks.
  virtual bool submit(DurableBatch&& b) = 0;
  /// Appends the verdicts that arrived since the last poll, in seq order. Never blocks.
  virtual void poll(std::vector<DurabilityVerdict>& out) = 0;
  virtual StoreStats stats() const { return {}; }
};

}  // namespace leasehold::lockd
