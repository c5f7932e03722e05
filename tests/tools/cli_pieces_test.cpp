// The CLI's pure pieces: the column formatter every listing uses (tools/table.hpp).
#include "tools/table.hpp"

#include <gtest/gtest.h>

#include <string>

namespace leasehold::cli {
namespace {

TEST(Table, ColumnsAreAsWideAsTheirWidestCellPlusTwoAndLastCellsUnpadded) {
  Table t({"NAME", "EPOCH", "HOLDER"});
  t.add({"orders", "12", "-"});
  t.add({"billing-long", "3", "0f8fad5b"});
  EXPECT_EQ(t.str(),
            "NAME          EPOCH  HOLDER\n"
            "orders        12     -\n"
            "billing-long  3      0f8fad5b\n");
  EXPECT_EQ(format_table({"A", "B"}, {{"x", "y"}}), "A  B\nx  y\n");
  EXPECT_EQ(format_table({"A", "B"}, {}), "A  B\n");
}

TEST(Table, KeyValueListsWithIndentAndMinimumWidth) {
  Table fields;
  fields.indent(2).min_width(0, 6);
  fields.add({"name", "orders"});
  fields.add({"pid", "42"});
  EXPECT_EQ(fields.str(), "  name    orders\n  pid     42\n");  // as wide as "cgroup" would be
  Table wider;
  wider.min_width(0, 2);
  wider.add({"reserved_for", "-"});
  wider.add({"epoch", "7"});
  EXPECT_EQ(wider.str(), "reserved_for  -\nepoch         7\n");  // a minimum, not a maximum
}

}  // namespace
}  // namespace leasehold::cli
