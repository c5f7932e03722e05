// UDP ping-pong over loopback: the io_uring EventLoop against the classic ways of doing it,
// measured in the same run. One "item" is one round trip (request out, echo back).
//
// Every variant runs on one thread with two sockets on 127.0.0.1: A sends `batch` datagrams of
// kPayloadBytes to B, B echoes each to its source, A counts the echoes; a round ends when all
// `batch` echoes are back. Same payload, same socket pairs, same thread, so the difference is
// the I/O mechanism:
//   Uring      EventLoop: multishot recvmsg on both sockets, sends through the loop; one
//              io_uring_enter per run_once submits the queued sends and waits.
//   UringSingleIssuer  the same with LoopConfig::single_issuer (SINGLE_ISSUER|DEFER_TASKRUN).
//   Blocking   plain blocking sendmsg/recvmsg, four syscalls per round trip (the baseline the
//              issue asks for at batch 1 and 64).
// Loaded (the daemon's real situation: many timers and sockets registered, few active):
//   Uring      + 1,000 pending timeouts and 100 idle UDP sockets with their multishot recvmsg.
//   Epoll      epoll over the same 102 non-blocking sockets + a binary heap of 1,000 deadlines:
//              each iteration reads the clock, takes the nearest deadline as the epoll timeout,
//              drains the ready sockets with recvmsg until EAGAIN, pops expired deadlines. This
//              is how an epoll event loop with timers works; the fairest readiness baseline.
//   Poll       the same with poll(2) over the 102 fds (its cost grows with idle fds).
// The timers are 1 h away so none fires during the run: they are live state, not work.
// items_per_second is computed on CPU time (Google Benchmark's default), which is steadier
// than wall time on a shared machine; run on a quiet machine for wall-clock rates.
#include "leasehold/io/clock.hpp"
#include "leasehold/io/loop.hpp"
#include "leasehold/io/udp.hpp"
#include "perf/common/ratio_report.hpp"

#include <benchmark/benchmark.h>

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <functional>
#include <map>
#include <queue>
#include <string>
#include <vector>

namespace {

using namespace leasehold;

constexpr std::size_t kPayloadBytes = 128;  // a small heartbeat batch
constexpr int kIdleSockets = 100;
constexpr int kLiveTimers = 1000;
constexpr std::int64_t kTimerHorizonNs = 3600 * kNsPerS;

struct Pair {
  UniqueFd a, b;
  SocketAddress a_addr, b_addr;
  explicit Pair(bool blocking) {
    auto open = blocking ? open_udp_socket_blocking : open_udp_socket;
    a.reset(open(SocketAddress::loopback_v4(0)));
    b.reset(open(SocketAddress::loopback_v4(0)));
    a_addr = *local_address(a.get());
    b_addr = *local_address(b.get());
  }
};

std::vector<UniqueFd> idle_sockets(int n) {
  std::vector<UniqueFd> v;
  for (int i = 0; i < n; ++i) v.emplace_back(open_udp_socket(SocketAddress::loopback_v4(0)));
  return v;
}

// ---- io_uring -----------------------------------------------------------------------------

void run_uring(benchmark::State& state, bool loaded, bool single_issuer) {
  const int batch = static_cast<int>(state.range(0));
  ProbeResult error;
  LoopConfig config;
  config.single_issuer = single_issuer;
  auto loop = EventLoop::create(config, &error);
  if (!loop) {
    state.SkipWithError(error.message.c_str());
    return;
  }
  Pair p(false);
  const SocketAddress b_addr = p.b_addr;
  int echoes = 0;
  SocketId b;
  SocketId a = loop->add_udp_socket(std::move(p.a), [&](const Datagram&) { ++echoes; });
  b = loop->add_udp_socket(std::move(p.b), [&](const Datagram& d) {
    SocketAddress from = d.source_address();
    loop->send_to(b, d.payload, &from);
  });
  if (loaded) {
    for (auto& fd : idle_sockets(kIdleSockets)) loop->add_udp_socket(std::move(fd), [](const Datagram&) {});
    const std::int64_t now = boottime_ns();
    for (int i = 0; i < kLiveTimers; ++i) loop->add_timer_at(now + kTimerHorizonNs + i * kNsPerMs, [] {});
  }
  std::byte payload[kPayloadBytes] = {};
  for (auto _ : state) {
    echoes = 0;
    for (int i = 0; i < batch; ++i) loop->send_to(a, payload, &b_addr);
    while (echoes < batch) {
      if (loop->run_once(kNsPerS) <= 0) {
        state.SkipWithError("no completion within 1 s: a datagram was lost");
        return;
      }
    }
  }
  if (loop->stats().sends_dropped_in_flight_full != 0 || loop->stats().kernel_drops != 0)
    state.SkipWithError("datagrams dropped");
  state.SetItemsProcessed(state.iterations() * batch);
}

void BM_PingPong_Uring(benchmark::State& state) { run_uring(state, false, false); }
void BM_PingPong_UringSingleIssuer(benchmark::State& state) { run_uring(state, false, true); }
void BM_PingPongLoaded_Uring(benchmark::State& state) { run_uring(state, true, false); }
void BM_PingPongLoaded_UringSingleIssuer(benchmark::State& state) { run_uring(state, true, true); }

// ---- blocking sendmsg / recvmsg -------------------------------------------------------------

bool send_one(int fd, const void* data, std::size_t len, const SocketAddress& to) {
  iovec iov{const_cast<void*>(data), len};
  msghdr m{};
  m.msg_name = const_cast<sockaddr*>(to.sa());
  m.msg_namelen = to.length;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  return ::sendmsg(fd, &m, 0) == static_cast<ssize_t>(len);
}

// Receives one datagram; the source lands in *from. Returns its length or -errno.
ssize_t recv_one(int fd, void* buf, std::size_t len, SocketAddress* from, int flags) {
  iovec iov{buf, len};
  msghdr m{};
  m.msg_name = &from->storage;
  m.msg_namelen = sizeof from->storage;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  ssize_t n = ::recvmsg(fd, &m, flags);
  from->length = m.msg_namelen;
  return n < 0 ? -errno : n;
}

void BM_PingPong_Blocking(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  Pair p(true);
  std::byte payload[kPayloadBytes] = {};
  std::byte buf[kUdpPayloadBytesMax];
  SocketAddress from;
  for (auto _ : state) {
    for (int i = 0; i < batch; ++i) send_one(p.a.get(), payload, sizeof payload, p.b_addr);
    for (int i = 0; i < batch; ++i) {
      ssize_t n = recv_one(p.b.get(), buf, sizeof buf, &from, 0);
      send_one(p.b.get(), buf, static_cast<std::size_t>(n), from);
    }
    for (int i = 0; i < batch; ++i) recv_one(p.a.get(), buf, sizeof buf, &from, 0);
  }
  state.SetItemsProcessed(state.iterations() * batch);
}

// ---- epoll / poll loops over 102 sockets with a timer heap ------------------------------------

struct ReadinessLoop {
  Pair p{false};
  std::vector<UniqueFd> idle = idle_sockets(kIdleSockets);
  std::priority_queue<std::int64_t, std::vector<std::int64_t>, std::greater<>> deadlines;
  int echoes = 0;
  std::byte buf[kUdpPayloadBytesMax];

  ReadinessLoop() {
    const std::int64_t now = boottime_ns();
    for (int i = 0; i < kLiveTimers; ++i) deadlines.push(now + kTimerHorizonNs + i * kNsPerMs);
  }
  // Timeout for the wait: until the nearest deadline, capped at 1 s (ms for epoll/poll).
  int timeout_ms() const {
    const std::int64_t left = deadlines.top() - boottime_ns();
    return static_cast<int>(std::clamp<std::int64_t>(left / kNsPerMs, 0, 1000));
  }
  void expire() {
    const std::int64_t now = boottime_ns();
    while (!deadlines.empty() && deadlines.top() <= now) deadlines.pop();
  }
  void on_readable(int fd) {
    SocketAddress from;
    for (;;) {
      ssize_t n = recv_one(fd, buf, sizeof buf, &from, MSG_DONTWAIT);
      if (n < 0) return;
      if (fd == p.b.get()) {
        send_one(p.b.get(), buf, static_cast<std::size_t>(n), from);
      } else {
        ++echoes;
      }
    }
  }
};

void BM_PingPongLoaded_Epoll(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  ReadinessLoop r;
  UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  auto add = [&](int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, fd, &ev);
  };
  add(r.p.a.get());
  add(r.p.b.get());
  for (auto& fd : r.idle) add(fd.get());
  std::byte payload[kPayloadBytes] = {};
  epoll_event events[64];
  for (auto _ : state) {
    r.echoes = 0;
    for (int i = 0; i < batch; ++i) send_one(r.p.a.get(), payload, sizeof payload, r.p.b_addr);
    while (r.echoes < batch) {
      int n = ::epoll_wait(ep.get(), events, 64, r.timeout_ms());
      if (n == 0) {
        state.SkipWithError("no readiness within 1 s: a datagram was lost");
        return;
      }
      for (int i = 0; i < n; ++i) r.on_readable(events[i].data.fd);
      r.expire();
    }
  }
  state.SetItemsProcessed(state.iterations() * batch);
}

void BM_PingPongLoaded_Poll(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  ReadinessLoop r;
  std::vector<pollfd> fds;
  fds.push_back({r.p.a.get(), POLLIN, 0});
  fds.push_back({r.p.b.get(), POLLIN, 0});
  for (auto& fd : r.idle) fds.push_back({fd.get(), POLLIN, 0});
  std::byte payload[kPayloadBytes] = {};
  for (auto _ : state) {
    r.echoes = 0;
    for (int i = 0; i < batch; ++i) send_one(r.p.a.get(), payload, sizeof payload, r.p.b_addr);
    while (r.echoes < batch) {
      int n = ::poll(fds.data(), fds.size(), r.timeout_ms());
      if (n == 0) {
        state.SkipWithError("no readiness within 1 s: a datagram was lost");
        return;
      }
      for (auto& f : fds)
        if (f.revents & POLLIN) r.on_readable(f.fd);
      r.expire();
    }
  }
  state.SetItemsProcessed(state.iterations() * batch);
}

BENCHMARK(BM_PingPong_Uring)->Arg(1)->Arg(64)->MinTime(1.0);
BENCHMARK(BM_PingPong_UringSingleIssuer)->Arg(1)->Arg(64)->MinTime(1.0);
BENCHMARK(BM_PingPong_Blocking)->Arg(1)->Arg(64)->MinTime(1.0);
BENCHMARK(BM_PingPongLoaded_Uring)->Arg(1)->Arg(64)->MinTime(1.0);
BENCHMARK(BM_PingPongLoaded_UringSingleIssuer)->Arg(1)->Arg(64)->MinTime(1.0);
BENCHMARK(BM_PingPongLoaded_Epoll)->Arg(1)->Arg(64)->MinTime(1.0);
BENCHMARK(BM_PingPongLoaded_Poll)->Arg(1)->Arg(64)->MinTime(1.0);

// At the end: round trips/s of io_uring and of the other loop, and the ratio io_uring / other,
// for every pair that ran (perf/common/ratio_report.hpp; the median with --benchmark_repetitions).
std::string summary(const leasehold::perf::RunResults& r) {
  using leasehold::perf::RatioTable;
  RatioTable t("round trips/s over loopback; ratio = io_uring / other (> 1: io_uring ahead)", "case",
               {{"io_uring /s", 0, ""}, {"other /s", 0, ""}, {"ratio", 2, ""}});
  for (const char* mode : {"Uring", "UringSingleIssuer"}) {
    const std::string plain = std::string("BM_PingPong_") + mode;
    const std::string loaded = std::string("BM_PingPongLoaded_") + mode;
    for (const char* batch : {"1", "64"}) {
      auto line = [&](const char* what, const std::string& uring, const std::string& other) {
        const auto u = r.items_per_second(uring + "/" + batch);
        const auto o = r.items_per_second(other + "/" + batch);
        t.row(std::string("batch ") + batch + ", " + what + ": " + (uring.c_str() + 3) + " vs " + (other.c_str() + 3),
              {u, o, leasehold::perf::ratio(u, o)});
      };
      line("unloaded", plain, "BM_PingPong_Blocking");
      line("1000 timers + 100 idle sockets", loaded, "BM_PingPongLoaded_Epoll");
      line("1000 timers + 100 idle sockets", loaded, "BM_PingPongLoaded_Poll");
    }
  }
  return leasehold::perf::join_tables({t});
}

}  // namespace

int main(int argc, char** argv) { return leasehold::perf::run_with_ratios(argc, argv, summary); }
