// FencedStore under concurrent writers: one connection per thread on one file, each thread a
// holder with its own epoch. The fence in the database must serialise check and write.
#include "leasehold/resource/fenced_store.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

namespace leasehold::resource {
namespace {

TEST(FencedStoreConcurrent, HoldersWithDifferentEpochsNeverInterleave) {
  char tmpl[] = "/tmp/fenced-store-conc-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/r.db";
  {
    const auto created = FencedStore::open(path);
    ASSERT_TRUE(created.ok()) << created.message();
  }
  constexpr int kThreads = 4;
  constexpr int kWrites = 100;
  std::atomic<int> errors{0};
  std::vector<std::vector<Verdict>> verdicts(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      StoreOptions o;
      o.durable = false;
      auto opened = FencedStore::open(path, o);
      if (!opened) {
        ++errors;
        return;
      }
      const auto s = std::move(opened).value();
      const SandboxId holder{0x1000u + static_cast<std::uint64_t>(t), 0x4000000000000000ULL};
      for (int i = 0; i < kWrites; ++i) {
        const WriteResult r = s->write({"orders", static_cast<Epoch>(t + 1), holder}, std::to_string(i));
        if (r.verdict == Verdict::error) ++errors;
        verdicts[t].push_back(r.verdict);
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(errors.load(), 0);

  // The holder with the highest epoch is never rejected; every other holder, once rejected,
  // stays rejected (the fence only grows).
  for (Verdict v : verdicts[kThreads - 1]) EXPECT_EQ(v, Verdict::accepted);
  for (int t = 0; t < kThreads - 1; ++t) {
    bool rejected = false;
    for (Verdict v : verdicts[t]) {
      if (rejected) {
        EXPECT_EQ(v, Verdict::stale) << "holder " << t;
      }
      rejected = rejected || v == Verdict::stale;
    }
  }
  auto s_opened = FencedStore::open(path);
  ASSERT_TRUE(s_opened.ok()) << s_opened.message();
  auto s = std::move(s_opened).value();
  const auto rows = s->audit("orders").value();
  ASSERT_EQ(rows.size(), static_cast<std::size_t>(kThreads * kWrites));
  const AuditReport rep = check_audit(rows);
  EXPECT_TRUE(rep.ok()) << (rep.violations.empty() ? "" : rep.violations.front());
  EXPECT_EQ(rep.accepted + rep.rejected, static_cast<std::uint64_t>(kThreads * kWrites));
  EXPECT_EQ(s->highest("orders"), static_cast<Epoch>(kThreads));
  EXPECT_EQ(s->records("orders"), static_cast<std::int64_t>(rep.accepted));
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace leasehold::resource
