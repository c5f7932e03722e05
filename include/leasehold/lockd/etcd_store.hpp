// leasehold/lockd: the etcd store — lockd's durable name table in etcd, for a cluster of lockd
// processes of which one leads (leadership.hpp).
//
// `--store etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` (PREFIX default "/leasehold"). Keys under
// the shard prefix `PREFIX/shard/<s>/` (one shard today, s = 0):
//   election         the leader's advertised ADDR:PORT, attached to its etcd lease; its
//                    create_revision is the leader's revision R (leadership.hpp)
//   names/<name-id>  one row per name (encode_row: `key=value` words, readable with etcdctl)
//   high_water       the table's epoch high-water mark (decimal)
//   lived/<R>        the restart rule's "lived" mark of the incarnation R (decimal ns)
//   seen/<worker>    the last incarnation that acknowledged the worker (decimal)
// The incarnation of a leader is its revision R: strictly above every earlier leader's, so the
// restart rule (service.hpp) serves a failover exactly as it serves a restart.
//
// Every commit is one or more etcd transactions, each guarded on the election key's
// create_revision being R: a lockd that no longer leads writes nothing (StoreRejected), so two
// lockd processes never both change the table. A batch is cut into transactions of at most
// `txn_ops_max` operations (etcd's --max-txn-ops, 128 by default); a crash between two of them
// leaves a prefix of the batch durable, which the service allows (nothing of the batch was
// answered yet, and every change is a whole row). A transaction that times out is retried with
// the same operations (they are idempotent puts) until the commit deadline; then StoreError.
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/lockd/config.hpp"
#include "leasehold/lockd/store.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

namespace leasehold::etcd {
class Client;
}

namespace leasehold::lockd {

/// Where shard `shard` of the cluster at `prefix` keeps its keys: "PREFIX/shard/<shard>/".
std::string shard_prefix(std::string_view prefix, unsigned shard);
/// The shard's election key: shard_prefix + "election".
std::string election_key(std::string_view shard_prefix);

/// A row as stored in etcd: "v=1 name=TEXT state=held epoch=5 old_epoch=0 owner=UUID peer=UUID
/// worker=UUID peer_worker=UUID ttl_ns=N fresh=0" (every field present, in that order).
std::string encode_row(const StoredName& n);
/// The row of `value`; corrupt naming the field when a field is missing, malformed or out of
/// range, when the name text is invalid or does not hash to `id`.
Result<StoredName> decode_row(NameId id, std::string_view value);

/// Default bound on the operations of one etcd transaction (etcd's --max-txn-ops default).
inline constexpr std::size_t kEtcdTxnOpsMaxDefault = 128;
/// How long a commit keeps retrying a transaction that timed out or found no member, in ns.
inline constexpr std::int64_t kEtcdCommitDeadlineNs = 5'000'000'000;
/// Deadline of one etcd call from the store, in ns.
inline constexpr std::int64_t kEtcdCallTimeoutNs = 1'000'000'000;

class EtcdStore final : public Store {
 public:
  /// A store for the shard at `shard_prefix`, written by the leader whose election key has
  /// create_revision `leader_revision` (> 0). Does no I/O.
  EtcdStore(std::shared_ptr<etcd::Client> client, std::string shard_prefix, std::int64_t leader_revision,
            std::size_t txn_ops_max = kEtcdTxnOpsMaxDefault);

  /// Every row of the shard, read at one revision (paged), and the marks. Throws StoreError
  /// naming the key on a corrupt row or a read that fails.
  StoredTable load() const override;
  void commit(std::span<const StoredName> changes, Epoch epoch_high_water, const StoreMarks& marks) override;
  std::size_t compact(std::size_t) override { return 0; }
  std::uint64_t log_rows() const noexcept override { return 0; }
  std::uint64_t incarnation() const noexcept override { return static_cast<std::uint64_t>(revision_); }
  std::string describe() const override;

 private:
  std::shared_ptr<etcd::Client> client_;
  std::string prefix_;
  std::string election_;
  std::int64_t revision_;
  std::size_t txn_ops_max_;
  /// Durable epoch per name (the never-lower check, as NameStore's), filled by load().
  mutable std::unordered_map<NameId, Epoch> epochs_;
};

}  // namespace leasehold::lockd
