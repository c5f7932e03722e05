#include "leasehold/lease/types.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string_view>

namespace leasehold {
namespace {

TEST(Id, ParsesAndPrintsUuidText) {
  auto id = SandboxId::parse("0F8FAD5B-D9CB-469F-A165-70867728950E");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->hi, 0x0f8fad5bd9cb469fULL);
  EXPECT_EQ(id->lo, 0xa16570867728950eULL);
  EXPECT_EQ(id->str(), "0f8fad5b-d9cb-469f-a165-70867728950e");
  auto undashed = SandboxId::parse("0f8fad5bd9cb469fa16570867728950e");
  ASSERT_TRUE(undashed.has_value());
  EXPECT_EQ(*undashed, *id);
}

TEST(Id, RejectsMalformedText) {
  EXPECT_FALSE(WorkerId::parse("").has_value());
  EXPECT_FALSE(WorkerId::parse("0f8fad5b-d9cb-469f-a165-70867728950").has_value());
  EXPECT_FALSE(WorkerId::parse("0f8fad5b-d9cb-469f-a165-70867728950g").has_value());
  EXPECT_FALSE(WorkerId::parse("0f8fad5bd9cb-469f-a165-70867728950e-").has_value());
  EXPECT_FALSE(WorkerId::parse("{0f8fad5b-d9cb-469f-a165-70867728950e}").has_value());
}

TEST(Name, ValidNamesPass) {
  EXPECT_TRUE(validate_name("a").ok());
  EXPECT_TRUE(validate_name("agent-7/db:main_v1.2").ok());
  EXPECT_TRUE(validate_name(std::string(kNameBytesMax, 'x')).ok());
}

TEST(Name, ErrorsSayWhatIsWrong) {
  EXPECT_EQ(validate_name("").code(), Errc::invalid_argument);
  EXPECT_NE(validate_name("").message().find("empty"), std::string::npos);
  EXPECT_NE(validate_name(std::string(129, 'x')).message().find("129 bytes; the limit is 128"),
            std::string::npos);
  const Status bad = validate_name("ab cd");
  EXPECT_EQ(bad.code(), Errc::invalid_argument);
  EXPECT_NE(bad.message().find("' ' (0x20) at byte 2"), std::string::npos) << bad.message();
  EXPECT_NE(validate_name(std::string("a\xff", 2)).message().find("byte 0xff at byte 1"), std::string::npos);
  // A new name does not begin with '-' (an option on a command line; "-" is "none" in listings);
  // validate_name still takes one, so a name held before the rule is still decoded and restored.
  EXPECT_TRUE(validate_name("-").ok());
  EXPECT_EQ(validate_new_name("-").code(), Errc::invalid_argument);
  EXPECT_NE(validate_new_name("-x").message().find("begins with '-'"), std::string::npos);
  EXPECT_TRUE(validate_new_name("x-").ok());
  EXPECT_TRUE(validate_new_name("agent-7/db:main_v1.2").ok());
  EXPECT_EQ(validate_new_name("a b").message(), validate_name("a b").message());
}

TEST(Name, IdIsDeterministicAndDistinct) {
  EXPECT_EQ(name_id_of("agent-1"), name_id_of("agent-1"));
  EXPECT_NE(name_id_of("agent-1"), name_id_of("agent-2"));
  EXPECT_FALSE(name_id_of("agent-1").is_nil());
  // UUIDv5: version nibble 5, RFC 4122 variant.
  EXPECT_EQ((name_id_of("agent-1").hi >> 12) & 0xf, 5u);
  EXPECT_EQ(name_id_of("agent-1").lo >> 62, 2u);
}

TEST(Refusal, TextIsStable) {
  EXPECT_EQ(to_string(Refusal::held), "held");
  EXPECT_EQ(to_string(Refusal::lock_delay), "lock_delay");
  EXPECT_EQ(to_string(static_cast<Refusal>(200)), "unknown_refusal");
}

// The text of each refusal reads back as that refusal (the CLI reads a supervisor's "reason"
// this way); text no refusal has reads as nothing, not as a near match.
TEST(Refusal, TextReadsBackThroughTheOneTable) {
  std::set<std::string_view> texts;
  for (const Refusal r : kRefusals) {
    texts.insert(to_string(r));
    EXPECT_EQ(refusal_of(to_string(r)), r) << to_string(r);
  }
  EXPECT_EQ(texts.size(), kRefusals.size());
  EXPECT_EQ(refusal_of("lock_delay"), Refusal::lock_delay);
  EXPECT_EQ(refusal_of("forbidden"), Refusal::forbidden);
  EXPECT_EQ(refusal_of("unknown_refusal"), std::nullopt);
  EXPECT_EQ(refusal_of("Lock_delay"), std::nullopt);
  EXPECT_EQ(refusal_of("lock_delay "), std::nullopt);
  EXPECT_EQ(refusal_of(""), std::nullopt);
}

}  // namespace
}  // namespace leasehold
