// leasehold CLI: the one plain-text column formatter every listing uses - tables with a header
// row (`names`, `sandboxes`, `audit`, the demo's audit) and key/value lists (`show`, `run`).
//
// Cells are left-aligned; each column is as wide as its widest cell (or a minimum), columns are
// separated by two spaces, and the last cell of a row is never padded, so lines carry no
// trailing blanks. Bounded by what the caller adds; no terminal control codes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace leasehold::cli {

class Table {
 public:
  /// `header`: the first row (none if empty).
  explicit Table(std::vector<std::string> header = {}) {
    if (!header.empty()) rows_.push_back(std::move(header));
  }
  /// Spaces before every line.
  Table& indent(std::size_t spaces) {
    indent_ = spaces;
    return *this;
  }
  /// Column `column` is at least `width` characters wide (so a list keeps its layout whether
  /// or not its widest optional row is present).
  Table& min_width(std::size_t column, std::size_t width) {
    if (min_width_.size() <= column) min_width_.resize(column + 1, 0);
    min_width_[column] = width;
    return *this;
  }
  Table& add(std::vector<std::string> row) {
    rows_.push_back(std::move(row));
    return *this;
  }
  /// Every row, one line each ("\n"-terminated).
  std::string str() const {
    std::vector<std::size_t> width = min_width_;
    for (const auto& r : rows_) {
      if (width.size() < r.size()) width.resize(r.size(), 0);
      for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
    }
    std::string out;
    for (const auto& r : rows_) {
      out.append(indent_, ' ');
      for (std::size_t i = 0; i < r.size(); ++i) {
        out += r[i];
        if (i + 1 < r.size()) out.append(width[i] - r[i].size() + kColumnGap, ' ');
      }
      out += '\n';
    }
    return out;
  }

 private:
  static constexpr std::size_t kColumnGap = 2;
  std::vector<std::vector<std::string>> rows_;
  std::vector<std::size_t> min_width_;
  std::size_t indent_ = 0;
};

/// A table with a header row, then `rows`.
inline std::string format_table(std::vector<std::string> header, const std::vector<std::vector<std::string>>& rows) {
  Table t(std::move(header));
  for (const auto& r : rows) t.add(r);
  return t.str();
}

}  // namespace leasehold::cli
