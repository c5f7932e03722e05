#include "leasehold/metrics/exposition.hpp"

#include "leasehold/lease/assert.hpp"

#include <unordered_map>

namespace leasehold::metrics {
namespace {

/// # HELP text: a backslash and a line feed are escaped (the format's rule).
void append_help(std::string& out, std::string_view help) {
  for (const char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
}

/// A label value: a backslash, a double quote and a line feed are escaped.
void append_label_value(std::string& out, std::string_view v) {
  for (const char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
}

void append_header(std::string& out, const std::string& family, std::string_view help, const char* type) {
  if (!help.empty()) {
    out += "# HELP ";
    out += family;
    out += ' ';
    append_help(out, help);
    out += '\n';
  }
  out += "# TYPE ";
  out += family;
  out += ' ';
  out += type;
  out += '\n';
}

}  // namespace

std::string decimal(std::uint64_t value, std::uint64_t scale) {
  LEASEHOLD_ASSERT(scale >= 1);
  std::string out = std::to_string(value / scale);
  if (scale == 1) return out;
  int digits = 0;
  for (std::uint64_t s = scale; s > 1; s /= 10) {
    LEASEHOLD_ASSERT(s % 10 == 0);  // a power of ten
    ++digits;
  }
  std::uint64_t frac = value % scale;
  if (frac == 0) return out;
  std::string f = std::to_string(frac);
  f.insert(0, static_cast<std::size_t>(digits) - f.size(), '0');  // frac < scale: at most `digits` digits
  while (!f.empty() && f.back() == '0') f.pop_back();
  return out + "." + f;
}

std::string format_text(std::string_view prefix, const Snapshot& snap) {
  // Families in the order they first appear; each one's series together (the format wants a
  // family's lines in one block).
  std::vector<std::vector<const Sample*>> families;
  std::unordered_map<std::string_view, std::size_t> index;
  for (const Sample& s : snap.samples) {
    const auto [it, fresh] = index.try_emplace(s.name, families.size());
    if (fresh) families.emplace_back();
    families[it->second].push_back(&s);
  }
  std::string out;
  out.reserve(64 * snap.samples.size() + 4096 * snap.histograms.size());
  for (const auto& family : families) {
    const Sample& first = *family.front();
    const bool counter = first.kind == Kind::counter;
    const std::string name = std::string(prefix) + std::string(first.name) + (counter ? "_total" : "");
    append_header(out, name, first.help, counter ? "counter" : "gauge");
    for (const Sample* s : family) {
      LEASEHOLD_ASSERT(s->kind == first.kind);  // one family, one type
      out += name;
      if (!s->reason.empty()) {
        out += "{reason=\"";
        append_label_value(out, s->reason);
        out += "\"}";
      }
      out += ' ';
      out += decimal(s->value, s->scale);
      out += '\n';
    }
  }
  for (const HistogramSample& h : snap.histograms) {
    const std::string name = std::string(prefix) + std::string(h.name);
    append_header(out, name, h.help, "histogram");
    std::uint64_t cumulative = 0;
    for (std::size_t b = 0; b < kLog2Buckets; ++b) {
      cumulative += h.buckets[b];
      out += name;
      out += "_bucket{le=\"";
      out += b + 1 < kLog2Buckets ? decimal((std::uint64_t{1} << b) - 1, h.scale) : std::string("+Inf");
      out += "\"} ";
      out += std::to_string(cumulative);
      out += '\n';
    }
    out += name + "_sum " + decimal(h.sum, h.scale) + "\n";
    out += name + "_count " + std::to_string(cumulative) + "\n";
  }
  return out;
}

}  // namespace leasehold::metrics
