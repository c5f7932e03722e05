// The Prometheus text exposition (metrics/exposition.cpp): names, types, labels, exact decimals,
// and the cumulative histogram of a log2-bucket record.
#include "leasehold/metrics/exposition.hpp"

#include <gtest/gtest.h>

#include <string>

namespace leasehold::metrics {
namespace {

TEST(Decimal, IsExactWithoutTrailingZeros) {
  EXPECT_EQ(decimal(0, 1), "0");
  EXPECT_EQ(decimal(12, 1), "12");
  EXPECT_EQ(decimal(1023, 1'000'000'000), "0.000001023");
  EXPECT_EQ(decimal(1'500'000'000, 1'000'000'000), "1.5");
  EXPECT_EQ(decimal(3'000'000'000, 1'000'000'000), "3");
  EXPECT_EQ(decimal(UINT64_MAX, 1), "18446744073709551615");
}

TEST(FormatText, CountersGetTotalAndReasonsShareOneFamily) {
  Snapshot s;
  s.samples.push_back({"grants", Kind::counter, 3, {}, "names granted"});
  s.samples.push_back({"refusal", Kind::counter, 2, "held", "refusals by reason", true});
  s.samples.push_back({"held", Kind::gauge, 1, {}, "names held now"});
  s.samples.push_back({"refusal", Kind::counter, 0, "lock_delay", "refusals by reason", true});
  const std::string text = format_text("leasehold_lockd_", s);
  EXPECT_EQ(text,
            "# HELP leasehold_lockd_grants_total names granted\n"
            "# TYPE leasehold_lockd_grants_total counter\n"
            "leasehold_lockd_grants_total 3\n"
            "# HELP leasehold_lockd_refusal_total refusals by reason\n"
            "# TYPE leasehold_lockd_refusal_total counter\n"
            "leasehold_lockd_refusal_total{reason=\"held\"} 2\n"
            "leasehold_lockd_refusal_total{reason=\"lock_delay\"} 0\n"
            "# HELP leasehold_lockd_held names held now\n"
            "# TYPE leasehold_lockd_held gauge\n"
            "leasehold_lockd_held 1\n");
}

TEST(FormatText, EscapesHelpAndLabelValues) {
  Snapshot s;
  s.samples.push_back({"x", Kind::gauge, 1, "a\"b\\c\nd", "back\\slash\nnewline"});
  EXPECT_EQ(format_text("p_", s),
            "# HELP p_x back\\\\slash\\nnewline\n"
            "# TYPE p_x gauge\n"
            "p_x{reason=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(FormatText, HistogramBucketsAreCumulativeAndCountIsTheirSum) {
  Snapshot s;
  HistogramSample h;
  h.name = "rtt_seconds";
  h.help = "round trips";
  h.scale = 1'000'000'000;
  h.buckets[0] = 1;   // v == 0
  h.buckets[3] = 2;   // 4..7 ns
  h.buckets[64] = 1;  // >= 2^63
  h.sum = 12;
  s.histograms.push_back(h);
  const std::string text = format_text("p_", s);
  EXPECT_NE(text.find("# TYPE p_rtt_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("p_rtt_seconds_bucket{le=\"0\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("p_rtt_seconds_bucket{le=\"0.000000003\"} 1\n"), std::string::npos);  // bucket 2: <= 3 ns
  EXPECT_NE(text.find("p_rtt_seconds_bucket{le=\"0.000000007\"} 3\n"), std::string::npos);  // bucket 3: <= 7 ns
  EXPECT_NE(text.find("p_rtt_seconds_bucket{le=\"9223372036.854775807\"} 3\n"), std::string::npos);  // 2^63 - 1
  EXPECT_NE(text.find("p_rtt_seconds_bucket{le=\"+Inf\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("p_rtt_seconds_sum 0.000000012\n"), std::string::npos);
  EXPECT_NE(text.find("p_rtt_seconds_count 4\n"), std::string::npos);
  std::size_t buckets = 0;
  for (std::size_t at = text.find("_bucket{"); at != std::string::npos; at = text.find("_bucket{", at + 1)) ++buckets;
  EXPECT_EQ(buckets, kLog2Buckets);
}

}  // namespace
}  // namespace leasehold::metrics
