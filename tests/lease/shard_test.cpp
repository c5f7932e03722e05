#include "leasehold/lease/shard.hpp"

#include <gtest/gtest.h>

#include <array>
#include <string>

namespace leasehold {
namespace {

// The values below were computed outside this code (RFC 4122 UUIDv5 in leasehold's namespace,
// then FNV-1a 64 over the 16 bytes): a change of the function moves names between the shards
// of an existing cluster, so it must fail here.
TEST(Shard, HashOfAnIdIsFnv1a64OverItsBytesInUuidOrder) {
  const auto id = NameId::parse("0f8fad5b-d9cb-469f-a165-70867728950e");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(shard_hash(*id), 0xf85f93a533f654ecull);
  EXPECT_EQ(shard_hash(NameId{}), 0x88201fb960ff6465ull);  // sixteen zero bytes
}

TEST(Shard, KnownNamesLandInKnownShards) {
  struct Known {
    const char* name;
    const char* id;
    std::uint64_t hash;
    unsigned of2, of3, of1024;
  };
  const std::array<Known, 4> known{{
      {"agent-1", "23f80ef3-af27-5f50-ac28-58d01d424276", 0xa84640286ab9217full, 1, 1, 383},
      {"agent-2", "369e01b7-6d2c-54b9-ae54-e877704856d7", 0x9472aca84593eaefull, 1, 1, 751},
      {"db/primary", "d2bb26bf-8f00-5737-bf18-cceff751542e", 0xeb7e6467498f4120ull, 0, 1, 288},
      {"job:42", "253641ef-39b0-577f-8981-ba105b7dde26", 0x5771a58308c2e239ull, 1, 0, 569},
  }};
  for (const Known& k : known) {
    SCOPED_TRACE(k.name);
    EXPECT_EQ(name_id_of(k.name).str(), k.id);
    EXPECT_EQ(shard_hash(name_id_of(k.name)), k.hash);
    EXPECT_EQ(shard_of_name(k.name, 1), 0u);
    EXPECT_EQ(shard_of_name(k.name, 2), k.of2);
    EXPECT_EQ(shard_of_name(k.name, 3), k.of3);
    EXPECT_EQ(shard_of_name(k.name, kShardsMax), k.of1024);
  }
}

TEST(Shard, OneShardOrNoneIsShardZero) {
  const NameId id = name_id_of("anything");
  EXPECT_EQ(shard_of(id, 0), 0u);
  EXPECT_EQ(shard_of(id, 1), 0u);
}

TEST(Shard, NamesSpreadOverEveryShard) {
  std::array<unsigned, 4> count{};
  for (int i = 0; i < 4000; ++i) ++count[shard_of_name("sandbox-" + std::to_string(i), 4)];
  // Computed outside this code too: about 1000 each, as a hash spreads them.
  EXPECT_EQ(count, (std::array<unsigned, 4>{988, 963, 1008, 1041}));
}

static_assert(shard_of(NameId{1, 2}, 7) < 7, "usable at compile time");

}  // namespace
}  // namespace leasehold
