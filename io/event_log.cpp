#include "leasehold/io/event_log.hpp"

#include "leasehold/lease/clock.hpp"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <ctime>

namespace leasehold {

namespace {

constexpr std::string_view kLevelKey = "level=";

std::int64_t realtime_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

/// `fields` without a leading `level=L ` (when L is a level), and that level.
std::string_view strip_level(std::string_view fields, std::optional<LogLevel>& level) noexcept {
  while (!fields.empty() && fields.front() == ' ') fields.remove_prefix(1);
  if (fields.substr(0, kLevelKey.size()) != kLevelKey) return fields;
  std::string_view rest = fields.substr(kLevelKey.size());
  const std::size_t end = rest.find(' ');
  level = parse_log_level(rest.substr(0, end));
  if (!level) return fields;
  rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  return rest;
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += esc;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

/// The index of the '"' that closes a quoted value starting at `from` (just after its opening
/// quote): the first unescaped '"' followed by the end or by ` key=`; failing that, the first one
/// followed by a space; failing that, the end. Producers do not always escape a quote inside a
/// value (an error message quoting a path), and such a quote must not end the value.
std::size_t closing_quote(std::string_view f, std::size_t from) {
  const std::size_t n = f.size();
  std::size_t loose = n;
  for (std::size_t i = from; i < n; ++i) {
    if (f[i] == '\\' && i + 1 < n) {
      ++i;
      continue;
    }
    if (f[i] != '"') continue;
    if (i + 1 == n) return i;
    if (f[i + 1] != ' ') continue;
    if (loose == n) loose = i;
    std::size_t j = i + 1;
    while (j < n && f[j] == ' ') ++j;
    const std::size_t key = j;
    while (j < n && (std::isalnum(static_cast<unsigned char>(f[j])) != 0 || f[j] == '_')) ++j;
    if (j > key && j < n && f[j] == '=') return i;
  }
  return loose;
}

/// Appends `fields` (logfmt) as `,"key":"value"` pairs; words without `=` are joined into "msg".
void append_json_fields(std::string& out, std::string_view fields) {
  std::string msg;
  std::string value;
  std::size_t i = 0;
  const std::size_t n = fields.size();
  while (i < n) {
    while (i < n && fields[i] == ' ') ++i;
    if (i >= n) break;
    const std::size_t word = i;
    while (i < n && fields[i] != ' ' && fields[i] != '=') ++i;
    if (i >= n || fields[i] == ' ' || i == word) {  // a bare word (or "=x")
      while (i < n && fields[i] != ' ') ++i;
      if (!msg.empty()) msg += ' ';
      msg.append(fields.substr(word, i - word));
      continue;
    }
    const std::string_view key = fields.substr(word, i - word);
    ++i;  // '='
    value.clear();
    if (i < n && fields[i] == '"') {
      ++i;
      const std::size_t close = closing_quote(fields, i);
      for (; i < close; ++i) {
        if (fields[i] == '\\' && i + 1 < close && (fields[i + 1] == '"' || fields[i + 1] == '\\')) ++i;
        value += fields[i];
      }
      i = close + 1;
    } else {
      const std::size_t start = i;
      while (i < n && fields[i] != ' ') ++i;
      value.assign(fields.substr(start, i - start));
    }
    out += ',';
    append_json_string(out, key);
    out += ':';
    append_json_string(out, value);
  }
  if (!msg.empty()) {
    out += ",\"msg\":";
    append_json_string(out, msg);
  }
}

}  // namespace

std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warn";
    case LogLevel::error: return "error";
  }
  return "info";
}

std::string_view to_string(LogFormat format) noexcept { return format == LogFormat::json ? "json" : "logfmt"; }

std::optional<LogLevel> parse_log_level(std::string_view text) noexcept {
  if (text == "debug") return LogLevel::debug;
  if (text == "info") return LogLevel::info;
  if (text == "warn" || text == "warning") return LogLevel::warn;
  if (text == "error") return LogLevel::error;
  return std::nullopt;
}

std::optional<LogFormat> parse_log_format(std::string_view text) noexcept {
  if (text == "logfmt") return LogFormat::logfmt;
  if (text == "json") return LogFormat::json;
  return std::nullopt;
}

std::string rfc3339_ms(std::int64_t wall_ns) {
  std::int64_t s = wall_ns / 1'000'000'000;
  std::int64_t rem = wall_ns % 1'000'000'000;
  if (rem < 0) {  // before 1970: floor, so the milliseconds stay within the second
    rem += 1'000'000'000;
    --s;
  }
  const std::time_t t = static_cast<std::time_t>(s);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[48];
  const std::size_t len = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + len, sizeof buf - len, ".%03dZ", static_cast<int>(rem / 1'000'000));
  return buf;
}

std::string quoted_value(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return out + "\"";
}

std::string logfmt_value(std::string_view text) {
  const bool bare = !text.empty() && std::none_of(text.begin(), text.end(), [](char c) {
    return c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
  });
  return bare ? std::string(text) : quoted_value(text);
}

LogLevel level_of(std::string_view fields, LogLevel fallback) noexcept {
  std::optional<LogLevel> level;
  strip_level(fields, level);
  return level.value_or(fallback);
}

void format_event(LogFormat format, LogLevel level, std::int64_t boot_ns, std::int64_t wall_ns,
                  std::string_view fields, std::string& out) {
  std::optional<LogLevel> own;
  fields = strip_level(fields, own);
  while (!fields.empty() && (fields.back() == '\n' || fields.back() == ' ')) fields.remove_suffix(1);
  const LogLevel lv = own.value_or(level);
  const std::string time = rfc3339_ms(wall_ns);
  char boot[24];
  std::snprintf(boot, sizeof boot, "%" PRId64, boot_ns);
  if (format == LogFormat::json) {
    out += "{\"time\":\"";
    out += time;
    out += "\",\"ts_boot_ns\":";
    out += boot;
    out += ",\"level\":\"";
    out += to_string(lv);
    out += '"';
    append_json_fields(out, fields);
    out += "}\n";
    return;
  }
  out += "time=";
  out += time;
  out += " ts_boot_ns=";
  out += boot;
  out += " level=";
  out += to_string(lv);
  if (!fields.empty()) {
    out += ' ';
    const std::size_t at = out.size();
    out.append(fields);
    for (std::size_t i = at; i < out.size(); ++i)
      if (out[i] == '\n' || out[i] == '\r') out[i] = ' ';  // one event, one line
  }
  out += '\n';
}

bool EventLog::emit(std::int64_t boot_ns, std::string_view fields) {
  if (!enabled(level_of(fields))) return true;
  thread_local std::string line;
  line.clear();
  const std::int64_t wall_ns = realtime_ns() + (boot_ns - boottime_ns());
  format_event(format(), LogLevel::info, boot_ns, wall_ns, fields, line);
  return sink_.write(line);
}

bool EventLog::emit_lines(std::string_view text) {
  constexpr std::string_view kStamp = "ts_boot_ns=";
  thread_local std::string lines;
  lines.clear();
  // One offset between the two clocks for the whole batch.
  const std::int64_t boot_now = boottime_ns();
  const std::int64_t offset_ns = realtime_ns() - boot_now;
  const LogFormat fmt = format();
  while (!text.empty()) {
    const std::size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    if (line.empty()) continue;
    std::int64_t boot_ns = boot_now;
    if (line.substr(0, kStamp.size()) == kStamp) {
      line.remove_prefix(kStamp.size());
      std::int64_t v = 0;
      std::size_t i = 0;
      while (i < line.size() && line[i] >= '0' && line[i] <= '9') v = v * 10 + (line[i++] - '0');
      if (i > 0) boot_ns = v;
      line.remove_prefix(i);
    }
    if (!enabled(level_of(line))) continue;
    format_event(fmt, LogLevel::info, boot_ns, boot_ns + offset_ns, line, lines);
  }
  return sink_.write(lines);
}

EventLog& daemon_log() {
  static EventLog log(stderr_log());
  return log;
}

}  // namespace leasehold
