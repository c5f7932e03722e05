// NameTexts and EpochMap (lockd/name_maps.hpp) against std::map models.
#include "leasehold/lockd/name_maps.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

namespace leasehold::lockd {
namespace {

std::string text_for(std::uint64_t i) { return "name/" + std::to_string(i) + std::string(i % 40, 'x'); }

TEST(NameTexts, EmplaceFindEraseLikeAMap) {
  NameTexts t;
  EXPECT_TRUE(t.empty());
  const NameId a = name_id_of("alpha"), b = name_id_of("beta");
  EXPECT_TRUE(t.emplace(a, "alpha"));
  EXPECT_FALSE(t.emplace(a, "other"));  // a present id keeps its text
  EXPECT_TRUE(t.emplace(b, "beta"));
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.find(a), "alpha");
  EXPECT_EQ(t.find(b), "beta");
  EXPECT_EQ(t.find(name_id_of("gamma")), "");
  EXPECT_TRUE(t.erase(a));
  EXPECT_FALSE(t.erase(a));
  EXPECT_EQ(t.find(a), "");
  EXPECT_EQ(t.find(b), "beta");
  EXPECT_EQ(t.size(), 1u);
  EXPECT_FALSE(t.emplace(a, ""));  // not kept: find() answers "" for it either way
  EXPECT_EQ(t.size(), 1u);
  EXPECT_THROW(t.emplace(a, std::string(NameTexts::kTextBytesMax + 1, 'n')), std::length_error);
  EXPECT_TRUE(t.emplace(a, std::string(NameTexts::kTextBytesMax, 'n')));
  EXPECT_EQ(t.find(a).size(), NameTexts::kTextBytesMax);
}

// Random inserts, erases, prunes and lower_bound walks, checked against std::map after every step
// group, with ids crowded into few home slots (equal high halves) as well as spread ones.
TEST(NameTexts, MatchesAnOrderedMapModel) {
  for (const bool crowded : {false, true}) {
    NameTexts t;
    std::map<NameId, std::string> model;
    std::mt19937_64 rng(crowded ? 7 : 11);
    auto id_for = [&](std::uint64_t i) {
      const NameId n = name_id_of(text_for(i));
      return crowded ? NameId{n.hi & 0xF000'0000'0000'0000ULL, n.lo} : n;
    };
    for (int round = 0; round < 40; ++round) {
      for (int k = 0; k < 500; ++k) {
        const std::uint64_t i = rng() % 5000;
        const NameId id = id_for(i);
        if (rng() % 3 != 0) {
          EXPECT_EQ(t.emplace(id, text_for(i)), model.emplace(id, text_for(i)).second);
        } else {
          EXPECT_EQ(t.erase(id), model.erase(id) == 1);
        }
      }
      if (round % 10 == 9) {
        const std::uint64_t m = rng() % 3 + 2;
        auto drop = [m](NameId id) { return id.lo % m == 0; };
        t.erase_if(drop);
        std::erase_if(model, [&](const auto& e) { return drop(e.first); });
      }
      ASSERT_EQ(t.size(), model.size());
      // Every entry in order, with its text.
      auto c = t.begin();
      for (const auto& [id, text] : model) {
        ASSERT_FALSE(c.done());
        ASSERT_EQ(c.id(), id);
        ASSERT_EQ(c.text(), text);
        ASSERT_EQ(t.find(id), text);
        c.next();
      }
      EXPECT_TRUE(c.done());
      // lower_bound at random cursors (a list page's start: {cursor, 0}) and at present ids.
      for (int k = 0; k < 50; ++k) {
        const NameId at = k % 2 == 0 || model.empty() ? NameId{rng(), 0} : std::next(model.begin(), static_cast<long>(rng() % model.size()))->first;
        const auto want = model.lower_bound(at);
        const auto got = t.lower_bound(at);
        if (want == model.end()) {
          EXPECT_TRUE(got.done());
        } else {
          ASSERT_FALSE(got.done());
          EXPECT_EQ(got.id(), want->first);
        }
      }
    }
    EXPECT_GT(t.size(), 0u);
    // Load factor <= 0.92 (+ the overflow tail), texts 1 + length bytes (+ erased, not compacted).
    EXPECT_GE(t.slots() * 23, t.size() * 25);
    EXPECT_LE(t.text_garbage_bytes(), t.text_bytes() + (std::size_t{256} << 10));
  }
}

TEST(NameTexts, ErasedTextIsCompacted) {
  NameTexts t;
  for (std::uint64_t i = 0; i < 20000; ++i) ASSERT_TRUE(t.emplace(name_id_of(text_for(i)), text_for(i)));
  const std::size_t live = t.text_bytes();
  std::size_t want = 0;
  for (std::uint64_t i = 0; i < 20000; ++i) want += 1 + text_for(i).size();
  EXPECT_EQ(live, want);
  for (std::uint64_t i = 0; i < 20000; i += 2) ASSERT_TRUE(t.erase(name_id_of(text_for(i))));
  EXPECT_EQ(t.size(), 10000u);
  EXPECT_LE(t.text_garbage_bytes(), t.text_bytes() + (std::size_t{256} << 10));
  for (std::uint64_t i = 1; i < 20000; i += 2) ASSERT_EQ(t.find(name_id_of(text_for(i))), text_for(i));
  for (std::uint64_t i = 0; i < 20000; i += 2) ASSERT_EQ(t.find(name_id_of(text_for(i))), "");
}

TEST(EpochMap, CrowdedIdsStillFound) {
  // Ids that differ only in a few bits (not SHA-1 derived) land on few home slots.
  EpochMap m;
  for (std::uint64_t i = 1; i <= 3000; ++i) m.set(NameId{0, i}, i * 7);
  for (std::uint64_t i = 1; i <= 3000; ++i) m.set(NameId{i, 0}, i * 5);
  EXPECT_EQ(m.size(), 6000u);
  for (std::uint64_t i = 1; i <= 3000; ++i) {
    ASSERT_NE(m.find(NameId{0, i}), m.end());
    EXPECT_EQ(m.find(NameId{0, i})->second, i * 7);
    ASSERT_NE(m.find(NameId{i, 0}), m.end());
    EXPECT_EQ(m.find(NameId{i, 0})->second, i * 5);
  }
  EXPECT_EQ(m.find(NameId{0, 3001}), m.end());
}

TEST(EpochMap, SetAndFind) {
  EpochMap m;
  std::map<NameId, Epoch> model;
  std::mt19937_64 rng(3);
  for (int k = 0; k < 50000; ++k) {
    const std::uint64_t i = rng() % 20000;
    const NameId id = name_id_of(text_for(i));
    const Epoch e = rng() % 1000;
    m.set(id, e);
    model[id] = e;
  }
  m.set(NameId{}, 9);  // the nil id is a key like any other
  model[NameId{}] = 9;
  ASSERT_EQ(m.size(), model.size());
  for (const auto& [id, e] : model) {
    ASSERT_NE(m.find(id), m.end());
    EXPECT_EQ(m.find(id)->first, id);
    EXPECT_EQ(m.find(id)->second, e);
  }
  EXPECT_EQ(m.find(name_id_of("never set")), m.end());
  // 20-byte slots at load factor 0.74..0.92 (+ a 64-slot overflow tail).
  EXPECT_LE(m.memory_bytes(), model.size() * 20 * 100 / 73 + 2 * 64 * 20);
  EXPECT_GE(m.memory_bytes(), model.size() * 20 * 100 / 92);
}

TEST(EpochMap, EpochsAbove32BitsStayExact) {
  EpochMap m;
  const NameId a = name_id_of("a"), b = name_id_of("b");
  const Epoch big = (Epoch{1} << 40) + 3;
  m.set(a, big);
  m.set(b, 0xFFFF'FFFEu);  // the largest epoch kept in the slot itself
  ASSERT_NE(m.find(a), m.end());
  EXPECT_EQ(m.find(a)->second, big);
  EXPECT_EQ(m.find(b)->second, 0xFFFF'FFFEu);
  m.set(b, 0xFFFF'FFFFu);
  EXPECT_EQ(m.find(b)->second, 0xFFFF'FFFFu);
  m.set(a, 7);  // back below: the side entry goes
  EXPECT_EQ(m.find(a)->second, 7u);
  m.set(a, kEpochMax);
  EXPECT_EQ(m.find(a)->second, kEpochMax);
  for (std::uint64_t i = 0; i < 5000; ++i) m.set(name_id_of(text_for(i)), i);  // rebuilds keep them
  EXPECT_EQ(m.find(a)->second, kEpochMax);
  EXPECT_EQ(m.find(b)->second, 0xFFFF'FFFFu);
  EXPECT_EQ(m.size(), 5002u);
}

}  // namespace
}  // namespace leasehold::lockd
