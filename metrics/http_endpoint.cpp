// The one translation unit that includes cpp-httplib (a large header): keep it that way, so the
// daemons' other code compiles without it.
//
// Why not httplib::Server::listen: its accept loop hands each connection to a pool thread that
// reads the request with a per-recv timeout (set_read_timeout). A client that sends one byte
// every half second never trips it, so a few such clients (a sandbox shares the worker's
// network) hold every pool thread and /healthz goes unanswered; and its accept loop offers no
// hook to see, count or refuse a connection. So this file owns the sockets itself:
//
//   the socket thread   one poll() over the listening socket, a wake eventfd and every
//                       connection (all non-blocking). It admits or closes each accepted
//                       connection (allow list, caps in all and per peer), reads a request until
//                       its blank line or its deadline, hands a complete one to the answerers,
//                       and writes their answer out, again under a deadline. It never blocks on a
//                       client and never runs a handler.
//   the answerers       HttpLimits::answer_threads threads that take complete requests from a
//                       queue and run cpp-httplib's request parser, router and response writer
//                       (Server::process_request) on a memory stream: the request bytes in, the
//                       response bytes out. Only they call the handlers (which may wait for the
//                       io thread's snapshot).
//
// One request per connection (Connection: close): a scrape opens a connection each time, and a
// kept-alive idle connection would hold a slot for nothing.
#include "leasehold/metrics/http_endpoint.hpp"

#include "leasehold/lease/clock.hpp"
#include "leasehold/metrics/exchange.hpp"
#include "leasehold/metrics/exposition.hpp"

#include <httplib.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace leasehold::metrics {

namespace {

/// A request's bytes at most (request line and headers; GETs carry no body).
constexpr std::size_t kRequestBytesMax = 8192;

/// An address as 16 bytes: IPv6 as it is, IPv4 as ::ffff:a.b.c.d (so a dual-stack socket's
/// mapped peers count and match as the IPv4 peers they are).
using Addr16 = std::array<unsigned char, 16>;

Addr16 v4_mapped(const in_addr& a) {
  Addr16 out{};
  out[10] = 0xff;
  out[11] = 0xff;
  std::memcpy(out.data() + 12, &a, 4);
  return out;
}

bool addr16_of(const sockaddr_storage& ss, Addr16& out) {
  if (ss.ss_family == AF_INET) {
    out = v4_mapped(reinterpret_cast<const sockaddr_in&>(ss).sin_addr);
    return true;
  }
  if (ss.ss_family == AF_INET6) {
    std::memcpy(out.data(), &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, 16);
    return true;
  }
  return false;
}

/// One entry of the allow list: the first `bits` bits of `net` (over the 16-byte form).
struct Cidr {
  Addr16 net{};
  unsigned bits = 0;
  bool contains(const Addr16& a) const {
    for (unsigned i = 0; i < bits; ++i) {
      const unsigned mask = 0x80u >> (i % 8);
      if ((net[i / 8] & mask) != (a[i / 8] & mask)) return false;
    }
    return true;
  }
};

/// "CIDR[,CIDR...]": ADDR or ADDR/PREFIX, IPv4 or IPv6 (no brackets).
Result<std::vector<Cidr>> parse_allow(const std::string& text) {
  std::vector<Cidr> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string entry = text.substr(start, comma - start);
    start = comma + 1;
    const Status bad{Errc::invalid_argument, "--metrics-allow: \"" + entry +
                                                 "\" is not ADDR or ADDR/PREFIX (e.g. 10.0.0.0/8, 192.0.2.7, fd00::/8)"};
    const std::size_t slash = entry.find('/');
    const std::string addr = entry.substr(0, slash);
    Cidr c;
    unsigned max_bits = 0;
    in_addr v4{};
    in6_addr v6{};
    if (::inet_pton(AF_INET, addr.c_str(), &v4) == 1) {
      c.net = v4_mapped(v4);
      max_bits = 32;
    } else if (::inet_pton(AF_INET6, addr.c_str(), &v6) == 1) {
      std::memcpy(c.net.data(), &v6, 16);
      max_bits = 128;
    } else {
      return bad;
    }
    unsigned prefix = max_bits;
    if (slash != std::string::npos) {
      const std::string p = entry.substr(slash + 1);
      if (p.empty() || p.size() > 3 || p.find_first_not_of("0123456789") != std::string::npos) return bad;
      prefix = static_cast<unsigned>(std::atoi(p.c_str()));
      if (prefix > max_bits) return bad;
    }
    c.bits = prefix + (max_bits == 32 ? 96 : 0);
    out.push_back(c);
  }
  return out;
}

/// "HOST:PORT" or "[V6]:PORT" into host and port (0..65535).
Result<std::pair<std::string, int>> split_listen(const std::string& listen) {
  const Status bad{Errc::invalid_argument, "--metrics-listen \"" + listen + "\" is not ADDR:PORT (e.g. 127.0.0.1:9740, [::1]:9740)"};
  const std::size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) return bad;
  std::string host = listen.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad;
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    return bad;  // a bare IPv6 address needs brackets
  }
  const std::string port_text = listen.substr(colon + 1);
  char* end = nullptr;
  errno = 0;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || port < 0 || port > 65535 || port_text.front() < '0' || port_text.front() > '9')
    return bad;
  return std::pair<std::string, int>{std::move(host), static_cast<int>(port)};
}

/// A listening TCP socket (non-blocking) on host:port; SO_REUSEADDR alone (with SO_REUSEPORT a
/// second daemon given the same port would bind it too and scrapes would alternate). -1 when
/// no address of `host` can be bound.
int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  return fd;
}

/// cpp-httplib's view of one buffered request: reads come from the bytes the socket thread
/// collected (then end of stream), writes go to the answer. No socket is touched here.
class MemoryStream final : public httplib::Stream {
 public:
  MemoryStream(const std::string& in, std::string& out, const std::string& peer_ip, int peer_port)
      : in_(in), out_(out), peer_ip_(peer_ip), peer_port_(peer_port) {}
  bool is_readable() const override { return pos_ < in_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const std::size_t n = std::min(size, in_.size() - pos_);
    std::memcpy(ptr, in_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = peer_ip_;
    port = peer_port_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip.clear();
    port = 0;
  }
  // No descriptor: httplib's FD_SETSIZE check must not refuse a request because of the fd number.
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  const std::string& in_;
  std::string& out_;
  const std::string& peer_ip_;
  int peer_port_;
  std::size_t pos_ = 0;
};

/// httplib::Server for its router and request parser only (process_request is protected).
class Router final : public httplib::Server {
 public:
  std::string answer(const std::string& request, const std::string& peer_ip, int peer_port) {
    std::string out;
    MemoryStream stream(request, out, peer_ip, peer_port);
    bool closed = true;
    process_request(stream, /*close_connection=*/true, closed, nullptr);
    return out;
  }
};

void answer(httplib::Response& res, const HttpAnswer& a) {
  res.status = a.status;
  res.set_content(a.body, a.content_type.c_str());
}

}  // namespace

struct HttpEndpoint::Server {
  HttpLimits limits;
  std::vector<Cidr> allow;
  Router router;
  int listen_fd = -1;
  int wake_fd = -1;  ///< eventfd: an answer is ready, or stop
  std::atomic<bool> stopping{false};

  struct Job {
    std::uint64_t id;
    std::string request;
    std::string peer_ip;
    int peer_port;
  };
  struct Done {
    std::uint64_t id;
    std::string response;
  };
  std::mutex mu;
  std::condition_variable work;
  std::deque<Job> jobs;   ///< guarded by mu
  std::deque<Done> done;  ///< guarded by mu

  mutable std::mutex counts_mu;
  Counts counts;  ///< guarded by counts_mu

  std::thread socket_thread;
  std::vector<std::thread> answerers;

  ~Server() {
    if (listen_fd >= 0) ::close(listen_fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
  }
  void count(std::uint64_t Counts::*field) {
    std::lock_guard lock(counts_mu);
    ++(counts.*field);
  }

  void answer_loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu);
        work.wait(lock, [&] { return stopping.load() || !jobs.empty(); });
        if (stopping.load()) return;  // queued requests are dropped with their connections
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      std::string response = router.answer(job.request, job.peer_ip, job.peer_port);
      {
        std::lock_guard lock(mu);
        done.push_back(Done{job.id, std::move(response)});
      }
      wake();
    }
  }

  struct Conn {
    int fd = -1;
    Addr16 peer{};
    std::string peer_ip;
    int peer_port = 0;
    enum class State { reading, answering, writing } state = State::reading;
    std::int64_t deadline_ns = 0;  ///< reading: of the request; writing: of the answer
    std::string in;
    std::string out;
    std::size_t sent = 0;
  };

  void socket_loop() {
    std::map<std::uint64_t, Conn> conns;
    std::map<Addr16, unsigned> per_peer;
    std::uint64_t next_id = 1;
    std::int64_t accept_paused_until = 0;  // after EMFILE/ENFILE: no busy loop on a readable listener
    auto close_conn = [&](std::map<std::uint64_t, Conn>::iterator it) {
      ::close(it->second.fd);
      if (--per_peer[it->second.peer] == 0) per_peer.erase(it->second.peer);
      return conns.erase(it);
    };
    // Sends what the socket takes now; true when the connection is finished (all sent, or failed).
    auto flush = [&](Conn& c) {
      while (c.sent < c.out.size()) {
        const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) {
          c.sent += static_cast<std::size_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        return !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
      }
      count(&Counts::answered);
      ::shutdown(c.fd, SHUT_WR);
      return true;
    };
    std::vector<pollfd> fds;
    std::vector<std::uint64_t> ids;
    while (!stopping.load()) {
      std::int64_t now = boottime_ns();
      std::int64_t next = accept_paused_until > now ? accept_paused_until : INT64_MAX;
      fds.clear();
      ids.clear();
      fds.push_back({wake_fd, POLLIN, 0});
      fds.push_back({accept_paused_until > now ? -1 : listen_fd, POLLIN, 0});
      for (const auto& [id, c] : conns) {
        if (c.state == Conn::State::answering) continue;  // neither read nor timed: an answerer has it
        fds.push_back({c.fd, static_cast<short>(c.state == Conn::State::reading ? POLLIN : POLLOUT), 0});
        ids.push_back(id);
        next = std::min(next, c.deadline_ns);
      }
      const int timeout_ms =
          next == INT64_MAX ? -1 : static_cast<int>(std::clamp<std::int64_t>((next - now + 999'999) / 1'000'000, 0, 60'000));
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
      now = boottime_ns();
      if ((fds[0].revents & POLLIN) != 0) {
        std::uint64_t v = 0;
        [[maybe_unused]] const ssize_t n = ::read(wake_fd, &v, sizeof v);
        std::deque<Done> ready;
        {
          std::lock_guard lock(mu);
          ready.swap(done);
        }
        for (Done& d : ready) {
          const auto it = conns.find(d.id);
          if (it == conns.end()) continue;
          Conn& c = it->second;
          c.out = std::move(d.response);
          c.state = Conn::State::writing;
          c.deadline_ns = now + limits.answer_deadline_ns;
          if (flush(c)) close_conn(it);
        }
      }
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const pollfd& p = fds[i + 2];
        if (p.revents == 0) continue;
        const auto it = conns.find(ids[i]);
        if (it == conns.end()) continue;
        Conn& c = it->second;
        if (c.state == Conn::State::writing) {
          if (flush(c)) close_conn(it);
          continue;
        }
        // Reading: take what is there; the request is complete at its blank line.
        char buf[2048];
        const ssize_t n = ::recv(c.fd, buf, std::min(sizeof buf, kRequestBytesMax - c.in.size()), 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (n <= 0) {  // closed by the client, or failed
          close_conn(it);
          continue;
        }
        c.in.append(buf, static_cast<std::size_t>(n));
        if (c.in.find("\r\n\r\n") != std::string::npos) {
          c.state = Conn::State::answering;
          {
            std::lock_guard lock(mu);
            jobs.push_back(Job{it->first, std::move(c.in), c.peer_ip, c.peer_port});
          }
          c.in.clear();
          work.notify_one();
        } else if (c.in.size() >= kRequestBytesMax) {
          close_conn(it);  // no blank line in 8 KiB: not a request of ours
        }
      }
      // Deadlines: a request still incomplete, or an answer the client does not take.
      for (auto it = conns.begin(); it != conns.end();) {
        if (it->second.state != Conn::State::answering && it->second.deadline_ns <= now) {
          if (it->second.state == Conn::State::reading) count(&Counts::request_deadline);
          it = close_conn(it);
        } else {
          ++it;
        }
      }
      if ((fds[1].revents & POLLIN) != 0) accept_all(conns, per_peer, next_id, accept_paused_until, now);
    }
    for (auto& [id, c] : conns) ::close(c.fd);
  }

  /// Accepts every pending connection and admits or closes each at once.
  void accept_all(std::map<std::uint64_t, Conn>& conns, std::map<Addr16, unsigned>& per_peer, std::uint64_t& next_id,
                  std::int64_t& accept_paused_until, std::int64_t now) {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          accept_paused_until = now + 100'000'000;
        return;  // EAGAIN: none left
      }
      Addr16 peer{};
      if (!addr16_of(ss, peer)) {
        ::close(fd);
        continue;
      }
      if (!allow.empty() && std::none_of(allow.begin(), allow.end(), [&](const Cidr& c) { return c.contains(peer); })) {
        ::close(fd);  // before it is counted: whoever sees the count sees the close
        count(&Counts::refused_allow);
        continue;
      }
      if (conns.size() >= limits.connections_max) {
        ::close(fd);  // before it is counted: whoever sees the count sees the close
        count(&Counts::refused_full);
        continue;
      }
      const auto seen = per_peer.find(peer);
      if (seen != per_peer.end() && seen->second >= limits.connections_per_peer_max) {
        ::close(fd);  // before it is counted: whoever sees the count sees the close
        count(&Counts::refused_peer);
        continue;
      }
      Conn c;
      c.fd = fd;
      c.peer = peer;
      char text[INET6_ADDRSTRLEN] = {};
      if (ss.ss_family == AF_INET) {
        const auto& sin = reinterpret_cast<const sockaddr_in&>(ss);
        ::inet_ntop(AF_INET, &sin.sin_addr, text, sizeof text);
        c.peer_port = ntohs(sin.sin_port);
      } else {
        const auto& sin6 = reinterpret_cast<const sockaddr_in6&>(ss);
        ::inet_ntop(AF_INET6, &sin6.sin6_addr, text, sizeof text);
        c.peer_port = ntohs(sin6.sin6_port);
      }
      c.peer_ip = text;
      c.deadline_ns = now + limits.request_deadline_ns;
      ++per_peer[peer];
      conns.emplace(next_id++, std::move(c));
      count(&Counts::accepted);
    }
  }
};

HttpEndpoint::HttpEndpoint() = default;

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::start(const std::string& listen, Handler metrics, Handler healthz,
                                                          const HttpLimits& limits) {
  auto where = split_listen(listen);
  if (!where) return where.status();
  const auto& [host, port] = *where;
  std::vector<Cidr> allow;
  if (!limits.allow.empty()) {
    auto parsed = parse_allow(limits.allow);
    if (!parsed) return parsed.status();
    allow = std::move(parsed).value();
  }
  std::unique_ptr<HttpEndpoint> ep(new HttpEndpoint());
  ep->server_ = std::make_unique<Server>();
  Server& s = *ep->server_;
  s.limits = limits;
  s.limits.answer_threads = std::max(1u, limits.answer_threads);
  s.allow = std::move(allow);
  s.router.set_payload_max_length(4096);  // GETs only
  s.router.Get("/metrics", [metrics = std::move(metrics)](const httplib::Request&, httplib::Response& res) {
    answer(res, metrics());
  });
  s.router.Get("/healthz", [healthz = std::move(healthz)](const httplib::Request&, httplib::Response& res) {
    answer(res, healthz());
  });
  s.listen_fd = listen_on(host, port);
  if (s.listen_fd < 0)
    return Status{Errc::io_error, "--metrics-listen " + listen + ": cannot bind (in use, or not an address of this host)"};
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  int bound_port = port;
  if (::getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0)
    bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(bound).sin6_port
                                                   : reinterpret_cast<const sockaddr_in&>(bound).sin_port);
  s.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.wake_fd < 0) return Status::from_errno(errno, "--metrics-listen " + listen + ": eventfd");
  ep->address_ = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(bound_port);
  for (unsigned i = 0; i < s.limits.answer_threads; ++i) s.answerers.emplace_back([&s] { s.answer_loop(); });
  s.socket_thread = std::thread([&s] { s.socket_loop(); });
  return ep;
}

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::serve(const std::string& listen, SnapshotExchange& exchange,
                                                          std::string prefix, std::string who, const HttpLimits& limits) {
  const std::string stalled = who + "'s io thread did not answer within 1 s\n";
  return start(
      listen,
      [&exchange, prefix = std::move(prefix), stalled] {
        const auto snap = exchange.get(kSnapshotWaitNs);
        if (!snap) return HttpAnswer{503, stalled};
        return HttpAnswer{200, format_text(prefix, *snap), kPrometheusContentType};
      },
      [&exchange, stalled] {
        const auto snap = exchange.get(kSnapshotWaitNs);
        if (!snap) return HttpAnswer{503, stalled};
        return HttpAnswer{snap->healthy ? 200 : 503, snap->health + "\n"};
      },
      limits);
}

HttpEndpoint::Counts HttpEndpoint::counts() const {
  std::lock_guard lock(server_->counts_mu);
  return server_->counts;
}

HttpEndpoint::~HttpEndpoint() {
  if (!server_) return;
  Server& s = *server_;
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
  }
  s.work.notify_all();
  s.wake();
  if (s.socket_thread.joinable()) s.socket_thread.join();
  for (std::thread& t : s.answerers) t.join();
}

}  // namespace leasehold::metrics
