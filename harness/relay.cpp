// leasehold/harness: the userspace UDP relay (include/leasehold/harness/relay.hpp).
#include "leasehold/harness/relay.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace leasehold::harness {

Result<std::unique_ptr<UdpRelay>> UdpRelay::start(const SocketAddress& target) {
  std::unique_ptr<UdpRelay> r(new UdpRelay());
  r->front_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  r->back_ = ::socket(target.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (r->front_ < 0 || r->back_ < 0) return Status::from_errno(errno, "relay socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(r->front_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(r->front_, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      ::connect(r->back_, target.sa(), target.length) != 0)
    return Status::from_errno(errno, "relay bind/connect");
  r->port_ = ntohs(a.sin_port);
  r->thread_ = std::thread([p = r.get()] { p->loop(); });
  return r;
}

UdpRelay::~UdpRelay() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (front_ >= 0) ::close(front_);
  if (back_ >= 0) ::close(back_);
}

void UdpRelay::set_answer_filter(AnswerFilter drop) {
  const std::lock_guard<std::mutex> g(filter_mu_);
  filter_ = std::move(drop);
}

Status UdpRelay::retarget(const SocketAddress& target) {
  if (::connect(back_, target.sa(), target.length) != 0) return Status::from_errno(errno, "relay connect");
  return {};
}

bool UdpRelay::drop_answer(std::span<const std::uint8_t> answer) {
  if (cut_answers_.load(std::memory_order_acquire)) return true;
  const std::lock_guard<std::mutex> g(filter_mu_);
  return filter_ && filter_(answer);
}

void UdpRelay::loop() {
  sockaddr_storage client{};
  socklen_t client_len = 0;
  std::uint8_t buf[kRelayDatagramMax];
  while (!stop_.load(std::memory_order_relaxed)) {
    pollfd fds[2] = {{front_, POLLIN, 0}, {back_, POLLIN, 0}};
    if (::poll(fds, 2, kRelayPollMs) <= 0) continue;
    if (fds[0].revents & POLLIN) {
      sockaddr_storage from{};
      socklen_t from_len = sizeof from;
      const ssize_t n = ::recvfrom(front_, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &from_len);
      if (n >= 0) {
        client = from;
        client_len = from_len;
        if (cut_.load(std::memory_order_acquire)) {
          dropped_.fetch_add(1);
        } else {
          ::send(back_, buf, static_cast<std::size_t>(n), MSG_DONTWAIT);
        }
      }
    }
    if (fds[1].revents & POLLIN) {
      const ssize_t n = ::recv(back_, buf, sizeof buf, 0);
      if (n >= 0 && client_len != 0) {
        if (drop_answer(std::span<const std::uint8_t>(buf, static_cast<std::size_t>(n))))
          answers_dropped_.fetch_add(1);
        else
          ::sendto(front_, buf, static_cast<std::size_t>(n), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&client),
                   client_len);
      }
    }
  }
}

}  // namespace leasehold::harness
