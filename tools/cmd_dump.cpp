// `leasehold dump` / `leasehold top`: a live view of a supervisor's shm epoch table.
//
// Reads the table read-only (shm::TableReader; DESIGN.md "The shared-memory epoch table"),
// like Aeron's `AeronStat`: header, writer liveness, stats and the live slots, as a table or
// JSON; `--watch` (and `top`) redraws it. A dead or closed writer is reported, and the exit
// code is then kTableError, as for a missing or corrupt table.
#include "tools/command.hpp"

#include "leasehold/lease/clock.hpp"
#include "leasehold/shm/table.hpp"

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

struct DumpArgs {
  std::string location;
  bool json = false;
  bool all = false;
  bool watch = false;
  double interval_s = 1.0;
  std::uint64_t count = 0;  // 0: until interrupted
};

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

std::string json_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') { out += '\\'; out += c; }
    else if (static_cast<unsigned char>(c) < 0x20) out += '?';
    else out += c;
  }
  return out;
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

void print_text(const TableReader& r, const DumpArgs& a) {
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
  std::printf("%6s %6s %-10s %-8s %20s  %-36s  %-12s %s\n", "SLOT", "GEN", "STATE", "CHECK", "EPOCH",
              "SANDBOX", "NAME", "VALID FOR");
  for (const auto& s : slots) {
    const bool valid = s.state == SlotState::published && !s.revoked && s.epoch != 0 && l.alive &&
                       now < s.valid_until_ns;
    std::string name = s.name_prefix;
    if (s.name_bytes > shm::kNamePrefixBytes) name += "...";
    std::string left = s.valid_until_ns == 0 ? "-"
                       : now < s.valid_until_ns ? duration_text(s.valid_until_ns - now)
                                                : "expired";
    std::printf("%6u %6u %-10s %-8s %20llu  %-36s  %-12s %s\n", s.index, s.generation,
                std::string(shm::to_string(s.state)).c_str(),
                s.revoked ? "revoked" : (valid ? "valid" : "invalid"),
                static_cast<unsigned long long>(s.epoch), s.sandbox.str().c_str(), name.c_str(),
                left.c_str());
  }
  for (const auto i : busy) std::printf("%6u  (busy: the writer kept updating it; retry)\n", i);
}

void print_json(const TableReader& r, const DumpArgs& a) {
  const shm::Header& h = r.header();
  const std::uint64_t now = static_cast<std::uint64_t>(boottime_ns());
  const shm::Liveness l = r.writer_liveness(now);
  const auto& st = r.stats();
  const auto& c = st.counters;
  auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf("{\"location\":\"%s\",\"layout_major\":%u,\"layout_minor\":%u,\"incarnation\":%llu,"
              "\"slot_count\":%u,\"total_bytes\":%llu,\"now_ns\":%llu,",
              json_escape(r.location().text).c_str(), h.layout_major, h.layout_minor,
              u(h.incarnation), h.slot_count, u(h.total_bytes), u(now));
  std::printf("\"writer\":{\"pid\":%d,\"start_ns\":%llu,\"heartbeat_ns\":%llu,\"age_ns\":%s,"
              "\"liveness_timeout_ns\":%llu,\"alive\":%s,\"closed\":%s},",
              h.writer_pid, u(h.writer_start_ns),
              u(r.liveness().heartbeat_ns.load(std::memory_order_acquire)),
              l.age_ns == UINT64_MAX ? "null" : std::to_string(l.age_ns).c_str(),
              u(h.liveness_timeout_ns), l.alive ? "true" : "false", l.closed ? "true" : "false");
  std::printf("\"stats\":{\"kills\":%llu,\"heartbeat_failures\":%llu,\"revokes\":%llu,"
              "\"publishes\":%llu,\"claims_refused_full\":%llu",
              u(c.kills.load()), u(c.heartbeat_failures.load()), u(c.revokes.load()),
              u(c.publishes.load()), u(c.claims_refused_full.load()));
  const std::pair<const char*, const Histogram*> hists[] = {
      {"rt_lateness_ns", &st.rt_lateness_ns}, {"heartbeat_rtt_ns", &st.heartbeat_rtt_ns},
      {"kill_latency_ns", &st.kill_latency_ns}};
  for (const auto& [label, hist] : hists) {
    const HistView v = view_of(*hist);
    std::printf(",\"%s\":{\"count\":%llu,\"sum\":%llu,\"max\":%llu,\"p50_le\":%llu,\"p99_le\":%llu,"
                "\"log2_buckets\":[",
                label, u(v.count), u(v.sum), u(v.max), u(v.p50), u(v.p99));
    for (std::size_t b = 0; b < shm::kHistogramBuckets; ++b)
      std::printf("%s%llu", b ? "," : "", u(hist->buckets[b].load(std::memory_order_relaxed)));
    std::printf("]}");
  }
  Census cen;
  std::vector<std::uint32_t> busy;
  const auto slots = collect(r, a.all, cen, busy);
  std::printf("},\"census\":{\"published\":%u,\"revoked\":%u,\"claimed\":%u,\"cooling\":%u,"
              "\"free\":%u,\"busy\":%u},\"slots\":[",
              cen.published, cen.revoked, cen.claimed, cen.cooling, cen.free, cen.busy);
  bool first = true;
  for (const auto& s : slots) {
    std::printf("%s{\"slot\":%u,\"generation\":%u,\"state\":\"%s\",\"revoked\":%s,\"epoch\":%llu,"
                "\"sandbox\":\"%s\",\"name_id\":\"%s\",\"name_prefix\":\"%s\",\"name_bytes\":%u,"
                "\"valid_until_ns\":%llu}",
                first ? "" : ",", s.index, s.generation, std::string(shm::to_string(s.state)).c_str(),
                s.revoked ? "true" : "false", u(s.epoch), s.sandbox.str().c_str(),
                s.name.str().c_str(), json_escape(s.name_prefix).c_str(), s.name_bytes,
                u(s.valid_until_ns));
    first = false;
  }
  std::printf("],\"busy_slots\":[");
  for (std::size_t i = 0; i < busy.size(); ++i) std::printf("%s%u", i ? "," : "", busy[i]);
  std::printf("]}\n");
}

int run_dump(DumpArgs a) {
  if (a.location.empty()) {
    const char* env = std::getenv(shm::kLocationEnv);
    if (env == nullptr || *env == '\0') {
      std::fprintf(stderr, "leasehold dump: no table: pass --shm LOCATION or set %s\n", shm::kLocationEnv);
      return kUsage;
    }
    a.location = env;
  }
  if (!a.watch && a.count != 0) {
    std::fprintf(stderr, "leasehold dump: --count %llu needs --watch (a plain dump draws once)\n",
                 static_cast<unsigned long long>(a.count));
    return kUsage;
  }
  if (a.watch && a.interval_s < kWatchIntervalMinS) {
    std::fprintf(stderr, "leasehold dump: --watch interval %.3f s is below %.2f s\n", a.interval_s,
                 kWatchIntervalMinS);
    return kUsage;
  }
  try {
    const TableReader r = TableReader::open(a.location);
    if (a.watch) {
      g_interrupted.store(false);
      std::signal(SIGINT, on_sigint);
    }
    const std::uint64_t rounds = a.watch ? (a.count == 0 ? kWatchCountMax : std::min(a.count, kWatchCountMax)) : 1;
    for (std::uint64_t n = 0; n < rounds && !g_interrupted.load(); ++n) {
      if (a.watch && !a.json) std::printf("\x1b[H\x1b[2J");
      if (a.json) print_json(r, a);
      else print_text(r, a);
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
      std::fprintf(stderr, "leasehold dump: shm table '%s': writer pid %d is %s\n", a.location.c_str(),
                   r.header().writer_pid, l.closed ? "gone (table closed)" : "dead (stale heartbeat)");
      return kTableError;
    }
    return kOk;
  } catch (const shm::TableError& e) {
    std::fprintf(stderr, "leasehold dump: %s\n", e.what());
    return e.code() == shm::TableErrc::bad_argument ? kUsage : kTableError;
  }
}

void add_common(CLI::App* sub, DumpArgs& a) {
  sub->add_option("--shm", a.location,
                  "Table location: a shm name, or an absolute path (default: $LEASEHOLD_SHM)");
  sub->add_flag("--json", a.json, "One JSON object per refresh");
  sub->add_flag("--all", a.all, "Also list free and cooling slots");
  sub->add_option("--count", a.count, "With --watch: stop after N refreshes (default: until ctrl-c)");
}

const Command kDump([](CLI::App& app, int* exit_code) {
  static DumpArgs dump_args;
  auto* dump = app.add_subcommand("dump", "Show a supervisor's shm epoch table (header, writer, stats, slots)");
  add_common(dump, dump_args);
  dump->add_option("--watch", dump_args.interval_s, "Refresh every SECONDS (default 1) like top")
      ->expected(0, 1)
      ->default_str("1");
  dump->callback([exit_code, dump] {
    dump_args.watch = dump->count("--watch") > 0;
    *exit_code = run_dump(dump_args);
  });

  static DumpArgs top_args;
  auto* top = app.add_subcommand("top", "Same as `dump --watch`");
  add_common(top, top_args);
  top->add_option("--interval", top_args.interval_s, "Refresh every SECONDS (default 1)");
  top->callback([exit_code] {
    top_args.watch = true;
    *exit_code = run_dump(top_args);
  });
});

}  // namespace
}  // namespace leasehold::cli
