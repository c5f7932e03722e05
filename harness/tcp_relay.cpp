// leasehold/harness: the userspace TCP relay (include/leasehold/harness/tcp_relay.hpp).
#include "leasehold/harness/tcp_relay.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <list>
#include <vector>

namespace leasehold::harness {

/// One client connection and its connection to the target (server < 0: none, while cut).
struct TcpRelay::Conn {
  int client = -1, server = -1;
  std::vector<std::uint8_t> to_server, to_client;  ///< read from one side, not yet written to the other
  bool broken = false;   ///< bytes were dropped (a cut): closed when the cut heals
  bool closing = false;  ///< one side ended: closed once what it sent is written
  ~Conn() {
    if (client >= 0) ::close(client);
    if (server >= 0) ::close(server);
  }
};

namespace {

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

/// Reads what `fd` has into `buf` (up to the buffer bound); false when the side ended or failed.
bool read_into(int fd, std::vector<std::uint8_t>& buf) {
  std::uint8_t chunk[16 * 1024];
  const std::size_t room = kTcpRelayBufferBytes > buf.size() ? kTcpRelayBufferBytes - buf.size() : 0;
  if (room == 0) return true;
  const ssize_t n = ::recv(fd, chunk, std::min(room, sizeof chunk), 0);
  if (n > 0) {
    buf.insert(buf.end(), chunk, chunk + n);
    return true;
  }
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

/// Reads and drops what `fd` has; the bytes dropped, or -1 when the side ended or failed.
ssize_t drain(int fd) {
  std::uint8_t chunk[16 * 1024];
  const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
  if (n > 0) return n;
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
}

/// Writes what it can of `buf` to `fd`; false when the side failed.
bool write_from(int fd, std::vector<std::uint8_t>& buf) {
  if (buf.empty()) return true;
  const ssize_t n = ::send(fd, buf.data(), buf.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n > 0) {
    buf.erase(buf.begin(), buf.begin() + n);
    return true;
  }
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

}  // namespace

Result<std::unique_ptr<TcpRelay>> TcpRelay::start(const SocketAddress& target) {
  std::unique_ptr<TcpRelay> r(new TcpRelay());
  r->target_ = target;
  r->listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (r->listen_ < 0) return Status::from_errno(errno, "tcp relay socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(r->listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(r->listen_, 64) != 0 ||
      ::getsockname(r->listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return Status::from_errno(errno, "tcp relay bind/listen");
  r->port_ = ntohs(a.sin_port);
  r->wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (r->wake_ < 0) return Status::from_errno(errno, "tcp relay eventfd");
  r->thread_ = std::thread([p = r.get()] { p->loop(); });
  return r;
}

TcpRelay::~TcpRelay() {
  stop_.store(true);
  if (wake_ >= 0) {
    const std::uint64_t one = 1;
    (void)::write(wake_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  if (listen_ >= 0) ::close(listen_);
  if (wake_ >= 0) ::close(wake_);
}

void TcpRelay::cut(bool on) {
  cut_.store(on, std::memory_order_release);
  const std::uint64_t one = 1;
  (void)::write(wake_, &one, sizeof one);
}

void TcpRelay::loop() {
  std::list<Conn> conns;
  std::vector<pollfd> fds;
  std::vector<Conn*> owner;  // per fds entry from index 2: the connection it belongs to
  bool was_cut = false;
  while (!stop_.load(std::memory_order_acquire)) {
    const bool cut = cut_.load(std::memory_order_acquire);
    if (cut) {
      // Whatever waits in a buffer is lost with the partition.
      for (Conn& c : conns) {
        const std::size_t lost = c.to_server.size() + c.to_client.size();
        if (lost == 0) continue;
        dropped_.fetch_add(lost);
        c.to_server.clear();
        c.to_client.clear();
        c.broken = true;
      }
    } else if (was_cut) {
      conns.remove_if([](const Conn& c) { return c.broken; });  // healed: broken streams end
    }
    was_cut = cut;
    conns.remove_if([](const Conn& c) { return c.closing && c.to_server.empty() && c.to_client.empty(); });

    fds.assign({{wake_, POLLIN, 0}, {listen_, POLLIN, 0}});
    owner.assign(2, nullptr);
    for (Conn& c : conns) {
      short ce = 0, se = 0;
      if (!c.closing && (cut || c.to_server.size() < kTcpRelayBufferBytes)) ce |= POLLIN;
      if (!c.to_client.empty()) ce |= POLLOUT;
      if (!c.closing && (cut || c.to_client.size() < kTcpRelayBufferBytes)) se |= POLLIN;
      if (!c.to_server.empty()) se |= POLLOUT;
      fds.push_back({c.client, ce, 0});
      owner.push_back(&c);
      if (c.server >= 0) {
        fds.push_back({c.server, se, 0});
        owner.push_back(&c);
      }
    }
    if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
    if (fds[0].revents & POLLIN) {
      std::uint64_t n = 0;
      (void)::read(wake_, &n, sizeof n);
    }
    if (fds[1].revents & POLLIN) {
      for (;;) {
        const int client = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (client < 0) break;
        accepted_.fetch_add(1);
        if (conns.size() >= kTcpRelayConnectionsMax) {
          ::close(client);
          continue;
        }
        Conn& c = conns.emplace_back();
        c.client = client;
        const int one = 1;
        ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (cut_.load(std::memory_order_acquire)) {
          c.broken = true;  // a connection made during a partition reaches nothing
          continue;
        }
        // Loopback: the connect completes (or is refused, the member being down) at once.
        c.server = ::socket(target_.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c.server < 0 || ::connect(c.server, target_.sa(), target_.length) != 0) {
          conns.pop_back();
          continue;
        }
        ::setsockopt(c.server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        set_nonblocking(c.server);
      }
    }
    const bool now_cut = cut_.load(std::memory_order_acquire);
    for (std::size_t i = 2; i < fds.size(); ++i) {
      Conn& c = *owner[i];
      const short ev = fds[i].revents;
      if (ev == 0 || c.closing) continue;
      const bool from_client = fds[i].fd == c.client;
      const int other = from_client ? c.server : c.client;
      std::vector<std::uint8_t>& in = from_client ? c.to_server : c.to_client;
      std::vector<std::uint8_t>& out = from_client ? c.to_client : c.to_server;
      bool ok = true;
      if (ev & POLLOUT) ok = write_from(fds[i].fd, out);
      if (ok && (ev & (POLLIN | POLLHUP | POLLERR))) {
        if (now_cut || other < 0) {
          const ssize_t n = drain(fds[i].fd);
          if (n > 0) {
            dropped_.fetch_add(static_cast<std::uint64_t>(n));
            c.broken = true;
          }
          ok = n >= 0;
        } else {
          ok = read_into(fds[i].fd, in);
          if (ok) ok = write_from(other, in);  // most bytes go straight through
        }
      }
      if (!ok) {
        // One side ended or failed: what the other side still has to get is written, then the
        // connection closes (the next turn, or at once when nothing waits).
        c.closing = true;
        if (c.client >= 0) (void)write_from(c.client, c.to_client);
        if (c.server >= 0) (void)write_from(c.server, c.to_server);
        c.to_client.clear();
        c.to_server.clear();
      }
    }
  }
}

}  // namespace leasehold::harness
