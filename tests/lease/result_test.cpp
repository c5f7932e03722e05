// Status and Result<T> (lease/result.hpp): the one error convention at module boundaries.
#include "leasehold/lease/result.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <memory>
#include <string>

namespace leasehold {
namespace {

Result<int> parse_digit(char c) {
  if (c < '0' || c > '9') return Status{Errc::invalid_argument, std::string("not a digit: '") + c + "'"};
  return c - '0';
}

TEST(Status, DefaultIsOkWithNoMessage) {
  const Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), Errc::ok);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(to_string(s), "");
}

TEST(Status, FailureKeepsCodeAndMessage) {
  const Status s{Errc::permission_denied, "/etc/k: mode 0644; fix: chmod 600 /etc/k"};
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Errc::permission_denied);
  EXPECT_EQ(to_string(s), "/etc/k: mode 0644; fix: chmod 600 /etc/k");
  EXPECT_EQ(to_string(s.code()), "permission_denied");
}

TEST(Status, FromErrnoNamesTheStepAndTheErrnoText) {
  const Status s = Status::from_errno(ENOENT, "/x/key: cannot open");
  EXPECT_EQ(s.code(), Errc::not_found);
  EXPECT_EQ(s.message(), "/x/key: cannot open: No such file or directory");
  EXPECT_EQ(Status::from_errno(-EEXIST, "create").code(), Errc::exists) << "a -errno reads as its magnitude";
}

TEST(Errc, ErrnoMapping) {
  EXPECT_EQ(errc_of_errno(0), Errc::ok);
  EXPECT_EQ(errc_of_errno(ENOTDIR), Errc::not_found);
  EXPECT_EQ(errc_of_errno(EACCES), Errc::permission_denied);
  EXPECT_EQ(errc_of_errno(EPERM), Errc::permission_denied);
  EXPECT_EQ(errc_of_errno(EEXIST), Errc::exists);
  EXPECT_EQ(errc_of_errno(EINVAL), Errc::invalid_argument);
  EXPECT_EQ(errc_of_errno(EAGAIN), Errc::busy);
  EXPECT_EQ(errc_of_errno(ETIMEDOUT), Errc::timeout);
  EXPECT_EQ(errc_of_errno(ENOSYS), Errc::unsupported);
  EXPECT_EQ(errc_of_errno(-ENOSPC), Errc::io_error);
  EXPECT_EQ(errc_of_errno(EIO), Errc::io_error);
}

TEST(Errc, EveryCodeHasItsOwnName) {
  const Errc all[] = {Errc::ok, Errc::invalid_argument, Errc::not_found, Errc::permission_denied,
                      Errc::exists, Errc::io_error, Errc::corrupt, Errc::unsupported, Errc::busy,
                      Errc::timeout, Errc::refused};
  for (std::size_t i = 0; i < std::size(all); ++i)
    for (std::size_t j = i + 1; j < std::size(all); ++j) EXPECT_NE(to_string(all[i]), to_string(all[j]));
  EXPECT_EQ(to_string(Errc::corrupt), "corrupt");
  EXPECT_EQ(to_string(Errc::refused), "refused");
}

TEST(Result, HoldsAValue) {
  auto r = parse_digit('7');
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(static_cast<bool>(r));
  EXPECT_EQ(*r, 7);
  EXPECT_EQ(r.value(), 7);
  EXPECT_TRUE(r.status().ok());
  EXPECT_EQ(r.code(), Errc::ok);
  EXPECT_EQ(r.message(), "");
}

TEST(Result, HoldsAFailure) {
  const auto r = parse_digit('x');
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.code(), Errc::invalid_argument);
  EXPECT_EQ(r.message(), "not a digit: 'x'");
}

TEST(Result, MovesAMoveOnlyValueOut) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(42);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 42);
}

TEST(Result, StringValueIsNotMistakenForAnError) {
  const Result<std::string> r = std::string("text");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 4u);
}

class ResultDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(ResultDeathTest, ValueOfAFailureAborts) {
  const auto r = parse_digit('x');
  EXPECT_DEATH((void)r.value(), "LEASEHOLD_ASSERT\\(ok\\(\\)\\) failed");
}

TEST_F(ResultDeathTest, AResultFromAnOkStatusAborts) {
  EXPECT_DEATH((void)Result<int>(Status{}), "LEASEHOLD_ASSERT\\(!std::get<1>\\(v_\\).ok\\(\\)\\) failed");
}

TEST_F(ResultDeathTest, AFailureWithoutMessageOrWithCodeOkAborts) {
  EXPECT_DEATH((void)Status(Errc::io_error, ""), "LEASEHOLD_ASSERT\\(!message_.empty\\(\\)\\) failed");
  EXPECT_DEATH((void)Status(Errc::ok, "fine"), "LEASEHOLD_ASSERT\\(code_ != Errc::ok\\) failed");
  EXPECT_DEATH((void)Status::from_errno(0, "step"), "LEASEHOLD_ASSERT\\(err != 0\\) failed");
}

}  // namespace
}  // namespace leasehold
