// leasehold/io: UDP sockets (see udp.hpp).
#include "leasehold/io/udp.hpp"

#include <cerrno>
#include <netinet/in.h>
#include <unistd.h>

namespace leasehold {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

int UniqueFd::release() noexcept {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void UniqueFd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {
int open_udp(const SocketAddress& bind_to, int extra_flags) noexcept {
  if (!bind_to.is_set()) return -EINVAL;
  int fd = ::socket(bind_to.family(), SOCK_DGRAM | SOCK_CLOEXEC | extra_flags, 0);
  if (fd < 0) return -errno;
  UniqueFd owned(fd);
  int one = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_RXQ_OVFL, &one, sizeof one) != 0) return -errno;
  if (::bind(fd, bind_to.sa(), bind_to.length) != 0) return -errno;
  return owned.release();
}
}  // namespace

int open_udp_socket(const SocketAddress& bind_to) noexcept { return open_udp(bind_to, SOCK_NONBLOCK); }

int open_udp_socket_blocking(const SocketAddress& bind_to) noexcept { return open_udp(bind_to, 0); }

int enable_recv_errors(int fd) noexcept {
  const std::optional<SocketAddress> self = local_address(fd);
  if (!self) return -errno;
  int one = 1;
  const int rc = self->family() == AF_INET6 ? ::setsockopt(fd, IPPROTO_IPV6, IPV6_RECVERR, &one, sizeof one)
                                            : ::setsockopt(fd, IPPROTO_IP, IP_RECVERR, &one, sizeof one);
  return rc == 0 ? 0 : -errno;
}

std::optional<SocketAddress> local_address(int fd) noexcept {
  SocketAddress a;
  a.length = sizeof(a.storage);
  if (::getsockname(fd, a.sa(), &a.length) != 0) return std::nullopt;
  return a;
}

int set_socket_buffers(int fd, int rcvbuf_bytes, int sndbuf_bytes) noexcept {
  if (rcvbuf_bytes > 0 && ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf_bytes, sizeof(int)) != 0)
    return -errno;
  if (sndbuf_bytes > 0 && ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf_bytes, sizeof(int)) != 0)
    return -errno;
  return 0;
}

}  // namespace leasehold
