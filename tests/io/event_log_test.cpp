// The daemons' event log (io/event_log.hpp): one line format for lockd and the supervisor,
// logfmt or JSON, each line with the wall clock, the boot-clock stamp and a level; events below
// the configured level are skipped, and the level can change while lines are being written.
#include "leasehold/io/event_log.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

namespace leasehold {
namespace {

// 2025-05-01T10:00:00.123Z, in ns since the epoch.
constexpr std::int64_t kWallNs = 1'746'093'600'123'456'789;

std::string logfmt(std::string_view fields, LogLevel level = LogLevel::info) {
  std::string out;
  format_event(LogFormat::logfmt, level, 42, kWallNs, fields, out);
  return out;
}

nlohmann::json json_of(std::string_view fields, LogLevel level = LogLevel::info) {
  std::string out;
  format_event(LogFormat::json, level, 42, kWallNs, fields, out);
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(out.find('\n'), out.size() - 1) << "one line: " << out;
  return nlohmann::json::parse(out);
}

TEST(EventLog, Rfc3339IsUtcWithMilliseconds) {
  EXPECT_EQ(rfc3339_ms(kWallNs), "2025-05-01T10:00:00.123Z");
  EXPECT_EQ(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
}

TEST(EventLog, LogfmtPutsTimeStampAndLevelBeforeTheFieldsUnchanged) {
  EXPECT_EQ(logfmt("event=grant name=orders why=\"a b\""),
            "time=2025-05-01T10:00:00.123Z ts_boot_ns=42 level=info event=grant name=orders why=\"a b\"\n");
  // A leading level= is the event's own level, and is not repeated.
  EXPECT_EQ(logfmt("level=warn event=rt_late lateness_ms=3"),
            "time=2025-05-01T10:00:00.123Z ts_boot_ns=42 level=warn event=rt_late lateness_ms=3\n");
  // A level= that is no level stays a field.
  EXPECT_EQ(logfmt("level=loud event=x", LogLevel::error),
            "time=2025-05-01T10:00:00.123Z ts_boot_ns=42 level=error level=loud event=x\n");
  // One event is one line, whatever its text holds.
  EXPECT_EQ(logfmt("event=x note=\"a\nb\"\n"), "time=2025-05-01T10:00:00.123Z ts_boot_ns=42 level=info event=x note=\"a b\"\n");
}

TEST(EventLog, JsonHasTheSameFieldsAsStrings) {
  const nlohmann::json j = json_of("level=error event=store_failed name=orders epoch=3 why=\"disk \\\"full\\\" now\" bare");
  EXPECT_EQ(j["time"], "2025-05-01T10:00:00.123Z");
  EXPECT_EQ(j["ts_boot_ns"], 42);
  EXPECT_EQ(j["level"], "error");
  EXPECT_EQ(j["event"], "store_failed");
  EXPECT_EQ(j["name"], "orders");
  EXPECT_EQ(j["epoch"], "3");
  EXPECT_EQ(j["why"], "disk \"full\" now");
  EXPECT_EQ(j["msg"], "bare");
  // A producer's unescaped quote inside a quoted value stays in the value; control bytes are escaped.
  const nlohmann::json k = json_of("event=x why=\"say \"hi\" twice\" tab=\"a\tb\"");
  EXPECT_EQ(k["why"], "say \"hi\" twice");
  EXPECT_EQ(k["tab"], "a\tb");
  EXPECT_EQ(k["level"], "info");
}

TEST(EventLog, LevelsParseAndOrder) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::debug);
  EXPECT_EQ(parse_log_level("warning"), LogLevel::warn);
  EXPECT_FALSE(parse_log_level("loud").has_value());
  EXPECT_EQ(parse_log_format("json"), LogFormat::json);
  EXPECT_FALSE(parse_log_format("xml").has_value());
  EXPECT_EQ(level_of("level=error event=x"), LogLevel::error);
  EXPECT_EQ(level_of("event=x level=error"), LogLevel::info) << "only a leading level= counts";
}

/// An EventLog over a LogWriter into a memfd, read back after a flush.
struct Captured {
  int fd = ::memfd_create("event-log-test", MFD_CLOEXEC);
  LogWriter writer{fd};
  EventLog log{writer};
  ~Captured() { ::close(fd); }
  std::vector<std::string> lines() {
    EXPECT_TRUE(writer.flush(std::chrono::seconds(10)));
    std::string text;
    char buf[4096];
    for (off_t off = 0;;) {
      const ssize_t n = ::pread(fd, buf, sizeof buf, off);
      if (n <= 0) break;
      text.append(buf, static_cast<std::size_t>(n));
      off += n;
    }
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
};

TEST(EventLog, SkipsEventsBelowTheLevelAndTakesANewLevelAtOnce) {
  Captured c;
  ASSERT_GE(c.fd, 0);
  c.log.set_level(LogLevel::warn);
  EXPECT_TRUE(c.log.emit(1000, "event=grant name=a"));
  EXPECT_TRUE(c.log.emit(1001, "level=warn event=rt_late"));
  EXPECT_TRUE(c.log.emit(1002, "level=debug event=detail"));
  c.log.set_level(LogLevel::debug);
  EXPECT_TRUE(c.log.emit(1003, "level=debug event=detail"));
  EXPECT_TRUE(c.log.emit(1004, "event=grant name=b"));
  const auto lines = c.lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find(" ts_boot_ns=1001 level=warn event=rt_late"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find(" ts_boot_ns=1003 level=debug event=detail"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find(" ts_boot_ns=1004 level=info event=grant name=b"), std::string::npos) << lines[2];
  EXPECT_EQ(c.log.dropped(), 0u);
}

TEST(EventLog, EmitLinesTakesEachLinesOwnStampAndLevel) {
  Captured c;
  ASSERT_GE(c.fd, 0);
  c.log.set_format(LogFormat::json);
  c.log.set_level(LogLevel::info);
  EXPECT_TRUE(c.log.emit_lines("ts_boot_ns=77 event=grant name=a\nts_boot_ns=78 level=debug event=noise\n"
                               "ts_boot_ns=79 level=warn event=step_down why=\"fenced\"\nevent=unstamped\n"));
  const auto lines = c.lines();
  ASSERT_EQ(lines.size(), 3u);
  const auto a = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(a["ts_boot_ns"], 77);
  EXPECT_EQ(a["event"], "grant");
  EXPECT_FALSE(a.contains("level=")) << lines[0];
  const auto b = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(b["ts_boot_ns"], 79);
  EXPECT_EQ(b["level"], "warn");
  EXPECT_EQ(b["why"], "fenced");
  const auto u = nlohmann::json::parse(lines[2]);
  EXPECT_EQ(u["event"], "unstamped");
  EXPECT_GT(u["ts_boot_ns"].get<std::int64_t>(), 79) << "a line without a stamp is stamped when written";
}

TEST(EventLog, WallClockOfAnEventFollowsItsBootStamp) {
  // Two events one hour apart on the boot clock are one hour apart on the wall clock too, to the
  // millisecond (one batch: one clock offset).
  Captured c;
  ASSERT_GE(c.fd, 0);
  constexpr std::int64_t kHourNs = 3'600'000'000'000;
  const std::int64_t base = kHourNs * 2;
  EXPECT_TRUE(c.log.emit_lines("ts_boot_ns=" + std::to_string(base) + " event=a\nts_boot_ns=" +
                               std::to_string(base + kHourNs) + " event=b\n"));
  const auto lines = c.lines();
  ASSERT_EQ(lines.size(), 2u);
  auto time_of = [](const std::string& l) { return l.substr(5, l.find(' ') - 5); };
  const std::string t0 = time_of(lines[0]), t1 = time_of(lines[1]);
  ASSERT_EQ(t0.size(), 24u) << lines[0];
  EXPECT_EQ(t0.substr(14), t1.substr(14)) << "minutes, seconds and ms agree: " << t0 << " " << t1;
  EXPECT_NE(t0.substr(11, 2), t1.substr(11, 2)) << "the hour differs: " << t0 << " " << t1;
}

}  // namespace
}  // namespace leasehold
