// The choice of a free private subnet for the workers' veth pairs (include/leasehold/harness/subnet.hpp).
#include "leasehold/harness/subnet.hpp"

#include <gtest/gtest.h>

#include <string>

namespace leasehold::harness {
namespace {

TEST(DemoSubnet, ParsesAddressesAndPrefixesFromIpOutput) {
  const auto r = ipv4_ranges_in(
      "2: eth0    inet 10.0.2.15/24 brd 10.0.2.255 scope global eth0\n"
      "default via 10.0.2.2 dev eth0 metric 100\n"
      "10.213.0.0/16 dev tun0\n"
      "not 1.2.3 nor 300.1.1.1 nor 1.2.3.4.5 nor 12345\n");
  ASSERT_EQ(r.size(), 4u) << "malformed tokens are skipped";
  EXPECT_EQ(r[0].first, (10u << 24) | (2u << 8));  // 10.0.2.0/24
  EXPECT_EQ(r[0].size, 256u);
  EXPECT_EQ(r[1].first, (10u << 24) | (2u << 8) | 255u);  // brd, a host
  EXPECT_EQ(r[1].size, 1u);
  EXPECT_EQ(r[2].first, (10u << 24) | (2u << 8) | 2u);  // the gateway
  EXPECT_EQ(r[3].first, (10u << 24) | (213u << 16));
  EXPECT_EQ(r[3].size, 65536u);
}

TEST(DemoSubnet, TakesTheStartWhenFreeAndSkipsWhatIsUsed) {
  EXPECT_EQ(pick_demo_subnet("", 48), 48u);
  EXPECT_EQ(pick_demo_subnet("", 250 + 48), 48u);  // the start wraps (a pid is any number)
  // Another run of the demo holds 10.213.48.x (addresses and its /30 routes): the next /24.
  const std::string other_run =
      "7: lhd4298h1    inet 10.213.48.1/30 scope global lhd4298h1\n"
      "10.213.48.4/30 dev lhd4298h2 proto kernel scope link src 10.213.48.5\n";
  EXPECT_EQ(pick_demo_subnet(other_run, 48), 49u);
  // Two runs whose pids differ by 250 start at the same /24 and still get different ones.
  EXPECT_EQ(pick_demo_subnet(other_run, 4298 % kDemoSubnetCount), 49u);
  EXPECT_EQ(pick_demo_subnet(other_run, 4548 % kDemoSubnetCount), 49u);
  // A /22 elsewhere takes four /24s; the search wraps around the end.
  EXPECT_EQ(pick_demo_subnet("10.213.248.0/22 dev br0", 248), 0u);
  EXPECT_EQ(pick_demo_subnet("10.213.4.0/22 dev br0", 5), 8u);
}

TEST(DemoSubnet, BroadRoutesDoNotBlockAndAFullRangeIsNone) {
  // A default route or a /16 is less specific than our /30s: not a conflict.
  EXPECT_EQ(pick_demo_subnet("default via 192.168.1.1\n10.0.0.0/8 dev vpn0\n10.213.0.0/16 dev tun0", 7), 7u);
  std::string all;
  for (unsigned i = 0; i < kDemoSubnetCount; ++i) all += "10.213." + std::to_string(i) + ".9/32\n";
  EXPECT_FALSE(pick_demo_subnet(all, 0).has_value());
  all.erase(all.find("10.213.17.9/32\n"), 15);
  EXPECT_EQ(pick_demo_subnet(all, 100), 17u);
}

}  // namespace
}  // namespace leasehold::harness
