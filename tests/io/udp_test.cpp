// Socket addresses: parsing (bad input refused), printing, comparing; UniqueFd ownership.
#include "leasehold/io/udp.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

namespace leasehold {
namespace {

TEST(SocketAddress, ParsesIpv4AndIpv6AndPrintsThemBack) {
  auto v4 = SocketAddress::parse("127.0.0.1:7000");
  ASSERT_TRUE(v4.has_value());
  EXPECT_EQ(v4->family(), AF_INET);
  EXPECT_EQ(v4->port(), 7000);
  EXPECT_EQ(v4->str(), "127.0.0.1:7000");
  EXPECT_EQ(*v4, SocketAddress::loopback_v4(7000));

  auto v6 = SocketAddress::parse("[::1]:65535");
  ASSERT_TRUE(v6.has_value());
  EXPECT_EQ(v6->family(), AF_INET6);
  EXPECT_EQ(v6->port(), 65535);
  EXPECT_EQ(v6->str(), "[::1]:65535");
  EXPECT_FALSE(*v6 == *v4);
}

TEST(SocketAddress, RefusesMalformedText) {
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
                          "127.0.0.1:80x", "localhost:80", "1.2.3:80", "[::1:80", "[::1]80",
                          "::1:80", "[zz::1]:80", ":80"}) {
    EXPECT_FALSE(SocketAddress::parse(bad).has_value()) << "accepted '" << bad << "'";
  }
}

TEST(SocketAddress, UnsetAndOversizedAddresses) {
  SocketAddress unset;
  EXPECT_FALSE(unset.is_set());
  EXPECT_EQ(unset.str(), "(unset)");
  EXPECT_EQ(unset.port(), 0);
  sockaddr_storage ss{};
  EXPECT_FALSE(SocketAddress::from(reinterpret_cast<sockaddr*>(&ss), 0).has_value());
  EXPECT_FALSE(SocketAddress::from(reinterpret_cast<sockaddr*>(&ss), sizeof ss + 1).has_value());
  EXPECT_FALSE(SocketAddress::from(nullptr, 16).has_value());
}

TEST(Udp, OpenBindsAndReportsErrorsAsErrno) {
  UniqueFd fd(open_udp_socket(SocketAddress::loopback_v4(0)));
  ASSERT_TRUE(fd.valid());
  auto bound = local_address(fd.get());
  ASSERT_TRUE(bound.has_value());
  EXPECT_NE(bound->port(), 0);
  EXPECT_TRUE(::fcntl(fd.get(), F_GETFL) & O_NONBLOCK);
  // The same port again: EADDRINUSE, as -errno.
  EXPECT_EQ(open_udp_socket(*bound), -EADDRINUSE);
  EXPECT_EQ(open_udp_socket(SocketAddress{}), -EINVAL);
}

TEST(UniqueFd, ClosesOnceAndMovesOwnership) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  ::close(p[1]);
  UniqueFd a(p[0]);
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());
  EXPECT_EQ(b.get(), p[0]);
  b.reset();
  EXPECT_EQ(::fcntl(p[0], F_GETFD), -1);  // closed
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
}  // namespace leasehold
