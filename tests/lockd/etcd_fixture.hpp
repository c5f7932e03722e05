// A gtest fixture with a real etcd on loopback (harness::EtcdCluster, `members()` members, 1 by
// default) and a client of it; skipped with the reason when there is no etcd binary. Each test
// gets a directory of its own, removed afterwards.
#pragma once

#include "leasehold/etcd/client.hpp"
#include "leasehold/harness/etcd.hpp"
#include "leasehold/lease/clock.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

namespace leasehold::lockd::testing {

class EtcdFixture : public ::testing::Test {
 protected:
  static constexpr std::int64_t kFixtureMs = 1'000'000;
  void SetUp() override {
    if (auto bin = harness::etcd_binary(); !bin.ok()) GTEST_SKIP() << bin.status().message();
    dir_ = std::filesystem::temp_directory_path() / ("lh-etcd-" + std::to_string(::getpid()) + "-" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    auto c = harness::EtcdCluster::start(members(), dir_.string());
    ASSERT_TRUE(c.ok()) << c.status().message();
    cluster_ = std::move(*c);
    auto client = etcd::Client::open(cluster_->endpoints());
    ASSERT_TRUE(client.ok()) << client.status().message();
    client_ = std::move(*client);
  }
  void TearDown() override {
    cluster_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  virtual int members() const { return 1; }
  /// CLOCK_BOOTTIME `ms` from now (ns), for the client's calls.
  std::int64_t deadline(std::int64_t ms) const { return boottime_ns() + ms * kFixtureMs; }

  std::filesystem::path dir_;
  std::unique_ptr<harness::EtcdCluster> cluster_;
  std::shared_ptr<etcd::Client> client_;
};

}  // namespace leasehold::lockd::testing
