// `leasehold audit --db PATH`: the exclusivity check over a fenced store's audit table
// (resource/fenced_store.hpp check_audit): writes per epoch, rejected writes, violations.
// It opens the store read-only and changes nothing (FencedStore::open_read_only), so it also
// checks a copy kept as evidence on a read-only file or mount.
// Exit 0 when the audit shows exclusive epochs, 1 when a rule is broken or a write with a forged
// token was refused (someone wrote without a grant: "ATTACKED"), 2 for a file that is not a
// fenced store or a malformed --name, 3 for a store another connection keeps locked, 4 for a
// missing file or a name without audit rows. Accepted
// writes whose token nobody verified (a store opened without lockd's public key) are reported as
// "unverified" (exit 0: the rules hold, but their epochs are unproven).
#include "tools/cmd_common.hpp"

#include "leasehold/resource/fenced_store.hpp"

#include <unistd.h>

#include <cstdio>
#include <memory>

namespace leasehold::cli {
namespace {

/// Names listed when --name has no rows.
constexpr std::size_t kKnownNamesShown = 10;

struct AuditArgs {
  std::string db;
  std::string name;
  bool json = false;
};

const Command kAudit([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<AuditArgs>();
  auto* sub = app.add_subcommand(
      "audit", "Check a fenced store's audit: accepted writes per epoch, epochs never overlapping or "
               "going backwards, one holder per epoch; exit 1 if any rule is broken");
  sub->add_option("--db", a->db, "the fenced store (SQLite file)")->required();
  auto* name_opt = sub->add_option("--name", a->name, "only this name");
  sub->add_flag("--json", a->json, "print a JSON object");
  sub->callback([a, exit_code, name_opt] {
    Failure f;
    if (name_opt->count() > 0 && !check_name(a->name, f)) {
      *exit_code = report("audit", f);
      return;
    }
    if (::access(a->db.c_str(), F_OK) != 0) {
      *exit_code = report("audit", {kNotFound, "no fenced store at " + a->db});
      return;
    }
    auto opened = resource::FencedStore::open_read_only(a->db);
    if (!opened) {
      // Locked by a writer: refused for now (exit 3, as "busy"); anything else: not a fenced store.
      *exit_code = report("audit", {opened.code() == Errc::busy ? kRefused : kUsage, opened.message()});
      return;
    }
    const auto store = std::move(opened).value();
    const auto read = store->audit(a->name, resource::kAuditRowsMax);
    if (!read) {
      *exit_code = report("audit", {kFailure, read.message()});
      return;
    }
    const std::vector<resource::AuditRow>& rows = *read;
    if (!a->name.empty() && rows.empty()) {
      std::string known;
      const auto names = store->names(kKnownNamesShown + 1);
      for (std::size_t i = 0; i < names.size() && i < kKnownNamesShown; ++i) known += (i ? ", " : "") + names[i];
      if (names.size() > kKnownNamesShown) known += ", ...";
      const std::string listed = known.empty() ? " (it has none at all)" : " (names in it: " + known + ")";
      *exit_code = report("audit", {kNotFound, "unknown name \"" + a->name + "\": no audit rows for it in " + a->db + listed});
      return;
    }
    const resource::AuditReport rep = resource::check_audit(rows);
    if (a->json) {
      nlohmann::json epochs = nlohmann::json::array();
      for (const auto& e : rep.epochs)
        epochs.push_back({{"name", e.name}, {"epoch", e.epoch}, {"accepted", e.accepted}, {"stale", e.rejected}, {"forged", e.forged},
                          {"first_ns", e.first_ns}, {"last_ns", e.last_ns}, {"holders", e.holders}});
      nlohmann::json rejected = nlohmann::json::array();
      for (const auto& r : rep.rejected_rows)
        rejected.push_back({{"time_ns", r.time_ns}, {"name", r.name}, {"epoch", r.epoch}, {"holder", r.holder},
                            {"verdict", std::string(resource::to_string(r.verdict))}, {"reason", r.reason}});
      nlohmann::json raises = nlohmann::json::array();
      for (const auto& r : rep.operator_fences)
        raises.push_back({{"time_ns", r.time_ns}, {"name", r.name}, {"epoch", r.epoch}, {"reason", r.reason}});
      std::printf("%s\n", nlohmann::json{{"ok", rep.ok()}, {"operator_fences", raises}, {"exclusive", rep.exclusive()}, {"summary", rep.summary()},
                                         {"accepted", rep.accepted}, {"rejected", rep.rejected},
                                         {"forged", rep.forged}, {"verified", rep.verified},
                                         {"unverified", rep.unverified}, {"fences", rep.fences}, {"epochs", epochs}, {"rejected_rows", rejected},
                                         {"violations", rep.violations}}
                              .dump()
                              .c_str());
    } else {
      std::vector<std::vector<std::string>> t;
      for (const auto& e : rep.epochs) {
        std::string holders;
        for (const auto& h : e.holders) holders += (holders.empty() ? "" : ",") + h;
        t.push_back({e.name, std::to_string(e.epoch), holders.empty() ? "-" : holders, std::to_string(e.accepted),
                     std::to_string(e.rejected), std::to_string(e.forged), duration_text(e.last_ns - e.first_ns)});
      }
      std::fputs(format_table({"NAME", "EPOCH", "HOLDER", "ACCEPTED", "STALE", "FORGED", "SPAN"}, t).c_str(), stdout);
      std::printf("%llu accepted, %llu rejected (%llu forged), %llu fence announcements; %llu accepted with a "
                  "verified token\n",
                  static_cast<unsigned long long>(rep.accepted), static_cast<unsigned long long>(rep.rejected),
                  static_cast<unsigned long long>(rep.forged), static_cast<unsigned long long>(rep.fences),
                  static_cast<unsigned long long>(rep.verified));
      for (const auto& r : rep.rejected_rows)
        std::printf("rejected: %s epoch %llu holder %s: %s\n", r.name.c_str(), static_cast<unsigned long long>(r.epoch),
                    r.holder.c_str(), r.reason.c_str());
      for (const auto& r : rep.operator_fences)
        std::printf("operator fence raise: %s to epoch %llu: %s\n", r.name.c_str(),
                    static_cast<unsigned long long>(r.epoch), r.reason.c_str());
      for (const auto& v : rep.violations) std::printf("VIOLATION: %s\n", v.c_str());
      std::printf("%s\n", rep.summary().c_str());
    }
    *exit_code = rep.ok() && rep.forged == 0 ? kOk : kFailure;
  });
});

}  // namespace
}  // namespace leasehold::cli
