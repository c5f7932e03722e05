// shm epoch table benchmarks (DESIGN.md "The shared-memory epoch table"; issue targets):
//   check            vs a bare std::atomic<uint64_t>::load(acquire) of the same word  (<= 1.5x)
//   check            while another thread extends/publishes the same slot ~1M/s      (ns/check)
//   check_deadline   vs the clock read alone (boottime_ns, CLOCK_BOOTTIME)           (<= 1.3x)
//   snapshot of 100,000 slots (what `leasehold dump` does)                           (ms)
// Ratios are printed at the end, from the runs of this process.
#include "leasehold/shm/table.hpp"

#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unistd.h>

namespace {

using namespace leasehold;
using namespace leasehold::shm;

constexpr Epoch kEpoch = 4242;

struct Fixture {
  explicit Fixture(std::uint32_t slots) {
    TableOptions o;
    o.location = "lh-bench-" + std::to_string(::getpid()) + "-" + std::to_string(slots);
    o.slot_count = slots;
    o.liveness_timeout_ns = kLivenessTimeoutMaxNs;  // check_deadline beats first (see below)
    writer.emplace(TableWriter::create(o));
    const std::uint64_t now = boottime_ns();
    for (std::uint32_t i = 0; i < slots; ++i) {
      const ClaimedSlot c = writer->claim(SandboxId{i + 1ULL, i + 7ULL}, now).value();
      writer->publish(c.slot, NameId{i + 1ULL, 1}, "bench-name", kEpoch, now + 3'600'000'000'000ULL);
    }
    reader.emplace(TableReader::open(o.location));
  }
  ~Fixture() {
    writer->remove();
  }
  std::optional<TableWriter> writer;
  std::optional<TableReader> reader;
};

Fixture& small() {
  static Fixture f(64);
  return f;
}

void BM_BareAtomicLoad(benchmark::State& state) {
  const Slot& s = *small().reader->slot(3);
  for (auto _ : state) {
    std::uint64_t v = s.check_word.load(std::memory_order_acquire);
    benchmark::DoNotOptimize(v);
  }
}
BENCHMARK(BM_BareAtomicLoad);

void BM_Check(benchmark::State& state) {
  const Slot& s = *small().reader->slot(3);
  Epoch opaque = kEpoch;
  benchmark::DoNotOptimize(opaque);
  const Epoch e = opaque;  // a runtime's epoch: fixed, in a register, unknown to the compiler
  if (!TableReader::check(s, e)) state.SkipWithError("check failed on a valid slot");
  for (auto _ : state) {
    bool v = TableReader::check(s, e);
    benchmark::DoNotOptimize(v);
  }
}
BENCHMARK(BM_Check);

void BM_LeaseCheckValid(benchmark::State& state) {
  Epoch opaque = kEpoch;
  benchmark::DoNotOptimize(opaque);
  const LeaseCheck lease = small().reader->lease(3, opaque);
  if (!lease.valid()) state.SkipWithError("lease check failed on a valid slot");
  for (auto _ : state) {
    bool v = lease.valid();
    benchmark::DoNotOptimize(v);
  }
}
BENCHMARK(BM_LeaseCheckValid);

void BM_CheckWhileWriterExtends(benchmark::State& state) {
  Fixture& f = small();
  const std::uint32_t slot = 5;
  const Slot& s = *f.reader->slot(slot);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> ops{0};
  // ~1M writes/s: an extend every microsecond, a publish (same epoch) every 16th.
  std::thread writer([&] {
    const auto start = std::chrono::steady_clock::now();
    std::uint64_t n = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const auto due = start + std::chrono::microseconds(n);
      while (std::chrono::steady_clock::now() < due) {
      }
      const std::uint64_t until = boottime_ns() + 3'600'000'000'000ULL;
      if (n % 16 == 0) f.writer->publish(slot, NameId{9, 9}, "bench-name", kEpoch, until);
      else f.writer->extend(slot, until);
      ++n;
      ops.store(n, std::memory_order_relaxed);
    }
  });
  Epoch opaque = kEpoch;
  benchmark::DoNotOptimize(opaque);
  const Epoch e = opaque;
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t ops0 = ops.load();
  for (auto _ : state) {
    bool v = TableReader::check(s, e);
    benchmark::DoNotOptimize(v);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::uint64_t ops1 = ops.load();
  stop.store(true);
  writer.join();
  state.counters["writes_per_s"] = static_cast<double>(ops1 - ops0) / secs;
}
BENCHMARK(BM_CheckWhileWriterExtends)->UseRealTime();

void BM_ClockGettimeBoottime(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(boottime_ns());
}
BENCHMARK(BM_ClockGettimeBoottime);

void BM_CheckDeadline(benchmark::State& state) {
  const TableReader& r = *small().reader;
  small().writer->heartbeat(boottime_ns());
  Epoch opaque = kEpoch;
  benchmark::DoNotOptimize(opaque);
  const Epoch e = opaque;
  if (!r.check_deadline(3, e)) state.SkipWithError("check_deadline failed on a valid slot");
  for (auto _ : state) {
    bool v = r.check_deadline(3, e);
    benchmark::DoNotOptimize(v);
  }
}
BENCHMARK(BM_CheckDeadline);

void BM_Snapshot100kSlots(benchmark::State& state) {
  static Fixture f(100'000);
  const TableReader& r = *f.reader;
  SlotSnapshot s;
  for (auto _ : state) {
    std::uint64_t published = 0;
    for (std::uint32_t i = 0; i < r.slot_count(); ++i)
      if (r.snapshot(i, s) == TableErrc::ok && s.state == SlotState::published) ++published;
    benchmark::DoNotOptimize(published);
    if (published != 100'000) state.SkipWithError("snapshot lost slots");
  }
}
BENCHMARK(BM_Snapshot100kSlots)->Unit(benchmark::kMillisecond);

// Remembers each run's per-iteration real time so main() can print the ratios.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    // Single runs are stored by name; with --benchmark_repetitions the median wins.
    for (const auto& r : runs) {
      const double t = r.GetAdjustedRealTime() * unit_to_ns(r.time_unit);
      if (r.run_type == Run::RT_Iteration && !median_.count(r.run_name.str())) ns_[r.run_name.str()] = t;
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name == "median") {
        ns_[r.run_name.str()] = t;
        median_[r.run_name.str()] = true;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  double ns(const std::string& name) const {
    const auto it = ns_.find(name);
    return it == ns_.end() ? 0.0 : it->second;
  }

 private:
  static double unit_to_ns(benchmark::TimeUnit u) {
    switch (u) {
      case benchmark::kNanosecond: return 1.0;
      case benchmark::kMicrosecond: return 1e3;
      case benchmark::kMillisecond: return 1e6;
      case benchmark::kSecond: return 1e9;
    }
    return 1.0;
  }
  std::map<std::string, double> ns_;
  std::map<std::string, bool> median_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  RatioReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  const double bare = rep.ns("BM_BareAtomicLoad"), check = rep.ns("BM_Check");
  const double clk = rep.ns("BM_ClockGettimeBoottime"), dl = rep.ns("BM_CheckDeadline");
  const double lease = rep.ns("BM_LeaseCheckValid");
  std::printf("\nratios (same run):\n");
  if (bare > 0 && check > 0)
    std::printf("  check / bare atomic load          = %.2f  (target <= 1.5)  [%.2f ns vs %.2f ns]\n",
                check / bare, check, bare);
  if (bare > 0 && lease > 0)
    std::printf("  LeaseCheck::valid / bare load     = %.2f  (target <= 1.5)  [%.2f ns vs %.2f ns]\n",
                lease / bare, lease, bare);
  if (clk > 0 && dl > 0)
    std::printf("  check_deadline / clock_gettime    = %.2f  (target <= 1.3)  [%.2f ns vs %.2f ns]\n",
                dl / clk, dl, clk);
  const double contended = rep.ns("BM_CheckWhileWriterExtends/real_time");
  if (contended > 0) std::printf("  check with a 1M/s writer          = %.2f ns\n", contended);
  const double snap = rep.ns("BM_Snapshot100kSlots");
  if (snap > 0) std::printf("  snapshot of 100,000 slots         = %.2f ms\n", snap / 1e6);
  benchmark::Shutdown();
  return 0;
}
