// leasehold-lockd-memory: lockd's resident memory per held name (issue "Performance", memory).
//
// Starts a release leasehold-lockd on a temporary SQLite store (as leasehold-lockd-load does),
// then acquires names over loopback UDP, W workers x S sandboxes (names "load/w<W>/s<S>", the
// load generator's), in rounds: the first --points[0] names, then up to each further point.
// Names go round-robin over the workers, so every worker (and its per-worker state in lockd:
// replay window, derived key, seen mark) is known before the first point and the growth between
// two points is what the names cost. At each point, after --settle-ms (the store thread folds its
// change log while idle), it reads lockd's /proc/<pid>/status (VmRSS, RssAnon, RssFile),
// /proc/<pid>/smaps_rollup, and lockd's memory and store counters (Stats: memory_*, store_*:
// whether the store's compaction keeps up), and reports the
// growth per held name between consecutive points, as text and as JSON (--json FILE, "-": stdout).
#include "perf/common/started_lockd.hpp"
#include "leasehold/io/clock.hpp"
#include "leasehold/io/udp.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#ifndef LEASEHOLD_LOCKD_BINARY
#define LEASEHOLD_LOCKD_BINARY "leasehold-lockd"
#endif

namespace {

using namespace leasehold;
namespace fs = std::filesystem;

struct Options {
  unsigned workers = 10'000;
  unsigned sandboxes = 100;
  std::vector<std::uint64_t> points{100'000, 1'000'000};
  unsigned window = 2048;
  unsigned settle_ms = 3000;
  std::uint64_t max_names = 0;  ///< lockd's --max-names (0: the last point, at least lockd's default)
  std::string store_dir = "/tmp";
  std::string lockd_binary = LEASEHOLD_LOCKD_BINARY;
  std::string json;
};

/// The kB fields of a /proc file ("Key:   123 kB"), in bytes.
std::map<std::string, std::uint64_t> proc_kb(const std::string& path) {
  std::map<std::string, std::uint64_t> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos || line.find(" kB") == std::string::npos) continue;
    out[line.substr(0, colon)] = std::strtoull(line.c_str() + colon + 1, nullptr, 10) * 1024;
  }
  return out;
}

/// One UDP socket to lockd: queue, send, receive what is there.
class Pipe {
 public:
  explicit Pipe(const SocketAddress& to) : to_(to) {
    fd_ = open_udp_socket(*SocketAddress::parse("127.0.0.1:0"));
    if (fd_ < 0) throw std::runtime_error("socket");
    set_socket_buffers(fd_, 16 << 20, 16 << 20);
  }
  ~Pipe() { ::close(fd_); }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  void send(const wire::Datagram& d) {
    while (::sendto(fd_, d.bytes.data(), d.size, 0, to_.sa(), to_.length) < 0) {
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, 1);
    }
  }
  template <class Fn>
  void receive(int wait_ms, Fn&& fn) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, wait_ms) <= 0) return;
    for (;;) {
      const ssize_t n = ::recv(fd_, buf_.data(), buf_.size(), MSG_DONTWAIT);
      if (n <= 0) return;
      fn(std::span<const std::uint8_t>(buf_.data(), static_cast<std::size_t>(n)));
    }
  }

 private:
  int fd_ = -1;
  SocketAddress to_;
  std::array<std::uint8_t, 2048> buf_{};
};

using perf::StartedLockd;

std::unique_ptr<StartedLockd> start_lockd(const Options& o, std::uint64_t max_names, std::string* key_file) {
  auto l = perf::make_lockd_dir(o.store_dir, "lockd-memory");
  if (l == nullptr) return nullptr;
  *key_file = l->key_file;
  if (!perf::spawn_lockd(*l, {o.lockd_binary, "--no-config", "--key-file", l->key_file, "--store",
                              (l->tmp / "lockd.db").string(), "--listen", "127.0.0.1:0", "--ttl-ms", "3600000",
                              "--max-names", std::to_string(max_names)}))
    return nullptr;
  return l;
}

struct Worker {
  WorkerId id;
  std::unique_ptr<wire::Sender> sender;
};

std::string name_of(std::uint64_t i, unsigned workers) {
  return "load/w" + std::to_string(i % workers) + "/s" + std::to_string(i / workers);
}

/// Acquires names [from, to) (name i: worker i % W, sandbox i / W); false on a refusal.
bool acquire_range(std::vector<Worker>& workers, Pipe& pipe, std::uint64_t from, std::uint64_t to, unsigned window,
                   std::uint64_t& rid) {
  std::unordered_map<std::uint64_t, std::uint64_t> in_flight;  // request id -> name index
  std::uint64_t next = from, done = 0, refused = 0;
  const auto W = static_cast<unsigned>(workers.size());
  std::int64_t last_progress = boottime_ns();
  auto send = [&](std::uint64_t i) {
    Worker& w = workers[i % W];
    wire::Acquire a;
    a.name = name_of(i, W);
    a.sandbox = SandboxId{i % W + 1, i / W + 1};
    a.worker = w.id;
    wire::Datagram d;
    if (!w.sender->seal(rid, a, d)) throw std::runtime_error("seal");
    in_flight.emplace(rid++, i);
    pipe.send(d);
  };
  while (done < to - from) {
    while (next < to && in_flight.size() < window) send(next++);
    pipe.receive(5, [&](std::span<const std::uint8_t> b) {
      const wire::DecodeResult r = wire::decode(b, nullptr);
      if (!r) return;
      const auto it = in_flight.find(r.header.request_id);
      if (it == in_flight.end()) return;
      if (!std::holds_alternative<wire::Grant>(r.body)) {
        if (refused++ == 0) std::fprintf(stderr, "acquire of %s refused\n", name_of(it->second, W).c_str());
      }
      in_flight.erase(it);
      ++done;
      last_progress = boottime_ns();
    });
    if (boottime_ns() - last_progress > 3 * kNsPerS) {  // lost datagrams: resend under new ids
      std::vector<std::uint64_t> again;
      for (const auto& [id, i] : in_flight) again.push_back(i);
      in_flight.clear();
      for (std::uint64_t i : again) send(i);
      last_progress = boottime_ns();
    }
  }
  return refused == 0;
}

/// All of lockd's counters (Stats, paged: the list is longer than one datagram); what arrived
/// if it stops answering (2 s a page).
std::vector<wire::Counter> lockd_counters(Pipe& pipe, Worker& w, std::uint64_t& rid) {
  std::vector<wire::Counter> all;
  for (int page = 0; page < 64; ++page) {
    wire::Datagram d;
    const std::uint64_t id = rid++;
    w.sender->seal(id, wire::Stats{static_cast<std::uint16_t>(all.size())}, d);
    pipe.send(d);
    std::vector<wire::Counter> got;
    bool answered = false;
    for (int i = 0; i < 100 && !answered; ++i)
      pipe.receive(20, [&](std::span<const std::uint8_t> b) {
        const wire::DecodeResult r = wire::decode(b, nullptr);
        const auto* st = std::get_if<wire::StatsAnswer>(&r.body);
        if (st != nullptr && r.header.request_id == id) got = st->counters, answered = true;
      });
    if (got.empty()) break;
    all.insert(all.end(), got.begin(), got.end());
  }
  return all;
}

struct Point {
  std::uint64_t names = 0;
  std::map<std::string, std::uint64_t> status, rollup, counters;
  std::uint64_t store_bytes = 0;
};

std::string json_map(const std::map<std::string, std::uint64_t>& m) {
  std::string s = "{";
  for (const auto& [k, v] : m) s += (s.size() > 1 ? ", \"" : "\"") + k + "\": " + std::to_string(v);
  return s + "}";
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"leasehold-lockd-memory: lockd's resident memory growth per held name (release lockd, SQLite "
               "store, loopback UDP)"};
  app.add_option("--workers", o.workers, "simulated workers (one sender id each)")->capture_default_str();
  app.add_option("--sandboxes", o.sandboxes, "names per worker (workers x sandboxes >= the last point)")
      ->capture_default_str();
  app.add_option("--points", o.points, "held names at which memory is read (increasing)")->capture_default_str();
  app.add_option("--window", o.window, "acquire requests in flight")->capture_default_str();
  app.add_option("--settle-ms", o.settle_ms, "idle time before each reading (the store folds its log)")
      ->capture_default_str();
  app.add_option("--max-names", o.max_names, "lockd's --max-names (0: max(last point, 1000000))");
  app.add_option("--store-dir", o.store_dir, "directory for lockd's temporary store")->capture_default_str();
  app.add_option("--lockd-binary", o.lockd_binary, "leasehold-lockd to start")->capture_default_str();
  app.add_option("--json", o.json, "also write the result as JSON to this file (\"-\": stdout)");
  CLI11_PARSE(app, argc, argv);
  if (o.points.empty() || o.workers == 0) return 2;
  for (std::size_t i = 1; i < o.points.size(); ++i)
    if (o.points[i] <= o.points[i - 1]) {
      std::fprintf(stderr, "--points must increase\n");
      return 2;
    }
  if (static_cast<std::uint64_t>(o.workers) * o.sandboxes < o.points.back()) {
    std::fprintf(stderr, "workers x sandboxes (%" PRIu64 ") is below the last point\n",
                 static_cast<std::uint64_t>(o.workers) * o.sandboxes);
    return 2;
  }
  const std::uint64_t max_names = o.max_names != 0 ? o.max_names : std::max<std::uint64_t>(o.points.back(), 1'000'000);

  std::string key_file;
  auto l = start_lockd(o, max_names, &key_file);
  if (!l) return 1;
  auto key = wire::load_key_file(key_file);
  if (!key) {
    std::fprintf(stderr, "%s\n", key.message().c_str());
    return 1;
  }
  std::vector<Worker> workers(o.workers);
  for (unsigned w = 0; w < o.workers; ++w) {
    workers[w].id = WorkerId{0x10ad, w + 1};
    workers[w].sender = std::make_unique<wire::Sender>(
        workers[w].id, wire::seq_seed(), wire::derive_worker_key_as_issued(*key, workers[w].id, false));
  }
  std::printf("lockd pid %d on %s, --max-names %" PRIu64 "; %u workers x %u names\n", l->pid, l->address.str().c_str(),
              max_names, o.workers, o.sandboxes);
  std::fflush(stdout);

  Pipe pipe(l->address);
  std::uint64_t rid = 1;
  std::vector<Point> points;
  auto read_point = [&](std::uint64_t names) {
    ::usleep(o.settle_ms * 1000u);
    Point p;
    p.names = names;
    const std::string proc = "/proc/" + std::to_string(l->pid);
    p.status = proc_kb(proc + "/status");
    p.rollup = proc_kb(proc + "/smaps_rollup");
    for (const auto& c : lockd_counters(pipe, workers[0], rid))
      if (c.key.rfind("memory_", 0) == 0 || c.key.rfind("store_", 0) == 0) p.counters[c.key] = c.value;
    std::error_code ec;
    for (const char* f : {"lockd.db", "lockd.db-wal"}) p.store_bytes += fs::file_size(l->tmp / f, ec), ec.clear();
    std::printf("%9" PRIu64 " names: VmRSS %8.1f MiB, RssAnon %8.1f MiB, RssFile %6.1f MiB, AnonHugePages %6.1f MiB",
                names, static_cast<double>(p.status["VmRSS"]) / 1048576.0,
                static_cast<double>(p.status["RssAnon"]) / 1048576.0,
                static_cast<double>(p.status["RssFile"]) / 1048576.0,
                static_cast<double>(p.rollup["AnonHugePages"]) / 1048576.0);
    for (const auto& [k, v] : p.counters)
      if (k == "store_log_rows" || k == "store_compactions" || k.rfind("memory_", 0) == 0)
        std::printf(", %s %" PRIu64, k.c_str(), v);
    std::printf("\n");
    std::fflush(stdout);
    points.push_back(std::move(p));
  };
  read_point(0);
  std::uint64_t held = 0;
  const std::int64_t t0 = boottime_ns();
  for (const std::uint64_t target : o.points) {
    if (!acquire_range(workers, pipe, held, target, o.window, rid)) return 1;
    held = target;
    read_point(held);
  }
  const double secs = static_cast<double>(boottime_ns() - t0) / 1e9;

  // Growth per held name between consecutive points.
  std::string json = "{\n  \"lockd_binary\": \"" + o.lockd_binary + "\",\n  \"workers\": " +
                     std::to_string(o.workers) + ",\n  \"max_names\": " + std::to_string(max_names) +
                     ",\n  \"seconds\": " + std::to_string(secs) + ",\n  \"points\": [\n";
  for (std::size_t i = 0; i < points.size(); ++i) {
    Point& p = points[i];
    json += "    {\"names\": " + std::to_string(p.names) + ", \"store_file_bytes\": " + std::to_string(p.store_bytes) +
            ", \"status\": " + json_map({{"VmRSS", p.status.at("VmRSS")},
                                         {"RssAnon", p.status["RssAnon"]},
                                         {"RssFile", p.status["RssFile"]},
                                         {"VmHWM", p.status["VmHWM"]}}) +
            ", \"smaps_rollup\": " + json_map(p.rollup) + ", \"counters\": " + json_map(p.counters) + "}" +
            (i + 1 < points.size() ? ",\n" : "\n");
  }
  json += "  ],\n  \"growth_per_name\": [\n";
  bool first = true;
  for (std::size_t i = 2; i < points.size(); ++i) {
    Point& a = points[i - 1];
    Point& b = points[i];
    const double n = static_cast<double>(b.names - a.names);
    auto per = [&](std::uint64_t x, std::uint64_t y) { return (static_cast<double>(y) - static_cast<double>(x)) / n; };
    std::printf("growth %" PRIu64 " -> %" PRIu64 " names: VmRSS %.1f B/name, RssAnon %.1f B/name, RssFile %.1f B/name",
                a.names, b.names, per(a.status.at("VmRSS"), b.status.at("VmRSS")),
                per(a.status["RssAnon"], b.status["RssAnon"]), per(a.status["RssFile"], b.status["RssFile"]));
    std::string counters;
    for (const auto& [k, v] : b.counters) {
      if (k.rfind("memory_", 0) != 0) continue;
      const auto it = a.counters.find(k);
      const double d = per(it == a.counters.end() ? 0 : it->second, v);
      std::printf(", %s %.1f", k.c_str(), d);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2f", d);
      counters += (counters.empty() ? "\"" : ", \"") + k + "\": " + buf;
    }
    std::printf("\n");
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "    %s{\"from\": %" PRIu64 ", \"to\": %" PRIu64
                  ", \"vmrss_bytes_per_name\": %.2f, \"rss_anon_bytes_per_name\": %.2f, \"rss_file_bytes_per_name\": %.2f",
                  first ? "" : ",", a.names, b.names, per(a.status.at("VmRSS"), b.status.at("VmRSS")),
                  per(a.status["RssAnon"], b.status["RssAnon"]), per(a.status["RssFile"], b.status["RssFile"]));
    json += std::string(buf) + ", \"counters_bytes_per_name\": {" + counters + "}}\n";
    first = false;
  }
  json += "  ]\n}\n";
  if (o.json == "-") std::fputs(json.c_str(), stdout);
  else if (!o.json.empty()) std::ofstream(o.json) << json;
  return 0;
}
