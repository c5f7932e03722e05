// harness::TcpRelay on loopback sockets, the test as both client and server: bytes pass both
// ways; cut, every byte is dropped (and counted) with every connection left open, and a
// connection made meanwhile reaches nothing; healed, the connections that lost bytes are closed
// and a new one is forwarded again.
#include "leasehold/harness/process.hpp"
#include "leasehold/harness/tcp_relay.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <string>

namespace leasehold::harness {
namespace {

/// A socket closed with the object.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

/// Whether `fd` becomes readable within `ms`.
bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

/// What `fd` receives within `ms`: the bytes, "" when the peer closed (or reset) the
/// connection, nullopt when nothing came.
std::optional<std::string> receive(int fd, int ms) {
  if (!readable(fd, ms)) return std::nullopt;
  char buf[256];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

void send_text(int fd, const std::string& text) {
  ASSERT_EQ(::send(fd, text.data(), text.size(), MSG_NOSIGNAL), static_cast<ssize_t>(text.size()));
}

int connect_to(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

TEST(HarnessTcpRelay, ForwardsBlackholesWhileCutAndClosesTheBrokenStreamsWhenHealed) {
  Fd server(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(server.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(server.fd, 8), 0);
  ASSERT_EQ(::getsockname(server.fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  auto started = TcpRelay::start(*SocketAddress::from(reinterpret_cast<sockaddr*>(&a), sizeof a));
  ASSERT_TRUE(started.ok()) << started.message();
  TcpRelay& relay = **started;

  // Forwarded both ways.
  Fd client(connect_to(relay.port()));
  ASSERT_TRUE(readable(server.fd, 5'000)) << "the relay did not connect to the server";
  Fd upstream(::accept4(server.fd, nullptr, nullptr, SOCK_CLOEXEC));
  send_text(client.fd, "ping");
  EXPECT_EQ(receive(upstream.fd, 5'000), "ping");
  send_text(upstream.fd, "pong");
  EXPECT_EQ(receive(client.fd, 5'000), "pong");

  // Cut: nothing passes either way, nothing is closed, and a new connection reaches nothing.
  relay.cut(true);
  EXPECT_TRUE(relay.is_cut());
  send_text(client.fd, "lost");
  send_text(upstream.fd, "lost too");
  EXPECT_EQ(receive(upstream.fd, 300), std::nullopt);
  EXPECT_EQ(receive(client.fd, 300), std::nullopt);
  EXPECT_TRUE(eventually([&] { return relay.bytes_dropped() == 12; }, std::chrono::seconds(5)))
      << relay.bytes_dropped() << " bytes dropped";
  Fd during(connect_to(relay.port()));
  send_text(during.fd, "hello?");
  EXPECT_FALSE(readable(server.fd, 300)) << "a connection made during the cut reached the server";
  EXPECT_EQ(receive(during.fd, 100), std::nullopt);
  EXPECT_EQ(relay.connections(), 2u);

  // Healed: the streams that lost bytes end (both sides), a new connection is forwarded.
  relay.cut(false);
  EXPECT_EQ(receive(client.fd, 5'000), "");
  EXPECT_EQ(receive(upstream.fd, 5'000), "");
  EXPECT_EQ(receive(during.fd, 5'000), "");
  Fd after(connect_to(relay.port()));
  ASSERT_TRUE(readable(server.fd, 5'000)) << "the relay did not connect to the server after the heal";
  Fd upstream2(::accept4(server.fd, nullptr, nullptr, SOCK_CLOEXEC));
  send_text(after.fd, "again");
  EXPECT_EQ(receive(upstream2.fd, 5'000), "again");
}

}  // namespace
}  // namespace leasehold::harness
