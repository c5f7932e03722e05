// leasehold/perf/common: the summary every perf/<module> benchmark prints at the end of a run —
// each variant's result next to its baseline measured in the same run, and their ratio.
//
// What it is for: a `--benchmark_filter` (or a benchmark that skipped with an error) leaves some
// results out of a run. A ratio with a missing side must not read as 0.0 ns or 0.00x, so a row
// is printed only when every value in it was measured; a table with no such row prints nothing.
//
// Pure text (no Google Benchmark here), header-only: ratio_report.hpp feeds it from a reporter,
// and tests/perf/ratio_table_test.cpp checks it directly.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace leasehold::perf {

/// Bounds: rows per table and columns per row (a summary is read by a person).
inline constexpr std::size_t kRatioRowsMax = 256;
inline constexpr std::size_t kRatioColumnsMax = 16;

/// The results of one run: items per second per benchmark, keyed "BM_Name" or "BM_Name/args"
/// (Google Benchmark's function name and arguments; no min_time, repetitions or threads).
class RunResults {
 public:
  /// Records a result (items per second, > 0; anything else is ignored).
  void set(std::string name, double items_per_second) {
    if (items_per_second > 0) rate_[std::move(name)] = items_per_second;
  }
  /// Items per second of a benchmark that ran; nullopt if it did not (filtered out, skipped).
  std::optional<double> items_per_second(std::string_view name) const {
    const auto it = rate_.find(std::string(name));
    if (it == rate_.end()) return std::nullopt;
    return it->second;
  }
  /// ns per item (1e9 / items per second) of a benchmark that ran.
  std::optional<double> ns_per_item(std::string_view name) const {
    const auto r = items_per_second(name);
    if (!r) return std::nullopt;
    return 1e9 / *r;
  }
  bool empty() const { return rate_.empty(); }

 private:
  std::map<std::string, double> rate_;
};

/// a / b when both were measured and b > 0.
inline std::optional<double> ratio(std::optional<double> a, std::optional<double> b) {
  if (!a || !b || !(*b > 0)) return std::nullopt;
  return *a / *b;
}

/// A column: its title, the digits after the point, and a suffix written after each value
/// ("x" for a ratio, "/s" for a rate, "" for a plain number).
struct RatioColumn {
  std::string title;
  int decimals = 1;
  std::string suffix;
};

/// A summary table: a title line, a header, then the rows whose every value was measured.
class RatioTable {
 public:
  RatioTable(std::string title, std::string label_title, std::vector<RatioColumn> columns)
      : title_(std::move(title)), label_title_(std::move(label_title)), columns_(std::move(columns)) {
    if (columns_.size() > kRatioColumnsMax) columns_.resize(kRatioColumnsMax);
  }
  /// Adds a row; it is kept only when it has one value per column and all of them are present.
  /// Returns whether it was kept.
  bool row(std::string label, std::vector<std::optional<double>> values) {
    if (values.size() != columns_.size() || rows_.size() == kRatioRowsMax) return false;
    if (std::any_of(values.begin(), values.end(), [](const auto& v) { return !v.has_value(); })) return false;
    std::vector<std::string> cells;
    for (std::size_t c = 0; c < values.size(); ++c) {
      char b[64];
      std::snprintf(b, sizeof b, "%.*f", columns_[c].decimals, *values[c]);
      cells.push_back(b + columns_[c].suffix);
    }
    rows_.emplace_back(std::move(label), std::move(cells));
    return true;
  }
  std::size_t rows() const { return rows_.size(); }
  /// The table as text: "" when no row was kept. The label column is left-aligned, the values
  /// right-aligned, columns two spaces apart.
  std::string str() const {
    if (rows_.empty()) return "";
    std::size_t label_w = label_title_.size();
    std::vector<std::size_t> w;
    for (const auto& c : columns_) w.push_back(c.title.size());
    for (const auto& [label, cells] : rows_) {
      label_w = std::max(label_w, label.size());
      for (std::size_t c = 0; c < cells.size(); ++c) w[c] = std::max(w[c], cells[c].size());
    }
    auto line = [&](const std::string& label, auto cell) {
      std::string s = label + std::string(label_w - label.size(), ' ');
      for (std::size_t c = 0; c < w.size(); ++c) {
        const std::string text = cell(c);
        s += "  " + std::string(w[c] - text.size(), ' ') + text;
      }
      return s + "\n";
    };
    std::string out = title_ + "\n";
    out += line(label_title_, [&](std::size_t c) { return columns_[c].title; });
    for (const auto& [label, cells] : rows_) out += line(label, [&](std::size_t c) { return cells[c]; });
    return out;
  }

 private:
  std::string title_, label_title_;
  std::vector<RatioColumn> columns_;
  std::vector<std::pair<std::string, std::vector<std::string>>> rows_;
};

}  // namespace leasehold::perf
