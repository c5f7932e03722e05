// leasehold/io: UDP sockets and addresses for the io_uring loop and the request client.
//
// A thin layer over the socket API: an owning fd (`UniqueFd`), an address value that holds
// IPv4 or IPv6 (`SocketAddress`), and socket set-up. Errors are returned as -errno, like
// liburing, never thrown.
#pragma once

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

/// An IPv4 or IPv6 socket address (value type; `sockaddr_storage` underneath).
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;  ///< 0 = unset

  bool is_set() const noexcept { return length != 0; }
  const sockaddr* sa() const noexcept { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* sa() noexcept { return reinterpret_cast<sockaddr*>(&storage); }
  int family() const noexcept { return storage.ss_family; }
  /// Port in host byte order (0 if unset or not IP).
  std::uint16_t port() const noexcept;

  /// Copies `length` bytes of `addr`; nullopt if length is 0 or larger than sockaddr_storage.
  static std::optional<SocketAddress> from(const sockaddr* addr, socklen_t length) noexcept;
  /// 127.0.0.1:port.
  static SocketAddress loopback_v4(std::uint16_t port) noexcept;
  /// Parses "1.2.3.4:port" or "[::1]:port" (numeric only, no DNS). nullopt if malformed.
  static std::optional<SocketAddress> parse(std::string_view text);
  /// "1.2.3.4:port" / "[::1]:port"; "(unset)" or "(family N)" otherwise.
  std::string str() const;

  /// Same family, address and port (IPv6 also compares scope id).
  friend bool operator==(const SocketAddress& a, const SocketAddress& b) noexcept;
};

/// Opens a non-blocking, close-on-exec UDP socket bound to `bind_to` (port 0 = ephemeral).
/// Sets SO_RXQ_OVFL so the loop can count datagrams the kernel dropped on a full receive
/// queue. Returns the fd or -errno (e.g. -EADDRINUSE, -EACCES).
int open_udp_socket(const SocketAddress& bind_to) noexcept;

/// Same, but blocking (for the blocking request client and baselines).
int open_udp_socket_blocking(const SocketAddress& bind_to) noexcept;

/// The address a socket is bound to (getsockname); nullopt on error.
std::optional<SocketAddress> local_address(int fd) noexcept;

/// Sets SO_RCVBUF / SO_SNDBUF (bytes; the kernel doubles and clamps them). Returns 0 or -errno.
int set_socket_buffers(int fd, int rcvbuf_bytes, int sndbuf_bytes) noexcept;

}  // namespace leasehold
