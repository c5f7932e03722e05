// leasehold-handover-bench: the hand-over of a held name as a user sees it, through the
// supervisors and the CLI, from the holder's release acknowledged to the next holder's first
// accepted write at a fenced resource (perf/handover/README.md).
//
// One lockd (SQLite store) and two supervisors on loopback (worker A holds, worker B takes
// over), real processes started as the process tests start them (harness::Deployment, root,
// --no-config). Each round:
//   1. A runs the name's holder: leasehold-handover-writer, which does one fenced write at its
//      epoch (so the resource has seen it) and waits for SIGTERM;
//   2. B's next holder is asked for, one of three ways (the modes, interleaved round by round):
//        fifo      `leasehold run --wait --name N -- WRITER`: B's supervisor waits in lockd's FIFO;
//                  the release comes once B's supervisor logs that lockd queued it;
//        poll P    `leasehold run --name N -- WRITER` again P ms after each `held` refusal (as
//                  `until leasehold run ...; do sleep 0.01; done`); the release comes at a random
//                  phase of that loop;
//   3. release: the control op `release` on A (SIGTERM to the holder, its exit, lockd's
//      acknowledgement of the Release, then the answer): "release acknowledged" is the answer's
//      arrival here;
//   4. the next holder's writer, started by B, does its fenced write the moment it starts: the
//      time write() returned accepted is the end point (CLOCK_MONOTONIC, read in the sandbox;
//      the same clock here);
//   5. B releases it; the resource is checkpointed (outside the measurement).
// Every round checks that the next holder's write was accepted at a higher epoch than the
// holder's, and the end checks the resource's audit (FencedStore check_audit: exclusive, every
// accepted write's token verified, nothing rejected). Exit 0; 1 when a check failed or a round
// could not complete; 2 for a bad flag; 77 where it cannot run (not root, no io_uring); 130 on
// SIGINT or SIGTERM.
#include "perf/common/ratio_table.hpp"

#include "leasehold/harness/deployment.hpp"
#include "leasehold/harness/log.hpp"
#include "leasehold/harness/process.hpp"
#include "leasehold/io/probe.hpp"
#include "leasehold/resource/fenced_store.hpp"
#include "leasehold/wire/token.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef LEASEHOLD_LOCKD_BINARY
#error "LEASEHOLD_LOCKD_BINARY must name the leasehold-lockd executable"
#endif
#ifndef LEASEHOLD_SUPERVISOR_BINARY
#error "LEASEHOLD_SUPERVISOR_BINARY must name the leasehold-supervisor executable"
#endif
#ifndef LEASEHOLD_CLI_BINARY
#error "LEASEHOLD_CLI_BINARY must name the leasehold executable"
#endif
#ifndef LEASEHOLD_HANDOVER_WRITER_BINARY
#error "LEASEHOLD_HANDOVER_WRITER_BINARY must name the leasehold-handover-writer executable"
#endif

namespace {

using namespace leasehold;
namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitSkip = 77;
/// Bounds of one step of a round (generous: a loaded 2-CPU machine).
constexpr milliseconds kStepTimeout{15'000};
/// Slots per supervisor: each refused `run` of a poller claims a slot, which cools down 2 s
/// after it is freed; 100 attempts a second need about 200.
constexpr unsigned kSlots = 512;
constexpr const char* kName = "handover";

std::int64_t mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void sleep_until_mono(std::int64_t t_ns) {
  timespec ts{static_cast<time_t>(t_ns / 1'000'000'000), static_cast<long>(t_ns % 1'000'000'000)};
  while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) harness::InterruptScope::check();
}

void tick() { harness::InterruptScope::check(); }

/// A failure that ends the run: the exit code and why.
struct Failure {
  int code = kExitFailed;
  std::string message;
};
[[noreturn]] void fail(const std::string& message, int code = kExitFailed) { throw Failure{code, message}; }

struct Options {
  unsigned rounds = 100;
  std::vector<unsigned> poll_ms = {10, 100};
  bool json = false;
  bool keep = false;
  std::uint64_t seed = 0;  // 0: random
  std::string lockd_bin = LEASEHOLD_LOCKD_BINARY;
  std::string supervisor_bin = LEASEHOLD_SUPERVISOR_BINARY;
  std::string cli_bin = LEASEHOLD_CLI_BINARY;
  std::string writer_bin = LEASEHOLD_HANDOVER_WRITER_BINARY;
};

/// How the next holder asks for the name.
struct Mode {
  std::string key;    ///< "fifo", "poll-10ms"
  std::string label;  ///< the table's
  unsigned poll_ms = 0;  ///< 0: lockd's FIFO (run --wait)
};

/// One hand-over. Times CLOCK_MONOTONIC ns.
struct Round {
  unsigned index = 0;
  Epoch held = 0;                 ///< the holder's epoch (its write accepted at it)
  Epoch next = 0;                 ///< the next holder's epoch (its write accepted at it)
  std::int64_t send_ns = 0;       ///< release request sent
  std::int64_t ack_ns = 0;        ///< release answered (lockd acknowledged the Release)
  std::int64_t start_ns = 0;      ///< the next holder's writer entered main()
  std::int64_t valid_ns = 0;      ///< its shm check passed
  std::int64_t accepted_ns = 0;   ///< its write returned accepted
  unsigned attempts = 1;          ///< `leasehold run` invocations of the next holder
  std::int64_t latency() const { return accepted_ns - ack_ns; }
};

/// A writer's result line (handover_writer.cpp).
struct WriterResult {
  Epoch epoch = 0;
  std::string verdict;
  std::int64_t start_ns = 0, valid_ns = 0, accepted_ns = 0;
  std::string line;
};

/// Whether `leasehold run --json` was refused because the name is held: exit 3 (refused) and
/// the error object on stdout with "reason": "held".
bool refused_held(int code, const std::string& output) {
  if (code != 3) return false;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("reason", std::string()) == "held") return true;
  }
  return false;
}

/// The epoch in the first line of `leasehold run --json`'s output that is a started sandbox's
/// answer (0: none).
Epoch started_epoch(const std::string& output) {
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("sandbox") && j.contains("epoch")) return j.value("epoch", Epoch{0});
  }
  return 0;
}

double ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

/// Nearest rank: the smallest value with at least p of the values at or below it.
std::int64_t percentile(std::vector<std::int64_t> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

std::string loadavg() {
  std::string s = harness::slurp("/proc/loadavg", 256);
  const auto sp = s.find(' ');
  return sp == std::string::npos ? s : s.substr(0, sp);
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d", &tm);
  return b;
}

class Bench {
 public:
  explicit Bench(const Options& o)
      : o_(o), tmp_("lh-handover"), rng_(o.seed != 0 ? o.seed : std::random_device{}()) {}
  ~Bench() {
    if (o_.keep) tmp_.keep();
  }

  void setup();
  Round round(const Mode& m, unsigned index);
  resource::AuditReport audit();
  const fs::path& dir() const { return tmp_.path(); }

 private:
  std::vector<std::string> writer_argv(const fs::path& result) const {
    return {o_.writer_bin, "--db", db_.string(), "--name", kName, "--public-key", pub_.string(), "--result",
            result.string(), "--max-seconds", "600"};
  }
  fs::path result_path(unsigned index, const Mode& m, const char* who) const {
    return results_ / (std::to_string(index) + "-" + m.key + "-" + who);
  }
  json control(int w, json req) const {
    auto a = harness::Deployment::request(sock_[w], std::move(req), kStepTimeout);
    if (!a) fail(std::string("worker ") + kWorker[w] + "'s control socket: " + a.message());
    return *a;
  }
  WriterResult wait_result(const fs::path& path, const std::string& who) const;
  Epoch hold(unsigned index, const Mode& m);
  void release_b(const std::string& why);

  static constexpr const char* kWorker[2] = {"A", "B"};
  const Options& o_;
  harness::TempDir tmp_;
  std::mt19937_64 rng_;
  std::unique_ptr<harness::Deployment> dep_;
  fs::path shared_, results_, pub_, db_;
  fs::path sock_[2], log_[2];
  std::unique_ptr<resource::FencedStore> store_;
};

void Bench::setup() {
  if (::geteuid() != 0) fail("needs root: the supervisors run isolated sandboxes as uids of their own", kExitSkip);
  if (const Status why = io_uring_usable(); !why.ok()) fail("lockd and the supervisors need io_uring: " + why.message(), kExitSkip);
  for (const std::string& bin : {o_.lockd_bin, o_.supervisor_bin, o_.cli_bin, o_.writer_bin})
    if (::access(bin.c_str(), X_OK) != 0) fail("cannot execute " + bin + ": build it first", kExitFailed);
  // The sandboxes run as unprivileged uids: they may pass through the directory (not read the
  // keys or lockd's store in it) and write only in shared/.
  ::chmod(dir().c_str(), 0711);
  shared_ = dir() / "shared";
  results_ = shared_ / "results";
  for (const fs::path& d : {shared_, results_})
    if (::mkdir(d.c_str(), 0777) != 0 || ::chmod(d.c_str(), 0777) != 0)
      fail("cannot create " + d.string() + ": " + std::strerror(errno));
  dep_ = std::make_unique<harness::Deployment>(dir());
  if (const Status e = dep_->make_cluster_key(); !e.ok()) fail(e.message());
  harness::LockdSpec ls;
  ls.bin = o_.lockd_bin;
  if (const harness::Started s = dep_->start_lockd(ls, tick); !s.ok()) fail(s.error);
  // lockd signs every grant's token with the key it made beside its store; the resource
  // verifies writes with the public key alone, copied where the sandboxes can read it.
  pub_ = shared_ / "lockd-token.pub";
  std::error_code ec;
  fs::copy_file(dir() / "lockd.db.signing.key.pub", pub_, fs::copy_options::overwrite_existing, ec);
  if (ec) fail("cannot copy lockd's token public key: " + ec.message());
  ::chmod(pub_.c_str(), 0644);
  db_ = shared_ / "resource.db";
  resource::StoreOptions so;
  so.durable = false;
  so.checkpoint_pages = 0;
  so.verifier = std::make_shared<token::TokenVerifier>();
  if (const Status why = so.verifier->add_public_key_file(pub_.string()); !why.ok()) fail(why.message());
  auto opened = resource::FencedStore::open(db_.string(), so);
  if (!opened) fail(opened.message());
  store_ = std::move(opened).value();
  for (const char* suffix : {"", "-wal", "-shm"}) ::chmod((db_.string() + suffix).c_str(), 0666);

  std::random_device rd;
  for (int w = 0; w < 2; ++w) {
    const WorkerId id{(std::uint64_t{rd()} << 32) | rd(), (std::uint64_t{rd()} << 32) | rd() | 1};
    const std::string key_file = std::string(kWorker[w]) + ".key";
    if (const Status e = dep_->make_worker_key(key_file, id); !e.ok()) fail(e.message());
    sock_[w] = dir() / (std::string(kWorker[w]) + ".sock");
    harness::SupervisorSpec ss;
    ss.bin = o_.supervisor_bin;
    ss.label = std::string("leasehold-supervisor (worker ") + kWorker[w] + ")";
    ss.key_file = dir() / key_file;
    ss.control_socket = sock_[w];
    log_[w] = ss.log = dir() / (std::string(kWorker[w]) + ".log");
    // Root's supervisors need disjoint sandbox uid ranges (a range overlapping a live
    // supervisor's is refused): one per process and worker, clear of the tests' and the demo's.
    const std::uint64_t first =
        1'600'000'000ull + (static_cast<std::uint64_t>(::getpid()) % 50'000) * 2048 + static_cast<std::uint64_t>(w) * 1024;
    ss.extra_args = {"--uid-range", std::to_string(first) + ":1024", "--slots", std::to_string(kSlots),
                     "--sandbox-log-dir", (dir() / (std::string(kWorker[w]) + "-sandbox-logs")).string()};
    if (const harness::Started s = dep_->start_supervisor(ss, nullptr, tick); !s.ok()) fail(s.error);
  }
}

WriterResult Bench::wait_result(const fs::path& path, const std::string& who) const {
  if (!harness::eventually([&] { return fs::exists(path); }, kStepTimeout, milliseconds(1), tick))
    fail(who + "'s writer wrote no result within " + std::to_string(kStepTimeout.count()) + " ms (" + path.string() + ")");
  WriterResult r;
  r.line = harness::slurp(path);
  if (!r.line.empty() && r.line.back() == '\n') r.line.pop_back();
  const harness::LogFields f = harness::parse_log_line(r.line);
  auto num = [&](const char* k) -> std::int64_t {
    const auto it = f.find(k);
    return it == f.end() ? 0 : std::strtoll(it->second.c_str(), nullptr, 10);
  };
  r.epoch = static_cast<Epoch>(num("epoch"));
  r.verdict = f.count("verdict") != 0 ? f.at("verdict") : "";
  r.start_ns = num("start_ns");
  r.valid_ns = num("valid_ns");
  r.accepted_ns = num("accepted_ns");
  if (r.verdict != "accepted") fail(who + "'s write was not accepted: " + r.line);
  return r;
}

/// Step 1: A runs the holder; its write accepted. Its epoch.
Epoch Bench::hold(unsigned index, const Mode& m) {
  const fs::path result = result_path(index, m, "holder");
  const json a = control(0, {{"op", "run"}, {"name", kName}, {"argv", writer_argv(result)}, {"env", {{"PATH", "/usr/bin:/bin"}}}});
  if (!a.value("ok", false)) fail("round " + std::to_string(index) + ": worker A's run of the holder: " + a.dump());
  const Epoch epoch = a.value("epoch", Epoch{0});
  const WriterResult w = wait_result(result, "the holder");
  if (w.epoch != epoch)
    fail("round " + std::to_string(index) + ": the holder was granted epoch " + std::to_string(epoch) +
         " but wrote at " + std::to_string(w.epoch));
  return epoch;
}

void Bench::release_b(const std::string& why) {
  const json r = control(1, {{"op", "release"}, {"name", kName}});
  if (!r.value("ok", false) || !r.value("released", false)) fail(why + ": worker B's release: " + r.dump());
}

/// A poller's loop on its own thread: `leasehold run --name N -- WRITER` until it is not refused
/// `held`, sleeping `poll_ms` after each refusal.
struct Poller {
  std::vector<std::string> argv;
  unsigned poll_ms = 0;
  std::atomic<unsigned> refusals{0};
  std::atomic<std::int64_t> first_refused_ns{0};  ///< when the first refused attempt ended
  std::atomic<std::int64_t> attempt_ns{0};        ///< how long that attempt took
  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};  ///< the loop has ended (the fields below are set)
  // Set by the thread before it ends:
  unsigned attempts = 0;
  bool started = false;
  std::string failure;
  std::string output;  ///< the successful attempt's

  void run() {
    loop();
    done.store(true);
  }

 private:
  void loop() {
    const std::int64_t deadline = mono_ns() + std::int64_t{120} * 1'000'000'000;
    while (!stop.load() && mono_ns() < deadline) {
      const std::int64_t t0 = mono_ns();
      std::string out;
      const int code = harness::run_command(argv, &out, kStepTimeout);
      const std::int64_t t1 = mono_ns();
      ++attempts;
      if (code == 0) {
        started = true;
        output = std::move(out);
        return;
      }
      if (!refused_held(code, out)) {
        failure = "`leasehold run` exited " + std::to_string(code) + ": " + out;
        return;
      }
      if (refusals.load() == 0) {
        attempt_ns.store(t1 - t0);
        first_refused_ns.store(t1);
      }
      refusals.fetch_add(1);
      const std::int64_t wake = t1 + std::int64_t{poll_ms} * 1'000'000;
      timespec ts{static_cast<time_t>(wake / 1'000'000'000), static_cast<long>(wake % 1'000'000'000)};
      while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
      }
    }
    failure = stop.load() ? "stopped" : "still refused after 120 s";
  }
};

Round Bench::round(const Mode& m, unsigned index) {
  const std::string where = "round " + std::to_string(index) + " (" + m.key + ")";
  Round r;
  r.index = index;
  r.held = hold(index, m);
  const fs::path result = result_path(index, m, "next");
  std::vector<std::string> cli = {o_.cli_bin, "run", "--json", "--supervisor", sock_[1].string(), "--name", kName};
  if (m.poll_ms == 0) cli.push_back("--wait");
  cli.push_back("--");
  for (const std::string& a : writer_argv(result)) cli.push_back(a);

  harness::Process waiter;  // fifo: `run --wait`, attached until B releases its sandbox
  Poller poller;
  std::thread poll_thread;
  struct Joiner {
    Poller& p;
    std::thread& t;
    ~Joiner() {
      p.stop.store(true);
      if (t.joinable()) t.join();
    }
  } joiner{poller, poll_thread};

  if (m.poll_ms == 0) {
    harness::Spawn s;
    s.argv = cli;
    s.stdout_path = dir() / ("cli-" + std::to_string(index) + ".out");
    s.stderr_path = dir() / ("cli-" + std::to_string(index) + ".err");
    s.label = "leasehold run --wait";
    std::error_code ec;
    const std::uintmax_t log_size = fs::file_size(log_[1], ec);
    const std::size_t log_from = ec ? 0 : static_cast<std::size_t>(log_size);
    if (const Status st = waiter.start(s); !st.ok()) fail(where + ": " + st.message());
    // In line at lockd: B's supervisor was answered Queued. It logs `event=queued` when it
    // writes the progress line for the CLI ("waiting for ..."), which the daemon drops (its
    // control port does not forward progress lines), so the log is what says so.
    if (!harness::wait_for_log_line(log_[1], "event=queued name=" + std::string(kName) + " ", kStepTimeout, nullptr,
                                    tick, log_from))
      fail(where + ": the waiter never got in line (no event=queued in " + log_[1].string() + "): " + waiter.err());
  } else {
    poller.argv = cli;
    poller.poll_ms = m.poll_ms;
    poll_thread = std::thread([&poller] { poller.run(); });
    if (!harness::eventually([&] { return poller.refusals.load() > 0 || poller.done.load(); }, kStepTimeout,
                             milliseconds(1), tick) ||
        poller.refusals.load() == 0) {
      poller.stop.store(true);
      poll_thread.join();
      fail(where + ": the poller was never refused `held`: " + poller.failure);
    }
    // A user's loop runs at no particular phase to the release: release at a uniformly random
    // point of one poll cycle (the sleep and one refused attempt) after the first refusal.
    const std::int64_t cycle = std::int64_t{m.poll_ms} * 1'000'000 + poller.attempt_ns.load();
    sleep_until_mono(poller.first_refused_ns.load() +
                     std::uniform_int_distribution<std::int64_t>(0, cycle - 1)(rng_));
  }

  r.send_ns = mono_ns();
  const json rel = control(0, {{"op", "release"}, {"name", kName}});
  r.ack_ns = mono_ns();
  if (!rel.value("ok", false) || !rel.value("released", false)) fail(where + ": worker A's release: " + rel.dump());

  const WriterResult w = wait_result(result, "the next holder");
  r.next = w.epoch;
  r.start_ns = w.start_ns;
  r.valid_ns = w.valid_ns;
  r.accepted_ns = w.accepted_ns;
  if (r.next <= r.held)
    fail(where + ": the next holder's write was accepted at epoch " + std::to_string(r.next) +
         ", not above the holder's " + std::to_string(r.held));

  if (m.poll_ms != 0) {
    poll_thread.join();
    if (!poller.started) fail(where + ": the poller: " + poller.failure);
    r.attempts = poller.attempts;
    if (started_epoch(poller.output) != r.next)
      fail(where + ": `leasehold run` answered " + poller.output + " but the writer wrote at epoch " + std::to_string(r.next));
  }
  release_b(where);
  if (m.poll_ms == 0) {
    const int code = waiter.wait(kStepTimeout);
    if (code != 0)
      fail(where + ": `leasehold run --wait` exited " + std::to_string(code) + " after the release: " + waiter.err());
    const std::string out = waiter.out();
    if (started_epoch(out) != r.next)
      fail(where + ": `leasehold run --wait` answered " + out + " but the writer wrote at epoch " + std::to_string(r.next));
  }
  if (const resource::CheckpointResult c = store_->checkpoint(); !c.ok) fail(where + ": checkpoint: " + c.error);
  return r;
}

resource::AuditReport Bench::audit() {
  auto rows = store_->audit(kName);
  if (!rows) fail("the resource's audit: " + rows.message());
  return resource::check_audit(*rows);
}

/// The results of one mode.
struct ModeResult {
  Mode mode;
  std::vector<Round> rounds;
  std::vector<std::int64_t> pick(const std::function<std::int64_t(const Round&)>& f) const {
    std::vector<std::int64_t> v;
    for (const Round& r : rounds) v.push_back(f(r));
    return v;
  }
  std::vector<std::int64_t> latencies() const { return pick([](const Round& r) { return r.latency(); }); }
};

json round_json(const Round& r) {
  return {{"round", r.index},
          {"held_epoch", r.held},
          {"next_epoch", r.next},
          {"latency_ms", ms(r.latency())},
          {"release_rtt_ms", ms(r.ack_ns - r.send_ns)},
          {"ack_to_start_ms", ms(r.start_ns - r.ack_ns)},
          {"start_to_valid_ms", ms(r.valid_ns - r.start_ns)},
          {"valid_to_accepted_ms", ms(r.accepted_ns - r.valid_ns)},
          {"attempts", r.attempts}};
}

int run(const Options& o) {
  std::vector<Mode> modes = {{"fifo", "FIFO: run --wait", 0}};
  for (const unsigned p : o.poll_ms)
    modes.push_back({"poll-" + std::to_string(p) + "ms", "poll every " + std::to_string(p) + " ms", p});
  std::vector<ModeResult> results;
  for (const Mode& m : modes) results.push_back({m, {}});

  harness::InterruptScope interrupts;
  Bench bench(o);
  const std::string load_start = loadavg();
  const unsigned cpus = std::thread::hardware_concurrency();
  try {
    bench.setup();
    if (!o.json)
      std::fprintf(stderr, "leasehold-handover-bench: %u rounds x %zu modes in %s\n", o.rounds, modes.size(),
                   bench.dir().c_str());
    for (unsigned i = 0; i < o.rounds; ++i) {
      // Interleaved, each round in another order: drift in the machine's load is shared out.
      for (std::size_t k = 0; k < modes.size(); ++k) {
        ModeResult& mr = results[(i + k) % modes.size()];
        mr.rounds.push_back(bench.round(mr.mode, i));
      }
      if (!o.json && (i + 1) % 10 == 0) std::fprintf(stderr, "  %u/%u rounds\n", i + 1, o.rounds);
    }
  } catch (const Failure& f) {
    std::fprintf(stderr, "leasehold-handover-bench: %s\n", f.message.c_str());
    if (f.code != kExitSkip) std::fprintf(stderr, "  (files in %s%s)\n", bench.dir().c_str(), o.keep ? "" : ", removed on exit; --keep keeps them");
    return f.code;
  } catch (const harness::Interrupted&) {
    std::fprintf(stderr, "leasehold-handover-bench: interrupted\n");
    return 130;
  }
  resource::AuditReport audit;
  try {
    audit = bench.audit();
  } catch (const Failure& f) {
    std::fprintf(stderr, "leasehold-handover-bench: %s\n", f.message.c_str());
    return f.code;
  }
  const std::string load_end = loadavg();
  // The resource's verdict over every write of the run, holders' and next holders' alike.
  const bool audit_ok = audit.exclusive() && audit.rejected == 0 && audit.accepted == 2ull * o.rounds * modes.size();

  const std::vector<std::int64_t> fifo = results[0].latencies();
  const double fifo_p50 = ms(percentile(fifo, 0.50)), fifo_p99 = ms(percentile(fifo, 0.99));
  if (o.json) {
    json out = {{"date", today()},
                {"cpus", cpus},
                {"loadavg_start", load_start},
                {"loadavg_end", load_end},
                {"rounds_per_mode", o.rounds},
                {"measured", "release acknowledged (the holder's supervisor answered the control op `release`, "
                             "after lockd acknowledged the Release) -> the next holder's first fenced write "
                             "returned accepted (CLOCK_MONOTONIC)"},
                {"modes", json::array()}};
    for (const ModeResult& mr : results) {
      const auto v = mr.latencies();
      const auto from_send = mr.pick([](const Round& r) { return r.accepted_ns - r.send_ns; });
      json m = {{"mode", mr.mode.key},
                {"label", mr.mode.label},
                {"poll_ms", mr.mode.poll_ms},
                {"p50_ms", ms(percentile(v, 0.50))},
                {"p99_ms", ms(percentile(v, 0.99))},
                {"min_ms", ms(*std::min_element(v.begin(), v.end()))},
                {"max_ms", ms(*std::max_element(v.begin(), v.end()))},
                {"p50_ratio_to_fifo", ms(percentile(v, 0.50)) / fifo_p50},
                {"p99_ratio_to_fifo", ms(percentile(v, 0.99)) / fifo_p99},
                {"from_release_sent_p50_ms", ms(percentile(from_send, 0.50))},
                {"from_release_sent_p99_ms", ms(percentile(from_send, 0.99))},
                {"rounds", json::array()}};
      for (const Round& r : mr.rounds) m["rounds"].push_back(round_json(r));
      out["modes"].push_back(std::move(m));
    }
    out["audit"] = {{"accepted", audit.accepted},
                    {"rejected", audit.rejected},
                    {"verified", audit.verified},
                    {"exclusive", audit.exclusive()},
                    {"violations", audit.violations},
                    {"summary", audit.summary()}};
    out["ok"] = audit_ok;
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    using perf::RatioColumn;
    perf::RatioTable t(
        "hand-over: release acknowledged -> the next holder's first accepted fenced write, ms (" +
            std::to_string(o.rounds) + " rounds per mode; " + std::to_string(cpus) + " CPUs, load " + load_start +
            " -> " + load_end + ")",
        "mode", {{"p50", 2, ""}, {"p99", 2, ""}, {"min", 2, ""}, {"max", 2, ""}, {"p50/FIFO", 1, "x"}, {"p99/FIFO", 1, "x"}});
    perf::RatioTable parts("where the time goes, p50 of each part, ms", "mode",
                           {{"release rtt", 2, ""},
                            {"ack->start", 2, ""},
                            {"start->check", 2, ""},
                            {"check->accepted", 2, ""},
                            {"runs/round", 1, ""}});
    for (const ModeResult& mr : results) {
      const auto v = mr.latencies();
      const double p50 = ms(percentile(v, 0.50)), p99 = ms(percentile(v, 0.99));
      t.row(mr.mode.label, {p50, p99, ms(*std::min_element(v.begin(), v.end())), ms(*std::max_element(v.begin(), v.end())),
                            perf::ratio(p50, fifo_p50), perf::ratio(p99, fifo_p99)});
      double attempts = 0;
      for (const Round& r : mr.rounds) attempts += r.attempts;
      parts.row(mr.mode.label,
                {ms(percentile(mr.pick([](const Round& r) { return r.ack_ns - r.send_ns; }), 0.5)),
                 ms(percentile(mr.pick([](const Round& r) { return r.start_ns - r.ack_ns; }), 0.5)),
                 ms(percentile(mr.pick([](const Round& r) { return r.valid_ns - r.start_ns; }), 0.5)),
                 ms(percentile(mr.pick([](const Round& r) { return r.accepted_ns - r.valid_ns; }), 0.5)),
                 attempts / static_cast<double>(mr.rounds.size())});
    }
    std::printf("%s\n%s\nresource audit: %s\n", t.str().c_str(), parts.str().c_str(), audit.summary().c_str());
    std::printf("every round: the next holder's write accepted above the holder's epoch; %s\n",
                audit_ok ? "no write rejected" : "BUT the audit does not hold (see above)");
  }
  return audit_ok ? 0 : kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"leasehold-handover-bench: the hand-over of a held name through the supervisors and the CLI, from the "
               "holder's release acknowledged to the next holder's first accepted fenced write: a waiter in lockd's "
               "FIFO (run --wait) against a poll-and-retry loop of `leasehold run`"};
  app.add_option("--rounds", o.rounds, "hand-overs per mode (the modes interleaved)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100'000u));
  app.add_option("--poll-ms", o.poll_ms, "the poll loops' sleep after each `held` refusal, ms (one mode each)")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::Range(1u, 10'000u));
  app.add_flag("--json", o.json, "one JSON object on stdout: every mode's percentiles and rounds, the audit");
  app.add_flag("--keep", o.keep, "keep the temporary directory (logs, the resource, the writers' results)");
  app.add_option("--seed", o.seed, "seed of the pollers' random release phase (0: random)");
  app.add_option("--lockd", o.lockd_bin, "leasehold-lockd")->capture_default_str();
  app.add_option("--supervisor", o.supervisor_bin, "leasehold-supervisor")->capture_default_str();
  app.add_option("--cli", o.cli_bin, "leasehold (the CLI)")->capture_default_str();
  app.add_option("--writer", o.writer_bin, "leasehold-handover-writer")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }
  ::signal(SIGPIPE, SIG_IGN);
  return run(o);
}
