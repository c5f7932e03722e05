// leasehold/io: the request client (see client.hpp).
#include "leasehold/io/client.hpp"

#include "leasehold/io/clock.hpp"

#include <linux/errqueue.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace leasehold {

namespace {

std::uint64_t splitmix64(std::uint64_t* state) noexcept {
  std::uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t seed_or_default(std::uint64_t seed) noexcept { return seed != 0 ? seed : random_jitter_seed(); }

constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

// Reads the socket's error queue (IP_RECVERR); returns how many entries were ICMP port
// unreachable for a datagram sent to `to`. Other entries are dropped.
std::uint32_t drain_port_unreachable(int fd, const SocketAddress& to) noexcept {
  std::uint32_t found = 0;
  for (int i = 0; i < 64; ++i) {
    sockaddr_storage dest{};
    char payload[64];
    alignas(cmsghdr) char control[512];
    iovec iov{payload, sizeof payload};
    msghdr msg{};
    msg.msg_name = &dest;
    msg.msg_namelen = sizeof dest;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    if (::recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) break;
    const std::optional<SocketAddress> where =
        SocketAddress::from(reinterpret_cast<const sockaddr*>(&dest), msg.msg_namelen);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      const bool v4 = c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_RECVERR;
      const bool v6 = c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_RECVERR;
      if (!v4 && !v6) continue;
      sock_extended_err ee{};
      std::memcpy(&ee, CMSG_DATA(c), sizeof ee);
      const bool port_unreachable =
          (ee.ee_origin == SO_EE_ORIGIN_ICMP && ee.ee_type == 3 && ee.ee_code == 3) ||   // ICMP
          (ee.ee_origin == SO_EE_ORIGIN_ICMP6 && ee.ee_type == 1 && ee.ee_code == 4);   // ICMPv6
      if (port_unreachable && ee.ee_errno == ECONNREFUSED && where && *where == to) ++found;
    }
  }
  return found;
}

}  // namespace

std::uint64_t random_jitter_seed() noexcept {
  std::uint64_t seed = 0;
  if (::getrandom(&seed, sizeof seed, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof seed))
    seed = static_cast<std::uint64_t>(boottime_ns()) ^ (static_cast<std::uint64_t>(::getpid()) << 32);
  return seed != 0 ? seed : 1;
}

std::int64_t backoff_delay_ns(const RetryPolicy& policy, std::uint32_t retry,
                              std::uint64_t* rng_state) noexcept {
  const std::int64_t cap = std::max<std::int64_t>(policy.backoff_max_ns, 1);
  std::int64_t base = std::clamp<std::int64_t>(policy.first_backoff_ns, 1, cap);
  const std::int64_t mult = std::max<std::uint32_t>(policy.multiplier, 1);
  for (std::uint32_t k = 1; k < retry && base < cap; ++k)
    base = base > cap / mult ? cap : base * mult;  // saturate instead of overflowing
  const std::uint32_t jitter = std::min<std::uint32_t>(policy.jitter_percent, 50);
  // factor in [1 - j, 1 + j], in 1/2^20 steps: u in [0, 2^20].
  const std::int64_t u = static_cast<std::int64_t>(splitmix64(rng_state) % ((1u << 20) + 1));
  const std::int64_t span = base / 100 * jitter + (base % 100) * jitter / 100;  // base * j
  const std::int64_t delta = static_cast<std::int64_t>(
      (static_cast<__int128>(2 * span) * u) >> 20) - span;
  return std::max<std::int64_t>(base + delta, 1);
}

std::int64_t longest_backoff_ns(const RetryPolicy& policy) noexcept {
  const std::int64_t cap = std::max<std::int64_t>(policy.backoff_max_ns, 1);
  const std::int64_t jitter = std::min<std::uint32_t>(policy.jitter_percent, 50);
  // backoff_delay_ns's span is at most cap * j (rounded down there), so this is never below it.
  return cap + cap / 100 * jitter + ((cap % 100) * jitter + 99) / 100;
}

const char* to_string(RequestStatus status) noexcept {
  switch (status) {
    case RequestStatus::answered: return "answered";
    case RequestStatus::deadline_passed: return "deadline passed";
    case RequestStatus::cancelled: return "cancelled";
  }
  return "?";
}

struct RequestClient::Pending {
  std::uint64_t request_id = 0;
  SocketAddress to;
  std::int64_t deadline_ns = 0;
  std::int64_t first_send_ns = 0;
  std::int64_t last_send_ns = 0;
  std::uint32_t attempts = 0;
  std::uint32_t gen = 1;
  bool used = false;
  TimerId timer;
  AnswerHandler on_done;
  std::size_t bytes_len = 0;
  std::byte bytes[kUdpPayloadBytesMax];
};

RequestClient::RequestClient(EventLoop& loop, RequestIdOf id_of, RetryPolicy policy,
                             ClientLimits limits, std::uint64_t jitter_seed)
    : loop_(loop),
      id_of_(id_of),
      policy_(policy),
      limits_(limits),
      rng_state_(seed_or_default(jitter_seed)),
      pending_(limits.outstanding_max) {}

RequestClient::~RequestClient() {
  for (Pending& p : pending_)
    if (p.used && p.timer.valid()) loop_.cancel_timer(p.timer);
  if (socket_.valid()) loop_.close_socket(socket_);
}

int RequestClient::open(const SocketAddress& bind_to) {
  if (socket_.valid()) return -EALREADY;
  int fd = open_udp_socket(bind_to);
  if (fd < 0) return fd;
  socket_ = loop_.add_udp_socket(UniqueFd(fd), [this](const Datagram& d) { on_datagram(d); });
  return socket_.valid() ? 0 : -EBUSY;
}

RequestClient::Pending* RequestClient::find(std::uint64_t request_id, std::uint32_t* index) {
  if (outstanding_ == 0) return nullptr;
  for (std::uint32_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].used && pending_[i].request_id == request_id) {
      *index = i;
      return &pending_[i];
    }
  }
  return nullptr;
}

int RequestClient::start(std::span<const std::byte> request, const SocketAddress& to,
                         std::int64_t deadline_boottime_ns, AnswerHandler on_done) {
  if (!socket_.valid()) return -ENOTCONN;
  if (request.empty() || !on_done || !to.is_set()) return -EINVAL;
  if (request.size() > kUdpPayloadBytesMax) return -EMSGSIZE;
  const std::optional<std::uint64_t> id = id_of_(request);
  if (!id) return -EINVAL;
  std::uint32_t index = 0;
  if (find(*id, &index) != nullptr) return -EEXIST;
  if (deadline_boottime_ns <= loop_.clock().now_ns()) return -ETIMEDOUT;
  auto free_slot = std::find_if(pending_.begin(), pending_.end(), [](const Pending& p) { return !p.used; });
  if (free_slot == pending_.end()) return -EBUSY;

  index = static_cast<std::uint32_t>(free_slot - pending_.begin());
  Pending& p = *free_slot;
  p.request_id = *id;
  p.to = to;
  p.deadline_ns = deadline_boottime_ns;
  p.attempts = 0;
  p.bytes_len = request.size();
  std::memcpy(p.bytes, request.data(), request.size());
  p.on_done = std::move(on_done);
  p.used = true;
  ++outstanding_;
  ++stats_.requests;
  send_attempt(p);
  p.first_send_ns = p.last_send_ns;
  schedule(index);
  if (!p.timer.valid()) {  // timer pool exhausted: undo, the caller learns at once
    p.used = false;
    p.on_done = nullptr;
    ++p.gen;
    --outstanding_;
    --stats_.requests;
    return -EBUSY;
  }
  return 0;
}

void RequestClient::send_attempt(Pending& p) {
  const std::int64_t now = loop_.clock().now_ns();
  ++p.attempts;
  if (p.attempts > 1) {
    ++stats_.retries;
    if (retarget_hook_) retarget_hook_(p.request_id, p.to);
    if (resend_hook_) resend_hook_({p.bytes, p.bytes_len});
  }
  if (observer_) observer_(p.request_id, p.attempts, now);
  p.last_send_ns = now;
  // A refused send (in-flight bound) is as good as a datagram lost on the way: retried later.
  if (loop_.send_to(socket_, {p.bytes, p.bytes_len}, &p.to) != 0) ++stats_.sends_refused;
}

void RequestClient::schedule(std::uint32_t index) {
  Pending& p = pending_[index];
  std::int64_t next = kNever;
  if (p.attempts < policy_.attempts_max) next = p.last_send_ns + backoff_delay_ns(policy_, p.attempts, &rng_state_);
  const std::int64_t at = std::min(next, p.deadline_ns);
  const std::uint32_t gen = p.gen;
  p.timer = loop_.add_timer_at(at, [this, index, gen] { on_timer(index, gen); });
}

void RequestClient::on_timer(std::uint32_t index, std::uint32_t gen) {
  Pending& p = pending_[index];
  if (!p.used || p.gen != gen) return;
  p.timer = {};
  if (loop_.turn_now_ns() >= p.deadline_ns) {
    finish(index, RequestStatus::deadline_passed, {});
    return;
  }
  if (p.attempts < policy_.attempts_max) send_attempt(p);
  schedule(index);
  if (!p.timer.valid()) finish(index, RequestStatus::deadline_passed, {});  // no timer left
}

bool RequestClient::cancel(std::uint64_t request_id) {
  std::uint32_t index = 0;
  if (find(request_id, &index) == nullptr) return false;
  finish(index, RequestStatus::cancelled, {});
  return true;
}

void RequestClient::finish(std::uint32_t index, RequestStatus status, std::span<const std::byte> answer,
                           const SocketAddress& from) {
  Pending& p = pending_[index];
  if (p.timer.valid()) loop_.cancel_timer(p.timer);
  RequestOutcome outcome;
  outcome.status = status;
  outcome.request_id = p.request_id;
  outcome.answer = answer;
  outcome.attempts = p.attempts;
  outcome.first_send_ns = p.first_send_ns;
  outcome.last_send_ns = p.last_send_ns;
  outcome.from = from;
  AnswerHandler handler = std::move(p.on_done);
  p.on_done = nullptr;
  p.timer = {};
  p.used = false;
  ++p.gen;
  --outstanding_;
  if (status == RequestStatus::answered) ++stats_.answered;
  if (status == RequestStatus::deadline_passed) ++stats_.deadlines_passed;
  handler(outcome);  // last: it may start the next request in this very slot
}

void RequestClient::on_datagram(const Datagram& d) {
  const std::optional<std::uint64_t> id = id_of_(d.payload);
  std::uint32_t index = 0;
  if (id && find(*id, &index) != nullptr) {
    if (check_ && !check_(d.payload)) {
      ++stats_.answers_forged;  // the real answer may still come: keep waiting for it
      return;
    }
    finish(index, RequestStatus::answered, d.payload, d.source_address());
    return;
  }
  if (unsolicited_) {
    unsolicited_(d);
  } else {
    ++stats_.answers_unmatched;
  }
}

BlockingOutcome request_blocking(int fd, std::span<const std::byte> request, const SocketAddress& to,
                                 std::int64_t deadline_boottime_ns, RequestIdOf id_of,
                                 std::span<std::byte> answer_out, const RetryPolicy& policy,
                                 std::uint64_t jitter_seed, const AnswerCheck& check,
                                 const DatagramObserver& others) {
  BlockingOutcome out;
  const std::optional<std::uint64_t> id = request.empty() ? std::nullopt : id_of(request);
  if (!id || !to.is_set() || fd < 0) {
    out.error = -EINVAL;
    return out;
  }
  if (request.size() > kUdpPayloadBytesMax) {
    out.error = -EMSGSIZE;
    return out;
  }
  std::uint64_t rng = seed_or_default(jitter_seed);
  std::int64_t next_send = boottime_ns();
  std::byte buf[kUdpPayloadBytesMax];
  drain_port_unreachable(fd, SocketAddress{});  // reports of earlier requests are not this one's
  for (;;) {
    std::int64_t now = boottime_ns();
    if (now >= deadline_boottime_ns) {
      if (out.attempts == 0) out.error = -ETIMEDOUT;
      return out;  // deadline_passed
    }
    if (out.attempts < policy.attempts_max && now >= next_send) {
      ssize_t n = ::sendto(fd, request.data(), request.size(), MSG_DONTWAIT, to.sa(), to.length);
      // ECONNREFUSED: an ICMP error of an earlier datagram, reported on this send (IP_RECVERR).
      if (n < 0 && out.attempts == 0 && errno != EAGAIN && errno != ENOBUFS && errno != EINTR &&
          errno != ECONNREFUSED) {
        out.error = -errno;  // unsendable (bad address, ...): retrying will not help
        return out;
      }
      if (out.attempts == 0) out.first_send_ns = now;
      ++out.attempts;
      next_send = now + backoff_delay_ns(policy, out.attempts, &rng);
    }
    const std::int64_t wait_until =
        std::min(out.attempts < policy.attempts_max ? next_send : kNever, deadline_boottime_ns);
    const std::int64_t wait_ns = std::max<std::int64_t>(wait_until - now, 0);
    pollfd pfd{fd, POLLIN, 0};
    timespec ts{static_cast<time_t>(wait_ns / kNsPerS), static_cast<long>(wait_ns % kNsPerS)};
    if (::ppoll(&pfd, 1, &ts, nullptr) <= 0) continue;  // timeout or EINTR: re-check the clock
    if ((pfd.revents & POLLERR) != 0) out.port_unreachable += drain_port_unreachable(fd, to);
    for (int drained = 0; drained < 64; ++drained) {    // bounded drain per wake-up
      ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
      if (n < 0) break;
      if (static_cast<std::size_t>(n) > sizeof buf) continue;  // truncated: not ours
      std::span<const std::byte> answer{buf, static_cast<std::size_t>(n)};
      const std::optional<std::uint64_t> answer_id = id_of(answer);
      if (!answer_id || *answer_id != *id || (check && !check(answer))) {
        // Another request's, or a forgery (or notice) naming our id: the real answer may follow.
        if (others) others(answer);
        continue;
      }
      out.status = RequestStatus::answered;
      if (answer.size() > answer_out.size()) {
        out.error = -EMSGSIZE;
        return out;
      }
      std::memcpy(answer_out.data(), answer.data(), answer.size());
      out.answer_bytes = answer.size();
      return out;
    }
  }
}

}  // namespace leasehold
