// leasehold/io: UDP sockets and addresses for the io_uring loop and the request client.
//
// A thin layer over the socket API: an owning fd (`UniqueFd`) and socket set-up, on the address
// value of the wire protocol (`SocketAddress`, leasehold/wire/address.hpp). Errors are returned as -errno, like
// liburing, never thrown.
#pragma once

#include "leasehold/wire/address.hpp"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace leasehold {

/// Largest UDP payload the loop and the client send: an IPv4 datagram that fits a 1500-byte
/// Ethernet MTU (1500 - 20 IP - 8 UDP). A transport bound, not the protocol's: the wire
/// protocol keeps its messages <= wire::kDatagramBytesMax = 1400 bytes (DESIGN.md "The wire
/// protocol"), which leaves headroom and never fragments.
inline constexpr std::size_t kUdpPayloadBytesMax = 1472;

/// An owned file descriptor; closes on destruction. -1 is "none".
class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  /// Gives up ownership; returns the fd (or -1).
  int release() noexcept;
  /// Closes the current fd (if any) and owns `fd` instead.
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

/// Opens a non-blocking, close-on-exec UDP socket bound to `bind_to` (port 0 = ephemeral).
/// Sets SO_RXQ_OVFL so the loop can count datagrams the kernel dropped on a full receive
/// queue. Returns the fd or -errno (e.g. -EADDRINUSE, -EACCES).
int open_udp_socket(const SocketAddress& bind_to) noexcept;

/// Same, but blocking (for the blocking request client and baselines).
int open_udp_socket_blocking(const SocketAddress& bind_to) noexcept;

/// Sets IP_RECVERR (IPV6_RECVERR for an IPv6 socket): the kernel queues ICMP errors for the
/// socket's datagrams (port unreachable: nothing listens there) on its error queue, where
/// request_blocking reads them, instead of dropping them for an unconnected socket. 0 or -errno.
int enable_recv_errors(int fd) noexcept;

/// The address a socket is bound to (getsockname); nullopt on error.
std::optional<SocketAddress> local_address(int fd) noexcept;

/// Sets SO_RCVBUF / SO_SNDBUF (bytes; the kernel doubles and clamps them). Returns 0 or -errno.
int set_socket_buffers(int fd, int rcvbuf_bytes, int sndbuf_bytes) noexcept;

}  // namespace leasehold
