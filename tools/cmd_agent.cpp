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
// Env (set by the supervisor): LEASEHOLD_SHM, LEASEHOLD_SLOT, LEASEHOLD_SANDBOX.
// Output: one line per event on stdout ("agent ... epoch=E accepted=N").
#include "tools/cmd_common.hpp"

#include "resource/fenced_store.hpp"
#include "shm/table.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

namespace leasehold::cli {
namespace {

/// The exit code of an agent whose token the resource rejected as stale.
constexpr int kAgentFencedOut = 3;
constexpr std::uint64_t kAgentIntervalMsMax = 10'000;

struct AgentArgs {
  std::string db;
  std::string name;
  std::uint64_t interval_ms = 5;
  std::uint64_t max_seconds = 300;
  bool durable = false;
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
  std::string err;
  resource::StoreOptions so;
  so.durable = a.durable;
  auto store = resource::FencedStore::open(a.db, err, so);
  if (!store) {
    std::fprintf(stderr, "leasehold agent: %s\n", err.c_str());
    return kUsage;
  }
  const NameId name_id = name_id_of(a.name);
  std::printf("agent pid=%d sandbox=%s slot=%u name=%s started\n", ::getpid(), sandbox->str().c_str(), slot,
              a.name.c_str());
  std::fflush(stdout);

  Epoch epoch = 0;
  std::uint64_t accepted = 0, skipped = 0, seq = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(a.max_seconds);
  bool was_valid = false;
  while (std::chrono::steady_clock::now() < end) {
    shm::SlotSnapshot snap;
    if (table->snapshot(slot, snap) == shm::TableErrc::ok && snap.sandbox == *sandbox &&
        snap.state == shm::SlotState::published && !snap.revoked && snap.name == name_id && snap.epoch != epoch &&
        snap.epoch != 0) {
      epoch = snap.epoch;
      const auto p = store->advance_fence(a.name, epoch, "holder " + sandbox->str() + " presents its token");
      std::printf("agent name=%s epoch=%llu: lease published; token presented to the resource (%s)\n",
                  a.name.c_str(), static_cast<unsigned long long>(epoch),
                  p.accepted() ? "fence ok" : p.reason.c_str());
      std::fflush(stdout);
    }
    // The check before every side effect: epoch, valid_until, writer liveness.
    const bool valid = epoch != 0 && table->check_deadline(slot, epoch);
    if (!valid) {
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
      const resource::WriteResult r = store->write({a.name, epoch, *sandbox}, payload);
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
  sub->add_flag("--durable", a->durable, "fsync every write (synchronous=FULL)");
  sub->callback([a, exit_code] {
    Failure f;
    if (!check_name(a->name, f)) {
      *exit_code = report("agent", f);
      return;
    }
    *exit_code = run_agent(*a);
  });
});

}  // namespace
}  // namespace leasehold::cli
