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
//   seen/<worker>    the last incarnation that acknowledged the worker, and the highest seq taken
//                    from it when that was recorded: "R seq=N" (the next leader's replay floor)
// One key above the shards, `PREFIX/cluster_key`: the fingerprints of the cluster keys the
// leader accepts (cluster_keys_value: "v=1 keys=ID:FP,..."; FP = cluster_key_fingerprint, never
// the key). A lockd campaigns only while its own cluster keys include every key recorded there
// (cluster_keys_mismatch), and the election's transaction compares the record's mod_revision with
// the one it checked and records the winner's own set: so no lockd whose keys the supervisors'
// keys were not derived from can lead and answer them with tags they cannot check. Rotation:
// adding a key (SIGHUP) grows the record once the lockd that has it leads (at its election or at
// its reload while leading); removing one shrinks it when the leader reloads. A lockd that lacks
// a recorded key waits (it logs both sets) until it is given the key; started without any
// recorded key it refuses to start.
//
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
#include "leasehold/wire/auth.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace leasehold::etcd {
class Client;
}

namespace leasehold::lockd {

/// Where shard `shard` of the cluster at `prefix` keeps its keys: "PREFIX/shard/<shard>/".
std::string shard_prefix(std::string_view prefix, unsigned shard);
/// The shard's election key: shard_prefix + "election".
std::string election_key(std::string_view shard_prefix);

/// The cluster-wide record of the accepted cluster keys: "PREFIX/cluster_key".
std::string cluster_key_key(std::string_view prefix);
/// A cluster key's fingerprint: the first 8 bytes of SHA-256("leasehold cluster key v1", key
/// id, key bytes), in hex. Names a key in etcd and in logs without revealing it.
std::string cluster_key_fingerprint(const wire::WireKey& key);
/// The record of `keys`' cluster keys (admin and worker keys are left out), by key id:
/// "v=1 keys=1:0123456789abcdef,2:...".
std::string cluster_keys_value(const std::vector<wire::WireKey>& keys);
/// Why a lockd holding the keys recorded as `mine` must not lead a cluster whose record is
/// `recorded` ("" = it may): a recorded key (id and fingerprint) it does not hold, or a record
/// that does not parse. The message names both sets.
std::string cluster_keys_mismatch(std::string_view mine, std::string_view recorded);
/// At start: reads the record under `prefix` and creates it holding `mine` when there is none.
/// Ok when it was created or `mine` may lead (cluster_keys_mismatch); permission_denied naming
/// both sets when this lockd has none of the recorded keys (another cluster's key: it must not
/// start); an etcd error as it came (the caller starts anyway: the campaign checks again).
/// `*note` (when not null): what was found, for the log.
Status check_cluster_keys(etcd::Client& client, std::string_view prefix, std::string_view mine,
                          std::int64_t deadline_ns, std::string* note = nullptr);

/// The cluster's token signing key record: PREFIX/signing_key, "v=1 key_id=XXXXXXXX
/// public=<hex of the Ed25519 public key>". Resources keep one public key (F.pub), so every
/// leader of every shard must sign with the same key: a lockd with another key would lead and
/// have every token it signs refused as unknown_key.
std::string signing_key_key(std::string_view prefix);
/// The record of the signing key whose public key is `public_key` and key id `key_id`.
std::string signing_key_value(std::span<const std::uint8_t> public_key, std::uint32_t key_id);
/// At start: creates the record holding `mine` when there is none. Ok when it was created or
/// holds `mine`; permission_denied naming both key ids (and how to rotate) when it holds another
/// key; an etcd error as it came. `*note` (when not null): "created" or "matches".
Status check_signing_key(etcd::Client& client, std::string_view prefix, std::string_view mine, std::int64_t deadline_ns,
                         std::string* note = nullptr);

/// A row as stored in etcd: "v=1 name=TEXT state=held epoch=5 old_epoch=0 owner=UUID peer=UUID
/// worker=UUID peer_worker=UUID ttl_ns=N fresh=0" (every field present, in that order).
std::string encode_row(const StoredName& n);
/// The row of `value`; corrupt naming the field when a field is missing, malformed or out of
/// range, when the name text is invalid or does not hash to `id`.
Result<StoredName> decode_row(NameId id, std::string_view value);

/// How many keys that are not rows (StoredTable::foreign_key_samples) a load names.
inline constexpr std::size_t kForeignKeySamplesMax = 8;
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

  /// Every row of the shard, read at one revision (paged), and the marks. A key under names/
  /// that is not names/<name-id> is not a row, and a lived/ or seen/ mark that does not parse is
  /// no mark: skipped and counted (foreign_keys; a restored lease only gets longer without a
  /// mark). Throws StoreError naming the key on a row that does not decode, a high_water that
  /// is not a number, or a read that fails.
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
  mutable DurableEpochs epochs_;
};

}  // namespace leasehold::lockd
