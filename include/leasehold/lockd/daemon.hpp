// leasehold/lockd: the production driver of LockService — everything with a syscall.
//
// LockdDaemon opens the SQLite store (store.hpp) and loads it, starts the store thread
// (StoreThread, the production DurabilityPort), binds the UDP socket and registers it with the
// io_uring EventLoop (UdpDatagramPort, the production DatagramPort), builds the LockService on
// what it loaded, delivers every datagram with the loop turn's clock reading, ticks the service
// after every turn and writes its log lines on stderr. Signals stay with leasehold-lockd's main.
//
// On an etcd store (--store etcd://...) the daemon is one of a cluster. It campaigns for the
// leadership (leadership.hpp) and, until it wins, serves as a follower: a LockService with an
// empty table that answers every request not_leader with the leader's address. When it wins
// revision R it loads the table from etcd (EtcdStore, guarded on R) and serves it as the leader
// - only while Leadership::serving(R, now) holds, checked before every datagram is delivered
// (self-fencing). When the fence passes, or the store rejects or fails a write, it steps down:
// the leader service is dropped with its unsent answers (clients retry and are redirected), a
// follower takes its place and the campaign starts again. It never exits for a lost leadership.
#pragma once

#include "leasehold/io/loop.hpp"
#include "leasehold/lockd/config.hpp"
#include "leasehold/lockd/leadership.hpp"
#include "leasehold/lockd/service.hpp"
#include "leasehold/lockd/store_thread.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace leasehold::lockd {

class LockdDaemon {
 public:
  /// Opens the store (StoreError on a bad store), rebuilds the table from it (every held lease
  /// refreshed at the loop's clock now), binds the UDP socket on `cfg.listen` and registers it
  /// with `loop` (which must outlive the daemon). Throws std::runtime_error naming the cause on
  /// any failure. `keys`: as LockService (cluster keys first).
  LockdDaemon(const LockdConfig& cfg, const std::vector<wire::WireKey>& keys, EventLoop& loop);
  /// Closes the socket, lets the store thread commit what it was handed, writes the log.
  ~LockdDaemon();
  LockdDaemon(const LockdDaemon&) = delete;
  LockdDaemon& operator=(const LockdDaemon&) = delete;

  /// The service serving now: the leader's, or a follower (etcd store, not leading).
  LockService& service() noexcept { return *service_; }
  /// The token signer of every grant, for this service and the ones the daemon builds later.
  /// On etcd, first checks it against the cluster's signing key record (check_signing_key):
  /// permission_denied when the cluster signs with another key (lockd must not start); an etcd
  /// that does not answer is no refusal (logged).
  Status set_token_signer(std::shared_ptr<const token::TokenSigner> signer);
  /// A key rotation (SIGHUP), for this service and the ones the daemon builds later.
  Status reload_keys(const std::vector<wire::WireKey>& keys, std::int64_t now_ns);
  /// The bound address (with the real port when cfg.listen asked for port 0).
  const SocketAddress& local_address() const noexcept { return local_; }

  /// Call after every EventLoop::run_once: ticks the service at the turn's clock reading and
  /// writes its log; on etcd, takes over or steps down as the leadership says. Returns false
  /// when lockd must stop because the store failed (failure() says why; nothing of the failed
  /// batch was answered) - on etcd never: a failed store makes this lockd step down instead.
  bool after_iteration();
  /// How long run_once may wait (ns): until the service's next tick.
  std::int64_t wait_ns() const noexcept { return wait_ns_; }
  /// Orderly stop (SIGTERM): makes everything pending durable, waiting for the store thread,
  /// and queues the answers that waited for it (the caller runs the loop once more to send
  /// them). Returns false if the store failed meanwhile.
  bool drain_for_shutdown();
  std::string failure() const { return service_->failure(); }
  /// Writes the service's ready log lines on stderr (best effort).
  void write_log();

 private:
  struct Cluster;  ///< the etcd store's client, the leadership and the leader's revision
  /// A service on `restored` over `store` (the signer and keys in force applied).
  std::unique_ptr<LockService> make_service(const RestoredTable& restored, DurabilityPort& store, std::int64_t now_ns);
  /// etcd: this lockd leads but must not serve at `now_ns` (its leadership lease may have run
  /// out: leadership.hpp); false for the SQLite store, a follower, and the self-fence ablation.
  bool fenced(std::int64_t now_ns) const;
  /// etcd: the follower service (an empty table, a store that takes nothing). A leader steps
  /// down: `fence` (the fence passed) campaigns again at once, otherwise (its store failed)
  /// after a backoff (Leadership::StepDown).
  void become_follower(std::int64_t now_ns, const std::string& why, bool fence);
  /// etcd: starts loading the table at revision `revision` on a thread of its own (the io
  /// thread goes on answering not_leader meanwhile).
  void start_load(std::int64_t revision, std::int64_t now_ns);
  /// etcd: once the load is done, serves the table as the leader if `v` (the leadership now)
  /// still leads that revision within its fence, restored at a clock reading taken then, which
  /// it returns (`now_ns` when it did not take over); a failed load steps down.
  std::int64_t finish_load(const Leadership::View& v, std::int64_t now_ns);
  /// etcd: the io-side checks of every turn (fence, store failure, a won election); the clock
  /// reading the service now runs at (later than `now_ns` after a takeover).
  std::int64_t follow_leadership(std::int64_t now_ns);

  EventLoop& loop_;
  LockdConfig cfg_;
  std::vector<wire::WireKey> keys_;
  std::shared_ptr<const token::TokenSigner> signer_;
  std::unique_ptr<Cluster> cluster_;  ///< null: the SQLite store
  std::unique_ptr<StoreThread> store_;
  SocketId socket_;
  SocketAddress local_;
  std::unique_ptr<UdpDatagramPort> net_;
  std::unique_ptr<LockService> service_;
  std::int64_t wait_ns_ = 0;
  std::string log_;
};

/// A random lockd instance id (RAND_bytes; never nil). Throws std::runtime_error if OpenSSL
/// cannot draw one.
WorkerId random_instance_id();

}  // namespace leasehold::lockd
