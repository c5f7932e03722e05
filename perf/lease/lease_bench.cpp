// LeaseTable at scale (issue 2 "Scale"): the cost of a 64-entry batch refresh on a table of
// 1,000,000 held names (random names, so every entry is a cache miss on a 64+ MB table), and
// the memory per held name. Baseline in the same run: the same records in a
// std::unordered_map<NameId, record>, the same batches. Targets: < 2 us per batch,
// <= 128 bytes per held name. Report ratios (LeaseTable / baseline), not absolute numbers.
//
//   lease_bench --benchmark_counters_tabular=true
#include "leasehold/lease/lease_table.hpp"

#include <benchmark/benchmark.h>

#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace leasehold {
namespace {

constexpr std::size_t kNames = 1'000'000;
constexpr std::size_t kBatch = 64;
constexpr std::size_t kBatches = 8192;  // 512 Ki entries: far more than any cache holds
constexpr std::size_t kWorkers = 1024;
constexpr std::int64_t kSecondNs = 1'000'000'000;
constexpr std::int64_t kT0 = 1000 * kSecondNs;

SandboxId sandbox_of(std::size_t i) { return SandboxId{0x5a5a0000 + i, i * 0x9E3779B97F4A7C15ULL}; }
WorkerId worker_of(std::size_t w) { return WorkerId{0x77000 + w, w + 1}; }
std::string text_of(std::size_t i) { return "bench/name-" + std::to_string(i); }

std::size_t rss_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<std::size_t>(resident) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}
std::size_t heap_bytes() {
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;  // in-use arena bytes + mmapped blocks
}

LeaseConfig bench_config() {
  LeaseConfig c;
  c.capacity = kNames;
  c.default_ttl_ns = 10 * kSecondNs;
  c.max_ttl_ns = 60 * kSecondNs;
  return c;
}

// Name i is held by sandbox_of(i) on worker i % kWorkers at epoch e_i.
std::unique_ptr<LeaseTable> build_table() {
  auto t = std::make_unique<LeaseTable>(bench_config());
  for (std::size_t i = 0; i < kNames; ++i) {
    const Outcome o = t->acquire(text_of(i), sandbox_of(i), worker_of(i % kWorkers), kT0);
    if (!o.ok()) std::abort();
  }
  return t;
}

struct Fixture {
  std::vector<NameId> ids;
  std::vector<Epoch> epochs;
  std::unique_ptr<LeaseTable> table;
  std::vector<RefreshEntry> entries;  // kBatches batches of kBatch, each from one worker
  std::vector<WorkerId> batch_worker;

  Fixture() {
    table = build_table();
    for (std::size_t i = 0; i < kNames; ++i) {
      ids.push_back(name_id_of(text_of(i)));
      epochs.push_back(table->state(ids.back()).epoch);
    }
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<std::size_t> worker_pick(0, kWorkers - 1);
    std::uniform_int_distribution<std::size_t> slot_pick(0, kNames / kWorkers - 1);
    for (std::size_t b = 0; b < kBatches; ++b) {
      const std::size_t w = worker_pick(rng);
      batch_worker.push_back(worker_of(w));
      for (std::size_t k = 0; k < kBatch; ++k) {
        const std::size_t i = slot_pick(rng) * kWorkers + w;  // a random name of worker w
        entries.push_back(RefreshEntry{ids[i], sandbox_of(i), epochs[i]});
      }
    }
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// The baseline: what a straightforward implementation would keep per name.
struct MapRecord {
  SandboxId owner;
  WorkerId worker;
  Epoch epoch = 0;
  std::int64_t expiry_ns = 0;
  LockPhase phase = LockPhase::free;
};
using MapTable = std::unordered_map<NameId, MapRecord>;

std::unique_ptr<MapTable> build_map(const std::vector<NameId>& ids, const std::vector<Epoch>& epochs) {
  auto m = std::make_unique<MapTable>();
  m->reserve(kNames);
  for (std::size_t i = 0; i < kNames; ++i)
    m->emplace(ids[i], MapRecord{sandbox_of(i), worker_of(i % kWorkers), epochs[i],
                                 kT0 + 10 * kSecondNs, LockPhase::held});
  return m;
}

MapTable& map_fixture() {
  static std::unique_ptr<MapTable> m = build_map(fixture().ids, fixture().epochs);
  return *m;
}

void BM_Refresh64_LeaseTable(benchmark::State& state) {
  Fixture& f = fixture();
  RefreshAnswer answers[kBatch];
  std::size_t b = 0;
  // One clock across the benchmark's runs: time into a LeaseTable never goes backwards.
  static std::int64_t now = kT0 + kSecondNs;
  std::size_t refreshed = 0;
  for (auto _ : state) {
    const std::span<const RefreshEntry> batch(&f.entries[b * kBatch], kBatch);
    f.table->refresh(f.batch_worker[b], batch, now, answers);
    refreshed += answers[kBatch - 1].status == RefreshStatus::refreshed;
    benchmark::DoNotOptimize(answers);
    b = b + 1 == kBatches ? 0 : b + 1;
    now += 1000;  // stays far below the 10 s TTL over a run
  }
  if (refreshed != static_cast<std::size_t>(state.iterations())) state.SkipWithError("a refresh was not answered refreshed");
  state.counters["ns_per_entry"] = benchmark::Counter(
      static_cast<double>(state.iterations() * kBatch), benchmark::Counter::kIsRate |
                                                            benchmark::Counter::kInvert);
}
BENCHMARK(BM_Refresh64_LeaseTable)->Unit(benchmark::kNanosecond);

// The same batches against std::unordered_map: find, check owner/epoch/worker/expiry, move
// the expiry. No prefetching (a node-based map offers nothing to prefetch before the find).
void BM_Refresh64_UnorderedMapBaseline(benchmark::State& state) {
  Fixture& f = fixture();
  MapTable& m = map_fixture();
  RefreshAnswer answers[kBatch];
  std::size_t b = 0;
  std::int64_t now = kT0 + kSecondNs;
  for (auto _ : state) {
    const RefreshEntry* batch = &f.entries[b * kBatch];
    const WorkerId w = f.batch_worker[b];
    for (std::size_t k = 0; k < kBatch; ++k) {
      auto it = m.find(batch[k].name);
      if (it == m.end()) {
        answers[k] = RefreshAnswer{RefreshStatus::unknown, 0, {}, 0};
        continue;
      }
      MapRecord& r = it->second;
      if (r.phase == LockPhase::held && now < r.expiry_ns && r.owner == batch[k].sandbox &&
          r.epoch == batch[k].epoch && r.worker == w) {
        r.expiry_ns = now + 10 * kSecondNs;
        answers[k] = RefreshAnswer{RefreshStatus::refreshed, r.epoch, r.owner, r.expiry_ns};
      } else {
        answers[k] = RefreshAnswer{RefreshStatus::lost, r.epoch, r.owner, 0};
      }
    }
    benchmark::DoNotOptimize(answers);
    b = b + 1 == kBatches ? 0 : b + 1;
    now += 1000;
  }
  state.counters["ns_per_entry"] = benchmark::Counter(
      static_cast<double>(state.iterations() * kBatch), benchmark::Counter::kIsRate |
                                                            benchmark::Counter::kInvert);
}
BENCHMARK(BM_Refresh64_UnorderedMapBaseline)->Unit(benchmark::kNanosecond);

// Memory per held name: a fresh 1,000,000-name table, measured three ways - the table's own
// accounting, the process RSS delta and the malloc heap delta - against the baseline map.
void BM_MemoryPerHeldName_LeaseTable(benchmark::State& state) {
  for (auto _ : state) {
    const std::size_t rss0 = rss_bytes(), heap0 = heap_bytes();
    std::unique_ptr<LeaseTable> t = build_table();
    const std::size_t rss1 = rss_bytes(), heap1 = heap_bytes();
    state.counters["accounted_B_per_name"] = static_cast<double>(t->memory_bytes()) / kNames;
    state.counters["rss_B_per_name"] = static_cast<double>(rss1 - rss0) / kNames;
    state.counters["heap_B_per_name"] = static_cast<double>(heap1 - heap0) / kNames;
    state.counters["held"] = static_cast<double>(t->held());
  }
}
BENCHMARK(BM_MemoryPerHeldName_LeaseTable)->Iterations(1)->Unit(benchmark::kMillisecond);

void BM_MemoryPerHeldName_UnorderedMapBaseline(benchmark::State& state) {
  const std::vector<NameId>& ids = fixture().ids;
  const std::vector<Epoch>& epochs = fixture().epochs;
  for (auto _ : state) {
    const std::size_t rss0 = rss_bytes(), heap0 = heap_bytes();
    std::unique_ptr<MapTable> m = build_map(ids, epochs);
    const std::size_t rss1 = rss_bytes(), heap1 = heap_bytes();
    state.counters["rss_B_per_name"] = static_cast<double>(rss1 - rss0) / kNames;
    state.counters["heap_B_per_name"] = static_cast<double>(heap1 - heap0) / kNames;
    state.counters["held"] = static_cast<double>(m->size());
  }
}
BENCHMARK(BM_MemoryPerHeldName_UnorderedMapBaseline)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace leasehold

BENCHMARK_MAIN();
