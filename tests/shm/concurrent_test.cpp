// shm table under threads: the io thread publishes/extends/frees, the rt thread revokes the
// same slots, readers check. Runs under TSan in CI (label "concurrent").
#include "leasehold/shm/table.hpp"
#include "tests/shm/hammer.hpp"
#include "tests/shm/test_util.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace leasehold::shm {
namespace {

using namespace test;

inline constexpr std::uint64_t kCyclesMax = 20'000;
inline constexpr auto kRunFor = std::chrono::milliseconds(800);

TEST(ShmConcurrent, RevokeRacingPublishAndExtendNeverResurrects) {
  TempTable t;
  TableOptions o = options_for(t, 4);
  o.slot_cooldown_ns = 0;
  o.liveness_timeout_ns = kLivenessTimeoutMaxNs;  // the probes use synthetic times near kBaseNs
  auto w = TableWriter::create(o);
  w.heartbeat(kBaseNs);
  const auto r = TableReader::open(t.location);
  Violations v;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> cycles{0}, revokes{0};

  std::thread io([&] {  // io thread: publish, extend, free
    const auto end = std::chrono::steady_clock::now() + kRunFor;
    for (std::uint64_t c = 0; c < kCyclesMax && std::chrono::steady_clock::now() < end; ++c)
      if (writer_cycle(w, c, 10 + c, 8)) cycles.fetch_add(1);
    stop.store(true);
  });
  std::thread rt([&] {  // rt thread: revoke (wait-free), then the revoke must hold
    std::mt19937 rng(7);
    while (!stop.load()) {
      const auto i = static_cast<std::uint32_t>(rng() % 4);
      ASSERT_TRUE(w.revoke(i));
      revokes.fetch_add(1);
      // The revoked epoch (epochs are never reused) must never check valid again, whatever
      // the io thread does next.
      const std::uint64_t word = r.slot(i)->check_word.load(std::memory_order_acquire);
      const Epoch e = word & ~kRevokedBit;
      if ((word & kRevokedBit) != 0 && e != 0) {
        v.revoked_seen.fetch_add(1);
        for (int k = 0; k < 4; ++k)
          if (r.check(i, e)) v.revoked_but_valid.fetch_add(1);
      }
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> readers;
  for (int k = 0; k < 2; ++k)
    readers.emplace_back([&, k] {
      std::mt19937 rng(static_cast<unsigned>(k + 100));
      while (!stop.load()) reader_step(r, static_cast<std::uint32_t>(rng() % 4), v);
    });
  io.join();
  rt.join();
  for (auto& th : readers) th.join();

  EXPECT_EQ(v.wrong_sandbox.load(), 0u);
  EXPECT_EQ(v.revoked_but_valid.load(), 0u);
  EXPECT_EQ(v.deadline_mismatch.load(), 0u);
  EXPECT_GT(cycles.load(), 0u);
  EXPECT_GT(revokes.load(), 0u);
  EXPECT_GT(v.valid_checks.load() + v.revoked_seen.load(), 0u) << "readers saw nothing: test is vacuous";
}

// A sandbox copying its token channel's record while the io thread publishes new epochs with
// new tokens never gets a torn token: every copy is exactly the token written for its epoch.
TEST(ShmConcurrent, TokenReadsAreNeverTorn) {
  auto w = TokenChannel::create("concurrent-tokens");
  const Result<int> reopened = w.reopen_read_only();
  ASSERT_TRUE(reopened.ok()) << reopened.message();
  const int ro = *reopened;
  const auto r = TokenChannelReader::open(std::to_string(ro));
  auto token_of = [](Epoch e) {
    std::vector<std::uint8_t> b(140);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(e * 31 + i);
    return b;
  };
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> reads{0}, torn{0};
  std::thread io([&] {
    const auto end = std::chrono::steady_clock::now() + kRunFor;
    for (Epoch e = 1; e < kCyclesMax && std::chrono::steady_clock::now() < end; ++e)
      (void)w.publish(e, token_of(e));
    stop.store(true);
  });
  std::thread reader([&] {
    TokenSnapshot ts;
    while (!stop.load()) {
      if (r.read(ts) != TableErrc::ok || ts.length == 0) continue;
      reads.fetch_add(1);
      const auto want = token_of(ts.epoch);
      if (ts.length != want.size() || !std::equal(want.begin(), want.end(), ts.view().begin())) torn.fetch_add(1);
    }
  });
  io.join();
  reader.join();
  EXPECT_EQ(torn.load(), 0u) << "of " << reads.load() << " reads";
  EXPECT_GT(reads.load(), 0u);
  ::close(ro);
}

TEST(ShmConcurrent, ReaderRacingARevokingWriterSeesValidOrNotValid) {
  // A reader checks one published slot while the writer revokes it: every answer is a clean
  // valid/not-valid, and once not-valid, never valid again.
  TempTable t;
  auto w = TableWriter::create(options_for(t, 1));
  const auto r = TableReader::open(t.location);
  const std::uint64_t now = boottime_ns();
  const Result<ClaimedSlot> claimed = w.claim(sandbox(1), now);
  ASSERT_TRUE(claimed.ok()) << claimed.message();
  const ClaimedSlot c = *claimed;
  ASSERT_EQ(w.publish(c.slot, NameId{1, 1}, "n", 77, now + 3'600'000'000'000ULL), TableErrc::ok);
  std::atomic<bool> go{false}, revoked{false};
  std::uint64_t valid = 0, flips_back = 0;
  std::thread reader([&] {
    bool seen_invalid = false;
    go.store(true);
    for (int k = 0; k < 200'000 && !(seen_invalid && k > 1000); ++k) {
      const bool ok = r.check(c.slot, 77);
      if (ok) ++valid;
      if (ok && seen_invalid) ++flips_back;
      if (!ok) seen_invalid = true;
    }
    EXPECT_TRUE(seen_invalid || !revoked.load());
  });
  while (!go.load()) std::this_thread::yield();
  w.revoke(c.slot);
  revoked.store(true);
  EXPECT_EQ(w.extend(c.slot, now + 7'200'000'000'000ULL), TableErrc::revoked);
  reader.join();
  EXPECT_EQ(flips_back, 0u);
  EXPECT_FALSE(r.check(c.slot, 77));
  EXPECT_FALSE(r.check_deadline(c.slot, 77));
}

}  // namespace
}  // namespace leasehold::shm
