// leasehold/io: the datagram port, through which a core (LockService, the supervisor's core)
// sends. Delivery is the other direction: the driver calls the core with the bytes, the sender
// and the turn's `now_ns` (LockService::on_datagram). Production: UdpDatagramPort (io/loop.hpp),
// a UDP socket on the io_uring EventLoop; the simulator: its simulated network.
#pragma once

#include "leasehold/io/udp.hpp"

#include <cstdint>
#include <span>

namespace leasehold {

/// What a port dropped on its own (not counted by the caller's `send` failures).
struct DatagramPortStats {
  std::uint64_t kernel_drops = 0;   ///< received datagrams lost on a full receive queue
  std::uint64_t truncated = 0;      ///< received datagrams larger than a receive buffer
  std::uint64_t send_errors = 0;    ///< sends accepted by send() that failed later (-errno)
};

class DatagramPort {
 public:
  virtual ~DatagramPort() = default;
  /// Queues `bytes` (one datagram) to `to`. false: not sent (counted by the caller). Never
  /// blocks; the bytes are copied before it returns.
  virtual bool send(const SocketAddress& to, std::span<const std::uint8_t> bytes) = 0;
  /// The address datagrams to this core arrive at (for logs, `listening ADDR:PORT`).
  virtual SocketAddress local_address() const { return {}; }
  virtual DatagramPortStats stats() const { return {}; }
};

}  // namespace leasehold
