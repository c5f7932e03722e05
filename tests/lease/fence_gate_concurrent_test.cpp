// FenceGate under concurrent admits (runs under TSan in CI: label "concurrent").
#include "leasehold/lease/fence.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace leasehold {
namespace {

TEST(FenceGateConcurrent, HighestIsTheMaximumAndNeverGoesBack) {
  constexpr int kThreads = 4;
  constexpr int kNames = 8;
  constexpr Epoch kEpochs = 2000;
  FenceGate gate;
  std::vector<NameId> names;
  for (int n = 0; n < kNames; ++n) names.push_back(name_id_of("name-" + std::to_string(n)));
  std::atomic<bool> go{false};
  std::atomic<int> violations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::vector<Epoch> seen(kNames, 0);
      for (Epoch e = 1; e <= kEpochs; ++e) {
        for (int n = 0; n < kNames; ++n) {
          // Each thread interleaves its own increasing epochs with other threads' ones.
          const Epoch mine = e * kThreads + static_cast<Epoch>(t);
          const FenceGate::Admission a = gate.admit(names[n], mine);
          // The highest a thread observes for a name never decreases...
          if (a.highest < seen[n]) violations.fetch_add(1);
          // ...and an admission is accepted exactly when it is not below that highest.
          if (a.accepted() != (a.highest == mine)) violations.fetch_add(1);
          if (!a.accepted() && a.highest <= mine) violations.fetch_add(1);
          seen[n] = a.highest;
        }
      }
    });
  }
  go.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  EXPECT_EQ(violations.load(), 0);
  for (int n = 0; n < kNames; ++n)
    EXPECT_EQ(gate.highest(names[n]), kEpochs * kThreads + kThreads - 1);
  EXPECT_EQ(gate.size(), static_cast<std::size_t>(kNames));
}

TEST(FenceGateConcurrent, SizeBoundHoldsUnderRacingNewNames) {
  constexpr int kThreads = 4;
  constexpr std::size_t kMax = 100;
  FenceGate gate(kMax);
  std::atomic<int> accepted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const auto a = gate.admit(name_id_of("t" + std::to_string(t) + "-" + std::to_string(i)), 1);
        if (a.accepted()) accepted.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(accepted.load(), static_cast<int>(kMax));
  EXPECT_EQ(gate.size(), kMax);
}

}  // namespace
}  // namespace leasehold
