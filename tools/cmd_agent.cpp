// `leasehold agent` (hidden): the demo's sandboxed workload, and the pattern a runtime copies.
//
// Runs inside a sandbox started by the supervisor. Every --interval-ms it appends a record to a
// fenced resource (resource/fenced_store.hpp) carrying its token {name, epoch, sandbox}, and
// before every write it checks its own lease in the shm epoch table (check_deadline: epoch,
// valid_until, writer liveness). It learns its epoch from its slot, so it also works when it
// was started unnamed and named later (`leasehold name`), or re-named after a transfer.
//   - the shm check fails          -> no write (node-local staleness: the lease is not ours)
//   - the resource answers "stale" -> the token is superseded: stop for good (exit 3)
// Its first act once it has an epoch is to present its token to the resource, so older
// tokens are fenced from then on even before its first write (lease/fence.hpp).
// Whenever it is not writing it says why, on stdout: no lease yet, the shm check failed, the
// resource refused, or a write is slow - a write that takes longer than --slow-ms is reported
// while it is still in progress (a watchdog thread) and again when it ends, with where the time
// went (waiting for another writer's lock, a WAL checkpoint, the transaction itself).
// Env (set by the supervisor): LEASEHOLD_SHM, LEASEHOLD_SLOT, LEASEHOLD_SANDBOX.
// Output: one line per event on stdout ("agent ... epoch=E accepted=N").
#include "tools/cmd_common.hpp"

#include "leasehold/resource/fenced_store.hpp"
#include "leasehold/shm/table.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

namespace leasehold::cli {
namespace {

/// SIGTERM (a release or kill with a grace period): finish the write in progress, then exit.
volatile std::sig_atomic_t g_agent_terminated = 0;
extern "C" void on_agent_sigterm(int) { g_agent_terminated = 1; }

/// The exit code of an agent whose token the resource rejected as stale.
constexpr int kAgentFencedOut = 3;
constexpr std::uint64_t kAgentIntervalMsMax = 10'000;
constexpr std::uint64_t kAgentSlowMsDefault = 100;

struct AgentArgs {
  std::string db;
  std::string name;
  std::uint64_t interval_ms = 5;
  std::uint64_t max_seconds = 300;
  std::uint64_t slow_ms = kAgentSlowMsDefault;
  int checkpoint_pages = resource::kWalCheckpointPagesDefault;
  bool durable = false;
  std::vector<std::string> public_keys;  ///< lockd's token public keys: the store verifies tokens
};

/// Reports a write that is still in progress after `slow_ms` (once per write), from its own
/// thread, so a stalled agent says so while it is stalled.
class SlowWriteWatch {
 public:
  SlowWriteWatch(std::uint64_t slow_ms, std::string name)
      : slow_ns_(static_cast<std::int64_t>(slow_ms) * 1'000'000), name_(std::move(name)), thread_([this] { loop(); }) {}
  ~SlowWriteWatch() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  SlowWriteWatch(const SlowWriteWatch&) = delete;
  SlowWriteWatch& operator=(const SlowWriteWatch&) = delete;
  void begin(Epoch epoch, std::uint64_t seq) {
    std::lock_guard<std::mutex> lk(mu_);
    epoch_ = epoch;
    seq_ = seq;
    since_ns_ = boottime_ns();
    reported_ = false;
    cv_.notify_all();
  }
  /// True if the watchdog reported this write as stalled.
  bool end() {
    std::lock_guard<std::mutex> lk(mu_);
    since_ns_ = 0;
    return reported_;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      if (since_ns_ == 0 || reported_) {
        cv_.wait(lk);
        continue;
      }
      const std::int64_t due = since_ns_ + slow_ns_;
      const std::int64_t now = boottime_ns();
      if (now < due) {
        cv_.wait_for(lk, std::chrono::nanoseconds(due - now));
        continue;
      }
      reported_ = true;
      std::printf("agent name=%s epoch=%llu: write seq=%llu still in progress after %lld ms (no writes meanwhile)\n",
                  name_.c_str(), static_cast<unsigned long long>(epoch_), static_cast<unsigned long long>(seq_),
                  static_cast<long long>((now - since_ns_) / 1'000'000));
      std::fflush(stdout);
    }
  }
  const std::int64_t slow_ns_;
  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool reported_ = false;
  Epoch epoch_ = 0;
  std::uint64_t seq_ = 0;
  std::int64_t since_ns_ = 0;  // 0: no write in progress
  std::thread thread_;         // last: starts after the fields above exist
};

double ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

/// This thread's scheduler accounting (/proc/thread-self/schedstat): time on a CPU and time
/// runnable but waiting for one, ns. Zeros where the kernel does not provide it.
struct SchedTimes {
  std::int64_t run_ns = 0;
  std::int64_t wait_ns = 0;
};
class SchedClock {
 public:
  SchedClock() : fd_(::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC)) {}
  ~SchedClock() {
    if (fd_ >= 0) ::close(fd_);
  }
  SchedClock(const SchedClock&) = delete;
  SchedClock& operator=(const SchedClock&) = delete;
  SchedTimes now() const {
    SchedTimes t;
    char buf[128];
    const ssize_t n = fd_ >= 0 ? ::pread(fd_, buf, sizeof buf - 1, 0) : -1;
    if (n <= 0) return t;
    buf[n] = '\0';
    unsigned long long run = 0, wait = 0;
    if (std::sscanf(buf, "%llu %llu", &run, &wait) == 2) {
      t.run_ns = static_cast<std::int64_t>(run);
      t.wait_ns = static_cast<std::int64_t>(wait);
    }
    return t;
  }

 private:
  int fd_;
};

int run_agent(const AgentArgs& a) {
  const char* shm_env = std::getenv("LEASEHOLD_SHM");
  const char* slot_env = std::getenv("LEASEHOLD_SLOT");
  const char* sandbox_env = std::getenv("LEASEHOLD_SANDBOX");
  if (shm_env == nullptr || slot_env == nullptr || sandbox_env == nullptr) {
    std::fprintf(stderr, "leasehold agent: LEASEHOLD_SHM, LEASEHOLD_SLOT and LEASEHOLD_SANDBOX must be set "
                         "(run it through `leasehold run`)\n");
    return kUsage;
  }
  const auto sandbox = SandboxId::parse(sandbox_env);
  const std::uint32_t slot = static_cast<std::uint32_t>(std::strtoul(slot_env, nullptr, 10));
  if (!sandbox) {
    std::fprintf(stderr, "leasehold agent: malformed LEASEHOLD_SANDBOX \"%s\"\n", sandbox_env);
    return kUsage;
  }
  std::optional<shm::TableReader> table;
  try {
    shm::OpenOptions oo;
    oo.wait_ns = 2'000'000'000;
    table.emplace(shm::TableReader::open(shm_env, oo));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leasehold agent: %s\n", e.what());
    return kTableError;
  }
  resource::StoreOptions so;
  so.durable = a.durable;
  so.checkpoint_pages = a.checkpoint_pages;
  if (!a.public_keys.empty()) {
    so.verifier = std::make_shared<token::TokenVerifier>();
    for (const std::string& k : a.public_keys) {
      if (const Status why = so.verifier->add_public_key_file(k); !why.ok()) {
        std::fprintf(stderr, "leasehold agent: %s\n", why.message().c_str());
        return kUsage;
      }
    }
  }
  auto opened = resource::FencedStore::open(a.db, so);
  if (!opened) {
    std::fprintf(stderr, "leasehold agent: %s\n", opened.message().c_str());
    return kUsage;
  }
  const auto store = std::move(opened).value();
  const NameId name_id = name_id_of(a.name);
  std::printf("agent pid=%d sandbox=%s slot=%u name=%s started\n", ::getpid(), sandbox->str().c_str(), slot,
              a.name.c_str());
  std::fflush(stdout);

  Epoch epoch = 0;
  std::vector<std::uint8_t> signed_token;  // of the grant at `epoch`
  std::uint64_t accepted = 0, skipped = 0, seq = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(a.max_seconds);
  bool was_valid = false;
  bool said_waiting = false;
  const std::int64_t slow_ns = static_cast<std::int64_t>(a.slow_ms) * 1'000'000;
  SlowWriteWatch watch(a.slow_ms, a.name);
  const SchedClock sched;
  std::int64_t last_write_end_ns = 0;  // 0: no write yet at this epoch
  SchedTimes last_write_sched;
  // As the init of its pid namespace it would ignore SIGTERM without a handler, and be killed
  // mid-write at the end of the grace period.
  struct sigaction term{};
  term.sa_handler = on_agent_sigterm;
  sigemptyset(&term.sa_mask);
  ::sigaction(SIGTERM, &term, nullptr);
  while (std::chrono::steady_clock::now() < end && g_agent_terminated == 0) {
    shm::SlotSnapshot snap;
    if (table->snapshot(slot, snap) == shm::TableErrc::ok && snap.sandbox == *sandbox &&
        snap.state == shm::SlotState::published && !snap.revoked && snap.name == name_id && snap.epoch != epoch &&
        snap.epoch != 0) {
      epoch = snap.epoch;
      last_write_end_ns = 0;
      // The grant's signed token, from this sandbox's own token channel (LEASEHOLD_TOKENS);
      // every write carries it, so a resource that verifies tokens admits them.
      auto own = shm::own_token({}, epoch);
      signed_token = own.ok() ? std::move(own).value() : std::vector<std::uint8_t>{};
      const auto p = store->present({a.name, epoch, *sandbox, signed_token},
                                    "holder " + sandbox->str() + " presents its token");
      std::printf("agent name=%s epoch=%llu: lease published; %s token presented to the resource (%s)\n",
                  a.name.c_str(), static_cast<unsigned long long>(epoch),
                  signed_token.empty() ? "unsigned" : ("signed (" + std::to_string(signed_token.size()) + " bytes)").c_str(),
                  p.accepted() ? (store->verifies_tokens() ? "signature verified, fence ok" : "fence ok") : p.reason.c_str());
      std::fflush(stdout);
    }
    // The check before every side effect: epoch, valid_until, writer liveness.
    const bool valid = epoch != 0 && table->check_deadline(slot, epoch);
    if (!valid) {
      if (epoch == 0 && !said_waiting) {
        std::printf("agent name=%s: no lease in slot %u yet; not writing until it is published\n", a.name.c_str(), slot);
        std::fflush(stdout);
        said_waiting = true;
      }
      if (was_valid) {
        std::printf("agent epoch=%llu: shm check failed; no more writes (accepted=%llu)\n",
                    static_cast<unsigned long long>(epoch), static_cast<unsigned long long>(accepted));
        std::fflush(stdout);
      }
      was_valid = false;
      ++skipped;
    } else {
      was_valid = true;
      ++seq;
      const std::string payload = "seq=" + std::to_string(seq) + " pid=" + std::to_string(::getpid());
      // A long gap since the previous write: say where the time went (this thread runnable
      // but not on a CPU, on a CPU, or asleep/blocked - in the sleep between writes or in I/O).
      if (const std::int64_t gap = boottime_ns() - last_write_end_ns; last_write_end_ns != 0 && gap >= slow_ns) {
        const SchedTimes st = sched.now();
        std::printf("agent name=%s epoch=%llu: %.0f ms since the previous write (interval %llu ms): %.0f ms "
                    "runnable waiting for a CPU, %.0f ms on a CPU, the rest asleep or blocked\n",
                    a.name.c_str(), static_cast<unsigned long long>(epoch), ms(gap),
                    static_cast<unsigned long long>(a.interval_ms), ms(st.wait_ns - last_write_sched.wait_ns),
                    ms(st.run_ns - last_write_sched.run_ns));
        std::fflush(stdout);
      }
      watch.begin(epoch, seq);
      const resource::WriteResult r = store->write({a.name, epoch, *sandbox, signed_token}, payload);
      const bool stalled = watch.end();
      last_write_end_ns = boottime_ns();
      last_write_sched = sched.now();
      if (stalled || r.took_ns >= slow_ns) {
        std::printf("agent name=%s epoch=%llu: write seq=%llu %s after %.0f ms: %.0f ms waiting for another "
                    "writer's lock, %.0f ms in a WAL checkpoint, %.0f ms in the transaction\n",
                    a.name.c_str(), static_cast<unsigned long long>(epoch), static_cast<unsigned long long>(seq),
                    std::string(resource::to_string(r.verdict)).c_str(), ms(r.took_ns), ms(r.lock_wait_ns),
                    ms(r.checkpoint_ns), ms(r.took_ns - r.lock_wait_ns - r.checkpoint_ns));
        std::fflush(stdout);
      }
      if (r.accepted()) {
        ++accepted;
      } else if (r.verdict == resource::Verdict::stale) {
        std::printf("agent epoch=%llu: resource rejected the write: %s; token superseded, stopping "
                    "(accepted=%llu)\n",
                    static_cast<unsigned long long>(epoch), r.reason.c_str(),
                    static_cast<unsigned long long>(accepted));
        std::fflush(stdout);
        return kAgentFencedOut;
      } else {
        std::printf("agent epoch=%llu: write %s: %s\n", static_cast<unsigned long long>(epoch),
                    std::string(resource::to_string(r.verdict)).c_str(), r.reason.c_str());
        std::fflush(stdout);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(a.interval_ms));
  }
  if (g_agent_terminated != 0) {
    std::printf("agent: SIGTERM (accepted=%llu, skipped=%llu); exiting\n", static_cast<unsigned long long>(accepted),
                static_cast<unsigned long long>(skipped));
    return kOk;
  }
  std::printf("agent: ran for %llu s (accepted=%llu, skipped=%llu); exiting\n",
              static_cast<unsigned long long>(a.max_seconds), static_cast<unsigned long long>(accepted),
              static_cast<unsigned long long>(skipped));
  return kOk;
}

const Command kAgent([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<AgentArgs>();
  auto* sub = app.add_subcommand("agent", "The demo's sandboxed workload: fenced writes to a SQLite resource");
  sub->group("");  // hidden from --help: started by `leasehold demo` inside a sandbox
  sub->add_option("--db", a->db, "the fenced store (SQLite file)")->required();
  sub->add_option("--name", a->name, "the name whose token the writes carry")->required();
  sub->add_option("--interval-ms", a->interval_ms, "pause between writes, milliseconds")
      ->check(CLI::Range(std::uint64_t{1}, kAgentIntervalMsMax));
  sub->add_option("--max-seconds", a->max_seconds, "exit after this long (a bound, so it never lingers)")
      ->check(CLI::Range(1, 86'400));
  sub->add_option("--slow-ms", a->slow_ms, "report a write that takes longer than this, milliseconds")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{600'000}));
  sub->add_option("--checkpoint-pages", a->checkpoint_pages,
                  "checkpoint the write-ahead log after a write that leaves it this many pages long; 0: "
                  "never (another connection checkpoints, so writes never pause for it)")
      ->check(CLI::Range(0, 1'000'000));
  sub->add_flag("--durable", a->durable, "fsync every write (synchronous=FULL)");
  sub->add_option("--public-key", a->public_keys,
                  "lockd's token public key file (PEM, as leasehold-lockd writes STORE.signing.key.pub); the "
                  "store then admits only writes whose signed token verifies; repeatable (rotation)");
  sub->callback([a, exit_code] {
    Failure f;
    if (!check_new_name(a->name, f)) {
      *exit_code = report("agent", f);
      return;
    }
    *exit_code = run_agent(*a);
  });
});

}  // namespace
}  // namespace leasehold::cli
