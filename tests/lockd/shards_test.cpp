// lockd on etcd with several shards: the cluster's shard count recorded and compared in etcd,
// and every shard's leader read from the election keys (a real etcd, started on loopback).
#include "leasehold/etcd/client.hpp"
#include "leasehold/harness/etcd.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/lockd/etcd_store.hpp"
#include "leasehold/lockd/shards.hpp"
#include "etcd_fixture.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

namespace leasehold::lockd {
namespace {

constexpr std::int64_t kMs = 1'000'000;

class ShardsTest : public testing::EtcdFixture {};

TEST_F(ShardsTest, TheFirstLockdRecordsTheShardCountAndALockdWithAnotherIsRefused) {
  ASSERT_TRUE(ensure_shard_count(*client_, "/c1", 4, deadline(5000)).ok());
  auto stored = client_->range("/c1/shards", {}, deadline(2000));
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->kvs.size(), 1u);
  EXPECT_EQ(stored->kvs.front().value, "4");
  EXPECT_TRUE(ensure_shard_count(*client_, "/c1", 4, deadline(5000)).ok());  // the same count: ok
  const Status other = ensure_shard_count(*client_, "/c1", 3, deadline(5000));
  EXPECT_EQ(other.code(), Errc::invalid_argument);
  EXPECT_EQ(other.message(),
            "the cluster at /c1 has 4 shard(s) (etcd key /c1/shards), and this lockd was started with --shards 3: "
            "every lockd of a cluster runs with the cluster's --shards 4");
  // Another cluster under another prefix has its own count.
  EXPECT_TRUE(ensure_shard_count(*client_, "/c2", 1, deadline(5000)).ok());
}

TEST_F(ShardsTest, AClusterMadeWithOneShardBeforeCountsWereRecordedKeepsOne) {
  // Keys of shard 0 and no count: a cluster of one shard, from before the count was recorded.
  ASSERT_TRUE(client_->put(shard_prefix("/old", 0) + "high_water", "7", deadline(2000)).ok());
  const Status two = ensure_shard_count(*client_, "/old", 2, deadline(5000));
  EXPECT_EQ(two.code(), Errc::invalid_argument);
  EXPECT_NE(two.message().find("has keys of shard 0 (/old/shard/0/high_water) but no shard count"), std::string::npos)
      << two.message();
  EXPECT_TRUE(client_->range("/old/shards", {}, deadline(2000))->kvs.empty());  // nothing recorded
  EXPECT_TRUE(ensure_shard_count(*client_, "/old", 1, deadline(5000)).ok());
  EXPECT_EQ(client_->range("/old/shards", {}, deadline(2000))->kvs.front().value, "1");
}

TEST_F(ShardsTest, KeysOfAnotherShardThanZeroWithoutACountRefuseEveryCount) {
  // A cluster of two shards whose count was removed by hand: a lockd of one shard (the
  // default) would serve shard 1's names beside shard 1's leader.
  ASSERT_TRUE(client_->put(shard_prefix("/lost", 0) + "high_water", "3", deadline(2000)).ok());
  ASSERT_TRUE(client_->put(shard_prefix("/lost", 1) + "high_water", "4", deadline(2000)).ok());
  for (unsigned shards : {1u, 2u}) {
    const Status s = ensure_shard_count(*client_, "/lost", shards, deadline(5000));
    EXPECT_EQ(s.code(), Errc::invalid_argument) << shards;
    EXPECT_NE(s.message().find("has keys of shards other than 0 (/lost/shard/1/high_water)"), std::string::npos) << s.message();
  }
  // Only shard 1's keys, and a count of 1: refused too.
  ASSERT_TRUE(client_->put(shard_prefix("/lost1", 1) + "high_water", "4", deadline(2000)).ok());
  EXPECT_NE(ensure_shard_count(*client_, "/lost1", 1, deadline(5000)).message().find("(/lost1/shard/1/high_water)"),
            std::string::npos);
  EXPECT_TRUE(client_->range("/lost/shards", {}, deadline(2000))->kvs.empty());  // nothing recorded
}

TEST_F(ShardsTest, AShardCountThatIsNoNumberIsCorrupt) {
  ASSERT_TRUE(client_->put("/bad/shards", "two", deadline(2000)).ok());
  const Status s = ensure_shard_count(*client_, "/bad", 2, deadline(5000));
  EXPECT_EQ(s.code(), Errc::corrupt);
  EXPECT_EQ(s.message(), "etcd key /bad/shards holds \"two\", not a shard count");
}

TEST_F(ShardsTest, EveryShardsLeaderIsReadFromItsElectionKeyInFewTransactions) {
  ASSERT_TRUE(client_->put(election_key(shard_prefix("/l", 0)), "127.0.0.1:7400", deadline(2000)).ok());
  ASSERT_TRUE(client_->put(election_key(shard_prefix("/l", 2)), "127.0.0.1:7402", deadline(2000)).ok());
  ASSERT_TRUE(client_->put(shard_prefix("/l", 1) + "high_water", "3", deadline(2000)).ok());  // no leader
  const std::vector<std::string> expected{"127.0.0.1:7400", "", "127.0.0.1:7402"};
  auto one = ShardLeaders::read_leaders(*client_, "/l", 3, 128, deadline(2000));
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(*one, expected);
  // Two reads per transaction: two transactions, the same answer.
  auto chunked = ShardLeaders::read_leaders(*client_, "/l", 3, 2, deadline(2000));
  ASSERT_TRUE(chunked.ok()) << chunked.status().message();
  EXPECT_EQ(*chunked, expected);

  // The thread publishes them and follows a change.
  ShardLeaders leaders(client_, "/l", 3, 128, 20 * kMs, nullptr);
  const auto wait_for = [&](const std::vector<std::string>& want) {
    for (int i = 0; i < 250 && leaders.leaders() != want; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return leaders.leaders();
  };
  EXPECT_EQ(wait_for(expected), expected);
  const std::uint64_t v = leaders.version();
  ASSERT_TRUE(client_->put(election_key(shard_prefix("/l", 1)), "127.0.0.1:7401", deadline(2000)).ok());
  const std::vector<std::string> all{"127.0.0.1:7400", "127.0.0.1:7401", "127.0.0.1:7402"};
  EXPECT_EQ(wait_for(all), all);
  EXPECT_GT(leaders.version(), v);
  EXPECT_EQ(leaders.last_error(), "");
}

}  // namespace
}  // namespace leasehold::lockd
