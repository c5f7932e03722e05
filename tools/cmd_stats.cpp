// `leasehold stats`: each lockd's counters, as its Stats answer gives them (DESIGN.md "lockd").
// `leasehold health`: whether lockd serves, from the same answer: its role, its store's commit
// latency, its refresh rate; exit 0 healthy, 1 not (DESIGN.md "Observability").
#include "tools/cmd_common.hpp"

#include <cstdio>
#include <map>
#include <memory>

namespace leasehold::cli {
namespace {

struct StatsArgs {
  LockdFlags lockd;
  bool json = false;
};

/// The addresses of a --lockd list ("A,B,C"), each asked on its own: a follower answers Stats
/// with its own counters (`leading` 0), so the leader's are not everything an operator needs.
std::vector<std::string> split_addresses(const std::string& list) {
  std::vector<std::string> out;
  std::size_t from = 0;
  for (;;) {
    const std::size_t comma = list.find(',', from);
    out.push_back(list.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
    if (comma == std::string::npos) return out;
    from = comma + 1;
  }
}

/// Asks each lockd of `flags.lockd` (one address at a time) for its Stats answer, in order:
/// `on_answer(address, stats)` when it answered, `on_failure(address, failure)` otherwise (`what`
/// names the command in the failure's message).
template <typename OnAnswer, typename OnFailure>
void each_lockd_stats(const LockdFlags& flags, const char* what, OnAnswer on_answer, OnFailure on_failure) {
  for (const std::string& address : split_addresses(flags.lockd)) {
    LockdFlags one = flags;
    one.lockd = address;
    Failure f;
    if (auto client = connect_lockd(one, f)) {
      const lockd::Answer ans = client->stats_all();
      if (const auto* s = ans.as<wire::StatsAnswer>()) {
        on_answer(address, *s);
        continue;
      }
      f = answer_failure(ans, one, what);
    }
    on_failure(address, f);
  }
}

const Command kStats([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<StatsArgs>();
  auto* sub = app.add_subcommand(
      "stats",
      "Print each lockd's counters, every one of them (paged Stats answers: version, grants, refusals by "
      "reason, refreshes, commits, leadership; the same set as its /metrics), one block per --lockd address");
  add_lockd_flags(sub, a->lockd);
  sub->add_flag("--json", a->json,
                "print {\"lockd\": [{\"address\": A, \"counters\": {KEY: VALUE, ...}} or {\"address\": A, "
                "\"error\": TEXT}, ...]}");
  sub->callback([a, exit_code] {
    resolve(a->lockd);
    nlohmann::json all = nlohmann::json::array();
    std::string text;
    each_lockd_stats(
        a->lockd, "stats",
        [&](const std::string& address, const wire::StatsAnswer& s) {
          nlohmann::json counters = nlohmann::json::object();
          text += "lockd " + address + "\n";
          for (const wire::Counter& c : s.counters) {
            counters[c.key] = c.value;
            text += "  " + c.key + " " + std::to_string(c.value) + "\n";
          }
          all.push_back({{"address", address}, {"counters", std::move(counters)}});
        },
        // One lockd that does not answer does not hide the others': its error is printed and the
        // exit code is its failure's.
        [&](const std::string& address, const Failure& f) {
          note("stats", f);  // its error is part of the answer below, with --json too
          *exit_code = f.code;
          all.push_back({{"address", address}, {"error", f.message}});
        });
    if (a->json) std::printf("%s\n", nlohmann::json{{"lockd", std::move(all)}}.dump(2).c_str());
    else std::fputs(text.c_str(), stdout);
  });
});

struct HealthArgs {
  LockdFlags lockd;
  bool json = false;
};

/// One lockd's health from its Stats answer: serving (standalone, or the leader of its shard
/// and not loading) and the figures an operator looks at first.
nlohmann::json health_of(const std::string& address, const wire::StatsAnswer& s) {
  std::map<std::string, std::uint64_t> c;
  for (const wire::Counter& k : s.counters) c[k.key] = k.value;
  auto get = [&](const char* key) -> nlohmann::json {
    const auto it = c.find(key);
    return it == c.end() ? nlohmann::json(nullptr) : nlohmann::json(it->second);
  };
  const bool cluster = c.count("leading") != 0;
  const bool loading = c.count("takeover_loading") != 0 && c["takeover_loading"] != 0;
  const bool leading = !cluster || c["leading"] != 0;
  const std::string role = !cluster ? "standalone" : loading ? "loading" : leading ? "leader" : "follower";
  const bool serving = leading && !loading;
  // "0.1.0", null from a lockd that does not say (older).
  const nlohmann::json version =
      c.count("version_major") == 0 ? nlohmann::json(nullptr)
                                    : nlohmann::json(std::to_string(c["version_major"]) + "." + std::to_string(c["version_minor"]) +
                                                     "." + std::to_string(c["version_patch"]));
  return {{"address", address},
          {"answered", true},
          {"version", version},
          {"role", role},
          {"serving", serving},
          {"shard", c.count("shard") != 0 ? get("shard") : nlohmann::json(0)},
          {"shards", c.count("shards") != 0 ? get("shards") : nlohmann::json(1)},
          {"names", get("names")},
          {"held", get("held")},
          {"refreshes_per_s", get("refreshes_per_s")},
          {"grants", get("grants")},
          {"overloaded", get("overloaded")},
          {"store", {{"commits", get("store_commits")},
                     {"commit_us_p50", get("store_commit_us_p50")},
                     {"commit_us_p99", get("store_commit_us_p99")},
                     {"log_rows", get("store_log_rows")}}}};
}

const Command kHealth([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<HealthArgs>();
  auto* sub = app.add_subcommand(
      "health",
      "Whether lockd serves: each --lockd address's role (standalone, leader, follower, loading), its store's "
      "commit latency and its refresh rate. Exit 0 when healthy: one address that serves, or a list of a "
      "cluster's addresses that all answer with a serving leader for every shard; 1 when not; 5 when no "
      "lockd answers");
  add_lockd_flags(sub, a->lockd);
  sub->add_flag("--json", a->json,
                "print {\"healthy\": B, \"reasons\": [TEXT...], \"lockd\": [{\"address\", \"answered\", \"version\", \"role\", "
                "\"serving\", \"shard\", \"shards\", \"names\", \"held\", \"refreshes_per_s\", \"grants\", "
                "\"overloaded\", \"store\": {\"commits\", \"commit_us_p50\", \"commit_us_p99\", \"log_rows\"}} or "
                "{\"address\", \"answered\": false, \"error\"}, ...]}");
  sub->callback([a, exit_code] {
    resolve(a->lockd);
    const std::vector<std::string> addresses = split_addresses(a->lockd.lockd);
    nlohmann::json all = nlohmann::json::array();
    std::vector<std::string> reasons;
    std::map<std::uint64_t, unsigned> serving_by_shard;
    std::uint64_t shards = 1;
    std::size_t answered = 0;
    Failure last;
    each_lockd_stats(
        a->lockd, "health",
        [&](const std::string& address, const wire::StatsAnswer& s) {
          nlohmann::json h = health_of(address, s);
          ++answered;
          shards = std::max<std::uint64_t>(shards, h["shards"].get<std::uint64_t>());
          if (h["serving"].get<bool>()) ++serving_by_shard[h["shard"].get<std::uint64_t>()];
          else if (addresses.size() == 1) reasons.push_back(address + " does not serve: it is a " + h["role"].get<std::string>());
          all.push_back(std::move(h));
        },
        [&](const std::string& address, const Failure& f) {
          last = f;
          reasons.push_back(address + " does not answer: " + f.message);
          all.push_back({{"address", address}, {"answered", false}, {"error", f.message}});
        });
    if (answered == 0) {
      *exit_code = report("health", last);
      if (a->json)
        std::printf("%s\n", nlohmann::json{{"healthy", false}, {"reasons", reasons}, {"lockd", std::move(all)}}.dump(2).c_str());
      return;
    }
    if (addresses.size() > 1)
      for (std::uint64_t k = 0; k < shards; ++k) {
        if (serving_by_shard[k] == 0) reasons.push_back("shard " + std::to_string(k) + " has no serving leader among the addresses given");
        if (serving_by_shard[k] > 1) reasons.push_back("shard " + std::to_string(k) + " has " + std::to_string(serving_by_shard[k]) + " lockd that say they lead");
      }
    const bool healthy = reasons.empty();
    *exit_code = healthy ? kOk : kFailure;
    if (a->json) {
      std::printf("%s\n", nlohmann::json{{"healthy", healthy}, {"reasons", reasons}, {"lockd", std::move(all)}}.dump(2).c_str());
      return;
    }
    std::string text = healthy ? "healthy\n" : "unhealthy\n";
    for (const std::string& r : reasons) text += "  " + r + "\n";
    for (const auto& h : all) {
      if (!h["answered"].get<bool>()) continue;
      auto num = [&](const nlohmann::json& v) { return v.is_null() ? std::string("?") : v.dump(); };
      text += "lockd " + h["address"].get<std::string>() +
              (h["version"].is_string() ? " (" + h["version"].get<std::string>() + ")" : std::string()) + ": " +
              h["role"].get<std::string>() +
              (h["serving"].get<bool>() ? ", serving" : ", not serving") + "; " + num(h["names"]) + " names, " +
              num(h["held"]) + " held; " + num(h["refreshes_per_s"]) + " refreshes/s; store commit p50 " +
              num(h["store"]["commit_us_p50"]) + " us, p99 " + num(h["store"]["commit_us_p99"]) + " us over " +
              num(h["store"]["commits"]) + " commits\n";
    }
    std::fputs(text.c_str(), stdout);
  });
});

}  // namespace
}  // namespace leasehold::cli
