#include "leasehold/harness/log.hpp"

#include <gtest/gtest.h>

namespace leasehold::harness {
namespace {

TEST(HarnessLog, ParsesKeyValueWordsAndIgnoresTheRest) {
  const LogFields f = parse_log_line("ts_boot_ns=12 event=grant name=orders epoch=3 note a==b =x\r");
  EXPECT_EQ(f.size(), 5u);
  EXPECT_EQ(f.at("ts_boot_ns"), "12");
  EXPECT_EQ(f.at("event"), "grant");
  EXPECT_EQ(f.at("name"), "orders");
  EXPECT_EQ(f.at("epoch"), "3");
  EXPECT_EQ(f.at("a"), "=b");  // the value is everything after the first '='
  EXPECT_EQ(f.count("note"), 0u);
  EXPECT_EQ(f.count(""), 0u);
  EXPECT_TRUE(parse_log_line("").empty());
  EXPECT_TRUE(parse_log_line("   \t ").empty());
}

TEST(HarnessLog, EventsAreTheLinesOfThatEventInOrder) {
  const std::string text =
      "event=grant name=a epoch=1\n"
      "listening 127.0.0.1:5\n"
      "event=expire name=a epoch=1\n"
      "event=grant name=b epoch=2\n"
      "event=granted name=c epoch=9\n"
      "event=grant name=d epoch=4";  // the last line without a newline counts too
  const auto grants = log_events(text, "grant");
  ASSERT_EQ(grants.size(), 3u);
  EXPECT_EQ(grants[0].at("name"), "a");
  EXPECT_EQ(grants[1].at("name"), "b");
  EXPECT_EQ(grants[1].at("epoch"), "2");
  EXPECT_EQ(grants[2].at("name"), "d");
  EXPECT_EQ(log_events(text, "expire").size(), 1u);
  EXPECT_TRUE(log_events(text, "release").empty());
  EXPECT_TRUE(log_events("", "grant").empty());
}

}  // namespace
}  // namespace leasehold::harness
