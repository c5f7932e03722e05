// `leasehold names` and `leasehold show NAME`: lockd's name table (DESIGN.md "Lock states").
#include "tools/cmd_common.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>

namespace leasehold::cli {
namespace {

std::vector<std::string> record_row(const wire::NameRecord& r, bool with_waiters) {
  return {r.name.empty() ? r.name_id.str() : r.name,
          std::string(leasehold::to_string(r.state)),
          std::to_string(r.epoch),
          id_text(r.holder),
          id_text(r.worker),
          r.ttl_left_ms == wire::kNoExpiryMs ? "no TTL (worker liveness)"
          : r.state == LockPhase::held || r.state == LockPhase::acquiring
              ? std::to_string(r.ttl_left_ms) + " ms"
          : r.revoke_pending ? (r.state == LockPhase::transferring ? "guard: " : "revoked: ") +
                                   std::to_string(r.ttl_left_ms) + " ms"
              : "-",
          id_text(r.reserved_for),
          with_waiters ? std::to_string(r.waiters) : "-"};
}

const std::vector<std::string> kHeader{"NAME",     "STATE",        "EPOCH",  "HOLDER", "WORKER",
                                       "TTL_LEFT", "RESERVED_FOR", "WAITERS"};

// True when lockd reports a cluster of several shards (its Stats' "shards").
bool sharded(lockd::AdminClient& client) {
  const auto counters = client.counters();
  if (!counters.ok()) return false;  // the listing below reports why lockd did not answer
  for (const wire::Counter& c : *counters)
    if (c.key == "shards") return c.value > 1;
  return false;
}

struct NamesArgs {
  LockdFlags lockd;
  bool json = false;
  std::size_t names_max = 1u << 20;
  std::string state;   ///< --state: "" or a LockPhase's text
  std::string worker;  ///< --worker: "" or a worker id
  std::string prefix;  ///< --prefix: names that begin with it
};

/// The filters of `names`, checked: a LockPhase, a worker id. kUsage naming the flag otherwise.
struct NamesFilter {
  std::optional<LockPhase> state;
  std::optional<WorkerId> worker;
  std::string prefix;
  bool keeps(const wire::NameRecord& r) const {
    return (!state || r.state == *state) && (!worker || r.worker == *worker) && r.name.rfind(prefix, 0) == 0;
  }
};

std::optional<NamesFilter> names_filter(const NamesArgs& a, Failure& f) {
  NamesFilter nf;
  nf.prefix = a.prefix;
  if (!a.state.empty()) {
    std::string known;
    for (const LockPhase p : kLockPhases) {
      known += (known.empty() ? "" : ", ") + std::string(leasehold::to_string(p));
      if (leasehold::to_string(p) == a.state) nf.state = p;
    }
    if (!nf.state) {
      f = {kUsage, "--state \"" + a.state + "\" is not a state; the states are " + known};
      return std::nullopt;
    }
  }
  if (!a.worker.empty()) {
    nf.worker = WorkerId::parse(a.worker);
    if (!nf.worker || nf.worker->is_nil()) {
      f = {kUsage, "--worker \"" + a.worker + "\" is not a worker id (a UUID)"};
      return std::nullopt;
    }
  }
  return nf;
}

const Command kNames([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<NamesArgs>();
  auto* sub = app.add_subcommand("names", "List lockd's names (paged through the whole table; of a cluster of several shards, every shard's from its leader)");
  add_lockd_flags(sub, a->lockd);
  sub->add_flag("--json", a->json, "print a JSON array");
  sub->add_option("--max", a->names_max, "stop after this many names")->check(CLI::Range(1, 1 << 24));
  sub->add_option("--state", a->state, "only names in this state: free, acquiring, held or transferring");
  sub->add_option("--worker", a->worker, "only names whose holder (or reservation) is on this worker (UUID)");
  sub->add_option("--prefix", a->prefix, "only names that begin with this text");
  sub->footer("The filters apply to the listing lockd pages out (--max names at most), in the CLI; they combine "
              "(all must hold).");
  sub->callback([a, exit_code] {
    Failure f;
    const std::optional<NamesFilter> filter = names_filter(*a, f);
    if (!filter) {
      *exit_code = report("names", f);
      return;
    }
    auto client = connect_lockd(a->lockd, f);
    if (!client) {
      *exit_code = report("names", f);
      return;
    }
    // A cluster of several shards: every shard's names, each from its own leader.
    std::vector<wire::NameRecord> all;
    bool with_waiters = true;  // until a page comes without them (an older lockd)
    const bool of_shards = sharded(*client);
    if (of_shards) {
      auto names = client->list_cluster(a->names_max, &with_waiters);
      if (!names.ok()) {
        *exit_code = report("names", failure_of(names.status(), "list names"));
        return;
      }
      all = std::move(*names);
    }
    // Paged here rather than with AdminClient::list_all, so a page without an answer keeps its
    // Answer (attempts made, the error) for the message.
    std::uint64_t cursor = 0;
    if (!of_shards) do {
      const lockd::Answer ans = client->list(cursor, 0, true);
      const auto* page = ans.as<wire::ListPage>();
      if (const auto* d = ans.as<wire::Deny>()) {  // a worker key may not list: forbidden
        *exit_code = report("names", d->refusal == Refusal::forbidden
                                         ? Failure{kRefused, "list names refused by lockd: forbidden: this key may not "
                                                             "list names (a worker key acts only on its own names); "
                                                             "give an admin key (--admin-key-file) or the cluster key"}
                                         : deny_failure(*d, "list names"));
        return;
      }
      if (page == nullptr) {
        *exit_code = report("names", answer_failure(ans, a->lockd, "list names"));
        return;
      }
      with_waiters = with_waiters && page->with_waiters;
      all.insert(all.end(), page->entries.begin(), page->entries.end());
      if (page->next_cursor != 0 && page->next_cursor <= cursor) {
        *exit_code = report("names", {kInternal, "list names: lockd's page cursor did not advance (" +
                                                     std::to_string(cursor) + " -> " +
                                                     std::to_string(page->next_cursor) + ")"});
        return;
      }
      cursor = page->next_cursor;
    } while (cursor != 0 && all.size() < a->names_max);
    if (all.size() > a->names_max) all.resize(a->names_max);
    std::erase_if(all, [&](const wire::NameRecord& r) { return !filter->keeps(r); });
    std::sort(all.begin(), all.end(), [](const auto& x, const auto& y) { return x.name < y.name; });
    if (a->json) {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& r : all) arr.push_back(record_json(r, with_waiters));
      std::printf("%s\n", arr.dump().c_str());
    } else {
      std::vector<std::vector<std::string>> rows;
      for (const auto& r : all) rows.push_back(record_row(r, with_waiters));
      std::fputs(format_table(kHeader, rows).c_str(), stdout);
      std::printf("%zu name(s)\n", all.size());
    }
    *exit_code = kOk;
  });
});

struct ShowArgs {
  LockdFlags lockd;
  std::string name;
  bool json = false;
};

const Command kShow([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ShowArgs>();
  auto* sub = app.add_subcommand("show", "Show one name: state, holder, worker, epoch, time to expiry, and its waiters in line");
  add_lockd_flags(sub, a->lockd);
  sub->add_option("name", a->name, "the name")->required();
  sub->add_flag("--json", a->json, "print a JSON object");
  sub->callback([a, exit_code] {
    Failure f;
    if (!check_name(a->name, f)) {
      *exit_code = report("show", f);
      return;
    }
    auto client = connect_lockd(a->lockd, f);
    if (!client) {
      *exit_code = report("show", f);
      return;
    }
    const lockd::Answer ans = client->show_waiters(a->name);
    const auto* info = answer_body<wire::NameInfo>(ans, "show", a->name, a->lockd, f);
    if (info == nullptr) {
      *exit_code = report("show", f);
      return;
    }
    if (a->json) {
      nlohmann::json j = record_json(info->record, info->with_waiters);
      if (info->with_waiters) {
        j["queue"] = nlohmann::json::array();
        for (std::size_t i = 0; i < info->waiters.size(); ++i) {
          const wire::WaiterRecord& w = info->waiters[i];
          j["queue"].push_back({{"position", info->waiters_from + i + 1},
                                {"sandbox", w.sandbox.str()},
                                {"worker", w.worker.str()},
                                {"ttl_left_ms", w.ttl_left_ms}});
        }
      }
      std::printf("%s\n", j.dump().c_str());
    } else {
      const auto row = record_row(info->record, info->with_waiters);
      Table fields;  // one "key  value" line per column of `names`
      for (std::size_t i = 0; i < kHeader.size(); ++i) {
        std::string key = kHeader[i];
        std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
        fields.add({key, row[i]});
      }
      const wire::NameRecord& r = info->record;
      if (r.revoke_pending && r.state == LockPhase::transferring)
        fields.add({"transfer", "waiting for the old holder (epoch " + std::to_string(r.revoked_epoch) +
                                    "): completable when worker " + id_text(r.worker) +
                                    " confirms its kill, or in " + std::to_string(r.ttl_left_ms) +
                                    " ms (its lease + lock-delay)"});
      else if (r.revoke_pending)
        fields.add({"revoke", "pending: revoked epoch " + std::to_string(r.revoked_epoch) +
                                  "; grantable when worker " + id_text(r.worker) + " confirms the kill, or in " +
                                  std::to_string(r.ttl_left_ms) + " ms (its lease + lock-delay)"});
      else if (r.revoke_ended != wire::RevokeEnd::none)
        fields.add({"revoke", r.revoke_ended == wire::RevokeEnd::kill_confirmed ? "ended: kill confirmed"
                                                                                  : "ended: lease expired"});
      if (!r.reserved_for.is_nil())
        fields.add({"reservation", r.reservation_left_ms == wire::kNoExpiryMs
                                       ? "lapses " + std::string("after the lock-delay, plus the reservation TTL")
                                       : "lapses in " + std::to_string(r.reservation_left_ms) + " ms"});
      // The FIFO, first in line first: who gets the name next, and how long each place is kept
      // without a renewal (its supervisor renews it every heartbeat).
      for (std::size_t i = 0; i < info->waiters.size(); ++i) {
        const wire::WaiterRecord& w = info->waiters[i];
        fields.add({i == 0 ? "queue" : "", std::to_string(info->waiters_from + i + 1) + ". sandbox " + w.sandbox.str() +
                                               " on worker " + w.worker.str() +
                                               (w.ttl_left_ms == 0 ? " (place lapsed)"
                                                                   : " (place kept " + std::to_string(w.ttl_left_ms) + " ms)")});
      }
      std::fputs(fields.str().c_str(), stdout);
    }
    *exit_code = kOk;
  });
});

}  // namespace
}  // namespace leasehold::cli
