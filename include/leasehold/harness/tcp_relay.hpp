// leasehold/harness: a userspace TCP relay on loopback in front of one server (an etcd member),
// which partitions its clients from that server without root. Clients connect to address();
// each connection is forwarded to `target` over a connection of its own.
//
// cut(true) is a partition as a lost network makes it: from then on every byte, both ways, of
// every connection is dropped, and connections made meanwhile are accepted and get the same.
// Nothing is closed: a client notices only through its own deadlines and keepalives (a
// refused connection would tell it at once, which a real partition does not). cut(false) heals
// it: the connections that lost bytes are closed (their streams are broken; the client
// reconnects) and new ones are forwarded again. A lockd given one relay per etcd member
// (`--store etcd://RELAY0,RELAY1,...`) is partitioned from etcd by cutting its relays, while it
// keeps running and keeps receiving datagrams. network.hpp is the cut that needs root.
//
// One thread forwards every connection (poll, non-blocking sockets, a bounded buffer per
// direction: a slow reader slows its writer, as TCP does). A connection to `target` that fails
// (the member is down) closes the client's connection. Errors come back as a Status (or the
// Result of start()) whose message names the system call and the errno text. Thread-safe: every
// member may be called from any thread while the relay forwards.
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/wire/address.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace leasehold::harness {

/// Bytes a connection buffers per direction before it stops reading that side.
inline constexpr std::size_t kTcpRelayBufferBytes = 64 * 1024;
/// Most connections forwarded at once; more are accepted and closed at once.
inline constexpr std::size_t kTcpRelayConnectionsMax = 256;

class TcpRelay {
 public:
  /// Listens on 127.0.0.1 (port chosen by the kernel) and starts forwarding to `target`.
  /// Errors (the errno's Errc): "tcp relay socket: REASON", "tcp relay bind/listen: REASON",
  /// "tcp relay eventfd: REASON".
  static Result<std::unique_ptr<TcpRelay>> start(const SocketAddress& target);
  /// Stops the thread and closes every connection.
  ~TcpRelay();
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  /// The address clients connect to: "127.0.0.1:PORT".
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::uint16_t port() const noexcept { return port_; }
  /// true: partition (every byte dropped from now on, nothing closed); false: heal (the
  /// connections that lost bytes are closed, new ones forwarded). Takes effect before the next
  /// byte is forwarded.
  void cut(bool on);
  bool is_cut() const noexcept { return cut_.load(std::memory_order_acquire); }
  /// Connections accepted since start().
  std::uint64_t connections() const noexcept { return accepted_.load(); }
  /// Bytes dropped while cut, both directions, since start().
  std::uint64_t bytes_dropped() const noexcept { return dropped_.load(); }

 private:
  struct Conn;
  TcpRelay() = default;
  void loop();
  SocketAddress target_;
  int listen_ = -1, wake_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> cut_{false}, stop_{false};
  std::atomic<std::uint64_t> accepted_{0}, dropped_{0};
  std::thread thread_;
};

}  // namespace leasehold::harness
