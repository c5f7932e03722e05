// leasehold/wire: the address a datagram comes from or goes to (IPv4 or IPv6), a value type.
//
// Part of the wire protocol, not of a transport: the replay window and the answer cache
// (replay.hpp) key on it, and the io_uring loop (leasehold/io/udp.hpp) sends to it.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace leasehold {

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

}  // namespace leasehold
