// leasehold/perf/common: the Google Benchmark side of the ratio summary (ratio_table.hpp) that
// perf/wheel, perf/loop and perf/wire print at the end of a run: a console reporter that keeps
// every benchmark's items per second, and the main() they share.
//
// Results: items_per_second of each benchmark that ran and did not skip with an error, keyed
// "BM_Name/args". With --benchmark_repetitions the median aggregate is the result (the other
// aggregates and the single repetitions are ignored once a median is seen).
#pragma once

#include "perf/common/ratio_table.hpp"

#include <benchmark/benchmark.h>

#include <functional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace leasehold::perf {

/// Console output as usual; at the end, `summary` turns the run's results into text (its ratio
/// tables), printed after the console output.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  using Summary = std::function<std::string(const RunResults&)>;
  explicit RatioReporter(Summary summary) : summary_(std::move(summary)) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (r.error_occurred) continue;
      const bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (r.run_type == Run::RT_Aggregate && !median) continue;
      const auto it = r.counters.find("items_per_second");
      if (it == r.counters.end()) continue;
      std::string name = r.run_name.function_name;
      if (!r.run_name.args.empty()) name += "/" + r.run_name.args;
      if (!median && medians_.count(name) != 0) continue;
      if (median) medians_.insert(name);
      results_.set(std::move(name), it->second.value);
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    const std::string text = summary_ ? summary_(results_) : std::string();
    std::ostream& out = GetOutputStream();
    if (text.empty()) {
      out << "\n(no ratio to print: a ratio needs both of its benchmarks in the run; see --benchmark_filter)\n";
    } else {
      out << "\n" << text;
    }
    out.flush();
  }

  const RunResults& results() const { return results_; }

 private:
  Summary summary_;
  RunResults results_;
  std::set<std::string> medians_;
};

/// The tables of a summary, one blank line apart, skipping empty ones; `note` follows when at
/// least one table was printed.
inline std::string join_tables(const std::vector<RatioTable>& tables, const std::string& note = "") {
  std::string out;
  for (const auto& t : tables) {
    const std::string s = t.str();
    if (s.empty()) continue;
    out += (out.empty() ? "" : "\n") + s;
  }
  if (!out.empty() && !note.empty()) out += note + "\n";
  return out;
}

/// main() of a perf benchmark: Google Benchmark's flags, the run with a RatioReporter, shutdown.
inline int run_with_ratios(int argc, char** argv, RatioReporter::Summary summary) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter(std::move(summary));
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

}  // namespace leasehold::perf
