// leasehold/lockd: the production driver of LockService — everything with a syscall.
//
// LockdDaemon opens the SQLite store (store.hpp) and loads it, starts the store thread
// (StoreThread, the production DurabilityPort), binds the UDP socket and registers it with the
// io_uring EventLoop (UdpDatagramPort, the production DatagramPort), builds the LockService on
// what it loaded, delivers every datagram with the loop turn's clock reading, ticks the service
// after every turn and writes its log lines on stderr. Signals stay with leasehold-lockd's main.
#pragma once

#include "leasehold/io/loop.hpp"
#include "leasehold/lockd/config.hpp"
#include "leasehold/lockd/service.hpp"
#include "leasehold/lockd/store_thread.hpp"

#include <cstdint>
#include <memory>
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

  LockService& service() noexcept { return *service_; }
  /// The bound address (with the real port when cfg.listen asked for port 0).
  const SocketAddress& local_address() const noexcept { return local_; }

  /// Call after every EventLoop::run_once: ticks the service at the turn's clock reading and
  /// writes its log. Returns false when lockd must stop because the store failed (failure()
  /// says why; nothing of the failed batch was answered).
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
  EventLoop& loop_;
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
