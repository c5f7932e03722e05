// Tests of the deadline wheel: ordering, round-down, cascading, cancel, capacity, far-future
// deadlines, lazy re-arm, and a seeded randomized comparison with a reference model.
#include "leasehold/supervisor/deadline_wheel.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <vector>

// Counts every operator new in this test binary, so the wheel's "no allocation after
// construction" (the rt thread uses it) is asserted, not assumed.
#include "tests/common/alloc_counter.hpp"
using leasehold::test::g_allocations;

namespace leasehold {
namespace {

constexpr std::uint64_t kG = 1'000'000;  // 1 ms granularity
constexpr std::uint64_t kStart = 5'000'000'123'456;  // an arbitrary CLOCK_BOOTTIME reading

struct Fired {
  std::uint64_t payload;
  std::uint64_t deadline_ns;
  std::uint64_t tick_ns;
  std::uint64_t now_ns;
};

// Advances in granularity steps from the wheel's next tick to `until_ns`, the way the rt thread
// does (it wakes at tick boundaries), recording every firing with the `now` it happened at.
std::vector<Fired> run_ticks(DeadlineWheel& w, std::uint64_t until_ns) {
  std::vector<Fired> out;
  for (std::uint64_t now = w.next_tick_ns(); now <= until_ns; now += w.granularity_ns()) {
    w.advance(now, [&](const DueTimer& d) {
      out.push_back({d.payload, d.deadline_ns, d.tick_ns, now});
      return Rearm::none();
    });
  }
  return out;
}

TEST(DeadlineWheel, RejectsBadConstruction) {
  EXPECT_THROW(DeadlineWheel(0, kG, 0), std::invalid_argument);
  EXPECT_THROW(DeadlineWheel(kDeadlineWheelCapacityMax + 1, kG, 0), std::invalid_argument);
  EXPECT_THROW(DeadlineWheel(8, 0, 0), std::invalid_argument);
  DeadlineWheel w(8, kG, kStart);
  EXPECT_EQ(w.granularity_ns(), kG);
  EXPECT_EQ(w.capacity(), 8u);
  EXPECT_EQ(w.size(), 0u);
}

TEST(DeadlineWheel, FiresInDeadlineOrder) {
  DeadlineWheel w(64, kG, kStart);
  const std::vector<std::uint64_t> offsets_ms = {50, 3, 900, 7, 255, 256, 257, 1, 70'000};
  for (std::uint64_t i = 0; i < offsets_ms.size(); ++i) {
    ASSERT_TRUE(w.schedule(kStart + offsets_ms[i] * kG, i));
  }
  const auto fired = run_ticks(w, kStart + 80'000 * kG);
  ASSERT_EQ(fired.size(), offsets_ms.size());
  for (std::size_t i = 1; i < fired.size(); ++i) {
    EXPECT_LT(fired[i - 1].deadline_ns, fired[i].deadline_ns) << "index " << i;
  }
  EXPECT_EQ(w.size(), 0u);
}

TEST(DeadlineWheel, RoundsDownNeverLate) {
  // Deadlines at every position inside a tick: each fires at the tick that contains it, so
  // deadline - g < now <= deadline ("fire early, never late", DESIGN.md "Time").
  DeadlineWheel w(1024, kG, kStart);
  std::vector<std::uint64_t> deadlines;
  for (std::uint64_t k = 1; k < 400; ++k) {
    deadlines.push_back(kStart + k * 777'777);  // lands at many offsets inside ticks
  }
  for (std::uint64_t i = 0; i < deadlines.size(); ++i) ASSERT_TRUE(w.schedule(deadlines[i], i));
  const auto fired = run_ticks(w, deadlines.back() + kG);
  ASSERT_EQ(fired.size(), deadlines.size());
  for (const auto& f : fired) {
    EXPECT_LE(f.now_ns, f.deadline_ns) << "fired late: payload " << f.payload;
    EXPECT_GT(f.now_ns + kG, f.deadline_ns) << "fired more than one granularity early: payload " << f.payload;
    EXPECT_EQ(f.tick_ns, f.deadline_ns / kG * kG);
  }
}

TEST(DeadlineWheel, NothingFiresBeforeItsTick) {
  DeadlineWheel w(4, kG, kStart);
  const std::uint64_t d = kStart + 10 * kG + 500;
  ASSERT_TRUE(w.schedule(d, 42));
  int calls = 0;
  auto cb = [&](const DueTimer&) { ++calls; return Rearm::none(); };
  EXPECT_EQ(w.advance(d / kG * kG - 1, cb), 0u);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(w.advance(d / kG * kG, cb), 1u);
  EXPECT_EQ(calls, 1);
}

TEST(DeadlineWheel, CascadesAcrossEveryLevel) {
  DeadlineWheel w(16, 1, 0);  // 1 ns ticks make level boundaries easy to hit exactly
  const std::vector<std::uint64_t> ticks = {
      255, 256, 257, 65'535, 65'536, 65'537, 16'777'215, 16'777'216, 16'777'217,
      (1ull << 32) - 1, (1ull << 32), (1ull << 32) + 1};
  for (std::uint64_t i = 0; i < ticks.size(); ++i) ASSERT_TRUE(w.schedule(ticks[i], i));
  std::vector<Fired> fired;
  // Jump straight to each deadline and one before it: exact firing ticks across cascades.
  for (std::uint64_t i = 0; i < ticks.size(); ++i) {
    const std::uint64_t before = fired.size();
    w.advance(ticks[i] - 1, [&](const DueTimer& d) {
      fired.push_back({d.payload, d.deadline_ns, d.tick_ns, ticks[i] - 1});
      return Rearm::none();
    });
    EXPECT_EQ(fired.size(), before) << "tick " << ticks[i] << " fired early";
    w.advance(ticks[i], [&](const DueTimer& d) {
      fired.push_back({d.payload, d.deadline_ns, d.tick_ns, ticks[i]});
      return Rearm::none();
    });
    ASSERT_EQ(fired.size(), before + 1) << "tick " << ticks[i];
    EXPECT_EQ(fired.back().payload, i);
    EXPECT_EQ(fired.back().tick_ns, ticks[i]);
  }
}

TEST(DeadlineWheel, CancelPreventsFiringAndStalesTheHandle) {
  DeadlineWheel w(8, kG, kStart);
  const auto a = w.schedule(kStart + 5 * kG, 1);
  const auto b = w.schedule(kStart + 300 * kG, 2);  // level 1
  ASSERT_TRUE(a && b);
  EXPECT_EQ(w.cancel(a.handle), WheelError::none);
  EXPECT_EQ(w.cancel(a.handle), WheelError::stale_handle);
  EXPECT_FALSE(w.live(a.handle));
  EXPECT_EQ(w.cancel(b.handle), WheelError::none);
  EXPECT_EQ(w.size(), 0u);
  EXPECT_TRUE(run_ticks(w, kStart + 1000 * kG).empty());
  // The freed node is reused with a new generation; the old handle stays stale.
  const auto c = w.schedule(kStart + 2000 * kG, 3);
  ASSERT_TRUE(c);
  EXPECT_EQ(w.cancel(a.handle), WheelError::stale_handle);
  EXPECT_EQ(w.reschedule(a.handle, kStart), WheelError::stale_handle);
  EXPECT_TRUE(w.live(c.handle));
}

TEST(DeadlineWheel, CapacityFullIsAClearError) {
  DeadlineWheel w(3, kG, kStart);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(w.schedule(kStart + kG, i));
  const auto r = w.schedule(kStart + kG, 9);
  EXPECT_FALSE(r);
  EXPECT_EQ(r.error, WheelError::capacity_full);
  EXPECT_TRUE(r.handle.is_nil());
  EXPECT_STREQ(describe(r.error), "deadline wheel full: every timer slot is in use");
  EXPECT_EQ(w.size(), 3u);
  EXPECT_EQ(run_ticks(w, kStart + 2 * kG).size(), 3u);
  EXPECT_TRUE(w.schedule(kStart + 5 * kG, 4));  // space again after firing
}

TEST(DeadlineWheel, FarFutureBeyondTheTopLevelFiresExactly) {
  DeadlineWheel w(4, 1, 0);
  const std::uint64_t far = (1ull << 40) + 12'345;  // 256 × the top level's span
  ASSERT_TRUE(w.schedule(far, 7));
  std::uint32_t calls = 0;
  std::uint64_t tick_seen = 0;
  auto cb = [&](const DueTimer& d) { ++calls; tick_seen = d.tick_ns; return Rearm::none(); };
  // Big jumps (each crosses top-level buckets) never fire it early.
  for (std::uint64_t now = 1ull << 30; now < far; now += 1ull << 33) {
    EXPECT_EQ(w.advance(now, cb), 0u) << "fired early at " << now;
  }
  EXPECT_EQ(w.advance(far - 1, cb), 0u);
  EXPECT_EQ(w.advance(far, cb), 1u);
  EXPECT_EQ(tick_seen, far);
  EXPECT_EQ(calls, 1u);
}

// The rt thread sleeps until next_event_ns(): the tick of the earliest deadline, the next tick
// for one already due, and "never" for an empty wheel.
TEST(DeadlineWheel, NextEventIsTheEarliestDeadlineTick) {
  DeadlineWheel w(4, kG, kStart);
  EXPECT_EQ(w.next_event_ns(), UINT64_MAX);
  const std::uint64_t d = kStart + 37 * kG + 500;
  const auto h = w.schedule(d, 1);
  ASSERT_TRUE(h);
  EXPECT_EQ(w.next_event_ns(), d / kG * kG);
  ASSERT_TRUE(w.schedule(kStart + 3 * kG, 2));
  EXPECT_EQ(w.next_event_ns(), (kStart + 3 * kG) / kG * kG);
  w.advance(kStart + 3 * kG, [](const DueTimer&) { return Rearm::none(); });
  EXPECT_EQ(w.next_event_ns(), d / kG * kG);
  ASSERT_TRUE(w.schedule(kStart, 3));  // already due: the next advance fires it
  EXPECT_EQ(w.next_event_ns(), w.next_tick_ns());
  w.advance(w.next_tick_ns(), [](const DueTimer&) { return Rearm::none(); });
  EXPECT_EQ(w.cancel(h.handle), WheelError::none);
  EXPECT_EQ(w.next_event_ns(), UINT64_MAX);
}

TEST(DeadlineWheel, PastDeadlineFiresAtTheNextAdvance) {
  DeadlineWheel w(4, kG, kStart);
  w.advance(kStart + 10 * kG, [](const DueTimer&) { return Rearm::none(); });
  ASSERT_TRUE(w.schedule(kStart, 1));  // already in a processed tick
  int calls = 0;
  EXPECT_EQ(w.advance(kStart + 10 * kG, [&](const DueTimer& d) {
    ++calls;
    EXPECT_EQ(d.payload, 1u);
    return Rearm::none();
  }), 1u);
  EXPECT_EQ(calls, 1);
}

// A clock that goes backwards aborts (it used to fire nothing, silently: a due kill would wait
// for the clock to catch up). Time standing still is allowed.
TEST(DeadlineWheelDeathTest, BackwardsClockAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeadlineWheel w(4, kG, kStart);
  ASSERT_TRUE(w.schedule(kStart + 5 * kG, 1));
  int calls = 0;
  w.advance(kStart + 3 * kG, [&](const DueTimer&) { ++calls; return Rearm::none(); });
  EXPECT_EQ(w.advance(kStart + 3 * kG, [&](const DueTimer&) { ++calls; return Rearm::none(); }), 0u);
  EXPECT_EQ(calls, 0);
  EXPECT_DEATH(w.advance(kStart + 3 * kG - 1, [&](const DueTimer&) { return Rearm::none(); }),
               "LEASEHOLD_ASSERT\\(now_ns >= last_now_ns_\\) failed");
  EXPECT_EQ(w.size(), 1u);
}

// advance from inside its own callback aborts: the inner call would take over the list being
// fired, and the timers left in it would never fire (a kill lost, silently).
TEST(DeadlineWheelDeathTest, AdvanceFromItsOwnCallbackAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeadlineWheel w(4, kG, kStart);
  ASSERT_TRUE(w.schedule(kStart + 5 * kG, 1));
  ASSERT_TRUE(w.schedule(kStart + 5 * kG, 2));
  EXPECT_DEATH(
      {
        w.advance(kStart + 5 * kG, [&](const DueTimer&) {
          w.advance(kStart + 6 * kG, [](const DueTimer&) { return Rearm::none(); });
          return Rearm::none();
        });
      },
      "LEASEHOLD_ASSERT\\(!advancing_\\) failed");
  // Advanced from outside, both fire, and the next advance may follow.
  int calls = 0;
  EXPECT_EQ(w.advance(kStart + 5 * kG, [&](const DueTimer&) { ++calls; return Rearm::none(); }), 2u);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(w.advance(kStart + 6 * kG, [&](const DueTimer&) { ++calls; return Rearm::none(); }), 0u);
  EXPECT_EQ(w.size(), 0u);
}

TEST(DeadlineWheel, LazyRearmKeepsTheHandleAndFiresAtTheNewDeadline) {
  DeadlineWheel w(4, kG, kStart);
  const auto h = w.schedule(kStart + 10 * kG, 5);
  ASSERT_TRUE(h);
  std::uint64_t extended = kStart + 1000 * kG;  // a heartbeat moved the deadline meanwhile
  std::vector<std::uint64_t> fired_at;
  for (std::uint64_t now = w.next_tick_ns(); now <= kStart + 2000 * kG; now += kG) {
    w.advance(now, [&](const DueTimer& d) {
      fired_at.push_back(now);
      EXPECT_EQ(d.handle, h.handle);
      if (!w.due_by(extended, now)) return Rearm::at(extended);
      return Rearm::none();
    });
    if (fired_at.size() == 1) {
      EXPECT_TRUE(w.live(h.handle)) << "re-armed timer must stay live";
    }
  }
  ASSERT_EQ(fired_at.size(), 2u);
  EXPECT_EQ(fired_at[0], kStart / kG * kG + 10 * kG);
  EXPECT_EQ(fired_at[1], extended / kG * kG);
  EXPECT_FALSE(w.live(h.handle));
}

TEST(DeadlineWheel, CallbackMayCancelOthersInTheSameTick) {
  DeadlineWheel w(8, kG, kStart);
  const auto a = w.schedule(kStart + 5 * kG, 1);
  const auto b = w.schedule(kStart + 5 * kG, 2);
  ASSERT_TRUE(a && b);
  int calls = 0;
  run_ticks(w, kStart + 4 * kG);
  w.advance(kStart + 5 * kG, [&](const DueTimer& d) {
    ++calls;
    EXPECT_EQ(w.cancel(d.payload == 1 ? b.handle : a.handle), WheelError::none);
    return Rearm::none();
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(w.size(), 0u);
}

TEST(DeadlineWheel, NoAllocationAfterConstruction) {
  const std::uint64_t at_start = g_allocations.load();
  DeadlineWheel w(4096, kG, kStart);
  ASSERT_GT(g_allocations.load(), at_start) << "the counting operator new is not in effect";
  std::vector<TimerHandle> handles;
  handles.reserve(4096);
  const std::uint64_t before = g_allocations.load();
  for (std::uint64_t i = 0; i < 4096; ++i) {
    handles.push_back(w.schedule(kStart + (i * 7919 % 100'000) * kG, i).handle);
  }
  for (std::uint64_t i = 0; i < 4096; i += 3) w.reschedule(handles[i], kStart + (1ull << 40));
  for (std::uint64_t i = 1; i < 4096; i += 3) w.cancel(handles[i]);
  std::uint64_t fired = 0;
  w.advance(kStart + 200'000 * kG, [&](const DueTimer& d) {
    ++fired;
    return d.payload % 2 == 0 ? Rearm::at(d.deadline_ns + 1000 * kG) : Rearm::none();
  });
  EXPECT_GT(fired, 0u);
  EXPECT_EQ(g_allocations.load(), before) << "the wheel allocated after construction";
}

// The reference model: a multiset of (tick, id). Firing = everything with tick <= target.
TEST(DeadlineWheel, RandomizedAgainstReferenceModel) {
  std::uint64_t seed = static_cast<std::uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  if (const char* s = std::getenv("LEASEHOLD_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::printf("DeadlineWheel randomized seed: %llu (replay with LEASEHOLD_SEED=%llu)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);

  constexpr std::uint32_t kCap = 512;
  constexpr std::uint64_t g = 1000;
  std::uint64_t now = 123'456'789;
  DeadlineWheel w(kCap, g, now);
  std::map<std::uint64_t, std::pair<TimerHandle, std::uint64_t>> live;  // id -> handle, deadline
  std::uint64_t next_id = 0;

  auto random_deadline = [&]() -> std::uint64_t {
    switch (rng() % 6) {
      case 0: return now - std::min<std::uint64_t>(now, rng() % (5 * g));  // past
      case 1: return now + rng() % (256 * g);                                // level 0
      case 2: return now + rng() % (65'536 * g);                             // level 1
      case 3: return now + rng() % (16'777'216ull * g);                      // level 2
      case 4: return now + rng() % ((1ull << 32) * g);                       // level 3
      default: return now + (1ull << 32) * g + rng() % ((1ull << 36) * g);  // beyond the top
    }
  };

  for (int step = 0; step < 20'000; ++step) {
    const auto op = rng() % 10;
    if (op < 4) {
      const std::uint64_t d = random_deadline();
      const auto r = w.schedule(d, next_id);
      if (live.size() == kCap) {
        ASSERT_EQ(r.error, WheelError::capacity_full);
      } else {
        ASSERT_TRUE(r);
        live[next_id++] = {r.handle, d};
      }
    } else if (op < 5 && !live.empty()) {
      auto it = live.lower_bound(rng() % next_id);
      if (it == live.end()) it = live.begin();
      ASSERT_EQ(w.cancel(it->second.first), WheelError::none);
      live.erase(it);
    } else if (op < 6 && !live.empty()) {
      auto it = live.lower_bound(rng() % next_id);
      if (it == live.end()) it = live.begin();
      const std::uint64_t d = random_deadline();
      ASSERT_EQ(w.reschedule(it->second.first, d), WheelError::none);
      it->second.second = d;
    } else {
      // Advance: mostly small steps, sometimes a long sleep.
      const std::uint64_t step_ns = (rng() % 8 == 0) ? rng() % ((1ull << 34) * g) : rng() % (300 * g);
      // next_event_ns() never lies beyond the earliest live deadline's tick: sleeping until it
      // cannot miss a deadline.
      if (live.empty()) {
        EXPECT_EQ(w.next_event_ns(), UINT64_MAX);
      } else {
        std::uint64_t earliest = UINT64_MAX;
        for (const auto& [id, hd] : live) earliest = std::min(earliest, std::max(hd.second / g * g, w.next_tick_ns()));
        EXPECT_LE(w.next_event_ns(), earliest);
        EXPECT_GE(w.next_event_ns(), w.next_tick_ns());
      }
      const std::uint64_t previous_tick = w.next_tick_ns() / g;
      now += step_ns;
      const std::uint64_t target = now / g;
      std::set<std::uint64_t> expect;
      for (const auto& [id, hd] : live) {
        if (hd.second / g <= target) expect.insert(id);
      }
      std::set<std::uint64_t> got;
      std::uint64_t last_tick = 0;
      w.advance(now, [&](const DueTimer& d) {
        EXPECT_TRUE(got.insert(d.payload).second) << "fired twice: " << d.payload;
        EXPECT_GE(d.tick_ns, last_tick) << "out of tick order";
        last_tick = d.tick_ns;
        // Never late: a timer fires in its own tick unless it was due before this advance began.
        const std::uint64_t dt = d.deadline_ns / g;
        if (dt >= previous_tick) {
          EXPECT_EQ(d.tick_ns, dt * g) << "payload " << d.payload;
        }
        // Occasionally re-arm into the future (lazy re-arm).
        if (rng() % 16 == 0) {
          const std::uint64_t nd = now + 1 + rng() % (100'000 * g);
          if (nd / g > target) {
            live[d.payload].second = nd;
            got.erase(d.payload);
            expect.erase(d.payload);
            return Rearm::at(nd);
          }
        }
        return Rearm::none();
      });
      ASSERT_EQ(got, expect) << "at step " << step;
      for (auto id : got) live.erase(id);
    }
    ASSERT_EQ(w.size(), live.size());
  }
}

}  // namespace
}  // namespace leasehold
