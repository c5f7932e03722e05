// Control-plane subcommands that talk to lockd (DESIGN.md "Lock states"):
//   leasehold acquire NAME [--sandbox S]               2-phase: Free -> Acquiring (epoch +1)
//   leasehold commit NAME --sandbox S --epoch E -- CMD  the worker's supervisor commits it with
//                                                      its next heartbeat, then starts CMD
//   leasehold transfer NAME --to SANDBOX               Held -> Transferring (epoch +1 at the
//                                                      start) -> Free{reserved for SANDBOX}
//                                                      once lockd's transfer guard lifts (the
//                                                      old holder's kill confirmed, or its
//                                                      lease + lock-delay over)
//   leasehold revoke NAME [--force] [--wait]           -> Free, epoch +1, no cooperation needed;
//                                                      grantable once the kill is confirmed or
//                                                      the old lease would have expired
// --fence-db PATH (transfer, revoke) announces the new epoch to a FencedStore
// (resource/fenced_store.hpp) before lockd moves it, so the old holder's writes are rejected
// from that moment.
#include "tools/cmd_common.hpp"

#include "leasehold/resource/fenced_store.hpp"
#include "leasehold/supervisor/config.hpp"
#include "leasehold/supervisor/sandbox_phase.hpp"

#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

namespace leasehold::cli {
namespace {

/// Announces `epoch` to the fenced store at `path` (if any); false + failure on error.
bool announce(const std::string& path, const std::string& name, Epoch epoch, const char* why, Failure& f) {
  if (path.empty()) return true;
  auto opened = resource::FencedStore::open(path);
  if (!opened) {
    f = {kUsage, opened.message()};  // the --db given is not a usable store, whatever the cause
    return false;
  }
  const auto store = std::move(opened).value();
  const auto r = store->advance_fence(name, epoch, why);
  if (!r.accepted()) {
    f = {kFailure, "announcing epoch " + std::to_string(epoch) + " to " + path + ": " + r.reason};
    return false;
  }
  return true;
}

struct AcquireArgs {
  LockdFlags lockd;
  std::string name;
  std::string sandbox;
  std::uint32_t ttl_ms = 0;
  bool json = false;
};

const Command kAcquire([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<AcquireArgs>();
  auto* sub = app.add_subcommand(
      "acquire", "2-phase acquire for control planes: reserve NAME for a sandbox (Acquiring, epoch +1); "
                 "the worker then commits it (`leasehold commit`) before its acquiring TTL runs out");
  add_lockd_flags(sub, a->lockd);
  sub->add_option("name", a->name, "the name")->required();
  sub->add_option("--sandbox", a->sandbox, "the sandbox id to reserve it for (default: a new random id)");
  sub->add_option("--ttl-ms", a->ttl_ms, "lease TTL to ask for at commit, milliseconds (0: lockd's default)");
  sub->add_flag("--json", a->json, "print the grant as JSON");
  sub->callback([a, exit_code] {
    Failure f;
    if (!check_new_name(a->name, f)) {
      *exit_code = report("acquire", f);
      return;
    }
    SandboxId sb;
    if (a->sandbox.empty()) {
      sb = random_sandbox_id();
    } else if (auto p = parse_sandbox(a->sandbox, f)) {
      sb = *p;
    } else {
      *exit_code = report("acquire", f);
      return;
    }
    auto client = connect_lockd(a->lockd, f);
    if (!client) {
      *exit_code = report("acquire", f);
      return;
    }
    const lockd::Answer ans = client->acquire(a->name, sb, WorkerId{}, a->ttl_ms, /*two_phase=*/true);
    const auto* g = answer_body<wire::Grant>(ans, "acquire", a->name, a->lockd, f);
    if (g == nullptr) {
      *exit_code = report("acquire", f);
      return;
    }
    if (a->json) {
      std::printf("%s\n", nlohmann::json{{"name", a->name},
                                         {"sandbox", sb.str()},
                                         {"epoch", g->epoch},
                                         {"state", std::string(leasehold::to_string(g->state))},
                                         {"ttl_left_ms", g->ttl_ms}}
                              .dump()
                              .c_str());
    } else {
      std::printf("\"%s\" is %s for sandbox %s at epoch %llu; commit within %u ms:\n"
                  "  leasehold commit %s --sandbox %s --epoch %llu -- COMMAND...   (on the worker)\n",
                  a->name.c_str(), std::string(leasehold::to_string(g->state)).c_str(), sb.str().c_str(),
                  static_cast<unsigned long long>(g->epoch), g->ttl_ms, a->name.c_str(), sb.str().c_str(),
                  static_cast<unsigned long long>(g->epoch));
    }
    *exit_code = kOk;
  });
});

struct CommitArgs {
  SupervisorFlags sup;
  LockdFlags lockd;
  std::string name;
  std::string sandbox;
  Epoch epoch = 0;
  std::string worker;
  std::vector<std::string> argv;
  bool json = false;
};

const Command kCommit([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<CommitArgs>();
  auto* sub = app.add_subcommand(
      "commit", "Second phase: the local supervisor commits a name acquired with `leasehold acquire` "
                "(through its next heartbeat, carrying its worker id) and starts the command only once "
                "lockd granted it. With --worker, commit at lockd directly and start nothing.");
  add_supervisor_flags(sub, a->sup);
  sub->add_option("--lockd", a->lockd.lockd, "with --worker: lockd address HOST:PORT, or a replicated lockd's list A,B,C (env LEASEHOLD_LOCKD)");
  sub->add_option("--key-file", a->lockd.key_file, "with --worker: key file (env LEASEHOLD_KEY_FILE)");
  sub->add_option("name", a->name, "the name")->required();
  sub->add_option("--sandbox", a->sandbox, "the sandbox id given to `acquire`")->required();
  sub->add_option("--epoch", a->epoch, "the epoch `acquire` printed")->required();
  sub->add_option("--worker", a->worker, "commit directly at lockd for this worker id (no process)");
  sub->add_flag("--json", a->json, "print the answer as JSON");
  sub->add_option("command", a->argv, "the command to start once committed, after --");
  sub->callback([a, exit_code] {
    Failure f;
    const auto sb = parse_sandbox(a->sandbox, f);
    if (!sb || !check_new_name(a->name, f)) {
      *exit_code = report("commit", f);
      return;
    }
    if (a->epoch == 0) {
      *exit_code = report("commit", {kUsage, "--epoch 0: no acquire hands out epoch 0"});
      return;
    }
    if (!a->worker.empty()) {
      const auto w = WorkerId::parse(a->worker);
      if (!w || w->is_nil()) {
        *exit_code = report("commit", {kUsage, "malformed worker id \"" + a->worker + "\": expected a UUID"});
        return;
      }
      auto client = connect_lockd(a->lockd, f);
      if (!client) {
        *exit_code = report("commit", f);
        return;
      }
      const lockd::Answer ans = client->commit(name_id_of(a->name), *sb, a->epoch, *w);
      const auto* g = answer_body<wire::Grant>(ans, "commit", a->name, a->lockd, f);
      if (g == nullptr) {
        *exit_code = report("commit", f);
        return;
      }
      if (a->json)
        std::printf("%s\n", nlohmann::json{{"name", a->name}, {"sandbox", sb->str()}, {"epoch", g->epoch},
                                           {"worker", w->str()}, {"state", std::string(leasehold::to_string(g->state))},
                                           {"ttl_left_ms", g->ttl_ms}}
                                .dump()
                                .c_str());
      else
        std::printf("\"%s\" held by %s at epoch %llu on worker %s (lease %u ms)\n", a->name.c_str(),
                    sb->str().c_str(), static_cast<unsigned long long>(g->epoch), w->str().c_str(), g->ttl_ms);
      *exit_code = kOk;
      return;
    }
    if (a->argv.empty()) {
      *exit_code = report("commit", {kUsage, "a command to start is required after -- (or --worker to "
                                             "commit at lockd without starting anything)"});
      return;
    }
    nlohmann::json env = nlohmann::json::object();
    if (const char* path = std::getenv("PATH")) env["PATH"] = path;
    auto ans = supervisor_call(a->sup,
                               {{"v", 1}, {"op", "expect-commit"}, {"name", a->name}, {"sandbox", sb->str()},
                                {"epoch", a->epoch}, {"argv", a->argv}, {"env", env}},
                               f);
    if (!ans) {
      *exit_code = report("commit", f);
      return;
    }
    if (!ans->value("ok", false)) {
      *exit_code = report("commit", supervisor_failure(*ans, "commit \"" + a->name + "\""));
      return;
    }
    if (a->json) std::printf("%s\n", output_json(*ans).dump().c_str());
    else
      std::printf("committed \"%s\" at epoch %llu: sandbox %s started (pid %d)\n", a->name.c_str(),
                  static_cast<unsigned long long>(ans->value("epoch", 0ull)),
                  ans->value("sandbox", std::string("?")).c_str(), ans->value("pid", -1));
    *exit_code = kOk;
  });
});

/// Poll interval of `transfer` while lockd's transfer guard is pending.
constexpr std::int64_t kTransferWaitPollNs = 20'000'000;

struct TransferArgs {
  LockdFlags lockd;
  std::string name;
  std::string to;
  std::string fence_db;
  std::string from_supervisor;
  std::string to_supervisor;
  std::string to_worker;
  std::int64_t wait_ms = -1;
  bool no_complete = false;
  bool json = false;
};

const Command kTransfer([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<TransferArgs>();
  auto* sub = app.add_subcommand(
      "transfer",
      "Graceful transfer: begin (epoch +1 at the start; lockd pushes the revocation to the holder's "
      "supervisor, which kills it and confirms), wait until lockd lets the transfer complete (the kill "
      "confirmed, or the old lease + lock-delay over), complete (Free, reserved for --to); nobody may "
      "write or be granted the name in between. Run again on a name left transferring to complete it");
  add_lockd_flags(sub, a->lockd);
  sub->add_option("name", a->name, "the name")->required();
  sub->add_option("--to", a->to, "the sandbox id that receives the name")->required();
  sub->add_option("--fence-db", a->fence_db,
                  "a fenced store (SQLite) to announce the new epoch to before the transfer begins");
  sub->add_option("--from-supervisor", a->from_supervisor,
                  "the old holder's supervisor socket, checked before anything moves: it must be the "
                  "supervisor of the holder's worker (lockd, not this check, decides when the old holder "
                  "is gone)");
  sub->add_option("--to-supervisor", a->to_supervisor,
                  "the new holder's supervisor socket: name the --to sandbox there once complete");
  sub->add_option("--to-worker", a->to_worker,
                  "the worker id (UUID) the --to sandbox runs on: only it may take the reservation "
                  "(default: --to-supervisor's worker; one of the two is needed)");
  sub->add_option("--wait-ms", a->wait_ms,
                  "longest wait for lockd to let the transfer complete (default: the guard's bound, the old "
                  "lease's time left + lock-delay, + 1 s); past it the name stays transferring");
  sub->add_flag("--no-complete", a->no_complete, "only begin; leave the name Transferring");
  sub->add_flag("--json", a->json, "print the outcome as JSON");
  sub->callback([a, exit_code] {
    Failure f;
    const auto to = parse_sandbox(a->to, f);
    if (!to || !check_name(a->name, f)) {
      *exit_code = report("transfer", f);
      return;
    }
    auto client = connect_lockd(a->lockd, f);
    if (!client) {
      *exit_code = report("transfer", f);
      return;
    }
    const std::string what = "transfer \"" + a->name + "\"";
    const lockd::Answer shown = client->show(a->name);
    if (const auto* d = shown.as<wire::Deny>()) {
      *exit_code = report("transfer", deny_failure(*d, a->name));
      return;
    }
    const auto* info = shown.as<wire::NameInfo>();
    if (info == nullptr) {
      *exit_code = report("transfer", answer_failure(shown, a->lockd, what));
      return;
    }
    const wire::NameRecord rec = info->record;
    // A name left transferring to this sandbox (a wait that ran out, --no-complete): complete it.
    const bool resume = rec.state == LockPhase::transferring && rec.reserved_for == *to;
    if (rec.state != LockPhase::held && !resume) {
      *exit_code = report("transfer", {kRefused, what + ": it is " + std::string(leasehold::to_string(rec.state)) +
                                                     " at epoch " + std::to_string(rec.epoch) +
                                                     (rec.state == LockPhase::transferring
                                                          ? " to " + rec.reserved_for.str() + ", not to " + to->str()
                                                          : std::string()) +
                                                     ", not held; only a held name can be transferred"});
      return;
    }
    if (!resume && *to == rec.holder) {
      *exit_code = report("transfer", {kRefused, what + ": " + to->str() + " already holds it (epoch " +
                                                     std::to_string(rec.epoch) + "); nothing to transfer"});
      return;
    }
    if (!a->from_supervisor.empty() && !rec.worker.is_nil()) {
      // Only a check of the operator's intent: lockd's guard decides when the old holder is gone.
      const auto reported = supervisor_worker(a->from_supervisor, f);
      if (!reported) {
        *exit_code = report("transfer", f);
        return;
      }
      const std::string& worker = *reported;
      if (worker != rec.worker.str()) {
        *exit_code = report("transfer", {kRefused, what + ": --from-supervisor " + a->from_supervisor +
                                                       " is the supervisor of worker " + (worker.empty() ? "?" : worker) +
                                                       ", but the holder " + rec.holder.str() + " runs on worker " +
                                                       rec.worker.str() + "; give that worker's supervisor socket "
                                                       "(nothing was changed)"});
        return;
      }
    }
    // The reservation the transfer leaves is for (--to, its worker): another worker naming the
    // sandbox is refused. The worker comes from --to-supervisor, or --to-worker.
    std::optional<WorkerId> to_worker;
    if (!a->to_worker.empty()) {
      to_worker = WorkerId::parse(a->to_worker);
      if (!to_worker || to_worker->is_nil()) {
        *exit_code = report("transfer", {kUsage, "--to-worker \"" + a->to_worker + "\" is not a worker id (a UUID)"});
        return;
      }
    }
    if (!a->to_supervisor.empty()) {
      const auto reported = supervisor_worker(a->to_supervisor, f);
      if (!reported) {
        *exit_code = report("transfer", f);
        return;
      }
      const auto theirs = WorkerId::parse(*reported);
      if (!theirs) {
        *exit_code = report("transfer", {kFailure, what + ": " + a->to_supervisor + " did not say its worker id"});
        return;
      }
      if (to_worker && *to_worker != *theirs) {
        *exit_code = report("transfer", {kUsage, what + ": --to-worker " + to_worker->str() + " is not " +
                                                     a->to_supervisor + "'s worker (" + theirs->str() + ")"});
        return;
      }
      to_worker = theirs;
    }
    if (!to_worker && !resume) {  // (a resumed transfer's reservation was set at its begin)
      *exit_code = report("transfer", {kUsage, what + ": which worker runs " + to->str() +
                                                   "? give --to-supervisor SOCKET or --to-worker UUID (only "
                                                   "that worker may take the name)"});
      return;
    }
    if (!a->to_supervisor.empty()) {
      // Check the receiver before anything moves: a transfer to a sandbox that is not there
      // would stop the holder and leave the name reserved for nobody.
      SupervisorFlags sf;
      sf.socket = a->to_supervisor;
      auto list = supervisor_call(sf, {{"v", 1}, {"op", "list"}}, f);
      if (!list) {
        *exit_code = report("transfer", f);
        return;
      }
      bool ready = false;
      const std::string_view running = phase_row(SandboxPhase::running).list_state;  // the list's word
      for (const auto& sb : list->value("sandboxes", nlohmann::json::array()))
        ready = ready || (sb.value("sandbox", std::string()) == to->str() && sb.value("state", std::string()) == running &&
                          (!sb.contains("name") || sb["name"].is_null()));
      if (!ready) {
        *exit_code = report("transfer", {kNotFound, what + ": no running unnamed sandbox " + to->str() + " on " +
                                                        a->to_supervisor + "; start it there first (nothing was changed)"});
        return;
      }
    }
    const SandboxId from = rec.holder;
    const Epoch old_epoch = resume ? rec.epoch - 1 : rec.epoch;
    Epoch new_epoch = rec.epoch;
    if (resume) {
      // The fence was raised when the transfer began; raising it again is harmless.
      if (!announce(a->fence_db, a->name, new_epoch, "transfer", f)) {
        *exit_code = report("transfer", f);
        return;
      }
      if (!a->json)
        std::printf("resuming: \"%s\" is transferring from %s (epoch %llu) to %s at epoch %llu\n", a->name.c_str(),
                    from.str().c_str(), static_cast<unsigned long long>(old_epoch), to->str().c_str(),
                    static_cast<unsigned long long>(new_epoch));
    } else {
      // Fence first: the resource rejects the old epoch before lockd moves it, so no write of
      // the old holder can land while the name is in transfer (epochs grow by exactly 1 at
      // begin; if lockd allocated more, the fence is raised again below).
      if (!announce(a->fence_db, a->name, rec.epoch + 1, "transfer begin", f)) {
        *exit_code = report("transfer", f);
        return;
      }
      const lockd::Answer begun = client->transfer_begin(rec.name_id, rec.holder, rec.epoch, *to, *to_worker);
      if (const auto* d = begun.as<wire::Deny>()) {
        *exit_code = report("transfer", deny_failure(*d, a->name));
        return;
      }
      const auto* ts = begun.as<wire::TransferState>();
      if (ts == nullptr) {
        *exit_code = report("transfer", answer_failure(begun, a->lockd, what));
        return;
      }
      new_epoch = ts->new_epoch;
      if (new_epoch != rec.epoch + 1 && !announce(a->fence_db, a->name, new_epoch, "transfer begin", f)) {
        *exit_code = report("transfer", f);
        return;
      }
      if (!a->json)
        std::printf("begun: \"%s\" transferring from %s (epoch %llu) to %s at epoch %llu\n", a->name.c_str(),
                    from.str().c_str(), static_cast<unsigned long long>(old_epoch), to->str().c_str(),
                    static_cast<unsigned long long>(new_epoch));
    }
    nlohmann::json out = {{"name", a->name},           {"from", from.str()},
                          {"to", to->str()},           {"old_epoch", old_epoch},
                          {"new_epoch", new_epoch},    {"state", std::string(to_string(LockPhase::transferring))}};
    if (a->no_complete) {
      if (a->json) std::printf("%s\n", out.dump().c_str());
      *exit_code = kOk;
      return;
    }
    // lockd's transfer guard: the complete is refused (lock_delay) until the old holder's
    // worker confirmed its kill (lockd pushed the revocation to it at begin) or the old lease
    // + lock-delay would have ended. Poll it; the guard, not this wait, is the defence.
    auto guard = [&]() -> std::optional<wire::NameRecord> {
      const lockd::Answer now = client->show(rec.name_id);
      const auto* ni = now.as<wire::NameInfo>();
      if (ni == nullptr) return std::nullopt;
      return ni->record;
    };
    const std::optional<wire::NameRecord> g0 = guard();
    const bool pending = g0 && g0->state == LockPhase::transferring && g0->revoke_pending;
    const std::int64_t wait_ms =
        a->wait_ms >= 0 ? a->wait_ms : (pending ? static_cast<std::int64_t>(g0->ttl_left_ms) : 0) + 1000;
    if (pending && !a->json)
      std::printf("waiting for worker %s to confirm the old holder's kill (at most %u ms: the old lease + lock-delay)\n",
                  id_text(g0->worker).c_str(), g0->ttl_left_ms);
    const std::int64_t start = boottime_ns();
    const std::int64_t until = start + wait_ms * 1'000'000;
    lockd::Answer done;
    for (;;) {
      done = client->transfer_complete(rec.name_id, new_epoch);
      const auto* d = done.as<wire::Deny>();
      if (d == nullptr || d->refusal != Refusal::lock_delay) break;
      if (boottime_ns() >= until) {
        const std::optional<wire::NameRecord> g = guard();
        out["waited_ms"] = (boottime_ns() - start) / 1'000'000;
        out["ended_by"] = nullptr;
        *exit_code = report(
            "transfer",
            {kFailure, what + ": not completed after " + std::to_string(wait_ms) +
                           " ms: refused lock_delay, the old holder " + from.str() + " may still run (worker " +
                           (g ? id_text(g->worker) : std::string("?")) + " has not confirmed its kill; its lease + "
                           "lock-delay end in " + (g ? std::to_string(g->ttl_left_ms) : std::string("?")) +
                           " ms). The name stays transferring (nobody can be granted it); run the same command "
                           "again to complete it",
             out});
        return;
      }
      std::this_thread::sleep_for(std::chrono::nanoseconds(kTransferWaitPollNs));
    }
    if (const auto* d = done.as<wire::Deny>()) {
      *exit_code = report("transfer", deny_failure(*d, a->name));
      return;
    }
    if (done.as<wire::TransferState>() == nullptr) {
      *exit_code = report("transfer", answer_failure(done, a->lockd, what + " (complete)"));
      return;
    }
    const std::int64_t waited_ms = (boottime_ns() - start) / 1'000'000;
    const std::optional<wire::NameRecord> after = guard();
    const wire::RevokeEnd ended =
        after && after->epoch == new_epoch ? after->revoke_ended : wire::RevokeEnd::none;
    out["waited_ms"] = waited_ms;
    out["ended_by"] = ended == wire::RevokeEnd::kill_confirmed ? nlohmann::json("kill_confirmed")
                      : ended == wire::RevokeEnd::lease_expired ? nlohmann::json("lease_expired")
                                                                : nlohmann::json(nullptr);
    if (!a->json && ended != wire::RevokeEnd::none)
      std::printf("old holder gone after %lld ms: %s\n", static_cast<long long>(waited_ms),
                  ended == wire::RevokeEnd::kill_confirmed ? "kill confirmed by its worker"
                                                           : "its lease + lock-delay ended");
    out["state"] = "free_reserved";
    if (!a->json)
      std::printf("complete: \"%s\" is free at epoch %llu, reserved for %s\n", a->name.c_str(),
                  static_cast<unsigned long long>(new_epoch), to->str().c_str());
    if (!a->to_supervisor.empty()) {
      SupervisorFlags sf;
      sf.socket = a->to_supervisor;
      auto named = supervisor_call(sf, {{"v", 1}, {"op", "name"}, {"sandbox", to->str()}, {"name", a->name}}, f);
      if (!named) {
        *exit_code = report("transfer", f);
        return;
      }
      if (!named->value("ok", false)) {
        *exit_code = report("transfer", supervisor_failure(*named, what + " (accept)"));
        return;
      }
      out["state"] = std::string(to_string(LockPhase::held));
      if (!a->json)
        std::printf("accepted: %s holds \"%s\" at epoch %llu\n", to->str().c_str(), a->name.c_str(),
                    static_cast<unsigned long long>(named->value("epoch", 0ull)));
    } else if (!a->json) {
      std::printf("next, on the receiving worker:  leasehold name %s %s\n", to->str().c_str(), a->name.c_str());
    }
    if (a->json) std::printf("%s\n", out.dump().c_str());
    *exit_code = kOk;
  });
});

struct RevokeArgs {
  LockdFlags lockd;
  std::string name;
  std::string fence_db;
  bool force = false;
  bool wait = false;
  bool json = false;
};

/// Revokes attempted before giving up when a grant keeps moving the epoch under the revoke.
constexpr int kRevokeAttemptsMax = 5;
/// Poll interval of `revoke --wait`.
constexpr std::int64_t kRevokeWaitPollNs = 20'000'000;

const Command kRevoke([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<RevokeArgs>();
  auto* sub = app.add_subcommand(
      "revoke", "Coordinator revoke: the name becomes free at epoch +1 without the holder's cooperation "
                "(the old token is fenced out at once), but is not grantable until the old holder's "
                "supervisor confirms the kill or the old lease would have expired (lock-delay); lockd "
                "pushes the revocation to that supervisor at once");
  add_lockd_flags(sub, a->lockd);
  sub->add_option("name", a->name, "the name")->required();
  sub->add_option("--fence-db", a->fence_db,
                  "a fenced store (SQLite) to announce the new epoch to before the revoke");
  sub->add_flag("--force", a->force, "also revoke a free name (burns an epoch); otherwise \"not held\", exit 4");
  sub->add_flag("--wait", a->wait,
                "return once the name is grantable again, saying whether the kill was confirmed or the "
                "old lease expired (--timeout-ms, if given, bounds the whole wait; default: the "
                "revoke's bound + 1 s)");
  sub->add_flag("--json", a->json, "print the outcome as JSON");
  sub->callback([a, exit_code, sub] {
    Failure f;
    if (!check_name(a->name, f)) {
      *exit_code = report("revoke", f);
      return;
    }
    auto client = connect_lockd(a->lockd, f);
    if (!client) {
      *exit_code = report("revoke", f);
      return;
    }
    const std::string what = "revoke \"" + a->name + "\"";
    const NameId id = name_id_of(a->name);
    // The epoch a revoke produces is known before it is applied: lockd revokes only at the
    // epoch we read (expected_epoch), and a revoke adds exactly 1. So the resource is told the
    // new epoch first, as `transfer` does; if a grant moved the epoch meanwhile, read again.
    const wire::Ok* ok = nullptr;
    lockd::Answer ans;
    Epoch old_epoch = 0;
    std::string old_state;
    for (int attempt = 0; attempt < kRevokeAttemptsMax && ok == nullptr; ++attempt) {
      const lockd::Answer shown = client->show(id);
      if (const auto* d = shown.as<wire::Deny>()) {
        *exit_code = report("revoke", deny_failure(*d, a->name));
        return;
      }
      const auto* info = shown.as<wire::NameInfo>();
      if (info == nullptr) {
        *exit_code = report("revoke", answer_failure(shown, a->lockd, what));
        return;
      }
      const wire::NameRecord& rec = info->record;
      if (rec.state == LockPhase::free && !a->force) {
        *exit_code = report("revoke", {kNotFound, what + ": not held (free at epoch " + std::to_string(rec.epoch) +
                                                      "); nothing was changed. --force burns an epoch anyway"});
        return;
      }
      old_epoch = rec.epoch;
      old_state = std::string(leasehold::to_string(rec.state));
      if (!announce(a->fence_db, a->name, rec.epoch + 1, "revoke", f)) {
        *exit_code = report("revoke", f);
        return;
      }
      ans = client->revoke(id, rec.epoch, a->force);
      if (const auto* d = ans.as<wire::Deny>()) {
        if (d->refusal == Refusal::stale_epoch) continue;  // a grant moved it: read again
        if (d->refusal == Refusal::not_held) {
          *exit_code = report("revoke", {kNotFound, what + ": not held (free at epoch " + std::to_string(d->epoch) +
                                                        "); nothing was changed. --force burns an epoch anyway"});
          return;
        }
        *exit_code = report("revoke", deny_failure(*d, a->name));
        return;
      }
      ok = ans.as<wire::Ok>();
      if (ok == nullptr) {
        *exit_code = report("revoke", answer_failure(ans, a->lockd, what));
        return;
      }
    }
    if (ok == nullptr) {
      *exit_code = report("revoke", {kRefused, what + ": the epoch moved under " + std::to_string(kRevokeAttemptsMax) +
                                                   " attempts (grants racing the revoke); nothing was revoked"});
      return;
    }
    const Epoch epoch = ok->epoch;
    nlohmann::json out = {{"name", a->name}, {"old_epoch", old_epoch}, {"old_state", old_state}, {"epoch", epoch}};
    // What lockd says now: a pending revoke and its bound.
    wire::NameRecord rec;
    if (const lockd::Answer now = client->show(id); const auto* info = now.as<wire::NameInfo>()) rec = info->record;
    const bool pending = rec.epoch == epoch && rec.revoke_pending;
    out["revoke_pending"] = pending;
    out["bound_ms"] = pending ? nlohmann::json(rec.ttl_left_ms) : nlohmann::json(nullptr);
    if (!a->json) {
      std::printf("revoked \"%s\": free at epoch %llu (was %s at epoch %llu)\n", a->name.c_str(),
                  static_cast<unsigned long long>(epoch), old_state.c_str(), static_cast<unsigned long long>(old_epoch));
      if (pending)
        std::printf("not grantable until worker %s confirms the kill, or at most %u ms (the old lease's end)\n",
                    id_text(rec.worker).c_str(), rec.ttl_left_ms);
    }
    if (!a->wait) {
      if (a->json) std::printf("%s\n", out.dump().c_str());
      *exit_code = kOk;
      return;
    }
    const bool timeout_given = sub->get_option("--timeout-ms")->count() > 0;
    const std::int64_t wait_ms = timeout_given ? static_cast<std::int64_t>(a->lockd.timeout_ms)
                                               : (pending ? static_cast<std::int64_t>(rec.ttl_left_ms) : 0) + 1000;
    const std::int64_t start = boottime_ns();
    const std::int64_t until = start + wait_ms * 1'000'000;
    wire::RevokeEnd ended = wire::RevokeEnd::none;
    for (bool first = true; ended == wire::RevokeEnd::none; first = false) {
      const lockd::Answer now = first ? lockd::Answer{} : client->show(id);
      const auto* info = first ? (rec.epoch == epoch ? &rec : nullptr) : nullptr;
      if (!first) {
        const auto* ni = now.as<wire::NameInfo>();
        if (ni == nullptr && now.as<wire::Deny>() == nullptr) {
          *exit_code = report("revoke", answer_failure(now, a->lockd, what + " (wait)"));
          return;
        }
        info = ni != nullptr ? &ni->record : nullptr;
      }
      if (info == nullptr || info->epoch != epoch || !info->revoke_pending) {
        // Unknown (dropped: plain free), or no longer pending: lockd says how it ended (a
        // revoke that was never pending found the old lease already expired).
        ended = info != nullptr && info->revoke_ended != wire::RevokeEnd::none ? info->revoke_ended
                                                                               : wire::RevokeEnd::lease_expired;
        break;
      }
      if (boottime_ns() >= until) {
        out["waited_ms"] = (boottime_ns() - start) / 1'000'000;
        out["ended_by"] = nullptr;
        *exit_code = report("revoke", {kFailure,
                                       what + ": still not grantable after " + std::to_string(wait_ms) +
                                           " ms (the revoke is pending; its bound is " +
                                           std::to_string(info->ttl_left_ms) + " ms away)",
                                       out});
        return;
      }
      std::this_thread::sleep_for(std::chrono::nanoseconds(kRevokeWaitPollNs));
    }
    const std::int64_t waited_ms = (boottime_ns() - start) / 1'000'000;
    const char* how = ended == wire::RevokeEnd::kill_confirmed ? "kill confirmed" : "lease expired";
    out["waited_ms"] = waited_ms;
    out["ended_by"] = ended == wire::RevokeEnd::kill_confirmed ? "kill_confirmed" : "lease_expired";
    if (a->json) std::printf("%s\n", out.dump().c_str());
    else std::printf("grantable again after %lld ms: %s\n", static_cast<long long>(waited_ms), how);
    *exit_code = kOk;
  });
});

}  // namespace
}  // namespace leasehold::cli
