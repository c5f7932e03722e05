// The HTTP endpoint against hostile clients (metrics/http_endpoint.hpp): connections that trickle
// a request one byte at a time, more connections than there are threads, peers beyond the caps
// or outside the allow list. Each client binds its own loopback source address (127.0.0.N), so a
// "peer" is an address, as the caps count them.
#include "leasehold/metrics/http_endpoint.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace leasehold::metrics {
namespace {

using namespace std::chrono_literals;

/// A generous bound for anything the tests wait for: reaching it is a failure, never a measurement.
constexpr auto kPatience = 60s;

int port_of(const HttpEndpoint& ep) { return std::stoi(ep.address().substr(ep.address().rfind(':') + 1)); }

/// A connected TCP socket from `source` (a loopback address) to 127.0.0.1:port.
int connect_from(const std::string& source, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<std::uint16_t>(port));
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Everything the server sends on `fd` until it closes (bounded by kPatience).
std::string read_to_end(int fd) {
  timeval tv{static_cast<time_t>(std::chrono::seconds(kPatience).count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

/// A whole GET from `source`: the raw answer ("" when the connection was closed unanswered).
std::string get(const std::string& source, int port, const std::string& path) {
  const int fd = connect_from(source, port);
  if (fd < 0) return "connect failed: " + std::string(std::strerror(errno));
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: test\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return "";
  }
  std::string answer = read_to_end(fd);
  ::close(fd);
  return answer;
}

/// Whether the server closed `fd` (end of stream or reset), waiting at most `wait_ms`.
bool closed_by_server(int fd, int wait_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, wait_ms) <= 0) return false;
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

/// Waits (at most kPatience) until `done()` holds.
template <class F>
bool eventually(F done) {
  const auto until = std::chrono::steady_clock::now() + kPatience;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::unique_ptr<HttpEndpoint> start_endpoint(const HttpLimits& limits = {}) {
  auto ep = HttpEndpoint::start(
      "127.0.0.1:0", [] { return HttpAnswer{200, "metrics\n"}; }, [] { return HttpAnswer{200, "serving\n"}; }, limits);
  EXPECT_TRUE(ep) << ep.message();
  return ep ? std::move(ep).value() : nullptr;
}

/// Connections that trickle an endless header, one byte per connection every 100 ms, from a
/// thread of their own, until destroyed.
class Tricklers {
 public:
  Tricklers(const std::string& source, int port, int count) {
    for (int i = 0; i < count; ++i) {
      const int fd = connect_from(source, port);
      EXPECT_GE(fd, 0) << std::strerror(errno);
      if (fd < 0) continue;
      const std::string start = "GET /healthz HTTP/1.1\r\nX-Slow: ";
      [[maybe_unused]] const ssize_t n = ::send(fd, start.data(), start.size(), MSG_NOSIGNAL);
      fds_.push_back(fd);
    }
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        for (const int fd : fds_) [[maybe_unused]] const ssize_t n = ::send(fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        std::this_thread::sleep_for(100ms);
      }
    });
  }
  ~Tricklers() {
    stop_ = true;
    thread_.join();
    for (const int fd : fds_) ::close(fd);
  }
  const std::vector<int>& fds() const { return fds_; }

 private:
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The attack on the endpoint as the daemons run it (the default limits): 40 connections that
// trickle a request forever, far more than the threads that answer. A /healthz from another
// address is still answered, with its body.
TEST(HttpEndpoint, TricklingConnectionsDoNotKeepHealthzFromBeingAnswered) {
  auto ep = start_endpoint();
  ASSERT_NE(ep, nullptr);
  const int port = port_of(*ep);
  Tricklers slow("127.0.0.1", port, 40);
  const std::string answer = get("127.0.0.2", port, "/healthz");
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
  EXPECT_NE(answer.find("\r\n\r\nserving\n"), std::string::npos) << answer;
  EXPECT_NE(answer.find("Connection: close\r\n"), std::string::npos) << answer;
}

// The caps: connections beyond the per-peer cap, and beyond the cap in all, are closed at once;
// a slot that frees admits the next connection. (A long request deadline here, so that only the
// caps close anything.)
TEST(HttpEndpoint, ConnectionsBeyondTheCapsAreClosedAtOnce) {
  HttpLimits limits;
  limits.connections_max = 12;
  limits.connections_per_peer_max = 8;
  limits.request_deadline_ns = 600'000'000'000;
  auto ep = start_endpoint(limits);
  ASSERT_NE(ep, nullptr);
  const int port = port_of(*ep);
  auto one = std::make_unique<Tricklers>("127.0.0.1", port, 10);  // 8 admitted, 2 closed (peer cap)
  ASSERT_TRUE(eventually([&] { return ep->counts().accepted + ep->counts().refused_peer == 10; }));
  EXPECT_EQ(ep->counts().accepted, 8u);
  EXPECT_EQ(ep->counts().refused_peer, 2u);
  auto closed = [&] {
    int n = 0;
    for (const int fd : one->fds()) n += closed_by_server(fd, 0) ? 1 : 0;
    return n;
  };
  EXPECT_TRUE(eventually([&] { return closed() == 2; })) << closed();
  Tricklers three("127.0.0.3", port, 4);  // 4 admitted: 12 in all
  ASSERT_TRUE(eventually([&] { return ep->counts().accepted == 12; }));
  // Full: a request from a new peer is closed unanswered, at once.
  EXPECT_EQ(get("127.0.0.4", port, "/healthz"), "");
  // (Counted just after the close the client saw.)
  EXPECT_TRUE(eventually([&] { return ep->counts().refused_full == 1; })) << ep->counts().refused_full;
  // The first peer goes away: its slots admit the next request.
  one.reset();
  ASSERT_TRUE(eventually([&] {
    const std::string answer = get("127.0.0.4", port, "/metrics");
    return answer.rfind("HTTP/1.1 200 OK\r\n", 0) == 0 && answer.find("\r\n\r\nmetrics\n") != std::string::npos;
  }));
  EXPECT_EQ(ep->counts().request_deadline, 0u);
}

// A request that is not complete at its deadline is closed unanswered, however steadily its
// bytes trickle in (a per-read timeout would never fire). The connection sends a byte every
// 50 ms for as long as it stays open; it must be closed by the deadline, not by the request size
// cap (8 KiB: 400 s at this pace) and not answered.
TEST(HttpEndpoint, AnIncompleteRequestIsClosedAtItsDeadlineHoweverItTrickles) {
  EXPECT_EQ(HttpLimits{}.request_deadline_ns, 2'000'000'000);  // the daemons'
  HttpLimits limits;
  limits.request_deadline_ns = 300'000'000;
  auto ep = start_endpoint(limits);
  ASSERT_NE(ep, nullptr);
  const int fd = connect_from("127.0.0.1", port_of(*ep));
  ASSERT_GE(fd, 0);
  const std::string start = "GET /healthz HTTP/1.1\r\nX-Slow: ";
  ASSERT_EQ(::send(fd, start.data(), start.size(), MSG_NOSIGNAL), static_cast<ssize_t>(start.size()));
  std::size_t sent = start.size();
  const auto until = std::chrono::steady_clock::now() + kPatience;
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() < until) {
    closed = closed_by_server(fd, 50);
    if (!closed && ::send(fd, "a", 1, MSG_NOSIGNAL) == 1) ++sent;
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(sent, 8192u);
  EXPECT_EQ(read_to_end(fd), "");  // nothing was answered
  ::close(fd);
  EXPECT_EQ(ep->counts().request_deadline, 1u);
  EXPECT_EQ(ep->counts().answered, 0u);
}

// --metrics-allow: a peer outside the allow list is closed at accept; one inside is answered. A
// malformed list is refused at start.
TEST(HttpEndpoint, TheAllowListClosesOtherPeers) {
  HttpLimits limits;
  limits.allow = "192.0.2.0/24,127.0.0.2";
  auto ep = start_endpoint(limits);
  ASSERT_NE(ep, nullptr);
  const int port = port_of(*ep);
  EXPECT_EQ(get("127.0.0.1", port, "/healthz"), "");
  EXPECT_TRUE(eventually([&] { return ep->counts().refused_allow == 1; })) << ep->counts().refused_allow;
  const std::string answer = get("127.0.0.2", port, "/healthz");
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
  limits.allow = "127.0.0.0/8";
  auto wide = start_endpoint(limits);
  ASSERT_NE(wide, nullptr);
  EXPECT_EQ(get("127.0.0.9", port_of(*wide), "/metrics").rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  for (const char* bad : {"10.0.0.0/33", "localhost", "10.0.0.0/", "::1/129", "10.0.0.1,"}) {
    limits.allow = bad;
    const auto refused = HttpEndpoint::start("127.0.0.1:0", [] { return HttpAnswer{}; }, [] { return HttpAnswer{}; }, limits);
    ASSERT_FALSE(refused) << bad;
    EXPECT_EQ(refused.code(), Errc::invalid_argument) << bad;
    EXPECT_NE(refused.message().find("--metrics-allow"), std::string::npos) << refused.message();
  }
}

// Anything but our two paths is 404, and a request that is no HTTP is answered 400, not hung on.
TEST(HttpEndpoint, OtherPathsAndGarbage) {
  auto ep = start_endpoint();
  ASSERT_NE(ep, nullptr);
  const int port = port_of(*ep);
  EXPECT_EQ(get("127.0.0.1", port, "/other").rfind("HTTP/1.1 404 ", 0), 0u);
  const int fd = connect_from("127.0.0.1", port);
  ASSERT_GE(fd, 0);
  const std::string junk = "\x01\x02 nonsense\r\n\r\n";
  ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  EXPECT_EQ(read_to_end(fd).rfind("HTTP/1.1 400 ", 0), 0u);
  ::close(fd);
}

}  // namespace
}  // namespace leasehold::metrics
