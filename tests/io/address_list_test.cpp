// Address lists, "A,B,C" (io/address_list.hpp): the syntax, the errors that name the bad entry,
// host names ("localhost" is 127.0.0.1: IPv4 first), duplicates, the bound.
#include "leasehold/io/address_list.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace leasehold {
namespace {

std::vector<std::string> texts(const std::vector<SocketAddress>& list) {
  std::vector<std::string> out;
  for (const SocketAddress& a : list) out.push_back(a.str());
  return out;
}

TEST(AddressList, OneNumericAddressIsTheOneAddressForm) {
  const auto r = resolve_address_list("127.0.0.1:7400");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(texts(*r), (std::vector<std::string>{"127.0.0.1:7400"}));
  const auto v6 = resolve_address_list("[::1]:7400");
  ASSERT_TRUE(v6.ok()) << v6.message();
  EXPECT_EQ(texts(*v6), (std::vector<std::string>{"[::1]:7400"}));
}

TEST(AddressList, SeveralAddressesKeepTheirOrderAndSpacesAreIgnored) {
  const auto r = resolve_address_list("10.0.0.1:7400, 10.0.0.2:7401 ,10.0.0.3:7402");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(texts(*r), (std::vector<std::string>{"10.0.0.1:7400", "10.0.0.2:7401", "10.0.0.3:7402"}));
  EXPECT_EQ(address_list_text(*r), "10.0.0.1:7400, 10.0.0.2:7401, 10.0.0.3:7402");
  const auto split = split_address_list("a.example:1,[fe80::1]:2");
  ASSERT_TRUE(split.ok()) << split.message();
  ASSERT_EQ(split->size(), 2u);
  EXPECT_EQ((*split)[0].host, "a.example");
  EXPECT_EQ((*split)[0].port, 1);
  EXPECT_EQ((*split)[1].host, "fe80::1");
  EXPECT_EQ((*split)[1].port, 2);
}

TEST(AddressList, LocalhostResolvesToIpv4Loopback) {
  const auto r = resolve_address_list("localhost:7400");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(texts(*r), (std::vector<std::string>{"127.0.0.1:7400"}));
}

TEST(AddressList, DuplicatesAreKeptOnce) {
  // The same text twice, and a name that resolves to an address already given.
  const auto r = resolve_address_list("127.0.0.1:7400,127.0.0.2:7400,127.0.0.1:7400,localhost:7400");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(texts(*r), (std::vector<std::string>{"127.0.0.1:7400", "127.0.0.2:7400"}));
  const auto split = split_address_list("a:1,a:1, a:1");
  ASSERT_TRUE(split.ok()) << split.message();
  EXPECT_EQ(split->size(), 1u);
  // The same address on another port is another lockd.
  const auto ports = resolve_address_list("127.0.0.1:7400,127.0.0.1:7401");
  ASSERT_TRUE(ports.ok()) << ports.message();
  EXPECT_EQ(ports->size(), 2u);
}

void expect_refused(const std::string& list, Errc code, const std::string& part) {
  SCOPED_TRACE(list);
  const auto r = resolve_address_list(list);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.code(), code) << r.message();
  EXPECT_NE(r.message().find(part), std::string::npos) << r.message();
}

TEST(AddressList, BadEntriesAreNamedWithTheirPosition) {
  expect_refused("", Errc::invalid_argument, "no address given");
  expect_refused("localhost", Errc::invalid_argument, "\"localhost\": expected HOST:PORT");
  expect_refused("127.0.0.1:7400,", Errc::invalid_argument, "\"\" (entry 2 of 2): an empty entry");
  expect_refused("127.0.0.1:7400,,127.0.0.2:7400", Errc::invalid_argument, "(entry 2 of 3): an empty entry");
  expect_refused("127.0.0.1:7400,127.0.0.2:x", Errc::invalid_argument,
                 "\"127.0.0.2:x\" (entry 2 of 2): the port \"x\" is not a number 0..65535");
  expect_refused("127.0.0.1:70000", Errc::invalid_argument, "the port \"70000\" is not a number");
  expect_refused("127.0.0.1:", Errc::invalid_argument, "the port \"\" is not a number");
  expect_refused(":7400", Errc::invalid_argument, "no host before :PORT");
  expect_refused("::1:7400", Errc::invalid_argument, "an IPv6 address needs brackets, as in [::1]:7400");
  expect_refused("[::1]7400", Errc::invalid_argument, "no :PORT after the address");
  expect_refused("[::1:7400", Errc::invalid_argument, "no ']'");
  expect_refused("[]:7400", Errc::invalid_argument, "an empty address between [ and ]");
  expect_refused("[127.0.0.1]:7400", Errc::invalid_argument, "\"127.0.0.1\" is not an IPv6 address");
  expect_refused("127.0.0.1:0", Errc::invalid_argument, "port 0 is no service's port");
  expect_refused("127.0.0.1:7400,[::1]:7400", Errc::invalid_argument,
                 "\"[::1]:7400\" (entry 2 of 2) is IPv6 ([::1]:7400) but \"127.0.0.1:7400\" is IPv4");
  // .invalid never resolves (RFC 6761).
  expect_refused("127.0.0.1:7400,lockd.invalid:7400", Errc::not_found,
                 "\"lockd.invalid:7400\" (entry 2 of 2): cannot resolve host \"lockd.invalid\"");
}

TEST(AddressList, AtMostSixteenEntries) {
  std::string list;
  for (int i = 1; i <= 16; ++i) list += (list.empty() ? "" : ",") + std::string("10.0.0.") + std::to_string(i) + ":7400";
  const auto sixteen = resolve_address_list(list);
  ASSERT_TRUE(sixteen.ok()) << sixteen.message();
  EXPECT_EQ(sixteen->size(), kAddressListMax);
  expect_refused(list + ",10.0.0.17:7400", Errc::invalid_argument, "17 addresses in");
}

}  // namespace
}  // namespace leasehold
