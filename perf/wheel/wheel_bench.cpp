// Deadline wheel benchmark: schedule, cancel, advance and re-arm with 1,000,000 live timers,
// next to std::priority_queue (cancel = lazy deletion by generation, the usual way a heap cancels)
// and std::multimap (cancel = erase by stored iterator) measured in the same run. At the end it
// prints each baseline's time per operation as a ratio of the wheel's.
//
// Workload: deadlines uniform over a 60 s horizon (typical lease TTLs are seconds), 1 ms
// granularity; `advance` walks the horizon in 1 ms steps, like the rt thread's tick loop.
#include "perf/common/ratio_report.hpp"
#include "leasehold/supervisor/deadline_wheel.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace {

using leasehold::DeadlineWheel;
using leasehold::DueTimer;
using leasehold::Rearm;
using leasehold::TimerHandle;

// The sizes: issue 9's 1,000,000 timers, and 10,000 (issue 6's sandboxes per supervisor).
constexpr std::uint32_t kTimers = 1'000'000;
constexpr std::uint32_t kTimersTypical = 10'000;
constexpr std::uint64_t kGranularityNs = 1'000'000;
constexpr std::uint64_t kHorizonNs = 60'000'000'000;
constexpr std::uint64_t kStartNs = 1'000'000'000'000;

const std::vector<std::uint64_t>& deadlines() {
  static const std::vector<std::uint64_t> d = [] {
    std::mt19937_64 rng(20261130);
    std::vector<std::uint64_t> v(kTimers);
    for (auto& x : v) x = kStartNs + kGranularityNs + rng() % kHorizonNs;
    return v;
  }();
  return d;
}

// A random permutation of 0..n-1 (cached per n).
const std::vector<std::uint32_t>& shuffled_ids(std::uint32_t n) {
  static std::map<std::uint32_t, std::vector<std::uint32_t>> cache;
  auto& v = cache[n];
  if (v.empty()) {
    v.resize(n);
    for (std::uint32_t i = 0; i < n; ++i) v[i] = i;
    std::shuffle(v.begin(), v.end(), std::mt19937_64(7));
  }
  return v;
}

// ---- the baselines ---------------------------------------------------------------------------

struct HeapEntry {
  std::uint64_t deadline_ns;
  std::uint32_t id;
  std::uint32_t generation;
  bool operator>(const HeapEntry& o) const { return deadline_ns > o.deadline_ns; }
};
using Heap = std::priority_queue<HeapEntry, std::vector<HeapEntry>, std::greater<HeapEntry>>;

struct HeapTimers {
  Heap heap;
  std::vector<std::uint32_t> generation = std::vector<std::uint32_t>(kTimers, 0);
  void reset() {
    std::vector<HeapEntry> storage;
    storage.reserve(2 * kTimers);
    heap = Heap(std::greater<HeapEntry>(), std::move(storage));
    for (auto& g : generation) ++g;
  }
  void schedule(std::uint32_t id, std::uint64_t d) { heap.push({d, id, generation[id]}); }
  void cancel(std::uint32_t id) { ++generation[id]; }
  template <class F>
  void advance(std::uint64_t now, F&& f) {
    while (!heap.empty() && heap.top().deadline_ns / kGranularityNs <= now / kGranularityNs) {
      const HeapEntry e = heap.top();
      heap.pop();
      if (e.generation == generation[e.id]) f(e.id);
    }
  }
};

struct MapTimers {
  std::multimap<std::uint64_t, std::uint32_t> map;
  std::vector<std::multimap<std::uint64_t, std::uint32_t>::iterator> where =
      std::vector<std::multimap<std::uint64_t, std::uint32_t>::iterator>(kTimers);
  void schedule(std::uint32_t id, std::uint64_t d) { where[id] = map.emplace(d, id); }
  void cancel(std::uint32_t id) { map.erase(where[id]); }
  template <class F>
  void advance(std::uint64_t now, F&& f) {
    while (!map.empty() && map.begin()->first / kGranularityNs <= now / kGranularityNs) {
      const std::uint32_t id = map.begin()->second;
      map.erase(map.begin());
      f(id);
    }
  }
};

// ---- schedule --------------------------------------------------------------------------------

void BM_Schedule_Wheel(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  DeadlineWheel w(n, kGranularityNs, kStartNs);
  const auto& d = deadlines();
  for (auto _ : state) {
    state.PauseTiming();
    w.clear();
    state.ResumeTiming();
    for (std::uint32_t i = 0; i < n; ++i) benchmark::DoNotOptimize(w.schedule(d[i], i));
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_Schedule_PriorityQueue(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  HeapTimers h;
  const auto& d = deadlines();
  for (auto _ : state) {
    state.PauseTiming();
    h.reset();
    state.ResumeTiming();
    for (std::uint32_t i = 0; i < n; ++i) h.schedule(i, d[i]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_Schedule_Multimap(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  const auto& d = deadlines();
  for (auto _ : state) {
    state.PauseTiming();
    auto m = std::make_unique<MapTimers>();
    state.ResumeTiming();
    for (std::uint32_t i = 0; i < n; ++i) m->schedule(i, d[i]);
    benchmark::ClobberMemory();
    state.PauseTiming();
    m.reset();  // freeing a million nodes is not part of scheduling
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// ---- cancel (every timer, in random order) ---------------------------------------------------

void BM_Cancel_Wheel(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  DeadlineWheel w(n, kGranularityNs, kStartNs);
  std::vector<TimerHandle> handles(n);
  const auto& d = deadlines();
  const auto& ids = shuffled_ids(n);
  for (auto _ : state) {
    state.PauseTiming();
    w.clear();
    for (std::uint32_t i = 0; i < n; ++i) handles[i] = w.schedule(d[i], i).handle;
    state.ResumeTiming();
    for (std::uint32_t id : ids) benchmark::DoNotOptimize(w.cancel(handles[id]));
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_Cancel_PriorityQueue(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  HeapTimers h;
  const auto& d = deadlines();
  const auto& ids = shuffled_ids(n);
  for (auto _ : state) {
    state.PauseTiming();
    h.reset();
    for (std::uint32_t i = 0; i < n; ++i) h.schedule(i, d[i]);
    state.ResumeTiming();
    for (std::uint32_t id : ids) h.cancel(id);  // lazy: the dead entry is popped later
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_Cancel_Multimap(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  const auto& d = deadlines();
  const auto& ids = shuffled_ids(n);
  for (auto _ : state) {
    state.PauseTiming();
    auto m = std::make_unique<MapTimers>();
    for (std::uint32_t i = 0; i < n; ++i) m->schedule(i, d[i]);
    state.ResumeTiming();
    for (std::uint32_t id : ids) m->cancel(id);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// ---- advance (fire all 1M timers, 1 ms steps across the horizon) ----------------------------

void BM_Advance_Wheel(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  const auto& d = deadlines();
  std::uint64_t fired = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto w = std::make_unique<DeadlineWheel>(n, kGranularityNs, kStartNs);  // clock at kStartNs
    for (std::uint32_t i = 0; i < n; ++i) w->schedule(d[i], i);
    state.ResumeTiming();
    for (std::uint64_t now = kStartNs; now <= kStartNs + kHorizonNs + kGranularityNs; now += kGranularityNs) {
      w->advance(now, [&](const DueTimer&) { ++fired; return Rearm::none(); });
    }
  }
  if (fired != static_cast<std::uint64_t>(state.iterations()) * n) state.SkipWithError("wheel fired the wrong count");
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_Advance_PriorityQueue(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  HeapTimers h;
  const auto& d = deadlines();
  std::uint64_t fired = 0;
  for (auto _ : state) {
    state.PauseTiming();
    h.reset();
    for (std::uint32_t i = 0; i < n; ++i) h.schedule(i, d[i]);
    state.ResumeTiming();
    for (std::uint64_t now = kStartNs; now <= kStartNs + kHorizonNs + kGranularityNs; now += kGranularityNs) {
      h.advance(now, [&](std::uint32_t) { ++fired; });
    }
  }
  if (fired != static_cast<std::uint64_t>(state.iterations()) * n) state.SkipWithError("heap fired the wrong count");
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_Advance_Multimap(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  const auto& d = deadlines();
  std::uint64_t fired = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto m = std::make_unique<MapTimers>();
    for (std::uint32_t i = 0; i < n; ++i) m->schedule(i, d[i]);
    state.ResumeTiming();
    for (std::uint64_t now = kStartNs; now <= kStartNs + kHorizonNs + kGranularityNs; now += kGranularityNs) {
      m->advance(now, [&](std::uint32_t) { ++fired; });
    }
  }
  if (fired != static_cast<std::uint64_t>(state.iterations()) * n) state.SkipWithError("multimap fired the wrong count");
  state.SetItemsProcessed(state.iterations() * n);
}

// ---- re-arm: move one of 1M live timers to a later deadline (a refreshed lease) -------------

void BM_Rearm_Wheel(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  DeadlineWheel w(n, kGranularityNs, kStartNs);
  std::vector<TimerHandle> handles(n);
  const auto& d = deadlines();
  const auto& ids = shuffled_ids(n);
  for (std::uint32_t i = 0; i < n; ++i) handles[i] = w.schedule(d[i], i).handle;
  std::uint64_t shift = 0;
  for (auto _ : state) {
    shift += kGranularityNs;
    for (std::uint32_t k = 0; k < n; ++k) {
      const std::uint32_t id = ids[k];
      benchmark::DoNotOptimize(w.reschedule(handles[id], d[id] + shift));
    }
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_Rearm_PriorityQueue(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  HeapTimers h;
  h.reset();
  const auto& d = deadlines();
  const auto& ids = shuffled_ids(n);
  for (std::uint32_t i = 0; i < n; ++i) h.schedule(i, d[i]);
  std::uint64_t shift = 0;
  for (auto _ : state) {
    state.PauseTiming();
    h.reset();  // keep the heap at 1M live entries (lazy cancel would grow it without bound)
    for (std::uint32_t i = 0; i < n; ++i) h.schedule(i, d[i]);
    state.ResumeTiming();
    shift += kGranularityNs;
    for (std::uint32_t k = 0; k < n; ++k) {
      const std::uint32_t id = ids[k];
      h.cancel(id);
      h.schedule(id, d[id] + shift);
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_Rearm_Multimap(benchmark::State& state) {
  const std::uint32_t n = static_cast<std::uint32_t>(state.range(0));
  auto m = std::make_unique<MapTimers>();
  const auto& d = deadlines();
  const auto& ids = shuffled_ids(n);
  for (std::uint32_t i = 0; i < n; ++i) m->schedule(i, d[i]);
  std::uint64_t shift = 0;
  for (auto _ : state) {
    shift += kGranularityNs;
    for (std::uint32_t k = 0; k < n; ++k) {
      const std::uint32_t id = ids[k];
      auto node = m->map.extract(m->where[id]);  // node reuse: the fairest multimap re-arm
      if (node.empty()) continue;
      node.key() = d[id] + shift;
      m->where[id] = m->map.insert(std::move(node));
    }
  }
  state.SetItemsProcessed(state.iterations() * n);
}

BENCHMARK(BM_Schedule_Wheel)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_Schedule_PriorityQueue)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_Schedule_Multimap)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_Cancel_Wheel)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_Cancel_PriorityQueue)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_Cancel_Multimap)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_Advance_Wheel)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_Advance_PriorityQueue)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_Advance_Multimap)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_Rearm_Wheel)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_Rearm_PriorityQueue)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_Rearm_Multimap)->Arg(kTimersTypical)->Arg(kTimers)->Unit(benchmark::kMicrosecond)->MinTime(0.5);

// At the end: ns per timer operation of the wheel and of each baseline, and the ratio
// baseline / wheel, for every pair that ran (perf/common/ratio_report.hpp).
std::string summary(const leasehold::perf::RunResults& r) {
  using leasehold::perf::RatioTable;
  std::vector<RatioTable> tables;
  for (std::uint32_t n : {kTimersTypical, kTimers}) {
    RatioTable t("ns per timer operation with " + std::to_string(n) + " timers; ratio = baseline / wheel (> 1: wheel faster)",
                 "operation", {{"wheel", 1, ""}, {"baseline", 1, ""}, {"ratio", 2, "x"}});
    const std::string size = "/" + std::to_string(n);
    for (const char* op : {"Schedule", "Cancel", "Advance", "Rearm"}) {
      const auto w = r.ns_per_item(std::string("BM_") + op + "_Wheel" + size);
      for (const char* base : {"PriorityQueue", "Multimap"}) {
        const auto b = r.ns_per_item(std::string("BM_") + op + "_" + base + size);
        t.row(std::string(op) + " vs " + (base == std::string("Multimap") ? "multimap" : "priority_queue"),
              {w, b, leasehold::perf::ratio(b, w)});
      }
    }
    tables.push_back(std::move(t));
  }
  return leasehold::perf::join_tables(tables, "(priority_queue cancel is lazy deletion: its cost is paid by later pops)");
}

}  // namespace

int main(int argc, char** argv) { return leasehold::perf::run_with_ratios(argc, argv, summary); }
