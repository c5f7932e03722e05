// leasehold/sim: lockd in the simulated world.
//
// The request path of LockService (lockd/service.hpp) over the real pure pieces: the wire
// Receiver (authentication with the key derived for the claimed worker, replay window, answer
// cache, in-flight set), the LeaseTable, and the durability rule: an answer that depends on a
// change not yet durable is held back until the disk reports it durable, heartbeat answers are
// not. Expiry runs on every datagram and every tick. A restart rebuilds the table from what the
// disk made durable (every Held lease refreshed at the restart: never shortened).
//
// No I/O: datagrams out through LockdEnv, the disk is SimDisk, time is `now_ns` on lockd's clock.
#pragma once

#include "leasehold/wire/auth.hpp"
#include "leasehold/lease/lease_table.hpp"
#include "leasehold/sim/disk.hpp"
#include "leasehold/sim/world.hpp"

#include <cstdint>
#include <memory>
#include <span>

namespace leasehold::sim {

class LockdEnv {
 public:
  virtual ~LockdEnv() = default;
  /// A datagram to the supervisor of worker `worker` (index).
  virtual void send_to_worker(std::uint32_t worker, std::span<const std::uint8_t> bytes) = 0;
  /// A batch was handed to the disk (the world schedules its completion).
  virtual void disk_submitted() = 0;
};

class LockdNode {
 public:
  /// Builds a new incarnation from `disk`'s durable content at `now_ns` (lockd's clock).
  LockdNode(const SimConfig& cfg, const wire::WireKey& cluster_key, LockdEnv& env, SimDisk& disk,
            std::int64_t now_ns);
  ~LockdNode();
  LockdNode(const LockdNode&) = delete;
  LockdNode& operator=(const LockdNode&) = delete;

  /// A datagram from worker `from` (index).
  void on_datagram(std::span<const std::uint8_t> bytes, std::uint32_t from, std::int64_t now_ns);
  /// Expiry, durability, submission; returns the next time (lockd's clock) it wants a tick.
  std::int64_t tick(std::int64_t now_ns);

  const LeaseTable& table() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace leasehold::sim
