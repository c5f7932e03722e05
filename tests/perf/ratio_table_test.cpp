// The ratio summary the perf benchmarks print (perf/common/ratio_table.hpp): a row whose
// benchmarks did not all run (filtered out, skipped) is left out instead of reading 0.0 / 0.00x.
#include "perf/common/ratio_table.hpp"

#include <gtest/gtest.h>

namespace lp = leasehold::perf;

TEST(RatioTable, ResultsAreKeyedByNameAndArgs) {
  lp::RunResults r;
  r.set("BM_Schedule_Wheel/1000000", 2e7);
  r.set("BM_Zero", 0.0);  // no rate: not a result
  ASSERT_TRUE(r.items_per_second("BM_Schedule_Wheel/1000000"));
  EXPECT_DOUBLE_EQ(*r.items_per_second("BM_Schedule_Wheel/1000000"), 2e7);
  EXPECT_DOUBLE_EQ(*r.ns_per_item("BM_Schedule_Wheel/1000000"), 50.0);
  EXPECT_FALSE(r.items_per_second("BM_Schedule_Wheel"));       // no prefix matching
  EXPECT_FALSE(r.items_per_second("BM_Schedule_Wheel/10000"));  // did not run
  EXPECT_FALSE(r.items_per_second("BM_Zero"));
  EXPECT_DOUBLE_EQ(*lp::ratio(6.0, 2.0), 3.0);
  EXPECT_FALSE(lp::ratio(std::nullopt, 2.0));
  EXPECT_FALSE(lp::ratio(6.0, std::nullopt));
  EXPECT_FALSE(lp::ratio(6.0, 0.0));
}

TEST(RatioTable, OnlyRowsWhoseValuesWereAllMeasuredArePrinted) {
  // --benchmark_filter='/1000000/': the 10,000-timer benchmarks did not run.
  lp::RunResults r;
  r.set("BM_Cancel_Wheel/1000000", 1e8);        // 10 ns
  r.set("BM_Cancel_Multimap/1000000", 2.5e6);   // 400 ns
  lp::RatioTable t("ns per op", "operation", {{"wheel", 1, ""}, {"baseline", 1, ""}, {"ratio", 2, "x"}});
  for (const char* n : {"1000000", "10000"}) {
    const auto w = r.ns_per_item(std::string("BM_Cancel_Wheel/") + n);
    for (const char* base : {"Multimap", "PriorityQueue"}) {
      const auto b = r.ns_per_item(std::string("BM_Cancel_") + base + "/" + n);
      EXPECT_EQ(t.row(std::string("Cancel vs ") + base + " " + n, {w, b, lp::ratio(b, w)}),
                std::string(n) == "1000000" && std::string(base) == "Multimap");
    }
  }
  EXPECT_EQ(t.rows(), 1u);
  EXPECT_EQ(t.str(),
            "ns per op\n"
            "operation                   wheel  baseline   ratio\n"
            "Cancel vs Multimap 1000000   10.0     400.0  40.00x\n");
}

TEST(RatioTable, AnEmptyTableOrAWrongWidthRowPrintsNothing) {
  lp::RatioTable t("title", "name", {{"a", 0, "/s"}, {"b", 0, "/s"}});
  EXPECT_EQ(t.str(), "");
  EXPECT_FALSE(t.row("short", {1.0}));
  EXPECT_FALSE(t.row("missing", {1.0, std::nullopt}));
  EXPECT_EQ(t.str(), "");
  EXPECT_TRUE(t.row("x", {1234.4, 99.6}));
  EXPECT_EQ(t.str(), "title\nname       a      b\nx     1234/s  100/s\n");
}
