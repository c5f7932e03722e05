// leasehold/lockd: the shards of a lockd cluster on etcd (DESIGN.md "lockd on etcd").
//
// A cluster has S shards (lease/shard.hpp says which names are whose). Each lockd process is a
// replica of one shard (--shard K): it campaigns for that shard's election key only
// (leadership.hpp) and, when it leads, serves that shard's table alone. S is the cluster's:
// recorded in etcd at `PREFIX/shards` by the first lockd that starts (ensure_shard_count), and
// every later lockd compares its --shards with it and refuses to start on a mismatch - a lockd
// that hashed names with another S would serve names that another shard's leader serves too.
//
// Every process also knows every shard's leader (ShardLeaders: a thread that reads the S
// election keys every poll interval, in read-only etcd transactions of at most txn_ops_max
// reads each, so one transaction per poll up to 127 shards), so that a request for a name of
// shard J that reaches a process of shard K != J is answered Error{not_leader, J's leader}.
#pragma once

#include "leasehold/lease/result.hpp"

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace leasehold::etcd {
class Client;
}

namespace leasehold::lockd {

/// How long a starting lockd waits for etcd to read or record the shard count.
inline constexpr std::int64_t kShardCountWaitNs = 10'000'000'000;

/// The key holding a cluster's shard count: PREFIX/shards (decimal).
std::string shard_count_key(std::string_view prefix);

/// Records `shards` at PREFIX/shards when no lockd has (one transaction: create if absent), or
/// compares it with what is there. Ok when they agree. Errors: invalid_argument naming both
/// counts when they differ, or when the key is absent and the cluster already has keys of a
/// shard that `shards` cannot account for: of shard 0 with `shards` not 1 (a cluster made before
/// shard counts were recorded had one shard: its names would be under the wrong leaders), of
/// any other shard whatever `shards` is (the count was removed by hand); corrupt for a value
/// that is no count; timeout when etcd did not answer before `deadline_ns` (each failed call is
/// retried after a short pause).
Status ensure_shard_count(etcd::Client& client, std::string_view prefix, unsigned shards, std::int64_t deadline_ns);

/// Every shard's leader, as its election key says, refreshed every poll interval by a thread.
class ShardLeaders {
 public:
  /// Starts the thread for a cluster at `prefix` of `shards` shards. `wake` runs on that thread
  /// after every change of the leaders (the daemon passes EventLoop::wake).
  ShardLeaders(std::shared_ptr<etcd::Client> client, std::string prefix, unsigned shards, std::size_t txn_ops_max,
               std::int64_t poll_ns, std::function<void()> wake);
  /// Stops the thread.
  ~ShardLeaders();
  ShardLeaders(const ShardLeaders&) = delete;
  ShardLeaders& operator=(const ShardLeaders&) = delete;

  /// The leaders' advertised addresses, one per shard ("" = none known), and how many times
  /// they changed (0 before the first poll answered): a caller copies them when that moved.
  std::vector<std::string> leaders() const;
  std::uint64_t version() const;
  /// The last etcd failure of a poll ("" = the last poll answered).
  std::string last_error() const;

  /// One poll of the S election keys: the leaders (read-only transactions, at most
  /// `txn_ops_max` reads each). Used by the thread; public for tests.
  static Result<std::vector<std::string>> read_leaders(etcd::Client& client, std::string_view prefix, unsigned shards,
                                                       std::size_t txn_ops_max, std::int64_t deadline_ns);

 private:
  void run();

  std::shared_ptr<etcd::Client> client_;
  std::string prefix_;
  unsigned shards_;
  std::size_t txn_ops_max_;
  std::int64_t poll_ns_;
  std::function<void()> wake_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> leaders_;  // guarded by mu_
  std::uint64_t version_ = 0;         // guarded by mu_
  std::string last_error_;            // guarded by mu_
  bool stop_ = false;                 // guarded by mu_
  std::thread thread_;
};

}  // namespace leasehold::lockd
