// leasehold-lockd-load: a load generator for lockd over loopback UDP (issue "lockd",
// Performance). It starts leasehold-lockd on a temporary store (or uses --lockd), then:
//
//   1. durable acquires: every simulated worker acquires its S sandboxes' names, pipelined;
//      each answer arrives only after lockd's group commit made the grant durable. One pass per
//      --acquire-windows entry (requests in flight, default 1,64,2048), each on names of its own:
//      every window but the last takes --acquire-samples names, the last takes the rest. Reports
//      acquires/s and the p50/p99 latency (send → answer) per window, next to a baseline taken
//      in the same run in the directory of lockd's store (its --store, read from
//      /proc/<pid>/cmdline; --store-dir with --lockd): 4 KiB pwrite + fdatasync over blocks
//      already written (what a commit that overwrites its log in place costs), sampled before
//      every window, and the same appending to the file (a log that grows: the file system
//      commits its size too). Prints each window's p50 and p99 as ratios of the overwrite
//      baseline's (issue "Performance": at 1 in flight p50 <= 2x, p99 <= 4x).
//   2. refreshes: every worker refreshes its S leases in heartbeat batches (29 entries per
//      datagram, the wire limit) round after round for --seconds. Reports refreshes/s, and
//      lockd's CPU (utime+stime from /proc/<pid>/stat) per million refreshes.
//   3. baseline, same run: the same heartbeat datagrams against a trivial UDP reflector (one
//      thread, recvmmsg/sendmmsg, no decoding): the ceiling of this generator + the kernel's
//      loopback path on this machine. Reports lockd's refresh rate as a ratio of it.
//
//   4. keys, same run: the started lockd runs (1.-2.) alternately with per-worker keys (each
//      worker signs with its own HKDF-derived key; lockd derives and caches one per worker) and
//      with one shared worker key (the shared-worker-key ablation: the cost before per-worker
//      keys), --key-rounds of each; reports the ratio of their refreshes/s (target >= 0.95).
//
//   5. stores, same run (--etcd ENDPOINTS instead of 4.): the started lockd runs (1.-2.)
//      alternately on its SQLite store and as the leader of a one-lockd cluster on etcd
//      (--store etcd://ENDPOINTS/<fresh prefix>), --key-rounds of each; reports the ratio of their
//      refreshes/s (target >= 0.9: refreshes stay in the leader's memory) and of their durable
//      acquires/s; then etcd's own rate for one-put transactions from --etcd-clients threads
//      (the etcd client of lockd, so the same gRPC path): what batching buys.
//
// The generator signs every datagram (HMAC-SHA256, fresh seq per worker) and checks every
// refresh answer as a supervisor does: its tag with the worker's key, that it is an answer to
// that worker, then its entries (an answer that fails is counted and fails the run).
//
// --json: the report goes to stderr and stdout gets one JSON object (refreshes_per_s,
// cpu_s_per_million, runs, ...: emit_json in main), for perf/peers/run.sh. --lockd-cpus pins the
// started lockd (sched_setaffinity before exec), so the generator can be pinned elsewhere.
#include "perf/common/started_lockd.hpp"
#include "leasehold/wire/auth.hpp"
#include "leasehold/etcd/client.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/wire/token.hpp"
#include "leasehold/io/clock.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"
#include "leasehold/io/udp.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#ifndef LEASEHOLD_LOCKD_BINARY
#define LEASEHOLD_LOCKD_BINARY "leasehold-lockd"
#endif

namespace {

using namespace leasehold;
namespace fs = std::filesystem;

constexpr std::size_t kBatchMax = 64;  ///< datagrams per sendmmsg / recvmmsg

struct Options {
  unsigned workers = 1000;
  unsigned sandboxes = 100;
  double seconds = 5.0;
  unsigned window = 1024;  ///< datagrams in flight
  std::vector<unsigned> acquire_windows{1, 64, 2048};  ///< acquire requests in flight, one pass each
  unsigned acquire_samples = 3000;  ///< names acquired per window but the last (which takes the rest)
  unsigned fsync_samples = 500;     ///< 4 KiB write+fdatasync samples (each kind) before every window
  std::string lockd;       ///< ADDR:PORT of a running lockd ("" = start one)
  std::string key_file;
  std::string store_dir = "/tmp";
  std::string lockd_binary = LEASEHOLD_LOCKD_BINARY;
  bool baseline = true;
  std::string etcd;          ///< ENDPOINTS: compare the SQLite store with the etcd store ("" = no)
  unsigned etcd_clients = 64;
  std::string lockd_cpus;    ///< CPU list the started lockd is pinned to ("" = not pinned)
};

/// "0", "0,2", "0-3": the CPUs of a list; false if it is not one.
bool parse_cpu_list(const std::string& text, cpu_set_t& set) {
  CPU_ZERO(&set);
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string part = text.substr(pos, comma - pos);
    const std::size_t dash = part.find('-');
    char* e1 = nullptr;
    char* e2 = nullptr;
    const unsigned long lo = std::strtoul(part.c_str(), &e1, 10);
    const unsigned long hi = dash == std::string::npos ? lo : std::strtoul(part.c_str() + dash + 1, &e2, 10);
    if (part.empty() || e1 == part.c_str() || (dash == std::string::npos ? *e1 != 0 : (*e1 != '-' || *e2 != 0)) ||
        hi < lo || hi >= CPU_SETSIZE)
      return false;
    for (unsigned long c = lo; c <= hi; ++c) CPU_SET(c, &set);
    pos = comma + 1;
  }
  return CPU_COUNT(&set) > 0;
}

std::uint64_t proc_cpu_ticks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');
  if (close == std::string::npos) return 0;
  // Fields after "(comm)": state(3) ... utime(14) stime(15).
  std::size_t pos = close + 2;
  for (int field = 3; field < 14; ++field) pos = s.find(' ', pos) + 1;
  const std::uint64_t utime = std::strtoull(s.c_str() + pos, nullptr, 10);
  pos = s.find(' ', pos) + 1;
  const std::uint64_t stime = std::strtoull(s.c_str() + pos, nullptr, 10);
  return utime + stime;
}

struct Worker {
  WorkerId id;
  std::unique_ptr<wire::Sender> sender;
  std::vector<wire::HeartbeatEntry> leases;
};

/// One UDP socket with batched send/receive.
class Pipe {
 public:
  explicit Pipe(const SocketAddress& to) : to_(to) {
    fd_ = open_udp_socket(*SocketAddress::parse("127.0.0.1:0"));
    if (fd_ < 0) throw std::runtime_error("socket");
    set_socket_buffers(fd_, 16 << 20, 16 << 20);
  }
  ~Pipe() { ::close(fd_); }
  void queue(const wire::Datagram& d) { out_.push_back(d); }
  std::size_t queued() const { return out_.size(); }
  void flush() {
    std::size_t off = 0;
    while (off < out_.size()) {
      mmsghdr msgs[kBatchMax];
      iovec iov[kBatchMax];
      const std::size_t n = std::min(kBatchMax, out_.size() - off);
      for (std::size_t i = 0; i < n; ++i) {
        iov[i] = {out_[off + i].bytes.data(), out_[off + i].size};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = const_cast<sockaddr*>(to_.sa());
        msgs[i].msg_hdr.msg_namelen = to_.length;
      }
      const int sent = ::sendmmsg(fd_, msgs, static_cast<unsigned>(n), 0);
      if (sent <= 0) {
        pollfd p{fd_, POLLOUT, 0};
        ::poll(&p, 1, 1);
        continue;
      }
      off += static_cast<std::size_t>(sent);
    }
    out_.clear();
  }
  /// Receives what is there (waiting up to wait_ms for the first); calls fn(bytes) per datagram.
  template <class Fn>
  std::size_t receive(int wait_ms, Fn&& fn) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, wait_ms) <= 0) return 0;
    std::size_t total = 0;
    for (;;) {
      mmsghdr msgs[kBatchMax];
      iovec iov[kBatchMax];
      for (std::size_t i = 0; i < kBatchMax; ++i) {
        iov[i] = {in_[i].data(), in_[i].size()};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      const int n = ::recvmmsg(fd_, msgs, kBatchMax, MSG_DONTWAIT, nullptr);
      if (n <= 0) break;
      for (int i = 0; i < n; ++i)
        fn(std::span<const std::uint8_t>(in_[static_cast<std::size_t>(i)].data(), msgs[i].msg_len));
      total += static_cast<std::size_t>(n);
      if (static_cast<std::size_t>(n) < kBatchMax) break;
    }
    return total;
  }

 private:
  int fd_;
  SocketAddress to_;
  std::vector<wire::Datagram> out_;
  std::array<std::array<std::uint8_t, 2048>, kBatchMax> in_{};
};

std::uint64_t percentile(std::vector<std::uint64_t> v, double p) {
  if (v.empty()) return 0;
  const std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

/// The directory of lockd's store file: the --store argument on its command line ("" when it
/// has none, or it names no file, e.g. an etcd:// store).
std::string store_dir_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (std::size_t pos = 0; pos < all.size();) {
    const std::size_t nul = all.find('\0', pos);
    args.push_back(all.substr(pos, nul == std::string::npos ? std::string::npos : nul - pos));
    if (nul == std::string::npos) break;
    pos = nul + 1;
  }
  for (std::size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--store" && args[i + 1].find("://") == std::string::npos)
      return fs::path(args[i + 1]).parent_path().string();
  return {};
}

/// The disk's own durable-write latency in a directory: 4 KiB pwrite + fdatasync, over blocks
/// already written and synced (no file-system metadata to commit: the floor of a durable write),
/// and appending (the file grows: the file system commits its size with the data).
class FsyncProbe {
 public:
  explicit FsyncProbe(const std::string& dir)
      : over_path_((fs::path(dir) / "fsync-probe-over").string()),
        append_path_((fs::path(dir) / "fsync-probe-append").string()) {
    over_fd_ = ::open(over_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    append_fd_ = ::open(append_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (over_fd_ < 0 || append_fd_ < 0) throw std::runtime_error("fdatasync baseline: cannot create a file in " + dir);
    block_.fill(0x5a);
    for (std::size_t i = 0; i < kBlocks; ++i)
      if (::pwrite(over_fd_, block_.data(), block_.size(), static_cast<off_t>(i * block_.size())) < 0)
        throw std::runtime_error("fdatasync baseline: cannot write in " + dir);
    ::fsync(over_fd_);
  }
  ~FsyncProbe() {
    ::close(over_fd_);
    ::close(append_fd_);
    ::unlink(over_path_.c_str());
    ::unlink(append_path_.c_str());
  }
  /// n samples of each kind, alternating.
  void sample(unsigned n) {
    for (unsigned i = 0; i < n; ++i) {
      over_ns.push_back(timed(over_fd_, static_cast<off_t>((next_over_++ % kBlocks) * block_.size())));
      append_ns.push_back(timed(append_fd_, static_cast<off_t>(next_append_++ * block_.size())));
    }
  }
  std::vector<std::uint64_t> over_ns, append_ns;

 private:
  static constexpr std::size_t kBlocks = 64;
  std::uint64_t timed(int fd, off_t at) {
    const std::int64_t t0 = boottime_ns();
    if (::pwrite(fd, block_.data(), block_.size(), at) != static_cast<ssize_t>(block_.size()) || ::fdatasync(fd) != 0)
      throw std::runtime_error("fdatasync baseline: write failed");
    return static_cast<std::uint64_t>(boottime_ns() - t0);
  }
  std::string over_path_, append_path_;
  int over_fd_ = -1, append_fd_ = -1;
  std::array<std::uint8_t, 4096> block_{};
  std::size_t next_over_ = 0, next_append_ = 0;
};

/// One acquire window's pass.
struct AcquirePass {
  unsigned window = 0;
  std::size_t count = 0;
  double seconds = 0, cpu_s = 0;
  std::vector<std::uint64_t> latencies_ns;
};

double ms_of(std::uint64_t ns) { return static_cast<double>(ns) / 1e6; }

/// Phase 1: every worker acquires its names, one pass per acquire window (each on names of its
/// own), with the fdatasync baseline sampled before each pass; returns false on a refusal.
/// *per_s: the last (widest) window's acquires/s.
bool acquire_all(std::vector<Worker>& workers, const SocketAddress& lockd, const Options& o, pid_t lockd_pid,
                 double* per_s = nullptr) {
  Pipe pipe(lockd);
  struct InFlight {
    std::int64_t sent_ns;
    std::size_t worker, lease;
  };
  std::unordered_map<std::uint64_t, InFlight> in_flight;
  const std::size_t total = static_cast<std::size_t>(o.workers) * o.sandboxes;
  std::string dir = lockd_pid > 0 ? store_dir_of(lockd_pid) : std::string();
  if (dir.empty()) dir = o.store_dir;
  FsyncProbe probe(dir);
  const std::vector<unsigned> windows = o.acquire_windows.empty() ? std::vector<unsigned>{2048} : o.acquire_windows;
  std::vector<AcquirePass> passes;
  std::size_t next = 0, refused = 0;
  std::uint64_t rid = 1;
  for (std::size_t wi = 0; wi < windows.size(); ++wi) {
    AcquirePass pass;
    pass.window = std::max(1u, windows[wi]);
    const std::size_t passes_left = windows.size() - wi;
    pass.count = passes_left == 1 ? total - next : std::min<std::size_t>(o.acquire_samples, (total - next) / passes_left);
    probe.sample(o.fsync_samples);
    pass.latencies_ns.reserve(pass.count);
    const std::size_t end = next + pass.count;
    std::size_t done = 0;
    const std::uint64_t cpu0 = lockd_pid > 0 ? proc_cpu_ticks(lockd_pid) : 0;
    const std::int64_t t0 = boottime_ns();
    std::int64_t last_progress = t0;
    while (done < pass.count) {
      while (next < end && in_flight.size() < pass.window) {
        const std::size_t w = next % o.workers, l = next / o.workers;
        Worker& wk = workers[w];
        wire::Acquire a;
        a.name = "load/w" + std::to_string(w) + "/s" + std::to_string(l);
        a.sandbox = wk.leases[l].sandbox;
        a.worker = wk.id;
        wire::Datagram d;
        if (!wk.sender->seal(rid, a, d)) return false;
        in_flight.emplace(rid, InFlight{boottime_ns(), w, l});
        ++rid;
        ++next;
        pipe.queue(d);
      }
      pipe.flush();
      pipe.receive(5, [&](std::span<const std::uint8_t> b) {
        wire::DecodeResult r = wire::decode(b, nullptr);
        if (!r) return;
        auto it = in_flight.find(r.header.request_id);
        if (it == in_flight.end()) return;
        if (const auto* g = std::get_if<wire::Grant>(&r.body)) {
          workers[it->second.worker].leases[it->second.lease].epoch = g->epoch;
          pass.latencies_ns.push_back(static_cast<std::uint64_t>(boottime_ns() - it->second.sent_ns));
        } else {
          ++refused;
        }
        in_flight.erase(it);
        ++done;
        last_progress = boottime_ns();
      });
      if (boottime_ns() - last_progress > 3 * kNsPerS) {
        // Lost datagrams (or a stuck lockd): re-send what is outstanding under new request ids.
        std::fprintf(stderr, "acquire: %zu requests unanswered for 3 s; resending\n", in_flight.size());
        std::vector<InFlight> again;
        for (auto& [id, f] : in_flight) again.push_back(f);
        in_flight.clear();
        for (const auto& f : again) {
          Worker& wk = workers[f.worker];
          wire::Acquire a;
          a.name = "load/w" + std::to_string(f.worker) + "/s" + std::to_string(f.lease);
          a.sandbox = wk.leases[f.lease].sandbox;
          a.worker = wk.id;
          wire::Datagram d;
          wk.sender->seal(rid, a, d);
          in_flight.emplace(rid++, InFlight{boottime_ns(), f.worker, f.lease});
          pipe.queue(d);
        }
        last_progress = boottime_ns();
      }
    }
    pass.seconds = static_cast<double>(boottime_ns() - t0) / 1e9;
    pass.cpu_s = lockd_pid > 0 ? static_cast<double>(proc_cpu_ticks(lockd_pid) - cpu0) /
                                     static_cast<double>(::sysconf(_SC_CLK_TCK))
                               : 0;
    std::printf("durable acquires, window %u: %zu in %.2f s = %.0f/s; latency p50 %.3f ms, p99 %.3f ms; "
                "lockd CPU %.2f s\n",
                pass.window, pass.count, pass.seconds, static_cast<double>(pass.count) / pass.seconds,
                ms_of(percentile(pass.latencies_ns, 0.50)), ms_of(percentile(pass.latencies_ns, 0.99)), pass.cpu_s);
    std::fflush(stdout);
    passes.push_back(std::move(pass));
  }
  const double sync50 = ms_of(percentile(probe.over_ns, 0.50)), sync99 = ms_of(percentile(probe.over_ns, 0.99));
  std::printf("  fdatasync baseline, same run, in %s (%zu samples of each, before every window): 4 KiB pwrite + "
              "fdatasync over written blocks p50 %.3f ms, p99 %.3f ms; appending p50 %.3f ms, p99 %.3f ms\n",
              dir.c_str(), probe.over_ns.size(), sync50, sync99, ms_of(percentile(probe.append_ns, 0.50)),
              ms_of(percentile(probe.append_ns, 0.99)));
  for (const AcquirePass& p : passes) {
    const double p50 = ms_of(percentile(p.latencies_ns, 0.50)), p99 = ms_of(percentile(p.latencies_ns, 0.99));
    std::printf("  window %5u: p50 %.3f ms = %.2fx fdatasync p50, p99 %.3f ms = %.2fx fdatasync p99, %.0f acquires/s",
                p.window, p50, sync50 > 0 ? p50 / sync50 : 0.0, p99, sync99 > 0 ? p99 / sync99 : 0.0,
                static_cast<double>(p.count) / p.seconds);
    if (p.window == 1) std::printf("  (targets: p50 <= 2x, p99 <= 4x)");
    if (p.window == 64) std::printf("  (target: p99 <= 2 ms)");
    if (p.window == 2048) std::printf("  (target: >= 70000/s)");
    std::printf("\n");
  }
  if (refused != 0) std::printf("  acquires refused: %zu\n", refused);
  if (per_s != nullptr && !passes.empty())
    *per_s = static_cast<double>(passes.back().count) / passes.back().seconds;
  return refused == 0;
}

/// lockd's counters (Stats), empty if it does not answer within 2 s.
std::vector<wire::Counter> lockd_counters(const SocketAddress& lockd, wire::Sender& sender) {
  static std::uint64_t request_id = 1ull << 50;  // unique per request: ids key lockd's answer cache
  Pipe pipe(lockd);
  wire::Datagram d;
  const std::uint64_t rid = request_id++;
  sender.seal(rid, wire::Stats{}, d);
  pipe.queue(d);
  pipe.flush();
  std::vector<wire::Counter> out;
  for (int i = 0; i < 100 && out.empty(); ++i) {
    pipe.receive(20, [&](std::span<const std::uint8_t> b) {
      wire::DecodeResult r = wire::decode(b, nullptr);
      const auto* st = std::get_if<wire::StatsAnswer>(&r.body);
      if (st != nullptr && r.header.request_id == rid) out = st->counters;
    });
  }
  return out;
}

std::uint64_t counter(const std::vector<wire::Counter>& cs, const std::string& key) {
  for (const auto& c : cs)
    if (c.key == key) return c.value;
  return 0;
}

/// Prints the counters named in `keys`.
void print_lockd_stats(const SocketAddress& lockd, wire::Sender& sender, const std::vector<std::string>& keys) {
  const auto cs = lockd_counters(lockd, sender);
  std::printf("  lockd:");
  for (const auto& c : cs)
    if (std::find(keys.begin(), keys.end(), c.key) != keys.end()) std::printf(" %s=%" PRIu64, c.key.c_str(), c.value);
  std::printf("\n");
}

struct RefreshRun {
  double per_s = 0;
  std::uint64_t entries = 0, not_refreshed = 0, datagrams = 0;
  /// Answers whose tag checked with the worker's key (and that are answers to the worker: see
  /// wire::is_answer_to), and answers refused (bad tag, not an answer, malformed, not a
  /// HeartbeatAck): their entries are not counted.
  std::uint64_t answers_verified = 0, answers_rejected = 0;
  double seconds = 0, cpu_s = 0;
  double generator_cpu_s = 0;  ///< this process (all threads), for "who is the bound"
};

double self_cpu_s() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/// Phase 2 (and the baseline): rounds of heartbeats from every worker for `seconds`.
/// `check_answers`: every answer is checked as a supervisor checks lockd's (supervisor/
/// lockd_link.cpp): its tag with the key of the worker whose request it answers, that it is an
/// answer and not that worker's own datagram (wire::is_answer_to), then its payload; only the
/// entries of an authentic HeartbeatAck count. The worker is found from the request id (the
/// datagrams of a round go out in order, one request id each).
RefreshRun refresh_rounds(std::vector<Worker>& workers, const SocketAddress& to, const Options& o,
                             pid_t cpu_pid, bool check_answers) {
  Pipe pipe(to);
  // The datagrams of one round: worker w's leases split at the wire limit.
  struct Slot {
    std::size_t worker;
    wire::Heartbeat hb;
  };
  std::vector<Slot> round;
  for (std::size_t w = 0; w < workers.size(); ++w)
    for (auto& hb : wire::split_heartbeat(workers[w].leases, 0)) round.push_back(Slot{w, std::move(hb)});
  RefreshRun res;
  constexpr std::uint64_t kFirstRid = 1ull << 40;
  std::uint64_t rid = kFirstRid, outstanding = 0;
  std::size_t next = 0;
  auto take_answer = [&](std::span<const std::uint8_t> b) {
    if (!check_answers) {
      // The reflector echoes the request: count its entries from the payload's count field.
      res.entries += b.size() > wire::kHeaderBytes + 6
                         ? static_cast<std::uint64_t>(b[wire::kHeaderBytes + 4] | (b[wire::kHeaderBytes + 5] << 8))
                         : 0;
      return;
    }
    const auto answered = wire::request_id_of(std::as_bytes(b));
    if (!answered || *answered < kFirstRid || *answered >= rid) {
      ++res.answers_rejected;
      return;
    }
    Worker& wk = workers[round[static_cast<std::size_t>((*answered - kFirstRid) % round.size())].worker];
    // The tag is checked once (is_answer_to); decode() then reads the payload.
    if (!wire::is_answer_to(b, wk.sender->authenticator(), wk.sender->self())) {
      ++res.answers_rejected;
      return;
    }
    wire::DecodeResult r = wire::decode(b, nullptr);
    const auto* ack = r ? std::get_if<wire::HeartbeatAck>(&r.body) : nullptr;
    if (ack == nullptr) {
      ++res.answers_rejected;
      return;
    }
    ++res.answers_verified;
    for (const auto& e : ack->entries) {
      ++res.entries;
      if (e.status != RefreshStatus::refreshed) ++res.not_refreshed;
    }
  };
  const std::uint64_t cpu0 = cpu_pid > 0 ? proc_cpu_ticks(cpu_pid) : 0;
  const double self0 = self_cpu_s();
  const std::int64_t t0 = boottime_ns();
  const std::int64_t end = t0 + static_cast<std::int64_t>(o.seconds * 1e9);
  std::int64_t last_answer = t0;
  while (boottime_ns() < end) {
    while (outstanding < o.window) {
      Slot& s = round[next];
      next = (next + 1) % round.size();
      wire::Datagram d;
      workers[s.worker].sender->seal(rid++, s.hb, d);
      pipe.queue(d);
      ++outstanding;
      ++res.datagrams;
    }
    pipe.flush();
    const std::size_t got = pipe.receive(2, take_answer);
    outstanding -= std::min<std::uint64_t>(outstanding, got);
    if (got > 0) last_answer = boottime_ns();
    if (boottime_ns() - last_answer > 200'000'000) {  // datagrams lost: reopen the window
      outstanding = 0;
      last_answer = boottime_ns();
    }
  }
  // Drain the answers still in flight (bounded).
  const std::int64_t drain_end = boottime_ns() + 500'000'000;
  while (outstanding > 0 && boottime_ns() < drain_end) {
    const std::size_t got = pipe.receive(10, take_answer);
    outstanding -= std::min<std::uint64_t>(outstanding, got);
  }
  res.seconds = static_cast<double>(boottime_ns() - t0) / 1e9;
  res.generator_cpu_s = self_cpu_s() - self0;
  res.per_s = static_cast<double>(res.entries) / res.seconds;
  if (cpu_pid > 0)
    res.cpu_s = static_cast<double>(proc_cpu_ticks(cpu_pid) - cpu0) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  return res;
}

/// The baseline: a one-thread UDP reflector (recvmmsg → sendmmsg back to the sender).
class Reflector {
 public:
  Reflector() {
    fd_ = open_udp_socket_blocking(*SocketAddress::parse("127.0.0.1:0"));
    set_socket_buffers(fd_, 16 << 20, 16 << 20);
    timeval tv{0, 50'000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    address_ = *local_address(fd_);
    thread_ = std::thread([this] { run(); });
  }
  ~Reflector() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  const SocketAddress& address() const { return address_; }

 private:
  void run() {
    std::vector<std::array<std::uint8_t, 2048>> bufs(kBatchMax);
    std::vector<sockaddr_storage> from(kBatchMax);
    while (!stop_) {
      mmsghdr msgs[kBatchMax];
      iovec iov[kBatchMax];
      for (std::size_t i = 0; i < kBatchMax; ++i) {
        iov[i] = {bufs[i].data(), bufs[i].size()};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = &from[i];
        msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
      }
      const int n = ::recvmmsg(fd_, msgs, kBatchMax, MSG_WAITFORONE, nullptr);
      if (n <= 0) continue;
      for (int i = 0; i < n; ++i) iov[i].iov_len = msgs[i].msg_len;
      ::sendmmsg(fd_, msgs, static_cast<unsigned>(n), 0);
    }
  }
  int fd_;
  SocketAddress address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

using perf::StartedLockd;

/// Starts lockd with a fresh cluster key (written to *key_file). `shared_keys`: under the
/// shared-worker-key ablation (every worker signs with one key: the figure before per-worker
/// keys). nullptr if it does not start.
std::unique_ptr<StartedLockd> start_lockd(const Options& o, bool shared_keys, std::string* key_file,
                                          const std::string& etcd = {}) {
  auto l = perf::make_lockd_dir(o.store_dir, "lockd-load");
  if (l == nullptr) return nullptr;
  *key_file = l->key_file;
  const std::string signing = (l->tmp / "signing.key").string();
  if (!etcd.empty()) {
    if (const Status err = token::generate_signing_key_file(signing); !err.ok()) {
      std::fprintf(stderr, "%s\n", err.message().c_str());
      return nullptr;
    }
  }
  // A fresh key prefix per run: nothing of an earlier run is loaded.
  const std::string store = etcd.empty() ? (l->tmp / "lockd.db").string()
                                         : "etcd://" + etcd + "/lockd-load-" + std::to_string(::getpid()) + "-" +
                                               l->tmp.filename().string();
  std::vector<std::string> argv = {o.lockd_binary, "--no-config", "--key-file", l->key_file, "--store", store,
                                    "--listen", "127.0.0.1:0", "--ttl-ms", "60000", "--max-names",
                                    std::to_string(static_cast<std::uint64_t>(o.workers) * o.sandboxes * 2 + 1024)};
  if (!etcd.empty()) argv.insert(argv.end(), {"--signing-key-file", signing});
  const bool started = perf::spawn_lockd(*l, argv, [&] {
    if (cpu_set_t cpus; !o.lockd_cpus.empty() && parse_cpu_list(o.lockd_cpus, cpus))
      ::sched_setaffinity(0, sizeof cpus, &cpus);
    if (shared_keys) ::setenv("LEASEHOLD_ABLATE", "shared-worker-key", 1);
    else ::unsetenv("LEASEHOLD_ABLATE");
  });
  if (!started) return nullptr;
  if (!etcd.empty()) {
    // A cluster of one: it serves once it has won the election (bounded wait).
    bool leading = false;
    for (int i = 0; i < 300 && !leading; ++i) {
      std::ifstream log(l->tmp / "lockd.log");
      const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      leading = text.find("event=leading") != std::string::npos;
      if (!leading) ::usleep(50'000);
    }
    if (!leading) {
      std::fprintf(stderr, "lockd on %s did not lead within 15 s; see %s\n", store.c_str(), (l->tmp / "lockd.log").c_str());
      return nullptr;
    }
  }
  std::printf("started lockd pid %d on %s (%s), store %s\n", l->pid, l->address.str().c_str(),
              shared_keys ? "one shared worker key: the ablation" : "per-worker keys", store.c_str());
  return l;
}

/// The simulated workers, each signing with the key lockd issues it: its own derived key
/// (HKDF of the cluster key and its id), or the one shared key under the ablation. A key file
/// that is not a cluster key (--lockd with some other key) is used as it is.
std::vector<Worker> make_workers(const Options& o, const wire::WireKey& key, bool shared_keys) {
  std::vector<Worker> workers(o.workers);
  for (unsigned w = 0; w < o.workers; ++w) {
    workers[w].id = WorkerId{0x10ad, w + 1};
    const wire::WireKey k = key.kind == wire::KeyKind::cluster
                                ? wire::derive_worker_key_as_issued(key, workers[w].id, shared_keys)
                                : key;
    workers[w].sender = std::make_unique<wire::Sender>(workers[w].id, wire::seq_seed(), k);
    for (unsigned s = 0; s < o.sandboxes; ++s) {
      wire::HeartbeatEntry e;
      e.name_id = name_id_of("load/w" + std::to_string(w) + "/s" + std::to_string(s));
      e.sandbox = SandboxId{w + 1, s + 1};
      workers[w].leases.push_back(e);
    }
  }
  return workers;
}

/// Acquires every name, then refreshes for o.seconds; the refresh result (per_s 0 on failure).
RefreshRun run_against(std::vector<Worker>& workers, const SocketAddress& lockd_addr, const Options& o,
                          pid_t pid, int* rc, double* acquires_per_s = nullptr) {
  if (!acquire_all(workers, lockd_addr, o, pid, acquires_per_s)) {
    std::fprintf(stderr, "some acquires were refused\n");
    *rc = 1;
  }
  print_lockd_stats(lockd_addr, *workers[0].sender,
                    {"store_commits", "store_changes", "store_commit_us_p50", "store_commit_us_p99",
                     "store_batch_changes_mean", "store_batch_changes_max", "store_compactions",
                     "store_compact_ms_max", "overloaded", "kernel_drops"});
  {
    // The store folds its change log once idle; let that finish so the refresh phase measures
    // refreshes only (bounded wait).
    const std::int64_t t0 = boottime_ns();
    std::uint64_t rows = 0;
    for (int i = 0; i < 300; ++i) {
      rows = counter(lockd_counters(lockd_addr, *workers[0].sender), "store_log_rows");
      if (rows <= 32'768) break;
      ::usleep(100'000);
    }
    std::printf("  change-log compaction after the acquires: %.2f s (log rows left %" PRIu64 ")\n",
                static_cast<double>(boottime_ns() - t0) / 1e9, rows);
  }
  const RefreshRun r = refresh_rounds(workers, lockd_addr, o, pid, true);
  std::printf("refreshes: %" PRIu64 " in %.2f s = %.0f/s (%" PRIu64 " datagrams, window %u); not refreshed %" PRIu64
              "; lockd CPU %.2f s = %.3f CPU-s per 1M refreshes; generator CPU %.2f s\n",
              r.entries, r.seconds, r.per_s, r.datagrams, o.window, r.not_refreshed, r.cpu_s,
              r.entries == 0 ? 0.0 : r.cpu_s / (static_cast<double>(r.entries) / 1e6), r.generator_cpu_s);
  std::printf("  answers: %" PRIu64 " authentic (tag checked with the worker's key), %" PRIu64 " rejected\n",
              r.answers_verified, r.answers_rejected);
  if (r.not_refreshed != 0 || r.answers_rejected != 0) *rc = 1;
  print_lockd_stats(lockd_addr, *workers[0].sender, {"refresh_entries", "kernel_drops", "sends_failed", "derived_keys"});
  return r;
}

/// etcd's own rate: `clients` threads, each putting one key per transaction (unguarded, a fresh
/// key each) for `seconds`; transactions per second, 0 on error.
double etcd_put_rate(const std::string& endpoints, unsigned clients, double seconds) {
  auto c = etcd::Client::open(endpoints);
  if (!c.ok()) {
    std::fprintf(stderr, "etcd: %s\n", c.status().message().c_str());
    return 0;
  }
  std::shared_ptr<etcd::Client> client = std::move(*c);
  std::atomic<std::uint64_t> done{0};
  std::atomic<bool> failed{false};
  const std::int64_t end = boottime_ns() + static_cast<std::int64_t>(seconds * 1e9);
  const std::string prefix = "/lockd-load-raw-" + std::to_string(::getpid()) + "/";
  std::vector<std::thread> threads;
  const std::int64_t t0 = boottime_ns();
  for (unsigned t = 0; t < clients; ++t)
    threads.emplace_back([&, t] {
      for (std::uint64_t n = 0; boottime_ns() < end && !failed; ++n) {
        const std::string key = prefix + std::to_string(t) + "/" + std::to_string(n);
        auto r = client->txn({}, {etcd::Op::put(key, std::string(110, 'x'))}, {}, boottime_ns() + 5'000'000'000);
        if (!r.ok()) {
          failed = true;
          std::fprintf(stderr, "etcd put: %s\n", r.status().message().c_str());
          return;
        }
        ++done;
      }
    });
  for (auto& t : threads) t.join();
  const double secs = static_cast<double>(boottime_ns() - t0) / 1e9;
  return failed ? 0.0 : static_cast<double>(done.load()) / secs;
}

// ---- --handover: a waiter's hand-over against a poll-and-retry loop ---------------------------

/// One round's latency, ns, from the holder's Release acknowledged to the next holder's grant
/// received (a queued waiter's pushed Grant, or a poller's first granted Acquire).
struct Party {
  WorkerId id;
  std::unique_ptr<wire::Sender> sender;
  wire::Authenticator auth;
  Pipe pipe;
  std::uint64_t next_rid = 1;
  Party(WorkerId w, const wire::WireKey& cluster, const SocketAddress& lockd)
      : id(w), auth(wire::derive_worker_key(cluster, w)), pipe(lockd) {
    sender = std::make_unique<wire::Sender>(w, wire::seq_seed(), wire::derive_worker_key(cluster, w));
  }
  std::uint64_t send(const wire::Body& body) {
    wire::Datagram d;
    const std::uint64_t rid = next_rid++;
    if (!sender->seal(rid, body, d)) throw std::runtime_error("seal");
    pipe.queue(d);
    pipe.flush();
    return rid;
  }
  /// Every authentic answer there is now (no wait).
  std::vector<wire::Body> poll_answers() {
    std::vector<wire::Body> out;
    pipe.receive(0, [&](std::span<const std::uint8_t> b) {
      wire::DecodeResult r = wire::decode(b, &auth);
      if (r) out.push_back(std::move(r.body));
    });
    return out;
  }
  /// Waits (spinning) for an answer that `accept` takes, at most 5 s.
  template <class Fn>
  bool await(Fn&& accept) {
    const std::int64_t end = boottime_ns() + 5'000'000'000;
    while (boottime_ns() < end)
      for (const wire::Body& b : poll_answers())
        if (accept(b)) return true;
    return false;
  }
};

/// `rounds` hand-overs of one name from A to B: B waits in lockd's FIFO (poll_ms 0), or B
/// polls with a 2-phase Acquire every poll_ms, starting at a random phase before the release.
/// The latencies in ns, from the release acknowledged and from the release sent (empty on a
/// failure, reported on stderr).
struct Handover {
  std::vector<std::uint64_t> from_ack, from_send;
};
Handover handover_rounds(const SocketAddress& lockd, const wire::WireKey& key, unsigned rounds,
                                           unsigned poll_ms, std::uint32_t tag) {
  Party a(WorkerId{0x4a, tag}, key, lockd), b(WorkerId{0x4b, tag}, key, lockd);
  Handover out;
  std::minstd_rand rng(tag);
  for (unsigned i = 0; i < rounds; ++i) {
    const std::string name = "handover/" + std::to_string(tag) + "/" + std::to_string(i);
    const NameId id = name_id_of(name);
    const SandboxId sa{0xa0 + tag, i + 1}, sb{0xb0 + tag, i + 1};
    Epoch held = 0;
    a.send(wire::Acquire{name, sa, a.id, 60'000, false});
    if (!a.await([&](const wire::Body& x) {
          const auto* g = std::get_if<wire::Grant>(&x);
          return g != nullptr && g->name_id == id && (held = g->epoch, true);
        })) {
      std::fprintf(stderr, "handover: A's acquire of %s was not granted\n", name.c_str());
      return {};
    }
    if (poll_ms == 0) {
      b.send(wire::Wait{name, sb, b.id, 60'000});
      if (!b.await([&](const wire::Body& x) { return std::holds_alternative<wire::Queued>(x); })) {
        std::fprintf(stderr, "handover: B's wait for %s was not queued\n", name.c_str());
        return {};
      }
    }
    // The poller's phase relative to the release is random, as a user's loop's would be.
    const std::int64_t poll_ns = static_cast<std::int64_t>(poll_ms) * 1'000'000;
    std::int64_t next_poll = poll_ms == 0 ? 0 : boottime_ns();
    const std::int64_t release_at = boottime_ns() + (poll_ms == 0 ? 0 : static_cast<std::int64_t>(rng() % static_cast<unsigned>(poll_ns)));
    bool released = false;
    std::int64_t sent = 0, acked = 0, granted = 0;
    Epoch got = 0;
    const std::int64_t end = boottime_ns() + 10'000'000'000;
    while ((acked == 0 || granted == 0) && boottime_ns() < end) {
      const std::int64_t now = boottime_ns();
      if (!released && now >= release_at) {
        a.send(wire::Release{id, sa, held});
        sent = boottime_ns();
        released = true;
      }
      if (poll_ms != 0 && granted == 0 && now >= next_poll) {
        b.send(wire::Acquire{name, sb, b.id, 0, true});
        next_poll = now + poll_ns;
      }
      for (const wire::Body& x : a.poll_answers())
        if (std::holds_alternative<wire::Ok>(x) && acked == 0) acked = boottime_ns();
      for (const wire::Body& x : b.poll_answers())
        if (const auto* g = std::get_if<wire::Grant>(&x); g != nullptr && g->name_id == id && granted == 0) {
          granted = boottime_ns();
          got = g->epoch;
        }
    }
    if (acked == 0 || granted == 0) {
      std::fprintf(stderr, "handover: round %u did not complete (release %s, grant %s)\n", i, acked ? "ok" : "lost",
                   granted ? "ok" : "lost");
      return {};
    }
    if (got <= held) {
      std::fprintf(stderr, "handover: round %u granted epoch %llu after %llu\n", i, static_cast<unsigned long long>(got),
                   static_cast<unsigned long long>(held));
      return {};
    }
    out.from_ack.push_back(granted > acked ? static_cast<std::uint64_t>(granted - acked) : 0);
    out.from_send.push_back(static_cast<std::uint64_t>(granted - sent));
    b.send(wire::Release{id, sb, got});  // aborts the 2-phase grant
    (void)b.await([](const wire::Body& x) { return std::holds_alternative<wire::Ok>(x); });
  }
  return out;
}

int run_handover(const Options& o, unsigned rounds) {
  std::string key_file;
  auto l = start_lockd(o, false, &key_file);
  if (!l) return 1;
  auto key = wire::load_key_file(key_file);
  if (!key) {
    std::fprintf(stderr, "%s\n", key.message().c_str());
    return 1;
  }
  std::printf("hand-over of a held name to the next holder's grant (%u rounds each, lockd on SQLite, loopback), ms:\n",
              rounds);
  std::printf("  %-24s %14s %14s %14s %14s\n", "next holder", "ack->grant p50", "ack->grant p99", "send->grant p50",
              "send->grant p99");
  double fifo_send_p50 = 0;
  std::uint32_t tag = 1;
  for (const unsigned poll_ms : {0u, 10u, 100u}) {
    const Handover h = handover_rounds(l->address, *key, rounds, poll_ms, tag++);
    if (h.from_ack.empty()) return 1;
    auto ms = [](const std::vector<std::uint64_t>& v, double p) { return static_cast<double>(percentile(v, p)) / 1e6; };
    if (poll_ms == 0) fifo_send_p50 = ms(h.from_send, 0.50);
    const std::string who = poll_ms == 0 ? "waits in lockd's FIFO" : "polls every " + std::to_string(poll_ms) + " ms";
    std::printf("  %-24s %14.3f %14.3f %14.3f %14.3f", who.c_str(), ms(h.from_ack, 0.50), ms(h.from_ack, 0.99),
                ms(h.from_send, 0.50), ms(h.from_send, 0.99));
    if (poll_ms != 0 && fifo_send_p50 > 0) std::printf("   send->grant p50 %.1fx the FIFO's", ms(h.from_send, 0.50) / fifo_send_p50);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  unsigned key_rounds = 2;
  CLI::App app{"leasehold-lockd-load: durable acquires and batched refreshes against lockd over loopback UDP"};
  app.add_option("--workers", o.workers, "simulated workers (one sender id each)")->capture_default_str()->check(CLI::Range(1u, 100000000u));
  app.add_option("--sandboxes", o.sandboxes, "sandboxes (leases) per worker")->capture_default_str()->check(CLI::Range(1u, 100000000u));
  app.add_option("--seconds", o.seconds, "refresh phase duration, seconds")->capture_default_str();
  app.add_option("--window", o.window, "heartbeat datagrams in flight")->capture_default_str()->check(CLI::Range(1u, 100000000u));
  app.add_option("--acquire-windows", o.acquire_windows,
                 "acquire requests in flight: one pass per entry (comma-separated), each on names of its own")
      ->delimiter(',')
      ->check(CLI::Range(1u, 100000000u))
      ->capture_default_str();
  app.add_option("--acquire-samples", o.acquire_samples,
                 "names acquired per window but the last (the last acquires the rest)")
      ->capture_default_str();
  app.add_option("--fsync-samples", o.fsync_samples,
                 "4 KiB write+fdatasync samples of each kind taken before every acquire window")
      ->capture_default_str();
  app.add_option("--lockd", o.lockd, "ADDR:PORT of a running lockd (default: start one)");
  app.add_option("--key-file", o.key_file, "key file (with --lockd): a cluster key (each worker's key is derived from it) or one key for all");
  app.add_option("--store-dir", o.store_dir, "directory for the started lockd's store")->capture_default_str();
  app.add_option("--lockd-binary", o.lockd_binary, "leasehold-lockd to start")->capture_default_str();
  app.add_option("--key-rounds", key_rounds,
                 "started lockd: runs with per-worker keys and with one shared worker key (the "
                 "shared-worker-key ablation), alternating, this many of each; the report compares "
                 "their refreshes/s (0: per-worker keys only)")
      ->capture_default_str();
  app.add_flag("!--no-baseline", o.baseline, "skip the UDP reflector baseline");
  app.add_option("--etcd", o.etcd,
                 "HOST:PORT[,...] of an etcd: compare the started lockd on SQLite with it as the leader of a "
                 "one-lockd cluster on this etcd (--key-rounds of each, per-worker keys), then measure etcd's "
                 "own one-put transaction rate");
  app.add_option("--etcd-clients", o.etcd_clients, "--etcd: threads putting concurrently for etcd's own rate")
      ->capture_default_str();
  unsigned handover = 0;
  app.add_option("--handover", handover,
                 "instead: this many hand-overs of a held name to a waiter in lockd's FIFO, and to a poller "
                 "retrying every 10 ms and every 100 ms (p50/p99 from release acknowledged to the next grant)");
  bool json = false;
  app.add_flag("--json", json,
               "print one JSON object on stdout (refreshes_per_s, cpu_s_per_million, runs, ...); the report goes "
               "to stderr");
  app.add_option("--lockd-cpus", o.lockd_cpus, "pin the started lockd to these CPUs (e.g. 0 or 0-1)")
      ->check([](const std::string& v) {
        cpu_set_t set;
        return parse_cpu_list(v, set) ? std::string() : "not a CPU list: " + v;
      });
  CLI11_PARSE(app, argc, argv);
  if (handover > 0) return run_handover(o, handover);
  int rc = 0;
  // --json: the report to stderr, the one object to the original stdout.
  int json_fd = -1;
  if (json) {
    std::fflush(stdout);
    json_fd = ::dup(1);
    ::dup2(2, 1);
  }
  nlohmann::json runs = nlohmann::json::array();
  auto run_json = [&](const char* keys, const RefreshRun& r, double acquires) {
    runs.push_back({{"keys", keys},
                    {"acquires_per_s", acquires},
                    {"refreshes", r.entries},
                    {"seconds", r.seconds},
                    {"refreshes_per_s", r.per_s},
                    {"datagrams", r.datagrams},
                    {"not_refreshed", r.not_refreshed},
                    {"answers_verified", r.answers_verified},
                    {"answers_rejected", r.answers_rejected},
                    {"lockd_cpu_s", r.cpu_s},
                    {"cpu_s_per_million", r.entries == 0 ? 0.0 : r.cpu_s / (static_cast<double>(r.entries) / 1e6)},
                    {"generator_cpu_s", r.generator_cpu_s}});
  };
  // The summary: the runs with per-worker keys on SQLite (the default configuration).
  auto emit_json = [&](double baseline_per_s) {
    if (json_fd < 0) return;
    double refreshes = 0, seconds = 0, cpu = 0, acquires = 0;
    unsigned n = 0;
    for (const auto& r : runs)
      if (r["keys"] == "per-worker") {
        refreshes += r["refreshes"].get<double>();
        seconds += r["seconds"].get<double>();
        cpu += r["lockd_cpu_s"].get<double>();
        acquires += r["acquires_per_s"].get<double>();
        ++n;
      }
    nlohmann::json out = {
        {"system", "lockd"},
        {"workers", o.workers},
        {"sandboxes", o.sandboxes},
        {"names", static_cast<std::uint64_t>(o.workers) * o.sandboxes},
        {"entries_per_datagram", wire::kHeartbeatEntriesMax},
        {"window", o.window},
        {"auth", "HMAC-SHA256 per datagram (per-worker keys), every answer's tag verified"},
        {"lockd_cpus", o.lockd_cpus},
        {"refreshes_per_s", seconds > 0 ? refreshes / seconds : 0.0},
        {"cpu_s_per_million", refreshes > 0 ? cpu / (refreshes / 1e6) : 0.0},
        {"acquires_per_s", n > 0 ? acquires / n : 0.0},
        {"ok", rc == 0},
        {"runs", runs}};
    if (baseline_per_s > 0) out["baseline_per_s"] = baseline_per_s;
    const std::string text = out.dump() + "\n";
    if (::write(json_fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) rc = 1;
    ::close(json_fd);
  };
  std::printf("%u workers x %u sandboxes = %u leases; 2 cores shared by lockd and this generator\n", o.workers,
              o.sandboxes, o.workers * o.sandboxes);
  std::fflush(stdout);

  if (!o.lockd.empty()) {
    auto a = SocketAddress::parse(o.lockd);
    if (!a) {
      std::fprintf(stderr, "--lockd %s: not an ADDR:PORT (e.g. 127.0.0.1:7400)\n", o.lockd.c_str());
      return 2;
    }
    if (o.key_file.empty()) {
      std::fprintf(stderr, "--lockd needs --key-file: the cluster key of that lockd (or one worker key)\n");
      return 2;
    }
    auto key = wire::load_key_file(o.key_file);
    if (!key) {
      std::fprintf(stderr, "%s\n", key.message().c_str());
      return 1;
    }
    std::vector<Worker> workers = make_workers(o, *key, false);
    double acquires = 0;
    run_json("per-worker", run_against(workers, *a, o, -1, &rc, &acquires), acquires);
    emit_json(0);
    return rc;
  }

  // Per-worker keys against one shared key, alternating (so drift of a loaded machine hits both).
  std::vector<double> per_worker, shared;
  std::vector<Worker> last;
  const unsigned n_runs = key_rounds == 0 ? 1 : 2 * key_rounds;
  std::vector<double> acquires_sqlite, acquires_etcd;
  for (unsigned i = 0; i < n_runs; ++i) {
    const bool on_etcd = !o.etcd.empty() && key_rounds != 0 && i % 2 == 1;
    const bool shared_keys = o.etcd.empty() && key_rounds != 0 && i % 2 == 1;
    std::string key_file;
    auto l = start_lockd(o, shared_keys, &key_file, on_etcd ? o.etcd : std::string());
    if (!l) return 1;
    auto key = wire::load_key_file(key_file);
    if (!key) {
      std::fprintf(stderr, "%s\n", key.message().c_str());
      return 1;
    }
    std::vector<Worker> workers = make_workers(o, *key, shared_keys);
    double acquires = 0;
    const RefreshRun r = run_against(workers, l->address, o, l->pid, &rc, &acquires);
    (shared_keys || on_etcd ? shared : per_worker).push_back(r.per_s);
    run_json(on_etcd ? "per-worker, etcd store" : shared_keys ? "shared" : "per-worker", r, acquires);
    (on_etcd ? acquires_etcd : acquires_sqlite).push_back(acquires);
    if (i + 1 == n_runs) last = std::move(workers);
  }
  auto mean = [](const std::vector<double>& v) {
    double t = 0;
    for (double x : v) t += x;
    return v.empty() ? 0.0 : t / static_cast<double>(v.size());
  };
  if (!shared.empty() && !o.etcd.empty()) {
    std::printf("stores: SQLite %.0f refreshes/s, %.0f acquires/s; etcd leader %.0f refreshes/s, %.0f acquires/s; "
                "etcd/SQLite refreshes = %.3f (target >= 0.9), acquires = %.3f\n",
                mean(per_worker), mean(acquires_sqlite), mean(shared), mean(acquires_etcd),
                mean(per_worker) > 0 ? mean(shared) / mean(per_worker) : 0.0,
                mean(acquires_sqlite) > 0 ? mean(acquires_etcd) / mean(acquires_sqlite) : 0.0);
    const double raw = etcd_put_rate(o.etcd, o.etcd_clients, 3.0);
    std::printf("etcd's own rate: %.0f one-put transactions/s from %u client threads (lockd's etcd client); "
                "lockd's durable acquires on etcd / etcd's own puts = %.2f (target >= 1)\n",
                raw, o.etcd_clients, raw > 0 ? mean(acquires_etcd) / raw : 0.0);
  } else if (!shared.empty()) {
    std::string pw, sh;
    for (double x : per_worker) pw += (pw.empty() ? "" : ", ") + std::to_string(static_cast<long long>(x));
    for (double x : shared) sh += (sh.empty() ? "" : ", ") + std::to_string(static_cast<long long>(x));
    const double ratio = mean(shared) > 0 ? mean(per_worker) / mean(shared) : 0.0;
    std::printf("per-worker keys: %.0f refreshes/s (runs: %s); one shared key: %.0f refreshes/s (runs: %s); "
                "per-worker/shared = %.3f (target >= 0.95)\n",
                mean(per_worker), pw.c_str(), mean(shared), sh.c_str(), ratio);
  }
  double baseline_per_s = 0;
  if (o.baseline && !last.empty()) {
    Reflector reflector;
    const RefreshRun b = refresh_rounds(last, reflector.address(), o, -1, false);
    baseline_per_s = b.per_s;
    std::printf("baseline (UDP reflector, same datagrams): %.0f entries/s (generator + reflector CPU %.2f s); "
                "lockd (per-worker keys)/baseline = %.2f\n",
                b.per_s, b.generator_cpu_s, b.per_s > 0 ? mean(per_worker) / b.per_s : 0.0);
  }
  emit_json(baseline_per_s);
  return rc;
}
