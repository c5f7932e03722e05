// `leasehold watch [NAME | --prefix P]`: ownership changes as they happen, by polling lockd's
// List (or Show, for one NAME) and comparing each listing with the one before (README "watch").
// No wire change: lockd pushes nothing to a watcher, so a change that is undone between two
// polls is not seen (a release and a re-acquire within one interval show as one "acquired" at
// the new epoch).
#include "tools/cmd_common.hpp"

#include <signal.h>
#include <time.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>

namespace leasehold::cli {
namespace {

volatile sig_atomic_t g_stop = 0;
void on_stop_signal(int) { g_stop = 1; }

struct WatchArgs {
  LockdFlags lockd;
  std::string name;
  std::string prefix;
  bool json = false;
  std::uint32_t interval_ms = 200;
  std::uint64_t count = 0;  ///< 0: until interrupted
  std::size_t names_max = 1u << 20;
};

/// CLOCK_REALTIME as RFC 3339 UTC with milliseconds.
std::string wall_time() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  tm t{};
  ::gmtime_r(&ts.tv_sec, &t);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                t.tm_hour, t.tm_min, t.tm_sec, ts.tv_nsec / 1'000'000);
  return buf;
}

std::int64_t monotonic_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

struct Seen {
  wire::NameRecord record;
  std::int64_t at_ms = 0;  ///< CLOCK_MONOTONIC when this listing saw it
};

bool same(const wire::NameRecord& a, const wire::NameRecord& b) {
  return a.state == b.state && a.epoch == b.epoch && a.holder == b.holder && a.worker == b.worker &&
         a.reserved_for == b.reserved_for && a.revoke_pending == b.revoke_pending && a.waiters == b.waiters;
}


/// What happened to a name between two listings: "" for nothing. `before`/`after` null: the name
/// was not in that listing (never acquired, or dropped by lockd once free).
std::string classify(const Seen* before, const wire::NameRecord* after, std::int64_t now_ms) {
  if (before == nullptr && after == nullptr) return "";
  if (before != nullptr && after != nullptr && same(before->record, *after)) return "";
  const wire::NameRecord* b = before != nullptr ? &before->record : nullptr;
  // Only its FIFO of waiters moved (a sandbox joined, left, or lost its place).
  if (b != nullptr && after != nullptr && b->waiters != after->waiters) {
    wire::NameRecord unqueued = *after;
    unqueued.waiters = b->waiters;
    if (same(*b, unqueued)) return "queue";
  }
  // A new holder while sandboxes waited: nothing jumps lockd's FIFO, so it is the first waiter,
  // handed the name at a new epoch (a release, expiry or revoke in between is not seen).
  // (After a revoke the first waiter holds the epoch the revoke announced: >=, not >.)
  if (b != nullptr && after != nullptr && b->waiters > 0 && after->waiters < b->waiters &&
      after->epoch >= b->epoch && after->holder != b->holder &&
      (after->state == LockPhase::acquiring || after->state == LockPhase::held))
    return "handed_over";
  const bool had = b != nullptr && b->state != LockPhase::free;
  if (after == nullptr || after->state == LockPhase::free) {
    // A revoke frees the name at epoch + 1 with the revocation pending (or already ended).
    if (after != nullptr && (after->revoke_pending || after->revoke_ended != wire::RevokeEnd::none) &&
        (b == nullptr || after->epoch > b->epoch || !b->revoke_pending))
      return "revoked";
    if (b != nullptr && b->state == LockPhase::transferring) return "transferred";
    if (!had) return after != nullptr ? "changed" : "";
    // Gone without a revoke: released, or its lease (or commit time) ran out. lockd does not say
    // which; a name whose last-seen time left had passed is reported expired.
    const bool ran_out = before->record.ttl_left_ms != wire::kNoExpiryMs &&
                         static_cast<std::int64_t>(before->record.ttl_left_ms) <= now_ms - before->at_ms;
    return ran_out ? "expired" : "released";
  }
  if (after->state == LockPhase::transferring) return had && b->state == LockPhase::transferring ? "changed" : "transferring";
  if (after->state == LockPhase::acquiring) return "acquiring";
  // held
  if (b != nullptr && b->state == LockPhase::acquiring && b->epoch == after->epoch) return "granted";
  if (b != nullptr && b->state == LockPhase::transferring) return "transferred";
  if (b != nullptr && b->state == LockPhase::held && b->epoch == after->epoch) return "changed";
  return "acquired";
}

class Printer {
 public:
  explicit Printer(bool json) : json_(json) {}
  /// false once stdout is gone (EPIPE): the watch ends.
  bool event(const std::string& kind, const std::string& name, const wire::NameRecord* now, const Seen* before) {
    const std::string t = wall_time();
    if (json_) {
      nlohmann::json j = {{"time", t}, {"event", kind}, {"name", name}};
      if (now != nullptr) {
        const nlohmann::json r = record_json(*now, true);
        for (const char* k : {"state", "epoch", "holder", "worker", "ttl_left_ms", "reserved_for", "revoke_pending", "waiters"})
          j[k] = r[k];
      } else {
        j["state"] = "free";
        j["epoch"] = before != nullptr ? nlohmann::json(before->record.epoch) : nlohmann::json(nullptr);
      }
      j["prev_epoch"] = before != nullptr ? nlohmann::json(before->record.epoch) : nlohmann::json(nullptr);
      j["prev_holder"] = before != nullptr && !before->record.holder.is_nil() ? nlohmann::json(before->record.holder.str())
                                                                              : nlohmann::json(nullptr);
      return line(j.dump());
    }
    std::string s = t + " " + kind + " " + name;
    const wire::NameRecord* r = now != nullptr ? now : before != nullptr ? &before->record : nullptr;
    if (r != nullptr) {
      s += " epoch " + std::to_string(r->epoch);
      if (before != nullptr && now != nullptr && before->record.epoch != now->epoch)
        s += " (was " + std::to_string(before->record.epoch) + ")";
      s += " state " + std::string(now != nullptr ? leasehold::to_string(now->state) : "free");
      if (!r->holder.is_nil()) s += " holder " + r->holder.str();
      if (!r->worker.is_nil()) s += " worker " + r->worker.str();
      if (now != nullptr && !now->reserved_for.is_nil()) s += " reserved_for " + now->reserved_for.str();
      if (now != nullptr && (now->waiters != 0 || (before != nullptr && before->record.waiters != 0))) {
        s += " waiters " + std::to_string(now->waiters);
        if (before != nullptr && before->record.waiters != now->waiters)
          s += " (was " + std::to_string(before->record.waiters) + ")";
      }
    }
    return line(s);
  }
  bool contact(const std::string& kind, const std::string& lockd, const std::string& message) {
    std::fprintf(stderr, "leasehold watch: %s\n",
                 (kind == "lost_contact" ? "lost contact with lockd at " + lockd + " (still trying): " + message
                                         : "lockd at " + lockd + " answers again")
                     .c_str());
    if (!json_) return true;
    nlohmann::json j = {{"time", wall_time()}, {"event", kind}, {"lockd", lockd}};
    if (!message.empty()) j["message"] = message;
    return line(j.dump());
  }

 private:
  bool line(const std::string& s) {
    if (std::printf("%s\n", s.c_str()) < 0 || std::fflush(stdout) != 0) return false;
    return true;
  }
  bool json_;
};

/// One listing: the names the watch covers, by name. nullopt with `f` set on a failure;
/// `lost` when it is lockd not answering (the watch goes on) rather than a refusal.
std::optional<std::map<std::string, wire::NameRecord>> poll_once(lockd::AdminClient& client, const WatchArgs& a,
                                                                 Failure& f, bool& lost) {
  lost = false;
  std::map<std::string, wire::NameRecord> out;
  if (!a.name.empty()) {
    const lockd::Answer ans = client.show_waiters(a.name);
    if (const auto* info = ans.as<wire::NameInfo>()) {
      out[a.name] = info->record;
      return out;
    }
    if (const auto* d = ans.as<wire::Deny>(); d != nullptr && d->refusal == Refusal::unknown_name) return out;
    if (ans.as<wire::Deny>() == nullptr) {
      lost = !ans.ok() && (ans.code() == Errc::timeout || ans.code() == Errc::io_error) && !ans.key_rejected;
      f = answer_failure(ans, a.lockd, "watch " + a.name);
    } else {
      f = deny_failure(*ans.as<wire::Deny>(), a.name);
    }
    return std::nullopt;
  }
  bool with_waiters = true;
  auto names = client.list_cluster(a.names_max, &with_waiters);
  if (!names.ok()) {
    lost = names.code() == Errc::timeout || names.code() == Errc::io_error;
    if (names.code() == Errc::permission_denied) f = {kRefused, "watch: " + names.status().message(), {{"reason", "key_rejected"}}};
    else if (names.code() == Errc::corrupt)
      f = {kRefused, "watch: lockd did not list its names (" + names.status().message() +
                         "): a worker key may not list names; give an admin key (--admin-key-file) or the cluster "
                         "key, or watch one NAME of this worker's"};
    else f = failure_of(names.status(), "watch");
    return std::nullopt;
  }
  for (wire::NameRecord& r : *names)
    if (r.name.rfind(a.prefix, 0) == 0) out[r.name] = std::move(r);
  return out;
}

/// Sleeps `ms`, or less when a stop signal arrives.
void nap(std::uint32_t ms) {
  timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1'000'000};
  while (!g_stop && ::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

const Command kWatch([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<WatchArgs>();
  auto* sub = app.add_subcommand(
      "watch",
      "Stream ownership changes of one NAME, of the names under --prefix, or of every name, by polling lockd: "
      "first one \"current\" line per name that exists, then one line per change (acquiring, acquired, granted, "
      "released, expired, revoked, transferring, transferred, handed_over, queue, changed) with the wall-clock "
      "time, the epoch, the holder and the number of sandboxes waiting for it. Runs until interrupted "
      "(SIGINT/SIGTERM: exit 0) or --count changes");
  add_lockd_flags(sub, a->lockd);
  auto* name = sub->add_option("name", a->name, "watch this name only (a worker key may watch its own names)");
  sub->add_option("--prefix", a->prefix, "watch the names that begin with this text (default: every name)")
      ->excludes(name);
  sub->add_flag("--json", a->json,
                "one JSON object per line: {\"time\", \"event\", \"name\", \"state\", \"epoch\", \"holder\", "
                "\"worker\", \"ttl_left_ms\", \"reserved_for\", \"revoke_pending\", \"waiters\", \"prev_epoch\", \"prev_holder\"}; "
                "a lockd that stops answering is {\"time\", \"event\": \"lost_contact\", \"lockd\", \"message\"}, "
                "and {\"event\": \"contact_restored\"} when it answers again");
  sub->add_option("--interval-ms", a->interval_ms, "poll lockd every this many milliseconds (default 200)")
      ->check(CLI::Range(20, 3'600'000));
  sub->add_option("--count", a->count, "exit 0 after this many changes (the \"current\" lines do not count)")
      ->check(CLI::Range(1, 1 << 30));
  sub->footer(
      "Changes are seen by comparing listings: one undone within an interval is not seen, and several in one "
      "interval show as one (a release and a re-acquire as \"acquired\" at the new epoch). lockd does not say "
      "whether a name that went away was released or expired: \"expired\" when its last-seen time left had "
      "passed, else \"released\". A lockd that stops answering is named on stderr and the watch goes on.");
  sub->callback([a, exit_code] {
    Failure f;
    if (!a->name.empty() && !check_name(a->name, f)) {
      *exit_code = report("watch", f);
      return;
    }
    resolve(a->lockd);
    auto client = connect_lockd(a->lockd, f);
    if (!client) {
      *exit_code = report("watch", f);
      return;
    }
    g_stop = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    ::sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);  // a closed stdout ends the watch through fflush's EPIPE
    Printer out(a->json);
    std::optional<std::map<std::string, Seen>> seen;  // nullopt until the first listing
    std::uint64_t changes = 0;
    bool lost = false;
    *exit_code = kOk;
    while (!g_stop) {
      const std::int64_t started = monotonic_ms();
      bool unanswered = false;
      auto now = poll_once(*client, *a, f, unanswered);
      if (!now) {
        if (!unanswered) {
          *exit_code = report("watch", f);
          return;
        }
        if (!lost && !out.contact("lost_contact", a->lockd.lockd, f.message)) return;
        lost = true;
      } else {
        if (lost && !out.contact("contact_restored", a->lockd.lockd, "")) return;
        lost = false;
        const std::int64_t at = monotonic_ms();
        std::map<std::string, Seen> next;
        for (auto& [n, r] : *now) next[n] = Seen{r, at};
        if (!seen) {
          for (const auto& [n, s] : next)
            if (!out.event("current", n, &s.record, nullptr)) return;
        } else {
          // Every name of either listing, in name order.
          std::map<std::string, int> names;
          for (const auto& [n, s] : *seen) names[n] = 0;
          for (const auto& [n, s] : next) names[n] = 0;
          for (const auto& [n, unused] : names) {
            const auto b = seen->find(n);
            const auto c = next.find(n);
            const Seen* before = b == seen->end() ? nullptr : &b->second;
            const wire::NameRecord* after = c == next.end() ? nullptr : &c->second.record;
            const std::string kind = classify(before, after, at);
            if (kind.empty()) continue;
            if (!out.event(kind, n, after, before)) return;
            if (a->count != 0 && ++changes >= a->count) return;
          }
        }
        seen = std::move(next);
      }
      const std::int64_t spent = monotonic_ms() - started;
      if (spent < a->interval_ms) nap(static_cast<std::uint32_t>(a->interval_ms - spent));
    }
  });
});

}  // namespace
}  // namespace leasehold::cli
