// leasehold-peers-load: the peers' side of the lease-refresh comparison (perf/peers/README.md,
// perf/peers/run.sh). It measures what lockd's refresh phase (leasehold-lockd-load) measures, on
// the systems a user would otherwise keep leases in, with the same names:
//
//   redis: W x S keys "load/w<w>/s<s>" (the names lockd-load acquires) are created with SET ... PX
//     (before the clock starts), then refreshed round after round for --seconds over raw RESP on
//     TCP loopback, --connections connections with --pipeline commands in flight on each:
//       --mode pexpire  one `PEXPIRE key ms` per key (every reply must be :1: the key existed)
//       --mode script   `EVALSHA` of a script that PEXPIREs --batch keys of one worker (25: the
//                       batching of lockd's heartbeat datagrams, 29 entries); the reply must be
//                       the number of keys, i.e. every key existed
//       --mode hot      `PEXPIRE` of one key only (a reference: Redis's best case)
//     Auth: none on loopback unless --password (then AUTH on every connection).
//   etcd: one lease per worker (LeaseGrant, TTL --ttl-s), each worker's S keys put with it (one
//     Txn per worker), then LeaseKeepAlive on --streams bidirectional streams (each a writer and
//     a reader thread, --pipeline keep-alives in flight), cycling over the leases for --seconds;
//     every answer must carry one of our lease ids and a TTL > 0. A keep-alive keeps the S names
//     of its lease: reported as keep-alives/s and names kept alive/s (= keep-alives x S).
//     gRPC stubs generated from etcd's rpc.proto (etcd/CMakeLists.txt); plaintext, no auth.
//
// Both report the server's CPU (utime+stime from /proc/<--server-pid>/stat, all its threads)
// over the measured interval, per million refreshes (per million keep-alives for etcd, and per
// million names). Any error reply, missing key or expired lease fails the run (exit 1).
// --json prints one JSON object on stdout.
#include <etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h>
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <semaphore>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

namespace {

namespace pb = etcdserverpb;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// utime+stime of a process (all threads), seconds; 0 for pid <= 0.
double proc_cpu_s(int pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::size_t pos = close + 2;  // state is field 3; utime 14, stime 15
  for (int field = 3; field < 14; ++field) pos = s.find(' ', pos) + 1;
  char* endp = nullptr;
  const unsigned long long utime = std::strtoull(s.c_str() + pos, &endp, 10);
  const unsigned long long stime = std::strtoull(endp, nullptr, 10);
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double self_cpu_s() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

std::string key_name(unsigned w, unsigned s) { return "load/w" + std::to_string(w) + "/s" + std::to_string(s); }

struct Common {
  unsigned workers = 1000;
  unsigned sandboxes = 100;
  double seconds = 5.0;
  int server_pid = 0;
  bool json = false;
};

/// What one run measured.
struct Result {
  std::uint64_t refreshes = 0;  ///< keys refreshed (redis), keep-alives (etcd)
  double seconds = 0, server_cpu_s = 0, generator_cpu_s = 0;
};

// ---- Redis: RESP over TCP ----------------------------------------------------------------------

void append_command(std::string& out, const std::vector<std::string_view>& args) {
  out += '*';
  out += std::to_string(args.size());
  out += "\r\n";
  for (std::string_view a : args) {
    out += '$';
    out += std::to_string(a.size());
    out += "\r\n";
    out.append(a);
    out += "\r\n";
  }
}

/// One RESP reply: an integer, a simple string, an error or a bulk string (arrays are not used).
struct Reply {
  char type = 0;  ///< ':' '+' '-' '$'
  long long integer = 0;
  std::string text;  ///< '+', '-', '$' (empty for a null bulk)
};

class RedisConn {
 public:
  RedisConn(const std::string& host, int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error("socket: " + std::string(std::strerror(errno)));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) throw std::runtime_error("not an IPv4 address: " + host);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      throw std::runtime_error("connect " + host + ":" + std::to_string(port) + ": " + std::strerror(errno));
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    in_.resize(1 << 20);
  }
  ~RedisConn() { ::close(fd_); }
  RedisConn(const RedisConn&) = delete;
  RedisConn& operator=(const RedisConn&) = delete;

  int fd() const { return fd_; }
  std::string& out() { return out_; }
  bool pending_out() const { return out_off_ < out_.size(); }

  /// Writes what it can of the queued bytes (non-blocking).
  void flush() {
    while (out_off_ < out_.size()) {
      const ssize_t n = ::send(fd_, out_.data() + out_off_, out_.size() - out_off_, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        throw std::runtime_error("send: " + std::string(std::strerror(errno)));
      }
      out_off_ += static_cast<std::size_t>(n);
    }
    out_.clear();
    out_off_ = 0;
  }
  /// Reads what there is (non-blocking), calls fn(reply) for each complete reply.
  template <class Fn>
  void read(Fn&& fn) {
    for (;;) {
      if (in_len_ == in_.size()) {
        if (in_off_ == 0) in_.resize(in_.size() * 2);
        std::memmove(in_.data(), in_.data() + in_off_, in_len_ - in_off_);
        in_len_ -= in_off_;
        in_off_ = 0;
      }
      const ssize_t n = ::recv(fd_, in_.data() + in_len_, in_.size() - in_len_, MSG_DONTWAIT);
      if (n == 0) throw std::runtime_error("redis closed the connection");
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        throw std::runtime_error("recv: " + std::string(std::strerror(errno)));
      }
      in_len_ += static_cast<std::size_t>(n);
      Reply r;
      while (parse(r)) fn(r);
      if (in_off_ == in_len_) in_off_ = in_len_ = 0;
    }
  }
  /// Blocks for one reply (setup).
  Reply call(const std::vector<std::string_view>& args) {
    append_command(out_, args);
    while (pending_out()) {
      flush();
      if (pending_out()) {
        pollfd p{fd_, POLLOUT, 0};
        ::poll(&p, 1, 100);
      }
    }
    Reply got;
    bool have = false;
    while (!have) {
      pollfd p{fd_, POLLIN, 0};
      ::poll(&p, 1, 1000);
      read([&](const Reply& r) {
        if (have) throw std::runtime_error("redis: an unexpected extra reply");
        got = r;
        have = true;
      });
    }
    return got;
  }

 private:
  /// One complete reply at in_[in_off_, in_len_) into r; false if it is not all there yet.
  bool parse(Reply& r) {
    const char* p = in_.data() + in_off_;
    const char* end = in_.data() + in_len_;
    if (p == end) return false;
    const char* crlf = static_cast<const char*>(std::memchr(p, '\r', static_cast<std::size_t>(end - p)));
    if (crlf == nullptr || crlf + 1 >= end) return false;
    r.type = *p;
    const std::string_view line(p + 1, static_cast<std::size_t>(crlf - p - 1));
    const char* next = crlf + 2;
    switch (r.type) {
      case ':':
        r.integer = std::strtoll(std::string(line).c_str(), nullptr, 10);
        break;
      case '+':
      case '-':
        r.text.assign(line);
        break;
      case '$': {
        const long long len = std::strtoll(std::string(line).c_str(), nullptr, 10);
        if (len < 0) {
          r.text.clear();
          break;
        }
        if (end - next < len + 2) return false;
        r.text.assign(next, static_cast<std::size_t>(len));
        next += len + 2;
        break;
      }
      default:
        throw std::runtime_error("redis: unexpected reply type '" + std::string(1, r.type) + "'");
    }
    in_off_ = static_cast<std::size_t>(next - in_.data());
    return true;
  }

  int fd_ = -1;
  std::string out_;
  std::size_t out_off_ = 0;
  std::vector<char> in_;
  std::size_t in_off_ = 0, in_len_ = 0;
};

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string mode = "pexpire";
  unsigned batch = 25;
  unsigned pipeline = 64;
  unsigned connections = 16;  // x pipeline 64 = 1,024 in flight, as lockd-load's window
  unsigned ttl_ms = 60000;
  std::string password;
};

// Refreshes every key of KEYS by ARGV[1] ms; returns how many existed (and so were refreshed).
constexpr std::string_view kRefreshScript =
    "local n = 0\n"
    "for i = 1, #KEYS do n = n + redis.call('PEXPIRE', KEYS[i], ARGV[1]) end\n"
    "return n\n";

Result run_redis(const Common& c, const RedisOptions& o) {
  if (o.mode != "pexpire" && o.mode != "script" && o.mode != "hot")
    throw std::runtime_error("--mode must be pexpire, script or hot");
  if (o.batch == 0 || o.pipeline == 0 || o.connections == 0) throw std::runtime_error("batch, pipeline, connections > 0");
  std::vector<std::unique_ptr<RedisConn>> conns;
  for (unsigned i = 0; i < o.connections; ++i) {
    conns.push_back(std::make_unique<RedisConn>(o.host, o.port));
    if (!o.password.empty()) {
      const Reply r = conns.back()->call({"AUTH", o.password});
      if (r.type != '+') throw std::runtime_error("redis AUTH: " + r.text);
    }
  }
  const std::string ttl = std::to_string(o.ttl_ms);
  // The keys, created before the clock starts (a PEXPIRE of a missing key does nothing).
  {
    RedisConn& s = *conns[0];
    std::uint64_t outstanding = 0;
    for (unsigned w = 0; w < c.workers; ++w) {
      for (unsigned k = 0; k < c.sandboxes; ++k) {
        const std::string key = key_name(w, k), value = "sandbox " + std::to_string(w + 1) + "/" +
                                                        std::to_string(k + 1) + " epoch 1";
        append_command(s.out(), {"SET", key, value, "PX", ttl});
        ++outstanding;
      }
      if (outstanding >= 4096 || w + 1 == c.workers) {
        while (s.pending_out() || outstanding > 0) {
          s.flush();
          pollfd p{s.fd(), static_cast<short>(POLLIN | (s.pending_out() ? POLLOUT : 0)), 0};
          ::poll(&p, 1, 1000);
          s.read([&](const Reply& r) {
            if (r.type != '+') throw std::runtime_error("redis SET: " + r.text);
            --outstanding;
          });
        }
      }
    }
    const Reply n = s.call({"DBSIZE"});
    if (n.type != ':' || static_cast<unsigned long long>(n.integer) < static_cast<unsigned long long>(c.workers) * c.sandboxes)
      throw std::runtime_error("redis DBSIZE " + std::to_string(n.integer) + " after creating the keys");
  }
  // The commands of one round, serialised once.
  std::vector<std::string> round;
  std::vector<unsigned> round_keys;  ///< keys each command refreshes
  std::string sha;
  if (o.mode == "script") {
    const Reply r = conns[0]->call({"SCRIPT", "LOAD", kRefreshScript});
    if (r.type != '$' || r.text.size() != 40) throw std::runtime_error("redis SCRIPT LOAD: " + r.text);
    sha = r.text;
  }
  if (o.mode == "hot") {
    std::string cmd;
    append_command(cmd, {"PEXPIRE", key_name(0, 0), ttl});
    round.push_back(cmd);
    round_keys.push_back(1);
  } else {
    for (unsigned w = 0; w < c.workers; ++w) {
      if (o.mode == "pexpire") {
        for (unsigned k = 0; k < c.sandboxes; ++k) {
          std::string cmd;
          append_command(cmd, {"PEXPIRE", key_name(w, k), ttl});
          round.push_back(std::move(cmd));
          round_keys.push_back(1);
        }
      } else {
        for (unsigned k0 = 0; k0 < c.sandboxes; k0 += o.batch) {
          const unsigned n = std::min(o.batch, c.sandboxes - k0);
          std::vector<std::string> keys;
          for (unsigned k = k0; k < k0 + n; ++k) keys.push_back(key_name(w, k));
          std::vector<std::string_view> args{"EVALSHA", sha};
          const std::string nkeys = std::to_string(n);
          args.push_back(nkeys);
          for (const auto& k : keys) args.push_back(k);
          args.push_back(ttl);
          std::string cmd;
          append_command(cmd, args);
          round.push_back(std::move(cmd));
          round_keys.push_back(n);
        }
      }
    }
  }
  // Each connection's replies come in order: a FIFO of the key counts it expects.
  struct Flight {
    std::vector<unsigned> expect;  // ring
    std::size_t head = 0, size = 0;
  };
  std::vector<Flight> flights(conns.size());
  for (auto& f : flights) f.expect.resize(o.pipeline);
  Result res;
  std::size_t next = 0;
  const double cpu0 = proc_cpu_s(c.server_pid), self0 = self_cpu_s();
  const std::int64_t t0 = now_ns(), end = t0 + static_cast<std::int64_t>(c.seconds * 1e9);
  std::vector<pollfd> fds(conns.size());
  bool sending = true;
  auto outstanding = [&] {
    std::size_t n = 0;
    for (const auto& f : flights) n += f.size;
    return n;
  };
  const std::int64_t drain_limit = end + 5'000'000'000;
  for (;;) {
    const std::int64_t now = now_ns();
    if (now >= end) sending = false;
    if (!sending && outstanding() == 0) break;
    if (now >= drain_limit) throw std::runtime_error("redis: replies still missing 5 s after the end");
    for (std::size_t i = 0; i < conns.size(); ++i) {
      Flight& f = flights[i];
      while (sending && f.size < o.pipeline) {
        conns[i]->out() += round[next];
        f.expect[(f.head + f.size) % f.expect.size()] = round_keys[next];
        ++f.size;
        next = (next + 1) % round.size();
      }
      conns[i]->flush();
      fds[i] = {conns[i]->fd(), static_cast<short>(POLLIN | (conns[i]->pending_out() ? POLLOUT : 0)), 0};
    }
    if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
    for (std::size_t i = 0; i < conns.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLERR | POLLHUP)) == 0) continue;
      Flight& f = flights[i];
      conns[i]->read([&](const Reply& r) {
        if (f.size == 0) throw std::runtime_error("redis: a reply to nothing");
        const unsigned want = f.expect[f.head];
        f.head = (f.head + 1) % f.expect.size();
        --f.size;
        if (r.type != ':' || r.integer != static_cast<long long>(want))
          throw std::runtime_error("redis: reply " + std::string(1, r.type) +
                                   (r.type == ':' ? std::to_string(r.integer) : r.text) + " where :" +
                                   std::to_string(want) + " (every key refreshed) was due");
        res.refreshes += want;
      });
    }
  }
  res.seconds = static_cast<double>(now_ns() - t0) / 1e9;
  res.server_cpu_s = proc_cpu_s(c.server_pid) - cpu0;
  res.generator_cpu_s = self_cpu_s() - self0;
  return res;
}

// ---- etcd: one lease per worker, LeaseKeepAlive streams -----------------------------------------

struct EtcdOptions {
  std::string endpoint = "127.0.0.1:2379";
  unsigned streams = 16;  // x pipeline 64 = 1,024 in flight, as lockd-load's window
  unsigned pipeline = 64;
  unsigned connections = 4;
  unsigned setup_threads = 16;
  long ttl_s = 60;
};

std::shared_ptr<grpc::Channel> etcd_channel(const std::string& endpoint) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own per channel
  args.SetMaxReceiveMessageSize(-1);
  return grpc::CreateCustomChannel("ipv4:" + endpoint, grpc::InsecureChannelCredentials(), args);
}

Result run_etcd(const Common& c, const EtcdOptions& o) {
  if (o.streams == 0 || o.pipeline == 0 || o.connections == 0 || o.setup_threads == 0)
    throw std::runtime_error("streams, pipeline, connections, setup threads > 0");
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (unsigned i = 0; i < o.connections; ++i) channels.push_back(etcd_channel(o.endpoint));
  // One lease per worker, its keys put with it (one Txn per worker), before the clock starts.
  std::vector<std::int64_t> leases(c.workers, 0);
  const std::string prefix = "/peers-load-" + std::to_string(::getpid()) + "/";
  {
    std::atomic<unsigned> next{0};
    std::mutex mu;
    std::string failure;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < o.setup_threads; ++t)
      threads.emplace_back([&, t] {
        auto lease = pb::Lease::NewStub(channels[t % channels.size()]);
        auto kv = pb::KV::NewStub(channels[t % channels.size()]);
        for (unsigned w; (w = next++) < c.workers;) {
          grpc::ClientContext gctx;
          gctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
          pb::LeaseGrantRequest greq;
          greq.set_ttl(o.ttl_s);
          pb::LeaseGrantResponse gresp;
          grpc::Status st = lease->LeaseGrant(&gctx, greq, &gresp);
          if (!st.ok() || gresp.id() == 0 || !gresp.error().empty()) {
            std::lock_guard lock(mu);
            failure = "LeaseGrant: " + st.error_message() + gresp.error();
            return;
          }
          leases[w] = gresp.id();
          pb::TxnRequest treq;
          for (unsigned k = 0; k < c.sandboxes; ++k) {
            auto* put = treq.add_success()->mutable_request_put();
            put->set_key(prefix + key_name(w, k));
            put->set_value("sandbox " + std::to_string(w + 1) + "/" + std::to_string(k + 1) + " epoch 1");
            put->set_lease(gresp.id());
          }
          grpc::ClientContext tctx;
          tctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
          pb::TxnResponse tresp;
          st = kv->Txn(&tctx, treq, &tresp);
          if (!st.ok() || !tresp.succeeded()) {
            std::lock_guard lock(mu);
            failure = "Txn (put " + std::to_string(c.sandboxes) + " keys with lease): " + st.error_message();
            return;
          }
        }
      });
    for (auto& t : threads) t.join();
    if (!failure.empty()) throw std::runtime_error("etcd setup: " + failure);
  }
  const std::unordered_set<std::int64_t> ours(leases.begin(), leases.end());
  // Keep-alives: each stream cycles over its share of the leases (stream s: leases s, s+S, ...),
  // --pipeline in flight (a writer and a reader thread: gRPC allows one Write and one Read at once).
  Result res;
  std::atomic<std::uint64_t> done{0};
  std::atomic<bool> stop{false}, failed{false};
  std::mutex mu;
  std::string failure;
  auto fail = [&](const std::string& why) {
    std::lock_guard lock(mu);
    if (failure.empty()) failure = why;
    failed = true;
    stop = true;
  };
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<pb::Lease::Stub> stub;
    std::unique_ptr<grpc::ClientReaderWriter<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>> rw;
    std::counting_semaphore<1 << 20> window{0};
    std::atomic<std::uint64_t> sent{0};
  };
  std::vector<std::unique_ptr<Stream>> streams;
  for (unsigned s = 0; s < o.streams && s < c.workers; ++s) {
    auto st = std::make_unique<Stream>();
    st->stub = pb::Lease::NewStub(channels[s % channels.size()]);
    st->rw = st->stub->LeaseKeepAlive(&st->ctx);
    st->window.release(o.pipeline);
    streams.push_back(std::move(st));
  }
  const double cpu0 = proc_cpu_s(c.server_pid), self0 = self_cpu_s();
  const std::int64_t t0 = now_ns(), end = t0 + static_cast<std::int64_t>(c.seconds * 1e9);
  std::vector<std::thread> threads;
  for (std::size_t s = 0; s < streams.size(); ++s) {
    Stream& st = *streams[s];
    threads.emplace_back([&, s] {  // writer
      std::size_t w = s;
      while (!stop && now_ns() < end) {
        if (!st.window.try_acquire_for(std::chrono::milliseconds(50))) continue;
        pb::LeaseKeepAliveRequest req;
        req.set_id(leases[w]);
        if (!st.rw->Write(req)) {
          fail("LeaseKeepAlive: the stream broke on a write");
          break;
        }
        ++st.sent;
        w += streams.size();
        if (w >= leases.size()) w = s;
      }
      st.rw->WritesDone();
    });
    threads.emplace_back([&] {  // reader
      pb::LeaseKeepAliveResponse resp;
      std::uint64_t got = 0;
      while (st.rw->Read(&resp)) {
        if (resp.ttl() <= 0 || !ours.contains(resp.id())) {
          fail("LeaseKeepAlive: lease " + std::to_string(resp.id()) + " answered with TTL " + std::to_string(resp.ttl()));
          st.ctx.TryCancel();
          break;
        }
        ++got;
        ++done;
        st.window.release();
      }
      const grpc::Status status = st.rw->Finish();
      if (!status.ok() && !failed) fail("LeaseKeepAlive: " + status.error_message());
      else if (!failed && got != st.sent) fail("LeaseKeepAlive: keep-alives left unanswered");
    });
  }
  for (auto& t : threads) t.join();
  res.seconds = static_cast<double>(now_ns() - t0) / 1e9;
  res.server_cpu_s = proc_cpu_s(c.server_pid) - cpu0;
  res.generator_cpu_s = self_cpu_s() - self0;
  res.refreshes = done;
  if (failed) throw std::runtime_error(failure);
  // Clean up what this run put (the leases' keys go with them); errors here do not matter.
  auto lease = pb::Lease::NewStub(channels[0]);
  for (const std::int64_t id : leases) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::LeaseRevokeRequest req;
    req.set_id(id);
    pb::LeaseRevokeResponse resp;
    (void)lease->LeaseRevoke(&ctx, req, &resp);
  }
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Common c;
  RedisOptions ro;
  EtcdOptions eo;
  CLI::App app{"leasehold-peers-load: lease refreshes against Redis and etcd, for the comparison with lockd "
               "(perf/peers/README.md)"};
  app.require_subcommand(1);
  for (CLI::App* sub : {app.add_subcommand("redis", "refresh W x S pre-created keys over RESP (PEXPIRE or a script)"),
                        app.add_subcommand("etcd", "one lease per worker over its S keys; LeaseKeepAlive streams")}) {
    sub->add_option("--workers", c.workers, "workers")->capture_default_str();
    sub->add_option("--sandboxes", c.sandboxes, "names per worker")->capture_default_str();
    sub->add_option("--seconds", c.seconds, "refresh phase, seconds")->capture_default_str();
    sub->add_option("--server-pid", c.server_pid, "the server's pid, for its CPU per million refreshes");
    sub->add_flag("--json", c.json, "print one JSON object on stdout");
  }
  CLI::App* redis = app.get_subcommand("redis");
  redis->add_option("--host", ro.host, "IPv4 address")->capture_default_str();
  redis->add_option("--port", ro.port, "port")->capture_default_str();
  redis->add_option("--mode", ro.mode, "pexpire | script | hot")->capture_default_str();
  redis->add_option("--batch", ro.batch, "keys per script call (--mode script)")->capture_default_str();
  redis->add_option("--pipeline", ro.pipeline, "commands in flight per connection")->capture_default_str();
  redis->add_option("--connections", ro.connections, "connections (one generator thread)")->capture_default_str();
  redis->add_option("--ttl-ms", ro.ttl_ms, "the keys' TTL, ms")->capture_default_str();
  redis->add_option("--password", ro.password, "AUTH with this password (requirepass)");
  CLI::App* etcd = app.get_subcommand("etcd");
  etcd->add_option("--endpoint", eo.endpoint, "HOST:PORT (IPv4, plaintext)")->capture_default_str();
  etcd->add_option("--streams", eo.streams, "LeaseKeepAlive streams")->capture_default_str();
  etcd->add_option("--pipeline", eo.pipeline, "keep-alives in flight per stream")->capture_default_str();
  etcd->add_option("--connections", eo.connections, "gRPC channels (TCP connections)")->capture_default_str();
  etcd->add_option("--ttl-s", eo.ttl_s, "lease TTL, s")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const bool is_redis = redis->parsed();
  nlohmann::json out;
  try {
    const Result r = is_redis ? run_redis(c, ro) : run_etcd(c, eo);
    const double per_s = r.seconds > 0 ? static_cast<double>(r.refreshes) / r.seconds : 0;
    const double per_m = r.refreshes > 0 ? r.server_cpu_s / (static_cast<double>(r.refreshes) / 1e6) : 0;
    out = {{"system", is_redis ? "redis" : "etcd"},
           {"workers", c.workers},
           {"sandboxes", c.sandboxes},
           {"names", static_cast<std::uint64_t>(c.workers) * c.sandboxes},
           {"seconds", r.seconds},
           {"refreshes", r.refreshes},
           {"refreshes_per_s", per_s},
           {"server_cpu_s", r.server_cpu_s},
           {"cpu_s_per_million", per_m},
           {"generator_cpu_s", r.generator_cpu_s}};
    if (is_redis) {
      out["mode"] = ro.mode;
      out["keys"] = ro.mode == "hot" ? 1u : c.workers * c.sandboxes;
      out["batch"] = ro.mode == "script" ? ro.batch : 1u;
      out["pipeline"] = ro.pipeline;
      out["connections"] = ro.connections;
      out["auth"] = ro.password.empty() ? "none (loopback)" : "AUTH requirepass (plaintext)";
      std::fprintf(stderr,
                   "redis %s: %llu keys refreshed in %.2f s = %.0f/s (%u connections x %u in flight); "
                   "server CPU %.2f s = %.3f CPU-s per 1M; generator CPU %.2f s\n",
                   ro.mode.c_str(), static_cast<unsigned long long>(r.refreshes), r.seconds, per_s, ro.connections,
                   ro.pipeline, r.server_cpu_s, per_m, r.generator_cpu_s);
    } else {
      out["mode"] = "keepalive";
      out["keepalives_per_s"] = per_s;
      out["names_per_s"] = per_s * c.sandboxes;
      out["cpu_s_per_million_names"] = per_m / c.sandboxes;
      out["streams"] = eo.streams;
      out["pipeline"] = eo.pipeline;
      out["connections"] = eo.connections;
      out["auth"] = "none (plaintext gRPC, no client auth)";
      std::fprintf(stderr,
                   "etcd keep-alive: %llu in %.2f s = %.0f/s = %.0f names kept alive/s (%u leases x %u names; "
                   "%u streams x %u in flight); server CPU %.2f s = %.2f CPU-s per 1M keep-alives; generator CPU "
                   "%.2f s\n",
                   static_cast<unsigned long long>(r.refreshes), r.seconds, per_s, per_s * c.sandboxes, c.workers,
                   c.sandboxes, eo.streams, eo.pipeline, r.server_cpu_s, per_m, r.generator_cpu_s);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leasehold-peers-load %s: %s\n", is_redis ? "redis" : "etcd", e.what());
    return 1;
  }
  if (c.json) std::printf("%s\n", out.dump().c_str());
  return 0;
}
