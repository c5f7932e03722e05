// harness::UdpRelay on loopback sockets: datagrams pass both ways, a cut drops what the client
// sends (and counts it) while answers still come back, answers can be dropped (all, or by a
// filter) while requests pass, a new target takes over, and a target it cannot reach is an error.
#include "leasehold/harness/relay.hpp"
#include "leasehold/harness/process.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <optional>
#include <span>
#include <string>

namespace leasehold::harness {
namespace {

using namespace std::chrono_literals;

/// A UDP socket on 127.0.0.1 (ephemeral port) whose receives give up after 300 ms.
struct Endpoint {
  int fd = -1;
  sockaddr_in addr{};
  Endpoint() {
    fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    const timeval tv{0, 300'000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~Endpoint() { ::close(fd); }
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  SocketAddress address() const {
    return *SocketAddress::from(reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  }
  void send_to(const sockaddr_in& to, const std::string& text) const {
    ASSERT_EQ(::sendto(fd, text.data(), text.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to),
              static_cast<ssize_t>(text.size()));
  }
  void send_to(std::uint16_t port, const std::string& text) const {
    sockaddr_in to = addr;
    to.sin_port = htons(port);
    send_to(to, text);
  }
  /// The next datagram and who sent it; nullopt after 300 ms without one.
  std::optional<std::pair<std::string, sockaddr_in>> receive() const {
    char buf[256];
    sockaddr_in from{};
    socklen_t len = sizeof from;
    const ssize_t n = ::recvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
    if (n < 0) return std::nullopt;
    return std::pair{std::string(buf, static_cast<std::size_t>(n)), from};
  }
};

std::unique_ptr<UdpRelay> relay_to(const Endpoint& target) {
  auto r = UdpRelay::start(target.address());
  EXPECT_TRUE(r.ok()) << r.message();
  return r ? std::move(r).value() : nullptr;
}

TEST(HarnessRelay, ForwardsDatagramsBothWays) {
  Endpoint lockd, client;
  auto relay = relay_to(lockd);
  ASSERT_NE(relay, nullptr);
  EXPECT_NE(relay->port(), 0);
  EXPECT_EQ(relay->address(), "127.0.0.1:" + std::to_string(relay->port()));
  EXPECT_FALSE(relay->is_cut());

  client.send_to(relay->port(), "refresh 1");
  const auto got = lockd.receive();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->first, "refresh 1");
  // lockd sees the relay's own socket, not the client, and answers it.
  EXPECT_NE(ntohs(got->second.sin_port), ntohs(client.addr.sin_port));
  lockd.send_to(got->second, "answer 1");
  const auto back = client.receive();
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->first, "answer 1");
  EXPECT_EQ(ntohs(back->second.sin_port), relay->port());
  EXPECT_EQ(relay->dropped(), 0u);
}

TEST(HarnessRelay, DropsWhatTheClientSendsWhileCutAndForwardsAgainAfter) {
  Endpoint lockd, client;
  auto relay = relay_to(lockd);
  ASSERT_NE(relay, nullptr);
  relay->cut(true);
  EXPECT_TRUE(relay->is_cut());
  client.send_to(relay->port(), "refresh 1");
  client.send_to(relay->port(), "refresh 2");
  EXPECT_FALSE(lockd.receive().has_value());
  EXPECT_TRUE(eventually([&] { return relay->dropped() == 2; }, 2'000ms));
  EXPECT_EQ(relay->dropped(), 2u);

  relay->cut(false);
  client.send_to(relay->port(), "refresh 3");
  const auto got = lockd.receive();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->first, "refresh 3");  // not a dropped one, late
  EXPECT_FALSE(lockd.receive().has_value());
  EXPECT_EQ(relay->dropped(), 2u);
}

TEST(HarnessRelay, AnswersStillReachTheClientWhileCut) {
  Endpoint lockd, client;
  auto relay = relay_to(lockd);
  ASSERT_NE(relay, nullptr);
  client.send_to(relay->port(), "acquire");
  const auto got = lockd.receive();
  ASSERT_TRUE(got.has_value());
  relay->cut(true);
  lockd.send_to(got->second, "grant");
  const auto back = client.receive();
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->first, "grant");
  EXPECT_EQ(relay->dropped(), 0u);
}

TEST(HarnessRelay, DropsAnswersWhileTheyAreCutOrTheFilterSaysSo) {
  Endpoint lockd, client;
  auto relay = relay_to(lockd);
  ASSERT_NE(relay, nullptr);
  client.send_to(relay->port(), "acquire");
  const auto got = lockd.receive();
  ASSERT_TRUE(got.has_value());
  relay->cut_answers(true);
  lockd.send_to(got->second, "grant 1");
  EXPECT_FALSE(client.receive().has_value());
  client.send_to(relay->port(), "refresh");  // requests still pass
  ASSERT_TRUE(lockd.receive().has_value());
  relay->cut_answers(false);
  relay->set_answer_filter([](std::span<const std::uint8_t> d) { return d.size() == 7; });  // "grant 2"
  lockd.send_to(got->second, "grant 2");
  lockd.send_to(got->second, "grant 33");
  const auto back = client.receive();
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->first, "grant 33");
  EXPECT_EQ(relay->answers_dropped(), 2u);
  EXPECT_EQ(relay->dropped(), 0u);
}

TEST(HarnessRelay, ARetargetedRelaySendsToTheNewTarget) {
  Endpoint old_lockd, new_lockd, client;
  auto relay = relay_to(old_lockd);
  ASSERT_NE(relay, nullptr);
  ASSERT_TRUE(relay->retarget(new_lockd.address()).ok());
  client.send_to(relay->port(), "refresh");
  const auto got = new_lockd.receive();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->first, "refresh");
  EXPECT_FALSE(old_lockd.receive().has_value());
  new_lockd.send_to(got->second, "ack");
  const auto back = client.receive();
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->first, "ack");
}

TEST(HarnessRelay, AnUnusableTargetIsAnErrorNamingTheCall) {
  const SocketAddress unset;  // no address family: no socket can be made for it
  const auto r = UdpRelay::start(unset);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.code(), Errc::unsupported) << r.message();
  EXPECT_EQ(r.message().rfind("relay socket: ", 0), 0u) << r.message();
}

}  // namespace
}  // namespace leasehold::harness
