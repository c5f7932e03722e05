// leasehold/wire: socket addresses (see address.hpp).
#include "leasehold/wire/address.hpp"

#include <arpa/inet.h>
#include <charconv>
#include <cstring>

namespace leasehold {

std::uint16_t SocketAddress::port() const noexcept {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

std::optional<SocketAddress> SocketAddress::from(const sockaddr* addr, socklen_t length) noexcept {
  if (addr == nullptr || length == 0 || length > sizeof(sockaddr_storage)) return std::nullopt;
  SocketAddress a;
  std::memcpy(&a.storage, addr, length);
  a.length = length;
  return a;
}

SocketAddress SocketAddress::loopback_v4(std::uint16_t port) noexcept {
  SocketAddress a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
  in->sin_family = AF_INET;
  in->sin_port = htons(port);
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.length = sizeof(sockaddr_in);
  return a;
}

std::optional<SocketAddress> SocketAddress::parse(std::string_view text) {
  std::string host;
  std::string_view port_text;
  bool v6 = false;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return std::nullopt;
    host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
    v6 = true;
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc{} || end != port_text.data() + port_text.size() || port_text.empty() ||
      port > 65535)
    return std::nullopt;
  SocketAddress a;
  if (v6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    if (::inet_pton(AF_INET6, host.c_str(), &in6->sin6_addr) != 1) return std::nullopt;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<std::uint16_t>(port));
    a.length = sizeof(sockaddr_in6);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    if (::inet_pton(AF_INET, host.c_str(), &in->sin_addr) != 1) return std::nullopt;
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<std::uint16_t>(port));
    a.length = sizeof(sockaddr_in);
  }
  return a;
}

std::string SocketAddress::str() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (!is_set()) return "(unset)";
  if (family() == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(port());
  }
  return "(family " + std::to_string(family()) + ")";
}

bool operator==(const SocketAddress& a, const SocketAddress& b) noexcept {
  if (a.family() != b.family()) return false;
  if (a.family() == AF_INET) {
    auto* x = reinterpret_cast<const sockaddr_in*>(&a.storage);
    auto* y = reinterpret_cast<const sockaddr_in*>(&b.storage);
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  if (a.family() == AF_INET6) {
    auto* x = reinterpret_cast<const sockaddr_in6*>(&a.storage);
    auto* y = reinterpret_cast<const sockaddr_in6*>(&b.storage);
    return x->sin6_port == y->sin6_port && x->sin6_scope_id == y->sin6_scope_id &&
           std::memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return a.length == b.length && std::memcmp(&a.storage, &b.storage, a.length) == 0;
}

}  // namespace leasehold
