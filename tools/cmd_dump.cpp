// `leasehold dump` / `leasehold top`: a live view of a supervisor's shm epoch table.
//
// Reads the table read-only (shm::TableReader; DESIGN.md "The shared-memory epoch table"),
// like Aeron's `AeronStat`: header, writer liveness, stats and the live slots, as a table or
// JSON; `--watch` (and `top`) redraws it. A dead or closed writer is reported, and the exit
// code is then kTableError, as for a missing or corrupt table (and as `check` exits).
//
// A slot keeps only the first kNamePrefixBytes of its name (and the name's id): the full names
// come from the table's supervisor (its `list` over the control socket, --supervisor), each
// checked against the slot's name id, so a name printed is the slot's. Without an answer the
// prefix is printed with "..." and the name's length.
//
// Redraws clear the screen only on a terminal that can (stdout a tty, TERM not "dumb", NO_COLOR
// unset); otherwise each refresh is printed after a blank line, without control codes.
#include "tools/cmd_common.hpp"

#include "leasehold/lease/clock.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/config.hpp"

#include <unistd.h>

#include <map>
#include <set>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace leasehold::cli {
namespace {

using shm::Histogram;
using shm::SlotSnapshot;
using shm::SlotState;
using shm::TableReader;

inline constexpr std::uint64_t kWatchCountMax = 1'000'000;  ///< bound on --watch redraws
inline constexpr double kWatchIntervalMinS = 0.05;

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

/// The longest wait for the supervisor's list of names (a dump must not hang on a silent socket).
inline constexpr std::uint64_t kNamesTimeoutMs = 500;

struct DumpArgs {
  std::string command = "dump";  ///< "dump" or "top": the name errors are reported under
  std::string location;
  std::string supervisor;        ///< --supervisor: where the full names come from
  bool json = false;
  bool all = false;
  bool watch = false;
  double interval_s = 1.0;
  std::uint64_t count = 0;  // 0: until interrupted
};

/// Whether redraws may clear the screen: stdout is a terminal that understands it, and the user
/// did not ask for plain output (NO_COLOR, TERM=dumb).
bool may_clear_screen() {
  if (::isatty(STDOUT_FILENO) != 1) return false;
  const char* no_color = std::getenv("NO_COLOR");
  if (no_color != nullptr && *no_color != '\0') return false;
  const char* term = std::getenv("TERM");
  return term != nullptr && *term != '\0' && std::string_view(term) != "dumb";
}

/// Full names by sandbox id, from the supervisor's `list`, each kept only when its name id is
/// the slot's. Asked again only when a slot shows a sandbox it has not seen.
class FullNames {
 public:
  explicit FullNames(std::string socket) : socket_(std::move(socket)) {}
  /// The full name of the slot's sandbox, or "" when the supervisor did not tell it.
  std::string of(const SlotSnapshot& s) {
    if (s.name_bytes <= shm::kNamePrefixBytes) return s.name_prefix;  // the prefix is the name
    auto it = names_.find(s.sandbox.str());
    if (it == names_.end() && asked_.insert(s.sandbox.str()).second) {
      refresh();
      it = names_.find(s.sandbox.str());
    }
    if (it == names_.end() || name_id_of(it->second) != s.name) return {};
    return it->second;
  }

 private:
  void refresh() {
    SupervisorFlags flags;
    flags.socket = socket_;
    flags.timeout_ms = kNamesTimeoutMs;
    Failure ignored;  // no supervisor: the prefixes are printed, and say so
    const auto ans = supervisor_call(flags, {{"v", 1}, {"op", "list"}}, ignored);
    if (!ans || !ans->value("ok", false)) return;
    for (const auto& sb : ans->value("sandboxes", nlohmann::json::array()))
      if (sb.contains("name") && sb["name"].is_string() && sb.contains("sandbox") && sb["sandbox"].is_string())
        names_[sb["sandbox"].get<std::string>()] = sb["name"].get<std::string>();
  }
  std::string socket_;
  std::map<std::string, std::string> names_;
  std::set<std::string> asked_;
};

/// The name column: the full name, or the prefix + "..." and the length when only that is known.
std::string name_text(const SlotSnapshot& s, FullNames& names, bool& cut) {
  if (s.name_bytes == 0) return "-";
  std::string full = names.of(s);
  if (!full.empty()) return full;
  cut = true;
  return std::string(s.name_prefix) + "... (" + std::to_string(s.name_bytes) + " B)";
}

std::string duration_text(std::uint64_t ns) {
  char buf[64];
  if (ns == UINT64_MAX) return "never";
  if (ns < 1'000) std::snprintf(buf, sizeof buf, "%llu ns", static_cast<unsigned long long>(ns));
  else if (ns < 1'000'000) std::snprintf(buf, sizeof buf, "%.1f us", static_cast<double>(ns) / 1e3);
  else if (ns < 1'000'000'000) std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
  else std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ns) / 1e9);
  return buf;
}

struct HistView {
  std::uint64_t count = 0, sum = 0, max = 0, p50 = 0, p99 = 0;
};

// Percentiles from log2 buckets are upper bounds of the bucket (2^b - 1).
HistView view_of(const Histogram& h) {
  HistView v;
  std::uint64_t buckets[shm::kHistogramBuckets];
  std::uint64_t total = 0;
  for (std::size_t b = 0; b < shm::kHistogramBuckets; ++b) {
    buckets[b] = h.buckets[b].load(std::memory_order_relaxed);
    total += buckets[b];
  }
  v.count = h.count.load(std::memory_order_relaxed);
  v.sum = h.sum.load(std::memory_order_relaxed);
  v.max = h.max.load(std::memory_order_relaxed);
  auto pct = [&](double q) -> std::uint64_t {
    if (total == 0) return 0;
    const auto want = static_cast<std::uint64_t>(q * static_cast<double>(total) + 0.5);
    std::uint64_t seen = 0;
    for (std::size_t b = 0; b < shm::kHistogramBuckets; ++b) {
      seen += buckets[b];
      if (seen >= std::max<std::uint64_t>(want, 1))
        return b == 0 ? 0 : (b >= 64 ? UINT64_MAX : (1ULL << b) - 1);
    }
    return v.max;
  };
  v.p50 = std::min(pct(0.50), v.max);
  v.p99 = std::min(pct(0.99), v.max);
  return v;
}

struct Census {
  std::uint32_t published = 0, claimed = 0, revoked = 0, cooling = 0, free = 0, busy = 0;
};

// One pass over the table: snapshots of the slots to print, and the counts of every state.
std::vector<SlotSnapshot> collect(const TableReader& r, bool all, Census& c, std::vector<std::uint32_t>& busy) {
  std::vector<SlotSnapshot> out;
  SlotSnapshot s;
  for (std::uint32_t i = 0; i < r.slot_count(); ++i) {
    if (r.snapshot(i, s) != shm::TableErrc::ok) {
      ++c.busy;
      busy.push_back(i);
      continue;
    }
    switch (s.state) {
      case SlotState::published: ++c.published; break;
      case SlotState::claimed: ++c.claimed; break;
      case SlotState::cooling: ++c.cooling; break;
      case SlotState::free: ++c.free; break;
    }
    if (s.revoked) ++c.revoked;
    if (all || s.state == SlotState::published || s.state == SlotState::claimed) out.push_back(s);
  }
  return out;
}

std::string liveness_text(const shm::Liveness& l, const shm::Header& h) {
  if (l.closed) return "CLOSED (the writer shut the table down)";
  if (l.alive) return "ALIVE";
  if (l.age_ns == UINT64_MAX) return "DEAD (no valid heartbeat): every deadline check fails";
  return "DEAD (heartbeat " + duration_text(l.age_ns) + " ago > liveness timeout " +
         duration_text(h.liveness_timeout_ns) + "): every deadline check fails";
}

// "<duration> ago", or "none" when there is no valid time (never beat, another boot).
std::string ago_text(std::uint64_t age_ns) {
  return age_ns == UINT64_MAX ? std::string("none") : duration_text(age_ns) + " ago";
}

void print_text(const TableReader& r, const DumpArgs& a, FullNames& names) {
  const shm::Header& h = r.header();
  const std::uint64_t now = static_cast<std::uint64_t>(boottime_ns());
  const shm::Liveness l = r.writer_liveness(now);
  std::printf("shm table '%s'  layout %u.%u  incarnation %llu  %u slots x %u B  %llu B\n",
              r.location().text.c_str(), h.layout_major, h.layout_minor,
              static_cast<unsigned long long>(h.incarnation), h.slot_count, h.slot_bytes,
              static_cast<unsigned long long>(h.total_bytes));
  std::printf("writer pid %d  started %s  heartbeat %s (timeout %s, %llu beats)  %s\n",
              h.writer_pid, ago_text(now >= h.writer_start_ns ? now - h.writer_start_ns : UINT64_MAX).c_str(),
              ago_text(l.age_ns).c_str(), duration_text(h.liveness_timeout_ns).c_str(),
              static_cast<unsigned long long>(r.liveness().heartbeats.load(std::memory_order_relaxed)),
              liveness_text(l, h).c_str());
  const auto& st = r.stats();
  const auto& c = st.counters;
  std::printf("kills %llu  heartbeat failures %llu  revokes %llu  publishes %llu  claims refused (full) %llu\n",
              static_cast<unsigned long long>(c.kills.load(std::memory_order_relaxed)),
              static_cast<unsigned long long>(c.heartbeat_failures.load(std::memory_order_relaxed)),
              static_cast<unsigned long long>(c.revokes.load(std::memory_order_relaxed)),
              static_cast<unsigned long long>(c.publishes.load(std::memory_order_relaxed)),
              static_cast<unsigned long long>(c.claims_refused_full.load(std::memory_order_relaxed)));
  std::printf("%-20s %10s %10s %10s %10s\n", "histogram", "count", "p50<=", "p99<=", "max");
  const std::pair<const char*, const Histogram*> hists[] = {
      {"rt lateness", &st.rt_lateness_ns}, {"heartbeat rtt", &st.heartbeat_rtt_ns},
      {"kill latency", &st.kill_latency_ns}};
  for (const auto& [label, hist] : hists) {
    const HistView v = view_of(*hist);
    std::printf("%-20s %10llu %10s %10s %10s\n", label, static_cast<unsigned long long>(v.count),
                duration_text(v.p50).c_str(), duration_text(v.p99).c_str(), duration_text(v.max).c_str());
  }
  Census cen;
  std::vector<std::uint32_t> busy;
  const auto slots = collect(r, a.all, cen, busy);
  std::printf("slots: %u published (%u revoked), %u claimed, %u cooling, %u free, %u busy\n",
              cen.published, cen.revoked, cen.claimed, cen.cooling, cen.free, cen.busy);
  Table t({"SLOT", "GEN", "STATE", "CHECK", "EPOCH", "SANDBOX", "TTL_LEFT", "NAME"});
  bool cut = false;
  for (const auto& s : slots) {
    const bool valid = s.state == SlotState::published && !s.revoked && s.epoch != 0 && l.alive &&
                       now < s.valid_until_ns;
    std::string left = s.valid_until_ns == 0 ? "-"
                       : now < s.valid_until_ns ? duration_text(s.valid_until_ns - now)
                                                : "expired";
    t.add({std::to_string(s.index), std::to_string(s.generation), std::string(shm::to_string(s.state)),
           s.revoked ? "revoked" : (valid ? "valid" : "invalid"), std::to_string(s.epoch), s.sandbox.str(), left,
           name_text(s, names, cut)});
  }
  std::fputs(t.str().c_str(), stdout);
  for (const auto i : busy) std::printf("%6u  (busy: the writer kept updating it; retry)\n", i);
  if (cut)
    std::printf("names cut to their first %zu bytes: the table keeps no more, and the supervisor at %s did not "
                "list them (--supervisor SOCKET)\n",
                shm::kNamePrefixBytes, a.supervisor.c_str());
}

/// One refresh as a JSON object (times: CLOCK_BOOTTIME ns, durations *_ns; "name" is the full
/// name, or null when only "name_prefix" is known).
nlohmann::json table_json(const TableReader& r, const DumpArgs& a, FullNames& names) {
  using nlohmann::json;
  const shm::Header& h = r.header();
  const std::uint64_t now = static_cast<std::uint64_t>(boottime_ns());
  const shm::Liveness l = r.writer_liveness(now);
  const auto& st = r.stats();
  const auto& c = st.counters;
  json j = {{"location", r.location().text}, {"layout_major", h.layout_major}, {"layout_minor", h.layout_minor},
            {"incarnation", h.incarnation},  {"slot_count", h.slot_count},      {"total_bytes", h.total_bytes},
            {"now_ns", now}};
  j["writer"] = {{"pid", h.writer_pid},
                 {"start_ns", h.writer_start_ns},
                 {"heartbeat_ns", r.liveness().heartbeat_ns.load(std::memory_order_acquire)},
                 {"age_ns", l.age_ns == UINT64_MAX ? json(nullptr) : json(l.age_ns)},
                 {"liveness_timeout_ns", h.liveness_timeout_ns},
                 {"alive", l.alive},
                 {"closed", l.closed}};
  json stats = {{"kills", c.kills.load(std::memory_order_relaxed)},
                {"heartbeat_failures", c.heartbeat_failures.load(std::memory_order_relaxed)},
                {"revokes", c.revokes.load(std::memory_order_relaxed)},
                {"publishes", c.publishes.load(std::memory_order_relaxed)},
                {"claims_refused_full", c.claims_refused_full.load(std::memory_order_relaxed)}};
  const std::pair<const char*, const Histogram*> hists[] = {
      {"rt_lateness_ns", &st.rt_lateness_ns}, {"heartbeat_rtt_ns", &st.heartbeat_rtt_ns},
      {"kill_latency_ns", &st.kill_latency_ns}};
  for (const auto& [label, hist] : hists) {
    const HistView v = view_of(*hist);
    json buckets = json::array();
    for (std::size_t b = 0; b < shm::kHistogramBuckets; ++b) buckets.push_back(hist->buckets[b].load(std::memory_order_relaxed));
    stats[label] = {{"count", v.count}, {"sum", v.sum},   {"max", v.max},
                    {"p50_le", v.p50},  {"p99_le", v.p99}, {"log2_buckets", std::move(buckets)}};
  }
  j["stats"] = std::move(stats);
  Census cen;
  std::vector<std::uint32_t> busy;
  const auto slots = collect(r, a.all, cen, busy);
  j["census"] = {{"published", cen.published}, {"revoked", cen.revoked}, {"claimed", cen.claimed},
                 {"cooling", cen.cooling},     {"free", cen.free},       {"busy", cen.busy}};
  json out = json::array();
  for (const auto& s : slots) {
    const std::string full = s.name_bytes == 0 ? std::string() : names.of(s);
    out.push_back({{"slot", s.index},
                   {"generation", s.generation},
                   {"state", std::string(shm::to_string(s.state))},
                   {"revoked", s.revoked},
                   {"epoch", s.epoch},
                   {"sandbox", s.sandbox.str()},
                   {"name_id", s.name.str()},
                   {"name", full.empty() ? json(nullptr) : json(full)},
                   {"name_prefix", std::string(s.name_prefix)},
                   {"name_bytes", s.name_bytes},
                   {"valid_until_ns", s.valid_until_ns},
                   {"ttl_left_ms", s.valid_until_ns == 0 ? json(nullptr)
                                   : now < s.valid_until_ns ? json((s.valid_until_ns - now) / 1'000'000)
                                                            : json(0)}});
  }
  j["slots"] = std::move(out);
  j["busy_slots"] = busy;
  return j;
}

int run_dump(DumpArgs a) {
  const std::string& cmd = a.command;
  if (a.location.empty()) {
    const char* env = std::getenv(shm::kLocationEnv);
    if (env == nullptr || *env == '\0')
      return report(cmd, {kUsage, std::string("no table: pass --shm LOCATION or set ") + shm::kLocationEnv});
    a.location = env;
  }
  if (!a.watch && a.count != 0)
    return report(cmd, {kUsage, "--count " + std::to_string(a.count) + " needs --watch (a plain dump draws once)"});
  if (a.watch && !(a.interval_s >= kWatchIntervalMinS)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s %.3f s is below %.2f s", cmd == "top" ? "--interval" : "--watch interval",
                  a.interval_s, kWatchIntervalMinS);
    return report(cmd, {kUsage, buf});
  }
  SupervisorFlags sup;
  sup.socket = a.supervisor;
  resolve(sup);
  a.supervisor = sup.socket;
  FullNames names(a.supervisor);
  try {
    const TableReader r = TableReader::open(a.location);
    if (a.watch) {
      g_interrupted.store(false);
      std::signal(SIGINT, on_sigint);
    }
    const bool clear = a.watch && !a.json && may_clear_screen();
    const std::uint64_t rounds = a.watch ? (a.count == 0 ? kWatchCountMax : std::min(a.count, kWatchCountMax)) : 1;
    for (std::uint64_t n = 0; n < rounds && !g_interrupted.load(); ++n) {
      if (clear) std::fputs("\x1b[H\x1b[2J", stdout);
      else if (n > 0 && !a.json) std::fputs("\n", stdout);
      if (a.json) std::printf("%s\n", table_json(r, a, names).dump().c_str());
      else print_text(r, a, names);
      std::fflush(stdout);
      if (n + 1 == rounds) break;
      // Sleep in short steps so ctrl-c ends the watch promptly.
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(a.interval_s);
      while (!g_interrupted.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!a.json && a.watch && r.replaced())
        std::printf("note: the location now holds another table incarnation; restart to follow it\n");
    }
    if (a.watch) std::signal(SIGINT, SIG_DFL);
    const shm::Liveness l = r.writer_liveness();
    if (!l.alive) {
      // A JSON dump already said so in "writer"; the error object would be a second document.
      const Failure f{kTableError, "shm table '" + a.location + "': writer pid " + std::to_string(r.header().writer_pid) +
                                       " is " + (l.closed ? "gone (table closed)" : "dead (stale heartbeat)")};
      if (a.json) note(cmd, f);
      return a.json ? f.code : report(cmd, f);
    }
    return kOk;
  } catch (const shm::TableError& e) {
    return report(cmd, {e.code() == shm::TableErrc::bad_argument ? kUsage : kTableError, e.what()});
  }
}

void add_common(CLI::App* sub, DumpArgs& a) {
  sub->add_option("--shm", a.location,
                  "Table location: a shm name, or an absolute path (default: $LEASEHOLD_SHM)");
  sub->add_flag("--json", a.json, "One JSON object per refresh");
  sub->add_flag("--all", a.all, "Also list free and cooling slots");
  sub->add_option("--count", a.count, "With --watch: stop after N refreshes (default: until ctrl-c)");
  sub->add_option("--supervisor", a.supervisor,
                  std::string("the table's supervisor's control socket, asked for the full names (a slot keeps ") +
                      std::to_string(shm::kNamePrefixBytes) + " bytes; env " + kSupervisorEnv + ", default " +
                      default_control_socket_path() + ")");
}

const Command kDump([](CLI::App& app, int* exit_code) {
  static DumpArgs dump_args;
  auto* dump = app.add_subcommand("dump", "Show a supervisor's shm epoch table (header, writer, stats, slots); "
                                          "exit 6 when it is missing or corrupt or its writer is dead or gone");
  add_common(dump, dump_args);
  dump->add_option("--watch", dump_args.interval_s, "Refresh every SECONDS (default 1) like top")
      ->expected(0, 1)
      ->default_str("1");
  dump->callback([exit_code, dump] {
    dump_args.watch = dump->count("--watch") > 0;
    *exit_code = run_dump(dump_args);
  });

  static DumpArgs top_args;
  top_args.command = "top";
  auto* top = app.add_subcommand("top", "Same as `dump --watch`: redraws on a terminal (not with NO_COLOR or "
                                        "TERM=dumb); into a pipe, one refresh after another");
  add_common(top, top_args);
  top->add_option("--interval", top_args.interval_s, "Refresh every SECONDS (default 1)");
  top->callback([exit_code] {
    top_args.watch = true;
    *exit_code = run_dump(top_args);
  });
});

}  // namespace
}  // namespace leasehold::cli
