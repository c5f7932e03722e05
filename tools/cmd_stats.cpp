// `leasehold stats`: each lockd's counters, as its Stats answer gives them (DESIGN.md "lockd").
#include "tools/cmd_common.hpp"

#include <cstdio>
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

const Command kStats([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<StatsArgs>();
  auto* sub = app.add_subcommand(
      "stats",
      "Print each lockd's counters (its Stats answer: grants, refusals by reason, refreshes, commits, "
      "leadership), one block per --lockd address");
  add_lockd_flags(sub, a->lockd);
  sub->add_flag("--json", a->json,
                "print {\"lockd\": [{\"address\": A, \"counters\": {KEY: VALUE, ...}} or {\"address\": A, "
                "\"error\": TEXT}, ...]}");
  sub->callback([a, exit_code] {
    resolve(a->lockd);
    nlohmann::json all = nlohmann::json::array();
    std::string text;
    for (const std::string& address : split_addresses(a->lockd.lockd)) {
      LockdFlags one = a->lockd;
      one.lockd = address;
      Failure f;
      auto client = connect_lockd(one, f);
      if (client) {
        const lockd::Answer ans = client->stats();
        if (const auto* s = ans.as<wire::StatsAnswer>()) {
          nlohmann::json counters = nlohmann::json::object();
          text += "lockd " + address + "\n";
          for (const wire::Counter& c : s->counters) {
            counters[c.key] = c.value;
            text += "  " + c.key + " " + std::to_string(c.value) + "\n";
          }
          all.push_back({{"address", address}, {"counters", std::move(counters)}});
          continue;
        }
        f = answer_failure(ans, one, "stats");
      }
      // One lockd that does not answer does not hide the others': its error is printed and the
      // exit code is its failure's.
      note("stats", f);  // its error is part of the answer below, with --json too
      *exit_code = f.code;
      all.push_back({{"address", address}, {"error", f.message}});
    }
    if (a->json) std::printf("%s\n", nlohmann::json{{"lockd", std::move(all)}}.dump(2).c_str());
    else std::fputs(text.c_str(), stdout);
  });
});

}  // namespace
}  // namespace leasehold::cli
