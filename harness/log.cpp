// leasehold/harness: structured log lines as fields (include/leasehold/harness/log.hpp).
#include "leasehold/harness/log.hpp"

namespace leasehold::harness {

LogFields parse_log_line(std::string_view line) {
  LogFields kv;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n')) ++i;
    std::size_t e = i;
    while (e < line.size() && !(line[e] == ' ' || line[e] == '\t' || line[e] == '\r' || line[e] == '\n')) ++e;
    const std::string_view word = line.substr(i, e - i);
    if (const auto eq = word.find('='); eq != std::string_view::npos && eq > 0)
      kv[std::string(word.substr(0, eq))] = std::string(word.substr(eq + 1));
    i = e;
  }
  return kv;
}

std::vector<LogFields> log_events(std::string_view text, std::string_view event) {
  std::vector<LogFields> out;
  std::size_t b = 0;
  while (b < text.size()) {
    auto e = text.find('\n', b);
    if (e == std::string_view::npos) e = text.size();
    LogFields kv = parse_log_line(text.substr(b, e - b));
    if (const auto it = kv.find("event"); it != kv.end() && it->second == event) out.push_back(std::move(kv));
    b = e + 1;
  }
  return out;
}

}  // namespace leasehold::harness
